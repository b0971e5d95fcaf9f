"""Swarm pieces without processes: topology config, routing, recovery plans per setting, results, launcher."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from checkfree.config import ConfigError
from checkfree.recovery.planner import RecoveryImpossible
from checkfree.swarm.cli import _overrides, add_parser
from checkfree.swarm.config import SwarmConfig, load_swarm_config, route, swarm_config_from_dict
from checkfree.swarm.policies import make_policy
from checkfree.swarm.supervisor.results import CrashRecord, Results
from checkfree.swarm.supervisor.summary_table import summary_table
from checkfree.swarm.wire.protocol import Message, MessageType

from helpers import ROOT
from helpers.swarm import stage0_copies_of


def test_paper_and_tiny_topologies() -> None:
    paper = load_swarm_config(ROOT / "configs" / "swarm_paper.json")
    assert (paper.n_stages, paper.replicas, paper.n_nodes, paper.mb_count, paper.in_flight) == (
        6,
        3,
        21,
        6,
        3,
    )
    assert [paper.stage_of(n) for n in (0, 2, 3, 20)] == [0, 0, 1, 6]
    assert (
        paper.location_of(0) == "Australia" and paper.location_of(8) == "Belgium"
    )  # id mod 7 (docs/paper.md §8)
    assert paper.storage_id == 21 and paper.first_replacement_id == 22
    tiny = load_swarm_config(ROOT / "configs" / "swarm_tiny.json")
    assert (tiny.n_stages, tiny.replicas, tiny.n_nodes) == (4, 2, 10)
    # the resolved config round-trips through the WELCOME message without the model file
    again = swarm_config_from_dict(json.loads(json.dumps(tiny.to_json())))
    assert again.model == tiny.model and again.n_nodes == 10


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("replicas", 0, "'replicas' is 0"),
        ("time_scale", -1, "time_scale"),
        ("locations", ["Atlantis"], "location 'Atlantis'"),
        ("data", "web", "'data' is 'web'"),
        ("bogus", 1, "unknown key 'bogus'"),
        ("peer_timeout", 0.5, "peer_timeout"),
    ],
)
def test_bad_config_values_raise_one_sentence(key: str, value: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        swarm_config_from_dict({"model_config": "tiny_config.json", key: value})


def test_the_checkpoint_baselines_k_is_checkpoint_every_and_its_old_name_is_read_with_a_note(
    tmp_path: Path,
) -> None:
    """The swarm's checkpoint-baseline interval is ``checkpoint_every`` (the simulator's config name for the same
    K); ``checkpoint_interval`` (in the simulator: the resume checkpoints) and ``--checkpoint-interval`` still work,
    each with one sentence."""
    raw = json.loads((ROOT / "configs" / "swarm_tiny.json").read_text())
    assert raw["checkpoint_every"] == 10 and "checkpoint_interval" not in raw
    old = tmp_path / "old.json"
    old.write_text(
        json.dumps({k if k != "checkpoint_every" else "checkpoint_interval": v for k, v in raw.items()})
    )
    notes: list[str] = []
    assert load_swarm_config(old, notes=notes).checkpoint_every == 10
    assert notes == [
        f"swarm config {old}: 'checkpoint_interval' is now called 'checkpoint_every'; read as checkpoint_every = 10."
    ]
    notes.clear()
    cfg = load_swarm_config(ROOT / "configs" / "swarm_tiny.json", {"checkpoint_interval": 4}, notes)  # --set
    assert cfg.checkpoint_every == 4 and notes == [
        "--set: 'checkpoint_interval' is now called 'checkpoint_every'; read as checkpoint_every = 4."
    ]
    with pytest.raises(ConfigError, match="gives both 'checkpoint_interval' and 'checkpoint_every'"):
        swarm_config_from_dict(
            {"model_config": "tiny_config.json", "checkpoint_interval": 3, "checkpoint_every": 3}
        )
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    for flag, note in (
        ("--checkpoint-every", []),
        (
            "--checkpoint-interval",
            ["--checkpoint-interval is now called --checkpoint-every; read as --checkpoint-every 6."],
        ),
    ):
        notes = []
        args = parser.parse_args(["swarm", "run", "--setting", "checkpoint", "--no-schedule", flag, "6"])
        assert _overrides(args, notes)["checkpoint_every"] == 6 and notes == note
    args = parser.parse_args(
        ["swarm", "run", "--setting", "checkpoint", "--checkpoint-every", "6", "--checkpoint-interval", "5"]
    )
    with pytest.raises(ValueError, match="--checkpoint-every 6 and --checkpoint-interval 5 disagree"):
        _overrides(args, [])


def test_route_prefers_the_pipelines_replica_and_falls_back_to_a_live_one() -> None:
    members = {0: [0, 1], 1: [2, 3], 2: [4], 3: [6, 7]}
    assert route(1, members, 3, [1, 2, 3]) == [1, 3, 4, 7]
    assert route(0, members, 3, [2, 1, 3]) == [0, 4, 2, 6]
    assert route(0, {**members, 2: []}, 3, [1, 2, 3]) is None  # a whole stage missing: no route
    assert route(2, members, 3, [1, 2, 3]) is None  # no such pipeline


@pytest.mark.parametrize(
    ("setting", "stage", "lost", "rule", "stages"),
    [
        ("ours", 2, {2}, "checkfree", [1, 3]),
        ("ours", 2, {2, 3}, "checkfree", [1, 4]),  # consecutive losses: nearest live neighbours
        ("ours", 1, {1}, "copy", [2]),  # CheckFree cannot do the first stage: documented fallback
        ("ours", 2, set(), "replica", [2]),  # partial failure: copy a live replica
        ("ours-plus", 1, {1}, "copy", [2]),
        ("ours-plus", 4, {4}, "copy", [3]),
        ("ours-plus", 3, {3}, "checkfree", [2, 4]),
        ("checkpoint", 3, {3}, "storage", [3]),
        ("ours-plus", 0, {0}, "stage0_copy", [1, 4]),  # E from stage 1's copy, E⁻¹ from stage S's
        ("ours-plus", 0, {0, 1}, "stage0_copy", [4]),  # E's holder lost too: E stays freshly initialised
    ],
)
def test_recovery_plans(setting: str, stage: int, lost: set[int], rule: str, stages: list[int]) -> None:
    plan = make_policy(setting).plan(stage, lost, 4)
    assert (plan.rule, list(plan.sources)) == (rule, stages)
    assert plan.fresh_lr_scale == (rule in ("checkfree", "copy", "stage0_copy"))
    assert plan.with_optimizer == (rule in ("replica", "storage"))


def test_settings_flags_and_impossible_recoveries() -> None:
    assert not make_policy("no_failure").loses_state and make_policy("ours").loses_state
    assert make_policy("ours-plus").swaps and not make_policy("ours").swaps
    assert make_policy("checkpoint").rollback_on_stage_loss
    with pytest.raises(RecoveryImpossible, match="stage 0"):
        make_policy("ours").plan(0, {0}, 4)
    plan = make_policy("ours-plus").plan(0, {0, 1, 4}, 4)
    assert (plan.sources, plan.parts) == ((), ()) and "random init of ['embedding', 'head']" in plan.fallback
    assert make_policy("ours-plus").plan(0, {0}, 4).parts == ("embedding", "head")
    with pytest.raises(ValueError, match="unknown setting 'oursx'"):
        make_policy("oursx")
    with pytest.raises(ValueError, match="'copy' has no swarm implementation"):
        make_policy("copy")
    assert make_policy("checkfree").name == make_policy("ours").name == "checkfree"
    assert make_policy("checkfree_plus").name == make_policy("ours-plus").name == "checkfree_plus"


def _copy(part: str, version: int, tensors: dict, sender: int = 0) -> Message:
    return Message(
        MessageType.STAGE0_COPY, sender, 0, -1, {"stage": 0, "part": part, "version": version}, tensors
    )


def test_stage0_copy_holders_keep_the_newest_valid_copy_and_reject_the_rest() -> None:
    holder = stage0_copies_of(1)
    emb = {"w.embed_tokens.weight": torch.ones(4, 2)}
    holder.on_copy(_copy("embedding", 3, emb))
    holder.on_copy(_copy("embedding", 2, {"w.embed_tokens.weight": torch.zeros(4, 2)}))  # older: ignored
    assert holder.held["embedding"][0] == 3 and torch.equal(
        holder.held["embedding"][1]["embed_tokens.weight"], torch.ones(4, 2)
    )
    bad = {
        "stage 1 holds the embedding, not the head": _copy("head", 4, {"w.lm_head.weight": torch.ones(4, 2)}),
        "not a stage-0 node": _copy("embedding", 4, emb, sender=7),
        "a head entry in an embedding copy": _copy("embedding", 4, {"w.lm_head.weight": torch.ones(4, 2)}),
        "integer tensor": _copy(
            "embedding", 4, {"w.embed_tokens.weight": torch.ones(4, 2, dtype=torch.int64)}
        ),
        "not named w.<key>": _copy("embedding", 4, {"embed_tokens.weight": torch.ones(4, 2)}),
        "NaN": _copy("embedding", 4, {"w.embed_tokens.weight": torch.full((4, 2), float("nan"))}),
        "inf": _copy("embedding", 4, {"w.embed_tokens.weight": torch.full((4, 2), float("inf"))}),
        "version ahead of the swarm": _copy("embedding", 2**62, emb),
    }
    for why, msg in bad.items():
        with pytest.raises(ValueError):
            holder.on_copy(msg)
        assert holder.held["embedding"][0] == 3, why
    with pytest.raises(ValueError, match="expected None"):  # CheckFree (ours) keeps no copies
        stage0_copies_of(1, "ours").on_copy(_copy("embedding", 1, emb))
    # serving: the held copy, or an error when none is held
    request = Message(MessageType.WEIGHTS_REQUEST, 20, meta={"stage": 0, "part": "embedding"})
    holder.answer(request, {"request": "r"})
    assert holder.ctx.send[-1][1]["version"] == 3 and "w.embed_tokens.weight" in holder.ctx.send[-1][2]
    empty = stage0_copies_of(4)
    empty.answer(
        Message(MessageType.WEIGHTS_REQUEST, 20, meta={"stage": 0, "part": "head"}), {"request": "r"}
    )
    assert "holds no copy of the stage-0 'head'" in empty.ctx.send[-1][1]["error"]


def test_the_lowest_stage0_replica_pushes_each_version_once_per_holder() -> None:
    copies = stage0_copies_of(0, node_id=0)
    copies.ctx.membership.members[0], copies.state.version, copies.ctx.clock.iteration = [0, 5], 7, 6
    sent = copies.ctx.send
    copies.push()
    assert {(peer, meta["part"], meta["version"], tuple(sorted(t))) for peer, meta, t in sent} == {
        (11, "embedding", 7, ("w.embed_tokens.weight",)),
        (14, "head", 7, ("w.norm.bias", "w.norm.weight")),
    }
    copies.push()
    assert len(sent) == 2  # this version is already there
    copies.ctx.membership.members[1].append(12)  # a replacement joined stage 1
    copies.push()
    assert [peer for peer, _, _ in sent[2:]] == [12]
    other = stage0_copies_of(0, node_id=5)  # not the lowest-id replica of stage 0: it never pushes
    other.ctx.membership.members[0] = [0, 5]
    other.push()
    assert not other.ctx.send


def test_results_file_and_table(tmp_path: Path) -> None:
    cfg = SwarmConfig(model_config="tiny_config.json")
    res = Results(cfg, "ours", 2)
    res.start()
    members = {0: [0, 1], 1: [2, 3]}
    for it, loss in enumerate((8.0, 7.5)):
        res.iteration(
            it,
            it + 1,
            {0: {"loss": loss, "tokens": 10, "attempt": it + 1}, 1: {"loss": loss, "tokens": 10}},
            {n: {"grad_norm": 0.5} for n in (0, 1, 2, 3)},
            members,
        )
    res.crashes.append(
        CrashRecord(
            slot=3, node=3, stage=1, iteration=1, cause="scheduled SIGKILL", t_crash=0.0, t_serving=1.5
        )
    )
    res.node_report(2, {"sent_bytes": {"FORWARD": 100, "GRADIENTS": 7}, "compute": {"forward_s": 0.1}})
    out = res.finish(tmp_path)
    saved = json.loads((tmp_path / "throughput.json").read_text())
    assert saved["iterations_completed"] == 2 and saved["loss_curve"] == [[0, 8.0], [1, 7.5]]
    assert saved["bytes_sent_by_type"]["FORWARD"] == 100 and saved["mean_crash_to_serving_s"] == 1.5
    assert saved["iterations"][0]["grad_norms"] == {"0": 0.5, "1": 0.5}
    table = summary_table([out])
    assert "| ours | 2 (2) | 1 | 1 |" in table and "8.000 → 7.500" in table


def test_a_crash_row_is_the_one_recovery_record_and_keeps_the_ladders_rung(tmp_path: Path) -> None:
    """A recovered crash is written as the recovery record the simulator writes too (checkfree.recovery.record):
    the schema's keys in order, the stage's sources as stages and as the nodes that sent them, one latency key,
    and the ladder's rung the replacement reported; then the fetch and the crash's timeline. The supervisor's own
    facts (stage, iteration, latency) win over what the node claims."""
    from checkfree.recovery.record import SCHEMA_KEYS
    from checkfree.swarm.supervisor.state import Slot

    res = Results(SwarmConfig(model_config="tiny_config.json"), "ladder", 2)
    res.start()
    slot = Slot(4, 2, "Iowa", True)
    slot.consecutive = True
    res.crashed(slot, "scheduled SIGKILL", 1)
    slot.occupant = 11
    res.spawned(slot)
    res.joined(slot)
    reported = {
        "stage": 3,  # a lie: the slot's stage is 2
        "rule": "checkfree",
        "source_stages": [1, 3],
        "source_nodes": [2, 6],
        "weights": [0.4, 0.6],
        "omegas": [1.0, 1.5],
        "grad_norm_mode": "paper",
        "rung": "neighbour",
        "latency_s": 0.0,
        "bytes": 640,
        "fetch_s": 0.2,
    }
    res.served(slot, reported)
    res.crashed(Slot(5, 2, "Iowa", True), "process exited with code -9", 1)  # still open at the end
    saved = json.loads(json.dumps(res.finish(tmp_path)))
    (row,) = saved["crashes"]
    assert list(row)[: len(SCHEMA_KEYS)] == list(SCHEMA_KEYS)
    assert (row["stage"], row["iteration"], row["rung"], row["consecutive"]) == (2, 1, "neighbour", True)
    assert (row["source_stages"], row["source_nodes"], row["weights"]) == ([1, 3], [2, 6], [0.4, 0.6])
    assert row["latency_s"] == pytest.approx(row["t_serving"] - row["t_crash"]) and "sources" not in row
    assert (row["slot"], row["node"], row["replacement_node"], row["bytes"]) == (4, 4, 11, 640)
    (still,) = saved["open_crashes"]
    assert (still["slot"], still["stage"], still["iteration"]) == (5, 2, 1) and "rule" not in still


def _launcher(*args: str, dry: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, DRY_RUN="1" if dry else "0")
    return subprocess.run(
        [str(ROOT / "communication" / "run_throughput.sh"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=ROOT,
    )


@pytest.mark.timeout(150)
def test_launcher_dry_run_prints_the_paper_topology_and_starts_nothing() -> None:
    out = _launcher("0", "21", "ours", "16")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "swarm run --start 0 --end 21 --setting ours --rate 16 --schedule" in lines[0]
    nodes = [line for line in lines if "checkfree.swarm.node.node" in line]
    assert len(nodes) == 21 and "--id 20 --stage 6 --location London" in nodes[-1]
    assert not (ROOT / "runs" / "swarm-ours-16").exists()
    bad = _launcher("5", "3", "ours", "16")
    assert bad.returncode == 2 and "END 3 is not above START 5" in bad.stderr
