"""benchmarks/device_bundle.sh --check: what a device call carries, the working tree as the call copies it (tracked
files and untracked ones git does not ignore) plus the bundle, against the call's 64 MiB."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import ROOT

MIB = 2**20


def _sparse(path: Path, mib: float) -> None:
    """A file of ``mib`` MiB that takes no disk space."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(int(mib * MIB))


def _checkout(tmp_path: Path, wheel_mib: float) -> Path:
    """A git checkout holding the script, 30 MiB tracked, 10 MiB untracked, 100 MiB ignored, and a bundle in the
    (ignored) .cache/device_bundle with one wheel of ``wheel_mib`` MiB."""
    repo = tmp_path / "repo"
    shutil.copy2(ROOT / "benchmarks" / "device_bundle.sh", repo / "benchmarks" / "device_bundle.sh")
    (repo / ".gitignore").write_text(".cache/\nbig.bin\n")
    _sparse(repo / "tracked.bin", 30)
    _sparse(repo / "untracked.bin", 10)
    _sparse(repo / "big.bin", 100)  # ignored: it does not travel
    for args in (["init", "-q"], ["add", ".gitignore", "benchmarks", "tracked.bin"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, timeout=60)
    bundle = repo / ".cache" / "device_bundle"
    _sparse(bundle / "pkg-1.0-py3-none-any.whl", wheel_mib)
    (bundle / "bundle.txt").write_text("# a test bundle\npkg-1.0-py3-none-any.whl\n")
    return repo


def _check(repo: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(repo / "benchmarks" / "device_bundle.sh"), "--check"],
        cwd=repo,
        env={**os.environ, "GIT_CEILING_DIRECTORIES": str(repo.parent)},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(autouse=True)
def _script_dir(tmp_path):
    (tmp_path / "repo" / "benchmarks").mkdir(parents=True)


@pytest.mark.timeout(120)
def test_the_working_tree_and_the_bundle_together_must_fit_the_64_mib_a_device_call_carries(tmp_path):
    """40 MiB of tree + a 30 MiB bundle: each fits alone, together they do not."""
    repo = _checkout(tmp_path, 30)
    r = _check(repo)
    assert r.returncode == 1, r.stdout + r.stderr
    bundle = repo / ".cache" / "device_bundle"
    assert r.stderr.startswith(
        f"device_bundle.sh: the working tree (40.0 MiB, 4 files) and {bundle} (30.0 MiB)"
    )
    assert r.stderr.rstrip().endswith(
        "add up to 70.0 MiB; a device call carries at most 64 MiB: remove wheels from the bundle or files from the tree."
    )
    assert len(r.stderr.splitlines()) == 1


@pytest.mark.timeout(120)
def test_what_git_ignores_does_not_count_and_a_tree_and_bundle_within_64_mib_pass(tmp_path):
    repo = _checkout(tmp_path, 20)
    r = _check(repo)
    assert r.returncode == 0, r.stdout + r.stderr
    bundle = repo / ".cache" / "device_bundle"
    assert r.stdout == (
        f"[bundle] a device call carries 60.0 MiB of 64 MiB: the working tree 40.0 MiB (4 files) + {bundle} 20.0 MiB\n"
    )


@pytest.mark.timeout(120)
def test_a_bundle_missing_a_wheel_it_lists_fails(tmp_path):
    repo = _checkout(tmp_path, 1)
    (repo / ".cache" / "device_bundle" / "pkg-1.0-py3-none-any.whl").unlink()
    r = _check(repo)
    assert r.returncode == 1 and r.stderr == (
        f"device_bundle.sh: {repo / '.cache' / 'device_bundle'}/bundle.txt lists pkg-1.0-py3-none-any.whl, which "
        "is missing; run benchmarks/device_bundle.sh again.\n"
    )
