"""Crash → serving of the first replacement after a resume, beside an uninterrupted run's (issue 37, point 6).

Each trial runs the tiny test swarm (4 transformer stages + stage 0, 2 replicas, synthetic batches, no WAN delay,
``ours``) through ``python -m checkfree swarm run`` with one scheduled crash (node ``--node`` at iteration
``--crash-at``):

* ``uninterrupted``: the run goes to its end;
* ``resumed``: the supervisor SIGKILLs itself right after committing iteration ``--crash-at − 2``
  (``CHECKFREE_SUPERVISOR_DIE_AT=committed:…``, checkfree/swarm/supervisor/failpoints.py) and ``swarm run --resume``
  takes over at once, so the scheduled crash is the first replacement the resumed supervisor starts.

The crash's row of throughput.json gives crash → serving (``latency_s``), crash → spawn, spawn → join and join →
serving; its ``coordinator_outages`` the resume's re-adoption (``t_resumed`` → ``t_adopted``), which the forkserver's
start must not lengthen. The median of ``--trials`` of each is printed and written to ``--out``/bench.json::

    .venv/bin/python benchmarks/bench_resume_replacement.py --trials 5 --out runs/bench-resume-replacement
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ENV = "CHECKFREE_SUPERVISOR_DIE_AT"
MODEL = {
    "dataset": "Shakespeare",
    "architecture": "LLaMa",
    "validation": 2,
    "dmodel": 32,
    "num_heads": 2,
    "n_layers_per_stage": 1,
    "n_stages": 4,
    "seq_l": 16,
    "batch_size": 4,
    "mb_count": 2,
    "lr_scale": 1.1,
    "max_iterations": 10,
    "lr": 3e-3,
    "vocab_size": 300,
    "seed": 0,
}
"""The live tests' tiny model (tests/helpers/swarm.py) with 4 transformer stages."""


def write_inputs(out: Path, node: int, crash_at: int) -> tuple[Path, Path]:
    """The swarm config (and its model config) and the crash schedule, under ``out``."""
    (out / "model.json").write_text(json.dumps(MODEL))
    cfg = {
        "model_config": str(out / "model.json"),
        "replicas": 2,
        "microbatches": 4,
        "in_flight": 2,
        "time_scale": 0.0,
        "data": "synthetic",
        "heartbeat_interval": 0.2,
        "peer_timeout": 3.0,
        "microbatch_timeout": 30,
        "iteration_timeout": 60,
        "recovery_timeout": 60,
        "request_timeout": 15,
        "supervisor_grace": 60.0,
        "eval_interval": 0,
    }
    (out / "swarm.json").write_text(json.dumps(cfg))
    (out / "schedule.json").write_text(json.dumps({str(node): [crash_at, 1_000_000]}))  # the last: a sentinel
    return out / "swarm.json", out / "schedule.json"


def swarm(args: list[str], log: Path, die_at: str | None = None, timeout: float = 300) -> int:
    """``swarm run ARGS`` to its end (output to ``log``); its exit code."""
    env = {k: v for k, v in os.environ.items() if k != ENV} | ({ENV: die_at} if die_at else {})
    cmd = [sys.executable, "-m", "checkfree", "swarm", "run", *args]
    with open(log, "a") as f:
        return subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=f, timeout=timeout).returncode


def crash_row(run: Path, node: int) -> dict[str, Any]:
    """The throughput.json row of ``node``'s crash, with its intervals (seconds)."""
    out = json.loads((run / "throughput.json").read_text())
    (row,) = [c for c in out["crashes"] if c.get("node") == node]
    return {
        "crash_to_serving_s": row["latency_s"],
        "crash_to_spawn_s": row["t_spawn"] - row["t_crash"],
        "spawn_to_join_s": row["t_join"] - row["t_spawn"],
        "join_to_serving_s": row["t_serving"] - row["t_join"],
        # the resume's own re-adoption (its outage's t_resumed → t_adopted); 0 without a resume
        "adoption_s": sum(o["t_adopted"] - o["t_resumed"] for o in out.get("coordinator_outages", [])),
        "resumes": out.get("resumes", 0),
    }


def trial(out: Path, kind: str, iterations: int, node: int, crash_at: int) -> dict[str, Any]:
    """One run of ``kind`` (``uninterrupted`` or ``resumed``) in a fresh folder under ``out``."""
    config, schedule = write_inputs(out, node, crash_at)
    run = out / "run"
    base = ["--setting", "ours", "--config", str(config), "--schedule", str(schedule)]
    base += ["--iterations", str(iterations), "--run-dir", str(run)]
    log = out / "console.log"
    if kind == "uninterrupted":
        rc = swarm(base, log)
    else:
        first = swarm(base, log, die_at=f"committed:{crash_at - 2}")
        if first != -9:
            raise RuntimeError(f"the supervisor was to SIGKILL itself; it exited with {first} (see {log})")
        t0 = time.monotonic()
        rc = swarm(["--resume", str(run)], log)
        print(f"  resumed run: {time.monotonic() - t0:.1f} s", flush=True)
    if rc != 0:
        raise RuntimeError(f"swarm run exited with {rc} (see {log})")
    return crash_row(run, node)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=5, help="runs of each kind (default 5)")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--crash-at", type=int, default=6, help="iteration of the scheduled crash (≥ 3)")
    p.add_argument("--node", type=int, default=3, help="the node that crashes (default 3: stage 1)")
    p.add_argument("--kinds", default="uninterrupted,resumed")
    p.add_argument("--out", type=Path, required=True, help="a folder that does not exist or is empty")
    a = p.parse_args(argv)
    if a.out.exists() and any(a.out.iterdir()):
        print(f"--out {a.out} is not empty; expected a new folder.", file=sys.stderr)
        return 2
    results: dict[str, list[dict[str, Any]]] = {}
    for i in range(a.trials):
        for kind in a.kinds.split(","):
            folder = a.out / f"{kind}{i}"
            folder.mkdir(parents=True)
            row = trial(folder.resolve(), kind, a.iterations, a.node, a.crash_at)
            results.setdefault(kind, []).append(row)
            print(
                f"{kind} {i}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items() if k != "resumes"),
                flush=True,
            )
    summary = {
        kind: {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "resumes"}
        for kind, rows in results.items()
    }
    (a.out / "bench.json").write_text(json.dumps({"trials": results, "median": summary}, indent=1))
    for kind, med in summary.items():
        print(f"median {kind} ({a.trials}): " + ", ".join(f"{k} {v:.2f} s" for k, v in med.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
