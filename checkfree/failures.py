"""Stage failures: hourly rate → per-iteration probability, seeded injectors and failure schedules.

A *stage failure* is the loss of every replica of one stage at once (SPEC §1). This module is the one place
where the failure rate in %/h is mapped to a per-iteration probability, where the simulator's injector
draws failures, and where the JSON schedules of ``failure_p_configs/`` (the authors' swarm node format,
SPEC §8) and our stage-schedule format are read, validated, generated and written.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

log = logging.getLogger(__name__)

STAGE_SCHEDULE_FORMAT = "checkfree-stage-failures-v1"
# Paper's measured iteration time of the 500M model (s), SPEC §5; used when a rate is not in a table.
PAPER_ITERATION_SECONDS = 91.32
# Per-iteration failure probabilities of the authors' throughput schedules, keyed like their configs
# (SPEC §1 and §8). The authors' generator has no entry for 5 %/h; 0.0009 is the 500M config's value.
SWARM_FAILURE_PROBABILITIES: dict[str, float] = {"5": 0.0009, "10": 0.002, "16": 0.004, "33": 0.01}

# Stream tags of the injector: transformer stages and stage 0 draw from separate streams (never 0, so a
# tag cannot collide with SeedSequence's zero padding).
_TRANSFORMER_STREAM = 1
_STAGE0_STREAM = 2


def _check_rate(rate_percent_per_hour: float) -> None:
    if not (isinstance(rate_percent_per_hour, (int, float)) and 0 <= rate_percent_per_hour < 100):
        raise ValueError(
            f"failure rate {rate_percent_per_hour!r} %/h is invalid: expected a number in [0, 100)."
        )


PROBABILITY_RANGE = "[0, 1)"
"""The one range of a per-iteration stage-failure probability, wherever it is given (config key, option,
injector, generator): 1 would fail every stage in every iteration, which no strategy can train through."""


def _check_probability(probability: float, what: str = "per-iteration failure probability") -> None:
    """Raises ValueError unless ``probability`` is a number in :data:`PROBABILITY_RANGE`."""
    if not (
        isinstance(probability, (int, float)) and not isinstance(probability, bool) and 0 <= probability < 1
    ):
        raise ValueError(f"{what} {probability!r} is invalid: expected a number in {PROBABILITY_RANGE}.")


def _check_iteration_seconds(iteration_seconds: float) -> None:
    if not (
        isinstance(iteration_seconds, (int, float))
        and iteration_seconds > 0
        and math.isfinite(iteration_seconds)
    ):
        raise ValueError(
            f"iteration time {iteration_seconds!r} s is invalid: expected a positive number of seconds."
        )


def per_iteration_probability(rate_percent_per_hour: float, iteration_seconds: float) -> float:
    """Probability that one stage fails during one iteration (SPEC §1).

    ``p_iter = 1 − (1 − h/100) ** (T_iter / 3600)`` with h the stage failure rate in %/h and T_iter the
    iteration time in seconds. Raises ValueError unless 0 ≤ h < 100 and T_iter > 0.
    """
    _check_rate(rate_percent_per_hour)
    _check_iteration_seconds(iteration_seconds)
    return 1.0 - (1.0 - rate_percent_per_hour / 100.0) ** (iteration_seconds / 3600.0)


def hourly_rate(p_iter: float, iteration_seconds: float) -> float:
    """Inverse of :func:`per_iteration_probability`: the stage failure rate in %/h (SPEC §1).

    ``h = 100 · (1 − (1 − p_iter) ** (3600 / T_iter))``. Raises ValueError unless 0 ≤ p_iter < 1 and T_iter > 0.
    """
    _check_probability(p_iter)
    _check_iteration_seconds(iteration_seconds)
    return 100.0 * (1.0 - (1.0 - p_iter) ** (3600.0 / iteration_seconds))


def rate_key(rate_percent_per_hour: float) -> str:
    """The authors' config key of a failure rate: 16 and 16.0 → "16", 2.5 → "2.5" (SPEC §1, §6)."""
    _check_rate(rate_percent_per_hour)
    rate = float(rate_percent_per_hour)
    return str(int(rate)) if rate.is_integer() else repr(rate)


