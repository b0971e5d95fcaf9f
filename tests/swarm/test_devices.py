"""Swarm nodes on devices (issue 11, GPU workers): the node → device map, ``--device``/``--gpus`` resolution and
errors, the dry run's map, host staging, and the CPU path left bit-identical. CUDA itself is monkeypatched:
the logic that decides and stages runs here; the kernels run only on a CUDA machine (benchmarks/gpu_check.sh).
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import time

import pytest
import torch

from checkfree.config import load_config
from checkfree.swarm import devices as D
from checkfree.swarm.config import load_swarm_config
from checkfree.swarm.devices import DeviceMap, autocast_for, parse_gpus, resolve_devices
from checkfree.swarm.hosts import LocalHost
from checkfree.swarm.node.compute import StageWorker, build_stage
from checkfree.swarm.supervisor.results import Results
from checkfree.swarm.wire.protocol import Message, MessageType
from checkfree.swarm.wire.staging import HostStaging
from checkfree.swarm.wire.transport import Transport

from helpers import ROOT
from helpers.cli import assert_user_error, run_cli, swarm_argv

pytestmark = pytest.mark.timeout(60)


def test_the_kth_local_node_uses_gpus_k_mod_len() -> None:
    m = DeviceMap("cuda", (2, 0, 1), start=7)
    assert [m.initial(n) for n in range(7, 14)] == [f"cuda:{g}" for g in (2, 0, 1, 2, 0, 1, 2)]
    assert DeviceMap("cuda", (3,), start=0).initial(5) == "cuda:3"
    assert DeviceMap("cpu").initial(4) == "cpu" and DeviceMap("cpu").replacement(["cpu"]) == "cpu"


def test_a_replacement_takes_the_gpu_with_the_fewest_live_nodes() -> None:
    m = DeviceMap("cuda", (2, 0, 1))
    assert m.replacement(["cuda:2", "cuda:1", "cuda:2", "cuda:0", "cuda:1"]) == "cuda:0"
    assert m.replacement(["cuda:0", "cuda:1"]) == "cuda:2"
    assert m.replacement([]) == "cuda:2"  # ties: the earliest in --gpus


def test_the_host_puts_each_node_on_its_device_and_a_replacement_on_the_crashed_nodes_gpu(tmp_path) -> None:
    class Proc:
        def __init__(self, code: int | None) -> None:
            self.code = code

        def poll(self) -> int | None:
            return self.code

    host = LocalHost(tmp_path, "tcp://127.0.0.1:1", devices=DeviceMap("cuda", (0, 1)), keys=None)
    for n in range(4):
        host.node_devices[n] = host.device_for(n, n // 2, False)
        host.procs[n] = Proc(None)
    assert host.node_devices == {0: "cuda:0", 1: "cuda:1", 2: "cuda:0", 3: "cuda:1"}
    host.procs[3].code = -9  # node 3 (on cuda:1) was killed
    assert host.device_for(10, 1, True) == "cuda:1"
    assert host.device_for(11, -1, False) is None  # the storage node holds bytes, not a model
    cmd = host.command(10, 1, "Iowa", True, "cuda:1")
    assert cmd[cmd.index("--device") + 1] == "cuda:1"
    assert "--device" not in LocalHost(tmp_path, "tcp://127.0.0.1:1").command(0, 0, "Iowa", False)
    host.procs.clear()


@pytest.mark.parametrize(
    ("device", "gpus", "count", "want"),
    [
        ("auto", None, 0, DeviceMap("cpu")),
        ("auto", None, 3, DeviceMap("cuda", (0, 1, 2))),
        ("cuda", "2,0", 3, DeviceMap("cuda", (2, 0))),
        ("cpu", None, 3, DeviceMap("cpu")),
        ("auto", " 1 ", 2, DeviceMap("cuda", (1,))),
    ],
)
def test_auto_is_cuda_when_torch_sees_a_device(monkeypatch, device, gpus, count, want) -> None:
    monkeypatch.setattr(D, "cuda_device_count", lambda: count)
    assert resolve_devices(device, gpus) == want


@pytest.mark.parametrize(
    ("device", "gpus", "count", "fragment"),
    [
        ("cuda", None, 0, "--device cuda was given, but torch sees no CUDA device"),
        ("cpu", "0", 2, "--gpus 0 was given with --device cpu"),
        ("auto", "0", 0, "--gpus 0 was given, but torch sees no CUDA device"),
        ("cuda", "0,5", 2, "names GPU 5, but torch sees 2 CUDA device(s)"),
        ("cuda", "a,b", 2, "expected comma-separated GPU indices"),
        ("cuda", "", 2, "expected comma-separated GPU indices"),
        ("cuda", "1,1", 2, "expected each GPU index once"),
        ("tpu", None, 2, "--device is 'tpu'"),
    ],
)
def test_device_errors_name_the_value_and_what_was_expected(monkeypatch, device, gpus, count, fragment):
    monkeypatch.setattr(D, "cuda_device_count", lambda: count)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        resolve_devices(device, gpus)
    assert parse_gpus("3,0") == (3, 0)


def test_dry_run_shows_the_node_device_map_on_two_gpus(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(D, "cuda_device_count", lambda: 2)
    rc, out, err = run_cli(
        swarm_argv(tmp_path, "--dry-run", "--gpus", "1,0", "--start", "2", "--end", "7"), capsys
    )
    assert rc == 0, err
    mapping = re.findall(r"^node (\d+) \(stage (\d+)\) -> (\S+)$", out, re.M)
    assert mapping == [("2", "1", "cuda:1"), ("3", "1", "cuda:0"), ("4", "2", "cuda:1")] + [
        ("5", "2", "cuda:0"),
        ("6", "3", "cuda:1"),
    ]
    commands = [line for line in out.splitlines() if "checkfree.swarm.node.node" in line]
    assert [c.split("--device ")[1].split()[0] for c in commands] == [d for _, _, d in mapping]
    rc, _, err = run_cli(swarm_argv(tmp_path, "--dry-run", "--device", "cuda", "--gpus", "0,5"), capsys)
    assert_user_error(rc, err, "--gpus 0,5 names GPU 5")
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(120)
def test_dry_run_of_the_launcher_prints_one_device_line_per_node(tmp_path) -> None:
    env = dict(os.environ, DRY_RUN="1")
    out = subprocess.run(
        [str(ROOT / "communication" / "run_throughput.sh"), "0", "10", "ours", "16"]
        + ["--config", "configs/swarm_tiny.json", "--no-schedule", "--device", "cpu"]
        + ["--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=env,
        timeout=110,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    mapping = re.findall(r"^node (\d+) \(stage (\d+)\) -> (\S+)$", out.stdout, re.M)
    assert mapping == [(str(n), str(n // 2), "cpu") for n in range(10)]
    assert not (tmp_path / "run").exists()


TENSORS = {
    "w.a": torch.randn(3, 5),
    "w.t": torch.randn(4, 6).t(),  # not contiguous
    "ids": torch.arange(7, dtype=torch.int64),
    "odd": torch.tensor([1, 2, 3], dtype=torch.uint8),
    "bf": torch.randn(2, 3).to(torch.bfloat16),
    "mask": torch.tensor([True, False]),
    "scalar": torch.tensor(2.5),
    "empty": torch.zeros(0, 4),
}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]) for k in a
    )


def test_on_the_cpu_staging_is_the_identity() -> None:
    staging = HostStaging(torch.device("cpu"))
    assert staging.to_host(TENSORS) is TENSORS and staging.to_device(TENSORS) is TENSORS
    assert staging.allocations == 0 and not staging.buffer.is_pinned()


def test_staging_round_trip_keeps_bytes_dtypes_and_shapes_and_reuses_one_buffer() -> None:
    staging = HostStaging(torch.device("cpu"), force=True)
    out = staging.to_host(TENSORS)
    assert _same(out, TENSORS) and all(
        out[k].data_ptr() != TENSORS[k].data_ptr() for k in out if out[k].numel()
    )
    ptr = staging.buffer.data_ptr()
    for _ in range(5):
        small = staging.to_host({"activations": torch.randn(2, 4, 8)})
    assert staging.allocations == 1 and staging.buffer.data_ptr() == ptr  # reused, not one per message
    assert small["activations"].data_ptr() == ptr
    staging.to_host({"w.big": torch.randn(1000, 100)})
    assert staging.allocations == 2  # grows once for a larger message


@pytest.mark.timeout(20)
def test_staged_tensors_survive_the_next_message_through_a_real_transport() -> None:
    """The buffer is overwritten by the next send: Transport.send must have copied the bytes already."""
    a, b = Transport(0), Transport(1)
    try:
        a.connect(1, b.address)
        staging = HostStaging(torch.device("cpu"), force=True)
        first = {"activations": torch.randn(2, 3, 4)}
        second = {"activations": torch.randn(2, 3, 4)}
        for tensors in (first, second):
            a.send(1, Message(MessageType.FORWARD, 0, 0, 0, _fwd_meta(), staging.to_host(tensors)))
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            msg = b.recv(0.1)
            if msg is not None:
                got.append(msg.tensors)
        assert len(got) == 2 and _same(got[0], first) and _same(got[1], second)
    finally:
        a.close()
        b.close()


def _fwd_meta() -> dict:
    return {"stage": 1, "attempt": 0, "route": [0, 2, 4], "pos": 1, "pipeline": 0}


def test_a_cpu_stage_computes_bit_identically_to_the_plain_module() -> None:
    """The CPU path of the device-aware worker: no autocast, no copies; every number equals the plain forward
    and backward of the same module (what the node computed before devices existed)."""
    cfg = load_config("tiny_config.json", {"dmodel": 32, "num_heads": 2, "seq_l": 8, "batch_size": 2})
    cpu = torch.device("cpu")
    with autocast_for(cpu):
        assert not torch.is_autocast_enabled("cpu")
    for stage in (1, 0):
        module = build_stage(cfg, stage, 64, seed=1, device=cpu)
        ref = copy.deepcopy(module)
        worker = StageWorker(module, stage)
        g = torch.randn(2, 8, 32)
        if stage == 1:
            x = torch.randn(2, 8, 32)
            y = worker.forward((0, 0), x.clone())
            gx = worker.backward((0, 0), g)
            xr = x.clone().requires_grad_()
            yr = ref(xr)
            yr.backward(g)
            assert torch.equal(y, yr.detach()) and torch.equal(gx, xr.grad)
        else:
            ids, labels = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
            h = worker.embed((0, 0), ids)
            loss, gh = worker.head_loss((0, 0), h.clone(), labels, 2)
            assert worker.embed_backward((0, 0), gh)
            hr = ref.embed(ids)
            hh = hr.detach().clone().requires_grad_()
            logits = ref.head(hh)
            lr = torch.nn.functional.cross_entropy(logits.float().reshape(-1, 64), labels.reshape(-1))
            (lr / 2).backward()
            hr.backward(hh.grad)
            assert torch.equal(h, hr.detach()) and loss == float(lr.detach()) and torch.equal(gh, hh.grad)
        worker.settle()  # the attempt's sync
        for (name, p), (_, q) in zip(module.named_parameters(), ref.named_parameters(), strict=True):
            assert p.device == cpu and p.dtype == torch.float32
            assert torch.equal(p.grad, q.grad), name


def test_throughput_json_records_each_nodes_device(tmp_path) -> None:
    devices: dict[int, str] = {}  # the host's, filled as it starts nodes (held by Results, not copied)
    results = Results(load_swarm_config("swarm_tiny.json"), "ours", 1, node_devices=devices)
    devices.update({0: "cuda:0", 1: "cuda:1", 10: "cuda:1"})
    saved = results.finish(tmp_path)
    assert json.loads((tmp_path / "throughput.json").read_text())["node_devices"] == {
        "0": "cuda:0",
        "1": "cuda:1",
        "10": "cuda:1",
    }
    assert saved["node_devices"]["10"] == "cuda:1"


def test_under_bf16_autocast_a_stage_sends_fp32_and_keeps_fp32_master_weights() -> None:
    """The CUDA path's autocast logic, run on the CPU (bf16 matmuls are slow here: micro sizes): what leaves
    the stage is fp32 (the wire's dtype), the backward accepts the fp32 gradient, parameters and their
    gradients stay fp32, and the numbers are those of the fp32 stage within bf16 precision."""
    cfg = load_config("tiny_config.json", {"dmodel": 32, "num_heads": 2, "seq_l": 8, "batch_size": 2})
    for stage in (1, 0):
        module = build_stage(cfg, stage, 64, seed=2)
        ref = StageWorker(copy.deepcopy(module), stage)
        worker = StageWorker(module, stage)
        worker.autocast = torch.autocast("cpu", dtype=torch.bfloat16)  # what autocast_for gives on CUDA
        g = torch.randn(2, 8, 32) * 0.1
        if stage == 1:
            x = torch.randn(2, 8, 32)
            outs = [w.forward((0, 0), x.clone()) for w in (worker, ref)]
            grads = [w.backward((0, 0), g) for w in (worker, ref)]
        else:
            ids, labels = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
            outs = [w.embed((0, 0), ids) for w in (worker, ref)]
            heads = [w.head_loss((0, 0), outs[0].clone(), labels, 2) for w in (worker, ref)]
            assert abs(heads[0][0] - heads[1][0]) < 0.05
            grads = [h[1] for h in heads]
            assert all(w.embed_backward((0, 0), grad) for w, grad in zip((worker, ref), grads, strict=True))
        for a, b in (outs, grads):
            assert a.dtype == torch.float32 and torch.isfinite(a).all()
            assert torch.allclose(a, b, atol=0.05, rtol=0.05)
        worker.settle()  # the attempt's sync
        for p in module.parameters():
            assert p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
