"""Unit tests of checkfree.failures.rates: the %/h mapping, the injector, schedules and the swarm generator."""

from __future__ import annotations

import json
import math
import random

import pytest

from checkfree.failures.injection import StageFailureInjector, StageFailureSource, StageSchedule
from checkfree.failures.rates import (
    SWARM_FAILURE_PROBABILITIES,
    hourly_rate,
    per_iteration_probability,
    rate_key,
    resolve_failure_probability,
)
from checkfree.failures.schedules import (
    format_node_schedule,
    generate_node_schedule,
    load_node_schedule,
    load_stage_schedule,
    node_to_stage_failures,
    save_stage_schedule,
)

# ---------------------------------------------------------------- %/h ↔ per-iteration probability (docs/paper.md §1)


def test_formula_matches_hand_computation():
    # h = 16 %/h, T = 91.32 s: T/3600 = 0.0253667; ln(0.84) = -0.1743534; product = -0.0044228;
    # p = 1 - exp(-0.0044228) = 0.0044130.
    assert per_iteration_probability(16, 91.32) == pytest.approx(0.0044130, abs=1e-7)
    # h = 50 %/h, T = 1800 s: p = 1 - 0.5 ** 0.5 = 1 - 0.7071068 = 0.2928932.
    assert per_iteration_probability(50, 1800) == pytest.approx(0.2928932, abs=1e-7)
    # One iteration per hour: p equals the hourly rate.
    assert per_iteration_probability(10, 3600) == pytest.approx(0.10)
    assert per_iteration_probability(0, 91.32) == 0.0


