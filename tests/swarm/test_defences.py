"""Defences of the swarm that no other test pinned (issue 37, "Defences no test pins"): each test here was seen
failing with its defence planted away (removed, or shifted by one); docs/checks.md lists the plants.

No processes and no sockets beyond the supervisor's own bound ones: each defence is driven through the handler,
the task or the function that holds it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from checkfree.recovery import rules
from checkfree.recovery.planner import RecoveryPlan
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.launcher import LAUNCHER_STAGE
from checkfree.swarm.node.context import StageState
from checkfree.swarm.node.parts import REFUSALS_PER_WINDOW, WeightGrants
from checkfree.swarm.node.recovering import Rollback
from checkfree.swarm.supervisor.link import Link
from checkfree.swarm.supervisor.state import Attempt
from checkfree.swarm.supervisor.supervisor import Supervisor, SwarmError
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.auth import (
    AuthError,
    MachineKeys,
    MachineLayout,
    SwarmKeys,
    read_key_file,
    read_token,
)
from checkfree.swarm.wire.protocol import Message, MessageType, ProtocolError

from helpers.swarm import FakeNode, stage0_copies_of, weights_answer

LAUNCHER_2, LAUNCHER_4 = 1_000_002, 1_000_004


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[Supervisor]:
    """A supervisor of tiny_config's 5 nodes (1 replica) on three machines: here 0-1, machine 2 (nodes 2-3, its
    launcher hosting them), machine 4 (node 4, likewise); every slot serving; no process is started."""
    cfg = SwarmConfig(model_config="tiny_config.json", replicas=1)
    sup = Supervisor(
        cfg,
        "ours",
        {},
        iterations=1,
        run_dir=tmp_path,
        vocab_size=300,
        start=0,
        end=2,
        machines=[(2, 4), (4, 5)],
    )
    for slot in sup.roster.slots:
        slot.serving, slot.address = True, f"tcp://127.0.0.1:{7000 + slot.slot}"
        sup.roster.by_node[slot.occupant] = slot
    for n, launcher in ((2, LAUNCHER_2), (3, LAUNCHER_2), (4, LAUNCHER_4)):
        sup.roster.slots[n].launcher = launcher
    sup.roster.launchers |= {LAUNCHER_2, LAUNCHER_4}
    yield sup
    sup.transport.close()


def _revoke(sup: Supervisor, start: int) -> None:
    layout = sup.state.keys.layout  # type: ignore[union-attr]
    machine = layout.by_start(start)
    assert machine is not None
    sup.revocations.revoke(machine, iteration=3, now=1.0)


def _join(sender: int, stage: int, **meta: object) -> Message:
    return Message(MessageType.JOIN, sender, meta={"stage": stage, "address": "tcp://127.0.0.1:9", **meta})


def _control(sender: int, command: str, **meta: object) -> Message:
    return Message(MessageType.CONTROL, sender, meta={"command": command, **meta})


# ---------------------------------------------------------------------- machines (supervisor/machines.py, inbox.py)


def test_a_revoked_machines_launcher_may_not_join_again(sup: Supervisor) -> None:
    """Checked by the handler itself, not only by the keyring: the transport here admits any dial, as one whose
    keyring still held the launcher's key would."""
    _revoke(sup, 2)
    assert LAUNCHER_2 not in sup.roster.launchers
    sup.peer_messages.outbox = _Outbox(sup.peer_messages.outbox)  # type: ignore[assignment]
    sup.roster.slots[2].local = False  # a slot it could be handed
    bad = sup.peer_messages.bad_messages
    again = _join(LAUNCHER_2, LAUNCHER_STAGE, slots=[2, 3])
    assert sup.peer_messages.handle(again) == [] and sup.peer_messages.bad_messages == bad + 1
    assert LAUNCHER_2 not in sup.roster.launchers and LAUNCHER_2 not in sup.roster.launcher_addresses
    assert sup.roster.slots[2].launcher is None
    exited = _control(LAUNCHER_2, "exited", node=2, code=0)
    assert sup.peer_messages.handle(exited) == []  # nor is it heard about a node it hosted


class _Outbox:
    """The supervisor's outbox, but dialling any id."""

    def __init__(self, real: object) -> None:
        self.real = real

    def connect(self, node: int, address: str) -> None:
        pass

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)


