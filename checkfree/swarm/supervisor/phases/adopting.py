"""Adopting the live nodes after a resume: the answers judged against the journal (checkfree.swarm.supervisor.
adoption ``judge``), the verdict carried out (the nodes it replaces killed, by pid or through their launcher; the
adopted nodes' versions and stage-0 copies taken, their ``serving`` for a recovery that finished while the supervisor
was away, the storage node's versions), then whether the run can go on, and the commit the dead supervisor began
finished (checkfree.swarm.supervisor.phases.finishing_commit) or the attempt it left in flight aborted."""

from __future__ import annotations

from typing import Any

from checkfree.recovery.planner import RecoveryImpossible
from checkfree.swarm.supervisor.adoption import ResumeImpossible, Verdict, judge
from checkfree.swarm.supervisor.phases.base import Act, Context, Decision, Phase, act, command, kill, record
from checkfree.swarm.supervisor.state import Attempt


class Adopting(Phase):
    """Judge the answers (``waited_s``: how long they were waited for; ``unasked``: node → why it was not asked) and
    carry out the verdict."""

    name = "adopting"
    poll_s = None

    def __init__(self, waited_s: float, unasked: dict[int, str], t_resumed: float) -> None:
        self.waited_s, self.unasked, self.t_resumed = waited_s, unasked, t_resumed

    def enter(self, ctx: Context, now: float) -> Decision:
        state, roster = ctx.state, ctx.state.roster
        claims = dict(state.reports.resumed)
        intent = (
            state.intent if state.intent is not None and state.intent.iteration == state.iteration else None
        )
        verdict = judge(state, intent, claims, self.waited_s, self.unasked)
        state.attempt = verdict.attempt
        for slot in roster.all():  # local processes that are gone, and the starts the journal only reserved
            if not slot.dead and slot.occupant not in claims and slot.occupant not in verdict.replace:
                verdict.replace[slot.occupant] = "its process is gone"
        actions: list[Act] = []
        for node, why in sorted(verdict.replace.items()):  # the peers learn the new table once, at the end
            actions.append(act("processes", "kill", roster.by_node[node], f"resume: {why}", tell_peers=False))
        for node, claim in verdict.adopt.items():
            slot = roster.by_node[node]
            if slot is roster.storage:
                stored = claim.get("stored_versions", {})
                state.checkpoints.stored = {int(k): set(v) for k, v in stored.items()}
                continue
            slot.version_reported(version=claim["version"])
            if "stage0_copy" in claim and slot.stage in (1, state.cfg.n_stages):
                slot.version_reported(copy_version=claim["stage0_copy"])
        for node in verdict.recovered:
            claim, slot = claims[node], roster.by_node[node]
            if "record" not in claim:
                actions.append(kill(slot, "resume: it serves, but sent no recovery record"))
                continue
            meta = {
                "command": "serving",
                "stage": slot.stage,
                "version": claim["version"],
                "record": claim["record"],
            }
            actions.append(act("supervisor", "serving", slot, meta))
        return Decision(actions, Adopted(verdict, claims, intent, self.t_resumed))


class Adopted(Phase):
    """The verdict carried out: check that every lost stage can be rebuilt, then finish the commit (roll forward) or
    abort the attempt left in flight.

    Raises (from :meth:`enter`):
        ResumeImpossible: a stage has no live replica and nothing it can be rebuilt from.
    """

    name = "adopted"
    poll_s = None

    def __init__(
        self, verdict: Verdict, claims: dict[int, dict[str, Any]], intent: Any, t_resumed: float
    ) -> None:
        self.verdict, self.claims, self.intent, self.t_resumed = verdict, claims, intent, t_resumed

    def enter(self, ctx: Context, now: float) -> Decision:
        state, verdict = ctx.state, self.verdict
        check_resumable(ctx)
        iteration = state.iteration
        redone = [iteration] if verdict.in_flight and not verdict.roll_forward else []
        rolled = iteration if verdict.roll_forward else None
        resumed = ctx.phases.Resumed(verdict, self.claims, self.t_resumed, iteration, redone, rolled)
        if verdict.roll_forward:
            return Decision([], ctx.phases.FinishingCommit(self.intent, verdict, self.claims, then=resumed))
        actions: list[Act] = []
        for node, claim in verdict.adopt.items():
            if claim["attempt"] >= 0:
                actions.append(command(node, "abort", attempt=claim["attempt"]))
        if verdict.in_flight:
            actions.append(record("aborted", iteration))
        # the attempt begun last: the one in flight (aborted), else the last commit
        begun = iteration if verdict.in_flight else max(iteration - 1, 0)
        state.current = Attempt(state.attempt, begun, state.roster.members(), now, phase="over")
        return Decision(actions, resumed)


def check_resumable(ctx: Context) -> None:
    """Raise ResumeImpossible naming the first lost stage the setting cannot rebuild from what is alive (no stage is
    waited for by a down-interval schedule)."""
    state, roster = ctx.state, ctx.state.roster
    if not any(s.serving for s in roster.slots):
        raise ResumeImpossible(
            f"no node of the swarm in {ctx.run_dir} is alive: every stage has no live replica and no snapshot "
            f"to restore it from{snapshot_note(ctx)}; the run cannot be resumed."
        )
    lost = roster.lost_stages() - set(ctx.outages.stranded())
    for stage in sorted(lost):
        why = None
        try:
            plan = ctx.policy.plan(stage, lost, state.cfg.n_stages, holding=roster.holding_stages())
        except RecoveryImpossible as exc:
            why = str(exc).rstrip(".")
        else:
            if plan.rule == "storage":
                storage = roster.storage
                if storage is None or storage.dead or not state.checkpoints.has_complete():
                    why = state.checkpoints.missing_cause()
            elif not plan.sources:
                why = f"{state.setting} would rebuild it from a random init, with no live stage to rebuild it from"
        if why is not None:
            raise ResumeImpossible(
                f"stage {stage} has no live replica and no snapshot to restore it from{snapshot_note(ctx)} "
                f"({why}); the run in {ctx.run_dir} cannot be resumed."
            )


def snapshot_note(ctx: Context) -> str:
    """Names the newest snapshot a lost stage could be restored from, which --resume does not use yet."""
    newest = ctx.results.model.newest_snapshot
    if newest is None:
        return ""
    return f" (the snapshot {newest['path']} of iteration {newest['iteration']} is not restored by --resume)"
