"""Size and nesting limits of every JSON or YAML file checkfree reads, checked before the file is parsed.

A config, a schedule, a journal or a run's results is small (the largest shipped is under 100 kB): a file above
:data:`MAX_FILE_BYTES` is refused unread, and one nested deeper than :data:`MAX_DEPTH` is refused from a scan of
its brackets (JSON) or of the parser's event stream (YAML, see checkfree.config_files), so that no recursive
parser ever sees it: Python's ``json`` raises RecursionError near depth 1,000, and a YAML alias bomb expands
only when constructed. A refusal is :class:`InputLimitError`, one sentence naming the file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_FILE_BYTES = 1 << 20
"""Largest file read as a config, schedule, journal or run result: 1 MiB."""
MAX_SCHEDULE_BYTES = 16 << 20
"""Largest crash schedule or down-interval file read (a generated schedule of a long run): 16 MiB."""
MAX_RESULT_BYTES = 64 << 20
"""Largest run result read (throughput.json, summary.json of a long run): 64 MiB."""
MAX_DEPTH = 32
"""Deepest nesting of objects and lists in such a file (the deepest checkfree writes is 6)."""

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


class InputLimitError(ValueError):
    """A file is larger or nested deeper than checkfree reads; the message is one sentence naming it."""


def read_text(path: str | Path, what: str, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of ``path``, read only when it is at most ``limit`` bytes.

    Args:
        what: how the file is named in messages ("config", "failure schedule", …).
        limit: the largest size read, in bytes.
    Raises:
        FileNotFoundError: the file does not exist. InputLimitError: larger than ``limit`` bytes, or not UTF-8.
        OSError: it cannot be read (a directory, no permission).
    """
    path = Path(path)
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise InputLimitError(
            f"{what} {path} is larger than {limit:,} bytes; expected a small JSON or YAML file (checkfree reads "
            f"at most {limit:,} bytes)."
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputLimitError(f"{what} {path} is not a text file (not UTF-8).") from None


def check_json_depth(text: str, where: str, limit: int = MAX_DEPTH) -> None:
    """Refuse JSON text nested deeper than ``limit`` objects and lists, from its brackets outside strings (no
    parser runs, so no recursion and no memory beyond the text's size).

    Raises:
        InputLimitError: nested deeper than ``limit`` (one sentence naming ``where``).
    """
    depth = 0
    for bracket in _BRACKET.findall(_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        if depth > limit:
            raise InputLimitError(
                f"{where} is nested deeper than {limit} objects and lists; expected a flat file (checkfree reads "
                f"at most {limit} levels)."
            )


def parse_json(text: str, where: str, loads: Callable[[str], Any] = json.loads) -> Any:
    """The JSON value of ``text`` (nested at most :data:`MAX_DEPTH` deep, checked first).

    Args:
        where: the text's name in messages ("trace t.jsonl line 3").
        loads: the parser (checkfree.jsonio.loads for files checkfree wrote).
    Raises:
        InputLimitError: too deep. ValueError: not valid JSON (one sentence naming ``where`` and the line).
    """
    check_json_depth(text, where)
    try:
        return loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not valid JSON ({e.msg} at line {e.lineno}).") from None


def load_json(
    path: str | Path, what: str, limit: int = MAX_FILE_BYTES, loads: Callable[[str], Any] = json.loads
) -> Any:
    """The JSON value in ``path`` (at most ``limit`` bytes, nested at most :data:`MAX_DEPTH` deep).

    Args:
        what: how the file is named in messages. loads: as :func:`parse_json`'s.
    Raises:
        FileNotFoundError: the file does not exist. InputLimitError: too large, too deep, or not UTF-8.
        ValueError: not valid JSON (one sentence naming the file and the line). OSError: unreadable.
    """
    return parse_json(read_text(path, what, limit), f"{what} {path}", loads)
