"""A stage's weights and Adam state as named tensors for the wire (no pickle), and back.

Tensor names in a WEIGHTS_RESPONSE or GRADIENTS message: ``w.<key>`` = state-dict entry, ``m.<param>`` /
``v.<param>`` = Adam's first/second moments, ``g.<param>`` = gradient. Scalars (Adam step, lr, gradient
norm, version) travel in the JSON meta.
"""

from __future__ import annotations

import torch
from torch import nn

from checkfree.swarm.wire.protocol import ProtocolError
from checkfree.training_state import StateDict

BETAS = (0.9, 0.999)
"""Adam betas (docs/paper.md §6)."""


def make_optimizer(module: nn.Module, lr: float) -> torch.optim.Adam:
    """A fresh Adam (0.9, 0.999), no weight decay (docs/paper.md §6)."""
    return torch.optim.Adam(module.parameters(), lr=lr, betas=BETAS)


def current_lr(opt: torch.optim.Optimizer) -> float:
    return float(opt.param_groups[0]["lr"])


def adam_step(opt: torch.optim.Optimizer) -> int:
    """Adam's step counter (0 before the first step)."""
    for state in opt.state.values():
        return int(float(state["step"]))
    return 0


def join(state: StateDict, prefix: str) -> dict[str, torch.Tensor]:
    """``state`` keyed by ``prefix.<key>`` (the inverse of :func:`split`); tensors detached, not copied."""
    return {f"{prefix}.{k}": v.detach() for k, v in state.items()}


def stage_tensors(module: nn.Module, opt: torch.optim.Optimizer | None = None) -> dict[str, torch.Tensor]:
    """``w.*`` for every state-dict entry, plus ``m.*``/``v.*`` Adam moments when ``opt`` is given."""
    out = join(module.state_dict(), "w")
    if opt is not None:
        for name, p in module.named_parameters():
            state = opt.state.get(p)
            if state:
                out[f"m.{name}"] = state["exp_avg"]
                out[f"v.{name}"] = state["exp_avg_sq"]
    return out


def split(tensors: dict[str, torch.Tensor], prefix: str) -> StateDict:
    """Entries of ``tensors`` named ``prefix.<key>``, keyed by ``<key>``."""
    n = len(prefix) + 1
    return {k[n:]: v for k, v in tensors.items() if k.startswith(prefix + ".")}


def check_finite(tensors: dict[str, torch.Tensor], source: str) -> None:
    """Reject NaN/inf in a peer's weights, gradients, Adam moments or stage-0 copy.

    Raises:
        ProtocolError: naming the first tensor that holds a NaN or an infinity.
    """
    for name, t in tensors.items():
        if torch.is_floating_point(t) and not bool(torch.isfinite(t).all()):
            raise ProtocolError(f"tensor {name!r} from {source} holds NaN or inf; expected finite numbers.")


def check_state(module: nn.Module, state: StateDict, source: str) -> None:
    """Check that ``state`` has exactly ``module``'s keys, shapes and dtypes, and finite values.

    Raises:
        ProtocolError: naming the first key, shape or value that does not fit.
    """
    own = module.state_dict()
    if own.keys() != state.keys():
        diff = sorted(set(own) ^ set(state))[:3]
        raise ProtocolError(
            f"weights from {source} differ from this stage in keys {diff}; expected the same stage."
        )
    for k, v in own.items():
        if v.shape != state[k].shape or v.dtype != state[k].dtype:
            raise ProtocolError(
                f"weights from {source}: {k!r} is {tuple(state[k].shape)} {state[k].dtype}; "
                f"expected {tuple(v.shape)} {v.dtype}."
            )
    check_finite(state, source)


def load_optimizer(
    module: nn.Module, opt: torch.optim.Adam, tensors: dict[str, torch.Tensor], step: int, lr: float
) -> None:
    """Set Adam's moments (``m.*``, ``v.*``), step and lr to a source's, making the replica exact."""
    m, v = split(tensors, "m"), split(tensors, "v")
    opt.state.clear()
    for name, p in module.named_parameters():
        if name in m and name in v:
            opt.state[p] = {
                "step": torch.tensor(float(step)),
                "exp_avg": m[name].clone(),
                "exp_avg_sq": v[name].clone(),
            }
    for group in opt.param_groups:
        group["lr"] = lr


def grad_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """``g.<param>`` for every parameter (zeros where no gradient was accumulated)."""
    return {
        f"g.{n}": (p.grad if p.grad is not None else torch.zeros_like(p))
        for n, p in module.named_parameters()
    }
