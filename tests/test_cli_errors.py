"""Every entry point answers a user mistake with exit code 2, one line on stderr and no traceback.

The tables are run in-process through each entry point's ``main`` (an unexpected exception would fail the test
with its traceback); the shell launchers and one ``python -m checkfree`` call run as real processes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT
from helpers.cli import assert_user_error, run_cli, simulate_argv

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    """Named bad inputs: a plain file, a binary config, bad JSON, a checkpoint with a null field, …"""
    (tmp_path / "a_file").write_text("not a directory")
    (tmp_path / "binary.json").write_bytes(b"\x00\x01\xff\xfe")
    (tmp_path / "broken.json").write_text('{"dmodel": ')
    (tmp_path / "list.json").write_text("[1, 2]")
    tiny = json.loads((ROOT / "configs" / "tiny_config.json").read_text())
    (tmp_path / "no_stages.json").write_text(json.dumps({k: v for k, v in tiny.items() if k != "n_stages"}))
    base = {"format": "checkfree-universal-v2", "iteration": 4, "effective_iteration": 4, "n_stages": 4}
    base |= {"n_layers_per_stage": 1, "files": {}}
    for name, change in (("iter_0000004", {"iteration": None}), ("iter_0000005", {"n_stages": "4"})):
        ckpt = tmp_path / "run" / "checkpoints" / name
        ckpt.mkdir(parents=True)
        meta = json.dumps(base | change).encode()  # checksummed: only the types are wrong
        (ckpt / "meta.json").write_bytes(meta)
        (ckpt / "meta.sha256").write_text(hashlib.sha256(meta).hexdigest())
    (tmp_path / "nodes.json").write_text(json.dumps({"0": [3, 9], "1": [3, 9]}))
    downtime = {"format": "checkfree-slot-downtime-v1", "stages": 12, "replicas": 2, "iterations": 9}
    (tmp_path / "trace_12x2.json").write_text(json.dumps(downtime | {"iteration_seconds": 300, "slots": {}}))
    (tmp_path / "stage_format.json").write_text(json.dumps({"format": "checkfree-stage-failures-v1"}))
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "sw_bad").mkdir()
    (tmp_path / "sw_bad" / "throughput.json").write_text("{not json")
    (tmp_path / "sw_partial").mkdir()
    (tmp_path / "sw_partial" / "throughput.json").write_text('{"setting": "ours"}')
    (tmp_path / "no_ckpt").mkdir()
    (tmp_path / "no_ckpt" / "summary.json").write_text("{}")
    names = [
        "a_file",
        "binary.json",
        "broken.json",
        "list.json",
        "no_stages.json",
        "nodes.json",
        "empty_dir",
        "foreign",
        "model",
    ]
    names += ["sw_bad", "sw_partial", "no_ckpt", "trace_12x2.json", "stage_format.json"]
    out = {n: str(tmp_path / n) for n in names}
    out.update(missing=str(tmp_path / "missing"), new=str(tmp_path / "new"), tmp=str(tmp_path))
    out.update(
        ckpt=str(tmp_path / "run/checkpoints/iter_0000004"),
        ckpt5=str(tmp_path / "run/checkpoints/iter_0000005"),
    )
    return out


def _fill(args: list[str], files: dict[str, str]) -> list[str]:
    return [files[a[1:]] if a.startswith("@") else a for a in args]


SIMULATE = {
    "cuda without CUDA": (["--device", "cuda"], "--device cuda"),
    "run dir is a file": (["--run-dir", "@a_file"], "is a file"),
    "cache dir is a file": (["--cache-dir", "@a_file"], "--cache-dir"),
    "runs root is a file": (["--runs-root", "@a_file"], "--runs-root"),
    "binary config": (["--config", "@binary.json"], "binary.json is not a text file"),
    "config not JSON": (["--config", "@broken.json"], "is not valid JSON"),
    "config not an object": (["--config", "@list.json"], "expected a JSON object"),
    "config missing": (["--config", "@missing"], "not found"),
    "config without n_stages": (["--config", "@no_stages.json"], "has no 'n_stages'"),
    "seed above 2^63": (["--seed", str(2**64)], "argument --seed"),
    "seed not a number": (["--seed", "x"], "argument --seed"),
    "unknown setting": (["--setting", "ours-magic"], "unknown setting 'ours-magic'"),
    "negative iterations": (["--max-iterations", "-1"], "'max_iterations' is -1"),
    "probability 1": (["--failure-probability", "1.0"], "[0, 1)"),
    "probability NaN": (["--failure-probability", "nan"], "failure probability"),
    "config probability 1": (["--set", "16=1.0"], "[0, 1)"),
    "rate 100 %/h": (["--rate", "100"], "failure rate 100"),
    "iteration seconds 0": (["--iteration-seconds", "0"], "--iteration-seconds"),
    "world size without torchrun": (["--world-size", "2"], "WORLD_SIZE is 2"),
    "checkpoint meta with a null": (["--resume-from", "@ckpt"], "'iteration' = None"),
    "checkpoint meta with a string": (
        ["--resume-from", "@ckpt5"],
        "'n_stages' = '4'; expected a positive integer",
    ),
    "resume path missing": (["--resume-from", "@missing"], "does not exist"),
    "malformed --set": (["--set", "dmodel"], "--set 'dmodel' is malformed"),
    "unknown config key": (["--set", "dmodle=3"], "unknown key 'dmodle'"),
    "node schedule without replicas": (["--failure-schedule", "@nodes.json"], "needs replicas"),
    "schedule is a directory": (["--failure-schedule", "@empty_dir"], "does not exist"),
    "max wall iterations 0": (["--max-wall-iterations", "0"], "--max-wall-iterations"),
    "stage 0 with checkfree": (["--fail-stage0"], "cannot recover stage 0"),
    "model beyond memory": (
        ["--set", "dmodel=65536", "--set", "n_layers_per_stage=1024"],
        "this run needs about",
    ),
    "model beyond the bounds": (["--set", "dmodel=1000000000"], "expected a positive integer ≤ 65,536"),
}


@pytest.mark.parametrize("case", SIMULATE)
def test_simulate_bad_inputs(case, files, capsys):
    extra, fragment = SIMULATE[case]
    argv = simulate_argv(Path(files["new"]), *_fill(extra, files))
    if "--runs-root" in argv:  # the default run directory under --runs-root: no --run-dir
        i = argv.index("--run-dir")
        argv = argv[:i] + argv[i + 2 :]
    rc, _, err = run_cli(argv, capsys)
    assert_user_error(rc, err, fragment)
    assert not Path(files["new"]).exists()


SWARM_RUN = {
    "config missing": (["--config", "@missing"], "not found"),
    "negative time scale": (["--set", "time_scale=-1"], "'time_scale' is -1"),
    "port out of range": (["--port", "70000"], "--port is 70000"),
    "END below START": (["--start", "5", "--end", "3"], "START 5 .. END 3"),
    "no iterations": (["--iterations", "0"], "--iterations is 0"),
    "run dir is a file": (["--run-dir", "@a_file"], "is a file"),
    "run dir holds files": (["--run-dir", "@foreign"], "already holds a run"),
    "cache dir is a file": (["--cache-dir", "@a_file"], "--cache-dir"),
    "schedule missing": (["--schedule", "@missing"], "does not exist"),
    "schedule not JSON": (["--schedule", "@broken.json"], "is not valid JSON"),
    "paper schedule on the tiny swarm": (["--rate", "16"], "names nodes 10..20"),
    "trace schedule for 12 × 2 on the tiny swarm": (
        ["--schedule", "@trace_12x2.json"],
        "maps 12 stages × 2 replicas, but the swarm of swarm_tiny.json has 4 transformer stages × 2 replicas",
    ),
    "a simulator stage schedule": (["--schedule", "@stage_format.json"], "a swarm replays"),
    "unknown setting": (["--setting", "magic"], "argument --setting"),
    "cuda without CUDA": (["--device", "cuda"], "--device cuda was given, but torch sees no CUDA device"),
    "gpus with the cpu": (["--device", "cpu", "--gpus", "0"], "--gpus 0 was given with --device cpu"),
    "gpus without CUDA": (["--gpus", "1"], "--gpus 1 was given, but torch sees no CUDA device"),
    "unknown device": (["--device", "tpu"], "argument --device"),
}


@pytest.mark.parametrize("case", SWARM_RUN)
def test_swarm_run_bad_inputs(case, files, capsys, monkeypatch):
    monkeypatch.setattr("checkfree.swarm.devices.cuda_device_count", lambda: 0)  # the same on a GPU machine
    extra, fragment = SWARM_RUN[case]
    argv = ["swarm", "run", "--setting", "ours", "--config", "swarm_tiny.json", "--run-dir", files["new"]]
    if not any(a in extra for a in ("--schedule", "--rate")):
        argv.append("--no-schedule")
    rc, _, err = run_cli([*argv, *_fill(extra, files), "--dry-run"], capsys)
    assert_user_error(rc, err, fragment)
    assert not Path(files["new"]).exists()


TABLE = {
    "no throughput.json": (["@missing"], "does not exist"),
    "throughput.json not JSON": (["@sw_bad"], "is not valid JSON"),
    "throughput.json partial": (["@sw_partial"], "lacks ["),
}


@pytest.mark.parametrize("case", TABLE)
def test_swarm_table_bad_inputs(case, files, capsys):
    extra, fragment = TABLE[case]
    rc, _, err = run_cli(["swarm", "table", *_fill(extra, files)], capsys)
    assert_user_error(rc, err, fragment)


REPORT = {
    "target NaN": (["--target-loss", "nan"], "argument --target-loss"),
    "target negative": (["--target-loss", "-1"], "argument --target-loss"),
    "target zero": (["--target-loss", "0"], "argument --target-loss"),
    "target a word": (["--target-loss", "low"], "argument --target-loss"),
    "out is a file": (["--out", "@a_file"], "is a file"),
    "out holds other files": (["--out", "@foreign"], "without checkfree_report.json"),
    "iteration seconds 0": (["--iteration-seconds", "0"], "argument --iteration-seconds"),
    "nothing usable": ([], "no usable run directory"),
}


@pytest.mark.parametrize("case", REPORT)
def test_report_bad_inputs(case, files, capsys):
    extra, fragment = REPORT[case]
    argv = ["report", files["empty_dir"], "--out", files["new"], *_fill(extra, files)]
    rc, _, err = run_cli(argv, capsys)
    assert_user_error(rc, err, fragment)
    assert Path(files["foreign"], "notes.txt").read_text() == "mine"


EXPORT = {
    "run dir missing": (["@missing"], "has no summary.json"),
    "no checkpoint": (["@no_ckpt"], "has no checkpoint"),
    "out is a file": (["@no_ckpt", "--out", "@a_file"], "is a file"),
    "out holds other files": (["@no_ckpt", "--out", "@foreign"], "without checkfree_export.json"),
    "tokenizer points at nothing": (["@no_ckpt", "--tokenizer", "@missing"], None),
    "checkpoint missing": (["@no_ckpt", "--checkpoint", "@missing"], "does not exist"),
}


@pytest.mark.parametrize("case", EXPORT)
def test_export_bad_inputs(case, files, capsys):
    extra, fragment = EXPORT[case]
    argv = ["export", *_fill(extra, files)]
    if "--out" not in argv:
        argv += ["--out", files["new"]]
    rc, _, err = run_cli(argv, capsys)
    assert_user_error(rc, err, fragment or "has no checkpoint")


def test_export_tokenizer_pointing_at_nothing_is_refused(files, capsys, tmp_path):
    """Before, a --tokenizer path that did not exist fell back silently to summary.json's tokenizer."""
    from checkfree.export import _tokenizer_dir

    with pytest.raises(FileNotFoundError, match="--tokenizer .*missing does not exist"):
        _tokenizer_dir(tmp_path, {"tokenizer_dir": str(tmp_path)}, Path(files["missing"]))