def resolve_failure_probability(
    config_probabilities: Mapping[str, Any],
    rate_percent_per_hour: float,
    iteration_seconds: float | None = None,
    override: float | None = None,
) -> tuple[float, str]:
    """Per-iteration stage failure probability for a rate in %/h, and where it came from.

    Order: ``override`` (the CLI's ``--failure-probability``) → "override"; the authors' config key
    (:func:`rate_key`, e.g. "16") → ``config["16"]``; otherwise the SPEC §1 formula with
    ``iteration_seconds`` → "formula". ``config_probabilities`` may be a whole config dict (other keys are
    ignored). Raises ValueError for an invalid value, or when the formula is needed and iteration_seconds is None.
    """
    if override is not None:
        _check_probability(override, "failure probability override")
        return float(override), "override"
    key = rate_key(rate_percent_per_hour)
    if key in config_probabilities:
        value = config_probabilities[key]
        _check_probability(value, f'config["{key}"] (per-iteration failure probability)')
        return float(value), f'config["{key}"]'
    if iteration_seconds is None:
        raise ValueError(
            f'failure rate {rate_percent_per_hour!r} %/h has no config key "{key}" and no iteration time was '
            "given: expected a config entry, an explicit per-iteration probability, or iteration_seconds."
        )
    return per_iteration_probability(rate_percent_per_hour, iteration_seconds), "formula"


@runtime_checkable
class StageFailureSource(Protocol):
    """Anything that says which stages fail at an iteration (injector or schedule); the trainer takes either."""

    def draw(self, iteration: int) -> list[int]:
        """Sorted ids of the stages that fail at the start of ``iteration``."""
        ...


class StageFailureInjector:
    """Seeded random stage failures, identical on every DP rank and for every recovery strategy (SPEC §1).

    Each transformer stage 1..n_stages (and stage 0 when ``include_stage0``) fails independently with
    ``probability`` per iteration. The draw is a pure function of (seed, iteration): no state is kept and no
    global RNG is touched, so a resumed or rolled-back run sees the same failures at the same iteration.
    Stage 0 draws from a separate stream, so ``include_stage0`` never changes the other stages' draws, and
    stage s's draw does not depend on n_stages.
    """

    def __init__(self, n_stages: int, probability: float, seed: int, include_stage0: bool = False) -> None:
        if not isinstance(n_stages, int) or n_stages < 1:
            raise ValueError(f"n_stages {n_stages!r} is invalid: expected a positive integer.")
        _check_probability(probability, "failure probability")
        if not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise ValueError(f"seed {seed!r} is invalid: expected an integer in [0, 2^63).")
        self.n_stages = n_stages
        self.probability = float(probability)
        self.seed = seed
        self.include_stage0 = include_stage0

    def _uniforms(self, iteration: int, stream: int, count: int) -> np.ndarray:
        seq = np.random.SeedSequence([self.seed, iteration, stream])
        return np.random.Generator(np.random.PCG64(seq)).random(count)

    def draw(self, iteration: int) -> list[int]:
        """Sorted failed stage ids at ``iteration`` (≥ 0); raises ValueError for a negative iteration."""
        if not isinstance(iteration, int) or iteration < 0:
            raise ValueError(f"iteration {iteration!r} is invalid: expected a non-negative integer.")
        u = self._uniforms(iteration, _TRANSFORMER_STREAM, self.n_stages)  # (n_stages,), stage s at u[s-1]
        failed = [s + 1 for s in np.flatnonzero(u < self.probability).tolist()]
        if self.include_stage0 and self._uniforms(iteration, _STAGE0_STREAM, 1)[0] < self.probability:
            failed.insert(0, 0)
        return failed


class StageSchedule:
    """A fixed list of (iteration, stage) failures, e.g. from ``--failure-schedule FILE``."""

    def __init__(self, failures: Iterable[tuple[int, int]], n_stages: int) -> None:
        self.n_stages = n_stages
        self._by_iteration: dict[int, list[int]] = {}
        for iteration, stage in sorted(set(failures)):
            self._by_iteration.setdefault(iteration, []).append(stage)

    def failures_at(self, iteration: int) -> list[int]:
        """Sorted stage ids that fail at the start of ``iteration``."""
        return list(self._by_iteration.get(iteration, []))

    def draw(self, iteration: int) -> list[int]:
        """Same as :meth:`failures_at` (the :class:`StageFailureSource` interface)."""
        return self.failures_at(iteration)

    def all(self) -> list[tuple[int, int]]:
        """Every (iteration, stage) pair, sorted by iteration then stage."""
        return [(it, s) for it, stages in sorted(self._by_iteration.items()) for s in stages]

    def __len__(self) -> int:
        return sum(len(s) for s in self._by_iteration.values())


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_json(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"failure schedule {str(path)!r} does not exist: expected a JSON file.")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"failure schedule {str(path)!r} is not valid JSON ({err}).") from None


