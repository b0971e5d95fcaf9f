"""A resume trusts nothing it reads (checkfree.swarm.supervisor.journal, .journal_schema): the journal and the run's
key files must be private to their user, the journal must fit its schema field by field, and the config it names
must be the one the run started with; each refusal is one sentence (``swarm run --resume`` exits 2)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from checkfree import jsonio
from checkfree.cli import build_parser
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.supervisor import journal as J
from checkfree.swarm.supervisor.journal import (
    JOURNAL_FILE,
    JournalError,
    check_options,
    check_started_files,
    read_journal,
    started_files,
    write_atomic,
)
from checkfree.swarm.supervisor.supervisor import Supervisor

from helpers.cli import assert_user_error, run_cli


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A journal as a real supervisor writes it (a 2-replica tiny swarm, nothing started), with the digests of
    the config files it started from."""
    tmp = tmp_path_factory.mktemp("journal")
    (tmp / "swarm.json").write_text(json.dumps({"model_config": "tiny_config.json", "replicas": 2}))
    cfg = SwarmConfig(model_config="tiny_config.json", replicas=2)
    model = Path(__file__).resolve().parents[3] / "configs" / "tiny_config.json"
    options = {"iterations": 9, "setting": "ours"} | started_files(tmp / "swarm.json", model, cfg.to_json())
    sup = Supervisor(cfg, "ours", {}, iterations=9, run_dir=tmp / "run", vocab_size=300, options=options)
    try:
        sup.journal.write("a test")
    finally:
        sup.transport.close()
    return jsonio.loads((tmp / "run" / JOURNAL_FILE).read_text())


def _write(run: Path, data: dict) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    write_atomic(run / JOURNAL_FILE, jsonio.dumps(data))
    return run / JOURNAL_FILE


def _edited(journal: dict, path: str, value: object) -> dict:
    data = copy.deepcopy(journal)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return data


def test_a_journal_as_written_reads_back(tmp_path: Path, journal: dict) -> None:
    _write(tmp_path, journal)
    assert read_journal(tmp_path) == journal
    check_started_files(journal, tmp_path)
    check_options(journal["options"], build_parser_run(), "j")


@pytest.mark.parametrize(
    "path, value, says",
    [
        ("supervisor", [1, 2], "'supervisor' is [1, 2]"),  # was an AttributeError
        ("processes", {"3": 5}, "'processes.3' is 5"),  # was a TypeError
        ("state", {}, "'state.setting' is missing"),  # was a KeyError
        ("port", "5555", "'port' is '5555'"),
        ("port", 70000, "'port' is 70000"),
        ("status", "paused", "'status' is 'paused'"),
        ("resumes", True, "'resumes' is True"),  # a bool is no count
        ("processes", {"3": [-1, 5]}, "'processes.3[0]' is -1"),  # kill(-1) would signal everything
        ("state.iteration", -1, "'state.iteration' is -1"),
        ("state.roster.slots", [], "'state.roster.slots' is []"),
        ("state.roster.next_id", 1.5, "'state.roster.next_id' is 1.5"),
        (
            "state.current",
            {"number": 1, "iteration": 0, "members": {"0": ["x"]}, "phase": "over"},
            "'state.current.members.0[0]' is 'x'",
        ),  # fmt: skip
        ("intent", {"attempt": 1}, "'intent.iteration' is missing"),
        ("swarm_secret", "short", "'swarm_secret' is 'short'"),
        ("address", "http://x", "'address' is 'http://x'"),
        ("extra", 1, "unknown key 'extra'"),
        ("state", KeyError, "the field 'state' is missing"),
    ],
)
def test_a_journal_off_its_schema_is_one_sentence_naming_the_field(
    tmp_path: Path, journal: dict, path: str, value: object, says: str
) -> None:
    file = _write(tmp_path, _edited(journal, path, value))
    with pytest.raises(JournalError) as err:
        read_journal(tmp_path)
    text = str(err.value)
    assert text.startswith(str(file)) and says in text and "expected" in text and "\n" not in text


