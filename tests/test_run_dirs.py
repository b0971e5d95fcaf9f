"""A run directory is written by exactly one run: refused runs leave every earlier file byte-identical.

Each test starts from a copy of one finished tiny run (real data, real checkpoints) and checks the sha256 of
every file in it before and after the command.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from checkfree.telemetry.metrics import read_metrics

from helpers.cli import CACHE, assert_user_error, checksums, run_cli, simulate_argv

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished 4-iteration run (seed 1) with a final checkpoint at iteration 4."""
    from checkfree.cli import main

    run = tmp_path_factory.mktemp("finished") / "D"
    assert main(simulate_argv(run, "--seed", "1")) == 0
    assert (run / "checkpoints" / "iter_0000004").is_dir()
    return run


@pytest.fixture
def run_dir(finished_run, tmp_path) -> Path:
    """A private copy of the finished run."""
    d = tmp_path / "D"
    shutil.copytree(finished_run, d)
    return d


def test_fresh_run_into_a_finished_run_is_refused(run_dir, capsys):
    before = checksums(run_dir)
    rc, _, err = run_cli(simulate_argv(run_dir, "--seed", "1", iterations=2), capsys)
    assert_user_error(rc, err, f"--run-dir {run_dir} already holds a run", "--overwrite", ".replaced-")
    assert checksums(run_dir) == before


@pytest.mark.parametrize(
    "bad, fragment",
    [
        (["--set", "dataset=/nowhere/*.txt"], "dataset '/nowhere/*.txt'"),
        (["--swaps", "--set", "n_stages=3"], "CheckFree+ swaps need n_stages ≥ 4"),
        (["--failure-seed", "-1"], "argument --failure-seed: -1 is outside [0, 2^63)"),
        (["--set", "seed=-5"], "'seed' is -5"),
        (["--failure-schedule", "SCHEDULE"], "has stage 9"),
        (["--start-iter", "7"], "iter_0000007 does not exist; existing checkpoints: iter_0000004"),
        (["--resume-from", "MISSING"], "nope does not exist"),
        (["--resume-from", "RUN"], "is a run directory, not a checkpoint; expected one of its checkpoints"),
        (["--device", "cuda"], "--device cuda"),
    ],
)
def test_failed_validation_writes_nothing(run_dir, tmp_path, capsys, bad, fragment):
    """Before the fix, each of these had already rewritten config.json and options.json of the run in D."""
    schedule = tmp_path / "bad_schedule.json"
    schedule.write_text(
        json.dumps({"format": "checkfree-stage-failures-v1", "failures": [{"iteration": 1, "stage": 9}]})
    )
    subst = {"SCHEDULE": str(schedule), "MISSING": str(tmp_path / "nope"), "RUN": str(run_dir)}
    argv = simulate_argv(run_dir, *(subst.get(b, b) for b in bad))
    if "--swaps" in bad:
        argv.remove("--no-swaps")
    before = checksums(run_dir)
    rc, _, err = run_cli(argv, capsys)
    assert_user_error(rc, err, fragment)
    assert checksums(run_dir) == before


def test_resume_into_its_own_directory_appends_a_resume_record(run_dir, capsys):
    old_metrics = (run_dir / "metrics.jsonl").read_bytes()
    ckpt = checksums(run_dir / "checkpoints" / "iter_0000004")
    rc, _, err = run_cli(simulate_argv(run_dir, "--seed", "1", "--start-iter", "4", iterations=6), capsys)
    assert rc == 0, err
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    assert metrics.startswith(old_metrics)  # appended, nothing rewritten
    kinds = [r["kind"] for r in read_metrics(run_dir / "metrics.jsonl")]
    assert kinds.count("resume") == 1
    assert checksums(run_dir / "checkpoints" / "iter_0000004") == ckpt
    assert (run_dir / "checkpoints" / "iter_0000006").is_dir()


def test_a_resume_into_a_directory_that_holds_another_run_is_refused(run_dir, tmp_path, capsys):
    """The checkpoint lies in another run's directory: --run-dir may be new, empty or the checkpoint's own run,
    never a third run's, and nothing is written anywhere."""
    other = tmp_path / "other"
    shutil.copytree(run_dir, other)
    ckpt = other / "checkpoints" / "iter_0000004"
    before, before_other = checksums(run_dir), checksums(other)
    argv = simulate_argv(run_dir, "--seed", "1", "--resume-from", str(ckpt), iterations=6)
    rc, _, err = run_cli(argv, capsys)
    assert_user_error(rc, err, f"--run-dir {run_dir} already holds a run")
    assert checksums(run_dir) == before and checksums(other) == before_other


def test_overwrite_moves_the_old_run_aside(run_dir, capsys):
    before = checksums(run_dir)
    rc, _, err = run_cli(simulate_argv(run_dir, "--seed", "2", "--overwrite", iterations=2), capsys)
    assert rc == 0, err
    (moved,) = run_dir.parent.glob("D.replaced-*")
    assert checksums(moved) == before  # nothing deleted, byte for byte
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 2
    assert not (run_dir / "checkpoints" / "iter_0000004").exists()  # the new run does not mix with the old


def test_failed_attempts_leave_no_default_run_directory(tmp_path, capsys):
    root = tmp_path / "runs"
    argv = simulate_argv(tmp_path / "unused", "--runs-root", str(root), iterations=2)
    i = argv.index("--run-dir")
    argv = argv[:i] + argv[i + 2 :]
    rc, _, err = run_cli([*argv, "--set", "dataset=/nowhere/*.txt"], capsys)
    assert_user_error(rc, err, "dataset '/nowhere/*.txt'")
    assert not root.exists()
    rc, _, err = run_cli(argv, capsys)
    assert rc == 0, err
    assert [p.name for p in root.iterdir()] == ["tiny_config-checkfree-p16-w1-seed0"]  # no "-2" suffix


