"""Failure rates: the hourly rate in %/h ↔ the per-iteration probability of a stage failure (paper §5).

A *stage failure* is the loss of every replica of one stage at once (paper §3). This module is the one place
where the failure rate in %/h is mapped to a per-iteration probability and where that probability is checked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# Paper's measured iteration time of the 500M model (s), docs/paper.md §5; used when a rate is not in a table.
PAPER_ITERATION_SECONDS = 91.32
# Per-iteration failure probabilities of the authors' throughput schedules, keyed like their configs
# (docs/paper.md §1 and §8). The authors' generator has no entry for 5 %/h; 0.0009 is the 500M config's value.
SWARM_FAILURE_PROBABILITIES: dict[str, float] = {"5": 0.0009, "10": 0.002, "16": 0.004, "33": 0.01}


def _check_rate(rate_percent_per_hour: float) -> None:
    if not (isinstance(rate_percent_per_hour, (int, float)) and 0 <= rate_percent_per_hour < 100):
        raise ValueError(
            f"failure rate {rate_percent_per_hour!r} %/h is invalid: expected a number in [0, 100)."
        )


PROBABILITY_RANGE = "[0, 1)"
"""The one range of a per-iteration stage-failure probability, wherever it is given (config key, option,
injector, generator): 1 would fail every stage in every iteration, which no strategy can train through."""


def check_probability(probability: float, what: str = "per-iteration failure probability") -> None:
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
    """Probability that one stage fails during one iteration (docs/paper.md §1).

    ``p_iter = 1 − (1 − h/100) ** (T_iter / 3600)`` with h the stage failure rate in %/h and T_iter the
    iteration time in seconds. Raises ValueError unless 0 ≤ h < 100 and T_iter > 0.
    """
    _check_rate(rate_percent_per_hour)
    _check_iteration_seconds(iteration_seconds)
    return 1.0 - (1.0 - rate_percent_per_hour / 100.0) ** (iteration_seconds / 3600.0)


def hourly_rate(p_iter: float, iteration_seconds: float) -> float:
    """Inverse of :func:`per_iteration_probability`: the stage failure rate in %/h (docs/paper.md §1).

    ``h = 100 · (1 − (1 − p_iter) ** (3600 / T_iter))``. Raises ValueError unless 0 ≤ p_iter < 1 and T_iter > 0.
    """
    check_probability(p_iter)
    _check_iteration_seconds(iteration_seconds)
    return 100.0 * (1.0 - (1.0 - p_iter) ** (3600.0 / iteration_seconds))


def rate_key(rate_percent_per_hour: float) -> str:
    """The authors' config key of a failure rate: 16 and 16.0 → "16", 2.5 → "2.5" (docs/paper.md §1, §6)."""
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
    (:func:`rate_key`, e.g. "16") → ``config["16"]``; otherwise the docs/paper.md §1 formula with
    ``iteration_seconds`` → "formula". ``config_probabilities`` may be a whole config dict (other keys are
    ignored). Raises ValueError for an invalid value, or when the formula is needed and iteration_seconds is None.
    """
    if override is not None:
        check_probability(override, "failure probability override")
        return float(override), "override"
    key = rate_key(rate_percent_per_hour)
    if key in config_probabilities:
        value = config_probabilities[key]
        check_probability(value, f'config["{key}"] (per-iteration failure probability)')
        return float(value), f'config["{key}"]'
    if iteration_seconds is None:
        raise ValueError(
            f'failure rate {rate_percent_per_hour!r} %/h has no config key "{key}" and no iteration time was '
            "given: expected a config entry, an explicit per-iteration probability, or iteration_seconds."
        )
    return per_iteration_probability(rate_percent_per_hour, iteration_seconds), "formula"
