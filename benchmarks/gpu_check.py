"""The simulator and the swarm on CUDA at paper scale, in one call of at most 8 min on one H100 (docs/gpu.md).

    benchmarks/gpu_check.sh                        # on a CUDA machine: the default sections, one table
    benchmarks/gpu_check.sh --plan                 # on any CPU: every section's inputs at full size, no training
    benchmarks/gpu_check.sh --sections 1,3,5       # (or SECTIONS=1,3,5) only those sections
    SMOKE=1 DEVICE=cpu benchmarks/gpu_check.sh     # every section's logic on the CPU, micro sizes, in a minute

The sections and what they measure: gpu_check_sections.py. Each has a budget in seconds on one H100; the default
set (all eight) ends within :data:`DEADLINE_S` (8 min) of the check's start: sections 1–5 have budgets that sum,
with the start-up, to at most that, and sections 6 (``--compile``), 7 (convergence under failures) and 8
(``--compile-mode reduce-overhead``) run only when enough time remains. A section stops itself at its budget (or at the deadline, whichever comes first;
SIGALRM) and records a row saying so, then the next one runs; ``--budgets 5=200`` changes a budget,
``--deadline`` the deadline. ``--plan`` prints each section's expected seconds and how they were estimated
(gpu_check_estimate.py).

``--plan`` builds, on the CPU and at full size, everything each selected section builds before it trains: the
configs with the check's overrides through the simulator's preflight, the tokenizers and token caches of the sizes
each section asks for, the training and validation batches, the swarm's ``--dry-run``; then the memory estimate
against an H100's memory and the expected time. It fails (exit code 1) with one sentence on anything that would
fail on the GPU: data too small, a config refused, a missing package, a run that would not fit, a section whose
expected time exceeds its budget, budgets that exceed the deadline. It trains nothing and writes only the token
caches ($CHECKFREE_CACHE or ~/.cache/checkfree, or --cache-dir).

Every row is printed as soon as it is measured and written to OUT_DIR/gpu_check.md (appended) and
OUT_DIR/gpu_check.json (rewritten, strict JSON: every row, each section's budget, seconds and how it ended, the
status); at the end, and on SIGTERM, OUT_DIR/gpu_check_logs.tar.gz gets the runs' logs (gpu_check_report.py).
OUT_DIR (--out-dir, or the OUT_DIR environment variable) defaults to runs/gpu_check-<UTC time>; one that already
holds a report is refused (exit code 2, nothing written). Between sections the models are freed and CUDA's peak
memory statistics reset. A section that raises is reported (traceback printed, an "error" row) and the next one
runs; the exit code is then 1. SIGTERM (``timeout``, the machine taken back) ends the whole check at once: the
running section stops (the swarm's processes too), a "terminated" row and status are written, exit code 143;
SIGINT the same with "interrupted" and 130. The runs go to a temporary directory (kept, its path printed).
"""

from __future__ import annotations

import os
import time

STARTED = time.monotonic()
"""The check's start, before the imports (torch's takes seconds): the deadline counts from here."""

# Before torch is imported and anything forks (datasets' map, the swarm's nodes): torch.cuda.is_available() then
# asks NVML instead of initialising CUDA in this process, which forked children could not use.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import argparse  # noqa: E402
import importlib  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from gpu_check_estimate import CHECK_STARTUP_S, H100_MEMORY, H100_PEAK_FLOPS  # noqa: E402
from gpu_check_report import Report, now, out_dir_for  # noqa: E402
from gpu_check_sections import (  # noqa: E402
    DEADLINE_S,
    PACKAGES,
    SECTIONS,
    CheckContext,
    Section,
    free_memory,
    gib,
    smoke_setup,
)

from checkfree.data.sources import DataUnavailableError  # noqa: E402
from checkfree.data.spec import default_cache_dir  # noqa: E402
from checkfree.loss import resolve_loss_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETUP_HINT = "run ./setup.sh (on a GPU machine: ./setup.sh --system-torch --wheelhouse .cache/device_bundle)"


class SectionTimeout(BaseException):
    """A section reached its budget (SIGALRM). Not an Exception: nothing on the way up may take it for a failure
    of its own (checkfree's run_simulation records an Exception as the run's failure and re-raises it)."""


