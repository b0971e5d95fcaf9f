"""A schema's first complaint as one sentence: the file, the field (a dotted path), the value and what was
expected, e.g. ``swarm config s.yaml: 'crash_point' is 'half'; expected a finite number ≥ 0 and ≤ 10.``"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

VALUE_CHARS = 60
"""A value is quoted up to this many characters of its repr (then "…")."""
_M = TypeVar("_M", bound=BaseModel)


def short(value: Any) -> str:
    """``repr(value)`` cut to :data:`VALUE_CHARS` characters."""
    text = repr(value)
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 1] + "…"


def _expected(error: dict[str, Any], descriptions: dict[str, str], leaves: dict[str, str]) -> str:
    loc = error["loc"]
    if len(loc) == 1 and isinstance(loc[0], str) and loc[0] in descriptions:
        return descriptions[loc[0]]
    if error["type"] in ("model_type", "model_attributes_type", "dict_type", "typed_dict_type"):
        return "a JSON object"
    if len(loc) > 1 and isinstance(loc[-1], str) and loc[-1] in leaves:
        return leaves[loc[-1]]
    message = error["msg"]
    for prefix in ("Input should be ", "Value error, "):
        if message.startswith(prefix):
            message = message[len(prefix) :]
    if message.startswith(("greater", "less")):
        message = "a value " + message
    return message[0].lower() + message[1:] if message else "another value"


def sentence(
    exc: ValidationError,
    source: str,
    descriptions: dict[str, str] | None = None,
    known: list[str] | None = None,
    leaves: dict[str, str] | None = None,
) -> str:
    """The first error of ``exc`` as one sentence beginning with ``source`` (the file as the user named it).

    Args:
        descriptions: field name → what a top-level field expects (its schema's ``description``), said instead
            of pydantic's wording. known: the fields an unknown key is told apart from (default: those of
            ``descriptions``). leaves: field name → what a nested field of that name expects (a field inside a
            list's objects, say), said instead of pydantic's wording.
    """
    error = exc.errors(include_url=False)[0]
    loc = error["loc"]
    field = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in loc).replace(".[", "[")
    kind = error["type"]
    if kind == "missing":
        if len(loc) > 1 and leaves and isinstance(loc[-1], str) and loc[-1] in leaves:
            wants = leaves[loc[-1]]
        else:
            wants = (descriptions or {}).get(str(loc[0]), "a value")
        return f"{source}: the field {field!r} is missing; expected {wants}."
    if kind == "extra_forbidden":
        names = sorted(known if known is not None else (descriptions or {}))
        also = f"; expected some of {names}" if names else "; expected only the fields this file format has"
        return f"{source}: unknown key {field!r}{also}."
    where = f"{field!r} is " if field else "the file holds "
    return f"{source}: {where}{short(error.get('input'))}; expected {_expected(error, descriptions or {}, leaves or {})}."


def descriptions_of(model: type[BaseModel]) -> dict[str, str]:
    """Field name → its schema description (what the field expects), for the fields that have one."""
    return {name: f.description for name, f in model.model_fields.items() if f.description}


def validate(model: type[_M], data: Any, source: str, error: type[Exception] = ValueError) -> _M:
    """``data`` checked against ``model`` (strict as the model says).

    Raises:
        ``error``: the first complaint as one sentence (:func:`sentence`).
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(sentence(exc, source, descriptions_of(model), list(model.model_fields))) from None


def validate_as(
    adapter: TypeAdapter,
    data: Any,
    source: str,
    error: type[Exception] = ValueError,
    descriptions: dict[str, str] | None = None,
) -> Any:
    """``data`` checked against ``adapter``'s type (strict).

    Args:
        descriptions: as :func:`sentence`'s.
    Raises:
        ``error``: the first complaint as one sentence (:func:`sentence`).
    """
    try:
        return adapter.validate_python(data, strict=True)
    except ValidationError as exc:
        raise error(sentence(exc, source, descriptions)) from None