GENERATE = {
    "model dir missing": (["@missing"], "has no config.json"),
    "temperature NaN": (["@model", "--temperature", "nan"], "--temperature is nan"),
    "temperature negative": (["@model", "--temperature", "-0.5"], "--temperature is -0.5"),
    "temperature infinite": (["@model", "--temperature", "inf"], "--temperature is inf"),
    "no new tokens": (["@model", "--max-new-tokens", "0"], "max_new_tokens is 0"),
    "top-k 0": (["@model", "--top-k", "0"], "--top-k is 0"),
    "seed not a number": (["@model", "--seed", "x"], "argument --seed"),
}


@pytest.mark.parametrize("case", GENERATE)
def test_generate_bad_inputs(case, files, capsys):
    extra, fragment = GENERATE[case]
    rc, _, err = run_cli(["generate", *_fill(extra, files), "--prompt", "KING:"], capsys)
    assert_user_error(rc, err, fragment)


def _failure_generator():
    spec = importlib.util.spec_from_file_location("failure_generator", ROOT / "failure_generator.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATOR = {
    "rate a word": (["--rate", "high"], "argument --rate"),
    "rate 100": (["--rate", "100"], "failure rate 100"),
    "no stages": (["--rate", "16", "--stages", "0"], "n_stages 0"),
    "probability 1.5": (["--rate", "7", "--probability", "1.5"], "[0, 1)"),
    "checkpoint every 1": (["--rate", "16", "--checkpoint-every", "1"], "checkpoint_every 1"),
    "checkpoint every and its old name disagree": (
        ["--rate", "16", "--checkpoint-every", "50", "--checkpoint-interval", "40"],
        "--checkpoint-every 50 and --checkpoint-interval 40 disagree",
    ),
    "out in a missing directory": (["--rate", "16", "--out", "@missing/x.json"], "does not exist"),
    "out is a directory": (["--rate", "16", "--out", "@empty_dir"], "is a directory"),
}