def test_export_and_report_refuse_to_write_into_a_run(run_dir, tmp_path, capsys):
    before = checksums(run_dir)
    rc, _, err = run_cli(["export", str(run_dir), "--out", str(run_dir)], capsys)
    assert_user_error(rc, err, f"--out {run_dir} is a non-empty directory without checkfree_export.json")
    rc, _, err = run_cli(["report", str(run_dir), "--target-loss", "5", "--out", str(run_dir)], capsys)
    assert_user_error(rc, err, f"--out {run_dir} is a non-empty directory without checkfree_report.json")
    assert checksums(run_dir) == before
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for argv in (
        ["export", str(run_dir), "--out", str(a_file)],
        ["report", str(run_dir), "--target-loss", "5", "--out", str(a_file)],
    ):
        rc, _, err = run_cli(argv, capsys)
        assert_user_error(rc, err, f"--out {a_file} is a file")
    assert a_file.read_text() == "mine"


READ_ONLY = Path("/proc/checkfree-cannot-write-here")
"""A location no process can create anything in, not even root (procfs refuses new entries)."""


def test_a_location_that_cannot_be_written_is_refused_before_anything_starts(run_dir, capsys):
    """Each was an OSError traceback once the command tried to write."""
    swarm = ["swarm", "run", "--setting", "ours", "--config", "swarm_tiny.json", "--no-schedule", "--dry-run"]
    for argv, option in (
        (simulate_argv(READ_ONLY / "run"), "--run-dir"),
        ([*swarm, "--run-dir", str(READ_ONLY / "run")], "--run-dir"),
        (["export", str(run_dir), "--out", str(READ_ONLY / "hf")], "--out"),
        (["report", str(run_dir), "--target-loss", "5", "--out", str(READ_ONLY / "rep")], "--out"),
        (["schedule", "--rate", "16", "--out", str(READ_ONLY.parent / "16.json")], "--out"),
    ):
        rc, _, err = run_cli(argv, capsys)
        assert_user_error(
            rc, err, f"{option} {READ_ONLY.parent}/", "cannot be written", "expected a location you can write"
        )


def test_the_write_check_leaves_nothing_behind_and_reports_the_refusal(tmp_path, monkeypatch):
    from checkfree import rundir

    rundir.check_writable(tmp_path / "new" / "run", "--run-dir")
    assert list(tmp_path.iterdir()) == []

    def refuse(**kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(rundir.tempfile, "mkdtemp", refuse)
    with pytest.raises(
        rundir.DirectoryConflictError, match=r"--out .* \(its nearest existing directory .*\): Perm"
    ):
        rundir.check_writable(tmp_path / "out", "--out")


def test_a_resume_from_a_truncated_checkpoint_writes_nothing(run_dir, tmp_path, capsys):
    """It used to create the new run directory (config, options, command, log, metrics) before refusing."""
    ckpt = run_dir / "checkpoints" / "iter_0000004"
    layer = ckpt / "layer_0000.safetensors"
    layer.write_bytes(layer.read_bytes()[:-100])
    before = checksums(run_dir)
    new = tmp_path / "resumed"
    rc, _, err = run_cli(simulate_argv(new, "--resume-from", str(ckpt), iterations=6), capsys)
    assert_user_error(rc, err, f"checkpoint file {layer} has", "truncated or corrupt")
    assert not new.exists() and checksums(run_dir) == before


def test_export_and_report_replace_their_own_earlier_output(run_dir, tmp_path, capsys):
    hf, rep = tmp_path / "hf", tmp_path / "report"
    for _ in range(2):
        rc, _, err = run_cli(["export", str(run_dir), "--out", str(hf), "--no-verify"], capsys)
        assert rc == 0, err
        rc, _, err = run_cli(["report", str(run_dir), "--target-loss", "5", "--out", str(rep)], capsys)
        assert rc == 0, err
    assert (hf / "checkfree_export.json").is_file() and (hf / "model.safetensors").is_file()
    assert json.loads((rep / "checkfree_report.json").read_text())["target"] == 5.0


def test_swarm_run_dir_holding_a_run_is_refused(run_dir, capsys):
    before = checksums(run_dir)
    argv = ["swarm", "run", "--setting", "ours", "--config", "swarm_tiny.json", "--no-schedule"]
    rc, _, err = run_cli([*argv, "--run-dir", str(run_dir), "--dry-run"], capsys)
    assert_user_error(rc, err, f"--run-dir {run_dir} already holds a run", "--overwrite")
    assert checksums(run_dir) == before


def test_resume_on_other_data_is_refused_unless_allowed(run_dir, tmp_path, capsys):
    from checkfree.data.sources import shakespeare_files

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for f in shakespeare_files()[:2]:
        shutil.copy(f, corpus / f.name)
    before = checksums(run_dir)
    argv = simulate_argv(
        run_dir, "--seed", "1", "--start-iter", "4", "--set", f"dataset={corpus}", iterations=5
    )
    rc, _, err = run_cli(argv, capsys)
    assert_user_error(rc, err, "was trained on dataset 'Shakespeare'", "--allow-data-change")
    assert checksums(run_dir) == before
    rc, _, err = run_cli([*argv, "--allow-data-change"], capsys)
    assert rc == 0, err
    log = (run_dir / "rank0.log").read_text()
    assert log.count("WARNING") and "--allow-data-change: resuming checkpoint" in log
    assert CACHE.is_dir()
