"""The one activation-shape check of FORWARD, BACKWARD and VALIDATION messages (checkfree.swarm.node.relay
.check_activation_shape): each bound exactly, and both message checks use it."""

from __future__ import annotations

import pytest
import torch

from checkfree.config import Config
from checkfree.swarm.node.relay import check_activation_shape, check_pipeline_message
from checkfree.swarm.node.validation import check_validation_message
from checkfree.swarm.wire.protocol import Message, MessageType, ProtocolError

MODEL = Config(batch_size=4, seq_l=8, dmodel=16, num_heads=2, n_stages=2, validation=2)


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((4, 8, 16), torch.float32),  # the largest
        ((1, 1, 16), torch.float32),  # the smallest
        ((3, 5, 16), torch.float32),
    ],
)
def test_fitting_shapes_pass(shape, dtype):
    check_activation_shape(torch.zeros(shape, dtype=dtype), MODEL, "tensor")


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((5, 8, 16), torch.float32),  # one sequence more than batch_size
        ((0, 8, 16), torch.float32),  # no sequence
        ((4, 9, 16), torch.float32),  # one token more than seq_l
        ((4, 0, 16), torch.float32),  # no token
        ((4, 8, 15), torch.float32),  # width dmodel - 1
        ((4, 8, 17), torch.float32),  # width dmodel + 1
        ((4, 8, 16), torch.float64),
        ((4, 8, 16), torch.bfloat16),
        ((4, 128), torch.float32),  # not (B, T, d)
        ((1, 4, 8, 16), torch.float32),
    ],
)
def test_misfits_refused(shape, dtype):
    with pytest.raises(ProtocolError, match=r"^the thing is .*; expected \(<= 4, <= 8, 16\) float32$"):
        check_activation_shape(torch.zeros(shape, dtype=dtype), MODEL, "the thing")


class _Cfg:
    """The two fields of a SwarmConfig the message checks read."""

    model = MODEL
    n_stages = MODEL.n_stages


def _message(kind: MessageType, batch: int) -> Message:
    name = "gradients" if kind == MessageType.BACKWARD else "activations"
    meta = {"route": [0, 1, 2], "pos": 1, "pipeline": 0}
    return Message(kind, 1, 0, 1, meta, {name: torch.zeros(batch, 8, 16)})


@pytest.mark.parametrize("kind", [MessageType.FORWARD, MessageType.BACKWARD, MessageType.VALIDATION])
def test_message_checks_use_it(kind):
    check = check_validation_message if kind == MessageType.VALIDATION else check_pipeline_message
    check(_message(kind, MODEL.batch_size), _Cfg())
    with pytest.raises(ProtocolError, match=r"expected \(<= 4, <= 8, 16\) float32"):
        check(_message(kind, MODEL.batch_size + 1), _Cfg())