class CheckStopped(BaseException):
    """SIGTERM or SIGINT: the whole check ends now (not a KeyboardInterrupt, which a simulator run turns into an
    ordinary exception, RunInterrupted)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_STOPPING: list[int] = []


def _alarm(signum: int, frame: object) -> None:
    raise SectionTimeout()


def _stop(signum: int, frame: object) -> None:
    if _STOPPING:  # a second signal while the first one is handled changes nothing
        return
    _STOPPING.append(signum)
    raise CheckStopped(signum)


# ------------------------------------------------------------------------------------------------ options


def parse_sections(value: str) -> list[int]:
    """ "1,3,5" → [1, 3, 5] (run in section order). Raises ValueError (one sentence) for anything else."""
    numbers = {s.number for s in SECTIONS}
    parts = [p.strip() for p in value.split(",")]
    if not all(p.isdigit() and int(p) in numbers for p in parts) or len(set(parts)) != len(parts):
        raise ValueError(
            f"--sections is {value!r}; expected distinct section numbers from {min(numbers)} to {max(numbers)}, "
            "comma-separated, e.g. 1,3,5."
        )
    return sorted(int(p) for p in parts)


def parse_budgets(value: str) -> dict[int, float]:
    """ "1=60,5=200" → {1: 60.0, 5: 200.0} (seconds). Raises ValueError (one sentence) for anything else."""
    numbers = {s.number for s in SECTIONS}
    out: dict[int, float] = {}
    for part in value.split(","):
        key, _, seconds = part.strip().partition("=")
        try:
            number, budget = int(key), float(seconds)
        except ValueError:
            number, budget = 0, 0.0
        if number not in numbers or not budget > 0 or budget == float("inf"):
            raise ValueError(
                f"--budgets is {value!r}; expected SECTION=SECONDS pairs, comma-separated, with sections from "
                f"{min(numbers)} to {max(numbers)} and positive seconds, e.g. 1=60,5=200."
            )
        out[number] = budget
    return out


def schedule(section: Section, budget: float | None, left: float | None) -> tuple[float | None, str | None]:
    """(the budget this section runs with, None), or (None, why it is skipped).

    ``budget``: its budget (None: none, SMOKE); ``left``: seconds before the deadline (None: no deadline). A
    section runs with the smaller of the two; one that runs only if time remains (section 7) is skipped when
    fewer than its ``if_time_remains`` seconds are left, else gets what is left up to its budget.
    """
    if left is not None and left <= 0:
        return None, "skipped: the deadline has passed"
    if section.if_time_remains is not None and left is not None and left < section.if_time_remains:
        return (
            None,
            f"skipped: {left:.0f} s left before the deadline, it needs {section.if_time_remains:.0f} s",
        )
    if budget is None:
        return left, None
    return (budget if left is None else min(budget, left)), None


# ------------------------------------------------------------------------------------------------ plan


def missing_package(sections: list[Section]) -> str | None:
    """The sentence naming the first package a selected section needs that does not import, or None."""
    for sec in sections:
        for module in sec.needs:
            try:
                importlib.import_module(module)
            except ImportError as e:
                return (
                    f"section {sec.number} ({sec.title}) needs the package {PACKAGES[module]} (import {module}: "
                    f"{e}); {SETUP_HINT}."
                )
    return None


def run_plan(ctx: CheckContext, sections: list[Section], budgets: dict[int, float], deadline: float) -> int:
    """Build every section's inputs at full size and print the plan table; 0, or 1 with one sentence."""
    print(
        f"gpu_check --plan: full size on one H100 ({gib(H100_MEMORY)}, {H100_PEAK_FLOPS / 1e12:.0f} TFLOP/s dense "
        f"bf16); inputs built on this CPU, nothing trained; token caches in {ctx.cache_dir or default_cache_dir()}",
        flush=True,
    )
    why = missing_package(sections)
    if why is not None:
        print(f"gpu_check --plan: {why}", file=sys.stderr)
        return 1
    seen: set = set()
    lines = [
        "| section | what it builds (full size) | memory on one GPU (estimate) | expected s | budget s |",
        "|---|---|---|---|---|",
    ]
    how: list[str] = []
    fixed_budgets = 0.0
    planned: list[tuple[Section, float]] = []
    for sec in sections:
        budget = budgets.get(sec.number, sec.budget_s)
        t0 = time.perf_counter()
        try:
            p = sec.plan(ctx, seen)
        except (ValueError, OSError, DataUnavailableError, subprocess.TimeoutExpired) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            print(
                f"gpu_check --plan: section {sec.number} ({sec.title}) would fail on the GPU: {first}",
                file=sys.stderr,
            )
            return 1
        print(f"  planned section {sec.number} in {time.perf_counter() - t0:.1f} s here", flush=True)
        if p.seconds > budget:
            print(
                f"gpu_check --plan: section {sec.number} ({sec.title}) is expected to take {p.seconds:.0f} s on an "
                f"H100, more than its budget of {budget:.0f} s; expected a budget above the expected time.",
                file=sys.stderr,
            )
            return 1
        cond = "" if sec.if_time_remains is None else f" (if ≥ {sec.if_time_remains:.0f} s remain)"
        lines.append(
            f"| {sec.number}. {sec.title}{cond} | {'<br>'.join(p.lines)} | {'<br>'.join(p.memory)} | "
            f"{p.seconds:.0f} | {budget:.0f} |"
        )
        how += [f"  {sec.number}. {h}" for h in p.how]
        if sec.if_time_remains is None:
            fixed_budgets += budget
        planned.append((sec, p.seconds))
    total_budget = fixed_budgets + CHECK_STARTUP_S
    if total_budget > deadline:
        print(
            f"gpu_check --plan: the sections' budgets and the start-up add up to {total_budget:.0f} s, more than the "
            f"deadline of {deadline:.0f} s; expected budgets that fit (--budgets, --deadline).",
            file=sys.stderr,
        )
        return 1
    # the schedule at the expected times: a section that runs only if time remains runs when it does
    elapsed, notes = CHECK_STARTUP_S, []
    for sec, seconds in planned:
        if sec.if_time_remains is None:
            elapsed += seconds
            continue
        left = deadline - elapsed
        runs = left >= sec.if_time_remains
        elapsed += seconds if runs else 0.0
        notes.append(
            f"section {sec.number} runs only if ≥ {sec.if_time_remains:.0f} s remain before the deadline: at the "
            f"expected times {left:.0f} s remain at its turn, so it {'runs' if runs else 'is skipped'}"
        )
    expected = elapsed
    lines.append(
        f"| total | start-up {CHECK_STARTUP_S:.0f} s + the sections that run at the expected times | | "
        f"{expected:.0f} | {total_budget:.0f} of the {deadline:.0f} s deadline (the sections that always run) |"
    )
    print("\n".join(lines + notes))
    print(
        "how each expected time was made (gpu_check_estimate.py; start-up of the check "
        f"{CHECK_STARTUP_S:.0f} s):"
    )
    print("\n".join(how))
    print(
        f"plan passed: {len(sections)} section(s) planned, {expected / 60:.1f} min expected, "
        f"{total_budget / 60:.1f} min budgeted of {deadline / 60:.1f}"
    )
    return 0