@pytest.mark.parametrize("h", [0.0, 5, 10, 16, 33, 99.5])
@pytest.mark.parametrize("t", [1.0, 91.32, 151.04, 7200.0])
def test_hourly_rate_inverts_formula(h, t):
    assert hourly_rate(per_iteration_probability(h, t), t) == pytest.approx(h, abs=1e-9)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: per_iteration_probability(100, 91.32), r"failure rate 100 %/h .*\[0, 100\)"),
        (lambda: per_iteration_probability(-1, 91.32), r"failure rate -1 %/h"),
        (lambda: per_iteration_probability(16, 0), r"iteration time 0 s .*positive"),
        (lambda: per_iteration_probability(16, -3.0), r"iteration time -3.0 s"),
        (lambda: hourly_rate(1.0, 91.32), r"probability 1.0 .*\[0, 1\)"),
        (lambda: hourly_rate(0.01, 0), r"iteration time 0 s"),
    ],
)
def test_formula_rejects_bad_input_with_one_sentence(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_rate_key_matches_authors_config_keys():
    assert rate_key(16) == "16"
    assert rate_key(16.0) == "16"
    assert rate_key(2.5) == "2.5"


def test_resolve_prefers_override_then_config_then_formula():
    config = {"lr": 3e-4, "5": 0.0009, "10": 0.002, "16": 0.004, "33": 0.01}
    assert resolve_failure_probability(config, 16, 91.32, override=0.05) == (0.05, "override")
    assert resolve_failure_probability(config, 16.0) == (0.004, 'config["16"]')
    assert resolve_failure_probability({"2.5": 0.0003}, 2.5) == (0.0003, 'config["2.5"]')
    p, source = resolve_failure_probability(config, 20, iteration_seconds=91.32)
    assert source == "formula" and p == pytest.approx(per_iteration_probability(20, 91.32))


def test_resolve_without_key_or_time_names_the_problem():
    with pytest.raises(ValueError, match=r'20 %/h has no config key "20" and no iteration time'):
        resolve_failure_probability({"16": 0.004}, 20)
    with pytest.raises(ValueError, match=r'config\["16"\].* 1.5 is invalid'):
        resolve_failure_probability({"16": 1.5}, 16)


# ---------------------------------------------------------------- the seeded injector (docs/paper.md §1)


def test_injector_is_identical_across_instances_and_call_order():
    a = StageFailureInjector(6, 0.2, seed=7)
    b = StageFailureInjector(6, 0.2, seed=7)
    forward = [a.draw(it) for it in range(200)]
    backward = [b.draw(it) for it in reversed(range(200))][::-1]  # a rolled-back / resumed run
    assert forward == backward
    assert any(forward)  # not trivially empty


def test_injector_differs_between_seeds_and_ignores_global_rng():
    draws = [StageFailureInjector(6, 0.2, seed=s).draw(it) for s in (1, 2) for it in range(100)]
    assert draws[:100] != draws[100:]
    injector = StageFailureInjector(6, 0.2, seed=3)
    random.seed(0)
    first = [injector.draw(it) for it in range(50)]
    random.seed(12345)
    assert [injector.draw(it) for it in range(50)] == first


def test_injector_failure_rate_matches_probability():
    p, stages, iterations = 0.05, 6, 4000
    injector = StageFailureInjector(stages, p, seed=11)
    count = sum(len(injector.draw(it)) for it in range(iterations))
    n = stages * iterations
    sigma = math.sqrt(n * p * (1 - p))  # binomial standard deviation ≈ 33.8
    assert abs(count - n * p) < 5 * sigma


def test_injector_output_is_sorted_and_in_range():
    injector = StageFailureInjector(4, 0.5, seed=5, include_stage0=True)
    for it in range(100):
        failed = injector.draw(it)
        assert failed == sorted(set(failed)) and all(0 <= s <= 4 for s in failed)
    assert all(0 not in StageFailureInjector(4, 0.5, seed=5).draw(it) for it in range(100))


def test_stage0_fails_independently_of_stage1():
    """With --fail-stage0, stages 0 and 1 fail in the same iteration at about p², not p (separate streams)."""
    p, n = 0.2, 20_000
    injector = StageFailureInjector(4, p, seed=11, include_stage0=True)
    draws = [injector.draw(it) for it in range(n)]
    zero = sum(0 in d for d in draws) / n
    one = sum(1 in d for d in draws) / n
    both = sum(0 in d and 1 in d for d in draws) / n
    assert abs(zero - p) < 0.015 and abs(one - p) < 0.015
    assert abs(both - p * p) < 0.01  # p² = 0.04; a shared draw would give p = 0.2


def test_include_stage0_does_not_change_transformer_draws():
    without = StageFailureInjector(6, 0.3, seed=9)
    with_0 = StageFailureInjector(6, 0.3, seed=9, include_stage0=True)
    saw_stage0 = False
    for it in range(300):
        a, b = without.draw(it), with_0.draw(it)
        saw_stage0 |= 0 in b
        assert [s for s in b if s != 0] == a
    assert saw_stage0


def test_injector_extremes_and_validation():
    assert all(StageFailureInjector(3, 0.0, seed=1).draw(it) == [] for it in range(50))
    assert StageFailureInjector(3, 0.999, seed=1).draw(0) == [1, 2, 3]
    with pytest.raises(
        ValueError, match=r"failure probability 1.0 is invalid: expected a number in \[0, 1\)"
    ):
        StageFailureInjector(3, 1.0, seed=1)  # the one range of a probability, as in a config file
    with pytest.raises(ValueError, match=r"iteration -1 is invalid"):
        StageFailureInjector(3, 0.1, seed=1).draw(-1)
    with pytest.raises(ValueError, match=r"failure probability 1.5"):
        StageFailureInjector(3, 1.5, seed=1)
    with pytest.raises(ValueError, match=r"seed -2"):
        StageFailureInjector(3, 0.1, seed=-2)


# ---------------------------------------------------------------- stage schedules (--failure-schedule)


def _write(tmp_path, data, name="schedule.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_stage_schedule_round_trip_and_protocol(tmp_path):
    path = tmp_path / "s.json"
    save_stage_schedule(path, [(30, 1), (12, 2), (12, 0)])
    schedule = load_stage_schedule(path, n_stages=4)
    assert schedule.all() == [(12, 0), (12, 2), (30, 1)]
    assert schedule.failures_at(12) == [0, 2] and schedule.draw(30) == [1] and schedule.failures_at(13) == []
    assert isinstance(schedule, StageFailureSource)
    assert isinstance(StageFailureInjector(2, 0.1, seed=0), StageFailureSource)


def test_node_format_becomes_stage_failures_only_when_all_replicas_crash(tmp_path):
    # stage 1 = nodes 3..5 all crash at 39; stage 2 = nodes 6..8, only two crash at 50 (partial failure).
    nodes = {str(n): [501] for n in range(21)}
    for n in (3, 4, 5):
        nodes[str(n)] = [39, 501]
    nodes["6"] = nodes["7"] = [50, 501]
    schedule = load_stage_schedule(_write(tmp_path, nodes), n_stages=6, replicas=3)
    assert schedule.all() == [(39, 1)]


def test_a_node_schedule_naming_a_node_outside_the_topology_is_refused(tmp_path):
    # 4 transformer stages + stage 0, 2 replicas each: nodes 0..9. Node 999 would be "stage 499".
    path = _write(tmp_path, {"2": [3, 10], "999": [5, 10]})
    with pytest.raises(ValueError, match=r"names node 999, but .* are nodes 0\.\.9: expected node ids"):
        load_stage_schedule(path, n_stages=4, replicas=2)
    assert load_stage_schedule(_write(tmp_path, {"9": [5, 10]}), n_stages=4, replicas=2).all() == []


def test_shipped_33_schedule_as_stage_failures():
    nodes = {int(k): v[:-1] for k, v in generate_node_schedule(33).items()}
    assert node_to_stage_failures(nodes, replicas=3) == [
        (39, 1),
        (128, 1),
        (148, 6),
        (176, 4),
        (395, 1),
        (481, 4),
        (482, 2),
    ]


@pytest.mark.parametrize(
    ("content", "kwargs", "match"),
    [
        ("{not json", {}, r"is not valid JSON"),
        ([1, 2], {"replicas": 3}, r"holds a list: expected an object"),
        ({"format": "v0", "failures": []}, {}, r"format 'v0': expected 'checkfree-stage-failures-v1'"),
        ({"format": "checkfree-stage-failures-v1", "failures": 3}, {}, r'"failures" = 3: expected a list'),
        (
            {"format": "checkfree-stage-failures-v1", "failures": [{"iteration": "1", "stage": 1}]},
            {},
            r"entry .*expected \{\"iteration\": int",
        ),
        (
            {"format": "checkfree-stage-failures-v1", "failures": [{"iteration": 1, "stage": 7}]},
            {},
            r"stage 7 at iteration 1: expected a stage in 0..6",
        ),
        (
            {"format": "checkfree-stage-failures-v1", "failures": [{"iteration": -4, "stage": 1}]},
            {},
            r"iteration -4: expected ≥ 0",
        ),
        (
            {"format": "checkfree-stage-failures-v1", "failures": [{"iteration": 4, "stage": 1}] * 2},
            {},
            r"stage 1 at iteration 4 twice",
        ),
        ({"0": [501]}, {}, r"node format, which needs replicas \(got None\)"),
        ({"x": [501]}, {"replicas": 3}, r"node id 'x'"),
        ({"3": []}, {"replicas": 3}, r"node 3: \[\] is invalid"),
        ({"3": [40, 39, 501]}, {"replicas": 3}, r"node 3: iterations \[40, 39\] are not strictly ascending"),
        ({"3": [39, 39, 501]}, {"replicas": 3}, r"not strictly ascending"),
        ({"3": [39, 20]}, {"replicas": 3}, r"sentinel 20 is below crash iteration 39"),
        (
            {str(n): [5, 501] for n in (21, 22, 23)},
            {"replicas": 3},
            r"names node 21, but 6 transformer stages \+ stage 0 × 3 replicas are nodes 0\.\.20",
        ),
    ],
)
def test_malformed_schedules_raise_one_sentence_naming_file(tmp_path, content, kwargs, match):
    path = _write(tmp_path, content)
    with pytest.raises(ValueError, match=match) as info:
        load_stage_schedule(path, n_stages=6, **kwargs)
    assert "schedule.json" in str(info.value) and "\n" not in str(info.value)


def test_missing_schedule_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope.json' does not exist"):
        load_stage_schedule(tmp_path / "nope.json", n_stages=6)
    with pytest.raises(FileNotFoundError):
        load_node_schedule(tmp_path / "nope.json")


# ---------------------------------------------------------------- swarm node schedules (docs/paper.md §8)

_QUIET = "[501]"
# The authors' shipped failure_p_configs/*.json, written out literally (7 stages × 3 replicas = 21 nodes).
SHIPPED = {
    10: {12: [395], 13: [395], 14: [395]},
    16: {9: [395], 10: [395], 11: [395]},
    33: {
        3: [39, 128, 395],
        4: [39, 128, 395],
        5: [39, 128, 395],
        6: [482],
        7: [482],
        8: [482],
        12: [176, 481],
        13: [176, 481],
        14: [176, 481],
        18: [148],
        19: [148],
        20: [148],
    },
}


def _shipped_text(rate: int) -> str:
    lists = ", ".join(
        f'"{n}": {json.dumps(SHIPPED[rate][n] + [501])}' if n in SHIPPED[rate] else f'"{n}": {_QUIET}'
        for n in range(21)
    )
    return "{" + lists + "}"


def test_shipped_text_helper_is_the_authors_layout():
    assert _shipped_text(10).startswith('{"0": [501], "1": [501], ') and '"12": [395, 501]' in _shipped_text(
        10
    )


@pytest.mark.parametrize("rate", [10, 16, 33, 16.0])
def test_defaults_reproduce_the_authors_files_byte_for_byte(rate):
    assert format_node_schedule(generate_node_schedule(rate)) == _shipped_text(int(rate))


def test_rate_5_uses_the_table_and_is_deterministic():
    assert SWARM_FAILURE_PROBABILITIES["5"] == 0.0009
    first = generate_node_schedule(5)
    assert first == generate_node_schedule(5)
    assert list(first) == [str(n) for n in range(21)] and all(v[-1] == 501 for v in first.values())
    # With p = 0.0009 over 495 drawable iterations, seed 33 draws no failure at all.
    assert all(v == [501] for v in first.values())


def test_other_topology_seeds_and_replicas_move_together():
    schedule = generate_node_schedule(16, n_stages=4, replicas=2, iterations=300, seed=1, probability=0.05)
    assert list(schedule) == [str(n) for n in range(10)]
    assert all(v[-1] == 301 for v in schedule.values())
    assert schedule["0"] == schedule["1"] == [301]  # stage 0 never fails
    for stage in range(1, 5):
        assert schedule[str(2 * stage)] == schedule[str(2 * stage + 1)]  # every replica of the stage
    crashed = sum(len(v) - 1 for v in schedule.values()) // 2
    assert 5 <= crashed <= 25  # ≈ 0.05 × 297 = 14.9 expected stage failures
    assert schedule != generate_node_schedule(
        16, n_stages=4, replicas=2, iterations=300, seed=2, probability=0.05
    )
    assert schedule != generate_node_schedule(
        16, n_stages=4, replicas=2, iterations=300, seed=1, stage_seed=7, probability=0.05
    )


def test_checkpoint_iterations_never_fail():
    schedule = generate_node_schedule(16, probability=0.9, iterations=500)
    crashes = {it for v in schedule.values() for it in v[:-1]}
    assert crashes and not any(it % 100 == 1 for it in crashes)
    every = generate_node_schedule(16, probability=0.9, checkpoint_every=None)
    assert any(it % 100 == 1 for v in every.values() for it in v[:-1])


def test_generated_file_loads_back(tmp_path):
    path = _write(tmp_path, format_node_schedule(generate_node_schedule(33)), "33.json")
    nodes = load_node_schedule(path)
    assert nodes[3] == [39, 128, 395] and nodes[0] == []
    assert load_stage_schedule(path, n_stages=6, replicas=3).failures_at(395) == [1]


def test_generator_rejects_bad_topology():
    with pytest.raises(ValueError, match=r"n_stages 0 is invalid"):
        generate_node_schedule(16, n_stages=0)
    with pytest.raises(ValueError, match=r"checkpoint_every 1 is invalid"):
        generate_node_schedule(16, checkpoint_every=1)


def test_stage_schedule_is_usable_directly():
    assert StageSchedule([(3, 2), (3, 1)], n_stages=2).draw(3) == [1, 2]
