"""The supervisor's side of a validation: when one is due, whom to ask, and the validation loss from the answers.

Like the simulator (checkfree.sim.trainer ``Trainer.train`` and ``evaluate``), the swarm evaluates at iteration 0,
then whenever the committed iterations reach a multiple of ``eval_interval`` (the swarm config's, else the model
config's; 0 = never), and at the end. Between two attempts, the supervisor sends every serving node CONTROL
``evaluate`` (the evaluation's number, the iteration, the serving replicas of every stage); the pipeline runs the
model config's fixed validation batches forward only, stages in order (checkfree.swarm.node.validation), and each
stage-0 node reports ``evaluated`` with the sum of its batches' token-mean cross-entropies and their number. The
validation loss is the sum over every batch (the stage-0 nodes' sums added in pipeline order, never in the order
they came, so a run's numbers repeat bit for bit) divided by the number of batches: the simulator's mean of per-batch
means, in nats; the perplexity is its exp (checkfree.pipeline.perplexity).

:class:`ValidationRuns` decides and records at once and never waits: the supervisor's loop waits for
:meth:`ValidationRuns.complete` in its validating phase (checkfree.swarm.supervisor.phases.validating). An evaluation is numbered by the last
attempt begun (the state's ``attempt``, journaled with it), so its number grows across a resumed supervisor too and
nodes drop an older evaluation's messages; at most one evaluation per attempt number. ``evaluated`` is a claim,
checked against the evaluation in progress: only from a stage-0 member of it, once, with the number of batches of
that node's share.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from checkfree.pipeline import perplexity
from checkfree.swarm.supervisor.link import Link
from checkfree.swarm.supervisor.model_records import ModelRecords
from checkfree.swarm.supervisor.state import Slot, SupervisorState
from checkfree.swarm.wire.protocol import ProtocolError

log = logging.getLogger(__name__)


class ValidationRuns:
    """The evaluations of a run.

    Args:
        state: the supervisor's state (the serving replicas, the iteration, the attempt number).
        link: sends ``evaluate``. records: where each evaluation's validation loss is recorded.
        now: the results' clock (seconds since training started).
    """

    def __init__(self, state: SupervisorState, link: Link, records: ModelRecords, now: Any) -> None:
        self.state, self.link, self.records, self.now = state, link, records, now
        self.interval = state.cfg.validation_every
        self.n_batches = state.cfg.model.validation
        self.number = -1
        """The evaluation in progress (or the last one)."""
        self.open = False
        """An evaluation is in progress (its reports are taken; a late one of the last is ignored)."""
        self.members: dict[int, list[int]] = {}
        self.reports: dict[int, dict[str, Any]] = {}
        self.t_begin = 0.0
        self.iteration = -1
        self.commits = -1
        """``state.commits`` at the last evaluation begun (the end's evaluation is skipped when it is this one)."""

    def due(self, iteration: int, target: int) -> bool:
        """Whether an evaluation is due now that ``iteration`` iterations are committed (toward ``target``): at a
        multiple of the interval (0 included), or at the target, and not evaluated at these commits already."""
        if not self.interval or self.commits == self.state.commits:
            return False
        return iteration % self.interval == 0 or iteration == target

    def due_at_end(self) -> bool:
        """Whether the run's last committed weights were not evaluated yet (the run ends before its target)."""
        return bool(self.interval) and self.commits != self.state.commits

    def begin(self) -> bool:
        """Send ``evaluate`` to every serving node; False (nothing sent) when a stage has no serving replica or an
        evaluation already ran at this attempt number."""
        state = self.state
        members = state.roster.members()
        lost = sorted(s for s, ids in members.items() if not ids)
        self.commits = state.commits
        if lost or state.attempt == self.number:
            why = f"stages {lost} have no serving replica" if lost else "one ran at this attempt already"
            self._give_up(why, state.iteration)
            return False
        self.number, self.iteration, self.members = state.attempt, state.iteration, members
        self.reports, self.t_begin, self.open = {}, time.monotonic(), True
        fields = {"evaluation": self.number, "iteration": self.iteration}
        members_json = {str(k): v for k, v in members.items()}
        for node in (n for ids in members.values() for n in ids):
            self.link.command(node, "evaluate", **fields, members=members_json)
        return True

    def share(self, node: int) -> int:
        """Validation batches of stage-0 member ``node``'s share (batches p, p + P, … of the model config's)."""
        stage0 = self.members.get(0, [])
        p = stage0.index(node)
        return len(range(p, self.n_batches, len(stage0)))

    def on_evaluated(self, slot: Slot, meta: dict[str, Any]) -> list[Any]:
        """A stage-0 node's ``evaluated`` (the inbox's handler of that command); nothing for the processes to do.

        Raises:
            ProtocolError: not of the evaluation in progress, not from a stage-0 member of it, a second report, or
                not the number of batches of its share.
        """
        node = slot.occupant
        if meta["evaluation"] != self.number or self.number < 0:
            raise ProtocolError(f"'evaluated' of evaluation {meta['evaluation']}, not the one in progress")
        if not self.open:
            return []  # a late report of the last evaluation (given up, or finished without it)
        if node not in self.members.get(0, []) or node in self.reports:
            raise ProtocolError(
                f"'evaluated' from node {node}, no stage-0 member yet to report evaluation {self.number}"
            )
        if meta["batches"] != self.share(node):
            raise ProtocolError(
                f"'evaluated' of {meta['batches']} batches; node {node}'s share is {self.share(node)}"
            )
        self.reports[node] = meta
        return []

    def complete(self) -> bool:
        """Every stage-0 member of the evaluation in progress reported."""
        return set(self.members.get(0, [])) <= set(self.reports)

    def finish(self) -> dict[str, Any]:
        """Record the evaluation (all reports in) and return its record."""
        self.open = False
        diverged = any(m.get("diverged") for m in self.reports.values())
        batches = sum(m["batches"] for m in self.reports.values())
        in_order = [self.reports[n] for n in self.members.get(0, []) if n in self.reports]  # not arrival
        val = math.nan if diverged else sum(m["loss_sum"] for m in in_order) / batches
        record = {
            "iteration": self.iteration,
            "val_loss": val,
            "perplexity": perplexity(val) if math.isfinite(val) else math.nan,
            "batches": batches,
            "seconds": time.monotonic() - self.t_begin,
            "t": self.now(),
        }
        self.records.validation.append(record)
        log.info(
            "supervisor: validation after %d iterations: val_loss %.4f | perplexity %.2f (%d batches, %.2f s)",
            self.iteration,
            val,
            record["perplexity"],
            batches,
            record["seconds"],
        )
        return record

    def give_up(self, why: str) -> None:
        """The evaluation in progress ends without a result (a node died, the deadline passed)."""
        self._give_up(why, self.iteration)
        self.open = False

    def _give_up(self, why: str, iteration: int) -> None:
        self.records.validation_given_up.append({"iteration": iteration, "why": why, "t": self.now()})
        log.warning("supervisor: the validation after %d iterations is given up: %s", iteration, why)
