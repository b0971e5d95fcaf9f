"""The authors' iteration-time formula and the paper's measured times (paper §5, SPEC §5).

:class:`IterationTimeFormula` is the estimate the authors' convergence simulator prints; the constants are the
500M model's measured iteration times (plain, with checkpoint sends, with redundant computation) and the ≈30 s
recovery of the paper's geo-distributed testbed. :mod:`checkfree.timing` turns runs into simulated hours with
them and re-exports every name here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from checkfree.failures import PAPER_ITERATION_SECONDS

GIB = 2**30
PAPER_CHECKPOINT_ITERATION_SECONDS = 91.35
"""Iteration time (s) of the 500M model with asynchronous checkpoint sends (paper §5 / SPEC §5)."""
PAPER_REDUNDANT_ITERATION_SECONDS = 151.04
"""Iteration time (s) of redundant computation on the 500M model (paper §5 / SPEC §5)."""
PAPER_REDUNDANT_RATIO = PAPER_REDUNDANT_ITERATION_SECONDS / PAPER_ITERATION_SECONDS
"""≈ 1.654: redundant computation's iteration time relative to plain pipeline training (paper)."""
PAPER_RECOVERY_SECONDS = 30.0
"""Seconds to recover one stage in the authors' geo-distributed testbed (paper §5.3 / SPEC §7)."""


# ---------------------------------------------------------------------------------------------- the formula
@dataclass(frozen=True)
class IterationTimeFormula:
    """The authors' iteration-time estimate (SPEC §5, printed by their convergence simulator):

    ``T_iter = backward_factor · waves · (T_fwd + (S+1)·B·d·L·bytes / (activation_bandwidth·2³⁰))
              + (2W−1)·P_stage·bytes / (dp_bandwidth·2³⁰)``

    The defaults are the authors' constants; each is a rough assumption of theirs, kept configurable.
    """

    backward_factor: float = 2.5
    """Forward + backward time as a multiple of the forward time ("backwards is a bit slower")."""
    waves: float = 2.0
    """Multiplier for pipeline waves ("in reality you will do multiple waves")."""
    bytes_per_element: float = 8.0
    """Bytes per activation / parameter element sent over the network."""
    activation_bandwidth_gib_s: float = 0.1
    """Bandwidth (GiB/s) for activations between consecutive stages (≈100 MB/s)."""
    dp_bandwidth_gib_s: float = 0.2
    """Bandwidth (GiB/s) of the data-parallel gradient exchange between replicas of a stage."""

    def components(
        self,
        forward_seconds: float,
        n_stages: int,
        batch_size: int,
        dmodel: int,
        seq_l: int,
        world_size: int,
        stage_parameters: int,
    ) -> dict[str, float]:
        """Seconds of the formula's parts: "compute", "activations", "data_parallel" and their "total".

        Args:
            forward_seconds: T_fwd, no-grad forward time (s) of one iteration's microbatches through all stages.
            n_stages: transformer stages S (the activation term counts S+1 hops, stage 0 included).
            batch_size, dmodel, seq_l: microbatch size B, model width d, sequence length L.
            world_size: data-parallel replicas W per stage.
            stage_parameters: P_stage, parameters of one transformer stage.
        Raises:
            ValueError: a negative time or a non-positive size.
        """
        if not (forward_seconds >= 0 and math.isfinite(forward_seconds)):
            raise ValueError(f"forward time {forward_seconds!r} s is invalid; expected a finite number ≥ 0.")
        for name, v in (
            ("n_stages", n_stages),
            ("batch_size", batch_size),
            ("dmodel", dmodel),
            ("seq_l", seq_l),
            ("world_size", world_size),
            ("stage_parameters", stage_parameters),
        ):
            if v <= 0:
                raise ValueError(f"{name} is {v!r}; the iteration-time formula needs a positive value.")
        activation_bytes = (n_stages + 1) * batch_size * dmodel * seq_l * self.bytes_per_element
        activations = activation_bytes / (self.activation_bandwidth_gib_s * GIB)
        compute = self.backward_factor * self.waves * forward_seconds
        comm = self.backward_factor * self.waves * activations
        dp = (
            (2 * world_size - 1) * stage_parameters * self.bytes_per_element / (self.dp_bandwidth_gib_s * GIB)
        )
        return {"compute": compute, "activations": comm, "data_parallel": dp, "total": compute + comm + dp}

    def seconds(
        self,
        forward_seconds: float,
        n_stages: int,
        batch_size: int,
        dmodel: int,
        seq_l: int,
        world_size: int,
        stage_parameters: int,
    ) -> float:
        """T_iter in seconds (see the class docstring and :meth:`components`)."""
        return self.components(
            forward_seconds, n_stages, batch_size, dmodel, seq_l, world_size, stage_parameters
        )["total"]

    def forward_seconds_from_compute(self, compute_seconds: float) -> float:
        """T_fwd estimated from a measured forward + backward time (s): ``compute / backward_factor``."""
        return compute_seconds / self.backward_factor


