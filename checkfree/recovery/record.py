"""The one recovery record: how one lost stage was rebuilt. The simulator writes it as a "recovery" line of
metrics.jsonl (checkfree/sim/trainer.py), the swarm as a row of throughput.json's ``crashes``
(checkfree/swarm/supervisor/results.py), and the report reads both (checkfree/report/runs.py).

Schema (:meth:`RecoveryRecord.to_json`; every key below is always present, null where it does not apply):

| key | meaning |
|---|---|
| ``iteration`` | the iteration of the loss (simulator: the wall-clock iteration; swarm: the iteration it was lost in) |
| ``stage`` | the stage rebuilt (0..S) |
| ``strategy`` | the canonical setting that rebuilt it (checkfree.settings); null where the run names it once |
| ``rule`` | a rule of checkfree/recovery/rules.py, or ``ec_decode``, ``rollback``, ``restore_one`` (the baselines) |
| ``source_stages`` | the stages the new weights came from, in the plan's order ([] for a random init or a checkpoint) |
| ``source_nodes`` | the nodes that sent them, in the same order (swarm); null in the simulator, which has stages only |
| ``parts`` | ``stage0_copy``: the part each source held ("embedding" / "head"); else null |
| ``weights`` | the coefficient applied to each source ([1.0] for a copy; Eq. 2's shares for ``checkfree``); else null |
| ``omegas`` | ω of each source (``checkfree``, paper §4.1); else null |
| ``grad_norm_mode`` | how ω was computed ("paper" / "clipped"), when ``omegas`` is set; else null |
| ``rung`` | the exactness ladder's rung (checkfree/recovery/ladder.py); null outside the ladder |
| ``fallback`` | why a simpler rule than the setting's own was used; null when none was |
| ``consecutive`` | a directly adjacent stage was lost in the same event |
| ``latency_s`` | THE latency, seconds: from the loss until the stage is rebuilt and serves again (simulator: the rebuild, which happens within the iteration of the loss; swarm: crash → the replacement serving) |

Any other key is a field of one producer (:attr:`RecoveryRecord.extra`, written after the schema's keys): the
simulator's recovery accounting (``weight_rel_l2``, ``loss_spike``, …), a baseline's staleness
(``stale_iterations``, …), the swarm's crash timeline (``slot``, ``node``, ``replacement_node``, ``t_crash``,
``t_serving``, ``recovery_s``, …) and fetch (``bytes``, ``fetch_s``, ``version``, ``lr``).

How the swarm writes one: the replacement builds the record of what it fetched (``source_stages`` = the plan's
sources, ``source_nodes`` = the senders of the answers, ``weights`` / ``omegas`` from
:class:`checkfree.recovery.rules.Rebuilt`, ``rung`` and ``fallback`` from the plan, its fetch fields in ``extra``)
and sends ``to_json()``; the supervisor reads it back with :meth:`RecoveryRecord.from_json`, sets ``iteration``,
``latency_s`` (crash → serving) and its crash timeline in ``extra``, and writes ``to_json()`` as the crash's row.

Files written before this schema are read through :func:`upgrade`, the one legacy mapping.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

SCHEMA_KEYS = (
    "iteration",
    "stage",
    "strategy",
    "rule",
    "source_stages",
    "source_nodes",
    "parts",
    "weights",
    "omegas",
    "grad_norm_mode",
    "rung",
    "fallback",
    "consecutive",
    "latency_s",
)
"""The keys :meth:`RecoveryRecord.to_json` always writes, in this order (the module's table)."""

LATENCY_KEY = "latency_s"
"""The one key of a recovery's latency (seconds) in metrics.jsonl and throughput.json."""


@dataclass
class RecoveryRecord:
    """How one lost stage was rebuilt (the module docstring's table, field by field).

    Attributes:
        stage: the stage rebuilt (0..S).
        rule: the rule applied.
        strategy: the canonical setting (None where the run names it once, as a swarm's throughput.json does).
        source_stages: stages the new weights came from, in the plan's order.
        source_nodes: nodes that sent them, in the same order (swarm); None in the simulator.
        parts: for ``stage0_copy``, the part each source held.
        weights: the coefficient applied to each source, or None.
        omegas: ω of each source (``checkfree``), or None.
        grad_norm_mode: how ω was computed, with ``omegas``.
        rung: the exactness ladder's rung, or None.
        fallback: why a simpler rule than the setting's own was used, or None.
        consecutive: a directly adjacent stage was lost in the same event.
        latency_s: seconds from the loss until the stage serves again (None: not known yet).
        iteration: the iteration of the loss (None: not set yet; the writer sets it).
        extra: a producer's own fields, written after the schema's keys.
    """

    stage: int
    rule: str
    strategy: str | None = None
    source_stages: list[int] = field(default_factory=list)
    source_nodes: list[int] | None = None
    parts: list[str] | None = None
    weights: list[float] | None = None
    omegas: list[float] | None = None
    grad_norm_mode: str | None = None
    rung: str | None = None
    fallback: str | None = None
    consecutive: bool = False
    latency_s: float | None = None
    iteration: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The record as one JSON object: :data:`SCHEMA_KEYS` in order, then :attr:`extra`.

        Raises:
            ValueError: a key of :attr:`extra` is one of the schema's (a producer would overwrite a field).
        """
        clash = set(self.extra) & set(SCHEMA_KEYS)
        if clash:
            raise ValueError(
                f"recovery record extra fields {sorted(clash)} are schema fields; set them directly."
            )
        out: dict[str, Any] = {k: getattr(self, k) for k in SCHEMA_KEYS}
        for k in ("source_stages", "source_nodes", "parts", "weights", "omegas"):
            out[k] = None if out[k] is None else list(out[k])
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RecoveryRecord:
        """The record :meth:`to_json` wrote (keys it lacks take their defaults; unknown keys go to ``extra``).

        Raises:
            ValueError: ``data`` is not a mapping with an integer ``stage`` and a string ``rule``.
        """
        if not isinstance(data, Mapping) or not isinstance(data.get("rule"), str):
            raise ValueError(f"a recovery record needs a string 'rule'; got {data!r:.120}.")
        stage = data.get("stage")
        if not isinstance(stage, int) or isinstance(stage, bool):
            raise ValueError(f"a recovery record needs an integer 'stage'; got {stage!r:.40}.")
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        fields = {k: v for k, v in data.items() if k in known}
        if fields.get("source_stages") is None:
            fields["source_stages"] = []
        return cls(**fields, extra={k: v for k, v in data.items() if k not in known})


LEGACY_KEYS: dict[str, dict[str, str]] = {
    "simulator": {"sources": "source_stages", "seconds": LATENCY_KEY, "omega": "omegas"},
    "swarm": {"sources": "source_nodes"},
}
"""Keys of records written before :data:`SCHEMA_KEYS` → their name now, by writer: the simulator's "recovery"
lines named the source stages ``sources``, the latency ``seconds`` and ω ``omega``; the swarm's crash rows named
the source nodes ``sources`` (its ``source_stages`` and ``latency_s`` keep their names)."""


def upgrade(row: Mapping[str, Any], origin: Literal["simulator", "swarm"]) -> dict[str, Any]:
    """A recovery record as the schema names its keys, whichever version of ``origin`` wrote it: old keys are
    renamed by :data:`LEGACY_KEYS` (a key already present under its new name wins) and every missing schema key
    is None. The report reads archived runs (benchmarks/results/) through this.

    Raises:
        ValueError: ``origin`` is neither "simulator" nor "swarm".
    """
    if origin not in LEGACY_KEYS:
        raise ValueError(f"recovery records come from 'simulator' or 'swarm'; got {origin!r}.")
    renames = LEGACY_KEYS[origin]
    out: dict[str, Any] = {}
    for k, v in row.items():
        new = renames.get(k, k)
        if new != k and new in row:
            continue  # written under both names: the new one is the record's
        out[new] = v
    for k in SCHEMA_KEYS:
        out.setdefault(k, None)
    return out
