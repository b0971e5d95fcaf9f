"""A node fetching its stage over the network: a replacement's recovery, or a checkpoint rollback.

:class:`Recovery` executes a :class:`~checkfree.swarm.strategies.RecoveryPlan`: one WEIGHTS_REQUEST per source
stage to a serving node of that stage (or the storage node), each with a deadline of ``request_timeout``
seconds and a random 128-bit request id. Each answer is checked on arrival (the stage and part asked, the node
asked, a plausible version, this stage's keys and shapes, finite numbers); an error or rejected answer, or a
source that leaves the peer table, moves the request to the next candidate at once, a missed deadline after
``request_timeout``, and after
``max_attempts`` rounds over the candidates the node gives up (``recovery_failed``; the supervisor kills it
and starts another replacement). The answers are combined with the shared recovery math
(checkfree.recovery.neighbours): ``copy_state`` for replica/storage/partner copies, ``weighted_average``
with ω = checkfree_weight(last gradient norm) for the CheckFree rule (SPEC §2), and, for a lost stage 0 under
CheckFree+, the embedding copy held by stage 1 merged with the head copy held by stage S (SPEC §3). Neighbour
and stage-0-copy rules get a fresh Adam at lr × lr_scale; replica and storage copies load the source's Adam
moments, step and lr.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from checkfree.pipeline import checkfree_weight
from checkfree.recovery.neighbours import copy_state, stage0_part, weighted_average
from checkfree.swarm import weights as W
from checkfree.swarm.protocol import Message, MessageType, ProtocolError
from checkfree.swarm.strategies import RecoveryPlan

if TYPE_CHECKING:
    from checkfree.swarm.node import Node

log = logging.getLogger(__name__)


class Recovery:
    """Fetch and combine a stage's weights per ``plan``; calls ``node.recovered(record)`` when done."""

    def __init__(self, node: Node, plan: RecoveryPlan, checkpoint_version: int = 0) -> None:
        self.node, self.plan, self.checkpoint_version = node, plan, checkpoint_version
        self.requests: list[dict[str, Any]] = []
        self.t0 = time.monotonic()

    def start(self) -> None:
        node = self.node
        log.info(
            "node %d: recovering stage %d by rule %s from stages %s%s",
            node.id,
            node.stage,
            self.plan.rule,
            self.plan.sources,
            f" ({self.plan.fallback})" if self.plan.fallback else "",
        )
        for i, stage in enumerate(self.plan.sources):
            if self.plan.rule == "storage":
                candidates = [node.storage_id]
            else:
                candidates = list(node.members.get(stage, []))
            if not candidates:
                node.give_up(f"no serving node of stage {stage} to recover from")
                return
            part = self.plan.parts[i] if self.plan.parts else None
            self.requests.append(
                {"stage": stage, "part": part, "candidates": candidates, "tries": 0, "response": None}
            )
            self._send(i)
        if not self.requests:  # nothing to fetch (every stage-0 copy holder is lost too): fresh init
            self._finish()

    def _send(self, i: int) -> None:
        req, node = self.requests[i], self.node
        req["target"] = req["candidates"][req["tries"] % len(req["candidates"])]
        req["id"] = secrets.token_hex(16)  # unguessable: only the asked node can answer it
        req["deadline"] = time.monotonic() + node.cfg.request_timeout
        req["tries"] += 1
        meta = {
            "stage": req["stage"],
            "optimizer": self.plan.with_optimizer,
            "request": req["id"],
            "version": self.checkpoint_version,
        }
        if req["part"] is not None:  # a stage-0 copy: the holder is a stage-1 or stage-S node
            meta.update(stage=0, part=req["part"])
        node.send(req["target"], MessageType.WEIGHTS_REQUEST, meta=meta)

    def _retry(self, i: int, why: str) -> None:
        """Ask the next candidate now (a rejected, failed or lost answer); give up after ``max_attempts``
        rounds over the candidates."""
        req = self.requests[i]
        if req["tries"] >= self.node.cfg.max_attempts * len(req["candidates"]):
            self.node.give_up(
                f"weights of stage {req['stage']} not obtained after {req['tries']} requests: {why}"
            )
            return
        log.warning(
            "node %d: request to %d failed (%s); asking the next candidate", self.node.id, req["target"], why
        )
        self._send(i)

    def tick(self) -> None:
        now = time.monotonic()
        for i, req in enumerate(self.requests):
            if req["response"] is None and now > req["deadline"]:
                self._retry(i, f"no answer within {self.node.cfg.request_timeout:.0f} s")
                if self.node.task is not self:
                    return

    def peers_changed(self) -> None:
        """A source that left the swarm will not answer: ask the next candidate at once."""
        for i, req in enumerate(self.requests):
            if req["response"] is None and req["target"] not in self.node.peers:
                self._retry(i, f"node {req['target']} left the swarm")
                if self.node.task is not self:
                    return

    def on_response(self, msg: Message) -> None:
        """Keep a valid answer; an error or a rejected answer moves that request to the next candidate.

        Raises:
            ProtocolError: the answer matches no open request (unknown id, or not from the node asked).
        """
        for i, req in enumerate(self.requests):
            if (
                req.get("id") == msg.meta["request"]
                and req["response"] is None
                and msg.sender == req["target"]
            ):
                if "error" in msg.meta:
                    self._retry(i, str(msg.meta["error"]))
                    return
                try:
                    self._check_answer(req, msg)
                except ProtocolError as exc:
                    self.node.reject(msg, str(exc))
                    self._retry(i, f"answer rejected: {exc}")
                    return
                req["response"] = msg
                if all(r["response"] is not None for r in self.requests):
                    self._finish()
                return
        raise ProtocolError("an unrequested WEIGHTS_RESPONSE (unknown request id or not the node asked)")

    def _check_answer(self, req: dict[str, Any], msg: Message) -> None:
        """Everything a loader needs, before it is kept: the stage and part asked, a plausible version, the
        stage's keys, shapes and dtypes, finite numbers, and the scalars of the rule.

        Raises:
            ProtocolError: naming what does not fit.
        """
        node, meta, source = self.node, msg.meta, f"node {msg.sender}"
        want_stage = 0 if req["part"] is not None else req["stage"]
        if meta["stage"] != want_stage or meta.get("part") != req["part"]:
            raise ProtocolError(
                f"{source} answered for stage {meta['stage']} part {meta.get('part')}; asked for stage "
                f"{want_stage} part {req['part']}"
            )
        if "version" not in meta or not node.plausible_version(meta["version"]):
            raise ProtocolError(f"{source} claims version {meta.get('version')}, ahead of the swarm")
        if self.plan.rule == "storage" and meta["version"] != self.checkpoint_version:
            raise ProtocolError(f"checkpoint version {meta['version']}; asked for {self.checkpoint_version}")
        state = W.split(msg.tensors, "w")
        own = node.module.state_dict()
        if req["part"] is not None:
            own = {k: v for k, v in own.items() if stage0_part(k) == req["part"]}
            if set(state) != set(own):
                raise ProtocolError(f"stage-0 {req['part']} copy from {source} has keys {sorted(state)[:3]}")
            for k, v in own.items():
                if state[k].shape != v.shape or state[k].dtype != v.dtype:
                    raise ProtocolError(
                        f"stage-0 copy entry {k!r} from {source} has the wrong shape or dtype"
                    )
            W.check_finite(state, source)
        else:
            W.check_state(node.module, state, source)
        if self.plan.rule == "checkfree" and "grad_norm" not in meta:
            raise ProtocolError(f"{source} sent no grad_norm, which the CheckFree rule needs")
        if self.plan.with_optimizer:
            if not {"step", "lr", "grad_norm"} <= set(meta):
                raise ProtocolError(f"{source} sent no Adam step, lr or grad_norm")
            params = dict(node.module.named_parameters())
            for prefix in ("m", "v"):
                moments = W.split(msg.tensors, prefix)
                for name, t in moments.items():
                    p = params.get(name)
                    if p is None or t.shape != p.shape or t.dtype != p.dtype:
                        raise ProtocolError(f"Adam moment {prefix}.{name} from {source} does not fit")
                W.check_finite(moments, source)

    def _load(self) -> dict[str, Any]:
        """Apply the plan to the answers; returns the recovery record."""
        node, plan, cfg = self.node, self.plan, self.node.model_cfg
        answers = [r["response"] for r in self.requests]
        states = [W.split(m.tensors, "w") for m in answers]
        omegas = None
        if plan.rule == "stage0_copy":
            new = self._merge_stage0_parts(answers, states)
        elif plan.rule == "checkfree":
            omegas = [
                checkfree_weight(float(m.meta["grad_norm"]), cfg.grad_clip, cfg.grad_norm_mode)
                for m in answers
            ]
            new = weighted_average(states[0], states[1], omegas[0], omegas[1])
        else:
            new = copy_state(states[0])
        node.module.load_state_dict(new)
        if plan.with_optimizer:
            src = answers[0]
            W.load_optimizer(node.module, node.opt, src.tensors, int(src.meta["step"]), float(src.meta["lr"]))
            node.grad_norm = float(src.meta["grad_norm"])
        else:
            node.opt = W.make_optimizer(node.module, cfg.lr * cfg.lr_scale)
            node.grad_norm = 1.0  # ω of a stage with no completed iteration yet (SPEC §2)
        node.version = max((int(m.meta["version"]) for m in answers), default=node.version)
        return {
            "rule": plan.rule,
            "sources": [m.sender for m in answers],
            "source_stages": list(plan.sources),
            "parts": list(plan.parts) or None,
            "rung": plan.rung,
            "omegas": omegas,
            "grad_norm_mode": cfg.grad_norm_mode if omegas else None,
            "fallback": plan.fallback,
            "lr": W.current_lr(node.opt),
            "version": node.version,
            "bytes": sum(t.numel() * t.element_size() for m in answers for t in m.tensors.values()),
            "fetch_s": time.monotonic() - self.t0,
        }

    def _merge_stage0_parts(self, answers: list[Message], states: list[dict[str, Any]]) -> dict[str, Any]:
        """Stage 0 from its copies (each answer was checked to hold exactly its part's entries on arrival);
        a part with no holder left keeps this node's fresh initialisation (the plan's fallback)."""
        new = dict(self.node.module.state_dict())  # load_state_dict copies the values in
        for state in states:
            new.update(state)
        return new

    def _finish(self) -> None:
        record = self._load()
        log.info("node %d: recovered stage %d: %s", self.node.id, self.node.stage, record)
        self.node.recovered(record)


class Rollback(Recovery):
    """Checkpoint baseline: reload this stage's weights and Adam state of ``version`` from storage."""

    def __init__(self, node: Node, version: int) -> None:
        super().__init__(
            node, RecoveryPlan("storage", (node.stage,), with_optimizer=True, fresh_lr_scale=False), version
        )

    def _finish(self) -> None:
        record = self._load()
        self.node.restored(record)