# ------------------------------------------------------------------------------------------------ the check


def run_check(
    ctx: CheckContext,
    report: Report,
    sections: list[Section],
    budgets: dict[int, float],
    deadline: float | None,
    started: float,
) -> int:
    """Run ``sections`` in order under their budgets and the deadline; returns the exit code."""
    device = torch.device(ctx.device)
    ok = True
    current: tuple[Section, float, float | None] | None = None
    try:
        for sec in sections:
            label = f"{sec.number}. {sec.title}"
            left = None if deadline is None else started + deadline - time.monotonic()
            default = None if ctx.smoke else sec.budget_s
            budget, skip = schedule(sec, budgets.get(sec.number, default), left)
            print(f"{label}" + ("" if budget is None else f" (budget {budget:.0f} s)"), flush=True)
            if skip is not None:
                report.row(label, "skipped", skip)
                report.section(sec.number, sec.title, None, 0.0, None, "skipped")
                continue
            t0 = time.monotonic()
            current = (sec, t0, budget)
            passed: bool | None = None
            ended = "finished"
            try:
                if budget is not None:
                    signal.setitimer(signal.ITIMER_REAL, budget)
                try:
                    passed = sec.run(ctx)
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except SectionTimeout:
                report.row(
                    label, "stopped", f"at its budget of {budget:.0f} s; the rows above are what it measured"
                )
                passed, ended = False, "budget"
            except Exception as e:  # a broken section is reported; the others still get their device time
                traceback.print_exc()
                report.row(label, "error", f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}")
                passed, ended = False, "error"
            seconds = time.monotonic() - t0
            ok &= passed is not False
            within = "" if budget is None else f" of {budget:.0f} s budgeted"
            report.row(label, "section seconds", f"{seconds:.1f}{within}")
            report.section(sec.number, sec.title, budget, seconds, passed, ended)
            current = None
            free_memory(device)
    except CheckStopped as e:
        signal.setitimer(signal.ITIMER_REAL, 0)
        name = signal.Signals(e.signum).name
        status = "terminated" if e.signum == signal.SIGTERM else "interrupted"
        if current is not None:
            sec, t0, budget = current
            seconds = time.monotonic() - t0
            report.row(
                f"{sec.number}. {sec.title}",
                status,
                f"by {name} after {seconds:.1f} s; the check stopped here",
            )
            report.section(sec.number, sec.title, budget, seconds, False, status)
        report.finish(status, f"{status.upper()} by {name}: the rows above are what was measured")
        report.archive_logs(ctx.root)
        print(f"\n{status} by {name}; what was measured is in {report.out_dir}", file=sys.stderr, flush=True)
        return 128 + e.signum
    report.row("all sections", "seconds", f"{time.monotonic() - started:.1f}")
    print("\n" + report.table())
    verdict = "all checks passed" if ok else "SOME CHECKS FAILED"
    report.finish("passed" if ok else "failed", verdict)
    report.archive_logs(ctx.root)
    print(
        f"\nreport: {', '.join(str(report.out_dir / f) for f in ('gpu_check.md', 'gpu_check.json', 'gpu_check_logs.tar.gz'))}"
    )
    print(f"\n{verdict}")
    return 0 if ok else 1


