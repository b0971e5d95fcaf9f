"""Soak the supervisor's death and resume: a long swarm run whose supervisor is SIGKILLed again and again and
resumed each time (``swarm run --resume``), with node crashes at a failure rate besides.

Writes a crash schedule at ``--rate`` %/h (``failure_generator.py``, the authors' format: whole-stage failures
drawn per iteration), runs ``python -m checkfree swarm run`` on it (default ``configs/swarm_tiny.json``,
``ours-plus``) and SIGKILLs the supervisor ``--kills`` times, spread over the run, each time in another way:

* ``external``: the soak SIGKILLs the supervisor a random fraction of the median iteration after a commit (in the
  middle of an attempt, or between two);
* ``committed``, ``begun``, ``commit-partial``, ``recovering``: the supervisor SIGKILLs itself at that point of its
  loop (``CHECKFREE_SUPERVISOR_DIE_AT``, checkfree/swarm/supervisor/failpoints.py): right after a commit was
  journaled, mid-attempt, mid-commit with one replica stepped, mid-recovery from a scheduled crash (the kill is
  moved to an iteration with a crash; without crashes it becomes ``external``).

After each kill it starts ``swarm run --resume RUN_DIR`` at once. It samples every supervisor's open fds and RSS
(``/proc/PID``), then reads throughput.json and supervisor.log and prints the outages, the resume latency (kill →
the next commit: median, max) and one verdict per target ("met" / "missed"): every node crash recovered; every
resume re-adopted the live nodes (a resume replaces only nodes that were gone, still recovering, or not yet
joined); nothing committed is lost (each iteration once, the run completed); the supervisors' fds and RSS flat
across restarts (the last incarnation's median against the first's: ``--fd-slack``, ``--rss-growth``); no stall
beyond the target (the longest iteration without a resume in it − the median ≤ median crash → serving +
``--stall-slack-s``), and no resume beyond its target (kill → next commit ≤ ``--resume-slack-s`` + 2 × the median
iteration: a restart, the adoption and the redone iteration). It exits 0 only when every verdict is met, 1 when
one is missed, 2 for a bad argument.

    .venv/bin/python benchmarks/soak_resume.py --iterations 200 --kills 10 --out runs/soak-resume
    .venv/bin/python benchmarks/soak_resume.py --iterations 30 --kills 3 --time-scale 0.1 --out runs/soak-resume-smoke

Everything goes under ``--out`` (it must not exist or be empty): ``schedule.json``, ``kills.json`` (the plan and
what happened), ``samples.jsonl``, ``soak_report.txt``, each supervisor's console output ``supervisor<i>.out`` and
the swarm's run directory ``run/``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak_swarm import Sampler, _quantile, deaths_by_kind  # noqa: E402

KINDS = ("external", "committed", "begun", "commit-partial", "recovering")
ENV = "CHECKFREE_SUPERVISOR_DIE_AT"
COMMITTED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) .*iteration (\d+) committed", re.M)
REPLACE_OK = ("its process is gone", "still recovering", "had not joined")
"""Why a resume may replace a node without failing the re-adoption verdict: it was not live, or not serving yet."""


def plan_kills(iterations: int, kills: int, crashes: list[int], seed: int) -> list[dict[str, Any]]:
    """``kills`` kills spread over iterations 3 .. iterations − 3, their kinds taking turns (:data:`KINDS`); a
    ``recovering`` kill goes to the nearest scheduled crash iteration not taken (``external`` if none is left).

    Raises:
        ValueError: too few iterations for that many kills (one sentence).
    """
    first, last = 3, iterations - 3
    if kills < 1 or last - first < 2 * kills:
        raise ValueError(
            f"--kills {kills} over --iterations {iterations}: expected at least 2 iterations per kill."
        )
    rng = random.Random(seed)
    step = (last - first) / kills
    taken: set[int] = set()
    out = []
    for k in range(kills):
        at = int(first + k * step + rng.uniform(0, step / 2))
        kind = KINDS[k % len(KINDS)]
        if kind == "recovering":
            free = [c for c in crashes if c not in taken and first <= c <= last]
            if free:
                at = min(free, key=lambda c: abs(c - at))
            else:
                kind = "external"
        taken.add(at)
        out.append({"iteration": at, "kind": kind, "delay_frac": round(rng.uniform(0.0, 1.0), 3)})
    return sorted(out, key=lambda k: k["iteration"])


def _log(run: Path) -> str:
    try:
        return (run / "supervisor.log").read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def _commits(text: str) -> list[tuple[int, float]]:
    """(iteration, epoch seconds) of every 'iteration N committed' line."""
    out = []
    for day, ms, it in COMMITTED.findall(text):
        out.append((int(it), time.mktime(time.strptime(day, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000))
    return out


def _median_iteration(text: str) -> float:
    stamps = [t for _, t in _commits(text)]
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False) if b > a]
    return statistics.median(gaps) if gaps else 1.0


def run_soak(
    args: argparse.Namespace, out: Path, kills: list[dict[str, Any]]
) -> tuple[list[dict], list[dict]]:
    """Start the swarm, kill and resume its supervisor as ``kills`` says; returns (the kills, as they happened,
    and every incarnation: pid, exit code, samples)."""
    run = out / "run"
    base = [sys.executable, "-m", "checkfree", "swarm", "run"]
    first = [*base, "--setting", args.setting, "--config", str(args.config), "--schedule", str(out / "schedule.json"),
             "--iterations", str(args.iterations), "--run-dir", str(run)]  # fmt: skip
    if args.time_scale is not None:
        first += ["--time-scale", str(args.time_scale)]
    pending, done, incarnations = list(kills), [], []
    deadline = time.monotonic() + (args.timeout_s or 300 + 30 * args.iterations)
    cmd = first
    while True:
        kill = pending[0] if pending else None
        env = {k: v for k, v in os.environ.items() if k != ENV}
        if kill is not None and kill["kind"] != "external":
            env[ENV] = f"{kill['kind']}:{kill['iteration']}"
        i = len(incarnations)
        t_start = time.time()
        with open(out / f"supervisor{i}.out", "w", encoding="utf-8") as console:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=console, stderr=subprocess.STDOUT)
        sampler = Sampler(proc.pid, args.sample_s, out / "samples.jsonl")
        sampler.start()
        t_kill = None
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.send_signal(signal.SIGINT)  # the supervisor reaps its nodes
                proc.wait(timeout=120)
                break
            if kill is not None and kill["kind"] == "external" and t_kill is None:
                text = _log(run)
                its = [it for it, _ in _commits(text)]
                if its and max(its) >= kill["iteration"]:
                    time.sleep(kill["delay_frac"] * _median_iteration(text))
                    if proc.poll() is None:
                        t_kill = time.time()
                        os.kill(proc.pid, signal.SIGKILL)
            time.sleep(0.05)
        code = proc.wait()
        sampler.stop()
        for sample in sampler.samples:
            sample["incarnation"] = i
        incarnations.append(
            {
                "pid": proc.pid,
                "code": code,
                "samples": sampler.samples,
                "t_start": t_start,
                "t_end": time.time(),
            }
        )
        if code == -signal.SIGKILL and kill is not None:
            if t_kill is None:  # it killed itself: the log says when
                m = re.findall(rf"^(\S+ \S+),(\d{{3}}) .*{ENV}=", _log(run), re.M)
                day, ms = m[-1] if m else (None, None)
                t_kill = (
                    time.mktime(time.strptime(day, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000
                    if day
                    else time.time()
                )
            done.append(kill | {"t_kill": t_kill, "incarnation": i})
            pending.pop(0)
            cmd = [*base, "--resume", str(run)]
            continue
        if code == -signal.SIGKILL:  # killed by nobody we know: stop here
            break
        if code == 0 and pending:  # the run ended before this kill's iteration
            for missed in pending:
                done.append(missed | {"t_kill": None, "missed": "the run completed before it"})
        break
    return done, incarnations


def report(out: Path, done: list[dict], incarnations: list[dict], args: argparse.Namespace) -> list[str]:
    """The soak's report lines, ending with one verdict per target."""
    run = out / "run"
    path = run / "throughput.json"
    tp = json.loads(path.read_text()) if path.is_file() else None
    log_text = _log(run)
    lines = [f"supervisor incarnations: {len(incarnations)} (exit codes {[i['code'] for i in incarnations]})"]
    deaths = deaths_by_kind(log_text)
    lines.append(
        f"node deaths: {sum(deaths.values())} ({', '.join(f'{k} {n}' for k, n in deaths.most_common())})"
    )
    verdicts = []
    if tp is None:
        return [*lines, "no throughput.json: the run did not finish", "every target: missed"]
    outages = tp.get("coordinator_outages", [])
    kills = [k for k in done if k.get("t_kill") is not None]
    named = ", ".join(f"{k['kind']} at {k['iteration']}" for k in kills)
    lines.append(f"supervisor kills: {len(kills)} ({named}); resumes recorded: {len(outages)}")
    latencies = []
    for kill, outage in zip(kills, outages, strict=False):
        if outage.get("t_next_commit") is not None and tp.get("started_at") is not None:
            latencies.append(tp["started_at"] + outage["t_next_commit"] - kill["t_kill"])
    for outage in outages:
        lines.append(
            f"  resume {outage['resume']}: from iteration {outage['from_iteration']}, redone "
            f"{outage['iterations_redone']}, rolled forward {outage['rolled_forward']}, adopted "
            f"{len(outage['adopted'])}, replaced {outage['replaced'] or 'none'}"
        )
    walls = [r["wall_s"] for r in tp["iterations"]]
    median_it = statistics.median(walls) if walls else 0.0
    if latencies:
        lines.append(
            f"resume latency (kill -> next commit): median {statistics.median(latencies):.2f} s, p95 "
            f"{_quantile(latencies, 0.95):.2f} s, max {max(latencies):.2f} s ({len(latencies)} resumes)"
        )
    lat = [c["latency_s"] for c in tp["crashes"] if c.get("latency_s") is not None]
    median_lat = statistics.median(lat) if lat else 0.0
    lines.append(
        f"node crashes: {tp['crashes_count']} crash records, {tp['recovered_count']} recovered; crash -> serving "
        f"median {median_lat:.2f} s; iterations {tp['iterations_completed']} completed, {tp['iterations_executed']} "
        f"executed, {tp['aborted_attempts']} attempts aborted; median iteration {median_it:.2f} s"
    )
    ok = tp["recovered_count"] == tp["crashes_count"] and not tp["open_crashes"]
    verdicts.append(
        f"every node crash recovered ({tp['recovered_count']} of {tp['crashes_count']}): {_met(ok)}"
    )
    bad = [
        (o["resume"], n, why)
        for o in outages
        for n, why in o["replaced"].items()
        if not any(reason in why for reason in REPLACE_OK)
    ]
    ok = len(outages) == len(kills) and not bad
    verdicts.append(
        f"every resume re-adopted the live nodes ({len(outages)} resumes for {len(kills)} kills"
        f"{'; replaced live nodes: ' + str(bad) if bad else ''}): {_met(ok)}"
    )
    its = [it for it, _ in tp["loss_curve"]]
    ok = tp["status"] == "completed" and its == list(range(args.iterations))
    verdicts.append(
        f"nothing committed lost (status {tp['status']}, each of {len(its)} iterations once): {_met(ok)}"
    )
    stamps = [t for _, t in _commits(log_text)]
    training = []  # each incarnation's samples from its first commit to its last (no start-up, no shutdown)
    for inc in incarnations:
        own = [t for t in stamps if inc["t_start"] <= t <= inc["t_end"]]
        if own:
            training.append([x for x in inc["samples"] if min(own) <= x["wall"] <= max(own)])
    for key, unit, allow in (
        ("fds", "", f"+{args.fd_slack}"),
        ("rss_mib", " MiB", f"+{args.rss_growth:.0%}"),
    ):
        medians = [statistics.median(x[key] for x in samples) for samples in training if len(samples) >= 3]
        if len(medians) < 2:
            verdicts.append(
                f"supervisor {key} flat across restarts: fewer than 2 sampled incarnations: missed"
            )
            continue
        first, worst = medians[0], max(medians[1:])
        ok = worst - first <= args.fd_slack if key == "fds" else worst <= first * (1 + args.rss_growth)
        lines.append(
            f"supervisor {key} per incarnation (median): {', '.join(f'{m:.0f}' for m in medians)}{unit}"
        )
        verdicts.append(
            f"supervisor {key} flat across restarts (max {worst:.0f} vs first {first:.0f}, {allow}): {_met(ok)}"
        )
    resumed = {o["from_iteration"] for o in outages}
    quiet = [r["wall_s"] for r in tp["iterations"] if r["iteration"] not in resumed]
    if quiet:
        stall = max(quiet) - median_it
        bound = median_lat + args.stall_slack_s
        verdicts.append(
            f"stall {stall:.1f} s <= median crash->serving + {args.stall_slack_s:.0f} s = {bound:.1f} s (iterations "
            f"without a resume): {_met(stall <= bound)}"
        )
    if latencies:
        bound = args.resume_slack_s + 2 * median_it
        verdicts.append(
            f"resume latency max {max(latencies):.1f} s <= {args.resume_slack_s:.0f} s + 2 x median iteration = "
            f"{bound:.1f} s: {_met(max(latencies) <= bound)}"
        )
    return lines + verdicts


