"""CheckFree+'s copies of stage 0 on its neighbours (paper §4.2, SPEC §3): E on stage 1, E⁻¹ on stage S.

Pusher (a stage-0 node): after each optimizer step, the serving stage-0 replica with the lowest node id sends
one STAGE0_COPY per holder: the embedding entries (``w.<key>``) to every stage-1 node and the head entries to
every stage-S node. The replicas of stage 0 are bit-identical after a step, so one sender is enough. The same
check runs at ``begin``, which brings holders that joined since (replacements) up to date before the next
crash can need them. Traffic: |E| bytes per stage-1 node plus |E⁻¹| bytes per stage-S node per iteration.

Holder (a stage-1 or stage-S node): keeps the newest copy it was sent, and serves it to a stage-0 replacement
as a WEIGHTS_RESPONSE to a WEIGHTS_REQUEST whose meta names ``"part"``. A holder without a copy answers with
an error, and the replacement asks the next holder (checkfree.swarm.recovering).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from checkfree.recovery.neighbours import stage0_copy_holders, stage0_part
from checkfree.swarm import weights as W
from checkfree.swarm.protocol import Message, MessageType, ProtocolError
from checkfree.swarm.worker import build_stage
from checkfree.training_state import StateDict

if TYPE_CHECKING:
    from checkfree.swarm.node import Node


class Stage0Copies:
    """A node's side of the stage-0 copies: pushing them (stage 0) or holding and serving them (stages 1, S)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.held: dict[str, tuple[int, StateDict]] = {}
        """part ("embedding" / "head") → (version, state dict of that part)."""
        self.sent: dict[int, int] = {}
        """holder node id → version last pushed to it."""

    def _active(self) -> bool:
        return self.node.strategy.keeps_stage0_copy

    def part_held_by_me(self) -> str | None:
        """The part this node's stage keeps a copy of, or None."""
        holders = stage0_copy_holders(self.node.cfg.n_stages)
        return next((part for part, stage in holders.items() if stage == self.node.stage), None)

    def push(self) -> None:
        """Stage 0, lowest-id serving replica: send this version's parts to every holder that lacks it."""
        node = self.node
        if not self._active() or node.stage != 0 or not node.serving:
            return
        replicas = node.members.get(0, [])
        if not replicas or min(replicas) != node.id:
            return
        state = node.module.state_dict()
        for part, stage in stage0_copy_holders(node.cfg.n_stages).items():
            targets = [peer for peer in node.members.get(stage, []) if self.sent.get(peer) != node.version]
            if not targets:
                continue
            tensors = W.join({k: v for k, v in state.items() if stage0_part(k) == part}, "w")
            for peer in targets:
                node.send(
                    peer,
                    MessageType.STAGE0_COPY,
                    node.iteration,
                    meta={"stage": 0, "part": part, "version": node.version},
                    tensors=tensors,
                )
                self.sent[peer] = node.version

    def on_copy(self, msg: Message) -> None:
        """Keep a pushed copy (the newest version wins).

        Raises:
            ProtocolError: the setting keeps no copies, this stage holds another part, the sender is not a
                stage-0 node, the version is ahead of the supervisor's iterations, or the tensors are not the
                named part's entries with this node's shapes and finite values (the node drops the message and
                counts it).
        """
        node = self.node
        part, version = msg.meta["part"], msg.meta["version"]
        mine = self.part_held_by_me() if self._active() else None
        if part != mine:
            raise ProtocolError(f"stage-0 copy part {part!r} sent to stage {node.stage}; expected {mine!r}")
        if msg.sender not in node.members.get(0, []) and node.peers.get(msg.sender, {}).get("stage") != 0:
            raise ProtocolError(f"stage-0 copy from node {msg.sender}, which does not serve stage 0")
        if not node.plausible_version(version):
            raise ProtocolError(f"stage-0 copy version {version} is ahead of the swarm's iterations")
        state = W.split(msg.tensors, "w")
        if not state or len(state) != len(msg.tensors):
            raise ProtocolError("stage-0 copy holds no tensors or tensors not named w.<key>")
        for key, tensor in state.items():
            if stage0_part(key) != part or not torch.is_floating_point(tensor):
                raise ProtocolError(
                    f"stage-0 copy entry {key!r} ({tensor.dtype}) is not a floating-point {part} entry"
                )
        shapes = self.part_shapes(part)
        if shapes is not None and {k: (t.shape, t.dtype) for k, t in state.items()} != shapes:
            raise ProtocolError(f"stage-0 {part} copy from node {msg.sender} has other keys or shapes")
        W.check_finite(state, f"node {msg.sender}")
        old = self.held.get(part)
        if old is None or version >= old[0]:
            self.held[part] = (int(version), state)

    def part_shapes(self, part: str) -> dict[str, tuple[torch.Size, torch.dtype]] | None:
        """Keys, shapes and dtypes of stage 0's ``part`` (from a stage-0 module built once), None if unknown."""
        if not hasattr(self, "_shapes"):
            node = self.node
            cfg = getattr(node, "cfg", None)
            vocab = getattr(node, "vocab_size", None)
            if cfg is None or vocab is None:
                return None
            with torch.device("meta"):  # shapes only: no memory, no init
                own = build_stage(cfg.model, 0, vocab, cfg.init_seed).state_dict()
            self._shapes = {
                p: {k: (v.shape, v.dtype) for k, v in own.items() if stage0_part(k) == p}
                for p in ("embedding", "head")
            }
        return self._shapes.get(part)

    def answer(self, msg: Message, reply: dict[str, Any]) -> None:
        """Answer a WEIGHTS_REQUEST for a stage-0 part with the held copy, or with an error if none is held."""
        node, part = self.node, msg.meta["part"]
        held = self.held.get(part) if msg.meta["stage"] == 0 else None
        if held is None:
            node.send(
                msg.sender,
                MessageType.WEIGHTS_RESPONSE,
                meta={**reply, "stage": 0, "error": f"node {node.id} holds no copy of the stage-0 {part!r}"},
            )
            return
        version, state = held
        node.send(
            msg.sender,
            MessageType.WEIGHTS_RESPONSE,
            meta={**reply, "stage": 0, "part": part, "version": version, "grad_norm": 1.0},
            tensors=W.join(state, "w"),
        )