def test_a_revocation_moves_only_the_revoked_machines_slots(sup: Supervisor) -> None:
    _revoke(sup, 2)
    moved, kept = sup.roster.slots[2:4], sup.roster.slots[4]
    assert all(s.local and s.launcher is None and s.dead for s in moved)
    assert not kept.local and kept.launcher == LAUNCHER_4 and not kept.dead  # the next machine's first slot
    assert sup.results.machine_revocations[-1]["slots_moved"] == [2, 3]
    first = sup.roster.slots[0]
    _revoke(sup, 4)  # the last machine: its range ends at the swarm's last node
    assert sup.roster.slots[4].local and sup.roster.slots[4].dead and not first.dead


# ---------------------------------------------------------------------- a node's JOIN and reports (inbox.py)


def test_a_join_from_the_occupant_of_a_dead_slot_is_refused(sup: Supervisor) -> None:
    slot = sup.roster.slots[1]
    slot.address, slot.serving = None, False
    slot.dead = True
    bad = sup.peer_messages.bad_messages
    assert sup.peer_messages.handle(_join(slot.occupant, slot.stage)) == []
    assert sup.peer_messages.bad_messages == bad + 1 and slot.address is None
    slot.dead = False  # the same JOIN from a live slot's occupant is taken
    assert sup.peer_messages.handle(_join(slot.occupant, slot.stage)) == []
    assert sup.peer_messages.bad_messages == bad + 1 and slot.address == "tcp://127.0.0.1:9"


def test_serving_is_taken_only_for_the_slots_own_stage(sup: Supervisor) -> None:
    slot = sup.roster.slots[2]
    slot.serving = False
    bad = sup.peer_messages.bad_messages
    other = _control(slot.occupant, "serving", stage=slot.stage + 1, version=0, record={"rule": "initial"})
    assert sup.peer_messages.handle(other) == [] and not slot.serving
    assert sup.peer_messages.bad_messages == bad + 1
    own = _control(slot.occupant, "serving", stage=slot.stage, version=0, record={"rule": "initial"})
    assert sup.peer_messages.handle(own) == [] and slot.serving and sup.peer_messages.bad_messages == bad + 1


def test_a_replacement_gets_at_most_max_attempts_new_plans(sup: Supervisor) -> None:
    slot = sup.roster.slots[2]
    slot.serving, slot.plan_seq = False, 3
    limit = sup.cfg.max_attempts
    bad = sup.peer_messages.bad_messages
    slot.replans = limit - 1
    assert sup.peer_messages.handle(_control(slot.occupant, "replan", reason="gone", seq=3)) == []
    assert slot.occupant in sup.state.reports.replan and sup.peer_messages.bad_messages == bad
    sup.state.reports.clear("replan")
    slot.replans = limit
    assert sup.peer_messages.handle(_control(slot.occupant, "replan", reason="gone", seq=3)) == []
    assert not sup.state.reports.replan and sup.peer_messages.bad_messages == bad + 1


# ---------------------------------------------------------------------- grants (supervisor/link.py)


class _Wire:
    def __init__(self) -> None:
        self.sent: list[tuple[int, dict]] = []
        self.identity = None

    def send(self, node: int, msg: Message) -> None:
        self.sent.append((node, msg.meta))


@pytest.mark.parametrize(
    ("plan", "optimizer"),
    [
        (RecoveryPlan("replica", (2,), with_optimizer=True, fresh_lr_scale=False), True),
        (RecoveryPlan("checkfree", (1, 3)), False),  # a neighbour's moments are not this stage's
        (RecoveryPlan("copy", (1,)), False),
        (RecoveryPlan("stage0_copy", (1, 4), parts=("embedding", "head")), False),
    ],
)
def test_only_a_same_stage_copy_is_granted_the_adam_state(
    sup: Supervisor, plan: RecoveryPlan, optimizer: bool
) -> None:
    wire = _Wire()
    link = Link(wire, sup.roster)  # type: ignore[arg-type]
    slot = sup.roster.slots[2]
    slot.plan, slot.plan_seq = plan, 1
    link.grant(slot)
    assert wire.sent and all(meta["optimizer"] is optimizer for _, meta in wire.sent)
    assert {node for node, _ in wire.sent} == {n for s in plan.sources for n in sup.roster.members()[s]}


# ---------------------------------------------------------------------- join tokens (wire/auth.py)


