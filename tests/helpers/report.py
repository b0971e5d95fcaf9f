"""Synthetic run directories, as checkfree.sim.launch writes them, for the report's tests."""

from __future__ import annotations

import json
from pathlib import Path

TINY = {
    "dataset": "Shakespeare",
    "architecture": "LLaMa",
    "validation": 2,
    "dmodel": 64,
    "num_heads": 4,
    "n_layers_per_stage": 1,
    "n_stages": 4,
    "seq_l": 32,
    "batch_size": 4,
    "mb_count": 4,
    "lr": 1e-3,
    "max_iterations": 40,
    "seed": 0,
    "16": 0.01,
}


def make_run(
    root: Path,
    name: str,
    strategy: str,
    evals: list[tuple[int, float]],
    *,
    rate: float = 16.0,
    p: float = 0.01,
    swaps: bool = False,
    failures: tuple[int, ...] = (),
    rollbacks: tuple = (),
    extra: list[dict] | None = None,
    stats: dict | None = None,
    summary: bool = True,
    iterations: int | None = None,
    seed: int = 0,
) -> Path:
    """A run directory as checkfree.sim.launch writes it, with the given evaluation curve."""
    d = root / name
    d.mkdir(parents=True)
    iterations = iterations if iterations is not None else max(it for it, _ in evals)
    (d / "config.json").write_text(json.dumps(dict(TINY, seed=seed)))
    (d / "options.json").write_text(
        json.dumps(
            {
                "setting": strategy,
                "config": "tiny_config.json",
                "rate": rate,
                "swaps": swaps,
                "world_size": 1,
                "failure_seed": None,
            }
        )
    )
    recs = [
        {
            "kind": "train",
            "iteration": i,
            "effective_iteration": i,
            "loss": 5.0 - i / 100,
            "seconds": 1.0,
            "tokens": 512,
            "grad_norms": [1.0] * 5,
        }
        for i in range(iterations)
    ]
    recs += [
        {"kind": "eval", "iteration": it, "effective_iteration": it, "val_loss": v, "perplexity": 2.718**v}
        for it, v in evals
    ]
    for it in failures:
        recs.append(
            {"kind": "failure", "iteration": it, "stage": 2, "effective_iteration": it, "with_stages": [2]}
        )
        if strategy != "no_failure":
            recs.append(
                {
                    "kind": "recovery",
                    "iteration": it,
                    "stage": 2,
                    "strategy": strategy,
                    "rule": "x",
                    "sources": [1, 3],
                    "weights": None,
                    "consecutive": False,
                    "fallback": None,
                    "seconds": 0.01,
                }
            )
    for it, lost in rollbacks:
        recs.append(
            {
                "kind": "rollback",
                "iteration": it,
                "from_effective_iteration": it,
                "to_effective_iteration": it - lost,
                "iterations_lost": lost,
            }
        )
    recs += extra or []
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    if summary:
        last = evals[-1]
        n_rec = len(failures) if strategy != "no_failure" else 0
        (d / "summary.json").write_text(
            json.dumps(
                {
                    "iterations": iterations,
                    "effective_iterations": iterations,
                    "failures": len(failures),
                    "recoveries": n_rec,
                    "fallbacks": 0,
                    "consecutive": 0,
                    "strategy": strategy,
                    "setting": strategy,
                    "swaps": swaps,
                    "failure_rate_per_hour": rate,
                    "failure_probability": p,
                    "world_size": 1,
                    "config": "tiny_config.json",
                    "final_eval": {"iteration": last[0], "val_loss": last[1], "perplexity": 2.718 ** last[1]},
                    "strategy_stats": stats or {},
                }
            )
        )
    return d


def comparison(root: Path) -> list[Path]:
    """Five strategies on the same failures; hand-picked curves for a target of 5.0."""
    return [
        make_run(root, "nf", "no_failure", [(0, 8.0), (10, 6.0), (20, 5.0), (30, 4.0)], failures=(5, 12)),
        make_run(root, "cf", "checkfree", [(0, 8.0), (10, 6.5), (20, 5.5), (30, 4.5)], failures=(5, 12)),
        make_run(
            root,
            "cfp",
            "checkfree_plus",
            [(0, 8.0), (10, 6.0), (20, 5.0), (30, 4.8)],
            swaps=True,
            failures=(5, 12),
        ),
        # checkpoint: redoes 10 iterations, reaches 5.0 at wall iteration 40 (exactly at an evaluation)
        make_run(
            root,
            "ckpt",
            "checkpoint",
            [(0, 8.0), (10, 6.0), (25, 6.0), (40, 5.0)],
            failures=(5, 12),
            rollbacks=((5, 5), (12, 5)),
            extra=[
                {
                    "kind": "checkpoint",
                    "iteration": 10,
                    "purpose": "strategy",
                    "bytes": 1000,
                    "stall_seconds": 0.0,
                }
            ],
        ),
        # redundant: never gets below 5.2
        make_run(root, "red", "redundant", [(0, 8.0), (10, 6.0), (20, 5.5), (30, 5.2)], failures=(5, 12)),
    ]