def _parse_node_schedule(data: Any, path: str | Path) -> dict[int, list[int]]:
    if not isinstance(data, dict):
        raise ValueError(
            f"failure schedule {str(path)!r} holds a {type(data).__name__}: expected an object "
            '{"node id": [crash iterations..., sentinel]}.'
        )
    nodes: dict[int, list[int]] = {}
    for key, crashes in data.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise ValueError(
                f"failure schedule {str(path)!r} has node id {key!r}: expected a non-negative integer string."
            )
        if not (isinstance(crashes, list) and crashes and all(_is_int(c) and c >= 0 for c in crashes)):
            raise ValueError(
                f"failure schedule {str(path)!r} node {key}: {crashes!r} is invalid: expected a "
                "non-empty list of non-negative integer iterations ending with a sentinel."
            )
        *real, sentinel = crashes
        if real != sorted(set(real)):
            raise ValueError(
                f"failure schedule {str(path)!r} node {key}: iterations {real!r} are not strictly "
                "ascending: expected each crash iteration once, in ascending order."
            )
        if real and sentinel < real[-1]:
            raise ValueError(
                f"failure schedule {str(path)!r} node {key}: sentinel {sentinel} is below crash "
                f"iteration {real[-1]}: expected the last value to be ≥ every crash iteration."
            )
        nodes[int(key)] = real
    return nodes


def load_node_schedule(path: str | Path) -> dict[int, list[int]]:
    """Read the authors' swarm schedule ``{"node id": [crash iterations ascending..., sentinel]}`` (SPEC §8).

    Returns {node id: crash iterations} with the sentinel (the last value of each list) dropped.
    Raises FileNotFoundError or ValueError (one sentence naming the file and the bad value).
    """
    return _parse_node_schedule(_read_json(path), path)


