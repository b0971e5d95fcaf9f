"""Reading a config file, JSON or YAML, into a mapping that the typed config dataclasses then validate.

Every config checkfree reads (model configs, swarm topologies, the swarm's latency/bandwidth table) may be JSON or
YAML: a file named ``*.yaml`` / ``*.yml`` is parsed with PyYAML's safe loader, anything else as JSON. The authors'
JSON files stay as they are. Both formats give the same mapping and the same one-sentence errors
(:class:`ConfigFileError`), and a key given twice is noted the same way (the last value is used).

YAML specifics, so that a config means the same in both formats:

- numbers in scientific notation without a dot (``lr: 3e-4``) are floats, as in JSON (YAML 1.1, which PyYAML
  implements, would read them as strings);
- an unquoted failure-rate key (``16: 0.004``) is the string ``"16"``, as JSON's ``"16"`` (top-level keys are
  strings in JSON; a YAML number key is turned into its decimal text);
- a tab in the indentation, a document that is not a mapping at the top, or a syntax error is refused with
  the line number;
- anchors and aliases (``&a``, ``*a``, and the ``<<`` merges built on them) are refused before anything is
  constructed: configs never need them, and an alias bomb ("billion laughs") expands only when constructed;
- a key that YAML reads as a boolean (``yes:``, ``on:``) or null is refused, as is any key that is not a name or
  a number.

Either format: a file above 1 MiB or nested deeper than 32 objects and lists is refused before it is parsed
(checkfree.schemas.limits).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from checkfree.schemas.limits import MAX_DEPTH, InputLimitError, check_json_depth, read_text

YAML_SUFFIXES = (".yaml", ".yml")


class ConfigFileError(ValueError):
    """A config file cannot be read as a mapping; the message is one sentence naming the file and the line."""


def is_yaml(path: str | Path) -> bool:
    """Whether ``path`` is read as YAML (by its suffix, case-insensitive)."""
    return Path(path).suffix.lower() in YAML_SUFFIXES


def read_mapping(path: str | Path, what: str = "config", notes: list[str] | None = None) -> dict[str, Any]:
    """The top-level mapping of the JSON or YAML file at ``path``.

    Args:
        what: how the file is named in messages ("config", "swarm config", "locations file").
        notes: receives one sentence per key given twice in a mapping (the last value is used).
    Raises:
        FileNotFoundError: the file does not exist.
        ConfigFileError: not UTF-8 text, larger than 1 MiB, nested deeper than 32, a syntax error, a tab used for
            YAML indentation, a YAML anchor or alias, or a top level that is not a mapping (one sentence each).
    """
    path = Path(path)
    try:
        text = read_text(path, what)
        if not is_yaml(path):
            check_json_depth(text, f"{what} {path}")
    except InputLimitError as e:
        raise ConfigFileError(str(e)) from None
    except IsADirectoryError:
        raise ConfigFileError(f"{what} {path} is a directory; expected a JSON or YAML file.") from None
    found: list[str] = []
    data = _yaml(text, path, what, found) if is_yaml(path) else _json(text, path, what, found)
    if not isinstance(data, dict):
        kind = "a YAML mapping" if is_yaml(path) else "a JSON object"
        raise ConfigFileError(f"{what} {path}: expected {kind} of keys at the top level, got {_kind(data)}.")
    if notes is not None:
        notes.extend(found)
    return data


def _kind(value: Any) -> str:
    return {list: "a list", str: "a string", type(None): "nothing"}.get(type(value), type(value).__name__)


def _duplicate(path: Path, what: str, key: Any, value: Any) -> str:
    return f"{what} {path} gives the key {key!r} twice; the last value {value!r} is used."


def _json(text: str, path: Path, what: str, found: list[str]) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                found.append(_duplicate(path, what, key, value))
            out[key] = value
        return out

    try:
        return json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as e:
        raise ConfigFileError(f"{what} {path} is not valid JSON ({e.msg} at line {e.lineno}).") from None


_SCIENTIFIC = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
"""Floats PyYAML's YAML 1.1 resolver misses: ``3e-4``, ``1E5`` (its own pattern needs a dot)."""


def _loader(path: Path, what: str, found: list[str]) -> type:
    import yaml

    class Loader(yaml.SafeLoader):
        """The safe loader, noting duplicate keys and reading ``3e-4`` as a float."""

        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self.construct_object(key_node, deep=deep)
                value = self.construct_object(value_node, deep=deep)
                if isinstance(key, bool) or not isinstance(key, str | int | float):
                    raise ConfigFileError(
                        f"{what} {path}: the key {key!r} at line {key_node.start_mark.line + 1} is not a name "
                        "or a number; expected a name (YAML reads yes, no, on, off and null as values: quote such "
                        "a key)."
                    )
                if isinstance(key, int | float):
                    key = repr(key) if isinstance(key, float) else str(key)
                if key in out:
                    found.append(_duplicate(path, what, key, value))
                out[key] = value
            return out

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _SCIENTIFIC, list("-+0123456789"))
    Loader.add_constructor("tag:yaml.org,2002:map", lambda loader, node: loader.construct_mapping(node, True))
    return Loader


def _yaml(text: str, path: Path, what: str, found: list[str]) -> Any:
    import yaml

    for number, line in enumerate(text.splitlines(), 1):
        indent = line[: len(line) - len(line.lstrip())]
        if "\t" in indent:
            raise ConfigFileError(
                f"{what} {path} indents line {number} with a tab; YAML indents with spaces only."
            )
    try:
        loader = _loader(path, what, found)
        _check_events(text, loader, path, what)
        return yaml.load(text, Loader=loader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigFileError(f"{what} {path} is not valid YAML ({e.problem or e.context}{where}).") from None
    except yaml.YAMLError as e:
        raise ConfigFileError(f"{what} {path} is not valid YAML ({e}).") from None


def _check_events(text: str, loader: type, path: Path, what: str) -> None:
    """Refuse anchors, aliases and nesting deeper than :data:`MAX_DEPTH` from the parser's event stream, before
    anything is composed or constructed (PyYAML's parser keeps its own stack: it does not recurse).

    Raises:
        ConfigFileError: an anchor, an alias or too deep a nesting (one sentence with the line).
        yaml.YAMLError: a syntax error (the caller words it).
    """
    import yaml

    depth = 0
    for event in yaml.parse(text, Loader=loader):
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise ConfigFileError(
                f"{what} {path} uses a YAML anchor or alias at line {line}; expected plain values (a config "
                "repeats a value instead of referring to it)."
            )
        if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigFileError(
                    f"{what} {path} is nested deeper than {MAX_DEPTH} mappings and lists at line {line}; expected "
                    f"a flat file (checkfree reads at most {MAX_DEPTH} levels)."
                )
        elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            depth -= 1
