"""The failure_generator.py CLI: defaults reproduce the shipped schedules; it writes only --out."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from checkfree.failures import format_node_schedule, generate_node_schedule

ROOT = Path(__file__).resolve().parents[1]
# Load the root-level script by path: it is not a package module and the repo root may not be on sys.path.
_spec = importlib.util.spec_from_file_location("failure_generator", ROOT / "failure_generator.py")
failure_generator = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(failure_generator)


@pytest.mark.parametrize("rate", ["5", "10", "16", "33"])
def test_committed_configs_are_reproducible_from_the_generator(rate, tmp_path):
    out = tmp_path / f"{rate}.json"
    assert failure_generator.main(["--rate", rate, "--out", str(out)]) == 0
    assert out.read_bytes() == (ROOT / "failure_p_configs" / f"{rate}.json").read_bytes()


def test_explicit_paper_arguments_equal_defaults(tmp_path):
    out = tmp_path / "16.json"
    argv = [
        "--rate",
        "16",
        "--stages",
        "6",
        "--replicas",
        "3",
        "--iterations",
        "500",
        "--seed",
        "33",
        "--stage-seed",
        "80",
        "--checkpoint-interval",
        "100",
        "--out",
        str(out),
    ]
    assert failure_generator.main(argv) == 0
    nodes = json.loads(out.read_text())
    assert [n for n, v in nodes.items() if v != [501]] == ["9", "10", "11"] and nodes["9"] == [395, 501]


def test_stdout_when_no_out_and_nothing_written(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["--rate", "10", "--stages", "4", "--replicas", "2", "--probability", "0.1", "--iterations", "40"]
    assert failure_generator.main(argv) == 0
    printed = capsys.readouterr().out
    expected = generate_node_schedule(10, n_stages=4, replicas=2, probability=0.1, iterations=40)
    assert printed == format_node_schedule(expected) + "\n"
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_interval_zero_disables_the_skip(capsys):
    argv = ["--rate", "16", "--probability", "0.9", "--checkpoint-interval", "0", "--iterations", "50"]
    assert failure_generator.main(argv) == 0
    nodes = json.loads(capsys.readouterr().out)
    assert any(1 in v for v in nodes.values())


def test_bad_argument_is_one_error_line_not_a_traceback(tmp_path, capsys):
    out = tmp_path / "x.json"
    assert failure_generator.main(["--rate", "16", "--stages", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("failure_generator.py: error: n_stages 0 is invalid") and err.count("\n") == 1
    assert not out.exists()


def test_runs_as_a_script():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "failure_generator.py"), "--rate", "33"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (ROOT / "failure_p_configs" / "33.json").read_text() + "\n"