def test_a_join_token_whose_share_offset_reaches_its_stride_is_refused(tmp_path: Path) -> None:
    keys = SwarmKeys.new()
    keys.set_layout(MachineLayout(10, 11, (0, 4)))
    machine = keys.layout.by_start(4)  # type: ignore[union-attr]
    path = tmp_path / "t.json"
    keys.write_token(path, "tcp://a:1", machine)
    data = json.loads(path.read_text())
    every = data["machine"]["every"]
    for offset in (every - 1, every, every + 1):
        data["machine"]["offset"] = offset
        path.write_text(json.dumps(data))
        if offset < every:
            read_token(path)
        else:
            with pytest.raises(AuthError, match="is not a share of a swarm's ids"):
                read_token(path)


# ---------------------------------------------------------------------- a source's refusals (node/parts.py)


def test_refusals_are_bounded_per_requester_per_request_timeout() -> None:
    module = torch.nn.Linear(2, 2)
    t = [0.0]
    grants = WeightGrants(StageState(module, W.make_optimizer(module, 1e-3)), 60.0, clock=lambda: t[0])
    assert all(grants.may_refuse(7) for _ in range(REFUSALS_PER_WINDOW))
    assert not grants.may_refuse(7) and grants.refused["withheld"] == 1
    assert grants.may_refuse(8)  # per requester: another one has its own budget
    t[0] = 59.0
    assert not grants.may_refuse(7)  # still within request_timeout of the first
    t[0] = 60.5
    assert grants.may_refuse(7)  # the window moved on
    assert grants.refused["withheld"] == 2


# ---------------------------------------------------------------------- fetches (node/recovering.py)


def test_a_rollback_takes_only_the_checkpoint_version_it_asked_for() -> None:
    for answered, taken in ((4, False), (2, False), (3, True)):
        node = FakeNode()
        node.clock.max_version = 5  # version 4 is plausible: only the checkpoint's version can refuse it
        rollback = Rollback(node.fetch, 3, node.state, lambda *_: None, node.gave_up.append)
        rollback.start()
        ((to, request),) = node.sent
        assert to == node.cfg.storage_id and request["version"] == 3
        rollback._check_answer(rollback.requests[0], weights_answer(node, to, request["request"]))  # fits
        answer = weights_answer(node, to, request["request"], meta={"version": answered})
        if taken:
            rollback._check_answer(rollback.requests[0], answer)
        else:
            with pytest.raises(Exception, match=f"checkpoint version {answered}; asked for 3"):
                rollback._check_answer(rollback.requests[0], answer)
            rollback.on_response(answer)
            assert node.rejected and "asked for 3" in node.rejected[0]


def test_a_fetch_gives_up_after_max_attempts_rounds_over_its_candidates() -> None:
    node = FakeNode()  # max_attempts 2, candidates 3 and 5: four requests, then it gives up
    rec = node.recovery(RecoveryPlan("replica", (1,), with_optimizer=True, fresh_lr_scale=False))
    rec.start()
    for n in range(1, 5):
        assert len(node.sent) == n and not node.gave_up
        to, meta = node.sent[-1]
        rec.on_response(Message(MessageType.WEIGHTS_RESPONSE, to, meta={"stage": 1, "request": meta["request"],
                                                                         "error": "busy"}))  # fmt: skip
    assert len(node.sent) == 4 and len(node.gave_up) == 1 and "after 4 requests" in node.gave_up[0]


def test_a_fetch_asks_for_a_new_plan_at_most_max_attempts_times() -> None:
    node = FakeNode()  # max_attempts 2
    rec = node.recovery(RecoveryPlan("replica", (1,)))
    rec.start()
    asked = 0
    for seq in range(1, 5):
        while node.sent[-1][0] != -1 and not node.gave_up:  # every source refuses this plan
            to, meta = node.sent[-1]
            refusal = {"stage": 1, "request": meta["request"], "refused": "no_grant"}
            rec.on_response(Message(MessageType.WEIGHTS_RESPONSE, to, meta=refusal))
        if node.gave_up:
            break
        assert node.sent[-1][0] == -1 and node.sent[-1][1]["command"] == "replan"
        asked += 1
        rec.replan(RecoveryPlan("replica", (1,)), {"1": [3, 5]}, seq=seq)
    assert asked == node.cfg.max_attempts and len(node.gave_up) == 1
    assert "asked for a new plan 2 times already" in node.gave_up[0]


