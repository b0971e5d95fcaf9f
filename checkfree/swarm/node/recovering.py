"""A node fetching its stage over the network: a replacement's recovery, or a checkpoint rollback.

:class:`Recovery` executes a :class:`~checkfree.recovery.planner.RecoveryPlan`: one WEIGHTS_REQUEST per source
stage to a serving node of that stage (or the storage node), each with a deadline of ``request_timeout``
seconds and a random 128-bit request id. Each answer is checked on arrival (the stage and part asked, the node
asked, a plausible version, this stage's keys and shapes, finite numbers); an error or rejected answer, a
refusal, or a source that leaves the peer table, moves the request to the next candidate still in the peer table
at once, a missed deadline after ``request_timeout``, and after ``max_attempts`` rounds over the candidates the
node gives up (``recovery_failed``; the supervisor kills it and starts another replacement).

**Refusals.** Every request names the plan it is made under (``seq``). A source that will not serve it says why
at once (checkfree.swarm.node.parts: ``refused`` is ``no_grant``, ``grant_used``, ``plan_superseded`` or
``byte_cap``, and the answer carries nothing else). A source that refused is not asked again under this plan:
the request goes to the next candidate that has not refused, and when every candidate still in the peer table
has, the task asks the supervisor for a new plan (below), whose grants reach the sources before the plan reaches
this node (checkfree.swarm.supervisor.planning). ``plan_superseded`` means the supervisor sent this node a newer
plan already: the task waits for it (asking for one too, which the supervisor ignores while one is on its way).

**Sources all gone.** When every candidate of a request has left the peer table (or a source stage has no
serving node at all), retrying is pointless: the task asks the supervisor at once (CONTROL ``replan`` with the
``seq`` of the plan it runs) and waits at most ``request_timeout`` for the answer. The supervisor plans the
stage again from the stages that serve now and sends CONTROL ``plan`` (the plan, the serving replicas of every
stage, a new ``seq``); :meth:`Recovery.replan` drops the open requests (a late answer to one is ignored) and
starts over. The supervisor also sends a new plan unasked when a loss event changes the plan of a stage this
node is rebuilding, so the replicas of one stage are rebuilt by one plan. The storage rule is exempt: the
storage node restarts under its own id. More than ``max_attempts`` requests for a plan, or no plan in time,
give up as above. The answers are combined by the plan's rule through the one table of recovery rules the
simulator executes too (:func:`checkfree.recovery.rules.rebuild`): a copy for replica/storage/partner copies, the
ω-weighted average of the CheckFree rule (docs/paper.md §2), stage 0 from the copies of E and E⁻¹ under CheckFree+
(docs/paper.md §3; a part whose holder is lost too gets the seeded random init), the seeded random init of the
"random" rule (no transformer stage survives): the seed, iteration and stage that the simulator uses give the same
numbers. A rule not in the table raises (:class:`~checkfree.recovery.rules.UnknownRule`): nothing is copied by
default. Neighbour, stage-0-copy and random rules get a fresh Adam at lr × lr_scale; replica and storage copies
load the source's Adam moments, step and lr. The record of what was rebuilt is the one recovery record
(checkfree.recovery.record): source stages and the nodes that sent them, the weight of each, ω, rung, fallback,
plus the fetch's lr, version, bytes and seconds.

A task never holds the node: it gets a :class:`FetchContext` (the node's context, config and ``reject``), the
:class:`~checkfree.swarm.node.context.StageState` to rebuild, and two callbacks. It returns what it rebuilt (a new
``StageState`` and the recovery record) through ``on_done``; ``on_fail`` gets the reason when it gives up.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from checkfree.recovery import rules
from checkfree.recovery.math import stage0_part
from checkfree.recovery.planner import RecoveryPlan
from checkfree.recovery.record import RecoveryRecord
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.node.context import NodeContext, StageState
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.control import control
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError

log = logging.getLogger(__name__)

Done = Callable[[StageState, dict[str, Any]], None]
"""Receives the rebuilt stage state and the recovery record."""


@dataclass
class FetchContext:
    """What a fetching task needs of its node.

    Attributes:
        node: the fetching node and its stage, the highest plausible weights version (its clock), who serves
            each stage (candidates) and the peer table (a source that left), and the ``send`` of the
            WEIGHTS_REQUESTs.
        cfg: the swarm config (``request_timeout``, ``max_attempts``, ``storage_id``, ``init_seed``, ``model``).
        reject: counts and logs a peer message that does not fit.
        iteration: the iteration of the loss event (seeds a random rule, as the simulator's).
    """

    node: NodeContext
    cfg: SwarmConfig
    reject: Callable[[Message, str], None]
    iteration: int = 0


class Recovery:
    """Fetch and combine a stage's weights per ``plan``.

    Args:
        ctx: the node's side (:class:`FetchContext`).
        plan: what to fetch and how to combine it (planned once by the supervisor).
        state: the replacement's fresh stage (keys and shapes to check answers against; the rebuilt weights are
            loaded into its module, which the node's worker computes with).
        on_done: receives the rebuilt :class:`StageState` and the record.
        on_fail: receives the reason when the task gives up.
        checkpoint_version: the storage version to ask for (rule "storage").
    """

    def __init__(
        self,
        ctx: FetchContext,
        plan: RecoveryPlan,
        state: StageState,
        on_done: Done,
        on_fail: Callable[[str], None],
        checkpoint_version: int = 0,
    ) -> None:
        self.ctx, self.plan, self.state, self.checkpoint_version = ctx, plan, state, checkpoint_version
        self.on_done, self.on_fail = on_done, on_fail
        self.requests: list[dict[str, Any]] = []
        self.t0 = time.monotonic()
        self.failed = False
        """True once the task gave up (it sends nothing more)."""
        self.seq = 0
        """The number of the plan it runs (0: the WELCOME's; the supervisor numbers the plans it sends after)."""
        self.plan_deadline: float | None = None
        """While it waits for a new plan from the supervisor: when it gives up waiting (monotonic seconds)."""
        self.plans_asked = 0
        self.superseded: set[str] = set()
        """Request ids of plans given up for a new one: a late answer to one is ignored."""

    def _give_up(self, reason: str) -> None:
        self.failed = True
        self.on_fail(reason)

    def start(self) -> None:
        ctx = self.ctx
        log.info(
            "node %d: recovering stage %d by rule %s from stages %s%s",
            ctx.node.node_id,
            ctx.node.stage,
            self.plan.rule,
            self.plan.sources,
            f" ({self.plan.fallback})" if self.plan.fallback else "",
        )
        self.requests = []
        for i, stage in enumerate(self.plan.sources):
            if self.plan.rule == "storage":
                candidates = [ctx.cfg.storage_id]
            else:
                candidates = list(ctx.node.membership.serving(stage))
            part = self.plan.parts[i] if self.plan.parts else None
            self.requests.append(
                {
                    "stage": stage,
                    "part": part,
                    "candidates": candidates,
                    "tries": 0,
                    "response": None,
                    "refused": set(),
                }
            )
        gone = [r["stage"] for r in self.requests if not self._live(r)]
        if gone:
            self._ask_plan(f"no serving node of stage {gone[0]} to recover from")
            return
        for i in range(len(self.requests)):
            self._send(i)
        if (
            not self.requests
        ):  # nothing to fetch ("random", or every stage-0 copy holder is lost): seeded init
            self._finish()

    def _live(self, req: dict[str, Any]) -> list[int]:
        """The request's candidates still in the peer table (the storage node: always its one id)."""
        if self.plan.rule == "storage":
            return req["candidates"]
        return [c for c in req["candidates"] if c in self.ctx.node.membership.peers]

    def _askable(self, req: dict[str, Any]) -> list[int]:
        """The request's candidates still in the peer table that have not refused it under this plan."""
        return [c for c in self._live(req) if c not in req["refused"]]

    def _ask_plan(self, why: str) -> None:
        """Every source of a request is gone: ask the supervisor for a new plan (once until it answers)."""
        if self.plan_deadline is not None:
            return
        self.plans_asked += 1
        if self.plans_asked > self.ctx.cfg.max_attempts:
            self._give_up(f"{why}; asked for a new plan {self.plans_asked - 1} times already")
            return
        self.plan_deadline = time.monotonic() + self.ctx.cfg.request_timeout
        log.warning("node %d: %s; asking the supervisor for a new plan", self.ctx.node.node_id, why)
        meta = control("replan", reason=why[:4000], seq=self.seq)
        self.ctx.node.send(SUPERVISOR_ID, MessageType.CONTROL, meta=meta)

    def replan(self, plan: RecoveryPlan, members: dict[str, list[int]], seq: int) -> None:
        """Run the supervisor's new plan number ``seq`` (``members``: the serving replicas of each stage now):
        the open requests are dropped (a late answer to one is ignored) and the fetch starts over.

        Raises:
            ProtocolError: ``seq`` is not newer than the plan it runs (a stale or replayed plan).
        """
        if seq <= self.seq:
            raise ProtocolError(f"recovery plan {seq}; this node runs plan {self.seq} already")
        self.superseded.update(r["id"] for r in self.requests if "id" in r)
        self.ctx.node.membership.set_members(members)
        self.plan, self.seq, self.plan_deadline = plan, seq, None
        self.start()

    def _send(self, i: int) -> None:
        req = self.requests[i]
        askable = self._askable(req)
        req["target"] = askable[req["tries"] % len(askable)]
        req["id"] = secrets.token_hex(16)  # unguessable: only the asked node can answer it
        req["deadline"] = time.monotonic() + self.ctx.cfg.request_timeout
        req["tries"] += 1
        meta = {
            "stage": req["stage"],
            "optimizer": self.plan.with_optimizer,
            "request": req["id"],
            "version": self.checkpoint_version,
            "seq": self.seq,  # the plan it asks under: the source's grant names it
        }
        if req["part"] is not None:  # a stage-0 copy: the holder is a stage-1 or stage-S node
            meta.update(stage=0, part=req["part"])
        self.ctx.node.send(req["target"], MessageType.WEIGHTS_REQUEST, meta=meta)

    def _retry(self, i: int, why: str) -> None:
        """Ask the next candidate still in the peer table now (a rejected, failed or lost answer), or the
        supervisor for a new plan when none is left; give up after ``max_attempts`` rounds over the
        candidates."""
        req = self.requests[i]
        if not self._live(req):
            self._ask_plan(f"every source of stage {req['stage']} left the swarm ({why})")
            return
        if not self._askable(req):
            self._ask_plan(f"every source of stage {req['stage']} refused plan {self.seq} ({why})")
            return
        if req["tries"] >= self.ctx.cfg.max_attempts * len(req["candidates"]):
            self._give_up(
                f"weights of stage {req['stage']} not obtained after {req['tries']} requests: {why}"
            )
            return
        log.warning(
            "node %d: request to %d failed (%s); asking the next candidate",
            self.ctx.node.node_id,
            req["target"],
            why,
        )
        self._send(i)

    def tick(self) -> None:
        now = time.monotonic()
        if self.plan_deadline is not None:
            if now > self.plan_deadline:
                self._give_up(
                    f"no new recovery plan from the supervisor within {self.ctx.cfg.request_timeout:.0f} s"
                )
            return
        for i, req in enumerate(self.requests):
            if req["response"] is None and now > req["deadline"]:
                self._retry(i, f"no answer within {self.ctx.cfg.request_timeout:.0f} s")
                if self.failed:
                    return

    def peers_changed(self) -> None:
        """A source that left the swarm will not answer: ask the next candidate at once (or the supervisor
        for a new plan, when no candidate is left)."""
        if self.plan_deadline is not None:
            return
        for i, req in enumerate(self.requests):
            if req["response"] is None and req["target"] not in self.ctx.node.membership.peers:
                self._retry(i, f"node {req['target']} left the swarm")
                if self.failed:
                    return

    def on_response(self, msg: Message) -> None:
        """Keep a valid answer; an error or a rejected answer moves that request to the next candidate.

        Raises:
            ProtocolError: the answer matches no open request (unknown id, or not from the node asked).
        """
        if msg.meta["request"] in self.superseded:
            log.info(
                "node %d: ignored a late answer of node %d to a replaced plan",
                self.ctx.node.node_id,
                msg.sender,
            )
            return
        for i, req in enumerate(self.requests):
            if (
                req.get("id") == msg.meta["request"]
                and req["response"] is None
                and msg.sender == req["target"]
            ):
                if "refused" in msg.meta:
                    self._refused(i, msg)
                    return
                if "error" in msg.meta:
                    self._retry(i, str(msg.meta["error"]))
                    return
                try:
                    self._check_answer(req, msg)
                except ProtocolError as exc:
                    self.ctx.reject(msg, str(exc))
                    self._retry(i, f"answer rejected: {exc}")
                    return
                req["response"] = msg
                if all(r["response"] is not None for r in self.requests):
                    self._finish()
                return
        raise ProtocolError("an unrequested WEIGHTS_RESPONSE (unknown request id or not the node asked)")

    def _refused(self, i: int, msg: Message) -> None:
        """Source ``msg.sender`` will not serve request ``i`` (module docstring, Refusals): wait for the newer
        plan it names, or move on to the next candidate (or the supervisor) at once.

        Raises:
            ProtocolError: the refusal carries more than the request's id, its stage and the reason.
        """
        if msg.tensors or set(msg.meta) != {"stage", "request", "refused"}:
            raise ProtocolError("a refusal that carries more than its request, stage and reason")
        req, reason = self.requests[i], msg.meta["refused"]
        if reason == "plan_superseded":
            self._ask_plan(f"node {msg.sender} holds a newer plan than plan {self.seq} for this node")
            return
        req["refused"].add(msg.sender)
        self._retry(i, f"node {msg.sender} refused: {reason}")

    def _check_answer(self, req: dict[str, Any], msg: Message) -> None:
        """Everything a loader needs, before it is kept: the stage and part asked, a plausible version, the
        stage's keys, shapes and dtypes, finite numbers, and the scalars of the rule.

        Raises:
            ProtocolError: naming what does not fit.
        """
        meta, source, module = msg.meta, f"node {msg.sender}", self.state.module
        want_stage = 0 if req["part"] is not None else req["stage"]
        if meta["stage"] != want_stage or meta.get("part") != req["part"]:
            raise ProtocolError(
                f"{source} answered for stage {meta['stage']} part {meta.get('part')}; asked for stage "
                f"{want_stage} part {req['part']}"
            )
        if "version" not in meta or not self.ctx.node.clock.plausible_version(meta["version"]):
            raise ProtocolError(f"{source} claims version {meta.get('version')}, ahead of the swarm")
        if self.plan.rule == "storage" and meta["version"] != self.checkpoint_version:
            raise ProtocolError(f"checkpoint version {meta['version']}; asked for {self.checkpoint_version}")
        state = W.split(msg.tensors, "w")
        own = module.state_dict()
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
            W.check_state(module, state, source)
        if self.plan.rule == "checkfree" and "grad_norm" not in meta:
            raise ProtocolError(f"{source} sent no grad_norm, which the CheckFree rule needs")
        if self.plan.with_optimizer:
            if not {"step", "lr", "grad_norm"} <= set(meta):
                raise ProtocolError(f"{source} sent no Adam step, lr or grad_norm")
            params = dict(module.named_parameters())
            for prefix in ("m", "v"):
                moments = W.split(msg.tensors, prefix)
                for name, t in moments.items():
                    p = params.get(name)
                    if p is None or t.shape != p.shape or t.dtype != p.dtype:
                        raise ProtocolError(f"Adam moment {prefix}.{name} from {source} does not fit")
                W.check_finite(moments, source)

    def _load(self) -> tuple[StageState, dict[str, Any]]:
        """Apply the plan to the answers; returns the rebuilt stage state and the recovery record.

        Raises:
            UnknownRule: the plan's rule is not in the table of recovery rules (checkfree.recovery.rules).
        """
        plan, cfg, ctx = self.plan, self.ctx.cfg.model, self.ctx
        module = self.state.module
        answers = [r["response"] for r in self.requests]
        inputs = rules.RuleInputs(
            template=module.state_dict(),
            sources=[W.split(m.tensors, "w") for m in answers],
            grad_norms=[float(m.meta["grad_norm"]) for m in answers] if plan.rule == "checkfree" else (),
            stage=ctx.node.stage,
            iteration=ctx.iteration,  # with the seed: the simulator's random-rule seed
            seed=ctx.cfg.init_seed,
            cfg=cfg,
        )
        rebuilt = rules.rebuild(plan, inputs)
        module.load_state_dict(rebuilt.state)
        if plan.with_optimizer:
            src = answers[0]
            opt = self.state.opt
            W.load_optimizer(module, opt, src.tensors, int(src.meta["step"]), float(src.meta["lr"]))
            grad_norm = float(src.meta["grad_norm"])
        else:
            opt = W.make_optimizer(module, cfg.lr * cfg.lr_scale)
            grad_norm = 1.0  # ω of a stage with no completed iteration yet (docs/paper.md §2)
        version = max((int(m.meta["version"]) for m in answers), default=self.state.version)
        record = RecoveryRecord(
            stage=ctx.node.stage,
            rule=plan.rule,
            source_stages=list(plan.sources),
            source_nodes=[m.sender for m in answers],
            parts=list(plan.parts) or None,
            weights=rebuilt.weights,
            omegas=rebuilt.omegas,
            grad_norm_mode=cfg.grad_norm_mode if rebuilt.omegas else None,
            rung=plan.rung,
            fallback=plan.fallback,
            extra={
                "lr": W.current_lr(opt),
                "version": version,
                "bytes": sum(t.numel() * t.element_size() for m in answers for t in m.tensors.values()),
                "fetch_s": time.monotonic() - self.t0,
            },
        )
        return StageState(module, opt, version, grad_norm), record.to_json()

    def _finish(self) -> None:
        rebuilt, record = self._load()
        log.info("node %d: recovered stage %d: %s", self.ctx.node.node_id, self.ctx.node.stage, record)
        self.on_done(rebuilt, record)


class Rollback(Recovery):
    """Checkpoint baseline: reload this stage's weights and Adam state of ``version`` from storage."""

    def __init__(
        self,
        ctx: FetchContext,
        version: int,
        state: StageState,
        on_done: Done,
        on_fail: Callable[[str], None],
    ) -> None:
        plan = RecoveryPlan("storage", (ctx.node.stage,), with_optimizer=True, fresh_lr_scale=False)
        super().__init__(ctx, plan, state, on_done, on_fail, version)

    def _finish(self) -> None:
        rebuilt, record = self._load()
        self.on_done(rebuilt, record)
