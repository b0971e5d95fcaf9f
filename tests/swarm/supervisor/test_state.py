"""The supervisor's control state is one plain-data object (checkfree.swarm.supervisor.state): what its loop
decides from, written down as strict JSON, and the loop starts from whatever it holds."""

from __future__ import annotations

import json
from pathlib import Path

from checkfree import jsonio
from checkfree.recovery.planner import RecoveryPlan
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.supervisor.phases.attempt import Attempting
from checkfree.swarm.supervisor.phases.between import Between
from checkfree.swarm.supervisor.state import Attempt
from checkfree.swarm.supervisor.supervisor import Supervisor


def test_the_control_state_is_plain_data_and_the_loop_starts_from_it(tmp_path: Path) -> None:
    cfg = SwarmConfig(model_config="tiny_config.json", replicas=1)
    sup = Supervisor(cfg, "checkpoint", {1: [3]}, iterations=5, run_dir=tmp_path, vocab_size=300)
    try:
        state = sup.state
        slot = sup.roster.slots[2]
        slot.occupant, slot.plan, slot.tries = 11, RecoveryPlan("replica", (2,), with_optimizer=True), 2
        state.iteration, state.attempt, state.schedule_clock = 4, 9, 6
        state.current = Attempt(9, 4, sup.roster.members(), t_begin=1.0, due=[1])
        state.fired.add((1, 3))
        state.failed_attempts[4] = 1
        state.checkpoints.record(0, 4)
        out = json.loads(jsonio.dumps(state.to_json()))  # strict JSON: no set, tuple or object left
        assert (out["iteration"], out["attempt"], out["begun_iteration"], out["schedule_clock"]) == (
            4,
            9,
            4,
            6,
        )
        assert out["fired"] == [[1, 3]] and out["failed_attempts"] == {"4": 1}
        assert out["roster"]["slots"][2]["occupant"] == 11 and out["roster"]["slots"][2]["tries"] == 2
        assert RecoveryPlan.from_json(out["roster"]["slots"][2]["plan"], cfg.n_stages) == slot.plan
        assert out["roster"]["storage"]["stage"] == -1 and out["checkpoints"]["stored"] == {"0": [4]}
        assert out["config"] == cfg.to_json() and out["setting"] == "checkpoint"
        # the loop runs from the state's iteration: with the target reached, it begins no attempt
        state.iteration = sup.iterations
        after = sup.drive(Between(), until=lambda p: True)
        assert not isinstance(after, Attempting) and state.attempt == 9 and sup.results.rows == []
    finally:
        sup.transport.close()
