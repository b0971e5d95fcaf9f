"""The model's way out of the swarm (checkfree.swarm.supervisor.model_io), without processes: the answers of one
replica per stage become one universal-format checkpoint, and nothing a peer sends gets into it unchecked."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from checkfree.checkpoint import store
from checkfree.swarm.node.compute import build_stage
from checkfree.swarm.supervisor.model_io import ModelIO, snapshot_of
from checkfree.swarm.supervisor.model_records import ModelRecords
from checkfree.swarm.supervisor.state import Slot
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.protocol import Message, MessageType, ProtocolError

from helpers.swarm import live_config


class Sends(list):
    """A link that records (node, type, meta)."""

    def send(self, node: int, mtype: MessageType, meta: dict) -> None:
        self.append((node, mtype, meta))


def answers(cfg, version: int = 3, optimizer: bool = True) -> dict[int, Message]:
    """One WEIGHTS_RESPONSE per stage, as node 2·stage sends it (its own stage's initial weights; Adam stepped)."""
    out = {}
    for stage in range(cfg.n_stages + 1):
        module = build_stage(cfg.model, stage, 300, cfg.init_seed)
        opt = W.make_optimizer(module, cfg.model.lr)
        if optimizer:
            sum(p.sum() for p in module.parameters()).backward()
            opt.step()
        meta = {
            "stage": stage,
            "request": f"r{stage}",
            "version": version,
            "grad_norm": 0.5,
            "lr": cfg.model.lr,
        }
        meta["step"] = W.adam_step(opt)
        tensors = W.stage_tensors(module, opt if optimizer else None)
        out[stage] = Message(MessageType.WEIGHTS_RESPONSE, 2 * stage, meta=meta, tensors=tensors)
    return out


def test_one_answer_per_stage_is_one_universal_checkpoint_that_loads_back(tmp_path: Path) -> None:
    cfg = live_config(tmp_path, replicas=2)
    got = answers(cfg)
    snap = snapshot_of(got, cfg, "ours", 300, optimizer=True)
    assert snap.iteration == 3 and snap.meta["n_stages"] == cfg.n_stages and snap.meta["strategy"] == "ours"
    assert sorted(snap.files) == [
        "layer_0000",
        "layer_0001",
        "layer_0002",
        "stage0",
    ]  # global layers of stages 1..3
    assert snap.meta["layer_stage"] == {"0": 1, "1": 2, "2": 3} and snap.meta["swarm"]["nodes"]["3"] == 6
    q = "layers.0.self_attn.q_proj.weight"
    assert torch.equal(snap.files["layer_0001"]["param/self_attn.q_proj.weight"], got[2].tensors[f"w.{q}"])
    assert torch.equal(snap.files["layer_0001"]["exp_avg/self_attn.q_proj.weight"], got[2].tensors[f"m.{q}"])
    assert float(snap.files["stage0"]["step/embed_tokens.weight"]) == 1.0
    path = store.write_snapshot(snap, tmp_path / "snapshots")
    back = store.read_checkpoint(path)  # checksums verified
    assert back.meta["lr_multipliers"] == [1.0] * 4 and back.meta["grad_norms"] == [0.5] * 4
    weights_only = snapshot_of(answers(cfg, optimizer=False), cfg, "ours", 300, optimizer=False)
    assert not any(k.startswith("exp_avg") for f in weights_only.files.values() for k in f)


@pytest.mark.parametrize(
    "damage, match",
    [
        ("version", "different versions"),
        ("nan", "NaN or inf"),
        ("shape", "expected"),
        ("moment", "Adam moment"),
    ],
)
def test_a_peer_answer_that_does_not_fit_its_stage_is_refused(
    tmp_path: Path, damage: str, match: str
) -> None:
    cfg = live_config(tmp_path, replicas=2)
    got = answers(cfg)
    q = "w.layers.0.mlp.up_proj.weight"
    if damage == "version":
        got[2].meta["version"] = 4  # stopped between two stages' commits
    elif damage == "nan":
        got[2].tensors[q][0, 0] = math.nan
    elif damage == "shape":
        got[2].tensors[q] = got[2].tensors[q][:-1]
    else:
        got[1].tensors["v.layers.0.mlp.up_proj.weight"] = torch.zeros(3)
    with pytest.raises(ProtocolError, match=match):
        snapshot_of(got, cfg, "ours", 300, optimizer=True)


def test_answers_are_taken_only_for_the_supervisor_s_own_requests(tmp_path: Path) -> None:
    cfg = live_config(tmp_path, replicas=2)
    link = Sends()
    io = ModelIO(cfg, "ours", 300, link, tmp_path, ModelRecords(), lambda: 0.0)  # type: ignore[arg-type]
    members = {0: [0, 1], 1: [2, 3], 2: [4, 5], 3: [6, 7]}
    io.gather(members)
    assert [(n, m["stage"], "optimizer" in m) for n, _, m in link] == [
        (0, 0, False),
        (2, 1, False),
        (4, 2, False),
        (6, 3, False),
    ]
    rid = {m["stage"]: m["request"] for _, _, m in link}
    good = answers(cfg, optimizer=False)
    slot = Slot(0, 0, "Iowa", True)
    stray = Message(MessageType.WEIGHTS_RESPONSE, 1, meta={"stage": 0, "request": "nobody asked"})
    with pytest.raises(ProtocolError, match="no request of the supervisor"):
        io.on_weights(slot, stray)
    wrong = Message(
        MessageType.WEIGHTS_RESPONSE, 3, meta={"stage": 1, "request": rid[1]}
    )  # not the node asked
    with pytest.raises(ProtocolError, match="stage 1 of node 2"):
        io.on_weights(slot, wrong)
    for stage, msg in good.items():
        msg.meta["request"] = rid[stage]
        assert not io.settled()
        assert io.on_weights(slot, msg) == []
    assert io.settled()
    io.write_model()
    assert io.records.model["iteration"] == 3 and (tmp_path / io.records.model["path"]).is_dir()
    late = Message(MessageType.WEIGHTS_RESPONSE, 0, meta={"stage": 0, "request": rid[0]})
    with pytest.raises(ProtocolError):  # the gather is over and was not given up: nobody waits for this
        io.on_weights(slot, late)


def test_a_gather_given_up_ignores_late_answers_and_says_why(tmp_path: Path) -> None:
    cfg = live_config(tmp_path, replicas=1)
    records = ModelRecords()
    io = ModelIO(cfg, "ours", 300, Sends(), tmp_path, records, lambda: 0.0)  # type: ignore[arg-type]
    assert not io.gather({0: [0], 1: [], 2: [2], 3: []})
    assert records.model == {
        "path": None,
        "why": "The model is not kept: stages 1, 3 have no serving replica.",
    }
    link = Sends()
    io = ModelIO(cfg, "ours", 300, link, tmp_path, records, lambda: 0.0)  # type: ignore[arg-type]
    io.gather({0: [0], 1: [1], 2: [2], 3: [3]})
    io.write_model()  # nobody answered within the deadline
    assert (
        records.model["path"] is None
        and "no answer within 15 s from (stage, node) [(0, 0), (1, 1)" in records.model["why"]
    )
    late = Message(MessageType.WEIGHTS_RESPONSE, 0, meta={"stage": 0, "request": link[0][2]["request"]})
    assert io.on_weights(Slot(0, 0, "Iowa", True), late) == []  # late, not an offence


def test_the_snapshot_records_know_the_newest_and_the_stall_against_the_quiet_median() -> None:
    records = ModelRecords(snapshot_every=2)
    rows = [{"t_commit": t, "wall_s": w} for t, w in [(1, 1.0), (2, 1.0), (3.5, 1.5), (4.5, 1.0), (5.5, 1.0)]]
    records.snapshots = [
        {"iteration": 2, "path": "snapshots/iter_0000002", "bytes": 10, "t_requested": 2.1},
        {"iteration": 4, "path": "snapshots/iter_0000004", "bytes": 10, "t_requested": 4.6},
    ]
    out = records.to_json(rows)["snapshots"]
    assert [s["iteration_s"] for s in out["written"]] == [1.5, 1.0]  # the iterations they were fetched during
    assert [s["stall_ratio"] for s in out["written"]] == [0.5, 0.0]  # against the quiet median (1.0)
    assert out["stall_ratio"] == 0.25 and out["bytes"] == 20
    assert out["newest"] == {"path": "snapshots/iter_0000004", "iteration": 4} == records.newest_snapshot
    again = ModelRecords()
    again.load(records.state())  # plain data: a journal keeps it
    assert again.newest_snapshot == records.newest_snapshot and again.snapshot_every == 2
