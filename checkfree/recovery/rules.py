"""The one table of recovery rules: a plan's rule name → the pure function that rebuilds the lost stage's weights
from the weights of its sources (paper §4.1, Eq. 2; §4.2; the ablations of Fig. 2).

The planner (checkfree/recovery/planner.py) decides each lost stage's rule and source stages; whoever executes the
plan gathers one state dict per source stage, in the plan's order, and calls :func:`rebuild`. The simulator passes
its live local stages (checkfree/recovery/execute.py), a swarm node the weights its peers sent
(checkfree/swarm/node/recovering.py); both get the same weights for the same inputs. A rule that is not in
:data:`RULES` raises :class:`UnknownRule`: nothing is ever copied by default.

| rule | sources (in plan order) | new weights |
|---|---|---|
| ``replica`` | the stage itself (a live replica) or, in the ladder, its Bamboo copy's holder | a copy |
| ``storage`` | the stage itself, from the storage node's checkpoint (swarm) | a copy |
| ``copy`` | one stage | a copy |
| ``zero`` | one stage | a copy with every block's MLP output projection zeroed |
| ``average`` | left, right | 0.5 · left + 0.5 · right |
| ``checkfree`` | left, right (and their last gradient norms) | the ω-weighted average of Eq. 2 |
| ``random`` | none | N(0, init_std) from the seed of (seed, iteration, stage) |
| ``stage0_copy`` | the holders of the parts in ``plan.parts`` (stage 1: E, stage S: E⁻¹), each with its part | stage 0 from the copies; a part without a holder: seeded random init |

Not in the table: ``ec_decode`` (the REFT snapshot decoded from a parity block, weights and Adam state together;
checkfree/recovery/ec_snapshot.py), which reads a parity block, not source weights; and the checkpoint
baselines' ``rollback`` / ``restore_one``, which restore a checkpoint and have no plan.

Adam state is the caller's: with ``plan.with_optimizer`` (replica, storage) load the source's moments, step and
lr; otherwise (``plan.fresh_lr_scale``) a fresh Adam at lr × lr_scale.

How a swarm node calls it with the weights it fetched (``answers``: one WEIGHTS_RESPONSE per ``plan.sources``)::

    rebuilt = rules.rebuild(
        plan,
        rules.RuleInputs(
            template=module.state_dict(),                     # the lost stage: keys, shapes, dtypes
            sources=[W.split(m.tensors, "w") for m in answers],
            grad_norms=[float(m.meta["grad_norm"]) for m in answers] if plan.rule == "checkfree" else (),
            stage=stage, iteration=iteration_of_the_loss, seed=cfg.init_seed, cfg=cfg.model,
        ),
    )
    module.load_state_dict(rebuilt.state)
    # rebuilt.weights and rebuilt.omegas go into the recovery record (checkfree/recovery/record.py)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from checkfree.config import Config
from checkfree.recovery.math import (
    average,
    checkfree_shares,
    checkfree_weight,
    copy_state,
    random_init,
    stage0_from_copies,
    weighted_average,
    zero_mlp_output,
)
from checkfree.recovery.planner import RecoveryPlan
from checkfree.training_state import StateDict


class UnknownRule(ValueError):
    """A plan names a rule that is not in :data:`RULES` (the message names it and the rules there are)."""


@dataclass(frozen=True)
class RuleInputs:
    """What a rule may read.

    Attributes:
        template: the lost stage's state dict: its keys, shapes and dtypes (its values are never read; in the
            simulator they are NaN).
        sources: one state dict per ``plan.sources``, in the plan's order (for ``stage0_copy``: the entries of the
            part that source holds).
        grad_norms: the last gradient norm of each source, in the same order (read by ``checkfree`` only: ω).
        stage: the stage rebuilt (0..S).
        iteration: the iteration of the loss event (seeds ``random``, as in the simulator and the swarm alike).
        seed: the run's model seed (seeds ``random``).
        cfg: the model config: ``architecture`` (``zero``), ``init_std`` (``random``), ``grad_clip`` and
            ``grad_norm_mode`` (ω of ``checkfree``).
    """

    template: Mapping[str, torch.Tensor]
    sources: Sequence[Mapping[str, torch.Tensor]]
    stage: int
    iteration: int
    seed: int
    cfg: Config
    grad_norms: Sequence[float] = ()


@dataclass(frozen=True)
class Rebuilt:
    """What a rule produced.

    Attributes:
        state: the new state dict of the stage (fresh tensors, same keys, shapes and dtypes as the template).
        weights: the coefficient applied to each source ([1.0] for a copy, [0.5, 0.5] for ``average``, the shares
            ω_{i−1}/(ω_{i−1}+ω_{i+1}), ω_{i+1}/(ω_{i−1}+ω_{i+1}) of Eq. 2 for ``checkfree``); None: no source
            weights it (``random``, ``stage0_copy``).
        omegas: ω of each source (``checkfree`` only, :func:`~checkfree.recovery.math.checkfree_weight`); else None.
    """

    state: StateDict
    weights: list[float] | None = None
    omegas: list[float] | None = None


Rule = Callable[[RecoveryPlan, RuleInputs], Rebuilt]


def _copy(plan: RecoveryPlan, x: RuleInputs) -> Rebuilt:
    return Rebuilt(copy_state(x.sources[0]), [1.0])


def _zero(plan: RecoveryPlan, x: RuleInputs) -> Rebuilt:
    return Rebuilt(zero_mlp_output(x.sources[0], x.cfg.architecture), [1.0])


def _average(plan: RecoveryPlan, x: RuleInputs) -> Rebuilt:
    return Rebuilt(average(x.sources[0], x.sources[1]), [0.5, 0.5])


def _checkfree(plan: RecoveryPlan, x: RuleInputs) -> Rebuilt:
    if len(x.grad_norms) != 2:
        raise ValueError(
            f"the checkfree rule needs the gradient norms of its 2 sources; got {list(x.grad_norms)}."
        )
    mode, clip = x.cfg.grad_norm_mode, x.cfg.grad_clip
    w_left, w_right = (checkfree_weight(float(n), clip, mode) for n in x.grad_norms)
    new = weighted_average(x.sources[0], x.sources[1], w_left, w_right)
    return Rebuilt(new, list(checkfree_shares(w_left, w_right)), [w_left, w_right])


def _random(plan: RecoveryPlan, x: RuleInputs) -> Rebuilt:
    return Rebuilt(random_init(x.template, x.seed, x.iteration, x.stage, x.cfg.init_std))


def _stage0_copy(plan: RecoveryPlan, x: RuleInputs) -> Rebuilt:
    copies = {k: v for source in x.sources for k, v in source.items()}
    return Rebuilt(stage0_from_copies(x.template, copies, plan.parts, x.seed, x.iteration, x.cfg.init_std))


RULES: dict[str, Rule] = {
    "replica": _copy,
    "storage": _copy,
    "copy": _copy,
    "zero": _zero,
    "average": _average,
    "checkfree": _checkfree,
    "random": _random,
    "stage0_copy": _stage0_copy,
}
"""Rule name → the function that rebuilds a stage's weights by it (the table in the module docstring)."""


def rebuild(plan: RecoveryPlan, inputs: RuleInputs) -> Rebuilt:
    """The new weights of the stage ``plan`` rebuilds, by ``plan.rule`` from ``inputs``.

    Raises:
        UnknownRule: ``plan.rule`` is not in :data:`RULES`.
        ValueError: not one source state dict per ``plan.sources`` (or per ``plan.parts`` for ``stage0_copy``),
            the ``checkfree`` rule without 2 gradient norms, or sources whose keys or shapes differ
            (:func:`~checkfree.recovery.math.weighted_average`).
    """
    rule = RULES.get(plan.rule)
    if rule is None:
        raise UnknownRule(
            f"recovery rule {plan.rule!r} is not in the rule table; expected one of {', '.join(sorted(RULES))}."
        )
    if len(inputs.sources) != len(plan.sources):
        raise ValueError(
            f"rule {plan.rule!r} of stage {inputs.stage} names sources {list(plan.sources)}; "
            f"got {len(inputs.sources)} source state dicts."
        )
    if plan.rule == "stage0_copy" and len(plan.parts) != len(plan.sources):
        raise ValueError(
            f"a stage0_copy plan needs one part per source; got {plan.parts} for {plan.sources}."
        )
    return rule(plan, inputs)