# ---------------------------------------------------------------------- the rule table (recovery/rules.py)


def test_rebuild_refuses_a_stage0_copy_plan_whose_parts_do_not_match_its_sources() -> None:
    template = {"embed_tokens.weight": torch.zeros(4, 2), "norm.weight": torch.zeros(2)}
    cfg = SimpleNamespace(init_std=0.02)
    one = {"embed_tokens.weight": torch.ones(4, 2)}

    def inputs(n: int) -> rules.RuleInputs:
        return rules.RuleInputs(template, [one] * n, stage=0, iteration=1, seed=0, cfg=cfg)  # type: ignore[arg-type]

    good = RecoveryPlan("stage0_copy", (1,), parts=("embedding",))
    assert torch.equal(rules.rebuild(good, inputs(1)).state["embed_tokens.weight"], torch.ones(4, 2))
    for parts in ((), ("embedding", "head")):
        with pytest.raises(ValueError, match="needs one part per source"):
            rules.rebuild(RecoveryPlan("stage0_copy", (1,), parts=parts), inputs(1))
    with pytest.raises(ValueError, match="needs one part per source"):
        rules.rebuild(RecoveryPlan("stage0_copy", (1, 4), parts=("embedding",)), inputs(2))


@pytest.mark.parametrize(
    "damage",
    [
        {"offset": -1},  # negative
        {"every": True},  # a bool is no count
        {"start": "4"},
        {"end": 4},  # start < end
        {"first": 9},  # end <= first: replacement ids above the initial ones
        {"extra": 1},  # keys other than the share's
        {"start": None},  # a key missing (popped below)
    ],
)
def test_a_join_token_with_a_damaged_share_is_refused(tmp_path: Path, damage: dict) -> None:
    keys = SwarmKeys.new()
    keys.set_layout(MachineLayout(10, 11, (0, 4)))
    path = tmp_path / "t.json"
    keys.write_token(path, "tcp://a:1", keys.layout.by_start(4))  # type: ignore[union-attr]
    data = json.loads(path.read_text())
    data["machine"].update(damage)
    if damage == {"start": None}:
        del data["machine"]["start"]
    path.write_text(json.dumps(data))
    with pytest.raises(AuthError):
        read_token(path)


@pytest.mark.parametrize("keys_field", [["3"], {"x3": "k"}, {"-1": "k"}, "3"])
def test_a_key_file_whose_keys_are_not_ids_to_keys_is_refused(tmp_path: Path, keys_field: object) -> None:
    keys = SwarmKeys.new()
    path = tmp_path / "k.json"
    keys.write_key_file(path, 5, keys.admitted(range(6), 7))
    read_key_file(path, 5)
    data = json.loads(path.read_text())
    data["keys"] = keys_field
    path.write_text(json.dumps(data))
    with pytest.raises(AuthError):
        read_key_file(path, 5)
    data["keys"], data["secret_key"] = {}, "not a key"
    path.write_text(json.dumps(data))
    with pytest.raises(AuthError):
        read_key_file(path, 5)


@pytest.mark.parametrize("n", [0, 31, 33])
def test_a_secret_of_other_than_32_bytes_is_refused(n: int) -> None:
    machine = MachineLayout(10, 11, (0, 4)).by_start(4)
    assert machine is not None
    SwarmKeys(bytes(32)), MachineKeys(bytes(32), machine, "k")
    with pytest.raises(AuthError, match=f"is {n} bytes; expected 32"):
        SwarmKeys(bytes(n))
    with pytest.raises(AuthError, match=f"is {n} bytes; expected 32"):
        MachineKeys(bytes(n), machine, "k")


def _answered(node: FakeNode, plan: RecoveryPlan, edit) -> None:
    """Start ``plan``'s fetch on ``node`` and answer its first request with a fitting answer that ``edit`` spoils."""
    rec = node.recovery(plan)
    rec.start()
    to, request = node.sent[0]
    answer = weights_answer(node, to, request["request"])
    edit(answer)
    rec.on_response(answer)


