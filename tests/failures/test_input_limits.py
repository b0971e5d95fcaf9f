"""Schedules and traces are bounded before they are parsed (checkfree.schemas.limits, issue 37): a file nested
100,000 deep is one sentence, never Python's RecursionError; a schedule above 16 MiB is refused unread."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkfree.failures.schedules import load_node_schedule, load_swarm_schedule
from checkfree.failures.traces import load_downtime, read_trace

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("load", [load_node_schedule, load_swarm_schedule, load_downtime])
def test_a_schedule_nested_deep_is_one_sentence(tmp_path: Path, load) -> None:
    path = tmp_path / "s.json"
    path.write_text('{"0": ' + DEEP + "}")
    with pytest.raises(ValueError, match="is nested deeper than 32 objects and lists"):
        load(path)


def test_a_schedule_above_16_mib_is_refused_unread(tmp_path: Path) -> None:
    from checkfree.schemas.limits import MAX_SCHEDULE_BYTES

    path = tmp_path / "s.json"
    head, tail = '{"0": [1, 5], "pad": "', '"}'
    path.write_text(head + "x" * (MAX_SCHEDULE_BYTES - len(head) - len(tail)) + tail)
    with pytest.raises(ValueError, match="'pad'"):  # read (exactly 16 MiB), then refused for its key
        load_node_schedule(path)
    path.write_text(head + "x" * (MAX_SCHEDULE_BYTES + 1 - len(head) - len(tail)) + tail)
    with pytest.raises(ValueError, match="is larger than 16,777,216 bytes"):
        load_node_schedule(path)


def test_a_parcae_trace_line_nested_deep_is_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('[0, "add", {"nodes": ["a"]}]\n' + DEEP + "\n")
    with pytest.raises(ValueError, match="line 2 is nested deeper than 32"):
        read_trace(path, "parcae")
