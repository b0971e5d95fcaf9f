"""An insider attacks a live swarm's data plane (issue 21): it holds one node's key, so it passes CURVE and the
sender binding, and sends what that node could send.

One small ``ours`` swarm (3 stages x 2 replicas: node n holds stage n // 2; pipeline 0's route is [0, 2, 4],
pipeline 1's [1, 3, 5]) serves every attack. The attacks are sent for attempts that have not begun yet, so the
target buffers them and takes them *before* the genuine messages of that attempt: had a check been missing, the
poison would have been used (not merely beaten by the genuine copy). Each test lets the swarm commit more
iterations, then checks that training went on with finite losses and that the target counted each attack in
its report (``rejected``). The last test stops the swarm: its throughput.json is strict JSON. A second, tiny
swarm ends in a ``SwarmError`` and must still write throughput.json (status ``failed``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from checkfree.pipeline import stage_order
from checkfree.swarm.config import route
from checkfree.swarm.node.compute import StageWorker, build_stage
from checkfree.swarm.node.context import AttemptClock, NodeContext, StageState
from checkfree.swarm.node.gradient_sync import GradientSync, over_bound
from checkfree.swarm.node.membership import Membership
from checkfree.swarm.node.relay import check_route
from checkfree.swarm.supervisor.supervisor import Supervisor, SwarmError
from checkfree.swarm.wire.protocol import Message, MessageType, ProtocolError, Rejected

from helpers import strict_json
from helpers.swarm import Attacker, after_commits, live_config, node_report, running_swarm

SHAPE = (4, 16, 32)
"""(batch_size, seq_l, dmodel) of the test model: a FORWARD's activations."""


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    yield from running_swarm(tmp_path_factory.mktemp("insider"))


def _rejected(sup: Supervisor, node: int) -> dict[str, int]:
    return {"nonfinite": 0, "off_route": 0, "gradients": 0} | node_report(sup, node).get("rejected", {})


def _losses_since(sup: Supervisor, row: int) -> list[float]:
    return [r["loss"] for r in sup.results.rows[row:]]