def test_a_fetched_answer_lacking_what_its_rule_needs_is_rejected() -> None:
    def drop(*keys: str):
        return lambda msg: [msg.meta.pop(k) for k in keys]

    checkfree = RecoveryPlan("checkfree", (1, 1))
    for plan, edit, why in (
        (checkfree, drop("grad_norm"), "sent no grad_norm, which the CheckFree rule needs"),
        (
            RecoveryPlan("replica", (1,), with_optimizer=True, fresh_lr_scale=False),
            drop("step"),
            "no Adam step",
        ),
        (
            RecoveryPlan("replica", (1,), with_optimizer=True, fresh_lr_scale=False),
            drop("lr"),
            "no Adam step",
        ),
    ):
        node = FakeNode()
        _answered(node, plan, edit)
        assert len(node.rejected) == 1 and why in node.rejected[0] and not node.done
    node = FakeNode()  # the same answers, unspoilt, are taken
    _answered(
        node, RecoveryPlan("replica", (1,), with_optimizer=True, fresh_lr_scale=False), lambda msg: None
    )
    assert node.rejected == [] and len(node.done) == 1


def test_a_stage0_copy_answer_of_other_keys_or_shapes_is_rejected() -> None:
    def node_of_stage0() -> FakeNode:
        node = FakeNode()
        module = torch.nn.ModuleDict(
            {"embed_tokens": torch.nn.Embedding(4, 2), "norm": torch.nn.LayerNorm(2)}
        )
        node.module, node.state = module, StageState(module, W.make_optimizer(module, 1e-3))
        return node

    def copy_of(tensors: dict[str, torch.Tensor]):
        def edit(msg: Message) -> None:
            msg.meta.update(stage=0, part="embedding")
            msg.tensors = {f"w.{k}": v for k, v in tensors.items()}

        return edit

    plan = RecoveryPlan("stage0_copy", (1,), parts=("embedding",))
    emb = torch.ones(4, 2)
    for tensors, why in (
        (
            {"embed_tokens.weight": emb, "norm.weight": torch.ones(2)},
            "copy from node 3 has keys",
        ),  # the head's too
        ({"embed_tokens.weight": torch.ones(5, 2)}, "has the wrong shape or dtype"),
        ({"embed_tokens.weight": emb.double()}, "has the wrong shape or dtype"),
    ):
        node = node_of_stage0()
        _answered(node, plan, copy_of(tensors))
        assert len(node.rejected) == 1 and why in node.rejected[0] and not node.done, why
    node = node_of_stage0()
    _answered(node, plan, copy_of({"embed_tokens.weight": emb}))
    assert node.rejected == [] and len(node.done) == 1
    assert torch.equal(node.done[0][0].module.state_dict()["embed_tokens.weight"], emb)


# ---------------------------------------------------------------------- the retry limit (supervisor/attempts.py)


class _Commands:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict]] = []

    def broadcast(self, command: str, **meta: object) -> None:
        self.sent.append((command, meta))


def test_an_iteration_is_given_up_after_max_attempts_failed_attempts(sup: Supervisor) -> None:
    """Each stalled or timed-out attempt is aborted and redone, the max_attempts-th stops the run (every node told
    ``abort`` first)."""
    commands = _Commands()
    sup.attempts.link = commands  # type: ignore[assignment]
    limit = sup.cfg.max_attempts
    for n in range(1, limit):
        sup.attempts.begin(6, [], 1.0)
        sup.attempts.retry("stalled")  # aborted, to be redone
        assert sup.state.failed_attempts[6] == n and commands.sent[-1][0] == "abort"
    sup.attempts.begin(6, [], 1.0)
    with pytest.raises(SwarmError, match=f"iteration 6 failed {limit} attempts; last: no commit"):
        sup.attempts.retry("no commit within 60 s")
    assert commands.sent[-1] == ("abort", {"attempt": sup.state.attempt})
    assert sup.state.current is not None and sup.state.current.phase == "over"


# ---------------------------------------------------------------------- stage-0 copies (node/stage0_copies.py)


def test_a_held_stage0_copy_must_have_the_parts_keys_shapes_and_dtypes() -> None:
    holder = stage0_copies_of(1)
    holder.shapes = {"embedding": {"embed_tokens.weight": (torch.Size([4, 2]), torch.float32)}, "head": {}}

    def copy(tensors: dict[str, torch.Tensor]) -> Message:
        meta = {"stage": 0, "part": "embedding", "version": 3}
        return Message(MessageType.STAGE0_COPY, 0, 0, -1, meta, {f"w.{k}": v for k, v in tensors.items()})

    for tensors in (
        {"embed_tokens.weight": torch.ones(5, 2)},
        {"embed_tokens.weight": torch.ones(4, 2, dtype=torch.float64)},
        {"embed_tokens.weight": torch.ones(4, 2), "embed_tokens.extra": torch.ones(1)},
    ):
        with pytest.raises(ValueError, match="has other keys or shapes"):
            holder.on_copy(copy(tensors))
        assert "embedding" not in holder.held
    holder.on_copy(copy({"embed_tokens.weight": torch.ones(4, 2)}))
    assert holder.held["embedding"][0] == 3


