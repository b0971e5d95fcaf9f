"""The stage-loss probe's table and plot: mean ± 95 % interval per (stage, strategy), from probe.json's cells.

Each cell's loss after K steps is also paired with the ``no_failure`` reference of the same seed (same data order)
and the same stage order (with swaps for a swap strategy), so the "− no_failure" column is the damage the failure
left after K steps. The swapped reference against the plain one (paired) is the cost of the swaps themselves. The Fig. 2 line says, per stage, which
adjacent pairs of the paper's order random ≫ copy > average > CheckFree are separated by non-overlapping 95 %
intervals of the validation loss after K steps.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from checkfree.report.colours import colours
from checkfree.report.stats import Interval, mean_ci

FIG2_ORDER = ("random", "copy", "average", "checkfree")


SWAPPED_REFERENCE = "no_failure +swaps"


def _label(cell: dict[str, Any]) -> str:
    """A cell's row name: its strategy, or ``no_failure +swaps`` for the swapped reference."""
    return SWAPPED_REFERENCE if cell["stage"] is None and cell.get("swaps") else cell["strategy"]


def _groups(result: dict[str, Any]) -> dict[tuple[Any, str], list[dict[str, Any]]]:
    out: dict[tuple[Any, str], list[dict[str, Any]]] = {}
    for c in result["cells"]:
        out.setdefault((c["stage"], _label(c)), []).append(c)
    return out


def _pair(cell: dict[str, Any]) -> tuple[int, bool]:
    """(seed, swaps): which no-failure reference a cell is paired with (cells written before swaps existed: none)."""
    return cell["seed"], bool(cell.get("swaps"))


def _references(result: dict[str, Any], k: str) -> dict[tuple[int, bool], float]:
    """(seed, swaps) → the no-failure reference's loss after K steps."""
    return {_pair(c): c["losses"][k] for c in result["cells"] if c["strategy"] == "no_failure"}


def swap_cost(result: dict[str, Any]) -> Interval | None:
    """The swapped no-failure reference minus the plain one after K steps, paired by seed (paper Fig. 4c)."""
    ref = _references(result, str(result["steps"][-1]))
    diffs = [v - ref[(seed, False)] for (seed, swaps), v in ref.items() if swaps and (seed, False) in ref]
    return _ci(diffs)


def intervals(result: dict[str, Any]) -> dict[tuple[Any, str], dict[str, Interval | None]]:
    """Per (stage, strategy): an interval of the loss at each step count ("0", "1", …), of the paired difference
    to the no_failure reference of the same seed and swaps after K steps ("minus_no_failure"; None for the references
    themselves), and of the weight distances ("rel_l2", "cosine")."""
    k = str(result["steps"][-1])
    ref = _references(result, k)
    out: dict[tuple[Any, str], dict[str, Interval | None]] = {}
    for key, cells in _groups(result).items():
        row: dict[str, Interval | None] = {
            s: _ci([c["losses"][s] for c in cells]) for s in map(str, result["steps"])
        }
        paired = [c["losses"][k] - ref[_pair(c)] for c in cells if _pair(c) in ref]
        row["minus_no_failure"] = _ci(paired) if key[0] is not None else None
        row["rel_l2"] = _ci([c["weight_rel_l2"] for c in cells if c["weight_rel_l2"] is not None])
        row["cosine"] = _ci([c["weight_cosine"] for c in cells if c["weight_cosine"] is not None])
        out[key] = row
    return out


def _ci(values: list[float]) -> Interval | None:
    return mean_ci(values) if values and all(math.isfinite(v) for v in values) else None


def _fmt(iv: Interval | None, spec: str = ".4f") -> str:
    return "—" if iv is None else iv.format(spec)


def fig2_separation(
    result: dict[str, Any], table: dict[tuple[Any, str], dict[str, Interval | None]]
) -> list[str]:
    """Per stage: each adjacent pair of Fig. 2's order, "separated" when the 95 % intervals after K steps do not
    overlap (and in the paper's direction), else "overlapping" or "reversed"."""
    k = str(result["steps"][-1])
    lines = []
    for stage in sorted({s for s, _ in table if s is not None}):
        parts = []
        for a, b in zip(FIG2_ORDER, FIG2_ORDER[1:], strict=False):
            ia, ib = table.get((stage, a), {}).get(k), table.get((stage, b), {}).get(k)
            if ia is None or ib is None:
                continue
            if ia.overlaps(ib):
                verdict = "overlapping"
            else:
                verdict = "separated" if ia.mean > ib.mean else "reversed"
            parts.append(f"{a} > {b}: {verdict}")
        if parts:
            lines.append(f"- stage {stage}, after {k} steps: " + "; ".join(parts))
    return lines


def render(result: dict[str, Any]) -> str:
    table = intervals(result)
    steps = [str(s) for s in result["steps"]]
    k = steps[-1]
    header = ["stage", "strategy", "seeds"] + [f"val loss @{s}" for s in steps]
    header += [f"− no_failure @{k} (paired)", "weight rel. L2", "weight cosine"]
    rules = {key: sorted({c["rule"] for c in cells}) for key, cells in _groups(result).items()}
    body = []
    for (stage, name), row in sorted(table.items(), key=lambda kv: (kv[0][0] is not None, kv[0][0] or 0)):
        label = name + (
            f" ({', '.join(r for r in rules[(stage, name)] if r)})" if any(rules[(stage, name)]) else ""
        )
        n = len(_groups(result)[(stage, name)])
        body.append(
            ["—" if stage is None else str(stage), label, str(n)]
            + [_fmt(row[s]) for s in steps]
            + [_fmt(row["minus_no_failure"], "+.4f"), _fmt(row["rel_l2"]), _fmt(row["cosine"])]
        )
    cfg = result["config"]
    lines = [
        "# Stage-loss probe",
        "",
        f"Checkpoint `{result['checkpoint']}` (effective iteration {result['effective_iteration']}; "
        f"{cfg['architecture']} d {cfg['dmodel']}, {cfg['n_stages']} stages × {cfg['n_layers_per_stage']} "
        f"layers). {result['seeds']} seed(s) per cell; {result['seconds']:.0f} s in the process that wrote this "
        f"({len(result['cells']) - result.get('resumed_cells', 0)} cells computed there, "
        f"{result.get('resumed_cells', 0)} by other shards or an earlier run). Validation loss in nats, mean ± "
        "half-width of the 95 % Student-t interval over seeds.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    cost = swap_cost(result)
    if cost is not None:
        lines += [
            "",
            f"Swaps without a failure ({SWAPPED_REFERENCE} − no_failure after {k} steps, paired by seed): "
            f"{cost.format('+.4f')} nats. Swap strategies are paired with the swapped reference, so their "
            "− no_failure column is the recovery's damage alone.",
        ]
    sep = fig2_separation(result, table)
    if sep:
        lines += [
            "",
            "Fig. 2's order (random ≫ copy > average > CheckFree), by non-overlapping intervals:",
            "",
        ]
        lines += sep
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> Path:
    """Validation loss vs steps after the failure, one panel per stage, one line per strategy (95 % bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = intervals(result)
    stages = sorted({s for s, _ in table if s is not None})
    fig, axes = plt.subplots(1, max(1, len(stages)), figsize=(4.5 * max(1, len(stages)), 3.6), squeeze=False)
    steps = [str(s) for s in result["steps"]]
    xs = [max(int(s), 0.5) for s in steps]  # log axis: step 0 drawn at 0.5
    palette = colours(sorted({name for _, name in table}))
    for ax, stage in zip(axes[0], stages, strict=False):
        for (st, name), row in table.items():
            if st not in (stage, None):
                continue
            ys = [row[s].mean if row[s] else math.nan for s in steps]
            err = [0.0 if not row[s] or row[s].single else row[s].half_width for s in steps]
            ax.errorbar(
                xs,
                ys,
                yerr=err,
                label=name,
                capsize=2,
                color=palette[name],
                linestyle="--" if st is None else "-",
            )
        ax.set_xscale("log")
        ax.set_title(f"stage {stage} lost")
        ax.set_xlabel("steps after the failure (0 at 0.5)")
        ax.set_ylabel("validation loss (nats)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(result: dict[str, Any], out: Path) -> None:
    """probe.md and probe.png into ``out``."""
    (out / "probe.md").write_text(render(result), encoding="utf-8")
    plot(result, out / "probe.png")
