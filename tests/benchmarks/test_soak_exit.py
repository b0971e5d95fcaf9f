"""The soak scripts fail when a verdict is missed (issue 37, point 7): benchmarks/soak_swarm.py and
benchmarks/soak_resume.py exit 1 when any verdict line says missed, though the swarm run itself exited 0 (before:
soak_swarm.py exited 0)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from helpers import ROOT

MET = ["deaths: 3", "stall 1.0 s <= median crash->serving + 10 s = 12.0 s: met", "fds flat (...): met"]
MISSED = [*MET[:-1], "rss_mib flat (last-quarter median 300.0 vs first-quarter 200.0, <= +25%): missed"]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Run:
    """A swarm run that exits 0 at once (the soak samples this test's own process meanwhile)."""

    def __init__(self, cmd: list[str], **kwargs: object) -> None:
        self.pid = os.getpid()

    def wait(self, timeout: float | None = None) -> int:
        return 0


@pytest.mark.parametrize(("lines", "code"), [(MET, 0), (MISSED, 1), (MET[:1], 1)])
def test_soak_swarm_exits_1_when_a_verdict_is_missed(lines, code, tmp_path: Path, monkeypatch) -> None:
    soak = _load("soak_swarm")
    monkeypatch.setattr(soak.subprocess, "Popen", _Run)
    monkeypatch.setattr(soak, "report", lambda *args, **kwargs: list(lines))
    argv = ["--config", str(ROOT / "configs" / "swarm_tiny.json"), "--iterations", "6", "--deaths", "4"]
    assert soak.main([*argv, "--out", str(tmp_path / "soak"), "--sample-s", "0.05"]) == code
    assert soak.exit_code(3, MET) == 1  # the run failed: whatever the verdicts say


@pytest.mark.parametrize(("lines", "code"), [(MET, 0), (MISSED, 1), (MET[:1], 1)])
def test_soak_resume_exits_1_when_a_verdict_is_missed(lines, code, tmp_path: Path, monkeypatch) -> None:
    soak = _load("soak_resume")
    monkeypatch.setattr(soak, "run_soak", lambda args, out, kills: (kills, []))
    monkeypatch.setattr(soak, "report", lambda *args, **kwargs: list(lines))
    argv = ["--config", str(ROOT / "configs" / "swarm_tiny.json"), "--iterations", "30", "--kills", "2"]
    assert soak.main([*argv, "--out", str(tmp_path / "soak")]) == code
