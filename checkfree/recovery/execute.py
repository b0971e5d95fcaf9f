"""The simulator's side of a recovery plan: read the plan's sources from the live local stages of a
:class:`~checkfree.training_state.TrainingState`, rebuild the stage through the one rule table
(:func:`checkfree.recovery.rules.rebuild`, which a swarm node calls with fetched weights), load it, and give it the
optimizer the plan says (a fresh Adam at lr × lr_scale for every rule that rebuilds from neighbours).
"""

from __future__ import annotations

from checkfree.config import Config
from checkfree.recovery import rules
from checkfree.recovery.math import stage0_part
from checkfree.recovery.planner import RecoveryPlan
from checkfree.recovery.record import RecoveryRecord
from checkfree.training_state import StateDict, TrainingState


def rebuild_local(
    state: TrainingState,
    stage: int,
    plan: RecoveryPlan,
    cfg: Config,
    seed: int,
    stage0_copy: StateDict | None = None,
) -> rules.Rebuilt:
    """The new weights of ``stage`` by ``plan``, its sources read from ``state``'s live stages (their last
    gradient norms for ω), the event's iteration ``state.iteration`` and the run seed ``seed`` (random inits).

    ``stage0_copy``: CheckFree+'s copies of E and E⁻¹ (stage 0's state dict, paper §4.2), which the
    ``stage0_copy`` rule reads instead of the holders' stages: each holder gives the part it holds.

    Raises:
        ValueError: a ``stage0_copy`` plan without ``stage0_copy``; what :func:`checkfree.recovery.rules.rebuild`
            raises (an unknown rule is :class:`~checkfree.recovery.rules.UnknownRule`).
    """
    if plan.rule == "stage0_copy":
        if stage0_copy is None:
            raise ValueError("the stage0_copy rule needs CheckFree+'s stage-0 copies, and none are kept.")
        sources = [{k: v for k, v in stage0_copy.items() if stage0_part(k) == part} for part in plan.parts]
        norms: list[float] = []
    else:
        sources = [state.stages[s].state_dict() for s in plan.sources]
        norms = [state.grad_norms[s] for s in plan.sources]
    inputs = rules.RuleInputs(
        template=state.stages[stage].state_dict(),
        sources=sources,
        stage=stage,
        iteration=state.iteration,
        seed=seed,
        cfg=cfg,
        grad_norms=norms,
    )
    return rules.rebuild(plan, inputs)


def execute_local(
    state: TrainingState,
    stage: int,
    plan: RecoveryPlan,
    cfg: Config,
    seed: int,
    strategy: str,
    stage0_copy: StateDict | None = None,
) -> RecoveryRecord:
    """Rebuild ``stage`` by ``plan`` (:func:`rebuild_local`), load it with a fresh Adam at lr × lr_scale, and
    return its record (rule, source stages, weights, ω, fallback, rung of the plan; ``strategy`` names who ran it).

    Raises:
        ValueError: a plan that keeps the source's Adam state (``with_optimizer``: an exact copy, restored with
            its optimizer by :func:`checkfree.recovery.stage_copy.restore_copy`); what :func:`rebuild_local`
            raises.
    """
    if plan.with_optimizer:
        raise ValueError(
            f"plan {plan.rule!r} of stage {stage} keeps its source's Adam state; restore the copy."
        )
    rebuilt = rebuild_local(state, stage, plan, cfg, seed, stage0_copy)
    state.load_stage(stage, rebuilt.state)
    state.fresh_optimizer(stage, cfg.lr_scale)
    return RecoveryRecord(
        stage,
        plan.rule,
        strategy,
        source_stages=list(plan.sources),
        parts=list(plan.parts) or None,
        weights=rebuilt.weights,
        omegas=rebuilt.omegas,
        grad_norm_mode=cfg.grad_norm_mode if rebuilt.omegas is not None else None,
        rung=plan.rung,
        fallback=plan.fallback,
    )
