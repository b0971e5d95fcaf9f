"""Crash schedules: drawn at a rate (the authors' failure_p_configs/RATE.json format, docs/paper.md §8) or mapped
from a real preemption trace (slot down intervals, checkfree-slot-downtime-v1).

    python failure_generator.py --rate 16 --stages 6 --replicas 3 --iterations 500 --seed 33 \
        --out failure_p_configs/16.json
    python failure_generator.py --trace failure_traces/bamboo-p3-trace.csv --stages 12 --replicas 2 \
        --iteration-seconds 91.32 --out runs/p3_12x2.json
    python failure_generator.py --describe runs/p3_12x2.json

Defaults reproduce the authors' shipped files; without --out the JSON goes to stdout. A thin wrapper over
checkfree.failures.cli (the same options and output as ``python -m checkfree schedule``); it writes nothing
except --out.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from checkfree.cli import OneLineParser
from checkfree.failures.cli import add_arguments, cmd_schedule


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return cmd_schedule(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"failure_generator.py: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `... --describe FILE | head`: the reader left; nothing is lost
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # as the Python docs advise (signal)
        return 0


if __name__ == "__main__":
    sys.exit(main())
