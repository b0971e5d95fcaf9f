"""Tensors between a node's device and the wire: host bytes out through one reused pinned buffer, device in.

Outgoing (:meth:`HostStaging.to_host`): every device tensor of a message is copied with ``non_blocking=True``
into a slice of one page-locked host buffer (64-byte aligned slices), then the node waits once for the copies
(``torch.cuda.synchronize``) before the host tensors go to the transport. The buffer is reused by every
message and grows only when a message is larger than any before (at most a handful of allocations per run:
activations, gradients, weights). The host tensors returned are views of that buffer and stay valid until the
next call: this relies on ``Transport.send`` copying the bytes before it returns (``encode(copy=True)``),
which ``tests/swarm/test_devices.py`` checks through a real transport.

Incoming (:meth:`HostStaging.to_device`): a decoded message's tensors go to the node's device, so the stage,
the gradient average (checkfree.swarm.node.gradient_sync) and the recovery math (checkfree.recovery.math)
run where the tensors live.

On the CPU both are the identity (the same dict, the same tensors): pinning needs CUDA, and a CPU node must
compute bit-identically to one without staging. ``force=True`` runs the buffer logic on the CPU (tests).
"""

from __future__ import annotations

import torch

ALIGN = 64
"""Byte alignment of each tensor's slice of the buffer (any dtype's element size divides it)."""


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class HostStaging:
    """One node's staging between ``device`` and host bytes.

    Args:
        device: where the node's tensors live. force: stage through the buffer even on the CPU (tests only).
    """

    def __init__(self, device: torch.device, force: bool = False) -> None:
        self.device = device
        self.active = device.type == "cuda" or force
        self.pin = device.type == "cuda"
        self.buffer = torch.empty(0, dtype=torch.uint8)
        self.allocations = 0
        """Times the buffer was (re)allocated: grows with the largest message, not with the message count."""

    def _reserve(self, nbytes: int) -> torch.Tensor:
        if self.buffer.numel() < nbytes:
            self.buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)
            self.allocations += 1
        return self.buffer

    def to_host(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Host copies of ``tensors`` (same names, dtypes, shapes and bytes), valid until the next call.

        On the CPU (without ``force``) returns ``tensors`` itself.
        """
        if not self.active or not tensors:
            return tensors
        sizes = [_aligned(t.numel() * t.element_size()) for t in tensors.values()]
        buffer = self._reserve(sum(sizes))
        out: dict[str, torch.Tensor] = {}
        offset = 0
        for (name, t), size in zip(tensors.items(), sizes, strict=True):
            nbytes = t.numel() * t.element_size()
            host = buffer[offset : offset + nbytes].view(t.dtype).view(t.shape)
            host.copy_(t.detach(), non_blocking=self.pin)
            out[name] = host
            offset += size
        if self.pin:
            torch.cuda.synchronize(self.device)  # the one wait: every copy has landed before the bytes leave
        return out

    def to_device(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``tensors`` on the node's device (copied on the stream; the host source is not reused)."""
        if not self.pin or not tensors:
            return tensors
        return {name: t.to(self.device, non_blocking=True) for name, t in tensors.items()}
