"""Swarm messages and their byte layout: no pickle, every field validated on decode.

A message is a list of ZeroMQ frames::

    frame 0   header, struct "<4sBBHqqqII" (40 bytes): magic b"CKFR", version, type, flags (0),
              sender, iteration, microbatch (int64, -1 = not applicable), meta length, tensor count
    frame 1   meta: a UTF-8 JSON object (``meta length`` bytes, at most ``MAX_META_BYTES``)
    then per tensor, two frames:
      header  struct "<BBB" (dtype code, ndim, name length) + name (ASCII) + ndim x int64 dims
              + uint64 nbytes
      data    the raw little-endian bytes of the contiguous tensor (``nbytes`` bytes)

``decode`` rejects anything that does not match this layout exactly with a ``ProtocolError`` whose message
is one sentence naming the field, the value seen and what was expected. Received tensors are writable and
alias nothing another message uses (large ones the transport received are views of their own frame, the rest
are copied). NaN/inf values are allowed by the wire format (a diverging run must still be able to report its
activations); the handlers reject them: FORWARD / BACKWARD before any computation
(checkfree.swarm.node.relay.check_pipeline_message, with :func:`all_finite` on the received bytes), weights,
gradients, stage-0 copies and checkpoints too (checkfree.swarm.wire.weights.check_finite,
checkfree.swarm.node.gradient_sync). The meta is strict JSON (RFC 8259, checkfree.jsonio): a non-finite number in
it (a diverging run's loss or ω) travels as ``null`` listed under the meta's ``"nonfinite"`` key and is put back
on decode; a meta frame with a bare ``NaN`` or ``Infinity`` token is malformed. The meta of each message type
and of each CONTROL command has a schema (checkfree.swarm.wire.control) that the transport checks right after
``decode``.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np
import torch
import zmq

from checkfree import jsonio

MAGIC = b"CKFR"
VERSION = 1
HEADER = struct.Struct("<4sBBHqqqII")
TENSOR_HEADER = struct.Struct("<BBB")
MAX_META_BYTES = 64 * 1024
"""Largest meta frame, bytes."""
DEFAULT_MAX_MESSAGE_BYTES = 2 * 1024**3
"""Largest message (all frames together), bytes."""
ZERO_COPY_MIN_BYTES = 64 * 1024
"""Smallest tensor (bytes) that ``decode(zero_copy=True)`` leaves in its frame; smaller ones are copied."""
MAX_TENSORS = 4096
MAX_NDIM = 8
MAX_DIM = 2**40
MAX_NAME_LEN = 200
MAX_META_DEPTH = 8
SUPERVISOR_ID = -1
"""Sender id of the supervisor (nodes have ids >= 0)."""
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]*\Z")

Frame = bytes | bytearray | memoryview | zmq.Frame


class ProtocolError(ValueError):
    """A message does not follow the wire format; the text names the field, the value and what is expected."""


class Rejected(ProtocolError):
    """A well-formed message a node refuses for what it carries (the data plane's checks); besides
    ``bad_messages`` it is counted in the node's report under ``rejected[counter]``.

    Args:
        text: one sentence naming the message, the value seen and what was expected.
        counter: ``nonfinite`` (NaN/inf activations or activation gradients) or ``off_route`` (a FORWARD /
            BACKWARD that is not from the node its route assigns, or whose route is not the attempt's).
    """

    def __init__(self, text: str, counter: str) -> None:
        super().__init__(text)
        self.counter = counter


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every value of ``tensor`` is finite; one pass on the tensor's device, no copy.

    ``torch.aminmax`` propagates NaN and shows ±inf in its min or max, so both are finite exactly when every
    value is; on the CPU it is about 40 times faster than ``torch.isfinite(t).all()``, which writes a bool per
    value (131 k float32: 0.03 ms against 0.8 ms, one thread). Non-float and empty tensors are finite.
    On a CUDA tensor the ``float()`` is a host sync: callers check the received host bytes instead.
    """
    if not torch.is_floating_point(tensor) or tensor.numel() == 0:
        return True
    low, high = torch.aminmax(tensor)
    return math.isfinite(float(low)) and math.isfinite(float(high))


class MessageType(IntEnum):
    """Kinds of swarm messages (the wire code is the int value; never renumber)."""

    FORWARD = 1  # activations of one microbatch, to the next stage (or back to stage 0 for the loss)
    BACKWARD = 2  # activation gradients of one microbatch, to the previous stage
    ITERATION_END = 3  # a stage-0 node announces the iteration's last backward is done
    GRADIENTS = 4  # data-parallel gradient exchange between replicas of one stage
    WEIGHTS_REQUEST = 5  # a joining node asks a peer for a stage's weights
    WEIGHTS_RESPONSE = 6  # the weights (a state dict) answering WEIGHTS_REQUEST
    JOIN = 7  # introduction: node id (= sender), stage, location, address
    HEARTBEAT = 8  # liveness; consumed by the transport
    LEAVE = 9  # orderly departure
    CONTROL = 10  # supervisor <-> node commands, JSON meta only
    STAGE0_COPY = 11  # CheckFree+: stage 0's embedding (to stage 1) or head (to stage S) after each step
    CHECKPOINT = 12  # checkpoint baseline: a stage's weights + Adam state, a node to the storage node
    VALIDATION = 13  # activations of one validation batch, forward only, stages in order (no backward)


DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: 1,
    torch.bfloat16: 2,
    torch.float16: 3,
    torch.int64: 4,
    torch.int32: 5,
    torch.uint8: 6,
}
"""Allowlist of tensor dtypes and their wire codes."""
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}
_ITEMSIZE = {dtype: torch.empty((), dtype=dtype).element_size() for dtype in DTYPE_CODES}

