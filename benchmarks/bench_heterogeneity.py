"""Heterogeneity bench (issue 39 point 4): a swarm with one slow node per stage, and one more that turns slow mid-run.

Runs ``swarm run`` on ``--config`` (default configs/swarm_tiny.json) with ``--replicas`` per stage (default 3),
replica 1 of every stage ``--factor`` × slow from the start (the config's ``slowdown``) and replica 2 of stage
``--turn-stage`` ``--turn-factor`` × slow from iteration ``--turn-at`` (a schedule's ``slowdowns`` event;
checkfree.swarm.slowdown), then reads throughput.json and prints:

* the mean iteration time (iterations 0-1, the warm-up, left out) on today's fixed routes;
* the last routing plan (checkfree.swarm.routing): per stage node:microbatches, its bound (the busiest node's
  seconds under the fractional plan), the integer plan's and the fixed routes' busiest-node seconds, and their
  ratio fixed / bound, what routes that follow the plan could save on the busiest node;
* verdicts: every slow node named fail-slow; the node that turns slow gets its share cut within 3 iterations
  (its share in the plans of iterations k, k+1 or k+2 below its share at k − 1).

The plan is not applied to routes yet, so the acceptance's "iteration time ≤ 1.15 × the bound and ≥ 1.3 × faster
than the fixed routes" is not measured here; the bound here is in busiest-node seconds, not a whole iteration's.
Exit 0 when every verdict is met, 1 when one is missed or the run failed, 2 on a bad option. ``--dry-run`` writes
the schedule and prints the command.

    .venv/bin/python benchmarks/bench_heterogeneity.py --iterations 10 --out runs/het
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def slow_nodes(n_stages: int, replicas: int) -> list[int]:
    """Replica 1 of every stage (stages 0..S): node ids ``s · R + 1``."""
    return [s * replicas + 1 for s in range(n_stages + 1)]


def share(row: dict[str, Any], node: int) -> int | None:
    """``node``'s microbatches in ``row``'s routing plan (None: no plan, or the node is not in it)."""
    plan = row.get("routing_plan")
    if not plan:
        return None
    for nodes in plan["shares"].values():
        if str(node) in nodes:
            return nodes[str(node)]
    return None


def report(throughput: dict[str, Any], slow: list[int], turned: int, turn_at: int) -> list[str]:
    """The bench's lines, its verdicts last (``...: met`` / ``...: missed``)."""
    rows = throughput["iterations"]
    walls = [r["wall_s"] for r in rows if r["iteration"] >= 2]
    lines = [
        f"iterations: {len(rows)} committed; mean {statistics.mean(walls):.3f} s over iterations 2.. "
        f"(fixed routes)"
        if walls
        else f"iterations: {len(rows)} committed (too few to time)"
    ]
    planned = [r for r in rows if r.get("routing_plan")]
    if planned:
        plan = planned[-1]["routing_plan"]
        stages = "; ".join(
            f"stage {s}: " + " ".join(f"{n}:{c}" for n, c in nodes.items())
            for s, nodes in plan["shares"].items()
        )
        ratio = plan["fixed_s"] / plan["bound_s"] if plan["bound_s"] > 0 else float("nan")
        lines.append(f"last routing plan (iteration {planned[-1]['iteration']}): {stages}")
        lines.append(
            f"busiest node: bound {plan['bound_s']:.3f} s, plan {plan['plan_s']:.3f} s, fixed routes "
            f"{plan['fixed_s']:.3f} s (fixed / bound {ratio:.2f})"
        )
    named = {r["node"] for r in throughput.get("fail_slow") or []}
    missing = sorted(set(slow) - named)
    lines.append(
        f"slow nodes {sorted(slow)} named fail-slow ({sorted(named)} named): {'missed' if missing else 'met'}"
    )
    by_iteration = {r["iteration"]: r for r in rows}
    before = share(by_iteration.get(turn_at - 1, {}), turned)
    after = [share(by_iteration.get(turn_at + k, {}), turned) for k in range(3)]
    cut = before is not None and any(a is not None and a < before for a in after)
    lines.append(
        f"node {turned} turned slow at iteration {turn_at}: share {before} before, {after} in the 3 plans after: "
        f"{'met' if cut else 'missed'}"
    )
    return lines


