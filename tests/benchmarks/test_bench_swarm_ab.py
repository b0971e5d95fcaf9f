"""benchmarks/bench_swarm_ab.py: the old-tree-against-new comparison refuses what is not a tree, alternates the
order of the trees, and calls a difference unchanged only within the noise of repeated runs (issue 38)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from helpers import ROOT


def _load():
    spec = importlib.util.spec_from_file_location("bench_swarm_ab", ROOT / "benchmarks" / "bench_swarm_ab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ab = _load()


def test_a_directory_that_is_not_a_checkout_is_refused_in_one_sentence_with_exit_2(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_swarm_ab.py"), str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert f"'{tmp_path}' is not a checkout of checkfree" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("text", ["0", "-1", "x", "1.5"])
def test_rounds_must_be_a_positive_integer(text: str) -> None:
    with pytest.raises(SystemExit) as exc:
        ab.main([str(ROOT), str(ROOT), "--rounds", text])
    assert exc.value.code == 2


def test_the_verdict_is_unchanged_exactly_up_to_the_noise() -> None:
    assert ab.verdict(1.25, 0.25).startswith("unchanged")  # binary-exact, so the bound itself is tested
    assert ab.verdict(0.75, 0.25).startswith("unchanged")
    assert ab.verdict(1.2501, 0.25).startswith("slower")
    assert ab.verdict(0.7499, 0.25).startswith("faster")


def test_the_noise_is_the_spread_between_runs_of_one_tree() -> None:
    assert ab.spread([1.0, 1.2, 1.1]) == pytest.approx(0.2 / 1.1)
    assert ab.spread([1.3]) == 0.0


def test_rounds_alternate_which_tree_runs_first(monkeypatch) -> None:
    order: list[str] = []

    def fake(src, iterations):
        order.append(src.upper())
        return 1.0, 1.0

    monkeypatch.setattr(ab, "run_once", fake)
    monkeypatch.setattr(ab, "tree", lambda p: p)
    assert ab.main(["a", "b", "--rounds", "3"]) == 0
    assert order == ["A", "B", "B", "A", "A", "B"]