# Per type: meta keys that must be present, with their JSON type. ``stage`` is the stage index that the
# message concerns (the sender's stage for FORWARD/BACKWARD/GRADIENTS/JOIN, the requested stage for
# WEIGHTS_REQUEST/RESPONSE).
REQUIRED_META: dict[MessageType, dict[str, type]] = {
    MessageType.FORWARD: {"stage": int},
    MessageType.BACKWARD: {"stage": int},
    MessageType.ITERATION_END: {"stage": int},
    MessageType.GRADIENTS: {"stage": int},
    MessageType.WEIGHTS_REQUEST: {"stage": int},
    MessageType.WEIGHTS_RESPONSE: {"stage": int},
    MessageType.JOIN: {"stage": int, "location": str, "address": str},
    MessageType.HEARTBEAT: {},
    MessageType.LEAVE: {},
    MessageType.CONTROL: {"command": str},
    MessageType.STAGE0_COPY: {"stage": int, "part": str, "version": int},
    MessageType.CHECKPOINT: {"stage": int, "version": int},
    MessageType.VALIDATION: {"stage": int},
}
REQUIRED_TENSORS: dict[MessageType, frozenset[str]] = {
    MessageType.FORWARD: frozenset({"activations"}),
    MessageType.BACKWARD: frozenset({"gradients"}),
    MessageType.VALIDATION: frozenset({"activations"}),
}
"""Tensor names a message of this type must carry."""
NO_TENSORS = frozenset(
    MessageType[name]
    for name in ("ITERATION_END", "WEIGHTS_REQUEST", "JOIN", "HEARTBEAT", "LEAVE", "CONTROL")
)
"""Types that carry meta only."""


