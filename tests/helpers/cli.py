"""Shared by the CLI safety tests: a tiny real run through ``python -m checkfree``'s ``main``, checksums of a
directory, and the user-error contract (exit code 2, one line on stderr, no traceback)."""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
from pathlib import Path

from checkfree.cli import main

CACHE = Path(tempfile.mkdtemp(prefix="checkfree-cli-cache-"))
"""One data cache for every run of this test process, so the tiny BPE tokenizer is trained once."""
atexit.register(shutil.rmtree, CACHE, True)

SMALL = [
    *("--set", "dmodel=32", "--set", "num_heads=2", "--set", "seq_l=32", "--set", "batch_size=2"),
    *("--set", "mb_count=1", "--set", "validation=2", "--set", "vocab_size=300"),
    *("--set", "eval_interval=2", "--set", "log_interval=2", "--no-progress"),
]


def simulate_argv(run_dir: Path, *extra: str, setting: str = "checkfree", iterations: int = 4) -> list[str]:
    """``simulate`` arguments of a tiny no-swaps run of the tiny config on the bundled corpus."""
    return [
        "simulate",
        *("--setting", setting, "--no-swaps", "--config", "tiny_config.json"),
        *("--run-dir", str(run_dir), "--max-iterations", str(iterations), "--cache-dir", str(CACHE)),
        *SMALL,
        *extra,
    ]


def swarm_argv(tmp_path: Path, *extra: str, setting: str = "ours") -> list[str]:
    """``swarm run`` arguments of the tiny swarm (configs/swarm_tiny.json) without a crash schedule, writing
    into ``tmp_path / "run"``."""
    return [
        *("swarm", "run", "--setting", setting, "--config", "swarm_tiny.json", "--no-schedule"),
        *("--run-dir", str(tmp_path / "run"), *extra),
    ]


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``python -m checkfree ARGV`` run in this process."""
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse usage errors exit through SystemExit
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def assert_user_error(rc: int, err: str, *fragments: str) -> None:
    """Exit code 2, exactly one line on stderr, no traceback, and each fragment in that line."""
    lines = err.strip().splitlines()
    assert rc == 2, (rc, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def checksums(directory: Path) -> dict[str, str]:
    """sha256 of every file under ``directory``, by relative path."""
    directory = Path(directory)
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }
