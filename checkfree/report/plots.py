"""PNG plots of the report (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from checkfree.report.analysis import Group, Row  # noqa: E402
from checkfree.report.colours import colour, colours  # noqa: E402
from checkfree.report.runs import Run  # noqa: E402


def slug(text: str) -> str:
    """A file-name-safe version of ``text``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:80] or "group"


def _style(run: Run) -> dict:
    return {
        "color": colour(run.strategy),
        "linestyle": "--" if run.swaps and run.strategy != "checkfree_plus" else "-",
        "label": run.label,
        "linewidth": 1.4,
    }


def _grid(n: int) -> tuple[plt.Figure, list[plt.Axes]]:
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    flat = [a for row in axes for a in row]
    for a in flat[n:]:
        a.set_visible(False)
    return fig, flat[:n]


def _finite(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(x, y) for x, y in points if math.isfinite(x) and math.isfinite(y)]


def validation_plots(groups: list[Group], references: dict[tuple, Run], out: Path) -> list[Path]:
    """Validation loss against wall-clock iterations and against simulated hours: one panel per group."""
    paths = []
    row_of = {
        id(row.run): row for g in groups for row in g.rows
    }  # a reference's timing comes from its own group
    for axis in ("iterations", "hours"):
        fig, axes = _grid(len(groups))
        for ax, g in zip(axes, groups, strict=True):
            rows: list[Row] = list(g.rows)
            for row in rows:
                pts = sorted(row.run.evals)
                xs = [it if axis == "iterations" else row.timeline.hours_at(it) for it, _ in pts]
                data = _finite(list(zip(xs, [v for _, v in pts], strict=True)))
                if data:
                    ax.plot(*zip(*data, strict=True), **_style(row.run))
            ref = references.get(g.key[:1] + g.key[2:4])
            ref_row = row_of.get(id(ref)) if ref is not None else None
            if (
                ref is not None
                and not any(r.run.strategy == "no_failure" for r in rows)
                and (axis == "iterations" or ref_row is not None)
            ):
                pts = sorted(ref.evals)
                xs = [it if axis == "iterations" else ref_row.timeline.hours_at(it) for it, _ in pts]
                data = _finite(list(zip(xs, [v for _, v in pts], strict=True)))
                if data:
                    ax.plot(
                        *zip(*data, strict=True),
                        color="black",
                        linestyle=":",
                        linewidth=1.0,
                        label="no_failure (reference run)",
                    )
            if g.target is not None:
                ax.axhline(
                    g.target, color="red", linewidth=0.8, linestyle=":", label=f"target {g.target:.3f}"
                )
            ax.set_title(g.title, fontsize=8)
            ax.set_xlabel("wall-clock iteration" if axis == "iterations" else "simulated hours")
            ax.set_ylabel("validation loss (nats)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6)
        fig.tight_layout()
        path = out / f"val_loss_vs_{axis}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def training_plot(group: Group, out: Path) -> Path:
    """Training loss of each run in ``group`` with failure (red dashed line), recovery (green ▲) and rollback (▼)."""
    fig, axes = _grid(len(group.rows))
    for ax, row in zip(axes, group.rows, strict=True):
        run = row.run
        train = sorted(
            (int(r["iteration"]), float(r["loss"]))
            for r in run.kind("train")
            if isinstance(r.get("loss"), int | float) and math.isfinite(r["loss"])
        )
        loss_at = dict(train)
        if train:
            ax.plot(*zip(*train, strict=True), color=colour(run.strategy), linewidth=0.8)
        top = max((v for _, v in train), default=1.0)
        for i, it in enumerate(
            sorted({int(r["iteration"]) for r in run.kind("failure") if "iteration" in r})
        ):
            ax.axvline(
                it, color="red", linewidth=0.7, alpha=0.6, linestyle="--", label="failure" if i == 0 else None
            )
        for kind, style in (
            ("recovery", dict(marker="^", color="green", s=18, label="recovery")),
            ("rollback", dict(marker="v", color="purple", s=30, label="rollback")),
        ):
            pts = [
                (int(r["iteration"]), loss_at.get(int(r["iteration"]), top))
                for r in run.kind(kind)
                if "iteration" in r
            ]
            if pts:
                ax.scatter(*zip(*pts, strict=True), zorder=3, **style)
        ax.set_title(
            f"{run.label}: {run.count('failures')} failures, {run.count('recoveries')} recoveries", fontsize=8
        )
        ax.set_xlabel("wall-clock iteration")
        ax.set_ylabel("training loss")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    fig.suptitle(group.title, fontsize=9)
    fig.tight_layout()
    path = out / f"train_loss_{slug(group.title)}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def recovery_plot(runs: list[Run], out: Path) -> Path | None:
    """Loss spike against the rebuilt stage's distance to the lost one, one colour per rule; None if no run has
    accounting fields."""
    from checkfree.report.recoveries import recovery_rows

    points: dict[str, list[tuple[float, float]]] = {}
    for row in recovery_rows(runs):
        x, y = row.record.get("weight_rel_l2"), row.record.get("loss_spike")
        if isinstance(x, int | float) and isinstance(y, int | float):
            points.setdefault(row.rule, []).append((float(x), float(y)))
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(6, 4.2))
    palette = colours(sorted(points))
    for rule, pts in sorted(points.items()):
        pts = _finite(pts)
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], label=rule, s=18, color=palette[rule], alpha=0.8)
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.set_xlabel("‖W_rebuilt − W_lost‖ / ‖W_lost‖")
    ax.set_ylabel("probe loss spike (nats)")
    ax.set_title("Recoveries: loss spike vs weight distance")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "recoveries.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
