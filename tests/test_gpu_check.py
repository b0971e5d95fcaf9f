"""benchmarks/gpu_check.sh: it skips only where there is no GPU, fails where torch cannot see the GPU that
nvidia-smi lists, and writes every row to OUT_DIR/gpu_check.md and gpu_check.json as it is measured."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.sh"
SECTIONS = (
    "1. throughput",
    "2. the same with --compile",
    "3. convergence",
    "4. recovery",
    "5. swarm on the device",
)
no_cuda = pytest.mark.skipif(
    torch.cuda.is_available(), reason="this machine has CUDA: the check would run for real"
)


def _strict(text: str) -> dict:
    """JSON that a strict reader accepts: no NaN or Infinity tokens."""
    return json.loads(
        text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"non-strict token {c}"))
    )


def _path_without_nvidia_smi(extra: Path | None = None) -> str:
    dirs = [d for d in os.environ["PATH"].split(os.pathsep) if d and not (Path(d) / "nvidia-smi").exists()]
    return os.pathsep.join(([str(extra)] if extra else []) + dirs)


def _fake_nvidia_smi(tmp_path: Path, listing: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\n[ \"$1\" = -L ] || exit 9\nprintf '%s\\n' '{listing}'\n")
    fake.chmod(0o755)
    return bin_dir


def _run(timeout: float, **env: str) -> subprocess.CompletedProcess:
    """The script in a session of its own: on a timeout its whole process group (the swarm too) is killed."""
    proc = subprocess.Popen(
        [str(SCRIPT)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this test started, by its id
        proc.communicate(timeout=30)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.timeout(60)
@no_cuda
def test_without_nvidia_smi_or_a_listed_gpu_the_check_is_skipped_and_succeeds(tmp_path):
    r = _run(50, PATH=_path_without_nvidia_smi())
    assert r.returncode == 0 and r.stdout.strip() == "no GPU: skipped (no nvidia-smi)", r.stderr
    bin_dir = _fake_nvidia_smi(tmp_path, "No devices were found")
    r = _run(50, PATH=_path_without_nvidia_smi(bin_dir))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "no GPU: skipped (nvidia-smi -L lists none: No devices were found)"
    bad = _run(50, DEVICE="tpu")
    assert bad.returncode == 2 and "DEVICE is 'tpu'" in bad.stderr


@pytest.mark.timeout(60)
@no_cuda
def test_a_gpu_that_torch_cannot_see_fails_with_torchs_version_and_cuda_build(tmp_path):
    """The borrowed machine's first question: nvidia-smi lists an H100, so "skipped" would hide a wrong torch."""
    bin_dir = _fake_nvidia_smi(tmp_path, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)")
    r = _run(50, PATH=_path_without_nvidia_smi(bin_dir), OUT_DIR=str(tmp_path / "out"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "skipped" not in r.stdout and "gpu_check on" not in r.stdout  # nothing ran
    build = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
    assert f"torch {torch.__version__}, {build}, sees none" in r.stderr
    assert "nvidia-smi lists 1 GPU(s) (GPU 0: NVIDIA H100 80GB HBM3" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(60)
def test_an_out_dir_that_holds_a_report_is_refused_and_left_as_it_was(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "gpu_check.json").write_text('{"earlier": true}')
    r = _run(50, SMOKE="1", DEVICE="cpu", OUT_DIR=str(out), TMPDIR=str(tmp_path))
    assert r.returncode == 2, r.stdout + r.stderr
    assert (
        r.stderr.strip()
        == f"gpu_check: OUT_DIR {out} already holds gpu_check.json; expected a new or empty directory."
    )
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json"]
    assert (out / "gpu_check.json").read_text() == '{"earlier": true}'


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_run_cut_short_keeps_the_rows_it_measured(tmp_path):
    """SIGKILL (the device's time limit) once section 2 starts: section 1's rows are already in both files."""
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [str(SCRIPT)],
        env={**os.environ, "SMOKE": "1", "DEVICE": "cpu", "OUT_DIR": str(out), "TMPDIR": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    seen = []
    try:
        deadline = time.monotonic() + 100
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("2. the same with --compile") or time.monotonic() > deadline:
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the process group this test started, by its id
        proc.wait(timeout=30)
    assert seen[-1].startswith("2."), "".join(seen)
    report = _strict((out / "gpu_check.json").read_text())
    assert (
        report["status"] == "running" and report["device"] == "cpu" and report["torch"] == torch.__version__
    )
    metrics = [(r["section"], r["metric"]) for r in report["rows"]]
    assert ("micro W=1", "tokens/s (mean, it. 2..N)") in metrics and (
        "micro W=1",
        "staged ÷ plain step",
    ) in metrics
    assert [s["number"] for s in report["sections"]] == [1] and report["sections"][0]["seconds"] > 0
    md = (out / "gpu_check.md").read_text()
    assert (
        "| micro W=1 | staged ÷ plain step |" in md
        and "| 1. throughput, no failures | section seconds |" in md
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_smoke_runs_every_section_on_the_cpu_and_writes_its_report(tmp_path):
    out = tmp_path / "out"
    r = _run(290, SMOKE="1", DEVICE="cpu", TMPDIR=str(tmp_path), OUT_DIR=str(out))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    text = r.stdout
    for section in SECTIONS:
        assert section in text
    table = text[text.index("\nsection ") + 1 :]  # the closing table, after the rows printed as they came
    assert "micro W=1 --compile" in table and "staged ÷ plain step" in table and "MFU" in table
    assert "finished, finite, falling      | yes" in table
    assert table.count("cpu vs cpu max |diff|          | 0.00e+00") == 4
    swarm = [line for line in table.splitlines() if line.startswith("swarm micro: ours, stage 2 lost")]
    assert len(swarm) == 4 and "| cpu (12 nodes)" in swarm[0], swarm  # 10 nodes + 2 replacements
    assert swarm[-1].endswith("| 2/2, yes")
    assert text.rstrip().endswith("all checks passed")

    report = _strict((out / "gpu_check.json").read_text())
    assert report["status"] == "passed" and report["smoke"] is True
    assert [s["number"] for s in report["sections"]] == [1, 2, 3, 4, 5]
    assert all(
        s["ok"] is not False and s["seconds"] > 0 and s["budget_s"] is None for s in report["sections"]
    )
    printed = [line for line in table.splitlines()[2:] if line.count(" | ") == 2]
    assert len(report["rows"]) == len(printed) > 20
    md = (out / "gpu_check.md").read_text().splitlines()
    assert sum(line.startswith("| ") for line in md) == len(report["rows"]) + 1  # + the header line
    assert md[-1] == "all checks passed"
