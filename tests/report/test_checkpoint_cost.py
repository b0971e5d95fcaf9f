"""The expected cost of checkpointing (checkfree/sim/progress.py) against a Monte Carlo of the rules themselves,
as the report replays them (checkfree/report/replay.py, which matches real simulator runs exactly:
tests/report/test_replay.py): the simulator's ``effective`` rule and the authors' ``authors`` rule, at Table 2's
compressed scale (6 stages, K = 3 standing for the paper's 100, 300 iterations) and at the paper's own (K = 100,
10,000 iterations). configs/README.md quotes these numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkfree.failures.injection import StageFailureInjector
from checkfree.report.replay import replay_checkpoint
from checkfree.sim.progress import any_failure_probability, expected_wall_iterations

TINY_6X2 = {5: 0.02957, 10: 0.06456, 16: 0.12506}
"""configs/tiny_6x2_config.json's per-iteration failure probability of a stage, by %/h."""
PAPER_500M = {5: 0.0009, 10: 0.002, 16: 0.004}
"""The 500M config's (the paper's Table 2 model), by %/h."""


def _monte_carlo(p: float, every: int, n: int, rule: str, paper_every: int, seeds: range) -> float:
    """Mean wall-clock iterations per trained iteration over ``seeds`` replays of ``n`` iterations."""
    flat = {0: 1.0, n: 1.0}  # validations only at 0 and n: the replay then runs to n and stops
    walls = 0
    for seed in seeds:
        src = StageFailureInjector(6, p, seed)
        rep = replay_checkpoint(flat, src, every, n, None, 100 * n, n, rule, paper_every, seed)
        assert rep.effective_iterations == n
        walls += rep.wall_iterations
    return walls / (len(seeds) * n)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rate", [5, 10, 16])
@pytest.mark.parametrize("rule", ["effective", "authors"])
def test_expected_cost_matches_a_monte_carlo_at_table_2_scale(rate, rule):
    p = TINY_6X2[rate]
    expected = expected_wall_iterations(any_failure_probability(p, 6), 3, 300, rule, 100) / 300
    assert _monte_carlo(p, 3, 300, rule, 100, range(60)) == pytest.approx(expected, rel=0.03)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rate", [5, 16])
def test_expected_cost_of_the_authors_rule_matches_a_monte_carlo_at_the_papers_scale(rate):
    p = PAPER_500M[rate]
    expected = expected_wall_iterations(any_failure_probability(p, 6), 100, 10_000, "authors") / 10_000
    assert _monte_carlo(p, 100, 10_000, "authors", 100, range(8)) == pytest.approx(expected, rel=0.03)


def test_the_numbers_configs_readme_quotes():
    def cost(p, every, n, rule, paper_every=0):
        return expected_wall_iterations(any_failure_probability(p, 6), every, n, rule, paper_every) / n

    assert [round(cost(TINY_6X2[r], 3, 300, "effective"), 2) for r in (5, 10, 16)] == [1.21, 1.57, 2.73]
    assert [round(cost(TINY_6X2[r], 3, 300, "authors", 100), 2) for r in (5, 10, 16)] == [1.30, 1.73, 2.68]
    assert [round(cost(PAPER_500M[r], 100, 10_000, "authors"), 2) for r in (5, 10, 16)] == [1.30, 1.73, 2.68]
    readme = " ".join((Path(__file__).parents[2] / "configs" / "README.md").read_text().split())
    assert (
        "is 1.21, 1.57 and 2.73 at 5, 10 and 16 %/h" in readme and "and 1.30, 1.73 and 2.68 under" in readme
    )
    assert expected_wall_iterations(0.0, 3, 300, "authors", 100) == 300
    with pytest.raises(ValueError, match="'weekly' is unknown"):
        expected_wall_iterations(0.1, 3, 300, "weekly")
