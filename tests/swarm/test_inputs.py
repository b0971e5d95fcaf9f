"""What the swarm reads from a user (issue 37): the swarm config's schema (checkfree.swarm.config), ``--machines``,
``swarm table``'s throughput.json, revocations.json and ``swarm revoke``'s refusal of a run that is not running.
Each check here was seen failing on a planted bug (the report of issue 37 lists them)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from checkfree import jsonio
from checkfree.config import ConfigError
from checkfree.swarm.config import SwarmConfig, load_swarm_config, machines_option, swarm_config_from_dict
from checkfree.swarm.supervisor.machines import read_revocations

from helpers import ROOT
from helpers.cli import assert_user_error, run_cli

TINY = {"model_config": "tiny_config.json"}


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("crash_point", "half", "'crash_point' is 'half'; expected a finite number ≥ 0 and ≤ 10"),
        ("crash_point", 10.5, "'crash_point' is 10.5; expected a finite number ≥ 0 and ≤ 10"),
        ("locations", 5, "'locations' is 5; expected a list of at most 4,096 names, or null"),
        ("locations", [["Iowa"]], "'locations[0]' is ['Iowa']"),
        ("storage_location", ["Iowa"], "'storage_location' is ['Iowa']; expected a non-empty string"),
        ("model_config", 5, "'model_config' is 5; expected a non-empty string"),
        ("seed", -1, "'seed' is -1; expected an integer in [0, 2^63), or null"),
        ("seed", "abc", "'seed' is 'abc'"),
        ("time_scale", float("nan"), "'time_scale' is nan; expected a finite number ≥ 0"),
        ("replicas", True, "'replicas' is True; expected a positive integer ≤ 1,024"),
        ("replicas", 1e29, "'replicas' is 1e+29"),
        ("replicas", 1025, "'replicas' is 1025; expected a positive integer ≤ 1,024"),
        ("microbatches", 4097, "'microbatches' is 4097"),
        ("max_attempts", 1001, "'max_attempts' is 1001; expected a positive integer ≤ 1,000"),
        ("peer_timeout", float("inf"), "'peer_timeout' is inf; expected a positive number ≤ 1e+07"),
        ("snapshot_every", -1, "'snapshot_every' is -1"),
    ],
)
def test_a_swarm_config_value_off_its_schema_is_one_sentence_naming_the_file(key, value, says):
    with pytest.raises(ConfigError) as e:
        swarm_config_from_dict(TINY | {key: value}, "swarm config s.yaml")
    assert (
        str(e.value).startswith("swarm config s.yaml: ") and says in str(e.value) and "\n" not in str(e.value)
    )


def test_the_schema_is_checked_for_a_config_built_in_code_too():
    with pytest.raises(ConfigError, match="'crash_point' is 'half'"):
        SwarmConfig(model_config="tiny_config.json", crash_point="half")  # type: ignore[arg-type]


def test_the_swarm_is_bounded_in_nodes_before_anything_is_built():
    """(S + 1) x R at most 4,096: 8 stages x 512 replicas pass, 513 do not."""
    model = json.loads((ROOT / "configs" / "tiny_config.json").read_text()) | {"n_stages": 7}
    assert SwarmConfig(replicas=512, model_json=model).n_nodes == 4096
    with pytest.raises(ConfigError, match=r"= 4,104 nodes; expected at most 4,096"):
        SwarmConfig(replicas=513, model_json=model)


def test_a_set_override_is_checked_like_the_file(tmp_path: Path):
    with pytest.raises(ConfigError, match="'crash_point' is 'x'"):
        load_swarm_config("swarm_tiny.json", {"crash_point": "x"})


def test_machines_ranges_are_bounded_before_any_range_is_built():
    assert machines_option("4:7,7:10", n_nodes=10) == [(4, 7), (7, 10)]
    for text, says in (
        ("4:11", "is not a range START < END <= 10 (the swarm's nodes)"),
        ("4:99999999999999999999999", "is not START:END"),  # refused by its digits, never made an int
        ("7:4", "is not a range START < END"),
        ("a:b", "is not START:END"),
    ):
        with pytest.raises(ValueError, match=re.escape(says)):
            machines_option(text, n_nodes=10)
    with pytest.raises(ValueError, match="names 4,097 ranges"):
        machines_option(",".join(["0:1"] * 4097))


def test_revocations_json_off_its_schema_is_one_sentence(tmp_path: Path):
    assert read_revocations(tmp_path) == []
    for text, says in (
        ("[1, 2]", "the file holds [1, 2]; expected a JSON object."),
        ('{"format": "checkfree-swarm-revocations-v1", "machines": [true]}', "'machines[0]' is True"),
        ('{"format": "checkfree-swarm-revocations-v1", "machines": [4], "x": 1}', "unknown key 'x'"),
        ('{"format": "other", "machines": [4]}', "'format' is 'other'"),
        ("[" * 40 + "]" * 40, "nested deeper than 32"),
    ):
        (tmp_path / "revocations.json").write_text(text)
        with pytest.raises(ValueError, match=re.escape(says)):
            read_revocations(tmp_path)
    (tmp_path / "revocations.json").write_text(
        '{"format": "checkfree-swarm-revocations-v1", "machines": [4, 7]}'
    )
    assert read_revocations(tmp_path) == [4, 7]


ROW = {
    "setting": "ours",
    "iterations_completed": 3,
    "iterations_executed": 4,
    "crashes_count": 0,
    "recovered_count": 0,
    "mean_iteration_s": 1.0,
    "mean_iteration_s_without_crashes": 1.0,
    "mean_crash_to_serving_s": None,
    "tokens_per_s": 10.0,
    "loss_curve": [[0, 5.0], [2, 4.0]],
}


@pytest.mark.parametrize(
    "edit, says",
    [
        ({"loss_curve": "down"}, "'loss_curve' is 'down'; expected a valid list"),
        ({"loss_curve": [["a", 1.0]]}, "'loss_curve[0][0]' is 'a'"),
        ({"tokens_per_s": [1]}, "'tokens_per_s' is [1]"),
        ({"iterations_completed": "x"}, "'iterations_completed' is 'x'"),
        ({"crashes_count": -1}, "'crashes_count' is -1"),
    ],
)
def test_swarm_table_refuses_a_throughput_json_off_its_schema(tmp_path: Path, capsys, edit, says):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "throughput.json").write_text(jsonio.dumps(ROW | edit))
    rc, _, err = run_cli(["swarm", "table", str(tmp_path / "run")], capsys)
    assert_user_error(rc, err, "throughput.json: ", says)
    (tmp_path / "run" / "throughput.json").write_text(jsonio.dumps(ROW))
    rc, out, _ = run_cli(["swarm", "table", str(tmp_path / "run")], capsys)
    assert rc == 0 and "| ours | 3 (4) |" in out and "5.000 → 4.000" in out


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A journal as a real supervisor writes it (a 2-replica tiny swarm, nothing started; this process is its
    supervisor)."""
    from checkfree.swarm.supervisor.journal import JOURNAL_FILE
    from checkfree.swarm.supervisor.supervisor import Supervisor

    tmp = tmp_path_factory.mktemp("journal")
    cfg = SwarmConfig(model_config="tiny_config.json", replicas=2)
    sup = Supervisor(cfg, "ours", {}, iterations=9, run_dir=tmp / "run", vocab_size=300, options={})
    try:
        sup.journal.write("a test")
    finally:
        sup.transport.close()
    return jsonio.loads((tmp / "run" / JOURNAL_FILE).read_text())


