"""``checkfree swarm table``: one row per run from the throughput.json files of several swarm runs (the
per-run columns of checkfree.swarm.supervisor.results, the speed columns of checkfree.report.throughput_columns)."""

from __future__ import annotations

from typing import Any

from checkfree.report.throughput_columns import SPEED_HEADERS, plan_text, speed_cells


def summary_table(results: list[dict[str, Any]]) -> str:
    """A Markdown table, one row per run: setting, iterations, crashes/recovered, times, loss, the last validation
    loss (perplexity) and the iteration it was measured at (— without a validation); and, when a run
    replayed down intervals (a preemption trace), a second table: per run the stage losses, the seconds spent
    short of replicas and waiting for a lost stage's node, recovery time and the slots still down at the end."""
    head = (
        "| setting | iterations (executed) | crashes | recovered | mean iteration s | w/o crashes s | "
        "crash→serving s | tokens/s | first → last loss | val loss (perplexity) @ iteration | "
        + " | ".join(SPEED_HEADERS)
        + " |"
    )
    lines = [head, "|" + "---|" * 14]
    for r in results:
        curve = r["loss_curve"]
        lat = r["mean_crash_to_serving_s"]
        lines.append(
            f"| {r['setting']} | {r['iterations_completed']} ({r['iterations_executed']}) | {r['crashes_count']} | "
            f"{r['recovered_count']} | {_f(r['mean_iteration_s'])} | {_f(r['mean_iteration_s_without_crashes'])} | "
            f"{_f(lat)} | {_f(r['tokens_per_s'], 0)} | "
            f"{_f(curve[0][1] if curve else None)} → {_f(curve[-1][1] if curve else None)} | {_val(r)} | "
            f"{speed_cells(r)} |"
        )
    planned = [(r, plan_text(r)) for r in results]
    if any(text for _, text in planned):
        lines += [
            "",
            "Routing plans (the last iteration's; computed from measured speeds, not applied to routes):",
            "",
        ]
        lines += [f"- {r['setting']}: {text}" for r, text in planned if text]
    traced = [r for r in results if (r.get("schedule") or {}).get("format") == "checkfree-slot-downtime-v1"]
    if traced:
        lines += [
            "",
            "Trace replays (per run, summed over stages): stage losses = whole-stage losses recovered; short = "
            "committed iterations (and their seconds) a stage ran on fewer replicas; waiting = schedule iterations "
            "(and seconds) the swarm waited with a stage lost; recovery = replacement started → serving.",
            "",
            "| setting | trace | schedule iterations | stage losses | short iterations (s) | waiting iterations (s) "
            "| recovery s | slots down at the end |",
            "|" + "---|" * 8,
        ]
        for r in traced:
            shortage = (r.get("replica_shortage") or {}).values()
            total = {k: sum(row.get(k, 0) for row in shortage) for k in _SHORTAGE_KEYS}
            source = r["schedule"].get("source") or {}
            lines.append(
                f"| {r['setting']} | {source.get('trace', r['schedule'].get('path'))} | "
                f"{r.get('schedule_clock')} of {r['schedule'].get('iterations')} | {total['losses']} | "
                f"{total['short_iterations']} ({_f(total['short_s'], 1)}) | "
                f"{total['waiting_iterations']} ({_f(total['waiting_s'], 1)}) | {_f(r.get('mean_recovery_s'))} | "
                f"{r.get('still_away') or '—'} |"
            )
    return "\n".join(lines)


_SHORTAGE_KEYS = ("losses", "short_iterations", "short_s", "waiting_iterations", "waiting_s")


def _val(result: dict[str, Any]) -> str:
    """The last validation of a run: "loss (perplexity) @ iteration", or — (none, or an older throughput.json)."""
    last = result.get("final_eval")
    if not isinstance(last, dict):
        return "—"
    return f"{_f(last.get('val_loss'))} ({_f(last.get('perplexity'), 2)}) @ {last.get('iteration')}"


def _f(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"