def _fail(message: str) -> int:
    print(f"bench_heterogeneity.py: error: {message}", file=sys.stderr)
    return 2


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/swarm_tiny.json", help="swarm topology config")
    p.add_argument("--setting", default="ours", help="swarm setting")
    p.add_argument("--replicas", type=int, default=3, help="replicas per stage (at least 3)")
    p.add_argument("--iterations", type=int, default=10, help="committed iterations of the run")
    p.add_argument("--factor", type=float, default=3.0, help="slowdown of replica 1 of every stage")
    p.add_argument("--turn-factor", type=float, default=4.0, help="slowdown of the node that turns slow")
    p.add_argument("--turn-stage", type=int, default=2, help="stage whose replica 2 turns slow")
    p.add_argument("--turn-at", type=int, default=5, help="iteration it turns slow at")
    p.add_argument("--out", type=Path, help="output directory (default runs/het-<iterations>, from here)")
    p.add_argument(
        "--timeout-s", type=float, help="wall-clock limit of the run (default 120 + 30 s/iteration)"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="write the schedule, print the command, run nothing"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    sys.path.insert(0, str(ROOT))
    from checkfree.swarm.config import load_swarm_config

    if args.replicas < 3:
        return _fail(
            f"--replicas is {args.replicas}; expected at least 3 (a slow, a turning and a fast one)."
        )
    if not 2 <= args.turn_at < args.iterations - 3:
        return _fail(
            f"--turn-at is {args.turn_at}; expected 2 <= it < --iterations - 3 = {args.iterations - 3} "
            "(a plan before it and three after)."
        )
    try:
        cfg = load_swarm_config(args.config, {"replicas": args.replicas})
    except (ValueError, FileNotFoundError) as exc:
        return _fail(str(exc))
    if not 0 <= args.turn_stage <= cfg.n_stages:
        return _fail(f"--turn-stage is {args.turn_stage}; expected a stage 0..{cfg.n_stages}.")
    slow = slow_nodes(cfg.n_stages, args.replicas)
    turned = args.turn_stage * args.replicas + 2
    out = (args.out or Path("runs") / f"het-{args.iterations}").resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        return _fail(f"--out {out} holds something already; expected a new or empty directory.")
    out.mkdir(parents=True, exist_ok=True)
    schedule = {"slowdowns": [{"slot": turned, "factor": args.turn_factor, "iteration": args.turn_at}]}
    (out / "schedule.json").write_text(json.dumps(schedule))
    cmd = [
        sys.executable, "-m", "checkfree", "swarm", "run", "--setting", args.setting, "--config", str(args.config),
        "--set", f"replicas={args.replicas}", "--set", f"slowdown={json.dumps({str(n): args.factor for n in slow})}",
        "--schedule", str(out / "schedule.json"), "--iterations", str(args.iterations), "--run-dir", str(out / "run"),
    ]  # fmt: skip
    print("command:", " ".join(cmd))
    if args.dry_run:
        return 0
    t0 = time.monotonic()
    with open(out / "swarm_run.out", "w", encoding="utf-8") as console:
        proc = subprocess.Popen(cmd, stdout=console, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=args.timeout_s or 120 + 30 * args.iterations)
        except subprocess.TimeoutExpired:
            print(f"the swarm run passed its time limit; interrupting it (pid {proc.pid})")
            proc.send_signal(signal.SIGINT)  # the supervisor reaps its nodes and writes throughput.json
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait(timeout=30)
    path = out / "run" / "throughput.json"
    lines = [f"swarm run: exit code {code}, {time.monotonic() - t0:.0f} s wall ({out / 'run'})"]
    if path.is_file():
        lines += report(json.loads(path.read_text()), slow, turned, args.turn_at)
    print("\n".join(lines))
    verdicts = [line for line in lines if line.endswith((": met", ": missed"))]
    return 0 if code == 0 and verdicts and all(v.endswith(": met") for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