def node_to_stage_failures(nodes: Mapping[int, list[int]], replicas: int) -> list[tuple[int, int]]:
    """(iteration, stage) pairs where every replica of a stage crashes in the same iteration.

    Node n holds stage n // replicas (SPEC §8). A crash of only some replicas is a partial failure (recovered
    by copying from a live replica) and is logged, not returned. Nodes missing from ``nodes`` never crash.
    """
    crashes: dict[tuple[int, int], int] = {}
    for node, iterations in nodes.items():
        for it in iterations:
            crashes[(it, node // replicas)] = crashes.get((it, node // replicas), 0) + 1
    full = sorted(key for key, count in crashes.items() if count >= replicas)
    partial = sorted(key for key, count in crashes.items() if count < replicas)
    if partial:
        log.info(
            "schedule has %d partial stage failures (some replicas alive), not stage failures: %s",
            len(partial),
            partial,
        )
    return full


def _parse_stage_failures(data: dict, path: str | Path) -> list[tuple[int, int]]:
    entries = data.get("failures")
    if not isinstance(entries, list):
        raise ValueError(
            f'failure schedule {str(path)!r} has "failures" = {entries!r}: expected a list of '
            '{"iteration": int, "stage": int} objects.'
        )
    failures = []
    for entry in entries:
        if not (isinstance(entry, dict) and _is_int(entry.get("iteration")) and _is_int(entry.get("stage"))):
            raise ValueError(
                f"failure schedule {str(path)!r} has entry {entry!r}: expected "
                '{"iteration": int, "stage": int}.'
            )
        failures.append((entry["iteration"], entry["stage"]))
    return failures


def load_stage_schedule(path: str | Path, n_stages: int, replicas: int | None = None) -> StageSchedule:
    """Read a stage-failure schedule for the simulator's ``--failure-schedule FILE``.

    Accepts our format ``{"format": "checkfree-stage-failures-v1", "failures": [{"iteration": 12, "stage": 2}]}``
    (entries in any order) or the authors' node format (see :func:`load_node_schedule`), which needs
    ``replicas`` to map node → stage. Stages must lie in 0..n_stages, iterations must be ≥ 0, and a pair may
    appear only once. Raises FileNotFoundError or ValueError (one sentence naming the file and the bad value).
    """
    data = _read_json(path)
    if isinstance(data, dict) and "format" in data:
        if data["format"] != STAGE_SCHEDULE_FORMAT:
            raise ValueError(
                f"failure schedule {str(path)!r} has format {data['format']!r}: "
                f"expected {STAGE_SCHEDULE_FORMAT!r}."
            )
        failures = _parse_stage_failures(data, path)
    else:
        if not _is_int(replicas) or replicas < 1:
            raise ValueError(
                f"failure schedule {str(path)!r} is in the node format, which needs replicas "
                f"(got {replicas!r}): expected a positive replicas count per stage."
            )
        failures = node_to_stage_failures(_parse_node_schedule(data, path), replicas)
    seen: set[tuple[int, int]] = set()
    for iteration, stage in failures:
        if iteration < 0:
            raise ValueError(f"failure schedule {str(path)!r} has iteration {iteration}: expected ≥ 0.")
        if not 0 <= stage <= n_stages:
            raise ValueError(
                f"failure schedule {str(path)!r} has stage {stage} at iteration {iteration}: "
                f"expected a stage in 0..{n_stages}."
            )
        if (iteration, stage) in seen:
            raise ValueError(
                f"failure schedule {str(path)!r} lists stage {stage} at iteration {iteration} "
                "twice: expected each (iteration, stage) once."
            )
        seen.add((iteration, stage))
    log.debug("loaded %d stage failures from %s", len(failures), path)
    return StageSchedule(failures, n_stages)


def save_stage_schedule(path: str | Path, failures: Iterable[tuple[int, int]]) -> None:
    """Write (iteration, stage) pairs in our format ``checkfree-stage-failures-v1``, sorted."""
    entries = [{"iteration": int(it), "stage": int(s)} for it, s in sorted(set(failures))]
    Path(path).write_text(json.dumps({"format": STAGE_SCHEDULE_FORMAT, "failures": entries}, indent=1) + "\n")


def generate_node_schedule(
    rate: float,
    n_stages: int = 6,
    replicas: int = 3,
    iterations: int = 500,
    seed: int = 33,
    stage_seed: int | None = None,
    checkpoint_interval: int | None = 100,
    probability: float | None = None,
    iteration_seconds: float = PAPER_ITERATION_SECONDS,
) -> dict[str, list[int]]:
    """Crash schedule of the swarm's nodes in the authors' format (SPEC §8); defaults reproduce their files.

    Per iteration 0..iterations−1 (except checkpoint-send iterations ``itr % checkpoint_interval == 1``, which
    neither fail nor consume a draw), ``random.Random(seed)`` decides whether a stage fails with the
    per-iteration probability (``probability``, else :data:`SWARM_FAILURE_PROBABILITIES`, else the SPEC §1
    formula at ``iteration_seconds``); only then does ``random.Random(stage_seed)`` (default rate·5) pick the
    stage uniformly in 1..n_stages. Every replica of that stage (nodes stage·replicas … stage·replicas+replicas−1)
    gets the iteration. Every node 0..(n_stages+1)·replicas−1 is listed (stage 0 never fails), each list ending
    with the sentinel iterations+1. ``checkpoint_interval=None`` lets every iteration fail.
    """
    for name, value, low in (
        ("n_stages", n_stages, 1),
        ("replicas", replicas, 1),
        ("iterations", iterations, 1),
    ):
        if not _is_int(value) or value < low:
            raise ValueError(f"{name} {value!r} is invalid: expected an integer ≥ {low}.")
    if checkpoint_interval is not None and (not _is_int(checkpoint_interval) or checkpoint_interval < 2):
        raise ValueError(
            f"checkpoint_interval {checkpoint_interval!r} is invalid: expected an integer ≥ 2 or None."
        )
    p_fail, source = resolve_failure_probability(
        SWARM_FAILURE_PROBABILITIES, rate, iteration_seconds, probability
    )
    if stage_seed is None:
        # rate·5 as the authors seed it; an integral float seeds like the int (hash(80.0) == 80).
        stage_seed = int(rate * 5) if float(rate * 5).is_integer() else rate * 5
    log.info(
        "node schedule: %s %%/h → p_iter %.6g (%s), %d stages × %d replicas, %d iterations, seeds %s/%s",
        rate,
        p_fail,
        source,
        n_stages,
        replicas,
        iterations,
        seed,
        stage_seed,
    )
    failure_rng, stage_rng = random.Random(seed), random.Random(stage_seed)
    crashes: dict[int, list[int]] = {node: [] for node in range((n_stages + 1) * replicas)}
    for itr in range(iterations):
        if checkpoint_interval is not None and itr % checkpoint_interval == 1:
            continue  # the checkpoint-send iteration never fails
        if failure_rng.random() < p_fail:
            stage = stage_rng.randint(1, n_stages)
            for node in range(stage * replicas, (stage + 1) * replicas):
                crashes[node].append(itr)
    return {str(node): its + [iterations + 1] for node, its in crashes.items()}


def format_node_schedule(schedule: Mapping[str, list[int]]) -> str:
    """JSON text in the authors' layout: one line, ``", "``/``": "`` separators, no trailing newline."""
    return json.dumps(dict(schedule))