def stage_parameter_count(architecture: str, dmodel: int, n_layers_per_stage: int) -> int:
    """Parameters of one transformer stage (checkfree.model's blocks, MLP hidden 4·d, no biases for LLaMa).

    LLaMa block: attention 4d² + SwiGLU 3·d·4d + two RMSNorms 2d = 16d² + 2d.
    GPT-2 block: attention 4d² + 4d, MLP 8d² + 5d, two LayerNorms 4d = 12d² + 13d.
    Raises ValueError for an unknown architecture.
    """
    d = dmodel
    if architecture == "LLaMa":
        per_block = 16 * d * d + 2 * d
    elif architecture == "GPT":
        per_block = 12 * d * d + 13 * d
    else:
        raise ValueError(f"architecture {architecture!r} is unknown; expected 'LLaMa' or 'GPT'.")
    return n_layers_per_stage * per_block


def implied_iteration_seconds(rate_percent_per_hour: float, p_iter: float) -> float:
    """The iteration time (s) at which ``p_iter`` per iteration equals ``rate_percent_per_hour`` (SPEC §1).

    Solves ``p_iter = 1 − (1 − h/100) ** (T/3600)`` for T; ``inf`` when p_iter = 0 and h > 0.
    Raises ValueError when the rate is not in (0, 100) or p_iter not in [0, 1).
    """
    if not 0 < rate_percent_per_hour < 100:
        raise ValueError(
            f"failure rate {rate_percent_per_hour!r} %/h is invalid; expected a number in (0, 100)."
        )
    if not 0 <= p_iter < 1:
        raise ValueError(
            f"per-iteration failure probability {p_iter!r} is invalid; expected a number in [0, 1)."
        )
    if p_iter == 0:
        return math.inf
    return 3600.0 * math.log1p(-p_iter) / math.log1p(-rate_percent_per_hour / 100.0)


def redundant_ratio(
    forward_seconds_per_microbatch: float | None,
    mb_count: int,
    compute_seconds: float | None,
    n_stages: int = 1,
) -> tuple[float, str]:
    """Iteration-time ratio of redundant computation and where it came from.

    Measured: ``1 + S · mb_count · f / C`` with f the redundant forward seconds per microbatch of the slowest
    stage (Bamboo: every stage also runs its successor's forward on each microbatch) and C the measured compute
    seconds of one iteration through all stages, one after the other, as the simulator runs them. In a balanced
    pipeline the S stages work in parallel, so the extra work S·mb·f over the total C is each stage's extra time
    over its own. Otherwise the paper's 151.04 s / 91.32 s (which also includes Bamboo's halved microbatches).
    """
    if (
        forward_seconds_per_microbatch is not None
        and compute_seconds
        and compute_seconds > 0
        and forward_seconds_per_microbatch >= 0
    ):
        ratio = 1.0 + n_stages * mb_count * forward_seconds_per_microbatch / compute_seconds
        return ratio, (
            f"measured: {n_stages} stages × {mb_count} microbatches × {forward_seconds_per_microbatch:.4g} s "
            f"redundant forward / {compute_seconds:.4g} s compute per iteration"
        )
    return PAPER_REDUNDANT_RATIO, (
        f"paper: {PAPER_REDUNDANT_ITERATION_SECONDS} s / {PAPER_ITERATION_SECONDS} s "
        "(no measured redundant forward time)"
    )
