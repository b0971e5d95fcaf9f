"""The one place that decides how each lost stage is rebuilt: a pure function of the loss event.

:func:`plan` maps a loss event (the stages that lost a replica, the stages that still have a serving replica)
to a :class:`RecoveryPlan` per stage: the rule, the source stages and the documented fallback. A plan is executed
through the one table of rules (:mod:`checkfree.recovery.rules`): by the simulator's strategies against local
stages (:mod:`checkfree.recovery.execute`), by a swarm replacement against weights fetched from peers (the
supervisor plans, :mod:`checkfree.swarm.policies`). ω shares are computed when a plan is executed, from the
sources' last gradient norms.

Rules (paper §4.1–4.2; the README's settings table):

| setting | lost transformer stage i | lost stage 0 |
|---|---|---|
| ``copy`` | copy of i−1 (of stage 2 for the first stage) | impossible |
| ``zero`` | as ``copy``, then every block's MLP output projection zeroed | impossible |
| ``random`` | a fresh N(0, init_std) initialisation | impossible |
| ``average`` | uniform average of the two neighbours | impossible |
| ``checkfree`` | ω-weighted average of the two neighbours (Eq. 2) | impossible |
| ``checkfree_plus`` | first stage ← copy of stage 2, last ← copy of S−1, others as ``checkfree`` | E from stage 1's copy, E⁻¹ from stage S's |

Neighbours are the nearest stages on each side that still serve (stage 0 never is one: its shapes differ). When
a rule cannot apply, the fallback is: one live neighbour → a copy of it; none → a random init; for stage 0, a part
whose holder is lost too, or holds no copy yet (the swarm's ``holding``: a holder stage rebuilt since stage 0 last
pushed its copies), → a random init of that part. A stage that still has a live replica is copied from it
(``replica``, Adam state included): a partial failure loses nothing (docs/paper.md §1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

NEIGHBOUR_SETTINGS = ("copy", "zero", "random", "average", "checkfree", "checkfree_plus")
"""Canonical settings whose lost stages this planner rebuilds from neighbours."""


class RecoveryImpossible(ValueError):
    """The setting has no rule for this loss (the message names the stage and why)."""


@dataclass(frozen=True)
class RecoveryPlan:
    """How one lost stage is rebuilt.

    Attributes:
        rule: "replica" (copy a live replica of the stage), "copy", "zero", "random", "average", "checkfree",
            or "stage0_copy" (E and E⁻¹ from the copies stages 1 and S hold, CheckFree+).
        sources: source stages, in combination order (left, right for "average" and "checkfree").
        parts: for "stage0_copy", the part each source holds ("embedding" or "head").
        with_optimizer: the source's Adam state and lr multiplier come along (exact copies only).
        fresh_lr_scale: a fresh Adam at lr × lr_scale (every neighbour rule, docs/paper.md §2).
        fallback: why a simpler rule than the setting's own was used, or None.
        rung: the ladder rung (:func:`plan_ladder`) or None.
    """

    rule: str
    sources: tuple[int, ...] = ()
    parts: tuple[str, ...] = ()
    with_optimizer: bool = False
    fresh_lr_scale: bool = True
    fallback: str | None = None
    rung: str | None = None
    """The exactness ladder's rung that produced this plan (:func:`plan_ladder`), else None."""

    def to_json(self) -> dict[str, Any]:
        """The plan as JSON (the swarm's supervisor sends it to the replacement it plans for)."""
        return {**dataclasses.asdict(self), "sources": list(self.sources), "parts": list(self.parts)}

    @classmethod
    def from_json(cls, data: Any, n_stages: int) -> RecoveryPlan:
        """A plan received as JSON, checked field by field.

        Raises:
            ValueError: a missing or unknown field, a wrong type, an unknown rule or part, a stage outside 0..S.
        """
        if not isinstance(data, dict) or set(data) != {f.name for f in dataclasses.fields(cls)}:
            raise ValueError(
                f"a recovery plan must hold exactly the fields of RecoveryPlan; got {data!r:.120}."
            )
        sources, parts = data["sources"], data["parts"]
        if data["rule"] not in PLAN_RULES:
            raise ValueError(f"recovery plan rule {data['rule']!r:.40} is unknown.")
        if not isinstance(sources, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= n_stages for s in sources
        ):
            raise ValueError(f"recovery plan sources {sources!r:.80} are not stages 0..{n_stages}.")
        if not isinstance(parts, list) or not all(p in ("embedding", "head") for p in parts):
            raise ValueError(f"recovery plan parts {parts!r:.80} are not 'embedding' / 'head'.")
        for key in ("with_optimizer", "fresh_lr_scale"):
            if not isinstance(data[key], bool):
                raise ValueError(f"recovery plan field {key!r} is {data[key]!r:.40}; expected true or false.")
        for key in ("fallback", "rung"):
            if data[key] is not None and not isinstance(data[key], str):
                raise ValueError(
                    f"recovery plan field {key!r} is {data[key]!r:.40}; expected a string or null."
                )
        return cls(**{**data, "sources": tuple(sources), "parts": tuple(parts)})


