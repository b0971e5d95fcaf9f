"""The one table of recovery rules: each rule gives what the recovery math gives, and a rule not in the table is an
error, never a copy."""

import pytest
import torch

from checkfree.model import build_stages
from checkfree.recovery import rules
from checkfree.recovery.math import (
    average,
    checkfree_shares,
    checkfree_weight,
    random_init,
    stage0_part,
    weighted_average,
    zero_mlp_output,
)
from checkfree.recovery.planner import PLAN_RULES, RecoveryPlan

from helpers import VOCAB, tiny_config

CFG = tiny_config(grad_norm_mode="clipped", grad_clip=1.0)
STAGES = [s.state_dict() for s in build_stages(CFG, VOCAB, 0)]


def _inputs(sources, grad_norms=(), stage=2, iteration=5):
    return rules.RuleInputs(
        template=STAGES[stage],
        sources=sources,
        stage=stage,
        iteration=iteration,
        seed=3,
        cfg=CFG,
        grad_norms=grad_norms,
    )


def _equal(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("rule", ["copy", "replica", "storage"])
def test_copy_rules_give_a_detached_copy_of_the_one_source(rule):
    out = rules.rebuild(RecoveryPlan(rule, (1,)), _inputs([STAGES[1]]))
    assert _equal(out.state, STAGES[1]) and out.weights == [1.0] and out.omegas is None
    assert all(out.state[k].data_ptr() != STAGES[1][k].data_ptr() for k in out.state)


def test_zero_and_average_rules_are_the_math_of_fig2():
    zero = rules.rebuild(RecoveryPlan("zero", (1,)), _inputs([STAGES[1]]))
    assert _equal(zero.state, zero_mlp_output(STAGES[1], CFG.architecture)) and zero.weights == [1.0]
    avg = rules.rebuild(RecoveryPlan("average", (1, 3)), _inputs([STAGES[1], STAGES[3]]))
    assert _equal(avg.state, average(STAGES[1], STAGES[3])) and avg.weights == [0.5, 0.5]


def test_the_checkfree_rule_weights_the_neighbours_by_omega_of_their_gradient_norms():
    """Eq. 2 with ω = checkfree_weight(‖∇‖) of each source, in the config's grad_norm_mode."""
    out = rules.rebuild(
        RecoveryPlan("checkfree", (1, 3)), _inputs([STAGES[1], STAGES[3]], grad_norms=(0.5, 3.0))
    )
    omegas = [checkfree_weight(0.5, 1.0, "clipped"), checkfree_weight(3.0, 1.0, "clipped")]
    assert out.omegas == omegas and out.weights == list(checkfree_shares(*omegas))
    assert _equal(out.state, weighted_average(STAGES[1], STAGES[3], *omegas))
    with pytest.raises(ValueError, match="gradient norms of its 2 sources"):
        rules.rebuild(RecoveryPlan("checkfree", (1, 3)), _inputs([STAGES[1], STAGES[3]]))


def test_random_and_stage0_copy_rules_draw_the_seeded_init_of_the_loss_event():
    out = rules.rebuild(RecoveryPlan("random"), _inputs([], stage=2, iteration=5))
    assert _equal(out.state, random_init(STAGES[2], 3, 5, 2, CFG.init_std)) and out.weights is None
    head = {k: v for k, v in STAGES[0].items() if stage0_part(k) == "head"}
    plan = RecoveryPlan("stage0_copy", (4,), ("head",))
    got = rules.rebuild(plan, _inputs([head], stage=0, iteration=5)).state
    fresh = random_init(STAGES[0], 3, 5, 0, CFG.init_std)
    for k in STAGES[0]:  # E⁻¹ from stage S's copy, E (its holder lost) the seeded init of stage 0
        assert torch.equal(got[k], head[k] if k in head else fresh[k]), k


@pytest.mark.parametrize("rule", ["ec_decode", "rollback", "avg", ""])
def test_a_rule_not_in_the_table_is_an_error_never_a_copy(rule):
    with pytest.raises(rules.UnknownRule, match=f"recovery rule {rule!r} is not in the rule table"):
        rules.rebuild(RecoveryPlan(rule, (1,)), _inputs([STAGES[1]]))


def test_one_source_state_dict_per_planned_source():
    with pytest.raises(ValueError, match=r"names sources \[1, 3\]; got 1 source state dicts"):
        rules.rebuild(RecoveryPlan("average", (1, 3)), _inputs([STAGES[1]]))


def test_every_rule_a_plan_may_name_is_in_the_table_but_the_parity_decode():
    assert set(rules.RULES) == set(PLAN_RULES) - {"ec_decode"}
