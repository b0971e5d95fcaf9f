"""benchmarks/gpu_profile.py: the width sweep and the kernel profile, run on the CPU at micro sizes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu_profile.py"


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.timeout(300)
def test_the_sweep_and_the_profile_report_every_width_and_where_the_time_went(tmp_path):
    out = tmp_path / "profile.json"
    args = ("--device", "cpu", "--smoke", "--autocast", "off", "--widths", "64,128", "--steps", "1")
    r = _run(*args, "--profile-steps", "1", "--out", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    result = json.loads(out.read_text())
    assert [row["d_model"] for row in result["sweep"]] == [64, 128]
    assert all(
        row["tokens_per_second"] > 0 and row["mfu"] > 0 and not row["compiled"] for row in result["sweep"]
    )
    assert result["sweep"][1]["params"] > result["sweep"][0]["params"]
    by_kind = result["ms_per_step_by_kind"]
    assert by_kind["matrix multiply"] > 0 and by_kind["attention"] > 0  # linear and SDPA are recognised
    assert "matrix multiply" in r.stdout and "device busy ÷ wall" in r.stdout


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "args, message",
    [
        (("--widths", "512,abc"), "is not a comma-separated list of integers"),
        (("--widths", "500"), "every width must be a positive multiple of 64"),
        (("--compile-widths", "0"), "every width must be a positive multiple of 64"),
        ((), "--device cpu at full size: the sweep is for a CUDA device"),
        (("--smoke", "--fused-loss"), "--fused-loss on needs CUDA, but this run computes on the cpu"),
    ],
)
def test_a_wrong_width_is_one_sentence_and_exit_2(args, message):
    r = _run("--device", "cpu", *args, timeout=50)  # each refused before any model is built
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


@pytest.mark.timeout(60)
def test_an_existing_out_file_is_refused_and_left_as_it_was(tmp_path):
    out = tmp_path / "profile.json"
    out.write_text("mine")
    r = _run("--device", "cpu", "--smoke", "--out", str(out), timeout=50)
    assert r.returncode == 2 and "exists" in r.stderr and out.read_text() == "mine"


def test_a_liger_kernel_is_counted_as_the_fused_loss():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_profile
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert gpu_profile.kind_of("_liger_cross_entropy_kernel_0d1d2d") == "fused loss (Liger)"
    assert gpu_profile.kind_of("element_mul_kernel") == "fused loss (Liger)"
    assert gpu_profile.kind_of("sm90_xmma_gemm_bf16bf16_bf16f32") == "matrix multiply"