PLAN_RULES = frozenset(
    {"replica", "copy", "zero", "random", "average", "checkfree", "stage0_copy", "storage", "ec_decode"}
)
"""Every rule a plan may name: the rule table's (:data:`checkfree.recovery.rules.RULES`; the swarm's "storage" loads a
checkpoint from its storage node) and "ec_decode" (the REFT snapshot decoded from parity, ec_snapshot.py)."""


def live_neighbours(stage: int, lost: Iterable[int], n_stages: int) -> tuple[int | None, int | None]:
    """Nearest transformer stages left and right of ``stage`` that are not in ``lost`` (None where none is)."""
    gone = set(lost)
    left = stage - 1
    while left >= 1 and left in gone:
        left -= 1
    right = stage + 1
    while right <= n_stages and right in gone:
        right += 1
    return (left if left >= 1 else None), (right if right <= n_stages else None)


def stage0_copy_holders(n_stages: int) -> dict[str, int]:
    """CheckFree+ (paper §4.2, docs/paper.md §3): stage 1 keeps a copy of E, stage S keeps a copy of E⁻¹."""
    return {"embedding": 1, "head": n_stages}


def plan(
    failed: Iterable[int],
    n_stages: int,
    setting: str,
    live: Iterable[int] | None = None,
    holding: Iterable[int] | None = None,
) -> dict[int, RecoveryPlan]:
    """The plan of every stage in ``failed``.

    Args:
        failed: stages that lost at least one replica in this event (0..S).
        n_stages: transformer stages S.
        setting: a canonical neighbour setting (:data:`NEIGHBOUR_SETTINGS`).
        live: stages with a serving replica after the event; default: every stage not in ``failed`` (the
            simulator, where a failure loses every replica). Stages outside ``live`` are never sources.
        holding: the stages whose serving replicas hold their CheckFree+ copy of a stage-0 part
            (:func:`stage0_copy_holders`); default: every live stage (the simulator, where the copies are
            always current). A holder stage outside it is no source for a lost stage 0: its part takes the
            random-init fallback at once (the swarm: a holder rebuilt since stage 0 last pushed its copies).
    Raises:
        RecoveryImpossible: the setting cannot rebuild a lost stage (stage 0 without CheckFree+).
        ValueError: an unknown setting or a stage outside 0..S.
    """
    if setting not in NEIGHBOUR_SETTINGS:
        raise ValueError(f"setting {setting!r} has no neighbour plan; expected one of {NEIGHBOUR_SETTINGS}.")
    failed = sorted(set(failed))
    if any(not 0 <= s <= n_stages for s in failed):
        raise ValueError(f"failed stages {failed} must lie in 0..{n_stages}.")
    live_set = set(range(n_stages + 1)) - set(failed) if live is None else set(live)
    lost = sorted(set(range(n_stages + 1)) - live_set)  # every stage without a serving replica
    holding_set = live_set if holding is None else set(holding)
    return {
        s: RecoveryPlan("replica", (s,), with_optimizer=True, fresh_lr_scale=False)
        if s in live_set
        else _plan_lost(s, lost, n_stages, setting, holding_set)
        for s in failed
    }


