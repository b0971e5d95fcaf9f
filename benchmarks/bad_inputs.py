"""The bad-input corpus: every file and flag a user hands checkfree, written wrong on purpose (issue 37).

    .venv/bin/python benchmarks/bad_inputs.py            # every case; a table, a summary line, exit 1 on a miss
    .venv/bin/python benchmarks/bad_inputs.py --only yaml    # the cases whose name holds "yaml"

Each case writes its files into a fresh directory and runs the real entry point there: ``checkfree.cli.main(argv)``
in a forked child (checkfree is imported once, in this process; each case is ``os.fork`` + ``os.wait4``, so its peak
resident memory is the child's ``ru_maxrss``), or a shell launcher through a subprocess. A case passes when

- the exit code is 2;
- the last non-empty line of stderr is one sentence (it ends with "." or ")"), and neither stream holds a
  Python traceback or an exception's name as a line;
- the case's directory (its inputs and any run directory in it) is byte-identical before and after (a tree hash);
- the child's peak RSS stays under 1 GiB (it includes what the parent had mapped at the fork, torch included) and
  it ends within 10 s (an alarm kills it at 10 s).

Cases marked ``needs`` name the engineer's change they wait for (the journal's checks); they are run and shown, and
counted apart: ``--strict`` counts them as misses too.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIME_LIMIT_S = 10.0
MEMORY_LIMIT_MIB = 1024.0
_EXCEPTION_LINE = re.compile(r"^\s*[A-Za-z_][\w.]*(Error|Exception|Interrupt)(:|$)")


@dataclass
class Case:
    """One bad input: the files it writes (name → text or bytes, in its own directory) and how it is run."""

    name: str
    what: str
    """The file or flag under test (the table groups by it)."""
    files: dict[str, str | bytes] = field(default_factory=dict)
    argv: list[str] | None = None
    """``checkfree`` arguments, run in-process in a forked child (relative paths are the case directory's)."""
    shell: list[str] | None = None
    """A launcher's command line instead, run with the case directory as the working directory."""
    env: dict[str, str] = field(default_factory=dict)
    prepare: Callable[[Path], None] | None = None
    """Builds more of the case directory (a run directory) after its files are written."""
    needs: str = ""
    """The change the case waits for ("R1: journal checks"), when it does not pass yet."""


@dataclass
class Result:
    case: Case
    code: int
    seconds: float
    peak_mib: float
    message: str
    misses: list[str]


# ---------------------------------------------------------------------------------------------- the inputs

TINY = json.loads((ROOT / "configs" / "tiny_config.json").read_text())
SWARM = {
    k: v
    for k, v in json.loads((ROOT / "configs" / "swarm_tiny.json").read_text()).items()
    if k != "description"
}
SIMULATE = ["simulate", "--setting", "checkfree", "--dry-run", "--run-dir", "run", "--config"]
SWARM_RUN = [
    "swarm",
    "run",
    "--setting",
    "ours",
    "--no-schedule",
    "--dry-run",
    "--run-dir",
    "run",
    "--config",
]


def _json(data: object) -> str:
    return json.dumps(data)  # NaN and Infinity as their bare tokens, as a hand-edited file may hold them


def _deep_json(depth: int) -> str:
    return '{"n_stages": 4, "x": ' + "[" * depth + "]" * depth + "}"


def _bomb(key: str, levels: int = 9) -> str:
    """A YAML "billion laughs": ``key`` refers to 9^levels strings through aliases."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        refs = ",".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    lines.append(f"{key}: *a{levels - 1}")
    return "\n".join(lines) + "\n"


def _first_latency(table: dict, value: object) -> dict:
    """The locations table with its first link's latency replaced by ``value``."""
    out = json.loads(json.dumps(table))
    out["links"][0]["latency_ms"] = value
    return out


def _yaml(data: dict) -> str:
    return "".join(f"{k}: {json.dumps(v)}\n" for k, v in data.items())  # JSON values are YAML flow values


def model_cases() -> list[Case]:
    """The model config (JSON and YAML) through ``simulate --dry-run``."""
    out: list[Case] = []

    def add(name: str, text: str | bytes, suffix: str = ".json", extra: tuple[str, ...] = ()) -> None:
        out.append(
            Case(f"model {name}", "model config", {f"c{suffix}": text}, [*SIMULATE, f"c{suffix}", *extra])
        )

    ints = ("n_stages", "dmodel", "num_heads", "mb_count", "batch_size", "seq_l", "max_iterations", "seed")
    for key in ints:
        for label, value in (("-1", -1), ("a string", "4"), ("true", True), ("1e29", 1e29), ("a list", [4])):
            add(f"{key} {label}", _json(TINY | {key: value}))
    for key, value in (
        ("n_stages", 1_000_000),
        ("n_stages", 1_000_000_000),
        ("mb_count", 10**9),
        ("dmodel", 10**12),
    ):
        add(f"{key} {value:.0e}", _json(TINY | {key: value}))
    add("vocab_size 10^15", _json(TINY | {"vocab_size": 10**15}))
    add("max_train_tokens 0", _json(TINY | {"max_train_tokens": 0}))
    for key in ("lr", "lr_scale", "grad_clip", "init_std"):
        for label, value in (("NaN", float("nan")), ("Infinity", float("inf")), ("0", 0), ("a string", "x")):
            add(f"{key} {label}", _json(TINY | {key: value}))
    for key, value in (("architecture", 5), ("architecture", "Mamba"), ("dataset", ""), ("dataset", [1])):
        add(f"{key} {value!r}", _json(TINY | {key: value}))
    for label, value in (("1.5", 1.5), ("a word", "often"), ("-0.1", -0.1), ("null", None)):
        add(f"failure key 16 {label}", _json(TINY | {"16": value}))
    add("unknown key", _json(TINY | {"dmdoel": 4}))
    add("no n_stages", _json({k: v for k, v in TINY.items() if k != "n_stages"}))
    add("a list at the top", "[1, 2]")
    add("not JSON", "{not json")
    add("empty file", "")
    add("not UTF-8", b"\xff\xfe{}")
    add("2 MiB", '{"n_stages": 4, "pad": "' + "x" * (2 << 20) + '"}')
    add("nested 100,000 deep", _deep_json(100_000))
    add("nested 33 deep", _deep_json(33))
    add("a directory", "", extra=())  # replaced by a directory in prepare (below)
    out[-1].files = {}
    out[-1].argv = [*SIMULATE, "adir"]
    out[-1].prepare = lambda d: (d / "adir").mkdir()
    add(
        "the --set value nested 100,000 deep",
        _json(TINY),
        extra=("--set", "dmodel=" + "[" * 100_000 + "]" * 100_000),
    )
    add("--set n_stages=1000000", _json(TINY), extra=("--set", "n_stages=1000000"))
    add("--set n_stages=1e29", _json(TINY), extra=("--set", "n_stages=1e29"))
    add("--set seed=-1", _json(TINY), extra=("--set", "seed=-1"))
    add("--set lr=NaN", _json(TINY), extra=("--set", "lr=NaN"))
    add("--set without =", _json(TINY), extra=("--set", "dmodel"))
    add("--set unknown key", _json(TINY), extra=("--set", "dmodle=3"))
    add("--set a huge value", _json(TINY), extra=("--set", "dataset=" + "x" * (2 << 20)))

    # YAML
    add("yaml alias bomb as lr", _bomb("lr") + _yaml({k: v for k, v in TINY.items() if k != "lr"}), ".yaml")
    add("yaml alias bomb under an unknown key", _yaml(TINY) + _bomb("bogus"), ".yaml")
    add(
        "yaml an anchor",
        _yaml(TINY | {"lr": 0.001}).replace("lr: 0.001", "lr: &x 0.001\nlr_scale: *x"),
        ".yaml",
    )
    add("yaml a merge key", "base: &b {dmodel: 64}\n<<: *b\nn_stages: 4\n", ".yaml")
    add("yaml nested 100,000 deep (flow)", "n_stages: 4\nx: " + "[" * 100_000 + "]" * 100_000 + "\n", ".yaml")
    add(
        "yaml nested 40 deep (block)",
        "n_stages: 4\n" + "".join(" " * i + f"k{i}:\n" for i in range(40)) + " " * 40 + "v: 1\n",
        ".yaml",
    )
    add("yaml a boolean key (yes:)", _yaml(TINY) + "yes: 1\n", ".yaml")
    add("yaml a boolean key (on:)", _yaml(TINY) + "on: 1\n", ".yaml")
    add("yaml a null key", _yaml(TINY) + "~: 1\n", ".yaml")
    add("yaml a list key", _yaml(TINY) + "? [a, b]\n: 1\n", ".yaml")
    add("yaml a python tag", _yaml(TINY) + "x: !!python/object/apply:os.system ['true']\n", ".yaml")
    add("yaml a tab", "n_stages: 4\nlr:\n\t0.1\n", ".yaml")
    add("yaml a list at the top", "- 1\n- 2\n", ".yaml")
    add("yaml a syntax error", "n_stages: [4\n", ".yaml")
    add("yaml n_stages 1e29", _yaml(TINY | {"n_stages": 1e29}), ".yaml")
    add("yaml lr .nan", _yaml(TINY).replace("lr: 0.002", "lr: .nan"), ".yaml")
    add("yaml seed -1 in a .YAML file", _yaml(TINY | {"seed": -1}), ".YAML")
    add("yaml two documents", _yaml(TINY) + "---\nn_stages: 5\n", ".yml")
    add("yaml 2 MiB", "n_stages: 4\npad: " + "x" * (2 << 20) + "\n", ".yaml")
    return out


def swarm_cases() -> list[Case]:
    """The swarm config (JSON and YAML) and ``--set`` through ``swarm run --dry-run``."""
    out: list[Case] = []

    def add(
        name: str, text: str, suffix: str = ".json", extra: tuple[str, ...] = (), more: dict | None = None
    ) -> None:
        files: dict[str, str | bytes] = {f"s{suffix}": text, **(more or {})}
        out.append(Case(f"swarm {name}", "swarm config", files, [*SWARM_RUN, f"s{suffix}", *extra]))

    for key, value in (
        ("crash_point", "half"),
        ("crash_point", 11),
        ("locations", 5),
        ("locations", [["Iowa"]]),
        ("locations", ["Atlantis"]),
        ("locations", ["Iowa"] * 5000),
        ("storage_location", ["Iowa"]),
        ("model_config", 5),
        ("model_config", "/nonexistent/dir/tiny_config.json"),
        ("seed", -1),
        ("seed", "abc"),
        ("seed", 2**64),
        ("time_scale", float("nan")),
        ("time_scale", -1),
        ("replicas", 0),
        ("replicas", True),
        ("replicas", 1e29),
        ("replicas", 2000),
        ("replicas", 1000),
        ("microbatches", 0),
        ("microbatches", 10**9),
        ("in_flight", 0),
        ("checkpoint_every", -1),
        ("max_attempts", 0),
        ("peer_timeout", float("inf")),
        ("peer_timeout", 0.5),
        ("heartbeat_interval", "x"),
        ("supervisor_grace", 0),
        ("data", "web"),
        ("eval_interval", -1),
        ("snapshot_every", "often"),
        ("locations_file", 3),
        ("bogus", 1),
    ):
        add(f"{key} {str(value)[:24]}", _json(SWARM | {key: value}))
    add("checkpoint_interval and checkpoint_every", _json(SWARM | {"checkpoint_interval": 3}))
    table = json.loads((ROOT / "checkfree" / "swarm" / "locations.json").read_text())
    for label, text in (
        ("a list", "[]"),
        ("nested 100,000 deep", "[" * 100_000 + "]" * 100_000),
        ("with a latency that is a word", _json(_first_latency(table, "slow"))),
        ("with a latency that is NaN", _json(_first_latency(table, float("nan")))),
        (
            "with a link to itself",
            _json(table | {"links": [{"a": "Iowa", "b": "Iowa", "latency_ms": 1, "bandwidth_gib_s": 1}]}),
        ),
        ("with an unknown key at the top", _json(table | {"comment": "x"})),
        ("with an unknown key in a link", _json(table | {"links": [table["links"][0] | {"jitter_ms": 1}]})),
        ("with a latency of an hour", _json(_first_latency(table, 3_600_000))),
        (
            "with a bandwidth of 1e12 GiB/s",
            _json(table | {"default": {"latency_ms": 1, "bandwidth_gib_s": 1e12}}),
        ),
        ("with an empty default_geo", _json(table | {"default_geo": []})),
    ):
        add(f"locations file {label}", _json(SWARM | {"locations_file": "loc.json"}), more={"loc.json": text})
    add(
        "locations file yaml alias bomb",
        _json(SWARM | {"locations_file": "loc.yaml"}),
        more={"loc.yaml": _bomb("bogus") + _yaml(table)},
    )
    add("a list at the top", "[]")
    add("nested 100,000 deep", _json(SWARM)[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    add("yaml nested 100,000 deep", _yaml(SWARM) + "x: " + "[" * 100_000 + "]" * 100_000 + "\n", ".yaml")
    add(
        "yaml alias bomb as replicas",
        _bomb("replicas") + _yaml({k: v for k, v in SWARM.items() if k != "replicas"}),
        ".yaml",
    )
    add("yaml time_scale .nan", _yaml(SWARM).replace("time_scale: 1.0", "time_scale: .nan"), ".yaml")
    add("yaml a boolean key", _yaml(SWARM) + "no: 3\n", ".yaml")
    model = {"m.yaml": _bomb("lr") + _yaml({k: v for k, v in TINY.items() if k != "lr"})}
    add("names a model config holding an alias bomb", _json(SWARM | {"model_config": "m.yaml"}), more=model)
    for label, value in (("1000000", 1_000_000), ("1000000000", 1_000_000_000), ("1e29", 1e29)):
        more = {"m.json": _json(TINY | {"n_stages": value})}
        add(
            f"names a model config with n_stages {label}",
            _json(SWARM | {"model_config": "m.json"}),
            more=more,
        )
    for label, item in (
        ("crash_point='\"x\"'", 'crash_point="x"'),
        ("replicas=1e29", "replicas=1e29"),
        ("replicas=[1]", "replicas=[1]"),
        ("time_scale=Infinity", "time_scale=Infinity"),
        ("locations=5", "locations=5"),
        ("seed=-1", "seed=-1"),
        ("unknown key", "bogus=1"),
        ("=3", "=3"),
        ("a value nested 100,000 deep", "locations=" + "[" * 100_000 + "]" * 100_000),
    ):
        add(f"--set {label}", _json(SWARM), extra=("--set", item))
    for text in ("4:99999999999999999999999", "a:b", "7:4", "4:7,5:9", "-1:3", "", "4:7:9", "4:7," * 10_000):
        add(f"--machines {text[:30]!r}", _json(SWARM), extra=("--machines", text))
    return out


def schedule_cases() -> list[Case]:
    """Crash schedules (``swarm run --schedule``, ``simulate --failure-schedule``) and traces."""
    out: list[Case] = []
    swarm = [*SWARM_RUN, str(ROOT / "configs" / "swarm_tiny.json")]
    swarm = [a for a in swarm if a != "--no-schedule"]
    for label, text in (
        ("a list", "[1, 2]"),
        ("a node id that is a word", '{"x": [1, 5]}'),
        ("crashes that are a word", '{"0": "abc"}'),
        ("crashes not ascending", '{"0": [5, 3, 9]}'),
        ("a node beyond the swarm", '{"99999999": [1, 5]}'),
        ("nested 100,000 deep", '{"0": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        ("2 MiB", '{"0": [' + ",".join(["1"] * (1 << 20)) + "]}"),
        ("not JSON", "{"),
        ("not UTF-8", b"\xff\xfe"),
        ("another format", '{"format": "checkfree-other-v1"}'),
        ("a downtime file without intervals", '{"format": "checkfree-slot-downtime-v1"}'),
        ("a crash at 1e29", '{"0": [1e29, 1e30]}'),
        ("a crash at a bool", '{"0": [true, 5]}'),
    ):
        out.append(
            Case(
                f"swarm schedule {label}",
                "schedule",
                {"sched.json": text},
                [*swarm, "--schedule", "sched.json"],
            )
        )
    kills = [*SWARM_RUN, str(ROOT / "configs" / "swarm_tiny.json"), "--recovery-kills", "kills.json"]
    for label, text in (
        ("a list", "[]"),
        (
            "nested 100,000 deep",
            '{"format": "checkfree-recovery-kills-v1", "kills": ' + "[" * 100_000 + "]" * 100_000 + "}",
        ),
        (
            "a kind that is not one",
            '{"format": "checkfree-recovery-kills-v1", "kills": [{"iteration": 1, "kind": "all"}]}',
        ),
        (
            "after_s NaN",
            '{"format": "checkfree-recovery-kills-v1", "kills": [{"iteration": 1, "kind": "source", "after_s": NaN}]}',
        ),
    ):
        out.append(Case(f"recovery kills {label}", "schedule", {"kills.json": text}, kills))
    sim = [*SIMULATE, str(ROOT / "configs" / "tiny_config.json"), "--failure-schedule"]
    for label, text in (
        ("a list", "[1]"),
        ("nested 100,000 deep", "[" * 100_000 + "]" * 100_000),
        ("stage failures that are words", '{"format": "checkfree-stage-failures-v1", "failures": "x"}'),
        ("not JSON", "}"),
    ):
        out.append(Case(f"simulate schedule {label}", "schedule", {"sched.json": text}, [*sim, "sched.json"]))
    gen = ["schedule", "--stages", "4", "--replicas", "2", "--iterations", "100", "--trace"]
    for label, text in (
        ("parcae lines not JSON", "{not json}\n"),
        ("bamboo not numbers", "time,node,event\nx,y,z\n"),
        ("a binary file", b"\x00\xff\x00\xff"),
        ("parcae nested 100,000 deep", "[" * 100_000 + "]" * 100_000 + "\n"),
        ("empty", ""),
        ("10 MiB", "0 up node1\n" * (1 << 20)),
    ):
        out.append(Case(f"trace {label}", "trace", {"trace.txt": text}, [*gen, "trace.txt"]))
    return out


def _finished_run(d: Path, throughput: object) -> None:
    (d / "run").mkdir()
    text = throughput if isinstance(throughput, str) else _json(throughput)
    (d / "run" / "throughput.json").write_text(text)


GOOD_ROW = {
    "setting": "ours",
    "iterations_completed": 3,
    "iterations_executed": 3,
    "crashes_count": 0,
    "recovered_count": 0,
    "mean_iteration_s": 1.0,
    "mean_iteration_s_without_crashes": 1.0,
    "mean_crash_to_serving_s": None,
    "tokens_per_s": 10.0,
    "loss_curve": [[0, 5.0]],
}


def run_file_cases() -> list[Case]:
    """throughput.json as ``swarm table`` reads it, summary.json as ``report`` reads it, revocations.json and
    join tokens."""
    out: list[Case] = []
    for label, data in (
        ("loss_curve a string", GOOD_ROW | {"loss_curve": "down"}),
        ("loss_curve of words", GOOD_ROW | {"loss_curve": [["a", "b"]]}),
        ("iterations_completed a word", GOOD_ROW | {"iterations_completed": "x"}),
        ("tokens_per_s a list", GOOD_ROW | {"tokens_per_s": [1]}),
        ("setting a number", GOOD_ROW | {"setting": 5}),
        ("a key missing", {k: v for k, v in GOOD_ROW.items() if k != "setting"}),
        ("a list", [GOOD_ROW]),
        ("not JSON", "{"),
        ("nested 100,000 deep", _json(GOOD_ROW)[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        ("nested 33 deep", _json(GOOD_ROW | {"x": json.loads("[" * 32 + "]" * 32)})),
    ):
        out.append(
            Case(
                f"swarm table throughput.json {label}",
                "throughput.json",
                {},
                ["swarm", "table", "run"],
                prepare=lambda d, data=data: _finished_run(d, data),
            )
        )
    for label, text in (
        ("a list", "[]"),
        ("not JSON", "{"),
        ("nested 100,000 deep", "[" * 100_000 + "]" * 100_000),
        ("status a number", '{"status": 5, "setting": "checkfree"}'),
        ("final_eval a string", '{"status": "completed", "final_eval": "good"}'),
        ("iterations -1", '{"status": "completed", "iterations": -1}'),
        ("world_size 0", '{"status": "completed", "world_size": 0}'),
    ):

        def prepare(d: Path, text: str = text) -> None:
            (d / "runs" / "a").mkdir(parents=True)
            (d / "runs" / "a" / "summary.json").write_text(text)
            (d / "runs" / "a" / "metrics.jsonl").write_text("")

        out.append(
            Case(
                f"report summary.json {label}",
                "summary.json",
                {},
                ["report", "runs/a", "--out", "rep"],
                prepare=prepare,
            )
        )

    def deep_metrics(d: Path) -> None:
        (d / "runs" / "a").mkdir(parents=True)
        lines = "[" * 100_000 + "]" * 100_000 + '\n{"kind": "eval", "iteration": 0, "val_loss": 5.0}\n'
        (d / "runs" / "a" / "metrics.jsonl").write_text(lines)

    report = ["report", "runs/a", "--out", "rep"]
    out.append(
        Case(
            "report metrics.jsonl a line nested 100,000 deep",
            "summary.json",
            {},
            report,
            prepare=deep_metrics,
        )
    )
    for label, text in (
        ("a list", "[1, 2]"),
        ("another format", '{"format": "x", "machines": [4]}'),
        ("machines a word", '{"format": "checkfree-swarm-revocations-v1", "machines": "4"}'),
        ("machines of bools", '{"format": "checkfree-swarm-revocations-v1", "machines": [true]}'),
        ("nested 100,000 deep", "[" * 100_000 + "]" * 100_000),
        ("not JSON", "{"),
    ):

        def prepare(d: Path, text: str = text) -> None:
            (d / "run" / "join_tokens").mkdir(parents=True)
            (d / "run" / "join_tokens" / "machine4.json").write_text("{}")
            (d / "run" / "revocations.json").write_text(text)

        out.append(
            Case(
                f"revoke revocations.json {label}",
                "revocations.json",
                {},
                ["swarm", "revoke", "run", "4"],
                prepare=prepare,
            )
        )

    def no_tokens(d: Path) -> None:
        (d / "run").mkdir()

    out.append(
        Case(
            "revoke a machine without a join token",
            "revocations.json",
            {},
            ["swarm", "revoke", "run", "4"],
            prepare=no_tokens,
        )
    )

    def supervisor_gone(d: Path) -> None:
        _journal_run(d)
        (d / "run" / "join_tokens").mkdir(mode=0o700)
        (d / "run" / "join_tokens" / "machine4.json").write_text("{}")
        (d / "run" / "join_tokens" / "machine4.json").chmod(0o600)

    revoke = ["swarm", "revoke", "run", "4"]
    out.append(
        Case("revoke a run whose supervisor is gone", "revocations.json", {}, revoke, prepare=supervisor_gone)
    )

    def ended(d: Path) -> None:
        supervisor_gone(d)
        _journal_run_edit(d, _set("status", "completed"))

    out.append(Case("revoke a run that ended", "revocations.json", {}, revoke, prepare=ended))
    token = {
        "version": 2,
        "bootstrap": "tcp://127.0.0.1:5555",
        "supervisor_key": "x" * 40,
        "machine": {"start": 4, "end": 7, "first": 11, "every": 2, "offset": 1},
        "machine_secret": "0" * 40,
    }
    tok = [*SWARM_RUN, str(ROOT / "configs" / "swarm_tiny.json"), "--join-token", "token.json"]
    for label, text in (
        ("a list", "[]"),
        ("not JSON", "{"),
        ("no bootstrap", _json({k: v for k, v in token.items() if k != "bootstrap"})),
        ("an old version", _json(token | {"version": 1})),
        ("machine a word", _json(token | {"machine": "four"})),
        ("machine_secret too short", _json(token | {"machine_secret": "abc"})),
        ("nested 100,000 deep", "[" * 100_000 + "]" * 100_000),
        ("2 MiB", _json(token | {"pad": "x" * (2 << 20)})),
        ("missing", None),
        ("a share whose offset is its stride", _json(token | {"machine": token["machine"] | {"offset": 2}})),
        (
            "a share of 10^30 nodes",
            _json(token | {"machine": token["machine"] | {"end": 10**30, "first": 10**30 + 1}}),
        ),
        ("a share beyond the swarm", _json(token | {"machine": token["machine"] | {"end": 11, "first": 12}})),
        ("a machine that is a bool", _json(token | {"machine": token["machine"] | {"start": True}})),
    ):
        files = {} if text is None else {"token.json": text}
        out.append(Case(f"join token {label}", "join token", files, tok))
    return out


def launcher_cases() -> list[Case]:
    """The shell launchers: a config path that does not exist, table2_6x2.sh's ONLY."""
    out = []
    run = str(ROOT / "simulate_training" / "run.sh")
    out.append(
        Case(
            "run.sh a config path that does not exist",
            "launcher",
            {},
            shell=["bash", run, "checkfree", "1", "16", "/nonexistent/dir/tiny_config.json", "0"],
            env={"DRY_RUN": "1"},
        )
    )
    run2 = str(ROOT / "simulate_training" / "run_2.sh")
    out.append(
        Case(
            "run_2.sh a config path that does not exist",
            "launcher",
            {},
            shell=["bash", run2, "checkfree", "1", "16", "/nonexistent/dir/tiny_config.json", "0"],
            env={"DRY_RUN": "1"},
        )
    )
    table2 = str(ROOT / "benchmarks" / "table2_6x2.sh")
    for label, only in (("[", "["), ("(", "("), ("a*{", "a*{99999999999}")):
        out.append(
            Case(
                f"table2_6x2.sh ONLY {label}",
                "launcher",
                {},
                shell=["bash", table2],
                env={"ONLY": only, "DRY_RUN": "1"},
            )
        )
    return out


@functools.cache
def _journal() -> dict:
    """A journal as a real supervisor writes it (a 2-replica tiny swarm, nothing started), built once; its
    supervisor (this process) is then marked gone, so that a resume reaches the checks of each case."""
    from checkfree import jsonio
    from checkfree.swarm.config import SwarmConfig
    from checkfree.swarm.supervisor.journal import JOURNAL_FILE
    from checkfree.swarm.supervisor.supervisor import Supervisor

    with tempfile.TemporaryDirectory(prefix="checkfree-bad-inputs-journal-") as tmp:
        cfg = SwarmConfig(model_config="tiny_config.json", replicas=2)
        sup = Supervisor(cfg, "ours", {}, iterations=9, run_dir=Path(tmp) / "run", vocab_size=300, options={})
        try:
            sup.journal.write("bad_inputs")
        finally:
            sup.transport.close()
        data = jsonio.loads((Path(tmp) / "run" / JOURNAL_FILE).read_text())
    data["supervisor"]["started"] += 1  # another process than this one: gone
    return data


def _journal_run(d: Path, edit: Callable[[dict, Path], object] | None = None, mode: int = 0o600) -> None:
    """``d/run`` with the journal of :func:`_journal` naming the config files in ``d`` (their digests as at the
    start), then ``edit(journal, d)`` (its return value, when not None, is written instead: text or an object)."""
    import copy

    from checkfree import jsonio
    from checkfree.swarm.supervisor.journal import JOURNAL_FILE, started_files

    data = copy.deepcopy(_journal())
    (d / "swarm.json").write_text(_json(SWARM))
    (d / "tiny.json").write_text(_json(TINY))
    data["options"].update(started_files(d / "swarm.json", d / "tiny.json", data["state"]["config"]))
    out = edit(data, d) if edit is not None else None
    run = d / "run"
    run.mkdir()
    text = out if isinstance(out, str) else jsonio.dumps(data if out is None else out)
    fd = os.open(run / JOURNAL_FILE, os.O_WRONLY | os.O_CREAT, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(run / JOURNAL_FILE, mode)


def _journal_run_edit(d: Path, edit: Callable[[dict, Path], object]) -> None:
    """Rewrite ``d/run``'s journal with ``edit`` applied (mode 0600 kept)."""
    from checkfree import jsonio

    path = d / "run" / "journal.json"
    data = jsonio.loads(path.read_text())
    edit(data, d)
    path.write_text(jsonio.dumps(data))


def _set(path: str, value: object) -> Callable[[dict, Path], None]:
    def edit(data: dict, d: Path) -> None:
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[last] = value

    return edit


def journal_cases() -> list[Case]:
    """``swarm run --resume`` over a journal edited by hand, made readable by others, or naming other configs
    (the journal's checks: checkfree.swarm.supervisor.journal)."""
    resume = ["swarm", "run", "--resume", "run"]
    out = []

    def add(name: str, edit: Callable[[dict, Path], object] | None = None, mode: int = 0o600) -> None:
        out.append(
            Case(
                f"resume journal {name}", "journal", {}, resume, prepare=lambda d: _journal_run(d, edit, mode)
            )
        )

    add("supervisor a list", _set("supervisor", []))
    add("processes mapping to ints", _set("processes", {"0": 5}))
    add("state {}", _set("state", {}))
    add("status a number", _set("status", 5))
    add("another format", _set("format", "checkfree-swarm-journal-v0"))
    add("an unknown key", _set("extra", 1))
    add("iterations -1", _set("options.iterations", -1))
    add("replicas 1e29 in its config", _set("state.config.replicas", 1e29))
    add("a list", lambda data, d: [])
    add("not JSON", lambda data, d: "{")
    add("nested 100,000 deep", lambda data, d: "[" * 100_000 + "]" * 100_000)
    add("world-readable (0644)", mode=0o644)
    add("group-writable (0620)", mode=0o620)
    add("the run ended", _set("status", "completed"))
    add("with no node alive")
    add(
        "naming a swarm config edited since",
        lambda data, d: (d / "swarm.json").write_text(_json(SWARM | {"replicas": 3})) and None,
    )
    add(
        "naming a model config edited since",
        lambda data, d: (d / "tiny.json").write_text(_json(TINY | {"lr": 0.1})) and None,
    )
    add("naming a swarm config that is gone", lambda data, d: (d / "swarm.json").unlink())
    add("whose resolved config was edited", _set("state.config.crash_point", 0.9))
    add("of an older checkfree (no digests)", lambda data, d: data["options"].pop("started_files") and None)

    def key_readable(d: Path) -> None:
        _journal_run(d)
        (d / "run" / "join_tokens").mkdir()
        (d / "run" / "join_tokens" / "machine4.json").write_text("{}")
        (d / "run" / "join_tokens" / "machine4.json").chmod(0o644)

    out.append(
        Case("resume journal beside a world-readable key file", "journal", {}, resume, prepare=key_readable)
    )

    def linked(d: Path) -> None:
        _journal_run(d)
        (d / "run" / "journal.json").rename(d / "elsewhere.json")
        (d / "run" / "journal.json").symlink_to(d / "elsewhere.json")

    out.append(Case("resume journal a symbolic link", "journal", {}, resume, prepare=linked))
    return out


def all_cases() -> list[Case]:
    return [
        *model_cases(),
        *swarm_cases(),
        *schedule_cases(),
        *run_file_cases(),
        *launcher_cases(),
        *journal_cases(),
    ]


# ---------------------------------------------------------------------------------------------- running them


def tree_hash(root: Path) -> str:
    """SHA-256 over every path, mode and file content under ``root`` (sorted)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for n in sorted(dirnames + filenames):
            p = Path(dirpath) / n
            st = p.lstat()
            h.update(f"{p.relative_to(root)}\0{st.st_mode}\0".encode())
            if p.is_file() and not p.is_symlink():
                h.update(p.read_bytes())
    return h.hexdigest()


def _child(case: Case, d: Path, out_path: Path, err_path: Path) -> None:
    """In the forked child: run ``checkfree.cli.main`` with stdout/stderr into files; never returns."""
    code = 1
    try:
        os.chdir(d)
        for fd, path in ((1, out_path), (2, err_path)):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(f, fd)
            os.close(f)
        sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), line_buffering=True)
        sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), line_buffering=True)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(int(TIME_LIMIT_S) + 1)
        os.environ.update(case.env)
        from checkfree.cli import main

        code = main(case.argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 (the case's verdict: a traceback is what the corpus looks for)
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


def run_case(case: Case, base: Path) -> Result:
    """Write the case's files, run it, and judge it (see the module docstring)."""
    d = Path(tempfile.mkdtemp(prefix=re.sub(r"[^A-Za-z0-9._-]+", "_", case.name)[:60] + "-", dir=base))
    for name, text in case.files.items():
        (d / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    if case.prepare is not None:
        case.prepare(d)
    before = tree_hash(d)
    out_path, err_path = base / "stdout", base / "stderr"
    t0 = time.monotonic()
    if case.argv is not None:
        pid = os.fork()
        if pid == 0:
            _child(case, d, out_path, err_path)
        _, status, usage = os.wait4(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        peak = usage.ru_maxrss / 1024
    else:
        assert case.shell is not None
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            p = subprocess.Popen(
                case.shell, cwd=d, stdout=out, stderr=err, env=os.environ | case.env, start_new_session=True
            )
        timer = threading.Timer(TIME_LIMIT_S + 5, os.killpg, (p.pid, signal.SIGKILL))
        timer.start()
        _, status, usage = os.wait4(p.pid, 0)  # its usage includes the processes it waited for (its python)
        timer.cancel()
        p.returncode = code = os.waitstatus_to_exitcode(status)
        peak = usage.ru_maxrss / 1024
    seconds = time.monotonic() - t0
    stdout = out_path.read_text(errors="replace")
    stderr = err_path.read_text(errors="replace")
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else ""
    misses = []
    if code != 2:
        misses.append(f"exit {code}")
    if "Traceback" in stdout + stderr or any(
        _EXCEPTION_LINE.match(ln) for ln in (stdout + stderr).splitlines()
    ):
        misses.append("a traceback")
    if not last.endswith((".", ")")):
        misses.append("the last line is not a sentence")
    if tree_hash(d) != before:
        misses.append("the directory changed")
    if peak >= MEMORY_LIMIT_MIB:
        misses.append(f"peak {peak:.0f} MiB")
    if seconds >= TIME_LIMIT_S:
        misses.append(f"{seconds:.1f} s")
    return Result(case, code, seconds, peak, last, misses)


def _warm() -> None:
    """Import and build once, in this process, what every case needs (the parser, the schemas): each forked case
    then starts from it instead of building it again."""
    import checkfree.config as model_config
    import checkfree.schemas.revocations  # noqa: F401
    import checkfree.schemas.run_files  # noqa: F401
    import checkfree.sim.launch  # noqa: F401
    import checkfree.swarm.config as swarm_config
    import checkfree.swarm.supervisor.journal  # noqa: F401
    import checkfree.swarm.supervisor.supervisor  # noqa: F401
    from checkfree.cli import build_parser

    build_parser()
    model_config._schema()
    swarm_config._schema()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="only the cases whose name holds this text")
    parser.add_argument(
        "--strict", action="store_true", help="count the cases that wait for another change too"
    )
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)
    cases = [c for c in all_cases() if args.only in c.name]
    if args.list:
        for c in cases:
            print(f"{c.what:18} {c.name}")
        print(f"{len(cases)} cases")
        return 0
    _warm()

    results = []
    with tempfile.TemporaryDirectory(prefix="checkfree-bad-inputs-") as tmp:
        for case in cases:
            r = run_case(case, Path(tmp))
            results.append(r)
            mark = "ok  " if not r.misses else ("WAIT" if case.needs and not args.strict else "MISS")
            print(
                f"{mark} {case.name[:58]:58} exit {r.code:3} {r.seconds:5.2f} s {r.peak_mib:6.0f} MiB  "
                f"{r.message[:150]}{'  <- ' + ', '.join(r.misses) if r.misses else ''}"
                f"{'  (' + case.needs + ')' if r.misses and case.needs else ''}",
                flush=True,
            )
    missed = [r for r in results if r.misses and (args.strict or not r.case.needs)]
    waiting = [r for r in results if r.misses and r.case.needs and not args.strict]
    worst_s = max((r.seconds for r in results), default=0.0)
    worst_mib = max((r.peak_mib for r in results), default=0.0)
    print(
        f"{len(results)} cases over {len({r.case.what for r in results})} kinds of input: "
        f"{len(results) - len(missed) - len(waiting)} refused as they should be, {len(missed)} missed, "
        f"{len(waiting)} waiting for another change; slowest {worst_s:.2f} s, largest peak {worst_mib:.0f} MiB."
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
