"""The bad-input corpus (benchmarks/bad_inputs.py, issue 37): at least 150 wrong files and flags, over every kind
of input checkfree reads, each refused in one sentence with exit code 2, no traceback, nothing in its directory
changed, under 10 s and 1 GiB. The corpus forks one child per case from a process that imported checkfree once."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers import ROOT


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_every_bad_input_is_one_sentence_exit_2_and_bounded():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bad_inputs.py")],
        capture_output=True,
        text=True,
        timeout=380,
        cwd=ROOT,
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
    misses = [line for line in done.stdout.splitlines() if line.startswith(("MISS", "WAIT"))]
    assert done.returncode == 0 and not misses, "\n".join(misses) or done.stderr[-3000:]
    found = re.match(
        r"(\d+) cases over (\d+) kinds of input: (\d+) refused as they should be, 0 missed", summary
    )
    assert found, summary
    cases, kinds, refused = map(int, found.groups())
    assert cases >= 150 and kinds >= 10 and refused == cases, summary


def test_the_corpus_covers_every_file_and_flag():
    """Each kind of input the issue names has cases (listed without running them)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bad_inputs
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    kinds: dict[str, int] = {}
    for case in bad_inputs.all_cases():
        kinds[case.what] = kinds.get(case.what, 0) + 1
    expected = {
        "model config",
        "swarm config",
        "schedule",
        "trace",
        "throughput.json",
        "summary.json",
        "revocations.json",
        "join token",
        "launcher",
        "journal",
    }
    assert expected <= set(kinds), kinds
    names = [c.name for c in bad_inputs.all_cases()]
    for needle in ("--set", "--machines", "yaml alias bomb", "nested 100,000 deep", "ONLY", "world-readable"):
        assert any(needle in n for n in names), needle
