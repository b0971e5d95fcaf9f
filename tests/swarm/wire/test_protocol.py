"""Wire format: round trips of every type and dtype, and a ProtocolError naming the field for each defect."""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import pytest
import torch

from checkfree.swarm.wire import protocol
from checkfree.swarm.wire.protocol import (
    HEADER,
    MAGIC,
    VERSION,
    Message,
    MessageType,
    ProtocolError,
    decode,
    encode,
    nbytes,
)


def _forward(**tensors: torch.Tensor) -> Message:
    tensors = tensors or {"activations": torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)}
    return Message(
        MessageType.FORWARD, sender=3, iteration=7, microbatch=2, meta={"stage": 1}, tensors=tensors
    )


def _frames(msg: Message | None = None) -> list[bytes]:
    return [bytes(f) for f in encode(msg or _forward())]


def _header(**fields: int) -> bytes:
    values = dict(magic=MAGIC, version=VERSION, type=1, flags=0, sender=3, iteration=7, microbatch=2)
    values.update(meta_len=len(b'{"stage":1}'), count=1)
    values.update(fields)
    return HEADER.pack(*values.values())


def _tensor_header(code: int = 1, shape: tuple[int, ...] = (2, 3, 4), name: bytes = b"activations", size=96):
    return (
        struct.pack("<BBB", code, len(shape), len(name))
        + name
        + struct.pack(f"<{len(shape)}q", *shape)
        + struct.pack("<Q", size)
    )


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8]
)
def test_round_trip_every_allowed_dtype(dtype: torch.dtype) -> None:
    t = (torch.randn(3, 5) * 10).to(dtype)
    out = decode(_frames(_forward(activations=t, extra=t[:, ::2])))  # non-contiguous slice too
    assert out.tensors["activations"].dtype == dtype
    assert torch.equal(out.tensors["activations"], t)
    assert torch.equal(out.tensors["extra"], t[:, ::2])


def test_round_trip_keeps_fields_nan_scalars_empty_and_meta() -> None:
    meta = {"stage": 2, "path": [0, 1, 2], "loss": float("nan"), "info": {"a": None, "b": True}}
    msg = Message(
        MessageType.GRADIENTS,
        sender=-1,
        iteration=0,
        microbatch=-1,
        meta=meta,
        tensors={
            "layers.0.w": torch.tensor([float("nan"), 1.0]),
            "scalar": torch.tensor(5),
            "e": torch.empty(0, 4),
        },
    )
    out = decode(_frames(msg))
    assert (out.type, out.sender, out.iteration, out.microbatch) == (MessageType.GRADIENTS, -1, 0, -1)
    assert out.meta["path"] == [0, 1, 2] and out.meta["info"] == {"a": None, "b": True}
    assert out.tensors["layers.0.w"][0].isnan() and out.tensors["layers.0.w"][1] == 1.0
    assert out.tensors["scalar"].shape == () and out.tensors["scalar"].item() == 5
    assert out.tensors["e"].shape == (0, 4)


def test_received_tensors_are_writable_and_do_not_alias_the_frames() -> None:
    frames = [bytearray(f) for f in encode(_forward())]
    out = decode(frames)
    frames[3][:] = bytes(len(frames[3]))
    out.tensors["activations"] += 1  # writable
    assert out.tensors["activations"][0, 0, 0] == 1.0


def test_zero_copy_encode_aliases_and_copy_encode_snapshots() -> None:
    t = torch.zeros(4)
    aliased, snapshot = encode(_forward(activations=t)), encode(_forward(activations=t), copy=True)
    t += 1
    assert decode(aliased).tensors["activations"].sum() == 4
    assert decode(snapshot).tensors["activations"].sum() == 0


