"""What a recovery strategy acts on: the stages, their optimizers, learning-rate multipliers and gradient norms.

The simulator holds one :class:`TrainingState` per data-parallel rank (every rank holds one replica of every stage).
Strategies read and replace whole stages through it, so the recovery math never touches processes or files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

StateDict = dict[str, torch.Tensor]


def make_adam(module: nn.Module, lr: float) -> torch.optim.Adam:
    """Adam (β 0.9, 0.999), no weight decay (paper §6)."""
    return torch.optim.Adam(module.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)


@dataclass
class TrainingState:
    """Stages 0..S with one optimizer each.

    Attributes:
        stages: [stage 0 (embedding + head), stage 1, …, stage S].
        optimizers: one Adam per stage.
        lr_multipliers: per-stage factor on the scheduled learning rate (lr_scale after a fresh recovery).
        grad_norms: per-stage L2 norm of the DP-averaged gradient at the last completed iteration, before
            clipping (1.0 before any iteration completed, paper §4.1).
        iteration: wall-clock iteration; only grows (failures are drawn by it).
        effective_iteration: the training position (data, LR schedule); rolls back with a checkpoint restore.
    """

    stages: list[nn.Module]
    optimizers: list[torch.optim.Optimizer]
    base_lr: float
    lr_multipliers: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    iteration: int = 0
    effective_iteration: int = 0
    optimizer_factory: Callable[[nn.Module, float], torch.optim.Optimizer] = make_adam

    def __post_init__(self) -> None:
        n = len(self.stages)
        if not self.lr_multipliers:
            self.lr_multipliers = [1.0] * n
        if not self.grad_norms:
            self.grad_norms = [1.0] * n

    @property
    def n_stages(self) -> int:
        """Transformer stages S (stage 0 excluded)."""
        return len(self.stages) - 1

    def stage_state(self, stage: int) -> StateDict:
        """Detached copies of stage ``stage``'s parameters and buffers."""
        return {k: v.detach().clone() for k, v in self.stages[stage].state_dict().items()}

    def load_stage(self, stage: int, state: StateDict) -> None:
        """Overwrite stage ``stage``'s weights in place (shapes must match exactly)."""
        with torch.no_grad():
            self.stages[stage].load_state_dict(state, strict=True)

    def fresh_optimizer(self, stage: int, lr_multiplier: float) -> None:
        """Replace stage ``stage``'s optimizer by a fresh Adam (state reset) at lr × ``lr_multiplier``."""
        self.lr_multipliers[stage] = lr_multiplier
        self.optimizers[stage] = self.optimizer_factory(self.stages[stage], self.base_lr * lr_multiplier)

    def destroy(self, stage: int) -> None:
        """Lose stage ``stage``: its weights become NaN and its optimizer state is dropped.

        A strategy that wrongly reads a lost stage then produces NaN instead of silently cheating.
        """
        with torch.no_grad():
            for p in self.stages[stage].parameters():
                p.fill_(float("nan"))
                p.grad = None
        self.optimizers[stage] = self.optimizer_factory(self.stages[stage], self.base_lr)