# ---------------------------------------------------------------------- the supervisor's other claims (inbox.py)


def test_each_implausible_peer_message_is_dropped_and_counted(sup: Supervisor) -> None:
    """One message per check of the supervisor's handlers, each dropped and counted as a bad message (and an
    offence of its sender), the state unchanged; the fitting twin of each is taken."""
    handle, reports = sup.peer_messages.handle, sup.state.reports
    t = [100.0]
    sup.peer_messages.clock = lambda: t[0]
    sup.state.attempt = 7
    sup.state.current = Attempt(7, 3, sup.roster.members(), t_begin=100.0)
    tokens = sup.cfg.mb_count * sup.cfg.model.batch_size * sup.cfg.model.seq_l
    end = Message(
        MessageType.ITERATION_END, 0, meta={"stage": 0, "attempt": 7, "loss": 2.0, "tokens": tokens}
    )

    def refused(msg: Message) -> None:
        bad = sup.peer_messages.bad_messages
        assert handle(msg) == [] and sup.peer_messages.bad_messages == bad + 1, msg.meta

    sup.state.current.phase = "sync"
    refused(end)  # ITERATION_END after the forward phase
    sup.state.current.phase = "forward"
    handle(end)
    assert set(reports.iteration_end) == {0}
    t[0] = 100.0 + sup.cfg.microbatch_timeout
    refused(_control(0, "stalled", attempt=7, reason="stuck"))  # its pipeline ended in this attempt
    refused(_control(99, "stalled", attempt=7, reason="stuck"))  # no member of this swarm
    refused(_control(1, "stored", stage=1, version=3))  # not the storage node (this setting has none)
    assert sup.state.checkpoints.newest_complete() == 0
    begun = sup.state.begun_iteration
    slot = sup.roster.slots[1]
    refused(_control(slot.occupant, "restored", version=begun + 2, bytes=0, record={}))  # ahead of the swarm
    handle(_control(slot.occupant, "restored", version=begun + 1, bytes=0, record={}))
    assert slot.version == begun + 1
    resumed = {"stage": 1, "version": 3, "attempt": 7}
    handle(_control(slot.occupant, "resumed", **resumed))
    refused(_control(slot.occupant, "resumed", **resumed))  # a second one
    refused(_control(LAUNCHER_2, "serving", stage=2, version=0, record={}))  # a launcher sends only 'exited'
    refused(_control(LAUNCHER_4, "exited", node=2, code=0))  # node 2 is machine 2's
    (dead,) = handle(_control(LAUNCHER_2, "exited", node=2, code=-9))
    assert dead.kind == "dead" and dead.slot is sup.roster.slots[2]
    refused(_join(LAUNCHER_2, LAUNCHER_STAGE, slots=[2]))  # a launcher joined already
    refused(_join(7, LAUNCHER_STAGE, slots=[2]))  # no launcher id
    refused(_join(sup.roster.slots[3].occupant, sup.roster.slots[3].stage))  # it joined already
    refused(_control(sup.roster.slots[3].occupant, "serving", stage=3, version=0, record={"rule": "initial"}))
    refused(
        _control(1, "begin", attempt=7, iteration=3, members={})
    )  # a command for nodes, not the supervisor
    sup.state.current.phase = "commit"
    stats = {"sent_bytes": {}, "sent_messages": {}, "dropped_malformed": 0, "bad_messages": 0, "compute": {}}
    refused(_control(1, "committed", attempt=7, version=3, **stats))  # committing iteration 3 gives version 4
    handle(_control(1, "committed", attempt=7, version=4, **stats))
    assert set(reports.committed) == {1}
    remote = sup.roster.slots[3]
    del sup.roster.by_node[remote.occupant]
    remote.address, remote.launcher = None, None
    refused(_join(remote.occupant, remote.stage))  # a remote node no launcher hosts
    remote.launcher = LAUNCHER_2
    handle(_join(remote.occupant, remote.stage))
    assert remote.address == "tcp://127.0.0.1:9"


