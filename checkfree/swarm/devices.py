"""Where a swarm node computes: ``--device auto|cpu|cuda`` and ``--gpus``, resolved once per machine.

The paper's throughput experiment ran one GPU per node (§5.2: 21 nodes). ``swarm run --device cuda --gpus
0,1`` places this machine's k-th node (k = node id − START, the launcher's first id) on
``cuda:gpus[k mod len(gpus)]``; ``auto`` is CUDA when torch sees a device, else the CPU; ``--gpus`` defaults to
every visible device. A replacement (a new node id, started after a crash) goes to the GPU that hosts the
fewest of this machine's live nodes (ties: the earliest in ``--gpus``), which is the crashed node's GPU when one
node is replaced at a time. The storage node (``checkpoint``) holds bytes, not a model: it stays on the CPU.

On CUDA a node computes its stage's forward and backward under bf16 autocast (as the simulator,
checkfree.devices.autocast_context) with fp32 master weights and fp32 Adam state; tensors reach the wire as
host bytes (checkfree.swarm.wire.staging). On the CPU nothing changes: no autocast, no pinned memory.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from checkfree.devices import autocast_context

log = logging.getLogger(__name__)

DEVICE_CHOICES = ("auto", "cpu", "cuda")
"""Values of ``swarm run --device``."""


def cuda_device_count() -> int:
    """Devices torch sees (0 without CUDA). The one probe of this module; tests monkeypatch it.

    ``torch.cuda.device_count`` asks NVML, which does not initialise CUDA in the calling process (the
    supervisor or launcher), so the node processes it starts can still initialise it themselves.
    """
    return torch.cuda.device_count()


def parse_gpus(text: str) -> tuple[int, ...]:
    """``"0,1,3"`` → (0, 1, 3).

    Raises:
        ValueError: an entry is not a non-negative integer, or an index repeats (one sentence).
    """
    parts = [p.strip() for p in text.split(",")]
    if not parts or any(not p.isdigit() for p in parts):
        raise ValueError(f"--gpus is {text!r}; expected comma-separated GPU indices such as 0,1,2.")
    gpus = tuple(int(p) for p in parts)
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"--gpus is {text!r}; expected each GPU index once.")
    return gpus


@dataclass(frozen=True)
class DeviceMap:
    """This machine's node → device rule.

    Attributes:
        kind: "cpu" or "cuda" (``auto`` already resolved). gpus: CUDA indices, in the order nodes take them
        (empty on the CPU). start: the first node id this machine starts (k = node − start).
    """

    kind: str
    gpus: tuple[int, ...] = ()
    start: int = 0

    def initial(self, node: int) -> str:
        """Device of initial node ``node`` (its k-th local node, k = node − start): ``cuda:gpus[k mod len]``."""
        if self.kind == "cpu":
            return "cpu"
        return f"cuda:{self.gpus[(node - self.start) % len(self.gpus)]}"

    def replacement(self, live: Iterable[str]) -> str:
        """Device of a replacement: the GPU hosting the fewest of ``live`` (this machine's running nodes'
        devices); ties go to the earliest in ``gpus``."""
        if self.kind == "cpu":
            return "cpu"
        load = list(live)
        return min((f"cuda:{g}" for g in self.gpus), key=load.count)

    def describe(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda, GPUs {','.join(map(str, self.gpus))}"

    def to_json(self) -> dict[str, Any]:
        return {"device": self.kind, "gpus": list(self.gpus)}


def resolve_devices(device: str, gpus: str | None, start: int = 0) -> DeviceMap:
    """``--device`` and ``--gpus`` → this machine's :class:`DeviceMap`; checks everything before a node starts.

    Raises:
        ValueError: ``--device cuda`` without a CUDA device; ``--gpus`` with ``--device cpu`` or where ``auto``
            found no CUDA; a GPU index torch does not see; an unknown device (one sentence each).
    """
    if device not in DEVICE_CHOICES:
        raise ValueError(f"--device is {device!r}; expected one of {', '.join(DEVICE_CHOICES)}.")
    count = cuda_device_count()
    if device == "cuda" and count == 0:
        raise ValueError(
            "--device cuda was given, but torch sees no CUDA device on this machine "
            "(torch.cuda.device_count() is 0); expected --device cpu or --device auto."
        )
    if gpus is not None and device == "cpu":
        raise ValueError(
            f"--gpus {gpus} was given with --device cpu; expected --gpus only with cuda or auto."
        )
    if gpus is not None and count == 0:
        raise ValueError(
            f"--gpus {gpus} was given, but torch sees no CUDA device on this machine; expected no --gpus "
            "(the nodes run on the CPU)."
        )
    if device == "cpu" or count == 0:
        return DeviceMap("cpu", (), start)
    chosen = parse_gpus(gpus) if gpus is not None else tuple(range(count))
    missing = [g for g in chosen if g >= count]
    if missing:
        raise ValueError(
            f"--gpus {gpus} names GPU {missing[0]}, but torch sees {count} CUDA device(s) on this machine; "
            f"expected indices in 0..{count - 1}."
        )
    return DeviceMap("cuda", chosen, start)


def prepare_device(name: str) -> torch.device:
    """A node's ``--device`` (``cpu`` or ``cuda:N``) as a torch.device; on CUDA it becomes the current device
    and fp32 matmuls outside autocast may use TF32 (as the simulator's launcher).

    Raises:
        ValueError: ``name`` is not cpu or cuda:N of a visible device.
    """
    device = torch.device(name)
    if device.type == "cpu":
        return device
    if device.type != "cuda" or device.index is None or not 0 <= device.index < cuda_device_count():
        raise ValueError(f"--device is {name!r}; expected cpu or cuda:N of a visible CUDA device.")
    torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    log.info("computing on %s (%s), bf16 autocast", device, torch.cuda.get_device_name(device))
    return device


def autocast_for(device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA (the simulator's ``autocast_context(device, "auto")``); on the CPU a no-op
    context, so a CPU node computes exactly as before."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return autocast_context(device, "auto")
