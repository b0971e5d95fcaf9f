"""The swarm's forkserver starts with PYTORCH_NVML_BASED_CUDA_CHECK set, whatever device its first node has: the
server keeps the environment it started with for every node it forks (checkfree/swarm/forkserver.py)."""

from __future__ import annotations

import os

from checkfree.swarm import forkserver


def test_the_forkserver_context_sets_the_nvml_cuda_check_before_the_server_starts(monkeypatch):
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    monkeypatch.setattr(forkserver, "_FORKSERVER", None)
    forkserver.forkserver_context()  # what LocalHost.spawn calls before the first node's Process.start (CPU or CUDA)
    assert os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"


def test_a_value_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "0")
    monkeypatch.setattr(forkserver, "_FORKSERVER", None)
    forkserver.forkserver_context()
    assert os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] == "0"
