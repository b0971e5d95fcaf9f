"""benchmarks/bench_heterogeneity.py's verdicts (issue 39 point 4): every slow node named fail-slow, and the node
that turns slow at iteration k has its share cut in one of the plans of k, k+1, k+2 (not later)."""

from __future__ import annotations

import importlib.util

from helpers import ROOT


def _bench():
    spec = importlib.util.spec_from_file_location(
        "bench_heterogeneity", ROOT / "benchmarks" / "bench_heterogeneity.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _throughput(shares_of_8: list[int], named: list[int]) -> dict:
    rows = [
        {
            "iteration": i,
            "wall_s": 2.0,
            "routing_plan": {
                "shares": {"2": {"6": 4, "7": 12 - 4 - s, "8": s}},
                "bound_s": 1.0,
                "plan_s": 1.1,
                "fixed_s": 2.0,
            },
        }
        for i, s in enumerate(shares_of_8)
    ]
    return {"iterations": rows, "fail_slow": [{"node": n} for n in named]}


def test_the_verdicts_say_met_and_missed() -> None:
    bench = _bench()
    assert bench.slow_nodes(4, 3) == [1, 4, 7, 10, 13]
    lines = bench.report(_throughput([4, 4, 4, 4, 4, 4, 2, 1, 1, 1], [7, 8]), [7], 8, 5)
    assert lines[-2].endswith(": met") and lines[-1].endswith(": met")
    assert "mean 2.000 s over iterations 2.." in lines[0] and "(fixed / bound 2.00)" in lines[2]
    # cut only at k + 3: too late
    lines = bench.report(_throughput([4, 4, 4, 4, 4, 4, 4, 4, 2, 1], [8]), [7], 8, 5)
    assert lines[-2].endswith(": missed") and lines[-1].endswith(": missed")
    # cut at k itself
    lines = bench.report(_throughput([4, 4, 4, 4, 4, 3, 3, 3, 3, 3], [7]), [7], 8, 5)
    assert lines[-1].endswith(": met")
