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
from pathlib import Path
from typing import NoReturn

from checkfree.config import MAX_SEED, parse_sets


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


def add_simulate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="train a pipeline-staged model while whole stages fail and are recovered",
        description="The convergence simulator (docs/simulator.md). Launch one process per data-parallel "
        "replica with torchrun, or use simulate_training/run.sh (swaps on) / run_2.sh (swaps off).",
    )
    p.add_argument(
        "--setting",
        required=True,
        help="recovery strategy: no_failure, copy, random, zero, average, checkfree, checkfree_plus, "
        "checkpoint, one, redundant, ec_snapshot, ladder, or an authors' name (ours-grad-avg, "
        "ours-naive, ours-random, ours-zero, ours-avg-ablation, whole_model)",
    )
    p.add_argument("--config", required=True, help="config JSON (working directory first, then configs/)")
    p.add_argument("--world-size", type=int, default=1, help="data-parallel replicas (torchrun processes)")
    p.add_argument(
        "--rate",
        type=float,
        default=16.0,
        help="stage failure rate in %%/h (P); selects "
        'config["P"] as the per-iteration probability when present',
    )
    p.add_argument("--start-iter", type=int, default=0, help="resume from this run checkpoint iteration")
    swaps = p.add_mutually_exclusive_group()
    swaps.add_argument(
        "--swaps",
        dest="swaps",
        action="store_true",
        default=True,
        help="CheckFree+ out-of-order execution on odd microbatches (default; run.sh)",
    )
    swaps.add_argument("--no-swaps", dest="swaps", action="store_false", help="in-order pipeline (run_2.sh)")
    p.add_argument(
        "--run-dir", type=Path, help="run directory (default runs/<config>-<strategy>-p<P>-w<W>-seed<S>)"
    )
    p.add_argument("--runs-root", type=Path, default=Path("runs"), help="parent of default run directories")
    p.add_argument("--max-iterations", type=int, help="override max_iterations")
    p.add_argument(
        "--eval-interval", type=int, help="override eval_interval (iterations between validations)"
    )
    p.add_argument(
        "--log-interval", type=int, help="override log_interval (iterations between console lines)"
    )
    p.add_argument(
        "--checkpoint-interval",
        type=int,
        help="iterations between run checkpoints for resuming (0 = only at the end)",
    )
    p.add_argument(
        "--seed", type=seed_arg, help="override seed (model init; failure draws unless --failure-seed)"
    )
    p.add_argument("--failure-seed", type=seed_arg, help="seed of the failure draws (default: --seed)")
    p.add_argument(
        "--failure-probability",
        type=float,
        help="per-iteration stage failure probability, overriding config[P] and the %%/h formula",
    )
    p.add_argument(
        "--failure-schedule",
        type=Path,
        help="replay exact failures from a JSON schedule instead of drawing them",
    )
    p.add_argument(
        "--schedule-replicas",
        type=int,
        help="replicas per stage when --failure-schedule is a swarm node schedule",
    )
    p.add_argument(
        "--fail-stage0",
        action="store_true",
        help="let stage 0 (embedding and head) fail too; only checkfree_plus and checkpoints recover it",
    )
    p.add_argument(
        "--grad-norm-mode",
        choices=["paper", "clipped"],
        help="CheckFree weights: paper = unclipped gradient norm (default), clipped = the release's",
    )
    p.add_argument(
        "--iteration-seconds",
        type=float,
        help="iteration time (s) for the %%/h formula when config has no key for P (default: the paper's "
        "91.32 s; a warning when given but unused)",
    )
    p.add_argument("--resume-from", type=Path, help="resume from this checkpoint directory")
    p.add_argument(
        "--allow-data-change",
        action="store_true",
        help="resume even when the checkpoint was trained on another dataset or tokenizer (a warning)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="a fresh run into a directory that holds a run moves the old run aside to "
        "DIR.replaced-<timestamp> (nothing is deleted)",
    )
    p.add_argument(
        "--max-wall-iterations",
        type=positive_int,
        help="stop after this many wall-clock iterations, keeping everything written (default: 20 × "
        "max_iterations; rollbacks make a run longer than max_iterations)",
    )
    p.add_argument(
        "--stop-at-loss",
        type=float,
        metavar="LOSS",
        help="stop at the first validation with loss <= LOSS (nats); a run that reaches --max-iterations or "
        "--max-wall-iterations first is censored (summary.json: target)",
    )
    p.add_argument(
        "--no-final-checkpoint",
        dest="final_checkpoint",
        action="store_false",
        help="write no run checkpoint when training ends (the --checkpoint-interval ones are still written)",
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument(
        "--cache-dir",
        type=Path,
        help="token/tokenizer cache (default $CHECKFREE_CACHE or ~/.cache/checkfree)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key, e.g. --set checkpoint_every=50 (JSON value)",
    )
    p.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="no tqdm bar (it is drawn on a terminal only)",
    )
    p.add_argument(
        "--max-train-tokens",
        type=int,
        help="cap on the training tokens to cache (default: the run's budget for hub datasets, all of a local corpus)",
    )
    p.add_argument(
        "--peak-tflops",
        type=float,
        help="device peak TFLOP/s for MFU (default: known GPUs, or measured on a CPU)",
    )
    p.add_argument(
        "--compile", action="store_true", help="torch.compile each stage (off by default; see docs/gpu.md)"
    )
    p.add_argument(
        "--compile-mode",
        choices=["default", "reduce-overhead"],
        default="default",
        help="torch.compile's mode with --compile: reduce-overhead replays CUDA graphs, fewer kernel launches "
        "(docs/gpu.md)",
    )
    p.add_argument(
        "--fused-loss",
        choices=["auto", "on", "off"],
        default="auto",
        help="the head and loss through Liger-Kernel's fused linear cross-entropy, which never holds the full "
        "logits: auto (default) = on where CUDA and liger-kernel are, on = that or an error, off = plain "
        "cross-entropy over fp32 logits (docs/gpu.md)",
    )
    p.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="recompute each transformer block in the backward pass instead of keeping its activations "
        "(less memory, one more forward per block; docs/gpu.md)",
    )
    p.add_argument(
        "--tensorboard", action="store_true", help="write TensorBoard scalars to RUN_DIR/tensorboard/"
    )
    # bf16 autocast on any device: exercises the CUDA mixed-precision path on a CPU (tests); not for real runs
    p.add_argument("--autocast", choices=["auto", "bf16", "off"], default="auto", help=argparse.SUPPRESS)
    p.add_argument(
        "--no-recovery-accounting",
        dest="recovery_accounting",
        action="store_false",
        help="do not measure each recovery against the lost stage (weight distance, probe loss spike)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the plan and parameter counts, train nothing"
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
    logging.getLogger("checkfree").info(
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
    root = logging.getLogger("checkfree")
    for old in [h for h in root.handlers if isinstance(h, _TqdmHandler)]:
        root.removeHandler(old)  # main() called again in one process (tests, notebooks): one console handler
    if os.environ.get("RANK", "0") == "0":
        root.addHandler(handler)
    logging.getLogger("checkfree").setLevel(logging.INFO)
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