def test_a_journal_too_large_or_too_deep_is_refused_unparsed(
    tmp_path: Path, journal: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = _edited(journal, "results.deep", json.loads("[" * 40 + "]" * 40))
    _write(tmp_path, deep)
    with pytest.raises(JournalError, match="nested deeper than 32"):
        read_journal(tmp_path)
    _write(tmp_path, journal)
    size = (tmp_path / JOURNAL_FILE).stat().st_size
    monkeypatch.setattr(J, "MAX_JOURNAL_BYTES", size - 1)
    with pytest.raises(JournalError, match=f"larger than {size - 1:,} bytes"):
        read_journal(tmp_path)
    monkeypatch.setattr(J, "MAX_JOURNAL_BYTES", size)  # the limit itself is read
    assert read_journal(tmp_path) == journal


def test_a_journal_or_key_file_others_may_read_is_refused_with_the_command_that_fixes_it(
    tmp_path: Path, journal: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = _write(tmp_path, journal)
    for mode in (0o644, 0o640, 0o604, 0o620, 0o602):  # every bit of group and others counts
        os.chmod(file, mode)
        with pytest.raises(JournalError, match=f"has mode {mode:04o}") as err:
            read_journal(tmp_path)
        assert f"run `chmod 600 {file}`" in str(err.value)
    os.chmod(file, 0o400)
    assert read_journal(tmp_path) == journal  # owner-only is enough
    os.chmod(file, 0o600)
    for folder, name in (("keys", "node3.json"), ("join_tokens", "machine4.json")):
        key = tmp_path / folder / name
        key.parent.mkdir()
        write_atomic(key, "{}")
        os.chmod(key, 0o644)
        with pytest.raises(JournalError, match=f"`chmod 600 {key}`"):
            read_journal(tmp_path)
        os.chmod(key, 0o600)
    assert read_journal(tmp_path) == journal
    monkeypatch.setattr(J.os, "getuid", lambda: os.stat(file).st_uid + 1)  # another user's journal
    with pytest.raises(JournalError, match=f"owned by uid {os.stat(file).st_uid}, not by this user"):
        read_journal(tmp_path)


def test_a_journal_that_is_a_symbolic_link_is_refused(tmp_path: Path, journal: dict) -> None:
    real = _write(tmp_path / "elsewhere", journal)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / JOURNAL_FILE).symlink_to(real)
    with pytest.raises(JournalError, match="not a regular file"):
        read_journal(tmp_path / "run")


def test_a_journal_naming_another_config_or_a_changed_file_is_refused(tmp_path: Path, journal: dict) -> None:
    files = journal["options"]["started_files"]
    edited = _edited(journal, "state.config.replicas", 3)  # the journal edited to train on another config
    with pytest.raises(JournalError, match="not the one the run started with"):
        check_started_files(edited, tmp_path)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"model_config": "tiny_config.json", "replicas": 3}))
    edited = copy.deepcopy(journal)
    edited["options"]["started_files"]["config"]["path"] = str(other)  # names another config file
    with pytest.raises(JournalError, match=f"the config {other} changed since the run"):
        check_started_files(edited, tmp_path)
    swarm = Path(files["config"]["path"])
    kept = swarm.read_text()
    try:
        swarm.write_text(kept.replace("2", "4"))  # the file itself changed
        with pytest.raises(JournalError, match="changed since the run"):
            check_started_files(journal, tmp_path)
        swarm.unlink()
        with pytest.raises(JournalError, match="cannot be read"):
            check_started_files(journal, tmp_path)
    finally:
        swarm.write_text(kept)
    check_started_files(journal, tmp_path)
    older = copy.deepcopy(journal)
    del older["options"]["started_files"]
    with pytest.raises(JournalError, match="holds no digest of the config"):
        check_started_files(older, tmp_path)


def build_parser_run():
    from checkfree.swarm import cli

    build_parser()
    assert cli._RUN_PARSER is not None
    return cli._RUN_PARSER


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("iterations", "many", "options.iterations is 'many'; expected an integer"),
        ("iterations", True, "options.iterations is True"),
        ("time_scale", float("nan"), "options.time_scale is nan; expected a finite number"),
        ("insecure", "yes", "options.insecure is 'yes'; expected true or false"),
        ("set", "lr=1", "options.set is 'lr=1'; expected a list of strings"),
        ("device", "tpu", "options.device is 'tpu'; expected one of"),
        ("run_dir", 5, "options.run_dir is 5; expected a string"),
        ("evil", 1, "options.evil is no option of `swarm run`"),
        ("schedule_sha256", 5, "options.schedule_sha256 is 5; expected str"),
    ],
)
def test_journaled_options_must_be_what_the_parser_could_produce(key: str, value: object, says: str) -> None:
    with pytest.raises(JournalError, match="^j: " + says.replace("(", r"\(").replace(")", r"\)")):
        check_options({"iterations": 9, key: value}, build_parser_run(), "j")


def test_swarm_run_resume_refuses_each_in_one_sentence_exit_2(tmp_path: Path, journal: dict, capsys) -> None:
    for name, data, says in [
        ("list", _edited(journal, "supervisor", []), "'supervisor' is []"),
        ("ints", _edited(journal, "processes", {"3": 7}), "'processes.3' is 7"),
        ("empty", _edited(journal, "state", {}), "'state.setting' is missing"),
        ("config", _edited(journal, "state.config.lr", 1.0), "not the one the run started with"),
        ("options", _edited(journal, "options.iterations", "many"), "options.iterations is 'many'"),
    ]:
        _write(tmp_path / name, data)
        rc, _, err = run_cli(["swarm", "run", "--resume", str(tmp_path / name)], capsys)
        assert_user_error(rc, err, says)
    os.chmod(tmp_path / "list" / JOURNAL_FILE, 0o644)
    rc, _, err = run_cli(["swarm", "run", "--resume", str(tmp_path / "list")], capsys)
    assert_user_error(rc, err, f"chmod 600 {tmp_path / 'list' / JOURNAL_FILE}")