def test_an_iteration_end_counts_only_from_the_node_the_routes_give_its_pipeline(sup: Supervisor) -> None:
    """After a ``reroute`` that took stage-0 node 1 (issue 39 point 1), pipeline 1 is driven by node 4
    (serving[1 mod 2]): its ITERATION_END is filed under node 1 (the pipeline's node of ``begin``, which the
    attempt awaits) only from node 4 and only once; one sent before the re-route is stale and ignored (no
    offence); node 0 claiming pipeline 1 is refused and counted."""
    handle, reports = sup.peer_messages.handle, sup.state.reports
    sup.state.attempt = 7
    begun = {0: [0, 1, 4], 1: [2], 2: [3]}
    sup.state.current = Attempt(7, 3, {0: [0, 4], 1: [2], 2: [3]}, t_begin=100.0, begun=begun)
    sup.state.current.need_end = {1: 1}
    tokens = sup.cfg.mb_count * sup.cfg.model.batch_size * sup.cfg.model.seq_l

    def end(sender: int, **extra: int) -> Message:
        meta = {"stage": 0, "attempt": 7, "loss": 2.0, "tokens": tokens, **extra}
        return Message(MessageType.ITERATION_END, sender, meta=meta)

    bad = sup.peer_messages.bad_messages
    assert handle(end(4, pipeline=1, reroutes=0)) == [] and not reports.iteration_end  # stale: before it
    assert sup.peer_messages.bad_messages == bad
    handle(end(0, pipeline=1, reroutes=1))  # node 0 does not drive pipeline 1
    assert sup.peer_messages.bad_messages == bad + 1 and not reports.iteration_end
    handle(end(4, pipeline=1, reroutes=1))
    handle(end(0))  # its own pipeline (0), no ``pipeline`` field
    assert set(reports.iteration_end) == {0, 1} and reports.iteration_end[1]["pipeline"] == 1
    handle(end(4, pipeline=1, reroutes=1))  # a second one
    assert sup.peer_messages.bad_messages == bad + 2


def test_fetched_weights_of_other_keys_shapes_or_dtypes_are_rejected() -> None:
    """A replica's answer must hold exactly this stage's keys, shapes and dtypes (wire/weights.py check_state)."""
    plan = RecoveryPlan("copy", (1,))

    def tensors(**change: torch.Tensor):
        def edit(msg: Message) -> None:
            msg.tensors = {**msg.tensors, **{f"w.{k}": v for k, v in change.items()}}

        return edit

    for edit, why in (
        (tensors(extra=torch.ones(2)), "differ from this stage in keys ['extra']"),
        (tensors(weight=torch.ones(3, 2)), "'weight' is (3, 2)"),
        (tensors(bias=torch.ones(2, dtype=torch.float64)), "'bias' is (2,) torch.float64"),
    ):
        node = FakeNode()
        _answered(node, plan, edit)
        assert len(node.rejected) == 1 and why in node.rejected[0] and not node.done, why


def test_gradients_of_other_names_shapes_or_dtypes_are_rejected() -> None:
    """A replica's gradients must name exactly this stage's parameters, each of its shape and dtype
    (node/gradient_sync.py)."""
    node = FakeNode()
    node.membership.members = {1: [20, 5]}
    sync = node.gradient_sync()
    grads = {f"g.{n}": torch.ones_like(p) for n, p in node.module.named_parameters()}
    meta = {"stage": 1, "attempt": 4, "microbatches": 4}
    for bad, why in (
        (grads | {"g.extra": torch.ones(2)}, "wrongly"),
        ({k: v for k, v in grads.items() if k != "g.bias"}, "wrongly"),
        (grads | {"g.weight": torch.ones(3, 2)}, "is (3, 2); expected (2, 2)"),
        (grads | {"g.bias": torch.ones(2, dtype=torch.float64)}, "is (2,); expected (2,)"),
    ):
        with pytest.raises(ProtocolError, match=re.escape(why)):
            sync.on_gradients(Message(MessageType.GRADIENTS, 5, 3, -1, meta, bad))
        assert sync.received == {}
    sync.on_gradients(Message(MessageType.GRADIENTS, 5, 3, -1, meta, grads))
    assert set(sync.received) == {(5, 1)}  # (sender, pipeline)
