"""Re-adopting a swarm's live nodes after its supervisor died: whom to trust, and which iteration is committed.

A resumed supervisor (``swarm run --resume RUN_DIR``, checkfree.swarm.supervisor.supervisor) restores its
predecessor's control state from the journal (checkfree.swarm.supervisor.journal), binds the same address,
takes over the node processes that still run with their journaled pid and start time
(checkfree.swarm.process_identity), dials every journaled node and asks it where it is (CONTROL ``resume``). Each
answers ``resumed`` (checkfree.swarm.node.node): its stage, the version of its weights (iterations whose step they
include), whether it serves, the attempt it was in, and ``pending``, the attempt whose averaged gradients await a
``commit`` that did not reach it. The answer travels under the node's CURVE key, its proof of identity. A node's
answer is a claim, checked here against the journal (:func:`judge`):

* no answer within the wait, another stage than the journal's, or still recovering → the node is replaced (it is
  killed by pid and its slot recovered by the setting's rule, through the ordinary planning and replacement);
* the journal's committed iteration ``J`` (the iteration to run next) gives every serving replica version ``J``.
  A node at another version is replaced, except in the *commit race*: the supervisor journals a commit's intent
  (the attempt ``A`` at ``J``, its members, every ``ITERATION_END`` and ``ready``) before it broadcasts
  ``commit``, and journals again once every node stepped. If it died between the two, some members may have
  stepped (version ``J + 1``) and the others still hold the averaged gradients of ``A`` (``pending``). Then the
  commit was decided: the resumed supervisor finishes it (*rolls forward*: it sends ``commit`` of ``A`` to the
  pending members, each steps once, as the node's one-step-per-attempt check guarantees, and records iteration
  ``J`` from the journaled intent), and a member that neither stepped nor holds the gradients is replaced (a copy of
  a replica that stepped). If no member stepped, nothing of ``A`` was applied anywhere: the commit is finished
  when every live member still holds the gradients (the supervisor died right after journaling it), else ``A`` is
  aborted and ``J`` is redone from microbatch 0, like any attempt a death interrupts. No iteration is committed
  twice or skipped: the loss curve holds each iteration once.

The attempt counter continues above every attempt a node or the journal saw, so nodes take the next ``begin``.
:func:`judge` decides and waits for nothing; the supervisor asks, waits, kills and commits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from checkfree.swarm.supervisor.state import CommitIntent, SupervisorState


class ResumeImpossible(ValueError):
    """The run cannot be resumed: a stage has no live replica and nothing to rebuild it from (no live neighbour the
    setting's rule can use, no checkpoint, no snapshot), or the run ended; one sentence naming the stage."""


@dataclass
class Verdict:
    """What :func:`judge` decided.

    Attributes:
        adopt: node → its claim (its ``resumed`` meta), for every node taken over as it is.
        replace: node → why it is replaced (killed and its slot recovered).
        roll_forward: the intent's commit is finished (module docstring).
        pending: the members that step when they get the intent's ``commit`` again.
        stepped: the members that stepped already (version ``J + 1``).
        attempt: the highest attempt number the journal or a node saw (the next ``begin`` is above it).
        in_flight: an attempt at the journal's iteration had begun when the supervisor died and is redone.
        recovered: nodes whose slot did not serve in the journal but that serve now (their recovery finished
            while the supervisor was away): their ``serving`` is taken as if it had arrived.
    """

    adopt: dict[int, dict[str, Any]] = field(default_factory=dict)
    replace: dict[int, str] = field(default_factory=dict)
    roll_forward: bool = False
    pending: list[int] = field(default_factory=list)
    stepped: list[int] = field(default_factory=list)
    attempt: int = 0
    in_flight: bool = False
    recovered: list[int] = field(default_factory=list)


def judge(
    state: SupervisorState,
    intent: CommitIntent | None,
    claims: dict[int, dict[str, Any]],
    waited_s: float,
    unasked: dict[int, str] | None = None,
) -> Verdict:
    """Weigh every live slot occupant's claim (``claims``: node → ``resumed`` meta) against the journal's state
    (``state``, as restored) and commit ``intent`` (module docstring). ``waited_s``: how long the resumed
    supervisor waited for the answers (named in the reason of a node that gave none); ``unasked``: node → why it
    was not asked (its process is gone, it had not joined)."""
    verdict = Verdict(attempt=max([state.attempt, *(c["attempt"] for c in claims.values())]))
    if intent is not None:
        verdict.attempt = max(verdict.attempt, intent.attempt)
    committed = state.iteration  # the iteration to run next = the version of every serving replica
    ahead: dict[int, dict[str, Any]] = {}
    for slot in state.roster.all():
        if slot.dead:
            continue
        node, claim = slot.occupant, claims.get(slot.occupant)
        if claim is None:
            why = (unasked or {}).get(node, f"no answer to the resumed supervisor within {waited_s:.0f} s")
            verdict.replace[node] = why
        elif claim["stage"] != slot.stage:
            verdict.replace[node] = f"claims stage {claim['stage']}; the journal has it at stage {slot.stage}"
        elif slot is state.roster.storage:
            verdict.adopt[node] = claim
        elif not claim["serving"]:
            verdict.replace[node] = "it was still recovering; the resumed supervisor plans its slot again"
        elif claim["version"] == committed:
            verdict.adopt[node] = claim
        elif intent is not None and claim["version"] == committed + 1 and node in _members(intent):
            ahead[node] = claim
        else:
            want = f"{committed}" + (f" or {committed + 1}" if intent is not None else "")
            verdict.replace[node] = f"claims weights version {claim['version']}; the journal gives {want}"
    if intent is not None:  # finished if a member stepped; else only if every member can step (else: redone)
        members = _members(intent)
        for node in [n for n, c in verdict.adopt.items() if c["pending"] is not None and n not in members]:
            verdict.replace[node] = (
                f"claims the gradients of attempt {verdict.adopt[node]['pending']}, whose commit it was no "
                "member of"
            )
            del verdict.adopt[node]
        # the gradients of the intent's attempt, not of any: a node's older attempt is no part of this commit
        pending = [n for n, c in verdict.adopt.items() if c["pending"] == intent.attempt]
        every = bool(pending) and all(n in pending for n in verdict.adopt if n in members)
        verdict.roll_forward = bool(ahead) or every
    if verdict.roll_forward:
        assert intent is not None
        members = _members(intent)
        verdict.stepped, verdict.pending = sorted(ahead), sorted(pending)
        verdict.adopt |= ahead
        for node in [n for n in verdict.adopt if n in members and n not in ahead and n not in pending]:
            verdict.replace[node] = (
                f"it neither stepped nor holds the gradients of attempt {intent.attempt}, whose commit others made"
            )
            del verdict.adopt[node]
    else:
        for node, claim in ahead.items():
            verdict.replace[node] = (
                f"claims weights version {claim['version']} of a commit no replica finished"
            )
        verdict.in_flight = intent is not None or any(c["attempt"] > state.attempt for c in claims.values())
    verdict.recovered = sorted(
        n for n in verdict.adopt if not state.roster.by_node[n].serving and n not in verdict.replace
    )
    return verdict


def _members(intent: CommitIntent) -> set[int]:
    return {n for ids in intent.members.values() for n in ids}