def _met(ok: bool) -> str:
    return "met" if ok else "missed"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/swarm_tiny.json", help="swarm topology config")
    p.add_argument("--setting", default="ours-plus", help="swarm setting")
    p.add_argument("--iterations", type=int, default=200, help="committed iterations of the run")
    p.add_argument(
        "--rate", type=float, default=16, help="node (stage) failure rate in %%/h of the crash schedule"
    )
    p.add_argument("--kills", type=int, default=10, help="times the supervisor is SIGKILLed and resumed")
    p.add_argument("--seed", type=int, default=0, help="seed of the crash schedule and of the kills")
    p.add_argument("--out", type=Path, help="output directory (default runs/soak-resume-<iterations>)")
    p.add_argument("--sample-s", type=float, default=2.0, help="seconds between fd/RSS samples")
    p.add_argument("--stall-slack-s", type=float, default=10.0, help="the stall target's seconds of slack")
    p.add_argument("--resume-slack-s", type=float, default=30.0, help="the resume target's seconds of slack")
    p.add_argument("--fd-slack", type=int, default=16, help="fds a later supervisor may hold above the first")
    p.add_argument("--rss-growth", type=float, default=0.25, help="RSS growth a later supervisor may show")
    p.add_argument("--timeout-s", type=float, help="wall-clock limit (default 300 + 30 s/iteration)")
    p.add_argument("--time-scale", type=float, help="override the config's time_scale")
    p.add_argument("--dry-run", action="store_true", help="write the schedule and the kill plan, run nothing")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    for name in ("sample_s", "stall_slack_s", "resume_slack_s", "rss_growth"):
        if not getattr(args, name) >= 0:
            print(
                f"soak_resume.py: error: --{name.replace('_', '-')} is {getattr(args, name)}; expected >= 0."
            )
            return 2
    sys.path.insert(0, str(ROOT))
    from checkfree.swarm.config import load_swarm_config

    try:
        cfg = load_swarm_config(args.config, {})
    except (ValueError, FileNotFoundError) as exc:
        print(f"soak_resume.py: error: {exc}", file=sys.stderr)
        return 2
    out = (args.out or Path("runs") / f"soak-resume-{args.iterations}").resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        print(
            f"soak_resume.py: error: --out {out} holds something already; expected a new or empty directory."
        )
        return 2
    out.mkdir(parents=True, exist_ok=True)
    gen = [sys.executable, str(ROOT / "failure_generator.py"), "--rate", f"{args.rate:g}", "--stages",
           str(cfg.n_stages), "--replicas", str(cfg.replicas), "--iterations", str(args.iterations), "--seed",
           str(args.seed), "--out", str(out / "schedule.json")]  # fmt: skip
    subprocess.run(gen, cwd=ROOT, check=True, capture_output=True)
    schedule = json.loads((out / "schedule.json").read_text())
    crashes = sorted({it for its in schedule.values() for it in its[:-1]})
    try:
        kills = plan_kills(args.iterations, args.kills, crashes, args.seed)
    except ValueError as exc:
        print(f"soak_resume.py: error: {exc}", file=sys.stderr)
        return 2
    (out / "kills.json").write_text(json.dumps(kills, indent=1))
    print(f"schedule: {args.rate:g} %/h, crashes at iterations {crashes}; kills: "
          f"{[(k['kind'], k['iteration']) for k in kills]}")  # fmt: skip
    if args.dry_run:
        return 0
    t0 = time.monotonic()
    done, incarnations = run_soak(args, out, kills)
    (out / "kills.json").write_text(json.dumps(done, indent=1))
    lines = [
        f"soak: {args.setting}, {args.iterations} iterations, {time.monotonic() - t0:.0f} s wall ({out / 'run'})"
    ]
    lines += report(out, done, incarnations, args)
    (out / "soak_report.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return exit_code(lines)


def exit_code(lines: list[str]) -> int:
    """The soak's exit status: 0 when every verdict line of ``lines`` says met, 1 when one is missed (or there is
    none)."""
    verdicts = [line for line in lines if line.endswith((": met", ": missed"))]
    return 0 if verdicts and all(v.endswith(": met") for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