@pytest.mark.parametrize(
    "mtype,meta,tensors",
    [
        (MessageType.FORWARD, {"stage": 0}, {"activations": torch.ones(2)}),
        (MessageType.BACKWARD, {"stage": 3}, {"gradients": torch.ones(2)}),
        (MessageType.ITERATION_END, {"stage": 0, "loss": 2.5}, {}),
        (MessageType.GRADIENTS, {"stage": 1}, {"w": torch.ones(2)}),
        (MessageType.WEIGHTS_REQUEST, {"stage": 1}, {}),
        (MessageType.WEIGHTS_RESPONSE, {"stage": 1}, {"0.weight": torch.ones(2)}),
        (MessageType.JOIN, {"stage": 1, "location": "Iowa", "address": "tcp://127.0.0.1:5"}, {}),
        (MessageType.HEARTBEAT, {}, {}),
        (MessageType.LEAVE, {}, {}),
        (MessageType.CONTROL, {"command": "crash", "at": 395}, {}),  # commands: checkfree.swarm.wire.control
        (MessageType.STAGE0_COPY, {"stage": 0, "part": "head", "version": 3}, {"w.x": torch.ones(2)}),
        (MessageType.CHECKPOINT, {"stage": 2, "version": 4}, {"w.x": torch.ones(2), "m.x": torch.ones(2)}),
    ],
)
def test_every_message_type_round_trips(mtype: MessageType, meta: dict, tensors: dict) -> None:
    out = decode(_frames(Message(mtype, 4, 1, 0, meta, tensors)))
    assert out.type == mtype and out.meta == meta and set(out.tensors) == set(tensors)


def test_nbytes_counts_every_frame() -> None:
    frames = encode(_forward())
    assert nbytes(frames) == HEADER.size + len(b'{"stage":1}') + len(_tensor_header()) + 96


