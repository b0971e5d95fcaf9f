"""The audit of the paper's checkpointing row (checkfree/report/audit.py, docs/paper.md §7)."""

from __future__ import annotations

import pytest

from checkfree.report import audit
from checkfree.sim.progress import any_failure_probability, expected_wall_iterations


def test_the_probability_a_cost_needs_inverts_the_authors_rule():
    for cost in (1.5, 2.2, 2.5):
        q = audit.probability_for_cost(cost)
        assert expected_wall_iterations(q, 100, 10_000, "authors") / 10_000 == pytest.approx(cost, rel=1e-6)
    q5 = any_failure_probability(audit.PAPER_P[5], 6)
    assert round(audit.probability_for_cost(2.2), 4) == 0.0181 and round(q5, 4) == 0.0054  # 3.4× the stated
    with pytest.raises(ValueError, match="must exceed 1"):
        audit.probability_for_cost(1.0)


@pytest.mark.timeout(120)
def test_the_audit_table_and_its_refusals(capsys, monkeypatch):
    monkeypatch.setattr(audit, "PAPER_P", {5: audit.PAPER_P[5]})  # one rate, two runs: seconds
    assert audit.main(["--runs", "2"]) == 0
    out = capsys.readouterr().out
    assert "| 5 | 0.0009 | 0.0054 | 1.30 | " in out and "| 558.23 | 2.20 | 0.0181 | 3.4 |" in out
    with pytest.raises(SystemExit) as e:
        audit.main(["--runs", "1"])
    assert e.value.code == 2 and "--runs is 1; expected at least 2" in capsys.readouterr().err