def main() -> int:
    started = STARTED
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--smoke", action="store_true", help="micro config, a few iterations (runs on a CPU)")
    ap.add_argument(
        "--plan", action="store_true", help="full-size inputs of every section on this CPU; no training"
    )
    ap.add_argument("--sections", help="comma-separated section numbers (default: all, 1..8)")
    ap.add_argument("--budgets", help="SECTION=SECONDS,... replacing those sections' budgets")
    ap.add_argument(
        "--deadline",
        type=float,
        help=f"seconds from the start that the check ends by (default {DEADLINE_S}; none under --smoke)",
    )
    ap.add_argument(
        "--config-validation",
        action="store_true",
        help="evaluate on each config's own validation size (the 124M config's 1.64 M tokens do not fit the default corpus)",
    )
    ap.add_argument(
        "--cache-dir", type=Path, help="token cache (default $CHECKFREE_CACHE or ~/.cache/checkfree)"
    )
    ap.add_argument("--iterations", type=int, default=10, help="iterations per timed block (staged vs plain)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timed blocks of each loop")
    ap.add_argument(
        "--out-dir",
        default=os.environ.get("OUT_DIR"),
        help="where the report goes (default $OUT_DIR, else runs/gpu_check-<UTC time>)",
    )
    args = ap.parse_args()
    try:
        numbers = parse_sections(args.sections) if args.sections else [s.number for s in SECTIONS]
        budgets = parse_budgets(args.budgets) if args.budgets else {}
        if args.deadline is not None and not 0 < args.deadline < float("inf"):
            raise ValueError(f"--deadline is {args.deadline}; expected a positive number of seconds.")
        if args.iterations < 1 or args.rounds < 1:
            raise ValueError(
                f"--iterations {args.iterations} and --rounds {args.rounds}; expected positive numbers."
            )
        if args.plan and args.smoke:
            raise ValueError(
                "--plan builds the full-size inputs and SMOKE=1 runs micro sizes; expected one of them."
            )
        out_dir = None if args.plan else out_dir_for(args.out_dir, ROOT)
    except ValueError as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2
    sections = [s for s in SECTIONS if s.number in numbers]
    deadline = args.deadline if args.deadline is not None else (None if args.smoke else float(DEADLINE_S))
    root = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    if args.smoke:
        args.cache_dir = args.cache_dir or root / "cache"
        args.iterations, args.rounds = 1, 1
    ctx = CheckContext(
        args.device,
        args.smoke,
        root,
        args.cache_dir,
        args.iterations,
        args.rounds,
        args.config_validation,
        print,
    )
    if args.smoke:
        ctx.micro_config = smoke_setup(root)
    if args.plan:
        try:
            return run_plan(ctx, sections, budgets, deadline or float(DEADLINE_S))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    device = torch.device(args.device)
    report = Report(
        out_dir,
        {
            "started": now(),
            "device": args.device,
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "smoke": args.smoke,
            "sections": numbers,
            "deadline_s": deadline,
            "budgets_s": {
                s.number: budgets.get(s.number, None if args.smoke else s.budget_s) for s in sections
            },
            "validation": "configs'" if args.config_validation else "check's",
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "loss": resolve_loss_path("auto", args.device).line,  # what --fused-loss auto trains on here
            "scratch_dir": str(root),
        },
    )
    ctx.row = report.row
    signal.signal(signal.SIGALRM, _alarm)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        print(
            f"gpu_check on {args.device} (smoke {args.smoke}), sections {','.join(map(str, numbers))}"
            + ("" if deadline is None else f", deadline {deadline:.0f} s")
            + f"; runs in {root}; report in {out_dir}",
            flush=True,
        )
        return run_check(ctx, report, sections, budgets, deadline, started)
    except CheckStopped as e:  # after the last section: the report is complete, the check ends as told
        return 128 + e.signum


if __name__ == "__main__":
    raise SystemExit(main())
