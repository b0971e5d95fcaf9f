"""benchmarks/gpu_check.sh: skipped without CUDA, and every section's logic runs on the CPU with SMOKE=1."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.sh"


def _run(timeout: float, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SCRIPT)], env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.timeout(60)
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run for real")
def test_without_cuda_the_check_is_skipped_and_succeeds():
    r = _run(50)
    assert r.returncode == 0 and r.stdout.strip() == "no CUDA device: skipped", r.stderr
    bad = _run(50, DEVICE="tpu")
    assert bad.returncode == 2 and "DEVICE is 'tpu'" in bad.stderr


@pytest.mark.timeout(240)
def test_smoke_runs_every_section_on_the_cpu(tmp_path):
    r = _run(230, SMOKE="1", DEVICE="cpu", TMPDIR=str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    for section in (
        "1. throughput",
        "2. the same with --compile",
        "3. convergence",
        "4. recovery",
        "5. swarm on the device",
    ):
        assert section in out
    table = out[out.index("section ") :]
    assert "micro W=1 --compile" in table and "staged ÷ plain step" in table and "MFU" in table
    assert "finished, finite, falling      | yes" in table
    assert table.count("cpu vs cpu max |diff|          | 0.00e+00") == 4
    swarm = [line for line in table.splitlines() if line.startswith("swarm micro: ours, stage 2 lost")]
    assert len(swarm) == 4 and "| cpu (12 nodes)" in swarm[0], swarm  # 10 nodes + 2 replacements
    assert swarm[-1].endswith("| 2/2, yes")
    assert out.rstrip().endswith("all checks passed")