def _plan_lost(stage: int, lost: list[int], n_stages: int, setting: str, holding: set[int]) -> RecoveryPlan:
    if stage == 0:
        if setting != "checkfree_plus":
            raise RecoveryImpossible(
                f"setting {setting!r} cannot recover stage 0 (embedding and head) when all its replicas are "
                "lost; only checkfree_plus and the checkpoint-based strategies can."
            )
        holders = stage0_copy_holders(n_stages)
        kept = tuple(p for p, h in holders.items() if h not in lost and h in holding)
        gone = [p for p, h in holders.items() if h in lost]
        empty = [p for p in holders if p not in kept and p not in gone]
        why = [f"copy holder lost too: random init of {gone}"] if gone else []
        why += [f"copy holder holds no copy yet: random init of {empty}"] if empty else []
        fallback = "; ".join(why) or None
        return RecoveryPlan("stage0_copy", tuple(holders[p] for p in kept), kept, fallback=fallback)
    if setting == "random":
        return RecoveryPlan("random")
    if setting == "checkfree_plus":
        partner = {1: 2, n_stages: n_stages - 1}.get(stage)
        if partner is not None and partner >= 1 and partner not in lost:
            return RecoveryPlan("copy", (partner,))
    left, right = live_neighbours(stage, lost, n_stages)
    if setting in ("copy", "zero"):
        intended = stage - 1 if stage > 1 else 2
        source = left if left is not None else right
        if source is None:
            return RecoveryPlan("random", fallback="no live transformer stage: random init")
        return RecoveryPlan(
            setting,
            (source,),
            fallback=None if source == intended else "intended source lost too: nearest live stage",
        )
    rule = "average" if setting == "average" else "checkfree"
    if left is not None and right is not None:
        return RecoveryPlan(rule, (left, right))
    only = left if left is not None else right
    if only is None:
        return RecoveryPlan("random", fallback="no live transformer stage: random init")
    return RecoveryPlan("copy", (only,), fallback="single live neighbour: copy")


LADDER_RUNGS = ("replica", "redundant", "ec_snapshot", "neighbour", "random")
"""The exactness ladder's rungs, most exact first (``replica``: a live replica, swarm only)."""


def plan_ladder(
    failed: Iterable[int],
    n_stages: int,
    rungs: Iterable[str],
    live: Iterable[int] | None = None,
    ec_fresh: bool = False,
    holding: Iterable[int] | None = None,
) -> dict[int, RecoveryPlan]:
    """The exactness ladder: for each stage in ``failed``, the plan of the most exact rung that can apply.

    Rungs, in order (each only when named in ``rungs``): ``replica`` (a live replica of the stage, Adam state
    included); ``redundant`` (the Bamboo copy held by the predecessor in the ring 0 → 1 → … → S → 0, if the
    predecessor did not fail: rule "replica", source the predecessor); ``ec_snapshot`` (the stage's snapshot
    decoded from the parity block: only when it is the one transformer stage lost and ``ec_fresh`` says the
    snapshot is young enough: rule "ec_decode"); ``neighbour`` (the CheckFree+ plan of :func:`plan`, from the
    stages alive or restored exactly; stage 0 from the copies of stages 1 and S, which die with them even when
    those are restored, and only from holders in ``holding``, as in :func:`plan`); ``random`` (a fresh init).
    Each plan's ``rung`` names the rung used.

    Raises:
        ValueError: an unknown rung, or neither ``neighbour`` nor ``random`` among them.
    """
    rungs = set(rungs)
    if rungs - set(LADDER_RUNGS) or not {"neighbour", "random"} & rungs:
        raise ValueError(
            f"ladder rungs {sorted(rungs)} must be from {LADDER_RUNGS} and hold neighbour or random."
        )
    failed = sorted(set(failed))
    live_set = set(range(n_stages + 1)) - set(failed) if live is None else set(live)
    lost = [s for s in failed if s not in live_set]
    plans: dict[int, RecoveryPlan] = {}
    for s in failed:
        if s in live_set and "replica" in rungs:
            plans[s] = RecoveryPlan(
                "replica", (s,), with_optimizer=True, fresh_lr_scale=False, rung="replica"
            )
    for s in lost:
        holder = s - 1 if s >= 1 else n_stages
        if "redundant" in rungs and holder not in failed:
            plans[s] = RecoveryPlan(
                "replica", (holder,), with_optimizer=True, fresh_lr_scale=False, rung="redundant"
            )
    transformer_lost = [s for s in lost if s >= 1]
    if (
        "ec_snapshot" in rungs
        and ec_fresh
        and len(transformer_lost) == 1
        and transformer_lost[0] not in plans
    ):
        s = transformer_lost[0]
        others = tuple(t for t in range(1, n_stages + 1) if t != s)
        plans[s] = RecoveryPlan(
            "ec_decode", others, with_optimizer=True, fresh_lr_scale=False, rung="ec_snapshot"
        )
    restored = set(
        plans
    )  # exactly: they serve as neighbours, but the stage-0 copies they held died with them
    for s in [s for s in failed if s not in plans]:
        if "neighbour" in rungs:
            p = plan(
                [s], n_stages, "checkfree_plus", live=live_set | restored if s else live_set, holding=holding
            )[s]
            plans[s] = dataclasses.replace(p, rung="random" if p.rule == "random" else "neighbour")
        else:
            plans[s] = RecoveryPlan("random", rung="random")
    return plans