def _pipeline(
    attempt: int, msg_type: MessageType, sender: int, path: list[int], pos: int, value: float
) -> Message:
    name = "activations" if msg_type == MessageType.FORWARD else "gradients"
    meta = {"stage": sender // 2, "attempt": attempt, "route": path, "pos": pos, "pipeline": 0}
    return Message(msg_type, sender, 0, 0, meta, {name: torch.full(SHAPE, value)})


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_nan_activations_from_the_predecessor_are_dropped_and_counted(swarm: Supervisor) -> None:
    attempt, row = swarm.state.attempt, len(swarm.results.rows)
    before4, before2 = _rejected(swarm, 4), _rejected(swarm, 2)
    assert swarm.roster.members()[1][0] == 2 and swarm.roster.members()[2][0] == 4
    forward = Attacker(swarm, 4, as_id=2)  # node 2 precedes node 4 on pipeline 0's route [0, 2, 4]
    backward = Attacker(swarm, 2, as_id=4)  # and node 4 sends node 2 its BACKWARD
    try:
        forward.send(
            *[
                _pipeline(e, MessageType.FORWARD, 2, [0, 2, 4], 2, math.nan)
                for e in (attempt + 2, attempt + 3)
            ]
        )
        backward.send(_pipeline(attempt + 2, MessageType.BACKWARD, 4, [0, 2, 4], 1, math.inf))
    finally:
        forward.close()
        backward.close()
    after_commits(swarm, 4)
    assert _rejected(swarm, 4)["nonfinite"] == before4["nonfinite"] + 2
    assert _rejected(swarm, 2)["nonfinite"] == before2["nonfinite"] + 1
    assert all(math.isfinite(loss) for loss in _losses_since(swarm, row))
    assert swarm.results.aborts == 0  # the genuine activations of those microbatches came: nothing was lost


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_activations_from_a_node_off_the_route_are_dropped_and_counted(swarm: Supervisor) -> None:
    attempt, row = swarm.state.attempt, len(swarm.results.rows)
    before = _rejected(swarm, 4)
    attacker = Attacker(swarm, 4, as_id=3)  # node 3 serves stage 1 too, but on pipeline 1's route
    huge = 3e38  # finite: only the route check can stop it (a stage that took it would compute inf/NaN)
    try:
        attacker.send(
            _pipeline(attempt + 2, MessageType.FORWARD, 3, [0, 2, 4], 2, math.nan),  # NaN, and not node 2
            _pipeline(attempt + 2, MessageType.FORWARD, 3, [0, 2, 4], 2, huge),  # finite, not node 2
            _pipeline(attempt + 3, MessageType.FORWARD, 3, [0, 3, 4], 2, huge),  # a route of its own making
        )
    finally:
        attacker.close()
    after_commits(swarm, 4)
    after = _rejected(swarm, 4)
    assert (after["nonfinite"], after["off_route"]) == (before["nonfinite"] + 1, before["off_route"] + 2)
    assert all(math.isfinite(loss) for loss in _losses_since(swarm, row))
    assert swarm.results.aborts == 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_nan_and_huge_gradients_from_a_real_replica_are_dropped_counted_and_reported(
    swarm: Supervisor,
) -> None:
    attempt, row = swarm.state.attempt, len(swarm.results.rows)
    before = _rejected(swarm, 3)
    params = dict(build_stage(swarm.cfg.model, 1, 300, swarm.cfg.init_seed).named_parameters())

    def grads(e: int, value: float) -> Message:
        tensors = {f"g.{n}": torch.full_like(p, value) for n, p in params.items()}
        return Message(
            MessageType.GRADIENTS, 2, 0, -1, {"stage": 1, "attempt": e, "microbatches": 4}, tensors
        )

    attacker = Attacker(swarm, 3, as_id=2)  # node 2 is the other replica of node 3's stage
    try:
        attacker.send(grads(attempt + 1, math.nan), grads(attempt + 2, 3e38), grads(attempt + 3, 1e4))
    finally:
        attacker.close()
    after_commits(swarm, 5)
    assert _rejected(swarm, 3)["gradients"] == before["gradients"] + 3
    rows = swarm.results.rows[row:]
    assert all(math.isfinite(r["loss"]) for r in rows)
    assert all(
        r["grad_norms"]["1"] < 100 for r in rows
    )  # ω of stage 1 never took the attack (≈ 1e6 if it had)
    # the 1e4 gradients (finite, over the bound) were averaged out at the reduce: the supervisor names them
    assert any(
        (g["stage"], g["replica"], g["reported_by"]) == (1, 2, [3]) for g in swarm.results.rejected_gradients
    )


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_attacked_swarm_finishes_with_a_strict_throughput_json(swarm: Supervisor) -> None:
    swarm.iterations = 0
    swarm.thread.join(timeout=60)  # type: ignore[attr-defined]
    assert not swarm.thread.is_alive() and swarm.result  # type: ignore[attr-defined]
    data = strict_json((swarm.run_dir / "throughput.json").read_text())
    assert data["status"] == "completed" and data["cause"] is None
    assert all(math.isfinite(loss) for _, loss in data["loss_curve"])
    assert "nonfinite" not in data  # nothing diverged
    counted = {n: r for n, r in data["rejected_messages"].items() if any(r.values())}
    assert set(counted) >= {"2", "3", "4"}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_swarm_that_ends_in_a_swarm_error_writes_its_throughput_json(tmp_path: Path) -> None:
    cfg = live_config(tmp_path, replicas=1, model={"n_stages": 2})
    # ours keeps no copy of stage 0: losing its only node at iteration 2 cannot be recovered
    sup = Supervisor(cfg, "ours", {0: [2]}, iterations=6, run_dir=tmp_path / "run", vocab_size=300)
    with pytest.raises(SwarmError, match="stage") as err:
        sup.run()
    data = strict_json((tmp_path / "run" / "throughput.json").read_text())
    assert data["status"] == "failed" and data["cause"] == str(err.value)
    assert [r["iteration"] for r in data["iterations"]] == [0, 1]  # every iteration committed before it
    assert data["iterations_target"] == 6 and all(math.isfinite(loss) for _, loss in data["loss_curve"])


# ------------------------------------------------------------------------------ the same checks, without processes


def test_the_route_check_names_the_one_sender_of_each_position() -> None:
    cfg = SimpleNamespace(n_stages=4, mb_count=4)
    members = {0: [0, 1], 1: [2, 3], 2: [4, 5], 3: [6, 7], 4: [8, 9]}
    swapped = route(
        1, members, 4, stage_order(1, 4, True)
    )  # microbatch 1 with CheckFree+ swaps: [2, 1, 4, 3]
    assert swapped == [1, 5, 3, 9, 7]

    def msg(kind: MessageType, sender: int, path: list[int], pos: int, mb: int = 1) -> Message:
        return Message(
            kind, sender, 0, mb, {"stage": 0, "attempt": 1, "route": path, "pos": pos, "pipeline": 1}
        )

    check_route(msg(MessageType.FORWARD, 5, swapped, 2), swapped, 2, cfg, members, True, 3)
    check_route(msg(MessageType.FORWARD, 7, swapped, 5), swapped, 5, cfg, members, True, 1)  # back to stage 0
    check_route(msg(MessageType.BACKWARD, 1, swapped, 4), swapped, 4, cfg, members, True, 7)  # from stage 0
    check_route(msg(MessageType.BACKWARD, 5, swapped, 0), swapped, 0, cfg, members, True, 1)
    straight = route(1, members, 4, stage_order(1, 4, False))
    bad = [
        (msg(MessageType.FORWARD, 4, swapped, 2), swapped, 2, True, 3),  # stage 2's other replica
        (msg(MessageType.FORWARD, 3, straight, 2), straight, 2, True, 5),  # an unswapped route, swaps on
        (msg(MessageType.FORWARD, 5, swapped, 2), swapped, 2, True, 2),  # not this node's position
        (msg(MessageType.BACKWARD, 3, swapped, 2), swapped, 2, True, 3),  # BACKWARD at its own position
        (msg(MessageType.FORWARD, 5, swapped, 2, mb=9), swapped, 2, True, 3),  # no microbatch 9
        (msg(MessageType.FORWARD, 1, swapped, 0), swapped, 0, True, 1),  # a FORWARD to position 0
    ]
    for m, path, pos, swaps, me in bad:
        with pytest.raises(Rejected) as err:
            check_route(m, path, pos, cfg, members, swaps, me)
        assert err.value.counter == "off_route"


def test_a_second_forward_and_a_nonfinite_loss_are_refused_without_touching_the_stage() -> None:
    torch.manual_seed(0)
    worker = StageWorker(nn.Sequential(nn.Linear(8, 8)), 1)
    worker.forward((0, 1), torch.randn(2, 3, 8))
    with pytest.raises(ProtocolError, match="came twice"):
        worker.forward((0, 1), torch.randn(2, 3, 8))  # a late copy cannot replace the saved activations
    worker.reset()
    worker.forward((0, 1), torch.randn(2, 3, 8))  # a new attempt: the same key again is fine

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.out = nn.Linear(8, 5)

        def head(self, h: torch.Tensor) -> torch.Tensor:
            return self.out(h)

    stage0 = StageWorker(Head(), 0)
    labels = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(Rejected, match="loss") as err:
        stage0.head_loss((0, 0), torch.full((2, 3, 8), 3e38), labels, 4)  # finite, but the logits overflow
    assert err.value.counter == "nonfinite"
    assert not stage0.gradients.chains  # nothing was back-propagated
    stage0.settle()
    assert all(p.grad is None for p in stage0.module.parameters())
    loss, grad = stage0.head_loss((0, 0), torch.randn(2, 3, 8), labels, 4)
    assert math.isfinite(loss) and torch.isfinite(grad).all()


def test_the_gradient_bound_drops_an_outlier_replica_and_averages_the_rest() -> None:
    g = {"w": torch.ones(3)}
    norm = float(torch.linalg.vector_norm(g["w"]))
    honest = {5: (g, 4, norm), 6: (g, 4, 2 * norm), 7: (g, 2, norm)}  # 7 ran half the microbatches
    assert over_bound(honest, own=5) == []
    assert over_bound(honest | {8: (g, 4, 100 * norm)}, own=5) == [8]
    assert over_bound({5: (g, 4, norm), 8: (g, 4, 1e6)}, own=8) == []  # never this node's own
    assert over_bound({5: (g, 4, norm), 8: (g, 4, 1e6)}, own=5) == [8]  # R = 2: the lower median is honest
    assert over_bound({5: (g, 4, norm), 6: (g, 0, 0.0), 8: (g, 4, 1e6)}, own=5) == [8]  # 6 ran nothing

    module = nn.Linear(2, 2, bias=False)
    module.weight.grad = torch.full((2, 2), 0.1)
    ready: list[dict] = []
    membership = Membership(20, members={1: [5, 20]})
    ctx = NodeContext(
        20, 1, AttemptClock(attempt=4, iteration=3), membership, lambda *a, **k: ready.append(k)
    )
    cfg = SimpleNamespace(mb_count=4, replicas=2, model=SimpleNamespace(grad_clip=1e9))
    sync = GradientSync(ctx, StageState(module, torch.optim.Adam(module.parameters())), cfg, lambda: 4)
    huge = Message(
        MessageType.GRADIENTS,
        5,
        3,
        -1,
        {"stage": 1, "attempt": 4, "microbatches": 4},
        {"g.weight": torch.full((2, 2), 1e4)},
    )
    sync.on_gradients(huge)
    sync.start()
    assert ready[-1]["meta"]["rejected"] == [5] and sync.rejected_count == 1
    assert torch.equal(module.weight.grad, torch.full((2, 2), 0.1))  # its own, over its one pipeline
    with pytest.raises(ProtocolError, match="came twice"):
        sync.on_gradients(huge)
