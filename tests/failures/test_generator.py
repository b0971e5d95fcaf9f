"""The failure_generator.py CLI: defaults reproduce the shipped schedules; it writes only --out."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from checkfree.failures.schedules import format_node_schedule, generate_node_schedule

from helpers import ROOT

# Load the root-level script by path: it is not a package module and the repo root may not be on sys.path.
_spec = importlib.util.spec_from_file_location("failure_generator", ROOT / "failure_generator.py")
failure_generator = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(failure_generator)


@pytest.mark.parametrize("rate", ["5", "10", "16", "33"])
def test_committed_configs_are_reproducible_from_the_generator(rate, tmp_path):
    out = tmp_path / f"{rate}.json"
    assert failure_generator.main(["--rate", rate, "--out", str(out)]) == 0
    assert out.read_bytes() == (ROOT / "failure_p_configs" / f"{rate}.json").read_bytes()


def test_explicit_paper_arguments_equal_defaults(tmp_path):
    out = tmp_path / "16.json"
    argv = [
        "--rate",
        "16",
        "--stages",
        "6",
        "--replicas",
        "3",
        "--iterations",
        "500",
        "--seed",
        "33",
        "--stage-seed",
        "80",
        "--checkpoint-every",
        "100",
        "--out",
        str(out),
    ]
    assert failure_generator.main(argv) == 0
    nodes = json.loads(out.read_text())
    assert [n for n, v in nodes.items() if v != [501]] == ["9", "10", "11"] and nodes["9"] == [395, 501]


def test_stdout_when_no_out_and_nothing_written(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["--rate", "10", "--stages", "4", "--replicas", "2", "--probability", "0.1", "--iterations", "40"]
    assert failure_generator.main(argv) == 0
    printed = capsys.readouterr().out
    expected = generate_node_schedule(10, n_stages=4, replicas=2, probability=0.1, iterations=40)
    assert printed == format_node_schedule(expected) + "\n"
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_every_zero_disables_the_skip(capsys):
    argv = ["--rate", "16", "--probability", "0.9", "--checkpoint-every", "0", "--iterations", "50"]
    assert failure_generator.main(argv) == 0
    nodes = json.loads(capsys.readouterr().out)
    assert any(1 in v for v in nodes.values())


def test_the_old_name_checkpoint_interval_is_read_with_a_note(capsys, caplog):
    base = ["--rate", "16", "--probability", "0.9", "--iterations", "50"]
    outputs = {}
    for flag in ("--checkpoint-every", "--checkpoint-interval", None):
        caplog.clear()
        assert failure_generator.main([*base, *((flag, "7") if flag else ())]) == 0
        outputs[flag] = (capsys.readouterr().out, caplog.text)
    assert outputs["--checkpoint-interval"][0] == outputs["--checkpoint-every"][0] != outputs[None][0]
    note = "--checkpoint-interval is now called --checkpoint-every; read as --checkpoint-every 7."
    assert note in outputs["--checkpoint-interval"][1] and note not in outputs["--checkpoint-every"][1]


def test_bad_argument_is_one_error_line_not_a_traceback(tmp_path, capsys):
    out = tmp_path / "x.json"
    assert failure_generator.main(["--rate", "16", "--stages", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("failure_generator.py: error: n_stages 0 is invalid") and err.count("\n") == 1
    assert not out.exists()


def test_runs_as_a_script():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "failure_generator.py"), "--rate", "33"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (ROOT / "failure_p_configs" / "33.json").read_text() + "\n"


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(argv, capture_output=True, timeout=60, cwd=cwd, env=env)


@pytest.mark.parametrize(
    "options",
    [
        ["--rate", "7.5", "--stages", "4", "--replicas", "2", "--iterations", "300", "--seed", "5"],
        ["--rate", "33", "--probability", "0.2", "--checkpoint-interval", "0", "--stage-seed", "9"],
    ],
)
def test_schedule_subcommand_equals_the_generator_byte_for_byte(options, tmp_path):
    script = _run([sys.executable, str(ROOT / "failure_generator.py"), *options], tmp_path)
    sub = _run([sys.executable, "-m", "checkfree", "schedule", *options], tmp_path)
    assert script.returncode == sub.returncode == 0, (script.stderr, sub.stderr)
    assert sub.stdout == script.stdout and len(sub.stdout) > 100
    a, b = tmp_path / "script.json", tmp_path / "sub.json"
    assert (
        _run(
            [sys.executable, str(ROOT / "failure_generator.py"), *options, "--out", str(a)], tmp_path
        ).returncode
        == 0
    )
    assert (
        _run([sys.executable, "-m", "checkfree", "schedule", *options, "--out", str(b)], tmp_path).returncode
        == 0
    )
    assert a.read_bytes() == b.read_bytes() == script.stdout.rstrip(b"\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["script.json", "sub.json"]  # nothing else written


def test_schedule_subcommand_and_generator_share_every_option():
    from checkfree.cli import build_parser

    def options(parser) -> dict[str, tuple]:
        return {
            a.option_strings[-1]: (a.default, a.type, a.required)
            for a in parser._actions
            if a.option_strings and a.dest != "help"
        }

    generator = argparse.ArgumentParser()
    failure_generator.add_arguments(generator)
    sub = build_parser()._subparsers._group_actions[0].choices["schedule"]
    assert options(sub) == options(generator) and "--rate" in options(sub)


def test_schedule_subcommand_bad_option_is_one_sentence(tmp_path):
    done = _run([sys.executable, "-m", "checkfree", "schedule", "--rate", "16", "--stages", "0"], tmp_path)
    assert done.returncode == 2 and done.stdout == b""
    assert done.stderr.decode().strip() == (
        "checkfree schedule: error: n_stages 0 is invalid: expected an integer in 1..100000."
    )


def test_every_subcommand_named_in_the_help_exists():
    from checkfree.cli import build_parser

    parser = build_parser()
    names = set(parser._subparsers._group_actions[0].choices)
    usage = parser.description.replace("`", "").split("checkfree", 1)[1]
    named = {w.strip(" .|") for w in usage.split("|")}
    assert named == names == {"simulate", "schedule", "swarm", "report", "export", "generate", "probe"}
