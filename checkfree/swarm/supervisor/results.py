"""What a swarm run measured, written to ``runs/<name>/throughput.json`` (issue "Results", docs/paper.md §8).

* ``iterations``: one row per committed iteration in execution order — iteration index, epoch, attempts,
  ``t_commit`` (seconds since the first ``begin``; the aggregation timestamp: every node has averaged its
  stage's gradients and stepped), ``wall_s`` (= t_commit − previous t_commit, recoveries included), mean
  loss over pipelines (nats), tokens, per-stage gradient norms.
* ``iterations_completed`` (net: a checkpoint rollback moves it back), ``iterations_executed``,
  ``mean_iteration_s`` (total time / executed), ``tokens_per_s`` (net tokens / total time).
* ``crashes``: per crash: slot, killed node, stage, iteration, replacement node, rule, source peers,
  ω (CheckFree weights), bytes fetched, crash → join and crash → serving latency (seconds).
* ``bytes_sent_by_type``: summed over every node (crashed nodes count up to their last commit).
* ``loss_curve``: [iteration, loss] in execution order; ``rollbacks``; ``skipped_crashes`` (no_failure).
* ``node_devices``: node id → ``cpu`` / ``cuda:N`` of every node this machine started (replacements too).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.wire.protocol import MessageType


class Results:
    """Accumulates measurements during a run (the supervisor's clock, seconds)."""

    def __init__(self, cfg: SwarmConfig, setting: str, target: int) -> None:
        self.cfg, self.setting, self.target = cfg, setting, target
        self.t0: float | None = None
        self.rows: list[dict[str, Any]] = []
        self.crashes: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []
        self.rollbacks: list[dict[str, Any]] = []
        self.reports: dict[int, dict[str, Any]] = {}
        self.finals: dict[int, dict[str, Any]] = {}
        self.failed_attempts: dict[int, int] = {}
        self.aborts = 0
        self.rollback_bytes = 0
        self.current_iteration = -1
        self.vocab_size: int | None = None
        self.node_devices: dict[int, str] = {}
        """node id → device of the nodes this machine started (``swarm run --device``)."""

    def start(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        """Seconds since training started (negative times never occur: before start it is 0)."""
        return 0.0 if self.t0 is None else time.monotonic() - self.t0

    def last_wall_s(self) -> float:
        """The previous iteration's wall time (1 s before the first), for placing a crash mid-iteration."""
        return self.rows[-1]["wall_s"] if self.rows else 1.0

    def iteration(
        self,
        it: int,
        epoch: int,
        ends: dict[int, dict],
        ready: dict[int, dict],
        members: dict[int, list[int]],
    ) -> None:
        t = self.now()
        prev = self.rows[-1]["t_commit"] if self.rows else 0.0
        stage_of = {n: s for s, ids in members.items() for n in ids}
        norms: dict[str, float] = {}
        for node, meta in ready.items():
            norms.setdefault(str(stage_of[node]), float(meta["grad_norm"]))
        losses = [float(m["loss"]) for m in ends.values()]
        self.rows.append(
            {
                "iteration": it,
                "epoch": epoch,
                "attempts": 1 + self.failed_attempts.get(it, 0),
                "t_commit": t,
                "wall_s": t - prev,
                "loss": sum(losses) / len(losses),
                "tokens": sum(int(m["tokens"]) for m in ends.values()),
                "grad_norms": norms,
            }
        )

    def served(self, crash: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
        t = self.now()
        out = {
            "t_serving": t,
            "latency_s": t - crash["t_crash"],
            "rule": record.get("rule"),
            "sources": record.get("sources"),
            "source_stages": record.get("source_stages"),
            "parts": record.get("parts"),
            "omegas": record.get("omegas"),
            "fallback": record.get("fallback"),
            "bytes": record.get("bytes", 0),
            "fetch_s": record.get("fetch_s"),
        }
        if "t_join" in crash:
            out["join_latency_s"] = crash["t_join"] - crash["t_crash"]
        return out

    def node_report(self, node: int, meta: dict[str, Any]) -> None:
        self.reports[node] = meta

    def bytes_by_type(self) -> dict[str, int]:
        out = {t.name: 0 for t in MessageType}
        for meta in self.reports.values():
            for name, n in meta.get("sent_bytes", {}).items():
                out[name] = out.get(name, 0) + int(n)
        return out

    def compute(self) -> dict[str, dict[str, float]]:
        return {str(n): m["compute"] for n, m in self.reports.items() if "compute" in m}

    def finish(self, run_dir: Path) -> dict[str, Any]:
        total = self.rows[-1]["t_commit"] if self.rows else 0.0
        completed = self.rows[-1]["iteration"] + 1 if self.rows else 0
        walls = [r["wall_s"] for r in self.rows]
        crash_iters = {c["iteration"] for c in self.crashes} | {r["at_iteration"] for r in self.rollbacks}
        quiet = [r["wall_s"] for r in self.rows if r["iteration"] not in crash_iters]
        latencies = [c["latency_s"] for c in self.crashes if "latency_s" in c]
        out = {
            "setting": self.setting,
            "nodes": self.cfg.n_nodes,
            "stages": self.cfg.n_stages + 1,
            "replicas": self.cfg.replicas,
            "microbatches": self.cfg.mb_count,
            "in_flight": self.cfg.in_flight,
            "time_scale": self.cfg.time_scale,
            "iterations_target": self.target,
            "iterations_completed": completed,
            "iterations_executed": len(self.rows),
            "total_s": total,
            "mean_iteration_s": total / len(self.rows) if self.rows else None,
            "median_iteration_s": statistics.median(walls) if walls else None,
            "mean_iteration_s_without_crashes": statistics.mean(quiet) if quiet else None,
            "tokens_per_s": completed * self.cfg.tokens_per_iteration() / total if total else None,
            "crashes_count": len(self.crashes),
            "recovered_count": len(latencies),
            "mean_crash_to_serving_s": statistics.mean(latencies) if latencies else None,
            "aborted_attempts": self.aborts,
            "crashes": self.crashes,
            "skipped_crashes": self.skipped,
            "rollbacks": self.rollbacks,
            "rollback_bytes": self.rollback_bytes,
            "bytes_sent_by_type": self.bytes_by_type(),
            "loss_curve": [[r["iteration"], r["loss"]] for r in self.rows],
            "iterations": self.rows,
            "node_compute": self.compute(),
            "malformed_dropped": {str(n): m.get("dropped_malformed", 0) for n, m in self.reports.items()},
            "vocab_size": self.vocab_size,
            "node_devices": {str(n): d for n, d in self.node_devices.items()},
            "config": self.cfg.to_json(),
        }
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / "throughput.json").write_text(json.dumps(out, indent=1))
        return out


def summary_table(results: list[dict[str, Any]]) -> str:
    """A Markdown table, one row per run: setting, iterations, crashes/recovered, times, loss."""
    head = (
        "| setting | iterations (executed) | crashes | recovered | mean iteration s | w/o crashes s | "
        "crash→serving s | tokens/s | first → last loss |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in results:
        curve = r["loss_curve"]
        lat = r["mean_crash_to_serving_s"]
        lines.append(
            f"| {r['setting']} | {r['iterations_completed']} ({r['iterations_executed']}) | {r['crashes_count']} | "
            f"{r['recovered_count']} | {_f(r['mean_iteration_s'])} | {_f(r['mean_iteration_s_without_crashes'])} | "
            f"{_f(lat)} | {_f(r['tokens_per_s'], 0)} | "
            f"{_f(curve[0][1] if curve else None)} → {_f(curve[-1][1] if curve else None)} |"
        )
    return "\n".join(lines)


def _f(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"