def _run_dir(tmp_path: Path, journal: dict) -> Path:
    from checkfree.swarm.supervisor.journal import JOURNAL_FILE

    run = tmp_path / "run"
    (run / "join_tokens").mkdir(parents=True)
    (run / "join_tokens" / "machine4.json").write_text("{}")
    (run / "join_tokens" / "machine4.json").chmod(
        0o600
    )  # the journal's reader checks the run's key files too
    fd = os.open(run / JOURNAL_FILE, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(jsonio.dumps(journal))
    return run


def test_swarm_revoke_refuses_a_run_whose_supervisor_is_gone(tmp_path: Path, journal: dict, capsys):
    """Nothing would read the request: one sentence with the command that resumes the run, nothing written."""
    gone = json.loads(json.dumps(journal))
    gone["supervisor"]["started"] += 1  # the pid's start time differs: another process, or none
    run = _run_dir(tmp_path, gone)
    rc, _, err = run_cli(["swarm", "revoke", str(run), "4"], capsys)
    assert_user_error(rc, err, "is not running, so nothing would read the revocation", f"--resume {run}")
    assert not (run / "revocations.json").exists()
    ended = json.loads(json.dumps(journal)) | {"status": "completed"}
    (run / "journal.json").write_text(jsonio.dumps(ended))
    rc, _, err = run_cli(["swarm", "revoke", str(run), "4"], capsys)
    assert_user_error(rc, err, "ended (completed)")


def test_swarm_revoke_asks_the_running_supervisor(tmp_path: Path, journal: dict, capsys):
    run = _run_dir(tmp_path, journal)  # its supervisor is this process: running
    rc, out, _ = run_cli(["swarm", "revoke", str(run), "4"], capsys)
    assert rc == 0 and "revocation asked" in out and read_revocations(run) == [4]


def test_the_memory_advice_bisects_to_the_same_answer_as_a_scan():
    """``swarm run``'s advice (the largest END, or in_flight, that fits) by bisection, not one estimate per node:
    a dry run of 4,096 nodes took 225 s scanning (issue 37); the answer is the scan's for every threshold."""
    from checkfree.swarm.cli import _largest

    for low, high in ((1, 1), (1, 9), (3, 40), (5, 4)):
        for edge in range(low - 2, high + 3):
            calls: list[int] = []

            def fits(n: int, edge: int = edge, calls: list[int] = calls) -> bool:
                calls.append(n)
                return n <= edge

            scan = next((n for n in range(high, low - 1, -1) if n <= edge), None)
            assert _largest(low, high, fits) == scan, (low, high, edge)
            assert len(calls) <= max(1, (high - low + 1).bit_length())


def test_a_join_token_too_deep_or_too_large_is_one_sentence(tmp_path: Path):
    from checkfree.swarm.wire.auth import AuthError, read_token

    path = tmp_path / "token.json"
    for text, says in (
        ("[" * 100_000 + "]" * 100_000, "is nested deeper than 32"),
        ('{"pad": "' + "x" * (1 << 20) + '"}', "is larger than 1,048,576 bytes"),
    ):
        path.write_text(text)
        with pytest.raises(AuthError, match=f"join token {re.escape(str(path))} cannot be read; .*{says}"):
            read_token(path)


def test_a_recovery_kill_schedule_too_deep_is_one_sentence(tmp_path: Path):
    from checkfree.swarm.supervisor.recovery_kills import load_recovery_kills

    path = tmp_path / "kills.json"
    path.write_text(
        '{"format": "checkfree-recovery-kills-v1", "kills": ' + "[" * 100_000 + "]" * 100_000 + "}"
    )
    with pytest.raises(ValueError, match="recovery-kill schedule .* is nested deeper than 32"):
        load_recovery_kills(path)


def test_a_join_token_is_read_through_its_schema(tmp_path: Path):
    """A token as the supervisor writes it reads back; a key of no token, a share of 10^30 ids or a secret that is
    not 40 Z85 characters is one sentence naming the field (checkfree.schemas.join_token)."""
    from checkfree.swarm.wire.auth import AuthError, MachineLayout, SwarmKeys, read_token

    keys = SwarmKeys.new()
    keys.set_layout(MachineLayout(10, 11, (0, 4)))
    path = tmp_path / "t.json"
    keys.write_token(path, "tcp://a:1", keys.layout.by_start(4))  # type: ignore[union-attr, arg-type]
    good = json.loads(path.read_text())
    assert read_token(path)[1] == "tcp://a:1"
    for edit, says in (
        ({"note": "hand-edited"}, "unknown key 'note'"),
        ({"machine": good["machine"] | {"end": 10**30}}, "'machine.end' is 1000000000000000000000000000000"),
        ({"machine": good["machine"] | {"every": 0}}, "'machine.every' is 0"),
        ({"machine_secret": "abc"}, "'machine_secret' is 'abc'; expected 40 Z85 characters"),
        ({"bootstrap": ""}, "'bootstrap' is ''"),
    ):
        path.write_text(json.dumps(good | edit))
        with pytest.raises(AuthError, match=re.escape(f"join token {path}: {says}")):
            read_token(path)


def test_a_key_file_is_read_through_its_schema(tmp_path: Path):
    from checkfree.swarm.wire.auth import AuthError, SwarmKeys, read_key_file

    keys = SwarmKeys.new()
    path = tmp_path / "node5.json"
    keys.write_key_file(path, 5, {7: keys.public_key(7)})
    good = json.loads(path.read_text())
    assert read_key_file(path, 5).keyring.owner(keys.public_key(7)) == 7
    for edit, says in (
        ({"extra": 1}, "unknown key 'extra'"),
        ({"node": True}, "'node' is True"),
        ({"keys": {"x": keys.public_key(7)}}, "'keys.x[key]' is 'x'"),
        ({"keys": {"7": "short"}}, "'keys.7' is 'short'"),
    ):
        path.write_text(json.dumps(good | edit))
        with pytest.raises(AuthError, match=re.escape(f"key file {path}: {says}")):
            read_key_file(path, 5)