@pytest.mark.parametrize("case", GENERATOR)
def test_failure_generator_bad_inputs(case, files, capsys):
    extra, fragment = GENERATOR[case]
    argv = [
        files[a[1:].split("/")[0]] + a[1:][len(a[1:].split("/")[0]) :] if a.startswith("@") else a
        for a in extra
    ]
    gen = _failure_generator()
    try:
        rc = gen.main(argv)
    except SystemExit as e:
        rc = e.code
    _, err = capsys.readouterr()
    assert_user_error(rc, err, fragment)
    assert not any(Path(files["empty_dir"]).iterdir())


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), DRY_RUN="0")
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=90)


@pytest.mark.parametrize(
    "cmd, fragment",
    [
        (["simulate_training/run.sh", "ours-grad-avg", "1", "abc", "tiny_config.json", "0"], "P is 'abc'"),
        (
            ["simulate_training/run_2.sh", "ours-grad-avg", "1", "16", "tiny_config.json", "x"],
            "START_ITER is 'x'",
        ),
        (["communication/run_throughput.sh", "5", "3", "ours", "16"], "END 3 is not above START 5"),
        (
            [sys.executable, "failure_generator.py", "--rate", "16", "--out", "/nonexistent-dir/x.json"],
            "does not exist",
        ),
        (
            [
                sys.executable,
                "-m",
                "checkfree",
                "simulate",
                "--setting",
                "checkfree",
                "--config",
                "tiny_config.json",
                "--device",
                "cuda",
                "--run-dir",
                "RUN",
            ],
            "--device cuda",
        ),
    ],
)
def test_real_processes_print_one_line_and_no_traceback(cmd, fragment, tmp_path):
    cmd = [str(ROOT / c) if c.endswith(".sh") or c.endswith(".py") else c for c in cmd]
    cmd = [str(tmp_path / "run") if c == "RUN" else c for c in cmd]
    r = _run(cmd, tmp_path)
    assert_user_error(r.returncode, r.stderr, fragment)
    assert not any(tmp_path.iterdir())  # nothing written in the working directory


def test_swarm_port_in_use_is_one_line_and_writes_nothing(files, capsys):
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    try:
        argv = ["swarm", "run", "--setting", "ours", "--config", "swarm_tiny.json", "--no-schedule"]
        argv += ["--set", 'data="synthetic"', "--port", str(port), "--run-dir", files["new"]]
        rc, _, err = run_cli(argv, capsys)
    finally:
        sock.close(linger=0)
        ctx.term()
    assert_user_error(rc, err, f"--port {port}", "Address already in use")
    assert not Path(files["new"]).exists()
