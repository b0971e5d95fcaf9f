"""``python -m checkfree simulate | schedule | swarm | report | export | generate | probe``.

The only place that configures output: library modules log, this module decides where logs go.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import NoReturn

from checkfree import PACKAGE_LOG
from checkfree.cli_flags import Flag
from checkfree.config import MAX_SEED, parse_sets

log = logging.getLogger(__name__)


class _TqdmHandler(logging.Handler):
    """Console log lines that do not break a tqdm progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        tqdm.write(self.format(record), file=sys.stderr)


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line on stderr (exit code 2), like every other user error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def seed_arg(text: str) -> int:
    """argparse type of a seed: an integer in [0, 2^63) (torch and numpy take 64-bit seeds)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value < MAX_SEED:
        raise argparse.ArgumentTypeError(f"{value} is outside [0, 2^63)")
    return value


def positive_int(text: str) -> int:
    """argparse type of a count that must be at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def simulate_flags() -> dict[str, Flag]:
    """``simulate``'s flags beyond their fields of checkfree.sim.options.SimulateOptions (checkfree.cli_flags)."""
    from checkfree.config import GRAD_NORM_MODES
    from checkfree.loss import FUSED_LOSS_CHOICES
    from checkfree.swarm.devices import DEVICE_CHOICES

    return {
        "swaps": Flag(both="in-order pipeline (run_2.sh)"),
        "seed": Flag(type=seed_arg),
        "failure_seed": Flag(type=seed_arg),
        "grad_norm_mode": Flag(choices=GRAD_NORM_MODES),
        "max_wall_iterations": Flag(type=positive_int),
        "stop_at_loss": Flag(metavar="LOSS"),
        "device": Flag(choices=DEVICE_CHOICES),
        "compile_mode": Flag(choices=("default", "reduce-overhead")),
        "fused_loss": Flag(choices=FUSED_LOSS_CHOICES),
        "autocast": Flag(
            choices=("auto", "bf16", "off"), hidden=True
        ),  # bf16 on a CPU: the CUDA path, for tests
    }


SIMULATE_NOT_FLAGS = ("compile_backend", "extra")
"""SimulateOptions fields without a flag of their own (``extra`` is ``--set KEY=VALUE``)."""


def add_simulate_parser(sub: argparse._SubParsersAction) -> None:
    """``simulate``: one flag per field of SimulateOptions (name, type, default and help from the field,
    checkfree.cli_flags; the config keys it overrides give the help of the fields that have none), and ``--set``."""
    import dataclasses

    from checkfree.cli_flags import add_field_flags
    from checkfree.config import Config
    from checkfree.sim.options import SimulateOptions

    p = sub.add_parser(
        "simulate",
        help="train a pipeline-staged model while whole stages fail and are recovered",
        description="The convergence simulator (docs/simulator.md). Launch one process per data-parallel "
        "replica with torchrun, or use simulate_training/run.sh (swaps on) / run_2.sh (swaps off).",
    )
    names = [f.name for f in dataclasses.fields(SimulateOptions) if f.name not in SIMULATE_NOT_FLAGS]
    add_field_flags(p, SimulateOptions, names, simulate_flags(), docs_from=Config)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key, e.g. --set checkpoint_every=50 (JSON value)",
    )
    p.set_defaults(func=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    from checkfree.sim.launch import RunInterrupted, SimulateOptions, plan_lines, run_simulation

    fields = {k: v for k, v in vars(args).items() if k not in ("func", "command", "set")}
    opts = SimulateOptions(**fields, extra=parse_sets(args.set))
    if opts.dry_run:
        from checkfree.sim.preflight import memory_lines

        for line in [*plan_lines(opts), *memory_lines(opts)]:
            print(line)
        return 0
    try:
        summary = run_simulation(opts)
    except RunInterrupted as e:  # Ctrl-C in training: everything written is kept; one line, exit 130
        print(f"checkfree simulate: {e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # Ctrl-C before training started (checks, data preparation)
        print(
            "checkfree simulate: interrupted before training started; nothing to resume from", file=sys.stderr
        )
        return 130
    if summary.get("stopped"):
        return 1  # the trainer has logged the one sentence (console and rank0.log)
    final = summary.get("final_eval", {})
    log.info(
        "done: %s, %d iterations, %d failures, %d recoveries, final val_loss %.4f (perplexity %.2f) → %s",
        summary["strategy"],
        summary["iterations"],
        summary["failures"],
        summary["recoveries"],
        final.get("val_loss", float("nan")),
        final.get("perplexity", float("nan")),
        summary["run_dir"],
    )
    return 0


# Modules that add their own sub-commands through ``add_parser(subparsers)``.
SUBCOMMAND_MODULES = (
    "checkfree.failures.cli",
    "checkfree.swarm.cli",
    "checkfree.report.build",
    "checkfree.export",
    "checkfree.probe.run",
)


def build_parser() -> argparse.ArgumentParser:
    import importlib
    import importlib.util

    parser = OneLineParser(prog="checkfree", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_simulate_parser(sub)
    for name in SUBCOMMAND_MODULES:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name).add_parser(sub)
    return parser


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM handler: raise KeyboardInterrupt("SIGTERM"), so a run ends as it does on Ctrl-C."""
    raise KeyboardInterrupt("SIGTERM")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = _TqdmHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = PACKAGE_LOG
    for old in [h for h in root.handlers if isinstance(h, _TqdmHandler)]:
        root.removeHandler(old)  # main() called again in one process (tests, notebooks): one console handler
    if os.environ.get("RANK", "0") == "0":
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    from checkfree.checkpoint.store import CheckpointError
    from checkfree.data.sources import DataUnavailableError

    # SIGTERM (a scheduler, torchrun, `kill`) stops a command the way Ctrl-C does: the run writes its
    # results with status "interrupted" (summary.json, throughput.json) instead of vanishing mid-write.
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if on_main_thread else None
    try:
        return args.func(args)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM outside training (which says where to resume itself)
        print(f"checkfree {args.command}: interrupted ({e or 'SIGINT'})", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, CheckpointError, DataUnavailableError) as e:  # user errors
        if os.environ.get("CHECKFREE_DEBUG"):
            raise
        print(f"checkfree {args.command}: error: {e}", file=sys.stderr)
        return 2
    finally:
        if on_main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
