"""Generate a swarm crash schedule (the authors' failure_p_configs/RATE.json format, SPEC §8).

    python failure_generator.py --rate 16 --stages 6 --replicas 3 --iterations 500 --seed 33 \
        --out failure_p_configs/16.json

Defaults reproduce the authors' shipped files; without --out the JSON goes to stdout. A thin wrapper over
checkfree.failures.generate_node_schedule; it writes nothing except --out.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from checkfree.cli import OneLineParser
from checkfree.failures import PAPER_ITERATION_SECONDS, format_node_schedule, generate_node_schedule


def check_out(out: Path) -> None:
    """--out must be a file path in an existing directory; raises ValueError with one sentence otherwise."""
    if out.is_dir():
        raise ValueError(
            f"--out {out} is a directory; expected the path of a JSON file, e.g. {out / '16.json'}."
        )
    if not out.parent.is_dir():
        raise ValueError(f"--out {out}: the directory {out.parent} does not exist; create it first.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--rate", type=float, required=True, help="stage failure rate in %%/h (5, 10, 16, 33, ...)"
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
        "--checkpoint-interval",
        type=int,
        default=100,
        help="iterations with itr %% K == 1 never fail; 0 = every iteration may fail",
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
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    rate = int(args.rate) if args.rate.is_integer() else args.rate
    try:
        if args.out is not None:
            check_out(args.out)
        schedule = generate_node_schedule(
            rate,
            n_stages=args.stages,
            replicas=args.replicas,
            iterations=args.iterations,
            seed=args.seed,
            stage_seed=args.stage_seed,
            checkpoint_interval=args.checkpoint_interval or None,
            probability=args.probability,
            iteration_seconds=args.iteration_seconds,
        )
    except ValueError as err:
        print(f"failure_generator.py: error: {err}", file=sys.stderr)
        return 2
    text = format_node_schedule(schedule)
    if args.out is None:
        sys.stdout.write(text + "\n")
    else:
        args.out.write_text(text)
        logging.getLogger("failure_generator").info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
