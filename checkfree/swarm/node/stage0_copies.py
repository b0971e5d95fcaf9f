"""CheckFree+'s copies of stage 0 on its neighbours (paper §4.2, docs/paper.md §3): E on stage 1, E⁻¹ on stage S.

Pusher (a stage-0 node): after each optimizer step, the serving stage-0 replica with the lowest node id sends
one STAGE0_COPY per holder: the embedding entries (``w.<key>``) to every stage-1 node and the head entries to
every stage-S node. The replicas of stage 0 are bit-identical after a step, so one sender is enough. The same
check runs at ``begin``, which brings holders that joined since (replacements) up to date before the next
crash can need them. Traffic: |E| bytes per stage-1 node plus |E⁻¹| bytes per stage-S node per iteration.

Holder (a stage-1 or stage-S node): keeps the newest copy it was sent, and serves it to a stage-0 replacement
as a WEIGHTS_RESPONSE to a WEIGHTS_REQUEST whose meta names ``"part"``. It reports the version it holds with
each ``committed`` (``stage0_copy``): the supervisor plans a lost stage 0 from a holder stage only once one of
its serving nodes holds a copy, so a holder rebuilt since the last push (it holds none) is never planned as a
source; that part takes the random-init fallback at once. A holder asked anyway answers with an error, and the
replacement asks the next holder (checkfree.swarm.node.recovering).
"""

from __future__ import annotations

from typing import Any

import torch

from checkfree.config import Config
from checkfree.recovery.math import stage0_part
from checkfree.recovery.planner import stage0_copy_holders
from checkfree.swarm.node.compute import build_stage
from checkfree.swarm.node.context import NodeContext, StageState
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.protocol import Message, MessageType, ProtocolError
from checkfree.training_state import StateDict

Shapes = dict[str, tuple[torch.Size, torch.dtype]]
"""State-dict key → (shape, dtype)."""


def stage0_part_shapes(model_cfg: Config, vocab_size: int, seed: int) -> dict[str, Shapes]:
    """Keys, shapes and dtypes of each stage-0 part ("embedding", "head"), from a stage-0 module built on the
    meta device (no memory, no init)."""
    with torch.device("meta"):
        own = build_stage(model_cfg, 0, vocab_size, seed).state_dict()
    return {
        p: {k: (v.shape, v.dtype) for k, v in own.items() if stage0_part(k) == p}
        for p in ("embedding", "head")
    }


