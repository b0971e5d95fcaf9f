"""Gathering the model, however the run ends: one serving replica per stage sends its weights, written to
``<run_dir>/model/`` (checkfree.swarm.supervisor.model_io; a stage without one is said in one sentence), and the
snapshot in flight completes. The run is ending: only the weights' answers are acted on."""

from __future__ import annotations

from checkfree.swarm.supervisor.model_io import live_members
from checkfree.swarm.supervisor.phases.base import Context, Decision, Phase, Turn, act, then
from checkfree.swarm.wire.protocol import Message, MessageType


class GatheringModel(Phase):
    """Ask for the weights, wait (at most ``request_timeout``) until the answers settled, write the model; then
    ``then`` (None: the drive ends)."""

    name = "gathering the model"
    police = False

    def __init__(self, then: Phase | None = None) -> None:
        self.then = then

    def enter(self, ctx: Context, now: float) -> Decision:
        self.deadline = now + ctx.state.cfg.request_timeout
        members = live_members(ctx.state.roster, ctx.silent(), ctx.host.exited)
        return self.stay([act("model_io", "gather", members)])

    def take(self, msg: Message, ctx: Context) -> bool:
        return (
            msg.type != MessageType.WEIGHTS_RESPONSE
        )  # to the gather or a snapshot (model_io); else dropped

    def step(self, ctx: Context, turn: Turn) -> Decision:
        return self.finish(ctx) if ctx.model_io.settled() else self.stay()

    def expired(self, ctx: Context, turn: Turn) -> Decision:
        return self.finish(ctx)

    def finish(self, ctx: Context) -> Decision:
        timeout = ctx.state.cfg.request_timeout
        return then([act("model_io", "finish_snapshots", timeout), act("model_io", "write_model")], self.then)
