"""Planning each loss event: how every slot without a serving node is rebuilt (docs/paper.md §2, §3, §8).

The supervisor plans each loss event once, for every slot without a serving node, and sends the plan in the
replacement's WELCOME. When a later loss event changes the plan of a stage whose replacement is already
recovering, or a replacement reports that every source of its plan is gone (CONTROL ``replan``), the stage is
planned again from the stages that serve now and the new plan (CONTROL ``plan``) goes to every replacement of the
stage still recovering: replicas of one stage are rebuilt by one plan, and a replacement never waits on a dead
source (checkfree.swarm.node.recovering). A lost stage 0 is planned from a copy holder (stage 1 or S) only once a
serving node of it reported holding its copy (``committed``); else that part takes the random-init fallback at
once. The rules themselves are the setting's policy (checkfree.swarm.policies), which asks the planner the
simulator uses (checkfree.recovery.planner).
"""

from __future__ import annotations

import logging

from checkfree.recovery.math import is_consecutive
from checkfree.recovery.planner import RecoveryImpossible, RecoveryPlan
from checkfree.swarm.policies import SwarmPolicy
from checkfree.swarm.supervisor.link import Link
from checkfree.swarm.supervisor.state import Slot, SupervisorState, SwarmError

log = logging.getLogger(__name__)


class LossPlanner:
    """Plans loss events and sends the plans that changed to the replacements that recover.

    Args:
        policy: the setting's recovery policy (checkfree.swarm.policies). state: the supervisor's state (the slots and their plans, the
            ``replan`` requests among its reports). link: the ``plan`` and ``grant`` commands.
    """

    def __init__(self, policy: SwarmPolicy, state: SupervisorState, link: Link) -> None:
        self.policy, self.state, self.link = policy, state, link
        self.roster = state.roster

    def plan(self, stage: int, lost: set[int]) -> RecoveryPlan:
        """The plan of a replacement of ``stage`` when ``lost`` have no serving replica (a lost stage 0 only
        from the copy holders that hold their copy).

        Raises:
            SwarmError: the setting cannot recover a lost stage (e.g. stage 0 under ``ours``).
        """
        try:
            n_stages = self.state.cfg.n_stages
            return self.policy.plan(stage, lost, n_stages, holding=self.roster.holding_stages())
        except RecoveryImpossible as exc:
            raise SwarmError(str(exc)) from None

    def assign(self, slot: Slot, plan: RecoveryPlan, force: bool = False) -> None:
        """Make ``plan`` the slot's plan; a replacement that joined and still recovers gets it (CONTROL
        ``plan``) when it changed, or with ``force`` (it asked for one)."""
        changed = slot.planned(plan)
        if (changed or force) and slot.address is not None and not slot.serving and not slot.dead:
            slot.plan_sent()
            members = {str(k): v for k, v in self.roster.members().items()}
            self.link.grant(slot)  # its sources may answer it under this plan
            self.link.command(slot.occupant, "plan", plan=plan.to_json(), members=members, seq=slot.plan_seq)
            log.info(
                "supervisor: node %d (stage %d) gets plan %d: %s from stages %s%s",
                slot.occupant,
                slot.stage,
                slot.plan_seq,
                plan.rule,
                list(plan.sources),
                f" ({plan.fallback})" if plan.fallback else "",
            )

    def plan_event(self, lost: set[int]) -> None:
        """Plan, once for this loss event (``lost``: the stages with no serving replica), how every slot
        without a serving node is rebuilt. Replacements execute these plans and never re-plan themselves; a
        recovering replacement whose plan this event changes is sent the new one, so replicas of one stage
        lost together are rebuilt alike, whatever order they join in.

        Raises:
            SwarmError: the setting cannot recover a lost stage (e.g. stage 0 under ``ours``).
        """
        for slot in self.roster.slots:
            if not slot.serving and not slot.away:
                slot.lost_in(consecutive=slot.stage in lost and is_consecutive(slot.stage, lost))
                self.assign(slot, self.plan(slot.stage, lost))

    def answer_replans(self) -> None:
        """A recovering replacement whose sources are all gone asked for a new plan: plan its stage again from
        the stages that serve now, for every replacement of that stage (the asker gets it in any case)."""
        asked, self.state.reports.replan = self.state.reports.replan, {}
        for node, meta in sorted(asked.items()):
            slot = self.roster.by_node.get(node)
            if (
                slot is None
                or slot.occupant != node
                or slot.serving
                or slot.dead
                or meta["seq"] < slot.plan_seq
            ):
                continue  # gone, serving, or a newer plan is on its way to it already
            log.warning("supervisor: node %d asks for a new plan: %s", node, meta["reason"][:200])
            slot.replan_answered()  # at most max_attempts answers (checkfree.swarm.supervisor.inbox)
            lost = self.roster.lost_stages()
            plan = self.plan(slot.stage, lost)
            for other in self.roster.slots:
                if other.stage == slot.stage and not other.serving:
                    other.lost_in(consecutive=other.stage in lost and is_consecutive(other.stage, lost))
                    self.assign(other, plan, force=other is slot)
