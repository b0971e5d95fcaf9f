"""The swarm's speed, one source tree against another: ``bench_swarm.py`` run on tree A and tree B in turn, on one
machine in one sitting, so that a refactor can show it left the iteration time where it was.

Each round runs ``benchmarks/bench_swarm.py`` (a no-failure swarm, CURVE on; its own docstring) once with tree A's
code and once with tree B's (``PYTHONPATH`` = the tree, the interpreter and every library the same), A first in
odd rounds and B first in even ones, so that a drift of the machine's load falls on both alike. From each run it
reads the measured mean iteration time and the ratio to the compute-and-transfer bound that run measured (the
bound's own compute times absorb a change of the node's CPU speed), and prints per round, then:

* B ÷ A of the mean iteration time and of the ratio to the bound (medians over rounds);
* the noise: the largest relative spread between two runs of one tree ((max − min) / median, over A's runs
  and over B's);
* the verdict "unchanged (within noise)" when |B ÷ A − 1| of the ratio to the bound is within that noise,
  else "slower" or "faster" by how much.

    .venv/bin/python benchmarks/bench_swarm_ab.py OLD_TREE NEW_TREE [--rounds 3] [--iterations 20]

A tree is a checkout of this repository (a ``git worktree add /tmp/old <commit>``). Exit 0 with a verdict, 1 when
a run failed, 2 for a bad argument.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

MEASURED = re.compile(r"measured no-failure iteration time \(mean of \d+\): ([0-9.]+) s")
RATIO = re.compile(r"iteration time / bound = ([0-9.]+)")
RUN_TIMEOUT_S = 900
"""Seconds one bench_swarm.py run may take before it is stopped (its 20 iterations take about a minute)."""


def tree(path: str) -> Path:
    """A source tree of this repository: the directory holding ``checkfree/`` and ``benchmarks/bench_swarm.py``."""
    p = Path(path).resolve()
    if not (p / "checkfree" / "__init__.py").is_file() or not (p / "benchmarks" / "bench_swarm.py").is_file():
        raise argparse.ArgumentTypeError(
            f"'{path}' is not a checkout of checkfree (no checkfree/__init__.py and benchmarks/bench_swarm.py in it); "
            "expected e.g. a `git worktree add /tmp/old <commit>` directory."
        )
    return p


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a positive integer.")
    return value


def run_once(src: Path, iterations: int) -> tuple[float, float]:
    """One bench_swarm.py run on tree ``src``; returns (mean iteration time s, iteration time ÷ bound).

    Raises:
        RuntimeError: the run failed, timed out, or printed neither number.
    """
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    cmd = [sys.executable, str(src / "benchmarks" / "bench_swarm.py"), "--iterations", str(iterations)]
    try:
        done = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"bench_swarm.py on {src} took over {RUN_TIMEOUT_S} s") from exc
    measured, ratio = MEASURED.search(done.stdout), RATIO.search(done.stdout)
    if done.returncode not in (0, 1) or measured is None or ratio is None:
        tail = (done.stdout + done.stderr)[-2000:]
        raise RuntimeError(f"bench_swarm.py on {src} exited {done.returncode}:\n{tail}")
    return float(measured.group(1)), float(ratio.group(1))


def spread(values: list[float]) -> float:
    """(max − min) / median: how far two runs of one tree lie apart."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


def verdict(ratio_b_over_a: float, noise: float) -> str:
    """'unchanged (within noise)' when B ÷ A lies within the noise of 1, else how much slower or faster."""
    if abs(ratio_b_over_a - 1.0) <= noise:
        return f"unchanged (within noise: |{ratio_b_over_a:.3f} - 1| <= {noise:.3f})"
    word = "slower" if ratio_b_over_a > 1.0 else "faster"
    return f"{word}: B / A = {ratio_b_over_a:.3f}, beyond the noise {noise:.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tree_a", type=tree, help="the reference tree (e.g. the commit before a refactor)")
    p.add_argument("tree_b", type=tree, help="the tree compared with it")
    p.add_argument("--rounds", type=positive, default=3, help="runs of each tree (alternating order)")
    p.add_argument("--iterations", type=positive, default=20, help="no-failure iterations per run")
    args = p.parse_args(argv)
    runs: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
    trees = {"A": args.tree_a, "B": args.tree_b}
    for r in range(args.rounds):
        for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
            try:
                runs[name].append(run_once(trees[name], args.iterations))
            except RuntimeError as exc:
                print(f"round {r + 1}, tree {name}: {exc}", file=sys.stderr)
                return 1
            mean, ratio = runs[name][-1]
            print(f"round {r + 1} tree {name}: iteration {mean:.3f} s, / bound {ratio:.3f}", flush=True)
    med = {
        k: (statistics.median(m for m, _ in v), statistics.median(q for _, q in v)) for k, v in runs.items()
    }
    noise = max(spread([q for _, q in runs[k]]) for k in runs)
    print(f"tree A {trees['A']}: iteration {med['A'][0]:.3f} s, / bound {med['A'][1]:.3f} (medians)")
    print(f"tree B {trees['B']}: iteration {med['B'][0]:.3f} s, / bound {med['B'][1]:.3f} (medians)")
    print(
        f"B / A: iteration time {med['B'][0] / med['A'][0]:.3f}, ratio to the bound {med['B'][1] / med['A'][1]:.3f}"
    )
    print(f"verdict: {verdict(med['B'][1] / med['A'][1], noise)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
