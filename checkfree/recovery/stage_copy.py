"""In-memory copies of one stage (weights + Adam state + LR multiplier), exact to the bit.

The baselines that keep state hold such copies: Bamboo's replica of the next stage (``redundant``), REFT's
per-stage snapshot (``ec_snapshot``). A copy is refreshed in place (no reallocation once shapes are known) and
restored so that the stage and its optimizer are bit-identical to the moment of the copy.

:func:`flatten` / :func:`unflatten` turn a copy into one float32 vector of a fixed layout, equal for every
transformer stage (they have the same parameter names and shapes), which is what parity coding needs. Missing Adam
state (no step yet) is encoded as zeros with step 0 and decoded back to "no state".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from checkfree.training_state import StateDict, TrainingState

ADAM_KEYS = ("step", "exp_avg", "exp_avg_sq")


@dataclass
class StageCopy:
    """A stage's weights (its ``state_dict``), Adam state by parameter index, and LR multiplier."""

    weights: StateDict
    optimizer: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    lr_multiplier: float = 1.0

    @property
    def nbytes(self) -> int:
        """Bytes held by this copy."""
        tensors = list(self.weights.values()) + [t for st in self.optimizer.values() for t in st.values()]
        return sum(t.numel() * t.element_size() for t in tensors)


def _adam_state(state: TrainingState, stage: int) -> dict[int, dict[str, torch.Tensor]]:
    """Live Adam tensors of ``stage`` by parameter index (references, not copies)."""
    opt = state.optimizers[stage]
    params = [p for g in opt.param_groups for p in g["params"]]
    out = {}
    for i, p in enumerate(params):
        st = opt.state.get(p)
        if st:
            out[i] = {k: st[k] if torch.is_tensor(st[k]) else torch.tensor(float(st[k])) for k in ADAM_KEYS}
    return out


def take_copy(state: TrainingState, stage: int, device: torch.device | str | None = None) -> StageCopy:
    """A fresh copy of stage ``stage`` (on ``device``, default: where the stage lives)."""

    def clone(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(device, copy=True) if device is not None else t.detach().clone()

    weights = {k: clone(v) for k, v in state.stages[stage].state_dict().items()}
    opt = {i: {k: clone(v) for k, v in st.items()} for i, st in _adam_state(state, stage).items()}
    return StageCopy(weights, opt, state.lr_multipliers[stage])


@torch.no_grad()
def refresh_copy(copy: StageCopy, state: TrainingState, stage: int) -> None:
    """Overwrite ``copy`` in place with stage ``stage``'s current state (tensors allocated only when new)."""
    for k, v in state.stages[stage].state_dict().items():
        copy.weights[k].copy_(v)
    live = _adam_state(state, stage)
    for i in list(copy.optimizer):
        if i not in live:
            del copy.optimizer[i]
    for i, st in live.items():
        dst = copy.optimizer.get(i)
        if dst is None:
            copy.optimizer[i] = {k: v.detach().clone() for k, v in st.items()}
        else:
            for k, v in st.items():
                dst[k].copy_(v)
    copy.lr_multiplier = state.lr_multipliers[stage]


def restore_copy(copy: StageCopy, state: TrainingState, stage: int) -> None:
    """Make stage ``stage`` and its optimizer bit-identical to ``copy`` (a fresh Adam loaded with its state)."""
    state.load_stage(stage, copy.weights)
    state.fresh_optimizer(stage, copy.lr_multiplier)
    opt = state.optimizers[stage]
    sd = opt.state_dict()
    sd["state"] = {i: {k: v.clone() for k, v in st.items()} for i, st in copy.optimizer.items()}
    opt.load_state_dict(sd)


# ------------------------------------------------------------------------------------ one vector per stage


def layout(state: TrainingState, stage: int) -> list[tuple[str, torch.Size]]:
    """The fixed order of :func:`flatten`: per parameter, weights, exp_avg, exp_avg_sq, then step (one element)."""
    out = []
    for name, p in state.stages[stage].named_parameters():
        out += [
            (f"param/{name}", p.shape),
            (f"exp_avg/{name}", p.shape),
            (f"exp_avg_sq/{name}", p.shape),
            (f"step/{name}", torch.Size([])),
        ]
    return out


def flatten(state: TrainingState, stage: int) -> torch.Tensor:
    """Stage ``stage``'s weights and Adam state as one float32 CPU vector in :func:`layout` order."""
    adam = _adam_state(state, stage)
    parts = []
    for i, (_, p) in enumerate(state.stages[stage].named_parameters()):
        st = adam.get(i)
        parts.append(p.detach().reshape(-1).float().cpu())
        for k in ("exp_avg", "exp_avg_sq"):
            parts.append(st[k].detach().reshape(-1).float().cpu() if st else torch.zeros(p.numel()))
        parts.append(st["step"].detach().reshape(1).float().cpu() if st else torch.zeros(1))
    return torch.cat(parts)


def unflatten(vector: torch.Tensor, state: TrainingState, stage: int, lr_multiplier: float) -> StageCopy:
    """Inverse of :func:`flatten` into a :class:`StageCopy` shaped like stage ``stage`` (step 0 = no state).

    Raises:
        ValueError: the vector's length does not match the stage's layout.
    """
    params = list(state.stages[stage].named_parameters())
    need = sum(3 * p.numel() + 1 for _, p in params)
    if vector.numel() != need:
        raise ValueError(f"a flattened stage has {vector.numel()} elements; stage {stage} needs {need}.")
    weights = {k: v.detach().clone() for k, v in state.stages[stage].state_dict().items()}
    opt: dict[int, dict[str, torch.Tensor]] = {}
    off = 0
    for i, (name, p) in enumerate(params):
        n = p.numel()
        chunks = [vector[off + j * n : off + (j + 1) * n].view(p.shape) for j in range(3)]
        step = vector[off + 3 * n].clone()
        off += 3 * n + 1
        weights[name] = chunks[0].to(weights[name].dtype).clone()
        if float(step) > 0:
            opt[i] = {"step": step, "exp_avg": chunks[1].clone(), "exp_avg_sq": chunks[2].clone()}
    return StageCopy(weights, opt, lr_multiplier)