BAD_CASES = {
    "bad magic": (lambda f: [_header(magic=b"PKL\x00")] + f[1:], "Magic"),
    "bad version": (lambda f: [_header(version=9)] + f[1:], "version is 9"),
    "unknown type": (lambda f: [_header(type=99)] + f[1:], "type code is 99"),
    "flags": (lambda f: [_header(flags=1)] + f[1:], "flags"),
    "negative sender": (lambda f: [_header(sender=-5)] + f[1:], "sender is -5"),
    "truncated header": (lambda f: [f[0][:20]] + f[1:], "Header frame is 20 bytes"),
    "missing frames": (lambda f: f[:3], "Frame count is 3"),
    "extra frame": (lambda f: f + [b"x"], "Frame count is 5"),
    "one frame": (lambda f: f[:1], "Frame count is 1"),
    "meta length 2**32-1": (lambda f: [_header(meta_len=2**32 - 1)] + f[1:], "Meta length field"),
    "tensor count huge": (lambda f: [_header(count=2**32 - 1)] + f[1:], "Tensor count"),
    "meta not object": (lambda f: [_header(meta_len=3)] + [b"[1]"] + f[2:], "expected a JSON object"),
    "meta not json": (lambda f: [_header(meta_len=3)] + [b"{x:"] + f[2:], "not UTF-8 JSON"),
    "meta not utf8": (lambda f: [_header(meta_len=2)] + [b"\xff\xfe"] + f[2:], "not UTF-8 JSON"),
    "meta lacks stage": (lambda f: [_header(meta_len=2)] + [b"{}"] + f[2:], "lacks key 'stage'"),
    "meta stage is bool": (lambda f: [_header(meta_len=15)] + [b'{"stage":true} '] + f[2:], "'stage'"),
    "pickle payload": (lambda f: [pickle.dumps({"a": 1})] + f[1:], "Header frame"),
    "pickle meta": (lambda f: [_header(meta_len=len(pickle.dumps(1)))] + [pickle.dumps(1)] + f[2:], "JSON"),
    "dtype float64": (lambda f: f[:2] + [_tensor_header(code=7, size=192)] + f[3:], "Dtype code"),
    "ndim 9": (lambda f: f[:2] + [_tensor_header(shape=(1,) * 9, size=4)] + f[3:], "ndim"),
    "negative dim": (lambda f: f[:2] + [_tensor_header(shape=(-2, -3, 4), size=96)] + f[3:], "Shape"),
    "huge dim": (lambda f: f[:2] + [_tensor_header(shape=(2**62, 1, 1), size=96)] + f[3:], "Shape"),
    "shape vs nbytes": (lambda f: f[:2] + [_tensor_header(shape=(2, 3, 5))] + f[3:], "nbytes"),
    "nbytes 2**63": (lambda f: f[:2] + [_tensor_header(size=2**63)] + f[3:], "nbytes"),
    "truncated data": (lambda f: f[:3] + [f[3][:50]], "Data frame"),
    "truncated tensor header": (lambda f: f[:2] + [f[2][:10]] + f[3:], "Header of tensor 0"),
    "bad name": (lambda f: f[:2] + [_tensor_header(name=b"../etc ")] + f[3:], "Name"),
    "non-ascii name": (lambda f: f[:2] + [_tensor_header(name=b"\xc3\xa9")] + f[3:], "ASCII"),
    "missing activations": (lambda f: f[:2] + [_tensor_header(name=b"other")] + f[3:], "activations"),
    "random bytes": (lambda f: [bytes(range(40))] + f[1:], "Magic"),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_decode_rejects_each_defect_with_a_sentence_naming_it(case: str) -> None:
    mutate, expected = BAD_CASES[case]
    with pytest.raises(ProtocolError) as info:
        decode(mutate(_frames()))
    text = str(info.value)
    assert expected in text, text
    assert text.endswith(".") and "\n" not in text


def test_decode_enforces_the_size_limit_and_tensors_on_meta_only_types() -> None:
    with pytest.raises(ProtocolError, match="at most 100 bytes"):
        decode(_frames(), max_message_bytes=100)
    frames = _frames(Message(MessageType.CONTROL, 1, meta={"command": "x"}))
    frames[0] = HEADER.pack(MAGIC, VERSION, int(MessageType.CONTROL), 0, 1, -1, -1, len(frames[1]), 1)
    frames += [_tensor_header(shape=(1,), name=b"t", size=4), b"\0" * 4]
    with pytest.raises(ProtocolError, match="CONTROL message carries 1 tensors"):
        decode(frames)


def test_duplicate_tensor_names_are_rejected() -> None:
    f = _frames(_forward(activations=torch.ones(2), b=torch.ones(2)))
    f[0] = _header(count=2)
    f[4] = f[2]
    with pytest.raises(ProtocolError, match="appears twice"):
        decode(f)


@pytest.mark.parametrize(
    "msg,expected",
    [
        (_forward(activations=torch.ones(2, dtype=torch.float64)), "dtype torch.float64"),
        (_forward(activations=torch.ones([1] * 9)), "9 dims"),
        (Message(MessageType.FORWARD, 1, meta={}, tensors={"activations": torch.ones(1)}), "'stage'"),
        (Message(MessageType.FORWARD, 1, meta={"stage": 0}, tensors={"x": torch.ones(1)}), "activations"),
        (Message(MessageType.JOIN, 1, meta={"stage": 0, "location": "Iowa"}), "'address'"),
        (Message(MessageType.HEARTBEAT, 1, meta={"x": object()}), "JSON scalar"),
        (Message(MessageType.HEARTBEAT, 1, meta={"x": "y" * 70000}), "at most 65536"),
        (Message(MessageType.HEARTBEAT, 2**63), "sender"),
        (Message(MessageType.HEARTBEAT, 1, iteration=-2), "iteration"),
        (Message(99, 1), "Message type"),  # type: ignore[arg-type]
        (_forward(**{"activations": torch.ones(1), "bad name": torch.ones(1)}), "short identifier"),
    ],
)
def test_encode_refuses_what_decode_would_reject(msg: Message, expected: str) -> None:
    with pytest.raises(ProtocolError) as info:
        encode(msg)
    assert expected in str(info.value)


def test_json_meta_round_trip_is_plain_json() -> None:
    frames = _frames(Message(MessageType.CONTROL, 1, meta={"command": "stop", "n": [1, 2]}))
    assert json.loads(frames[1]) == {"command": "stop", "n": [1, 2]}


def test_no_pickle_in_the_wire_code() -> None:
    wire = Path(
        protocol.__file__
    ).parent  # checkfree/swarm/wire; the WAN table is checkfree/swarm/topology.py
    paths = [wire / name for name in ("protocol.py", "transport.py", "netem.py")] + [
        wire.parent / "topology.py"
    ]
    for path in paths:
        text = path.read_text()
        for word in ("import pickle", "recv_pyobj", "send_pyobj", "torch.load", "torch.save"):
            assert word not in text, f"{path.name} uses {word}"


def test_a_data_frame_longer_than_its_nbytes_is_a_protocol_error() -> None:
    """Extra bytes after a tensor's data are refused by name, not left to a numpy broadcast error."""
    frames = _frames()
    with pytest.raises(ProtocolError, match="Data frame of tensor 'activations' is 97 bytes; expected 96"):
        decode(frames[:3] + [frames[3] + b"\0"])
