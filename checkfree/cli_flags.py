"""Command-line flags generated from a config dataclass: each flag's name, type, default and help come from its field.

torchtitan derives its command line from its config dataclasses (with tyro); ``python -m checkfree simulate`` and
``swarm run`` do the same with this small generator over :func:`dataclasses.fields` and argparse rather than tyro:
both commands are argparse sub-commands of one parser (checkfree.cli.build_parser) whose flags users type today
(``--no-swaps``, ``--no-progress``, ``--checkpoint-interval`` as an old name, ``--set KEY=VALUE``), which tyro would
spell its own way behind a parser of its own and a dependency to pin; this module's few functions over argparse keep
every flag as it was while the field stays the one place its type, default and meaning are written.

A field ``name: T = default`` with the docstring below it gives the flag ``--name`` (``_`` as ``-``) that stores
into ``name``:

- ``T`` (``int``, ``float``, ``str``, ``Path``, or one of them ``| None``) is the flag's type (``str``: none,
  as argparse stores strings); :attr:`Flag.type` replaces it where a flag checks more (a seed's range).
- a ``bool`` field is a switch: ``--name`` (default False) or ``--no-name`` (default True) stores the other value;
  :attr:`Flag.both` gives a True field both spellings.
- the default is the field's, or None for an override of a config file's key (``overrides=True``: a flag not
  given leaves the file's value); a field without a default is a required flag.
- the help is the field's docstring, else (an override) the docstring of the key it overrides in ``docs_from``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Flag:
    """What a field's flag has beyond its field (every attribute optional)."""

    type: Callable[[str], Any] | None = None
    """argparse type that replaces the field's (e.g. one that checks a range)."""
    choices: Sequence[str] | None = None
    """The values the flag accepts."""
    metavar: str | None = None
    """The value's name in the help (default: the flag's name in capitals)."""
    both: str | None = None
    """A ``bool`` field that defaults to True: also ``--name`` (the default), and this help for ``--no-name``."""
    hidden: bool = False
    """Left out of ``--help`` (an option for tests)."""


def flag_name(name: str) -> str:
    """``--`` and the field name with ``-`` for ``_`` (``max_iterations`` → ``--max-iterations``)."""
    return "--" + name.replace("_", "-")


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name → its docstring (the string literal right below the field in ``cls``'s source, on one line,
    without reST markup; ``%`` doubled for argparse) for each field of ``cls`` and its dataclass bases that has one.

    Raises:
        OSError: the source of ``cls`` cannot be read (a class defined outside a file).
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, after in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = _one_line(after.value.value)
    return docs


def _one_line(doc: str) -> str:
    text = " ".join(inspect.cleandoc(doc).split())
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text).replace("``", "")
    return text.replace("%", "%%")


def _lower_first(text: str) -> str:
    """``text`` with its first letter in lower case, unless it starts a name (``CheckFree``, ``GPT``)."""
    word = text.split(" ", 1)[0]
    return text[0].lower() + text[1:] if word[:1].isupper() and word[1:].islower() else text


def _base_type(hint: Any) -> Any:
    """``T`` of ``T`` or ``T | None``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _help(cls: type, name: str, overrides: bool, docs_from: type | None) -> str:
    """The help of ``cls``'s field ``name``: its docstring, or (an override) what it overrides and the default
    that applies when the config file does not set it.

    Raises:
        ValueError: neither ``cls`` nor ``docs_from`` has a docstring for ``name``.
    """
    docs, other = field_docs(cls), field_docs(docs_from) if docs_from is not None else {}
    doc = docs.get(name, other.get(name))
    if doc is None:
        raise ValueError(f"{cls.__name__}.{name} has no docstring; expected one (it is the flag's help).")
    if not overrides and name in docs:
        return doc
    source = cls if overrides else docs_from
    known = {f.name: f for f in dataclasses.fields(source)} if source is not None else {}
    was = _default(known[name]) if name in known else None
    unset = "" if was in (None, dataclasses.MISSING) else f" ({was} when the config file does not set it)"
    return f"Overrides the config's {name}: {_lower_first(doc)}{unset}"


def _switch(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, name: str, default: bool, spec: Flag, doc: str
) -> list[argparse.Action]:
    """The flags of a ``bool`` field: ``--name`` (default False), ``--no-name`` (default True), or both."""
    on, off = flag_name(name), "--no-" + flag_name(name)[2:]
    if not default:
        return [parser.add_argument(on, action="store_true", help=argparse.SUPPRESS if spec.hidden else doc)]
    if spec.both is None:
        text = argparse.SUPPRESS if spec.hidden else f"{doc} (on by default; this flag turns it off)"
        return [parser.add_argument(off, dest=name, action="store_false", help=text)]
    group = parser.add_mutually_exclusive_group()
    return [
        group.add_argument(on, action="store_true", default=True, help=f"{doc} (the default)"),
        group.add_argument(off, dest=name, action="store_false", help=spec.both),
    ]


def add_field_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    names: Iterable[str],
    flags: Mapping[str, Flag] | None = None,
    *,
    overrides: bool = False,
    docs_from: type | None = None,
) -> list[argparse.Action]:
    """Add to ``parser`` one flag per field of the dataclass ``cls`` in ``names`` (in that order), as the module
    docstring says; ``flags`` gives the extras of some (by field name); ``overrides``: each flag overrides the
    config key of its name (default None); ``docs_from``: the dataclass whose field docstrings give the help of
    fields that have none.

    Returns:
        The actions added (a ``both`` field adds two).

    Raises:
        ValueError: a name is no field of ``cls``, a field's type is none of those the module docstring lists, or a
            field has no docstring in ``cls`` nor in ``docs_from`` (a bug of the caller: every flag has help).
    """
    flags = flags or {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    added = []
    for name in names:
        if name not in fields:
            raise ValueError(f"{name!r} is no field of {cls.__name__}; expected one of {sorted(fields)}.")
        spec = flags.get(name, Flag())
        doc = _help(cls, name, overrides, docs_from)
        default = None if overrides else _default(fields[name])
        kind = _base_type(hints[name])
        help_text = argparse.SUPPRESS if spec.hidden else doc
        if kind is bool:
            added.extend(_switch(parser, name, bool(default), spec, doc))
            continue
        if kind not in (int, float, str, Path):
            raise ValueError(f"{cls.__name__}.{name} is of type {kind}; expected int, float, str or Path.")
        kwargs: dict[str, Any] = {"help": help_text}
        if default is dataclasses.MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = default
            if default is not None and not spec.hidden:
                kwargs["help"] = f"{doc} (default: {default})"
        arg_type = spec.type or (None if kind is str else kind)
        if arg_type is not None:
            kwargs["type"] = arg_type
        if spec.choices is not None:
            kwargs["choices"] = list(spec.choices)
        if spec.metavar is not None:
            kwargs["metavar"] = spec.metavar
        added.append(parser.add_argument(flag_name(name), **kwargs))
    return added
