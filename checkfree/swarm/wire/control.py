"""The swarm's typed control plane: one schema per message type and per CONTROL command.

Every swarm process (supervisor, node, storage node, launcher) hands :func:`check` to its transport, which
runs it on every message right after the wire-format decode (checkfree.swarm.wire.protocol): a message whose meta
has an unknown CONTROL command, an unknown field, a missing required field or a value of the wrong type or
range raises :class:`~checkfree.swarm.wire.protocol.ProtocolError` and is dropped and counted like any malformed
message (``stats['dropped_malformed']``). Handlers then read fields without further type checks; they still
check what only they can know (is this attempt current, does this node hold that stage).

A schema maps a field name to a kind (below); a name ending in ``?`` is optional. Kinds:

=========  ==============================================================================================
``int``    an integer in int64 (not a bool)
``nat``    an integer in [0, 2**62]
``onat``   a ``nat`` or null
``stage``  an integer in [-2, 4096] (-1 = the storage node, -2 = a launcher)
``node``   an integer in [-1, 2**62] (a node id, -1 = the supervisor)
``num``    a finite number (int or float)
``norm``   a finite number ≥ 0 (a loss, a gradient norm, a learning rate, seconds)
``onorm``  a ``norm`` or null
``str``    a string of at most 4096 characters
``ostr``   a ``str`` or null
``bool``   true / false
``addr``   ``tcp://HOST:PORT``, at most 256 characters
``nodes``  a list of at most 4096 node ids
``onodes`` a ``nodes`` or null
``obj``    any JSON object (nested content is the wire format's concern: depth and size are bounded)
``peers``  a list of ``[node, stage, location, address]`` rows
``members`` an object ``{"<stage>": [nat, ...]}`` (the serving replicas of each stage; stored versions)
``counts`` an object ``{name: nat}``
``factors`` an object ``{"<node>": number in [1, 1000]}`` (slowdown factors, checkfree.swarm.slowdown)
``tally``  an object ``{"<node>": nat}`` (a node's rejected messages per sender)
``nums``   an object ``{name: norm}`` (compute seconds)
``keys``   an object ``{"<node>": CURVE public key (40 Z85 characters)}``
``strs``   a list of at most 4096 strings of at most 64 characters, or null
``norms``  a list of at most 4096 ``norm``, or null
``record`` a recovery record (:data:`RECORD`)
``refusal`` why a node will not serve a weights request: one of :data:`REFUSALS`
=========  ==============================================================================================

Objects and lists hold at most 4096 entries. Every number is finite: a NaN or an infinity in a ``loss``,
``grad_norm`` or ``lr`` is refused here, so no peer's number can make a supervisor's ω or loss NaN
(throughput.json) or a replacement's CheckFree weights invalid. A diverging run does not need to report one:
stage 0 back-propagates nothing from a non-finite loss (checkfree.swarm.node.driver), and the run stops with the
supervisor's ``SwarmError``.

:func:`check_counting` wraps :func:`check` for a transport and tells a callback the sender of each message it
refuses (the supervisor's evidence for evicting a node, checkfree.swarm.supervisor.conduct).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from checkfree.swarm.config import MAX_SLOWDOWN
from checkfree.swarm.wire.protocol import Message, MessageType, ProtocolError

_INT64 = (-(2**63), 2**63 - 1)
_NAT_MAX = 2**62
_MAX_LIST = 4096
_MAX_STR = 4096
_Z85_KEY = re.compile(r"[0-9A-Za-z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}\Z")
REFUSALS = ("no_grant", "grant_used", "plan_superseded", "byte_cap")
"""Why a node refuses a WEIGHTS_REQUEST (``refused``; checkfree.swarm.node.parts): no grant covers it, its grant was
answered already, a newer plan of the requester replaced the one it names, the cap on outstanding bytes."""


def _int(v: Any, low: int, high: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def _num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _norm(v: Any) -> bool:
    return _num(v) and v >= 0


def _sized(v: Any, kind: type) -> bool:
    return isinstance(v, kind) and len(v) <= _MAX_LIST


def _peer_row(v: Any) -> bool:
    return (
        isinstance(v, list)
        and len(v) == 4
        and _int(v[0], -1, _NAT_MAX)
        and _int(v[1], -2, _MAX_LIST)
        and isinstance(v[2], str)
        and _KINDS["addr"](v[3])
    )


_KINDS: dict[str, Any] = {
    "int": lambda v: _int(v, *_INT64),
    "nat": lambda v: _int(v, 0, _NAT_MAX),
    "onat": lambda v: v is None or _int(v, 0, _NAT_MAX),
    "stage": lambda v: _int(v, -2, _MAX_LIST),
    "node": lambda v: _int(v, -1, _NAT_MAX),
    "num": _num,
    "norm": _norm,
    "onorm": lambda v: v is None or _norm(v),
    "str": lambda v: isinstance(v, str) and len(v) <= _MAX_STR,
    "ostr": lambda v: v is None or (isinstance(v, str) and len(v) <= _MAX_STR),
    "bool": lambda v: isinstance(v, bool),
    "addr": lambda v: isinstance(v, str) and v.startswith("tcp://") and len(v) <= 256,
    "nodes": lambda v: _sized(v, list) and all(_int(x, -1, _NAT_MAX) for x in v),
    "onodes": lambda v: v is None or (_sized(v, list) and all(_int(x, -1, _NAT_MAX) for x in v)),
    "obj": lambda v: isinstance(v, dict),
    "peers": lambda v: _sized(v, list) and all(_peer_row(r) for r in v),
    "members": lambda v: (
        _sized(v, dict)
        and all(
            k.isdigit() and _sized(ids, list) and all(_int(x, 0, _NAT_MAX) for x in ids)
            for k, ids in v.items()
        )
    ),
    "counts": lambda v: _sized(v, dict) and all(_int(x, 0, _NAT_MAX) for x in v.values()),
    "factors": lambda v: (
        _sized(v, dict)
        and all(k.isdigit() and len(k) <= 19 and _num(f) and 1 <= f <= MAX_SLOWDOWN for k, f in v.items())
    ),
    "tally": lambda v: (
        _sized(v, dict) and all(re.fullmatch(r"-?\d{1,19}", k) and _int(x, 0, _NAT_MAX) for k, x in v.items())
    ),
    "nums": lambda v: _sized(v, dict) and all(_norm(x) for x in v.values()),
    "keys": lambda v: (
        _sized(v, dict)
        and all(
            re.fullmatch(r"-?\d{1,19}", k) and isinstance(x, str) and _Z85_KEY.match(x) for k, x in v.items()
        )
    ),
    "strs": lambda v: v is None or (_sized(v, list) and all(isinstance(x, str) and len(x) <= 64 for x in v)),
    "norms": lambda v: v is None or (_sized(v, list) and all(_norm(x) for x in v)),
    "record": lambda v: isinstance(v, dict) and _fits(v, RECORD),
    "refusal": lambda v: isinstance(v, str) and v in REFUSALS,
}

RECORD: dict[str, str] = {
    "iteration?": "onat",
    "stage": "stage",
    "strategy?": "ostr",
    "rule": "str",
    "source_stages?": "nodes",
    "source_nodes?": "onodes",
    "parts?": "strs",
    "weights?": "norms",
    "omegas?": "norms",
    "grad_norm_mode?": "ostr",
    "rung?": "ostr",
    "fallback?": "ostr",
    "consecutive?": "bool",
    "latency_s?": "onorm",
    "lr?": "norm",
    "version?": "nat",
    "bytes?": "nat",
    "fetch_s?": "norm",
}
"""A recovery record (checkfree.recovery.record: the one schema the simulator writes too), which ``serving`` and
``restored`` carry (checkfree.swarm.node.recovering) and the supervisor completes and writes to throughput.json:
the schema's keys (stage, rule, source stages and nodes, parts, the sources' weights, ω, ladder rung, fallback, …;
the iteration, consecutive and latency are the supervisor's to set) and the fetch's own: lr, version, bytes
fetched, seconds. An initial node's ``serving`` carries rule ``initial``, the storage node's ``storage``."""

_REPORT = {
    "sent_bytes": "counts",
    "sent_messages": "counts",
    "dropped_malformed": "nat",
    "dropped_spoofed?": "nat",
    "bad_messages": "nat",
    "rejected?": "counts",
    "rejected_from?": "tally",
    "compute": "nums",
    "version": "nat",
    "stage0_copy?": "nat",
    "refused_requests?": "counts",
    "refused_connections?": "nat",
}
"""The cumulative statistics a node reports with ``committed`` and ``final`` (``stage0_copy``: the version of
the CheckFree+ stage-0 copy a stage-1 or stage-S node holds, absent when it holds none; ``rejected_from``: the
messages it refused, per sender, which the supervisor weighs as evidence, checkfree.swarm.supervisor.conduct;
``refused_requests``: the weights requests it refused, per reason, checkfree.swarm.node.parts;
``refused_connections``: the CURVE handshakes its ZAP check refused, checkfree.swarm.wire.auth)."""

_RESUMED = {
    "stage": "stage",
    "version": "nat",
    "serving": "bool",
    "attempt": "int",
    "pending": "onat",
    "last_control_wall": "norm",
    **{(k if k.endswith("?") else k + "?"): v for k, v in _REPORT.items() if k != "version"},
    "stored_versions?": "members",
    "record?": "record",
}
"""A node's answer to a resumed supervisor's ``resume`` (checkfree.swarm.supervisor.adoption): its stage, the
version of its weights, whether it serves, the last attempt it began, the attempt whose averaged gradients await
a ``commit`` (``pending``; null: none), when it last heard a command of the supervisor (epoch seconds), its
cumulative statistics, the recovery record it served with (``record``; a recovery that finished while the
supervisor was away is taken as if its ``serving`` had arrived) and, for the storage node, the versions it holds."""

COMMANDS: dict[str, dict[str, str]] = {
    # supervisor -> node / storage
    "welcome": {
        "config": "obj",
        "setting": "str",
        "peers": "peers",
        "members": "members",
        "vocab_size": "nat",
        "rank": "nat",
        "checkpoint_version": "nat",
        "iteration": "nat",
        "attempt": "nat",
        "keys?": "keys",
        "revoked?": "nodes",
        "plan?": "obj",
    },
    "peers": {"peers": "peers", "keys?": "keys", "revoked?": "nodes"},
    "begin": {"attempt": "nat", "iteration": "nat", "members": "members", "slowdown?": "factors"},
    "sync": {"attempt": "nat"},
    "commit": {"attempt": "nat", "iteration": "nat", "checkpoint_senders?": "nodes"},
    "abort": {"attempt": "nat"},
    "reroute": {"attempt": "nat", "members": "members", "dead": "nodes", "seq": "nat"},
    "checkpoint": {"checkpoint_senders": "nodes"},
    "rollback": {"version": "nat"},
    "plan": {"plan": "obj", "members": "members", "seq": "nat"},
    "grant": {"requester": "nat", "stage": "stage", "part?": "str", "optimizer": "bool", "seq": "nat"},
    "evaluate": {"evaluation": "nat", "iteration": "nat", "members": "members"},
    "shutdown": {},
    "resume": {},
    # supervisor -> launcher
    "spawn": {"node": "nat", "stage": "stage", "location": "str", "replacement": "bool", "keys": "keys"},
    "kill": {"node": "nat"},
    # node / storage / launcher -> supervisor
    "serving": {"stage": "stage", "version": "nat", "record": "record"},
    "stored": {
        "stage": "stage",
        "version": "nat",
        "bytes": "nat",
        "bad_messages?": "nat",
        "rejected_from?": "tally",
    },
    "committed": {"attempt": "nat", "microbatch_s?": "norm", **_REPORT},
    "final": {
        **{k if k.endswith("?") else k + "?": v for k, v in _REPORT.items()},
        "stored_versions?": "members",
    },
    "ready": {"attempt": "nat", "grad_norm": "norm", "pipelines": "norm", "rejected?": "nodes"},
    "stalled": {"attempt": "nat", "reason": "str"},
    "restored": {"version": "nat", "bytes": "nat", "record": "record"},
    "recovery_failed": {"reason": "str"},
    "replan": {"reason": "str", "seq": "nat"},
    "evaluated": {"evaluation": "nat", "loss_sum": "norm", "batches": "nat", "diverged?": "bool"},
    "exited": {"node": "nat", "code": "int"},
    "resumed": _RESUMED,
}
"""CONTROL command → schema of the rest of its meta (``command`` itself is implied)."""

_ATTEMPT_ROUTE = {
    "stage": "stage",
    "attempt": "nat",
    "route": "nodes",
    "pos": "nat",
    "pipeline": "nat",
    "reroutes?": "nat",
}

SCHEMAS: dict[MessageType, dict[str, str]] = {
    MessageType.FORWARD: _ATTEMPT_ROUTE,
    MessageType.BACKWARD: _ATTEMPT_ROUTE,
    MessageType.ITERATION_END: {
        "stage": "stage",
        "attempt": "nat",
        "loss": "norm",
        "tokens": "nat",
        "seconds": "norm",
        "reroutes?": "nat",
        "resent?": "nat",
        "pipeline?": "nat",
    },
    MessageType.GRADIENTS: {"stage": "stage", "attempt": "nat", "microbatches": "nat", "pipeline?": "nat"},
    MessageType.WEIGHTS_REQUEST: {
        "stage": "stage",
        "request": "str",
        "optimizer?": "bool",
        "version?": "nat",
        "part?": "str",
        "seq?": "nat",
        "update?": "nat",
    },
    MessageType.WEIGHTS_RESPONSE: {
        "stage": "stage",
        "request": "str",
        "version?": "nat",
        "grad_norm?": "norm",
        "lr?": "norm",
        "step?": "nat",
        "part?": "str",
        "error?": "str",
        "refused?": "refusal",
        "update?": "nat",
    },
    MessageType.JOIN: {
        "stage": "stage",
        "location": "str",
        "address": "addr",
        "replacement?": "bool",
        "slots?": "nodes",
    },
    MessageType.HEARTBEAT: {},
    MessageType.LEAVE: {},
    MessageType.STAGE0_COPY: {"stage": "stage", "part": "str", "version": "nat"},
    MessageType.CHECKPOINT: {
        "stage": "stage",
        "version": "nat",
        "grad_norm": "norm",
        "lr": "norm",
        "step": "nat",
    },
    MessageType.VALIDATION: {
        "stage": "stage",
        "evaluation": "nat",
        "route": "nodes",
        "pos": "nat",
        "pipeline": "nat",
    },
}
"""Message type → schema of its meta (CONTROL: see :data:`COMMANDS`)."""


def _fits(meta: dict[str, Any], schema: dict[str, str]) -> bool:
    try:
        _check_fields(meta, schema, "record")
    except ProtocolError:
        return False
    return True


def _check_fields(meta: dict[str, Any], schema: dict[str, str], what: str) -> None:
    allowed = {k.rstrip("?") for k in schema}
    for key in meta:
        if key not in allowed:
            raise ProtocolError(f"{what} has unknown field {key!r}; expected only {sorted(allowed)}.")
    for name, kind in schema.items():
        key = name.rstrip("?")
        if key not in meta:
            if name.endswith("?"):
                continue
            raise ProtocolError(f"{what} lacks field {key!r}; expected a {kind}.")
        if not _KINDS[kind](meta[key]):
            raise ProtocolError(f"{what} field {key!r} is {str(meta[key])[:80]!r}; expected a {kind}.")


def check(msg: Message) -> None:
    """Validate ``msg.meta`` against its schema (the transport's ``validate`` hook).

    Raises:
        ProtocolError: an unknown command or field, a missing field, or a wrong type or range; the text
            names the message, the field, the value seen and the kind expected.
    """
    if msg.type == MessageType.CONTROL:
        command = msg.meta.get("command")
        if command not in COMMANDS:
            raise ProtocolError(
                f"CONTROL command is {str(command)[:40]!r}; expected one of {sorted(COMMANDS)}."
            )
        rest = {k: v for k, v in msg.meta.items() if k != "command"}
        _check_fields(rest, COMMANDS[command], f"CONTROL {command!r}")
        return
    _check_fields(msg.meta, SCHEMAS[msg.type], f"{msg.type.name} meta")


def check_counting(on_refused: Callable[[Message, ProtocolError], None]) -> Callable[[Message], None]:
    """:func:`check` that first tells ``on_refused(msg, error)`` of every message it refuses (the transport runs it
    on its receiving thread: the callback must be thread-safe), then raises as :func:`check` does."""

    def validate(msg: Message) -> None:
        try:
            check(msg)
        except ProtocolError as exc:
            on_refused(msg, exc)
            raise

    return validate


class SchemaBug(RuntimeError):
    """This process built a message that does not fit its own schema: a bug, never a peer's fault."""


def control(command: str, **fields: Any) -> dict[str, Any]:
    """The meta of a CONTROL ``command``, checked against its schema before it is sent.

    Raises:
        SchemaBug: the command or a field does not fit its schema (a bug in the sender: not a
            ProtocolError, so no dispatcher mistakes it for a peer's bad message).
    """
    meta = {"command": command, **fields}
    try:
        check(Message(MessageType.CONTROL, -1, meta=meta))
    except ProtocolError as exc:
        raise SchemaBug(f"outgoing {exc}") from None
    return meta