class Stage0Copies:
    """A node's side of the stage-0 copies: pushing them (stage 0) or holding and serving them (stages 1, S).

    Args:
        ctx: this node and its stage, its iteration and the highest plausible version, the serving replicas of
            stages 0, 1 and S and the peer table, and the ``send`` of STAGE0_COPY and WEIGHTS_RESPONSE messages.
        n_stages: transformer stages S.
        active: the setting keeps stage-0 copies (CheckFree+).
        state: the stage this node trains (stage 0: the parts it pushes, and their version).
        shapes: each part's keys, shapes and dtypes (:func:`stage0_part_shapes`); None: not checked.
    """

    def __init__(
        self,
        ctx: NodeContext,
        n_stages: int,
        active: bool,
        state: StageState,
        shapes: dict[str, Shapes] | None = None,
    ) -> None:
        self.ctx, self.n_stages, self.active, self.state, self.shapes = ctx, n_stages, active, state, shapes
        self.held: dict[str, tuple[int, StateDict]] = {}
        """part ("embedding" / "head") → (version, state dict of that part)."""
        self.sent: dict[int, int] = {}
        """holder node id → version last pushed to it."""

    def report(self) -> dict[str, int]:
        """``{"stage0_copy": version}`` of the copy this node holds, ``{}`` when it holds none (the field of
        ``committed`` the supervisor plans a lost stage 0 by)."""
        part = self.part_held_by_me() if self.active else None
        held = self.held.get(part) if part is not None else None
        return {} if held is None else {"stage0_copy": held[0]}

    def part_held_by_me(self) -> str | None:
        """The part this node's stage keeps a copy of, or None."""
        holders = stage0_copy_holders(self.n_stages)
        return next((part for part, stage in holders.items() if stage == self.ctx.stage), None)

    def push(self) -> None:
        """Stage 0, lowest-id serving replica: send this version's parts to every holder that lacks it (the
        caller pushes only while it serves)."""
        ctx = self.ctx
        if not self.active or ctx.stage != 0:
            return
        replicas, version = ctx.membership.serving(0), self.state.version
        if not replicas or min(replicas) != ctx.node_id:
            return
        state = self.state.module.state_dict()
        for part, stage in stage0_copy_holders(self.n_stages).items():
            targets = [peer for peer in ctx.membership.serving(stage) if self.sent.get(peer) != version]
            if not targets:
                continue
            tensors = W.join({k: v for k, v in state.items() if stage0_part(k) == part}, "w")
            for peer in targets:
                ctx.send(
                    peer,
                    MessageType.STAGE0_COPY,
                    ctx.clock.iteration,
                    meta={"stage": 0, "part": part, "version": version},
                    tensors=tensors,
                )
                self.sent[peer] = version

    def on_copy(self, msg: Message) -> None:
        """Keep a pushed copy (the newest version wins).

        Raises:
            ProtocolError: the setting keeps no copies, this stage holds another part, the sender is not a
                stage-0 node, the version is ahead of the supervisor's iterations, or the tensors are not the
                named part's entries with this node's shapes and finite values (the node drops the message and
                counts it).
        """
        ctx, part, version = self.ctx, msg.meta["part"], msg.meta["version"]
        mine = self.part_held_by_me() if self.active else None
        if part != mine:
            raise ProtocolError(f"stage-0 copy part {part!r} sent to stage {ctx.stage}; expected {mine!r}")
        if msg.sender not in ctx.membership.serving(0) and ctx.membership.stage_of(msg.sender) != 0:
            raise ProtocolError(f"stage-0 copy from node {msg.sender}, which does not serve stage 0")
        if not ctx.clock.plausible_version(version):
            raise ProtocolError(f"stage-0 copy version {version} is ahead of the swarm's iterations")
        state = W.split(msg.tensors, "w")
        if not state or len(state) != len(msg.tensors):
            raise ProtocolError("stage-0 copy holds no tensors or tensors not named w.<key>")
        for key, tensor in state.items():
            if stage0_part(key) != part or not torch.is_floating_point(tensor):
                raise ProtocolError(
                    f"stage-0 copy entry {key!r} ({tensor.dtype}) is not a floating-point {part} entry"
                )
        shapes = self.shapes.get(part) if self.shapes is not None else None
        if shapes is not None and {k: (t.shape, t.dtype) for k, t in state.items()} != shapes:
            raise ProtocolError(f"stage-0 {part} copy from node {msg.sender} has other keys or shapes")
        W.check_finite(state, f"node {msg.sender}")
        old = self.held.get(part)
        if old is None or version >= old[0]:
            self.held[part] = (int(version), state)

    def answer(self, msg: Message, reply: dict[str, Any]) -> int:
        """Answer a WEIGHTS_REQUEST for a stage-0 part with the held copy, or with an error if none is held;
        returns the tensor bytes sent."""
        part = msg.meta["part"]
        held = self.held.get(part) if msg.meta["stage"] == 0 else None
        if held is None:
            self.ctx.send(
                msg.sender,
                MessageType.WEIGHTS_RESPONSE,
                meta={
                    **reply,
                    "stage": 0,
                    "error": f"node {self.ctx.node_id} holds no copy of the stage-0 {part!r}",
                },
            )
            return 0
        version, state = held
        tensors = W.join(state, "w")
        self.ctx.send(
            msg.sender,
            MessageType.WEIGHTS_RESPONSE,
            meta={**reply, "stage": 0, "part": part, "version": version, "grad_norm": 1.0},
            tensors=tensors,
        )
        return sum(t.numel() * t.element_size() for t in tensors.values())
