"""The exact catch-up of a replacement recovering in the background (issue 39 point 3;
checkfree.swarm.node.catch_up): the kept updates, the checks of an update answer, the step it applies."""

from __future__ import annotations

import pytest
import torch

from checkfree.swarm.node.catch_up import UpdateKeeper, apply_update, check_update
from checkfree.swarm.node.context import StageState
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.protocol import Message, MessageType, ProtocolError


def _state(seed: int = 0) -> StageState:
    torch.manual_seed(seed)
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    return StageState(module, W.make_optimizer(module, 1e-2), 0, 1.0)


def _answer(grads: dict[str, torch.Tensor], update: int, stage: int = 1, norm: float = 0.5) -> Message:
    meta = {"stage": stage, "request": "r", "update": update, "version": update + 1, "grad_norm": norm}
    return Message(
        MessageType.WEIGHTS_RESPONSE, 7, meta=meta, tensors={f"g.{n}": g for n, g in grads.items()}
    )


def _grads(state: StageState, scale: float = 1.0) -> dict[str, torch.Tensor]:
    return {n: torch.full_like(p, scale) for n, p in state.module.named_parameters()}


def test_an_update_of_another_iteration_is_refused() -> None:
    state = _state()
    msg = _answer(_grads(state), update=3)
    assert check_update(msg, state.module, 3, 1).keys() == dict(state.module.named_parameters()).keys()
    with pytest.raises(ProtocolError, match="iteration 3; asked for 2"):
        check_update(msg, state.module, 2, 1)
    with pytest.raises(ProtocolError, match="stage"):
        check_update(_answer(_grads(state), update=3, stage=2), state.module, 3, 1)


def test_an_update_of_the_wrong_shape_dtype_or_values_is_refused() -> None:
    state = _state()
    bad = _grads(state)
    bad["0.weight"] = torch.zeros(3, 5)
    with pytest.raises(ProtocolError, match="does not fit"):
        check_update(_answer(bad, 0), state.module, 0, 1)
    bad = _grads(state)
    bad["0.bias"] = bad["0.bias"].double()
    with pytest.raises(ProtocolError, match="does not fit"):
        check_update(_answer(bad, 0), state.module, 0, 1)
    bad = _grads(state)
    bad["1.bias"][0] = float("nan")
    with pytest.raises(ProtocolError):
        check_update(_answer(bad, 0), state.module, 0, 1)
    with pytest.raises(ProtocolError, match="grad_norm"):
        check_update(_answer(_grads(state), 0, norm=float("inf")), state.module, 0, 1)


def test_replaying_the_kept_updates_on_a_copy_gives_the_replicas_bits() -> None:
    replica, keeper = _state(), UpdateKeeper(kept=2)
    copy = _state()  # the same weights and a fresh Adam: the copy at version 0
    for i in range(3):
        for p in replica.module.parameters():
            p.grad = torch.randn_like(p)
        keeper.keep(i, replica.module, 0.1 * i)
        replica.opt.step()
        replica.opt.zero_grad(set_to_none=True)
        replica.version += 1
    assert sorted(keeper.updates) == [1, 2]  # the last two kept
    assert keeper.get(0) is None
    # the copy at version 1 (as a WEIGHTS_RESPONSE gives it) would take updates 1 and 2; here the copy replays
    # from version 0 with all three, kept before the keeper dropped the first
    replica2, keeper2, copy2 = _state(), UpdateKeeper(kept=4), _state()
    for i in range(3):
        for p in replica2.module.parameters():
            p.grad = torch.randn_like(p)
        keeper2.keep(i, replica2.module, 0.5)
        replica2.opt.step()
        replica2.opt.zero_grad(set_to_none=True)
    for i in range(3):
        grads, norm = keeper2.get(i)  # type: ignore[misc]
        apply_update(copy2, grads, norm, i)
    assert copy2.version == 3
    for a, b in zip(replica2.module.parameters(), copy2.module.parameters(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="version 3"):
        apply_update(copy2, grads, 0.5, 1)
    del copy
