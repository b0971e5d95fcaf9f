"""Resuming a run whose supervisor died (``swarm run --resume``; checkfree.swarm.supervisor.adoption): take over
the journaled processes that still run (pid and start time), dial every journaled launcher and node again, ask
each node where it is (``resume``) and wait for the answers, at least ``RESUME_WAIT_S`` and twice
``peer_timeout``; what a node's send queue still held for the dead supervisor is dropped, uncounted as offences
(``stale_after_resume``): a node's queue to the bootstrap address is flushed, in order, before its answer arrives.
Then the answers are judged (checkfree.swarm.supervisor.phases.adopting)."""

from __future__ import annotations

import logging
import time

from checkfree.swarm.supervisor.phases.base import Context, Decision, Phase, Turn, act
from checkfree.swarm.wire.protocol import Message, MessageType

log = logging.getLogger(__name__)

RESUME_WAIT_S = 15.0
"""At least this long a resumed supervisor waits for every journaled node's ``resume`` answer (and at least twice
``peer_timeout``: a node's PUSH socket reconnects to the bootstrap address within a second)."""


class Resuming(Phase):
    """The journal's state is loaded (``Supervisor.restore``): take over its processes, dial its launchers."""

    name = "resuming"
    poll_s = None

    def enter(self, ctx: Context, now: float) -> Decision:
        state = ctx.state
        data = state.resumed_from
        assert data is not None
        log.warning(
            "supervisor: resuming the run in %s (resume %d) at iteration %d from its journal of %s",
            ctx.run_dir,
            state.resumes,
            state.iteration,
            time.strftime("%H:%M:%S", time.localtime(data["written"])),
        )
        actions = [
            act("host", "adopt", int(node), pid, started)
            for node, (pid, started) in data["processes"].items()
        ]
        for launcher, address in sorted(state.roster.launcher_addresses.items()):
            actions.append(act("supervisor", "dial", launcher, address))
        return Decision(actions, AskingNodes(ctx.results.now()))


class AskingNodes(Phase):
    """Ask every live journaled node ``resume`` (the processes taken over, so their exits show); name why the others
    are not asked; start the forkserver's imports before training goes on, as in a fresh run."""

    name = "asking the nodes"
    poll_s = None

    def __init__(self, t_resumed: float) -> None:
        self.t_resumed = t_resumed

    def enter(self, ctx: Context, now: float) -> Decision:
        host, unasked, actions, candidates = ctx.host, {}, [], []
        for slot in ctx.state.roster.all():
            node = slot.occupant
            if slot.dead:
                continue
            if slot.local and (node not in host.procs or host.exited(node) is not None):
                unasked[node] = "its process is gone"
            elif slot.address is None:
                unasked[node] = "it had not joined (as the journal knows) when the supervisor died"
            else:  # a node that cannot be dialled is named in unasked by the executor
                actions.append(act("supervisor", "ask", node, slot.address, unasked))
                candidates.append(node)
        actions.append(act("host", "warm_up", wait=True))
        return Decision(actions, AwaitingAnswers(candidates, unasked, self.t_resumed))


class AwaitingAnswers(Phase):
    """Wait for the ``resumed`` answers of ``candidates`` (but those in ``unasked``), or until the ones left have
    exited (here: their grace ran out); then judge them."""

    name = "awaiting the nodes' answers"
    police = False

    def __init__(self, candidates: list[int], unasked: dict[int, str], t_resumed: float) -> None:
        self.candidates, self.unasked, self.t_resumed = candidates, unasked, t_resumed

    def enter(self, ctx: Context, now: float) -> Decision:
        self.wait = max(RESUME_WAIT_S, 2 * ctx.state.cfg.peer_timeout)
        self.deadline = now + self.wait
        return self.stay()

    def take(self, msg: Message, ctx: Context) -> bool:
        if msg.sender in ctx.state.roster.launchers or (
            msg.type == MessageType.CONTROL and msg.meta.get("command") == "resumed"
        ):
            return False
        ctx.state.stale_after_resume += 1
        return True

    def step(self, ctx: Context, turn: Turn) -> Decision:
        answered = set(ctx.state.reports.resumed)
        left = {n for n in self.candidates if n not in self.unasked} - answered
        if all(ctx.host.exited(n) is not None for n in left):  # none left, or the ones left have exited
            return self.judge(ctx)
        return self.stay()

    def expired(self, ctx: Context, turn: Turn) -> Decision:
        return self.judge(ctx)

    def judge(self, ctx: Context) -> Decision:
        return Decision([], ctx.phases.Adopting(self.wait, self.unasked, self.t_resumed))
