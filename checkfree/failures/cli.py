"""``python -m checkfree schedule``: crash schedules, drawn at a rate or mapped from a real preemption trace.

The same generator as the root-level ``failure_generator.py`` (docs/paper.md §8, paper §6 failure rates), with one
argument parser shared by both (:func:`add_arguments`), so their options cannot drift apart.

- ``--rate R``: the authors' node format (``failure_p_configs/RATE.json``); defaults reproduce their files.
- ``--trace FILE``: a Bamboo or Parcae preemption trace mapped to slot down intervals
  (``checkfree-slot-downtime-v1``, :mod:`checkfree.failures.traces`).
- ``--describe FILE``: per stage, the iterations a down-interval schedule runs short of replicas and is lost.

Without ``--out`` the JSON goes to stdout. It writes nothing except ``--out``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from checkfree import jsonio
from checkfree.failures.rates import PAPER_ITERATION_SECONDS
from checkfree.failures.schedules import format_node_schedule, generate_node_schedule
from checkfree.failures.traces import TRACE_FORMATS, load_downtime, save_downtime, schedule_from_trace
from checkfree.rundir import check_writable

log = logging.getLogger(__name__)

DEFAULT_CHECKPOINT_EVERY = 100
"""The authors' K: their swarm sends a checkpoint every 100 iterations, and those iterations never fail."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The generator's options (shared by ``python -m checkfree schedule`` and ``failure_generator.py``)."""
    parser.add_argument(
        "--rate", type=float, default=None, help="stage failure rate in %%/h (5, 10, 16, 33, ...)"
    )
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="map a real preemption trace (Bamboo CSV or Parcae JSON lines) to slot down intervals",
    )
    parser.add_argument(
        "--trace-format", choices=TRACE_FORMATS, default=None, help="the trace's format (default: detected)"
    )
    parser.add_argument(
        "--start-hours", type=float, default=0.0, help="with --trace: where in the trace iteration 0 begins"
    )
    parser.add_argument(
        "--hours", type=float, default=None, help="with --trace: hours of the trace to map (default: all)"
    )
    parser.add_argument(
        "--describe",
        type=Path,
        default=None,
        help="print, per stage, when a down-interval schedule runs short of replicas and when it is lost",
    )
    parser.add_argument(
        "--stages", type=int, default=6, help="transformer stages S (stage 0 extra, never fails)"
    )
    parser.add_argument("--replicas", type=int, default=3, help="replicas (nodes) per stage")
    parser.add_argument("--iterations", type=int, default=500, help="iterations 0..N-1; the sentinel is N+1")
    parser.add_argument("--seed", type=int, default=33, help="seed of the does-a-stage-fail RNG")
    parser.add_argument(
        "--stage-seed", type=int, default=None, help="seed of the which-stage RNG (default rate*5)"
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        metavar="K",
        help=f"the swarm's checkpoint baseline sends every K iterations: iterations with itr %% K == 1 never fail; "
        f"0 = every iteration may fail (default {DEFAULT_CHECKPOINT_EVERY})",
    )
    parser.add_argument(
        "--checkpoint-interval", type=int, default=None, metavar="K", help="old name of --checkpoint-every"
    )
    parser.add_argument(
        "--probability",
        type=float,
        default=None,
        help="per-iteration stage failure probability (default: the paper's table for the rate)",
    )
    parser.add_argument(
        "--iteration-seconds",
        type=float,
        default=PAPER_ITERATION_SECONDS,
        help="iteration time (s) for the %%/h formula when the rate is not in the table",
    )
    parser.add_argument("--out", type=Path, default=None, help="output JSON file (default: stdout)")


def checkpoint_every(args: argparse.Namespace) -> int:
    """``--checkpoint-every``, or its old name ``--checkpoint-interval`` (read with a one-line note), or the
    authors' 100.

    Raises:
        ValueError: both names are given with different values.
    """
    every, old = args.checkpoint_every, args.checkpoint_interval
    if old is not None:
        if every is not None and every != old:
            raise ValueError(
                f"--checkpoint-every {every} and --checkpoint-interval {old} disagree; expected only "
                "--checkpoint-every (--checkpoint-interval is its old name)."
            )
        log.warning(
            "--checkpoint-interval is now called --checkpoint-every; read as --checkpoint-every %d.", old
        )
        every = old
    return DEFAULT_CHECKPOINT_EVERY if every is None else every


def schedule_text(args: argparse.Namespace) -> str:
    """The schedule asked for by parsed :func:`add_arguments` options, as the authors' one-line JSON.

    Raises:
        ValueError: an option is out of range (one sentence naming it).
    """
    rate = int(args.rate) if args.rate.is_integer() else args.rate
    schedule = generate_node_schedule(
        rate,
        n_stages=args.stages,
        replicas=args.replicas,
        iterations=args.iterations,
        seed=args.seed,
        stage_seed=args.stage_seed,
        checkpoint_every=checkpoint_every(args) or None,
        probability=args.probability,
        iteration_seconds=args.iteration_seconds,
    )
    return format_node_schedule(schedule)


def check_out(out: Path) -> None:
    """--out must be a file path in an existing directory; raises ValueError with one sentence otherwise."""
    if out.is_dir():
        raise ValueError(
            f"--out {out} is a directory; expected the path of a JSON file, e.g. {out / '16.json'}."
        )
    if not out.parent.is_dir():
        raise ValueError(f"--out {out}: the directory {out.parent} does not exist; create it first.")
    check_writable(out, "--out")


def cmd_schedule(args: argparse.Namespace) -> int:
    """Write the schedule to ``--out`` (no trailing newline, as the shipped files) or to stdout (with one).

    Raises:
        ValueError: an option is out of range, or --out is a directory or lies in a missing one; nothing is
            written.
    """
    if args.describe is not None:
        print(load_downtime(args.describe).describe())
        return 0
    if args.out is not None:
        check_out(args.out)
    if args.trace is not None:
        if args.rate is not None:
            raise ValueError("--trace and --rate were both given; expected one of them.")
        schedule = schedule_from_trace(
            args.trace,
            args.stages,
            args.replicas,
            args.iteration_seconds,
            args.start_hours,
            args.hours,
            args.trace_format,
        )
        if args.out is None:
            sys.stdout.write(jsonio.dumps(schedule.to_json()) + "\n")
        else:
            save_downtime(args.out, schedule)
            log.info("wrote %s: %s", args.out, schedule.describe().splitlines()[0])
        return 0
    if args.rate is None:
        raise ValueError("no --rate, --trace or --describe given; expected one of them (e.g. --rate 16).")
    text = schedule_text(args)
    if args.out is None:
        sys.stdout.write(text + "\n")
    else:
        args.out.write_text(text)
        log.info("wrote %s", args.out)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``schedule`` sub-command."""
    p = sub.add_parser(
        "schedule",
        help="generate a crash schedule: at a rate (failure_p_configs/RATE.json format) or from a preemption trace",
        description=__doc__.splitlines()[0],
    )
    add_arguments(p)
    p.set_defaults(func=cmd_schedule)
