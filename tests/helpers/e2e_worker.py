"""Run by tests/sim/test_e2e.py under torchrun: every listed strategy trains the tiny config in one gloo group.

usage: PYTHONPATH=.:tests torchrun --nproc_per_node=2 -m helpers.e2e_worker OUT_DIR SCHEDULE CACHE SETTING[:swaps|:no-swaps] ...
Writes OUT_DIR/<setting>.json (the summary) from rank 0.
"""

import json
import sys
from pathlib import Path

import torch.distributed as dist

from checkfree.sim.launch import SimulateOptions, run_simulation

SMALL = {"dmodel": 32, "num_heads": 2, "seq_l": 32, "batch_size": 2, "mb_count": 2, "validation": 2}


def main() -> None:
    out, schedule, cache, *settings = sys.argv[1:]
    dist.init_process_group("gloo")
    for item in settings:
        setting, _, mode = item.partition(":")
        summary = run_simulation(
            SimulateOptions(
                setting=setting,
                config="tiny_config.json",
                world_size=2,
                swaps=mode != "no-swaps",
                run_dir=Path(out) / setting,
                max_iterations=6,
                eval_interval=3,
                failure_schedule=Path(schedule),
                cache_dir=Path(cache),
                progress=False,
                extra=dict(SMALL),
            ),
            argv=["e2e_worker", item],
        )
        if dist.get_rank() == 0:
            (Path(out) / f"{setting}.json").write_text(json.dumps(summary))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
