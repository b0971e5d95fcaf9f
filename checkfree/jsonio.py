"""Strict JSON out: NaN / Infinity written as null with the reason, read back as numbers (RFC 8259).

Python's ``json.dumps`` writes a non-finite float as the bare tokens ``NaN``, ``Infinity`` or ``-Infinity``,
which RFC 8259 §6 does not allow: ``jq``, JavaScript's ``JSON.parse`` and most other readers refuse the whole
file. A diverging run produces exactly those numbers (a NaN loss, an infinite gradient norm ω), and its files
are the ones someone needs to read. :func:`dumps` writes such a number as ``null`` and says why in one
top-level key, ``"nonfinite"``: a map from the RFC 6901 JSON Pointer of each such value to the token it
stands for::

    {"loss": null, "grad_norm": 1.5, "nonfinite": {"/loss": "NaN"}}

:func:`loads` reads any JSON text checkfree wrote (files written before this module too, whose bare tokens
Python still parses) and puts the non-finite values back where the ``"nonfinite"`` map says, so a reader sees
exactly the object that was written. Every site that writes JSON (run files, metrics lines, reports, the
swarm's wire meta) goes through :func:`dumps`; ``tests/test_json_strict.py`` parses each file with a parser
that refuses the bare tokens.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

NONFINITE_KEY = "nonfinite"
"""The top-level key listing the values written as null: JSON Pointer → "NaN" | "Infinity" | "-Infinity"."""

_TOKENS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _token(x: float) -> str:
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def _pointer_part(key: object) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _clean(obj: Any, path: str, found: dict[str, str], default: Callable[[Any], Any] | None) -> Any:
    """``obj`` with every non-finite float replaced by None (recorded in ``found`` by pointer), tuples as
    lists, and objects JSON does not know passed through ``default`` (then cleaned too)."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        found[path] = _token(obj)
        return None
    if obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, dict):
        return {k: _clean(v, f"{path}/{_pointer_part(k)}", found, default) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v, f"{path}/{i}", found, default) for i, v in enumerate(obj)]
    if default is None:
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")
    return _clean(default(obj), path, found, default)


def dumps(
    obj: Any,
    *,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
    default: Callable[[Any], Any] | None = None,
) -> str:
    """``obj`` as strict JSON text: like ``json.dumps`` with the same keyword arguments, except that a NaN or
    infinite float is written as ``null`` and listed under the top-level ``"nonfinite"`` key (its JSON
    Pointer → ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``). Finite data gives the same text as
    ``json.dumps``.

    Raises:
        ValueError: ``obj`` holds a non-finite number but is not a dict (there is no place for the reason),
            or is a dict that already has a ``"nonfinite"`` key.
        TypeError: an object JSON does not know, and no ``default`` (as ``json.dumps``).
    """
    try:  # finite data (nearly always): one pass in the C encoder, the same text as json.dumps
        return json.dumps(
            obj, indent=indent, separators=separators, sort_keys=sort_keys, default=default, allow_nan=False
        )
    except ValueError:  # a NaN or an infinity somewhere: write it as null with its reason
        pass
    found: dict[str, str] = {}
    clean = _clean(obj, "", found, default)
    if found:
        if not isinstance(clean, dict):
            raise ValueError(
                f"a {type(obj).__name__} holding non-finite numbers at {sorted(found)[:3]} cannot be written as "
                "strict JSON; expected a dict, where the reason can go."
            )
        if NONFINITE_KEY in clean:
            raise ValueError(f"the object already has a {NONFINITE_KEY!r} key; expected it to be free.")
        clean[NONFINITE_KEY] = found
    return json.dumps(clean, indent=indent, separators=separators, sort_keys=sort_keys, allow_nan=False)


class _BareToken(ValueError):
    pass


def _refuse(token: str) -> float:
    raise _BareToken(token)


_STRICT = json.JSONDecoder(parse_constant=_refuse)
_LENIENT = json.JSONDecoder()


def loads(text: str | bytes, *, strict: bool = False) -> Any:
    """Parse JSON text written by :func:`dumps` (or by ``json.dumps``) and put back the non-finite values its
    ``"nonfinite"`` key lists (the key is removed): the inverse of :func:`dumps`.

    Args:
        text: the JSON text.
        strict: refuse the bare tokens ``NaN``, ``Infinity`` and ``-Infinity`` (the swarm's wire does; files
            written before this module may hold them, so readers of files do not).

    Raises:
        json.JSONDecodeError: the text is not JSON; or ``strict`` and it holds a bare non-finite token; or its
            ``"nonfinite"`` map is not a map of JSON Pointers, each to a ``null``, to one of the three tokens.
            (A ``ValueError``: readers that catch ``json.JSONDecodeError`` treat all of these as bad JSON.)
    """
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")
    try:
        obj = (_STRICT if strict else _LENIENT).decode(text)
    except _BareToken as exc:
        raise json.JSONDecodeError(
            f"bare token {exc} (strict JSON has no NaN or Infinity)", text, 0
        ) from None
    if not isinstance(obj, dict) or NONFINITE_KEY not in obj:
        return obj
    found = obj.pop(NONFINITE_KEY)
    if not isinstance(found, dict):
        raise json.JSONDecodeError(f"{NONFINITE_KEY!r} is not a map of JSON Pointers", text, 0)
    for pointer, token in found.items():
        _restore(obj, pointer, token, text)
    return obj


def _restore(obj: dict[str, Any], pointer: str, token: Any, text: str) -> None:
    """Put the value of ``token`` at ``pointer`` in ``obj``, where a null must be."""
    if not isinstance(token, str) or token not in _TOKENS or not pointer.startswith("/"):
        raise json.JSONDecodeError(
            f"{NONFINITE_KEY!r} entry {pointer!r}: {token!r} is not a known token", text, 0
        )
    parent: Any = obj
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/")]
    for i, part in enumerate(parts):
        if isinstance(parent, dict) and part in parent:
            key: Any = part
        elif isinstance(parent, list) and part.isdigit() and int(part) < len(parent):
            key = int(part)
        else:
            raise json.JSONDecodeError(f"{NONFINITE_KEY!r} entry {pointer!r} leads nowhere", text, 0)
        if i < len(parts) - 1:
            parent = parent[key]
        elif parent[key] is not None:
            raise json.JSONDecodeError(
                f"{NONFINITE_KEY!r} entry {pointer!r} leads to a value, not null", text, 0
            )
        else:
            parent[key] = _TOKENS[token]
