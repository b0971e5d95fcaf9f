"""Score a swarm run's exported model the way anyone would, and compare with the run's last validation loss.

``python benchmarks/score_export.py RUN_DIR HF_DIR [--cache-dir DIR]``: RUN_DIR is a finished ``swarm run``
directory (its ``throughput.json``, which holds the run's config), HF_DIR what ``python -m checkfree export RUN_DIR
--out HF_DIR`` wrote. The model is loaded with ``AutoModelForCausalLM.from_pretrained`` (fp32 on the CPU, as
saved) and scored on the run's validation batches (the simulator's for its model config): the token-mean
cross-entropy per batch, the mean over the batches, as the swarm's validation computes it. Prints one line and
exits 0 when the two agree within ``--tolerance`` (default 1e-4), 1 when they do not, 2 on a wrong input.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from checkfree.config import ConfigError
from checkfree.data.spec import default_cache_dir
from checkfree.swarm.config import swarm_config_from_dict
from checkfree.swarm.node.compute import validation_batches_for


def plain_loss(model_dir: Path, batches: list[torch.Tensor]) -> float:
    """Mean over ``batches`` ((B, T + 1) int64 each) of the token-mean next-token cross-entropy."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    losses = []
    with torch.no_grad():
        for batch in batches:
            logits = model(input_ids=batch[:, :-1]).logits  # (B, T, V)
            losses.append(float(F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())))
    return sum(losses) / len(losses)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("hf_dir", type=Path)
    ap.add_argument(
        "--cache-dir", type=Path, help="data cache (default $CHECKFREE_CACHE or ~/.cache/checkfree)"
    )
    ap.add_argument("--tolerance", type=float, default=1e-4)
    args = ap.parse_args(argv)
    try:
        throughput = json.loads((args.run_dir / "throughput.json").read_text())
        cfg = swarm_config_from_dict(throughput["config"], f"{args.run_dir}/throughput.json's config")
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ConfigError) as e:
        print(
            f"error: {args.run_dir} is not a swarm run directory with its throughput.json ({e})",
            file=sys.stderr,
        )
        return 2
    final = throughput.get("final_eval")
    if not isinstance(final, dict) or not isinstance(final.get("val_loss"), float):
        print(
            f"error: {args.run_dir}/throughput.json has no final validation loss (final_eval)",
            file=sys.stderr,
        )
        return 2
    if not (args.hf_dir / "config.json").is_file():
        print(f"error: {args.hf_dir} holds no exported model (config.json)", file=sys.stderr)
        return 2
    batches = validation_batches_for(
        cfg.model, cfg.data, throughput["vocab_size"], args.cache_dir or default_cache_dir()
    )
    loss = plain_loss(args.hf_dir, batches)
    diff = abs(loss - final["val_loss"])
    ok = math.isfinite(loss) and diff <= args.tolerance
    print(
        f"exported model: val_loss {loss:.6f} on {len(batches)} batches; the swarm's at iteration {final['iteration']}: "
        f"{final['val_loss']:.6f}; |diff| {diff:.2e} ({'within' if ok else 'beyond'} {args.tolerance:g})"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
