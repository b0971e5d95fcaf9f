"""Soak the swarm with churn: hundreds to thousands of process deaths, and no stall, fd leak or memory growth.

Writes a crash schedule in the authors' node format (``{"node": [iterations..., sentinel]}``, what
``swarm run --schedule`` replays: the supervisor SIGKILLs each listed node partway through the iteration) with
single replicas, whole stages, adjacent pairs of stages (0+1 included) and stage 0, plus a recovery-kill schedule
(``swarm run --recovery-kills``, checkfree/swarm/supervisor/recovery_kills.py) for what a crash schedule cannot
name: replacements killed while they recover, and the sources of a replacement killed mid-fetch. Then it runs
``python -m checkfree swarm run`` (default configs/swarm_tiny.json, ``ours-plus``), samples the supervisor's
open file descriptors (``/proc/PID/fd``) and resident memory (``VmRSS``) every few seconds, reads
throughput.json and supervisor.log, and prints:

* deaths by kind (from supervisor.log's "is gone" lines), crashes recovered, iterations given up;
* median and p95 crash → serving, the longest iteration against the median;
* fds and RSS first / last / max;
* one verdict line per target, "met" or "missed": stall (longest − median iteration) ≤ median crash → serving
  + ``--stall-slack-s``; fds flat (last-quarter median − first-quarter median ≤ ``--fd-slack``); RSS flat
  (last-quarter median ≤ first-quarter median × (1 + ``--rss-growth``)).

It exits 0 only when the swarm run exited 0 and every verdict is met; 1 when a verdict is missed or the run
failed; 2 for a bad argument.

``--checkpoint-storage-kill S`` runs the ``checkpoint`` setting instead and SIGKILLs the storage node every S
seconds (by the pid supervisor.log gives for it, checked to be a grandchild of the supervisor).

    .venv/bin/python benchmarks/soak_swarm.py --iterations 40 --deaths 100 --out runs/soak-smoke     # smoke
    .venv/bin/python benchmarks/soak_swarm.py --iterations 330 --deaths 1000 --out runs/soak-1000    # the soak
    .venv/bin/python benchmarks/soak_swarm.py --checkpoint-storage-kill 30 --iterations 40 --deaths 60

Everything goes under ``--out`` (it must not exist or be empty): ``schedule.json``, ``recovery_kills.json``,
``samples.jsonl``, ``soak_report.txt`` and the swarm's run directory ``run/``.

``--reference`` then runs the same swarm command without the schedules (``reference/``) and prints issue 39's
useful-work fraction, its mean iteration time ÷ the soak's; ``--useful-work-target F`` adds its verdict.
``--replicas-only`` schedules only deaths that leave every stage a serving replica. The swarm run gets a wall-clock
limit (``--timeout-s``); past it the supervisor is interrupted (SIGINT: it reaps its nodes), then killed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KILLS_FORMAT = "checkfree-recovery-kills-v1"
EVENT_KINDS = ("single", "stage", "pair", "stage0", "replacement", "source")
"""Loss events the schedule mixes: a single replica; every replica of a transformer stage; of two adjacent
stages (0+1 included); of stage 0; a single replica whose replacement is killed while it recovers; a single
replica whose last live sibling (its source) is killed mid-fetch."""

REPLICA_KINDS = ("single", "replacement")
"""The kinds whose deaths leave the stage a serving replica: a single replica, and a single replica whose
replacement is killed while it recovers (its sibling serves throughout)."""

DEATH_KINDS = (
    ("scheduled", r"^scheduled crash"),
    ("replacement killed while recovering", r"^recovery kill: replacement"),
    ("source killed mid-fetch", r"^recovery kill: source"),
    ("storage node killed", r"^storage:"),
    ("not serving in time", r"^not serving within"),
    ("recovery failed", r"^its recovery failed"),
    ("rebuilt by a superseded plan", r"^rebuilt by rule"),
    ("silent", r"^silent for"),
    ("exited by itself", r"^process exited"),
)
"""Death causes in supervisor.log ("node N (slot S, stage T) is gone: CAUSE"), first match wins."""

GONE = re.compile(r"node (\d+) \(slot (-?\d+), stage (-?\d+)\) is gone: (.*)$")
STARTED = re.compile(r"host: started node (\d+) \(stage (-?\d+)[^)]*\), pid (\d+)")


# ---------------------------------------------------------------------------------------------- schedules


def expected_deaths(kind: str, replicas: int) -> int:
    """Deaths one event of ``kind`` causes when every kill fires (a source kill of a single-replica loss
    kills the one sibling left)."""
    return {"single": 1, "stage": replicas, "pair": 2 * replicas, "stage0": replicas}.get(kind, 2)


def make_schedules(
    n_stages: int,
    replicas: int,
    iterations: int,
    deaths: int,
    seed: int = 0,
    warmup: int = 2,
    replicas_only: bool = False,
) -> tuple[dict[str, list[int]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The crash schedule, the recovery kills and the event list of a soak run.

    Events go to iterations ``warmup .. iterations − 1``, spread so that the expected deaths so far keep up
    with ``deaths`` × the share of iterations done; the kinds of :data:`EVENT_KINDS` take turns in a seeded
    random order, and one iteration's events kill disjoint slots (at most half the swarm). Node ``n`` holds
    stage ``n // replicas`` (docs/paper.md §8). ``replicas_only``: only the kinds of :data:`REPLICA_KINDS`, and one
    iteration's events leave every stage at least one replica (at most ``replicas − 1`` of a stage's slots), so
    no death takes a whole stage (issue 39's "deaths always leave each stage a serving replica").

    Returns:
        (``{"node": [crash iterations..., sentinel]}`` for every node, the recovery-kill entries, the events
        ``{"iteration", "kind", "slots", "expected_deaths"}``).
    Raises:
        ValueError: a count that does not fit (one sentence naming it).
    """
    if n_stages < 2 or replicas < 2:
        raise ValueError(f"{n_stages} stages x {replicas} replicas: the soak needs >= 2 of each.")
    if iterations <= warmup:
        raise ValueError(f"--iterations is {iterations}; expected more than the {warmup} warm-up iterations.")
    if deaths < 1:
        raise ValueError(f"--deaths is {deaths}; expected a positive number of deaths.")
    rng = random.Random(seed)
    kinds = REPLICA_KINDS if replicas_only else EVENT_KINDS
    n_nodes = (n_stages + 1) * replicas
    crashes: dict[int, list[int]] = {n: [] for n in range(n_nodes)}
    kills: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    order: list[str] = []
    scheduled = 0
    span = iterations - warmup
    for it in range(warmup, iterations):
        owed = deaths * (it - warmup + 1) / span - scheduled
        used: set[int] = set()
        redraws = 0
        while owed > 0:
            if not order:
                order = list(kinds)
                rng.shuffle(order)
            kind = order.pop()
            slots = _event_slots(kind, rng, n_stages, replicas)
            stages = Counter(n // replicas for n in used | set(slots))
            takes_a_stage = replicas_only and max(stages.values()) >= replicas
            if used & set(slots) or len(used | set(slots)) > n_nodes // 2 or takes_a_stage:
                redraws += replicas_only
                if replicas_only and redraws <= 50:  # another slot may fit this iteration
                    order.append(kind)
                    continue
                if used:
                    order.append(kind)  # try it again in a later iteration
                    break
                continue
            used |= set(slots)
            for n in slots:
                crashes[n].append(it)
            n_dead = expected_deaths(kind, replicas)
            if kind in ("replacement", "source"):
                kills.append({"iteration": it, "kind": kind, "after_s": round(rng.uniform(0.0, 0.3), 3)})
            events.append({"iteration": it, "kind": kind, "slots": slots, "expected_deaths": n_dead})
            scheduled += n_dead
            owed -= n_dead
    schedule = {str(n): its + [iterations + 1] for n, its in crashes.items()}
    return schedule, kills, events


def _event_slots(kind: str, rng: random.Random, n_stages: int, replicas: int) -> list[int]:
    def stage_slots(stage: int) -> list[int]:
        return list(range(stage * replicas, (stage + 1) * replicas))

    if kind in ("single", "replacement", "source"):
        return [rng.randrange((n_stages + 1) * replicas)]
    if kind == "stage":
        return stage_slots(rng.randint(1, n_stages))
    if kind == "pair":
        first = rng.randint(0, n_stages - 1)
        return stage_slots(first) + stage_slots(first + 1)
    return stage_slots(0)


# ---------------------------------------------------------------------------------------------- sampling


def proc_sample(pid: int) -> dict[str, float] | None:
    """Open fds and resident MiB of process ``pid`` now (None once it is gone)."""
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    rss = int(match.group(1)) / 1024 if match else float("nan")
    return {"fds": fds, "rss_mib": rss}


class Sampler(threading.Thread):
    """Samples ``pid`` every ``every_s`` seconds until it exits or :meth:`stop` is called."""

    def __init__(self, pid: int, every_s: float, out: Path) -> None:
        super().__init__(daemon=True)
        self.pid, self.every_s, self.out = pid, every_s, out
        self.samples: list[dict[str, float]] = []
        self.t0 = time.monotonic()
        self._stop_event = threading.Event()

    def run(self) -> None:
        with open(self.out, "a", encoding="utf-8") as f:
            while not self._stop_event.is_set():
                sample = proc_sample(self.pid)
                if sample is None:
                    return
                sample["t"] = round(time.monotonic() - self.t0, 2)
                sample["wall"] = round(time.time(), 2)
                self.samples.append(sample)
                f.write(json.dumps(sample) + "\n")
                f.flush()
                self._stop_event.wait(self.every_s)

    def stop(self) -> None:
        self._stop_event.set()


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


class StorageKiller(threading.Thread):
    """SIGKILLs the storage node every ``every_s`` seconds from the first committed iteration on (start-up
    does not count): its newest pid from supervisor.log, only when that process is a grandchild of the
    supervisor (the supervisor forks nodes from its forkserver)."""

    def __init__(self, supervisor_pid: int, log_path: Path, every_s: float) -> None:
        super().__init__(daemon=True)
        self.supervisor_pid, self.log_path, self.every_s = supervisor_pid, log_path, every_s
        self.kills: list[int] = []
        self._stop_event = threading.Event()

    def _log(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def _storage_pid(self) -> int | None:
        pids = [int(m.group(3)) for m in STARTED.finditer(self._log()) if m.group(2) == "-1"]
        return pids[-1] if pids else None

    def run(self) -> None:
        while "iteration 0 committed" not in self._log():
            if self._stop_event.wait(0.5):
                return
        while not self._stop_event.wait(self.every_s):
            pid = self._storage_pid()
            parent = _ppid(pid) if pid is not None else None
            if pid is None or parent is None or _ppid(parent) != self.supervisor_pid:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.kills.append(pid)

    def stop(self) -> None:
        self._stop_event.set()


# ---------------------------------------------------------------------------------------------- the report


def _quantile(xs: list[float], q: float) -> float | None:
    """Nearest-rank quantile (q in 0..1) of ``xs``; None when empty."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def deaths_by_kind(log_text: str) -> Counter[str]:
    """Deaths in supervisor.log by cause (:data:`DEATH_KINDS`; "other" when none matches). The storage node's
    deaths are "storage node killed" whatever the cause."""
    counts: Counter[str] = Counter()
    for line in log_text.splitlines():
        m = GONE.search(line)
        if m is None:
            continue
        cause = "storage: " + m.group(4) if m.group(3) == "-1" else m.group(4)
        kind = next((name for name, pattern in DEATH_KINDS if re.search(pattern, cause)), "other")
        counts[kind] += 1
    return counts


def _flat(values: list[float]) -> tuple[float, float] | None:
    """(median of the first quarter, median of the last quarter) of a series of ≥ 4 samples."""
    if len(values) < 4:
        return None
    q = len(values) // 4
    return statistics.median(values[:q]), statistics.median(values[-q:])


def training_window(log_text: str) -> tuple[float, float] | None:
    """Wall-clock seconds (epoch) of the first and the last committed iteration in supervisor.log, or None."""
    stamps = re.findall(
        r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) .*iteration \d+ committed", log_text, re.M
    )
    if not stamps:
        return None
    to_s = [time.mktime(time.strptime(day, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000 for day, ms in stamps]
    return to_s[0], to_s[-1]


def report(
    throughput: dict[str, Any] | None,
    log_text: str,
    samples: list[dict[str, float]],
    stall_slack_s: float = 10.0,
    fd_slack: int = 16,
    rss_growth: float = 0.25,
) -> list[str]:
    """The soak's report lines, ending with one verdict line per target ("met" / "missed"); a run that did not
    finish (no throughput.json) misses every target it cannot show. Samples with a ``wall`` time count only
    between the first and the last committed iteration (not the start-up, not the shutdown)."""
    window = training_window(log_text)
    if window is not None:
        samples = [s for s in samples if "wall" not in s or window[0] <= s["wall"] <= window[1]]
    lines: list[str] = []
    deaths = deaths_by_kind(log_text)
    lines.append(f"deaths: {sum(deaths.values())}")
    for kind, n in deaths.most_common():
        lines.append(f"  {kind}: {n}")
    failed = re.search(r"swarm run failed: (.*?)(?: \(logs in .*)?$", log_text, re.M)
    given_up = re.findall(r"iteration (\d+) failed \d+ attempts", log_text)
    lines.append(
        f"iterations given up: {len(given_up)}" + (f" (iteration {', '.join(given_up)})" if given_up else "")
    )
    asked, sent = log_text.count("asks for a new plan"), len(re.findall(r"gets plan \d+", log_text))
    lines.append(f"new plans asked by replacements: {asked}; new plans sent: {sent}")
    if failed:
        lines.append(f"the run stopped: {failed.group(1)}")
    median_lat = None
    stall_ok = False
    if throughput is not None:
        lat = [c["latency_s"] for c in throughput["crashes"] if c.get("latency_s") is not None]
        walls = [r["wall_s"] for r in throughput["iterations"]]
        median_lat, p95 = statistics.median(lat) if lat else None, _quantile(lat, 0.95)
        lines.append(
            f"crashes recovered: {throughput['recovered_count']} of {throughput['crashes_count']} crash records "
            f"(slots; a replacement lost before it serves belongs to its slot's crash); iterations "
            f"{throughput['iterations_completed']} completed, {throughput['iterations_executed']} executed, "
            f"{throughput['aborted_attempts']} attempts aborted"
        )
        if "useful_work_fraction" in throughput:  # absent in an older throughput.json
            useful = throughput["useful_work_fraction"]
            lines.append(
                "useful-work fraction within the run (mean iteration without a crash or an abort / mean "
                "iteration; issue 39 compares with a crash-free run instead): "
                + ("none (no clean iteration)" if useful is None else f"{useful:.2f}")
            )
        if lat:
            lines.append(
                f"crash -> serving: median {median_lat:.2f} s, p95 {p95:.2f} s, max {max(lat):.2f} s "
                f"({len(lat)} recoveries)"
            )
        if walls:
            longest = max(range(len(walls)), key=walls.__getitem__)
            med = statistics.median(walls)
            lines.append(
                f"iterations: median {med:.2f} s, longest {walls[longest]:.2f} s (iteration "
                f"{throughput['iterations'][longest]['iteration']}), {walls[longest] / med:.1f}x the median; "
                f"total {throughput['total_s']:.0f} s"
            )
            stall = walls[longest] - med
            bound = (median_lat or 0.0) + stall_slack_s
            stall_ok = stall <= bound
            stall_line = (
                f"stall {stall:.1f} s <= median crash->serving + {stall_slack_s:.0f} s = {bound:.1f} s"
            )
        else:
            stall_line = "stall: no iteration committed"
    else:
        lines.append("no throughput.json: the run did not finish")
        stall_line = "stall: the run did not finish"
    verdicts = [f"{stall_line}: {'met' if stall_ok else 'missed'}"]
    for key, unit, fmt in (("fds", "", "{:.0f}"), ("rss_mib", " MiB", "{:.1f}")):
        values = [s[key] for s in samples if key in s]
        if not values:
            verdicts.append(f"{key} flat: no samples: missed")
            continue
        first, last, peak = values[0], values[-1], max(values)
        lines.append(
            f"supervisor {key}: first {fmt.format(first)}{unit}, last {fmt.format(last)}{unit}, "
            f"max {fmt.format(peak)}{unit} ({len(values)} samples)"
        )
        quarters = _flat(values)
        if quarters is None:
            verdicts.append(f"{key} flat: fewer than 4 samples: missed")
            continue
        q1, q4 = quarters
        if key == "fds":
            ok, limit = q4 - q1 <= fd_slack, f"<= +{fd_slack}"
        else:
            ok, limit = q4 <= q1 * (1 + rss_growth), f"<= +{rss_growth:.0%}"
        verdicts.append(
            f"{key} flat (last-quarter median {fmt.format(q4)} vs first-quarter {fmt.format(q1)}, {limit}): "
            f"{'met' if ok else 'missed'}"
        )
    return lines + verdicts


def useful_work_fraction(reference: dict[str, Any], soak: dict[str, Any]) -> float | None:
    """Issue 39's useful-work fraction: the mean iteration time of the run without deaths ÷ that of the run with
    them (throughput.json ``iterations[].wall_s``, committed iterations; each run's mean over its own), None when
    either committed none."""
    clean = [r["wall_s"] for r in reference["iterations"]]
    churned = [r["wall_s"] for r in soak["iterations"]]
    if not clean or not churned:
        return None
    return statistics.fmean(clean) / statistics.fmean(churned)


def reference_run(cmd: list[str], out: Path, timeout: float) -> dict[str, Any] | None:
    """Run ``cmd`` (the soak's swarm command) with ``--no-schedule`` instead of its schedules, into
    ``out``/reference: its throughput.json, None when it did not finish."""
    i = cmd.index("--schedule")
    clean = cmd[:i] + ["--no-schedule"] + cmd[i + 4 :]  # for --schedule S --recovery-kills K
    j = clean.index("--run-dir")
    clean[j + 1] = str(out / "reference")
    with open(out / "reference.out", "w", encoding="utf-8") as console:
        proc = subprocess.Popen(clean, stdout=console, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=60)
    path = out / "reference" / "throughput.json"
    return json.loads(path.read_text()) if code == 0 and path.is_file() else None


def reference_lines(
    reference: dict[str, Any] | None, soak: dict[str, Any] | None, target: float | None
) -> list[str]:
    """The useful-work line (and its verdict when ``target`` is given; missed when a run did not finish)."""
    fraction = useful_work_fraction(reference, soak) if reference and soak else None
    if fraction is None:
        line = "useful-work fraction: a run did not finish or committed no iteration"
        return [line + (": missed" if target is not None else "")]
    clean = statistics.fmean(r["wall_s"] for r in reference["iterations"])
    line = (
        f"useful-work fraction {fraction:.3f} (mean iteration {clean:.2f} s without deaths, "
        f"{statistics.fmean(r['wall_s'] for r in soak['iterations']):.2f} s with them)"
    )
    if target is None:
        return [line]
    return [f"{line} >= {target}: {'met' if fraction >= target else 'missed'}"]


# ---------------------------------------------------------------------------------------------- main


def exit_code(run_code: int, lines: list[str]) -> int:
    """The soak's exit status: 0 when the swarm run exited 0 and every verdict line of ``lines`` says met, 1
    when the run failed or a verdict is missed (or there is none)."""
    verdicts = [line for line in lines if line.endswith((": met", ": missed"))]
    return 0 if run_code == 0 and verdicts and all(v.endswith(": met") for v in verdicts) else 1


def _fail(message: str) -> int:
    print(f"soak_swarm.py: error: {message}", file=sys.stderr)
    return 2


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/swarm_tiny.json", help="swarm topology config")
    p.add_argument(
        "--setting", default="ours-plus", help="swarm setting (checkpoint with --checkpoint-storage-kill)"
    )
    p.add_argument("--iterations", type=int, default=40, help="committed iterations of the run")
    p.add_argument("--deaths", type=int, default=100, help="process deaths the schedules aim at")
    p.add_argument("--seed", type=int, default=0, help="seed of the schedules")
    p.add_argument(
        "--out", type=Path, help="output directory (default runs/soak-<setting>-<iterations>, from here)"
    )
    p.add_argument(
        "--checkpoint-storage-kill",
        type=float,
        metavar="S",
        help="run the checkpoint setting and SIGKILL the storage node every S seconds",
    )
    p.add_argument("--sample-s", type=float, default=2.0, help="seconds between fd/RSS samples")
    p.add_argument("--stall-slack-s", type=float, default=10.0, help="the stall target's seconds of slack")
    p.add_argument("--fd-slack", type=int, default=16, help="fds the last quarter may hold above the first")
    p.add_argument("--rss-growth", type=float, default=0.25, help="RSS growth the last quarter may show")
    p.add_argument(
        "--timeout-s", type=float, help="wall-clock limit of the swarm run (default 120 + 20 s/iteration)"
    )
    p.add_argument("--time-scale", type=float, help="override the config's time_scale")
    p.add_argument(
        "--replicas-only",
        action="store_true",
        help="only deaths that leave every stage a serving replica (single replicas, replacements killed)",
    )
    p.add_argument(
        "--reference",
        action="store_true",
        help="then run the same swarm without deaths for the useful-work fraction (its mean iteration time "
        "over the soak's)",
    )
    p.add_argument(
        "--useful-work-target",
        type=float,
        metavar="F",
        help="a verdict line: the useful-work fraction is at least F (needs --reference)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="write the schedules, print the command, run nothing"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    sys.path.insert(0, str(ROOT))
    from checkfree.swarm.config import load_swarm_config

    setting = "checkpoint" if args.checkpoint_storage_kill is not None else args.setting
    if args.checkpoint_storage_kill is not None and not args.checkpoint_storage_kill > 0:
        return _fail(f"--checkpoint-storage-kill is {args.checkpoint_storage_kill}; expected seconds > 0.")
    if args.useful_work_target is not None and not (args.reference and 0 < args.useful_work_target <= 1):
        return _fail(
            f"--useful-work-target is {args.useful_work_target}; expected a fraction in (0, 1] with --reference."
        )
    for name in ("sample_s", "stall_slack_s", "rss_growth"):
        if not getattr(args, name) >= 0:
            return _fail(f"--{name.replace('_', '-')} is {getattr(args, name)}; expected a number >= 0.")
    try:
        cfg = load_swarm_config(args.config, {})
        schedule, kills, events = make_schedules(
            cfg.n_stages,
            cfg.replicas,
            args.iterations,
            args.deaths,
            args.seed,
            replicas_only=args.replicas_only,
        )
    except (ValueError, FileNotFoundError) as exc:
        return _fail(str(exc))
    out = (args.out or Path("runs") / f"soak-{setting}-{args.iterations}").resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        return _fail(f"--out {out} holds something already; expected a new or empty directory.")
    out.mkdir(parents=True, exist_ok=True)
    (out / "schedule.json").write_text(json.dumps(schedule))
    (out / "recovery_kills.json").write_text(json.dumps({"format": KILLS_FORMAT, "kills": kills}, indent=1))
    (out / "events.json").write_text(json.dumps(events, indent=1))
    kinds = Counter(e["kind"] for e in events)
    planned = sum(e["expected_deaths"] for e in events)
    print(
        f"schedule: {len(events)} loss events over iterations 2..{args.iterations - 1} "
        f"({', '.join(f'{k} {kinds[k]}' for k in EVENT_KINDS if k in kinds)}), ~{planned} deaths if every kill "
        "fires"
    )
    cmd = [
        sys.executable, "-m", "checkfree", "swarm", "run", "--setting", setting, "--config", str(args.config),
        "--schedule", str(out / "schedule.json"), "--recovery-kills", str(out / "recovery_kills.json"),
        "--iterations", str(args.iterations), "--run-dir", str(out / "run"),
    ]  # fmt: skip
    if args.time_scale is not None:
        cmd += ["--time-scale", str(args.time_scale)]
    print("command:", " ".join(cmd))
    if args.dry_run:
        return 0
    timeout = args.timeout_s or 120 + 20 * args.iterations
    t0 = time.monotonic()
    with open(out / "swarm_run.out", "w", encoding="utf-8") as console:
        proc = subprocess.Popen(cmd, stdout=console, stderr=subprocess.STDOUT)
        sampler = Sampler(proc.pid, args.sample_s, out / "samples.jsonl")
        sampler.start()
        killer = None
        if args.checkpoint_storage_kill is not None:
            killer = StorageKiller(proc.pid, out / "run" / "supervisor.log", args.checkpoint_storage_kill)
            killer.start()
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"the swarm run passed --timeout-s {timeout:.0f}; interrupting it (pid {proc.pid})")
            proc.send_signal(signal.SIGINT)  # the supervisor reaps its nodes
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait(timeout=30)
        finally:
            sampler.stop()
            if killer is not None:
                killer.stop()
    wall = time.monotonic() - t0
    path = out / "run" / "throughput.json"
    throughput = json.loads(path.read_text()) if path.is_file() else None
    log_path = out / "run" / "supervisor.log"
    log_text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    lines = [f"swarm run: setting {setting}, exit code {code}, {wall:.0f} s wall ({out / 'run'})"]
    if killer is not None:
        lines.append(f"storage node SIGKILLs sent by the soak: {len(killer.kills)}")
    node_logs = "\n".join(f.read_text(errors="replace") for f in sorted((out / "run").glob("node*.log")))
    lines.append(
        f"node logs: {node_logs.count('asking the supervisor for a new plan')} asks for a new plan, "
        f"{node_logs.count('left the swarm); asking the next candidate')} retries after a source left, "
        f"{node_logs.count('holds no copy of the stage-0')} answers 'holds no copy'"
    )
    lines += report(throughput, log_text, sampler.samples, args.stall_slack_s, args.fd_slack, args.rss_growth)
    if args.reference:
        lines += reference_lines(reference_run(cmd, out, timeout), throughput, args.useful_work_target)
    (out / "soak_report.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return exit_code(code, lines)


if __name__ == "__main__":
    sys.exit(main())