@dataclass
class Message:
    """One swarm message.

    Attributes:
        type: the message kind.
        sender: node id of the sender (``SUPERVISOR_ID`` = -1 for the supervisor).
        iteration: training iteration, -1 when not applicable.
        microbatch: microbatch index within the iteration, -1 when not applicable.
        meta: small JSON object (str keys; numbers, strings, bools, null, lists, nested objects).
        tensors: named CPU tensors, e.g. ``{"activations": (B, T, C) float32}``.
    """

    type: MessageType
    sender: int
    iteration: int = -1
    microbatch: int = -1
    meta: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def _check_int(value: object, what: str, low: int = -1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= _INT64_MAX:
        raise ProtocolError(f"Field {what} is {value!r}; expected an integer in [{low}, 2**63-1].")
    return value


def _check_json_value(value: object, where: str, depth: int) -> None:
    if depth > MAX_META_DEPTH:
        raise ProtocolError(
            f"Meta value at {where} nests deeper than {MAX_META_DEPTH}; expected flatter meta."
        )
    if value is None or isinstance(value, (bool, str, float)):
        return
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ProtocolError(f"Meta value at {where} is {value}; expected an integer that fits int64.")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_json_value(item, f"{where}[{i}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ProtocolError(f"Meta key {key!r} at {where} is not a string; expected str keys.")
            _check_json_value(item, f"{where}.{key}", depth + 1)
        return
    raise ProtocolError(
        f"Meta value at {where} is a {type(value).__name__}; expected a JSON scalar, list or object."
    )


def _check_meta(mtype: MessageType, meta: object) -> None:
    if not isinstance(meta, dict):
        raise ProtocolError(
            f"Meta of a {mtype.name} message is a {type(meta).__name__}; expected a JSON object."
        )
    _check_json_value(meta, "meta", 0)
    for key, kind in REQUIRED_META[mtype].items():
        if key not in meta:
            raise ProtocolError(
                f"Meta of a {mtype.name} message lacks key '{key}'; expected a {kind.__name__}."
            )
        value = meta[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ProtocolError(
                f"Meta key '{key}' of a {mtype.name} message is {value!r}; expected a {kind.__name__}."
            )


def _check_tensor_names(mtype: MessageType, names: Sequence[str]) -> None:
    if len(names) > MAX_TENSORS:
        raise ProtocolError(f"Tensor count is {len(names)}; expected at most {MAX_TENSORS}.")
    if mtype in NO_TENSORS and names:
        raise ProtocolError(f"A {mtype.name} message carries {len(names)} tensors; expected none.")
    missing = REQUIRED_TENSORS.get(mtype, frozenset()) - set(names)
    if missing:
        raise ProtocolError(f"A {mtype.name} message lacks tensor(s) {sorted(missing)}; they are required.")
    for name in names:
        if not isinstance(name, str) or len(name) > MAX_NAME_LEN or not _NAME_RE.match(name):
            raise ProtocolError(
                f"Tensor name {name!r} is not a short identifier; expected 1-{MAX_NAME_LEN} characters "
                "of [A-Za-z0-9_.] not starting with '.'."
            )


def encode(
    msg: Message,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    copy: bool = False,
    snapshot: Callable[[np.ndarray], object] | None = None,
) -> list[Frame]:
    """Serialize ``msg`` into ZeroMQ frames.

    With ``copy=False`` tensor data frames are zero-copy memoryviews of the tensors: do not modify the
    tensors until the frames are sent. ``copy=True`` snapshots them (one memcpy), which an asynchronous
    sender needs because the caller may update weights or zero gradients in place right after ``send``;
    ``snapshot(uint8 array)`` takes that copy if given (the transport's reused buffers: swarm.snapshots).

    Raises:
        ProtocolError: if the message would not pass ``decode`` (bad field, dtype, name, meta or size).
    """
    try:
        mtype = MessageType(msg.type)
    except ValueError:
        raise ProtocolError(f"Message type is {msg.type!r}; expected a MessageType.") from None
    sender = _check_int(msg.sender, "sender")
    iteration = _check_int(msg.iteration, "iteration")
    microbatch = _check_int(msg.microbatch, "microbatch")
    _check_meta(mtype, msg.meta)
    try:  # strict JSON: a NaN/inf (a diverging loss) travels as null, listed under "nonfinite"
        meta = jsonio.dumps(msg.meta, separators=(",", ":")).encode("utf-8")
    except ValueError as exc:
        raise ProtocolError(f"Meta cannot be written as strict JSON ({exc}).") from None
    if len(meta) > MAX_META_BYTES:
        raise ProtocolError(f"Meta is {len(meta)} bytes of JSON; expected at most {MAX_META_BYTES}.")
    _check_tensor_names(mtype, list(msg.tensors))
    frames: list[Frame] = [
        HEADER.pack(
            MAGIC, VERSION, int(mtype), 0, sender, iteration, microbatch, len(meta), len(msg.tensors)
        ),
        meta,
    ]
    total = len(frames[0]) + len(meta)
    for name, tensor in msg.tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise ProtocolError(f"Tensor {name!r} is a {type(tensor).__name__}; expected a torch.Tensor.")
        if tensor.dtype not in DTYPE_CODES:
            raise ProtocolError(
                f"Tensor {name!r} has dtype {tensor.dtype}; expected one of {sorted(map(str, DTYPE_CODES))}."
            )
        if tensor.dim() > MAX_NDIM:
            raise ProtocolError(f"Tensor {name!r} has {tensor.dim()} dims; expected at most {MAX_NDIM}.")
        flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        # a memoryview keeps ``flat`` alive for as long as zmq holds the frame
        raw = flat.numpy()
        data: Any = raw if not copy else snapshot(raw) if snapshot is not None else raw.tobytes()
        data = data if isinstance(data, zmq.Frame) else memoryview(data)
        header = (
            TENSOR_HEADER.pack(DTYPE_CODES[tensor.dtype], tensor.dim(), len(name))
            + name.encode("ascii")
            + struct.pack(f"<{tensor.dim()}q", *tensor.shape)
            + struct.pack("<Q", raw.nbytes)
        )
        frames += [header, data]
        total += len(header) + raw.nbytes
    if total > max_message_bytes:
        raise ProtocolError(f"Message is {total} bytes; expected at most {max_message_bytes} bytes.")
    return frames


def _buffer(frame: object, index: int) -> memoryview:
    buf = getattr(frame, "buffer", frame)  # zmq.Frame exposes .buffer
    try:
        view = memoryview(buf)  # type: ignore[arg-type]
    except TypeError:
        raise ProtocolError(
            f"Frame {index} is a {type(frame).__name__}; expected a bytes-like frame."
        ) from None
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def nbytes(frames: Sequence[object]) -> int:
    """Total size of a message's frames, bytes (for the bytes-per-message-type statistic)."""
    return sum(_buffer(f, i).nbytes for i, f in enumerate(frames))


def decode(
    frames: Sequence[object], max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, zero_copy: bool = False
) -> Message:
    """Parse and validate ZeroMQ frames into a ``Message``.

    Tensors are copied into fresh memory, except with ``zero_copy``: a tensor of ``ZERO_COPY_MIN_BYTES`` or
    more whose data frame is a writable, dtype-aligned ``zmq.Frame`` is then a view of it (``torch.frombuffer``
    keeps the frame alive); libzmq receives each large frame into memory of its own, so nothing else aliases it.

    Raises:
        ProtocolError: on any deviation from the wire format (see the module docstring).
    """
    views = [_buffer(f, i) for i, f in enumerate(frames)]
    if len(views) < 2:
        raise ProtocolError(f"Frame count is {len(views)}; expected at least 2 (header and meta).")
    total = sum(v.nbytes for v in views)
    if total > max_message_bytes:
        raise ProtocolError(f"Message is {total} bytes; expected at most {max_message_bytes} bytes.")
    head = views[0]
    if head.nbytes != HEADER.size:
        raise ProtocolError(f"Header frame is {head.nbytes} bytes; expected {HEADER.size}.")
    magic, version, code, flags, sender, iteration, microbatch, meta_len, count = HEADER.unpack(head)
    if magic != MAGIC:
        raise ProtocolError(f"Magic is {magic!r}; expected {MAGIC!r}.")
    if version != VERSION:
        raise ProtocolError(f"Protocol version is {version}; expected {VERSION}.")
    try:
        mtype = MessageType(code)
    except ValueError:
        raise ProtocolError(
            f"Message type code is {code}; expected one of {[int(t) for t in MessageType]}."
        ) from None
    if flags != 0:
        raise ProtocolError(f"Header flags are {flags}; expected 0.")
    for what, value in (("sender", sender), ("iteration", iteration), ("microbatch", microbatch)):
        _check_int(value, what)
    if count > MAX_TENSORS:
        raise ProtocolError(f"Tensor count is {count}; expected at most {MAX_TENSORS}.")
    if len(views) != 2 + 2 * count:
        raise ProtocolError(f"Frame count is {len(views)}; expected {2 + 2 * count} for {count} tensors.")
    if meta_len > MAX_META_BYTES or meta_len != views[1].nbytes:
        raise ProtocolError(
            f"Meta length field is {meta_len}; expected the meta frame's size {views[1].nbytes} "
            f"(at most {MAX_META_BYTES})."
        )
    try:
        meta = jsonio.loads(bytes(views[1]).decode("utf-8"), strict=True)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ProtocolError(
            f"Meta frame is not UTF-8 JSON ({type(exc).__name__}); expected a JSON object."
        ) from None
    _check_meta(mtype, meta)
    tensors: dict[str, torch.Tensor] = {}
    for i in range(count):
        alias = zero_copy and isinstance(frames[3 + 2 * i], zmq.Frame)
        name, tensor = _decode_tensor(views[2 + 2 * i], views[3 + 2 * i], i, alias)
        if name in tensors:
            raise ProtocolError(f"Tensor name {name!r} appears twice; expected unique names.")
        tensors[name] = tensor
    _check_tensor_names(mtype, list(tensors))
    return Message(mtype, sender, iteration, microbatch, meta, tensors)


def _decode_tensor(header: memoryview, data: memoryview, index: int, alias: bool) -> tuple[str, torch.Tensor]:
    where = f"tensor {index}"
    if header.nbytes < TENSOR_HEADER.size:
        raise ProtocolError(
            f"Header of {where} is {header.nbytes} bytes; expected at least {TENSOR_HEADER.size}."
        )
    code, ndim, name_len = TENSOR_HEADER.unpack_from(header)
    if code not in CODE_DTYPES:
        raise ProtocolError(f"Dtype code of {where} is {code}; expected one of {sorted(CODE_DTYPES)}.")
    if ndim > MAX_NDIM:
        raise ProtocolError(f"ndim of {where} is {ndim}; expected at most {MAX_NDIM}.")
    expected = TENSOR_HEADER.size + name_len + 8 * ndim + 8
    if header.nbytes != expected:
        raise ProtocolError(
            f"Header of {where} is {header.nbytes} bytes; expected {expected} for a {name_len}-byte name "
            f"and {ndim} dims."
        )
    raw_name = bytes(header[TENSOR_HEADER.size : TENSOR_HEADER.size + name_len])
    try:
        name = raw_name.decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError(f"Name of {where} is {raw_name!r}; expected ASCII.") from None
    if not name or len(name) > MAX_NAME_LEN or not _NAME_RE.match(name):
        raise ProtocolError(f"Name of {where} is {name!r}; expected a short identifier of [A-Za-z0-9_.].")
    offset = TENSOR_HEADER.size + name_len
    shape = struct.unpack_from(f"<{ndim}q", header, offset)
    (size,) = struct.unpack_from("<Q", header, offset + 8 * ndim)
    for dim in shape:
        if dim < 0 or dim > MAX_DIM:
            raise ProtocolError(
                f"Shape of tensor {name!r} is {list(shape)}; expected dims >= 0 and not huge."
            )
    dtype = CODE_DTYPES[code]
    itemsize = _ITEMSIZE[dtype]
    want = math.prod(shape) * itemsize
    if want != size:
        raise ProtocolError(
            f"nbytes of tensor {name!r} is {size}; expected {want} for shape {list(shape)} and {dtype}."
        )
    if data.nbytes != size:
        raise ProtocolError(f"Data frame of tensor {name!r} is {data.nbytes} bytes; expected {size}.")
    if alias and size >= ZERO_COPY_MIN_BYTES and not data.readonly:
        out = torch.frombuffer(data, dtype=torch.uint8)
        if out.data_ptr() % itemsize == 0:
            return name, out.view(dtype).reshape(shape)
    out = torch.empty(size, dtype=torch.uint8)
    if size:
        out.numpy()[:] = np.frombuffer(data, dtype=np.uint8)
    return name, out.view(dtype).reshape(shape)
