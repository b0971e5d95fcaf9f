"""Memory per simulator rank of the paper's configs, with and without activation checkpointing, against one GPU.

    .venv/bin/python benchmarks/memory_table.py                       # CUDA, bf16 autocast, an 80 GB H100
    .venv/bin/python benchmarks/memory_table.py --memory-mib 143771   # against an H200 (141 GB)

Prints a Markdown table (GiB) of checkfree.memory.simulator_estimate for each config: the parts, the total, and
whether it fits, i.e. is at most 90 % of the GPU's memory (checkfree.memory.FIT_FRACTION). Nothing is built or
allocated; it takes well under a second. The output is in docs/gpu.md (Memory).
"""

from __future__ import annotations

import argparse
import sys

from checkfree import memory as M
from checkfree.config import load_config

CONFIGS = (
    "124M_config.json",
    "500M_config.json",
    "500M_config_6x4.json",
    "500M_config_gpt.json",
    "1_5B_config.json",
    "1_5B_config_6x4.json",
)
H100_MIB = 81559
"""An 80 GB H100 (HBM3) as nvidia-smi and torch.cuda.get_device_properties report it: 81,559 MiB = 79.65 GiB."""
COLUMNS = (
    "weights",
    "gradients",
    "optimizer",
    "copies",
    "autocast_copies",
    "activations",
    "temporaries",
    "runtime",
)


def table(memory_bytes: int, setting: str, device: str) -> list[str]:
    """The Markdown lines: one row per config and activation-checkpointing choice."""
    autocast = device == "cuda"
    head = "| config | parameters | microbatch | act. ckpt | " + " | ".join(
        ("weights", "grads", "Adam", "copies", "bf16 copies", "activations", "temporaries", "runtime")
    )
    lines = [
        f"{head} | total | {M.gib(memory_bytes)} |",
        "|" + "---|" * (len(COLUMNS) + 6),
    ]
    for name in CONFIGS:
        cfg = load_config(name)
        vocab = M.model_vocab_size(cfg)
        params = M.parameter_counts(cfg, vocab).total
        for ckpt in (False, True):
            e = M.simulator_estimate(cfg, vocab, device, autocast, ckpt, setting)
            parts = " | ".join(f"{getattr(e, c) / M.GIB:.2f}" for c in COLUMNS)
            verdict = "fits" if M.fits(e.total, memory_bytes) else "does not fit"
            lines.append(
                f"| {name} | {params / 1e6:,.0f} M | {cfg.batch_size} × {cfg.seq_l} | {'on' if ckpt else 'off'} | "
                f"{parts} | **{e.total / M.GIB:.2f}** | {verdict} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--memory-mib", type=int, default=H100_MIB, help="GPU memory in MiB (default: an 80 GB H100)"
    )
    p.add_argument("--setting", default="checkfree_plus", help="canonical setting whose copies count")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cuda: bf16 autocast; cpu: fp32")
    args = p.parse_args(argv)
    if args.memory_mib < 1:
        print(f"--memory-mib is {args.memory_mib}; expected a positive number of MiB.", file=sys.stderr)
        return 2
    print(
        f"Memory per rank, estimated from the config's shapes ({args.device}, "
        f"{'bf16 autocast' if args.device == 'cuda' else 'fp32'}, setting {args.setting}); "
        f"fits = at most {M.FIT_FRACTION:.0%} of {M.gib(args.memory_mib * 2**20)}. GiB:"
    )
    print()
    for line in table(args.memory_mib * 2**20, args.setting, args.device):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
