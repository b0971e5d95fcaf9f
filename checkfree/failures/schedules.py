"""Failure schedule files: the authors' swarm node schedules (``failure_p_configs/RATE.json``, paper §5) and
checkfree's stage schedules: read, validated, generated and written.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from checkfree import jsonio
from checkfree.failures.injection import StageSchedule
from checkfree.failures.rates import (
    PAPER_ITERATION_SECONDS,
    SWARM_FAILURE_PROBABILITIES,
    resolve_failure_probability,
)
from checkfree.failures.traces import DOWNTIME_FORMAT, DowntimeSchedule, parse_downtime
from checkfree.schemas.limits import MAX_SCHEDULE_BYTES, load_json

log = logging.getLogger(__name__)

STAGE_SCHEDULE_FORMAT = "checkfree-stage-failures-v1"
MAX_SCHEDULE_ITERATIONS = 10_000_000
"""The longest schedule the generator writes (the paper's longest run is 100,001 iterations)."""
MAX_SCHEDULE_NODES = 100_000
SLOWDOWNS_KEY = "slowdowns"
"""A node-format schedule's key for its slowdown events (checkfree.swarm.slowdown reads them; no crashes)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_json(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"failure schedule {str(path)!r} does not exist: expected a JSON file.")
    # at most 16 MiB and 32 deep (checkfree.schemas.limits): one sentence, never a RecursionError
    return load_json(path, "failure schedule", MAX_SCHEDULE_BYTES)


def _parse_node_schedule(data: Any, path: str | Path) -> dict[int, list[int]]:
    if not isinstance(data, dict):
        raise ValueError(
            f"failure schedule {str(path)!r} holds a {type(data).__name__}: expected an object "
            '{"node id": [crash iterations..., sentinel]}.'
        )
    nodes: dict[int, list[int]] = {}
    for key, crashes in data.items():
        if key == SLOWDOWNS_KEY:  # slowdown events, read by checkfree.swarm.slowdown
            continue
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
    """Read the authors' swarm schedule ``{"node id": [crash iterations ascending..., sentinel]}`` (docs/paper.md §8).

    Returns {node id: crash iterations} with the sentinel (the last value of each list) dropped.
    Raises FileNotFoundError or ValueError (one sentence naming the file and the bad value).
    """
    return _parse_node_schedule(_read_json(path), path)


def load_swarm_schedule(path: str | Path) -> dict[int, list[int]] | DowntimeSchedule:
    """A swarm's failure schedule: the authors' node format (:func:`load_node_schedule`: {node id: crash
    iterations}) or slot down intervals mapped from a preemption trace (``checkfree-slot-downtime-v1``,
    :class:`checkfree.failures.traces.DowntimeSchedule`; replayed by checkfree.swarm.supervisor.outages).

    Raises FileNotFoundError or ValueError (one sentence naming the file and the bad value).
    """
    data = _read_json(path)
    if isinstance(data, dict) and "format" in data:
        if data["format"] != DOWNTIME_FORMAT:
            raise ValueError(
                f"failure schedule {str(path)!r} has format {data['format']!r}: a swarm replays "
                f"{DOWNTIME_FORMAT!r} (failure_generator.py --trace) or the authors' node format."
            )
        return parse_downtime(data, f"failure schedule {str(path)!r}")
    return _parse_node_schedule(data, path)


def node_to_stage_failures(nodes: Mapping[int, list[int]], replicas: int) -> list[tuple[int, int]]:
    """(iteration, stage) pairs where every replica of a stage crashes in the same iteration.

    Node n holds stage n // replicas (docs/paper.md §8). A crash of only some replicas is a partial failure (recovered
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
    (entries in any order), slot down intervals mapped from a preemption trace (``checkfree-slot-downtime-v1``,
    :mod:`checkfree.failures.traces`: a stage fails at the iteration its last replica goes down; its stages must
    equal ``n_stages``), or the authors' node format (see :func:`load_node_schedule`), which needs ``replicas`` to
    map node → stage. Stages must lie in 0..n_stages, iterations must be ≥ 0, and a pair may appear only once.
    Raises FileNotFoundError or ValueError (one sentence naming the file and the bad value).
    """
    data = _read_json(path)
    if isinstance(data, dict) and data.get("format") == DOWNTIME_FORMAT:
        down = parse_downtime(data, f"failure schedule {str(path)!r}")
        if down.stages != n_stages:
            raise ValueError(
                f"failure schedule {str(path)!r} maps {down.stages} transformer stages; the config has "
                f"{n_stages}: expected the same (e.g. --set n_stages={down.stages})."
            )
        stages = range(1, n_stages + 1)
        return StageSchedule(
            down.stage_losses(),
            n_stages,
            short_iterations={s: down.short_iterations(s) for s in stages},
            lost_iterations={s: down.lost_iterations(s) for s in stages},
        )
    if isinstance(data, dict) and "format" in data:
        if data["format"] != STAGE_SCHEDULE_FORMAT:
            raise ValueError(
                f"failure schedule {str(path)!r} has format {data['format']!r}: "
                f"expected {STAGE_SCHEDULE_FORMAT!r} or {DOWNTIME_FORMAT!r}."
            )
        failures = _parse_stage_failures(data, path)
    else:
        if not _is_int(replicas) or replicas < 1:
            raise ValueError(
                f"failure schedule {str(path)!r} is in the node format, which needs replicas "
                f"(got {replicas!r}): expected a positive replicas count per stage."
            )
        nodes = _parse_node_schedule(data, path)
        n_nodes = (n_stages + 1) * replicas
        outside = sorted(n for n in nodes if n >= n_nodes)
        if outside:
            raise ValueError(
                f"failure schedule {str(path)!r} names node {outside[0]}, but {n_stages} transformer stages + "
                f"stage 0 × {replicas} replicas are nodes 0..{n_nodes - 1}: expected node ids in that range."
            )
        failures = node_to_stage_failures(nodes, replicas)
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
    Path(path).write_text(
        jsonio.dumps({"format": STAGE_SCHEDULE_FORMAT, "failures": entries}, indent=1) + "\n"
    )


def generate_node_schedule(
    rate: float,
    n_stages: int = 6,
    replicas: int = 3,
    iterations: int = 500,
    seed: int = 33,
    stage_seed: int | None = None,
    checkpoint_every: int | None = 100,
    probability: float | None = None,
    iteration_seconds: float = PAPER_ITERATION_SECONDS,
) -> dict[str, list[int]]:
    """Crash schedule of the swarm's nodes in the authors' format (docs/paper.md §8); defaults reproduce their files.

    Per iteration 0..iterations−1 (except the swarm's checkpoint-send iterations ``itr % checkpoint_every == 1``, which
    neither fail nor consume a draw), ``random.Random(seed)`` decides whether a stage fails with the
    per-iteration probability (``probability``, else :data:`SWARM_FAILURE_PROBABILITIES`, else the docs/paper.md §1
    formula at ``iteration_seconds``); only then does ``random.Random(stage_seed)`` (default rate·5) pick the
    stage uniformly in 1..n_stages. Every replica of that stage (nodes stage·replicas … stage·replicas+replicas−1)
    gets the iteration. Every node 0..(n_stages+1)·replicas−1 is listed (stage 0 never fails), each list ending
    with the sentinel iterations+1. ``checkpoint_every=None`` lets every iteration fail.
    """
    for name, value, low, high in (
        ("n_stages", n_stages, 1, MAX_SCHEDULE_NODES),
        ("replicas", replicas, 1, MAX_SCHEDULE_NODES),
        ("iterations", iterations, 1, MAX_SCHEDULE_ITERATIONS),
    ):
        if not _is_int(value) or not low <= value <= high:
            raise ValueError(f"{name} {value!r} is invalid: expected an integer in {low}..{high}.")
    if (n_stages + 1) * replicas > MAX_SCHEDULE_NODES:
        raise ValueError(
            f"{n_stages} stages × {replicas} replicas is {(n_stages + 1) * replicas} nodes with stage 0; "
            f"expected at most {MAX_SCHEDULE_NODES}."
        )
    if checkpoint_every is not None and (not _is_int(checkpoint_every) or checkpoint_every < 2):
        raise ValueError(
            f"checkpoint_every {checkpoint_every!r} is invalid: expected an integer ≥ 2 or None."
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
        if checkpoint_every is not None and itr % checkpoint_every == 1:
            continue  # the checkpoint-send iteration never fails
        if failure_rng.random() < p_fail:
            stage = stage_rng.randint(1, n_stages)
            for node in range(stage * replicas, (stage + 1) * replicas):
                crashes[node].append(itr)
    return {str(node): its + [iterations + 1] for node, its in crashes.items()}


def format_node_schedule(schedule: Mapping[str, list[int]]) -> str:
    """JSON text in the authors' layout: one line, ``", "``/``": "`` separators, no trailing newline."""
    return jsonio.dumps(dict(schedule))
