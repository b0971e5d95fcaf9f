"""The convergence simulator: a pipeline-staged model trained with DP replicas while whole stages fail.

Each data-parallel rank (a torchrun process) holds one replica of every stage. Per iteration (docs/paper.md §1, §6):

    failures = source.draw(iteration)             identical on every rank and for every strategy
    strategy.recover(state, failures)             stages are destroyed first, then rebuilt
    for each microbatch: order = stage_order(mb)  CheckFree+ swaps on odd microbatches
        loss = CE(stages in order) / mb_count ; backward
    all-reduce(avg) gradients per stage ; ω_s = ‖∇_s‖ ; clip each stage to grad_clip ; Adam step per stage
    strategy.after_step(state) ; metrics ; validation every eval_interval ; run checkpoint every N

Strategies that keep state also get ``begin_iteration`` (before failed stages are lost) and
``before_optimizer_step`` (after backward, before any parameter changes) to take snapshots. The trainer writes
its own metrics lines and the recovery records ``recover`` returns (checkfree/recovery/record.py); a strategy
writes its own lines ("rollback", "checkpoint", "snapshot") the moment a hook produces them, through
:meth:`RunContext.emit`, so every line is in the order it happened.

``iteration`` (wall clock) only grows; ``effective_iteration`` (data position and LR schedule) can roll back when a
checkpoint strategy restores an old state, and the run ends when it reaches max_iterations.

Host syncs. :meth:`Trainer.step` waits for the device exactly once per iteration: one ``.tolist()`` of the
(S + 2,) vector [mean loss, ω_0, …, ω_S] after the gradient all-reduce (the clip factors and the CheckFree weights
need ω on the host, and every "train" line of metrics.jsonl logs the loss and ω). The forward/backward loop,
the all-reduce, clipping, the Adam steps (whose step counts torch keeps on the host) and the recovery math of the
neighbour rules queue device work only. Beyond that one sync, only:

- recovery accounting, in a failure iteration (on by default; ``--no-recovery-accounting``): the probe loss
  before and after the recovery (2) and 4 per floating-point tensor of each rebuilt stage
  (checkfree/telemetry/recovery_accounting.py);
- the strategies that keep copies in host memory or on disk by design, at their save interval: ``checkpoint``
  and ``one`` (their saves), ``ec_snapshot`` and the ladder's ``ec_snapshot`` rung (the REFT snapshots); their
  device → host copies are their cost;
- ``redundant`` (and its ladder rung), every ``redundant_measure_every`` iterations: a timed forward of each
  replica between two ``torch.cuda.synchronize`` (a wait, no read);
- the fused loss (``--fused-loss``, on CUDA by default where liger-kernel is installed): Liger's loss reads the
  count of labels on the host in its forward and compares the upstream gradient with 1.0 in its backward, two
  waits per microbatch (checkfree/loss.py);
- a recovery by the ``random`` rule (the ``random`` strategy, a fallback, the ladder's last rung): it draws on a
  CPU generator (the same numbers on every device and in the swarm) and copies them in from pageable memory,
  which on CUDA waits for the stream once per tensor (a wait, no read).

:meth:`Trainer.evaluate` syncs once per evaluation. tests/sim/test_meta_device.py runs the step on the meta device,
where any other sync or a CPU tensor mixed into device math raises, and counts these.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from checkfree.checkpoint import store
from checkfree.config import Config
from checkfree.devices import autocast_context, to_device
from checkfree.failures.injection import StageFailureSource
from checkfree.pipeline import (
    clip_coefficient,
    forward_loss,
    perplexity,
    scale_grads,
    stage_order,
)
from checkfree.recovery.base import RecoveryStrategy
from checkfree.sim.progress import WallClockGuard, expected_run_length
from checkfree.telemetry.metrics import MetricsSink
from checkfree.telemetry.recovery_accounting import RecoveryAccounting
from checkfree.telemetry.throughput import Peak, ThroughputMeter, peak_memory, stages_flops_per_token
from checkfree.training_state import TrainingState, make_adam

log = logging.getLogger(__name__)


def grad_norm_on_device(module: torch.nn.Module, device: torch.device) -> torch.Tensor:
    """L2 norm of all gradients of ``module`` as a 0-dim float32 tensor on ``device`` (0 when it has none).

    The value :func:`checkfree.pipeline.grad_norm` returns (the norm of the per-tensor norms), without its host
    sync: the trainer reads the norms of every stage and the loss in one copy.
    """
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float32, device=device)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


def learning_rate(cfg: Config, iteration: int) -> float:
    """Scheduled base LR (paper §6): constant for LLaMa; GPT: linear warm-up, then cosine to 0.1·lr."""
    if cfg.architecture == "LLaMa":
        return cfg.lr
    if iteration < cfg.warmup_iterations:
        return cfg.lr * (iteration + 1) / cfg.warmup_iterations
    span = max(1, cfg.max_iterations - cfg.warmup_iterations)
    progress = min(1.0, (iteration - cfg.warmup_iterations) / span)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


@dataclass
class RunContext:
    """Side effects of a run, passed in so tests can use fakes."""

    sink: MetricsSink
    checkpoint_dir: Path | None = None
    rank: int = 0
    world_size: int = 1
    group: Any = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    progress: Any = None  # tqdm-like: .update(n), .set_postfix_str(s), .close()
    autocast: str = "auto"
    """"auto" (bf16 on CUDA, off on CPU), "bf16" (also on CPU: the same code path, ~400× slower there) or "off"."""
    compile: bool = False
    """torch.compile each stage in place (``nn.Module.compile``: parameter names and state dicts unchanged)."""
    compile_backend: str = "inductor"
    """torch.compile backend ("eager" traces without code generation: gpu_check's CPU smoke run)."""
    compile_mode: str = "default"
    """torch.compile mode of the inductor backend: "default" or "reduce-overhead" (CUDA graphs)."""
    activation_checkpointing: bool = False
    """Recompute each transformer block in the backward pass instead of keeping its activations
    (:class:`checkfree.model.TransformerStage`; ``--activation-checkpointing``)."""
    fused_loss: bool = False
    """Train on Liger-Kernel's fused linear cross-entropy (CUDA; checkfree/loss.py, ``--fused-loss``); evaluation
    and the recovery probe keep the plain path."""
    peak: Peak | None = None
    """The device peak MFU divides by (checkfree.telemetry.throughput.device_peak); None: MFU is not reported."""
    recovery_accounting: bool = True
    """Measure each recovery against the lost stage (checkfree.telemetry.recovery_accounting); off: no extra fields."""

    def emit(self, kind: str, **fields: Any) -> None:
        """Write one metrics line now (a strategy's "rollback", "checkpoint", "snapshot" lines; the strategy's
        :class:`~checkfree.recovery.base.StrategyContext`)."""
        self.sink.write(kind, **fields)


class Trainer:
    """Trains ``stages`` under ``strategy`` with failures from ``failures``; see the module docstring."""

    def __init__(
        self,
        cfg: Config,
        stages: list[torch.nn.Module],
        batches: Any,
        val_batches: list[torch.Tensor],
        strategy: RecoveryStrategy,
        failures: StageFailureSource,
        ctx: RunContext,
        swaps: bool,
        config_json: dict[str, Any] | None = None,
        max_wall_iterations: int | None = None,
        data_fingerprint: dict[str, Any] | None = None,
        stop_at_loss: float | None = None,
        final_checkpoint: bool = True,
    ):
        """``max_wall_iterations``: stop after this many wall-clock iterations (None = 20 × max_iterations,
        :class:`checkfree.sim.progress.WallClockGuard`); ``data_fingerprint``: recorded in every run checkpoint so
        that a resume on other data is refused; ``stop_at_loss``: end at the first validation loss (nats) ≤ it,
        and treat reaching a cap first as censoring, not a failure (the summary's ``target``);
        ``final_checkpoint``: write a run checkpoint when training ends."""
        self.cfg, self.batches, self.val_batches = cfg, batches, val_batches
        self.guard = WallClockGuard(cfg.max_iterations, max_wall_iterations)
        self.stop_at_loss, self.final_checkpoint = stop_at_loss, final_checkpoint
        self.data_fingerprint = data_fingerprint
        self.strategy, self.failures, self.ctx, self.swaps = strategy, failures, ctx, swaps
        self.config_json = config_json or cfg.to_json()
        for s in stages:
            s.to(ctx.device)
        if ctx.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(ctx.device)  # summary.json's peak memory is this run's
        self.state = TrainingState(stages, [make_adam(s, cfg.lr) for s in stages], base_lr=cfg.lr)
        # bf16 autocast: parameters (the master weights), gradients and Adam state stay fp32.
        self.autocast = autocast_context(ctx.device, ctx.autocast)
        if ctx.activation_checkpointing:
            for s in stages[1:]:
                s.activation_checkpointing = True  # a plain attribute: names and state dicts unchanged
        if ctx.compile:
            # a mode is inductor's: another backend (gpu_check's CPU smoke: "eager") gets none
            mode = ctx.compile_mode if ctx.compile_backend == "inductor" else "default"
            options = {"mode": mode} if mode != "default" else {}
            for s in stages:  # stage 0 too: EmbeddingStage.compile compiles its embedding and head
                s.compile(backend=ctx.compile_backend, **options)  # in place: names and state dicts unchanged
        self.last_rate: dict[str, float | None] = {"tokens_per_second": 0.0, "mfu": None}
        self.meter = ThroughputMeter(
            stages_flops_per_token(stages, cfg.n_layers, cfg.dmodel, cfg.seq_l),
            ctx.peak or Peak(None, "not measured"),
            ctx.world_size,
        )
        self.counts = {"failures": 0, "recoveries": 0, "fallbacks": 0, "consecutive": 0}
        self.last_eval: dict[str, float] = {}
        self.first_eval: dict[str, float] = {}
        self.accounting = (
            RecoveryAccounting(val_batches[0] if val_batches else None, self.autocast)
            if ctx.recovery_accounting
            else None
        )
        if swaps:
            stage_order(1, cfg.n_stages, True)  # raises early for S < 4
        strategy.bind(ctx)

    # ------------------------------------------------------------------ one iteration
    def step(self) -> float:
        """Run one iteration (failures, recovery, forward/backward of every microbatch, step); returns the loss."""
        st, cfg = self.state, self.cfg
        failed = self.failures.draw(st.iteration)
        self.strategy.begin_iteration(st, failed)
        self.lose_stages(failed)
        lr = learning_rate(cfg, st.effective_iteration)
        for s, opt in enumerate(st.optimizers):
            for g in opt.param_groups:
                g["lr"] = lr * st.lr_multipliers[s]
            opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        total = torch.zeros((), device=self.ctx.device)
        # No host-device sync in this loop: the loss is summed on the device, batches are copied from pinned
        # memory without blocking, so on CUDA the host queues microbatch mb + 1 while mb runs.
        for mb in range(cfg.mb_count):
            batch = to_device(self.batches.batch(st.effective_iteration * cfg.mb_count + mb), self.ctx.device)
            with self.autocast:
                order = stage_order(mb, cfg.n_stages, self.swaps)
                loss = forward_loss(st.stages, batch, order, fused=self.ctx.fused_loss) / cfg.mb_count
            loss.backward()
            total += loss.detach()
        # The iteration's one sync is in _reduce_and_step: the loss and every stage's gradient norm ω in one copy
        # (the clip factors and the CheckFree weights need ω on the host); after it every queued kernel has
        # finished, so `seconds` is the iteration's real time on CUDA too.
        loss_value = self._reduce_and_step(total)
        self.strategy.after_step(st)
        seconds = time.perf_counter() - t0
        tokens = cfg.tokens_per_iteration * self.ctx.world_size
        self.last_rate = self.meter.record(tokens, seconds)
        self.ctx.sink.write(
            "train",
            iteration=st.iteration,
            effective_iteration=st.effective_iteration,
            loss=loss_value,
            lr=lr,
            tokens=tokens,
            seconds=round(seconds, 4),
            **self.last_rate,
            grad_norms=[round(x, 6) for x in st.grad_norms],
        )
        st.iteration += 1
        st.effective_iteration += 1
        return loss_value

    def lose_stages(self, failed: list[int]) -> None:
        """Lose the stages in ``failed`` now and let the strategy rebuild them: a "failure" line per stage, the
        stages destroyed (NaN weights, no optimizer state) when the strategy ``loses_state``, its recovery, and a
        "recovery" line per rebuilt stage (its :class:`~checkfree.recovery.record.RecoveryRecord`).

        :meth:`step` calls it after the strategy's ``begin_iteration``; a caller outside the loop (the probe,
        checkfree/probe/run.py) calls ``strategy.begin_iteration(state, failed)`` first when the strategy's
        snapshots may be due.
        """
        if not failed:
            return
        st = self.state
        it, eff = st.iteration, st.effective_iteration
        for s in failed:
            self.ctx.sink.write("failure", iteration=it, stage=s, effective_iteration=eff, with_stages=failed)
        self.counts["failures"] += len(failed)
        if not self.strategy.loses_state:
            log.info(
                "iteration %d: stage(s) %s drawn to fail; %s loses nothing", it, failed, self.strategy.name
            )
            return
        log.info("iteration %d: stage(s) %s failed", st.iteration, failed)
        # the lost weights stay in this frame only: the strategy gets the state, where they are NaN
        lost = self.accounting.keep(st, failed) if self.accounting is not None else None
        for s in failed:
            st.destroy(s)
        records = self.strategy.recover(st, list(failed))  # a rollback's lines are written meanwhile
        if lost is not None:
            self.accounting.annotate(lost, st, records)
        del lost
        for rec in records:
            rec.iteration = st.iteration
            self.counts["recoveries"] += 1
            self.counts["fallbacks"] += rec.fallback is not None
            self.counts["consecutive"] += rec.consecutive
            self.ctx.sink.write("recovery", **rec.to_json())
            log.info(
                "iteration %d: stage %d recovered by %s (%s) from stages %s%s",
                st.iteration,
                rec.stage,
                rec.strategy,
                rec.rule,
                rec.source_stages,
                f"; fallback: {rec.fallback}" if rec.fallback else "",
            )

    def _reduce_and_step(self, loss_sum: torch.Tensor) -> float:
        """All-reduce (average) gradients per stage, record ω, clip each stage, step. Returns the mean loss.

        ``loss_sum``: 0-dim float32 on the device. The one host sync of the step is here (module docstring).
        """
        st, cfg, ctx = self.state, self.cfg, self.ctx
        if ctx.world_size > 1:
            for stage in st.stages:  # one flat buffer per stage: one collective instead of one per tensor
                grads = [p.grad for p in stage.parameters() if p.grad is not None]
                flat = torch.cat([g.reshape(-1) for g in grads])
                dist.all_reduce(flat, group=ctx.group)
                flat.div_(ctx.world_size)
                offset = 0
                for g in grads:
                    g.copy_(flat[offset : offset + g.numel()].view_as(g))
                    offset += g.numel()
            dist.all_reduce(loss_sum, group=ctx.group)
            loss_sum /= ctx.world_size
        self.strategy.before_optimizer_step(st)
        # ω of the DP-averaged gradient, before clipping (paper §4.1), of every stage: (S + 1,) on the device
        norms = torch.stack([grad_norm_on_device(stage, ctx.device) for stage in st.stages])
        host = torch.cat([loss_sum.reshape(1).float(), norms.float()]).tolist()  # the step's one host sync
        for s, (stage, opt) in enumerate(zip(st.stages, st.optimizers, strict=True)):
            norm = host[1 + s]
            st.grad_norms[s] = norm
            scale_grads(stage, clip_coefficient(norm, cfg.grad_clip))
            opt.step()
        return host[0]

    # ------------------------------------------------------------------ validation
    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        """Mean validation cross-entropy (nats) and perplexity, stages in order; batches split over ranks."""
        st, ctx = self.state, self.ctx
        # on the device: NCCL reduces CUDA tensors only; and no host sync per validation batch
        total = torch.zeros(2, dtype=torch.float64, device=ctx.device)
        for i in range(ctx.rank, len(self.val_batches), ctx.world_size):
            with self.autocast:
                loss = forward_loss(
                    st.stages, to_device(self.val_batches[i], ctx.device), range(1, self.cfg.n_stages + 1)
                )
            total[0] += loss.detach().double()
            total[1] += 1.0
        if ctx.world_size > 1:
            dist.all_reduce(total, group=ctx.group)
        val = float(total[0] / total[1])
        self.ctx.sink.write(
            "eval",
            iteration=st.iteration,
            effective_iteration=st.effective_iteration,
            val_loss=val,
            perplexity=perplexity(val),
        )
        self.last_eval = {"iteration": st.iteration, "val_loss": val, "perplexity": perplexity(val)}
        if not self.first_eval:
            self.first_eval = dict(self.last_eval)
        return val, perplexity(val)

    # ------------------------------------------------------------------ run checkpoints
    def save_checkpoint(self) -> Path | None:
        """Write a run checkpoint (rank 0 only) so that START_ITER = effective_iteration resumes here."""
        if self.ctx.checkpoint_dir is None or self.ctx.rank != 0:
            return None
        t0 = time.perf_counter()
        snap = store.capture(
            self.state,
            self.cfg.n_layers_per_stage,
            self.config_json,
            strategy=self.strategy.name,
            world_size=self.ctx.world_size,
        )
        if self.data_fingerprint is not None:
            snap.meta["data"] = self.data_fingerprint
        path = store.write_snapshot(snap, self.ctx.checkpoint_dir, keep=self.cfg.keep_checkpoints)
        seconds = round(time.perf_counter() - t0, 4)
        self.ctx.sink.write(
            "checkpoint",
            iteration=self.state.iteration,
            effective_iteration=self.state.effective_iteration,
            path=str(path),
            bytes=snap.nbytes,
            seconds=seconds,
            stall_seconds=seconds,
            mode="sync",
            purpose="resume",
        )
        return path

    def resume(self, path: Path) -> None:
        """Load a run checkpoint (any stage layout with the same total layers)."""
        snap = store.read_checkpoint(path)
        same = store.restore(snap, self.state, self.cfg.n_layers_per_stage)
        self.ctx.sink.write(
            "resume",
            iteration=self.state.iteration,
            effective_iteration=self.state.effective_iteration,
            path=str(path),
            same_layout=same,
        )

    def replicas_consistent(self) -> bool:
        """Whether every DP rank holds bit-identical weights (they must: same failures, same recoveries)."""
        if self.ctx.world_size == 1:
            return True
        checksum = torch.zeros(2, dtype=torch.float64, device=self.ctx.device)  # NCCL: CUDA tensors only
        for stage in self.state.stages:
            for p in stage.parameters():
                checksum[0] += p.detach().double().sum()
        checksum[1] = -checksum[0]
        dist.all_reduce(checksum, op=dist.ReduceOp.MAX, group=self.ctx.group)
        consistent = bool(checksum[0] == -checksum[1])
        if not consistent:
            log.warning("data-parallel replicas diverged: their weights differ")
        return consistent

    # ------------------------------------------------------------------ the loop
    def _target_reached(self) -> bool:
        """Whether ``stop_at_loss`` is set and the last validation loss is at or below it."""
        return self.stop_at_loss is not None and self.last_eval.get("val_loss", math.inf) <= self.stop_at_loss

    def _target_summary(self, reached: bool, ended_by: str) -> dict[str, Any] | None:
        """summary.json's ``target``: the loss aimed at, whether it was reached and where, or the cap at which the
        run was censored with its last validation loss (a censored run has no time to target)."""
        if self.stop_at_loss is None:
            return None
        st, last = self.state, self.last_eval
        out: dict[str, Any] = {
            "loss": self.stop_at_loss,
            "reached": reached,
            "iteration": st.iteration,
            "effective_iteration": st.effective_iteration,
            "val_loss": last.get("val_loss"),
        }
        if not reached:
            out["censored_by"] = ended_by
            log.info(
                "censored: validation loss %.4f at iteration %d (effective %d) has not reached %.4f by %s",
                last.get("val_loss", math.nan),
                st.iteration,
                st.effective_iteration,
                self.stop_at_loss,
                ended_by.replace("_", "-"),
            )
        return out

    def train(self) -> dict[str, Any]:
        """Train until effective_iteration reaches max_iterations; returns the summary."""
        cfg, st = self.cfg, self.state
        self.strategy.setup(st)
        t_start = time.perf_counter()
        self.evaluate()
        last_loss = float("nan")
        guard, start = self.guard, (st.iteration, st.effective_iteration)
        expected = expected_run_length(
            self.strategy, self.failures, cfg.max_iterations - st.effective_iteration
        )
        if expected is not None and (warning := guard.expected_length_warning(expected)):
            log.warning("%s", warning)
        stopped, ended_by = None, "max_iterations"
        reached = self._target_reached()
        while st.effective_iteration < cfg.max_iterations and not reached:
            if guard.exceeded(st.iteration):
                ended_by = "max_wall_iterations"
                if self.stop_at_loss is None:
                    stopped = guard.stop_sentence(st.iteration, st.effective_iteration)
                    log.warning("%s", stopped)
                break
            last_loss = self.step()
            it = st.effective_iteration
            rate = guard.rate(it, st.iteration, start[1], start[0])
            if self.ctx.progress is not None:
                self.ctx.progress.n = it  # the training position: it goes back after a rollback
                self.ctx.progress.refresh()
                self.ctx.progress.set_postfix_str(f"loss {last_loss:.3f}, progress {rate:.2f} it/wall-it")
            if st.iteration % cfg.log_interval == 0 or it == cfg.max_iterations:
                log.info(
                    "iter %6d | loss %.4f | %s tok/s | MFU %s | failures %d | recoveries %d | progress %.2f it/wall-it",
                    st.iteration,
                    last_loss,
                    f"{self.last_rate['tokens_per_second']:,.0f}",
                    "n/a" if self.last_rate["mfu"] is None else f"{100 * self.last_rate['mfu']:.2f}%",
                    self.counts["failures"],
                    self.counts["recoveries"],
                    rate,
                )
            if it % cfg.eval_interval == 0 or it == cfg.max_iterations:
                val, ppl = self.evaluate()
                log.info("iter %6d | val_loss %.4f | perplexity %.2f", st.iteration, val, ppl)
                reached = self._target_reached()
            if (
                cfg.checkpoint_interval
                and it % cfg.checkpoint_interval == 0
                and it != cfg.max_iterations
                and not reached
            ):
                self.save_checkpoint()
        if reached:
            ended_by = "target"
        self.strategy.finish(st)
        if self.final_checkpoint:
            self.save_checkpoint()
        target = self._target_summary(reached, ended_by)
        return {
            "replicas_consistent": self.replicas_consistent(),
            "iterations": st.iteration,
            "effective_iterations": st.effective_iteration,
            "final_train_loss": last_loss,
            "first_eval": self.first_eval,
            "final_eval": self.last_eval,
            "stopped": stopped,
            "ended_by": ended_by,
            **({"target": target} if target is not None else {}),
            "progress_rate": round(guard.rate(st.effective_iteration, st.iteration, start[1], start[0]), 4),
            **self.counts,
            "seconds": round(time.perf_counter() - t_start, 3),
            "strategy_stats": self.strategy.stats(),
            **self.meter.summary(),
            **dict(
                zip(("peak_memory_bytes", "peak_memory_source"), peak_memory(self.ctx.device), strict=True)
            ),
            "fused_loss": self.ctx.fused_loss,
            "recovery_accounting_seconds": (
                None if self.accounting is None else round(self.accounting.seconds, 6)
            ),
        }
