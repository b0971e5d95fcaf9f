"""Swarms for the tests: the tiny live swarm's config (real node processes on 127.0.0.1, synthetic batches), one
running in a thread, waiting on it, an attacker's socket, and the small doubles of the processless tests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import torch
import zmq

from checkfree.recovery.planner import RecoveryPlan
from checkfree.swarm.config import SwarmConfig, swarm_config_from_dict
from checkfree.swarm.node.context import AttemptClock, NodeContext, StageState
from checkfree.swarm.node.gradient_sync import GradientSync
from checkfree.swarm.node.membership import Membership
from checkfree.swarm.node.recovering import FetchContext, Recovery
from checkfree.swarm.node.stage0_copies import Stage0Copies
from checkfree.swarm.policies import make_policy
from checkfree.swarm.supervisor.supervisor import Supervisor
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType, encode

MODEL = {
    "dataset": "Shakespeare",
    "architecture": "LLaMa",
    "validation": 2,
    "dmodel": 32,
    "num_heads": 2,
    "n_layers_per_stage": 1,
    "n_stages": 3,
    "seq_l": 16,
    "batch_size": 4,
    "mb_count": 2,
    "lr_scale": 1.1,
    "max_iterations": 10,
    "lr": 3e-3,
    "vocab_size": 300,
    "seed": 0,
}
"""The live swarms' model: d 32, vocab 300, 3 transformer stages x 1 layer."""


def live_config(tmp_path: Path, replicas: int, model: dict | None = None, **extra: object):
    """The SwarmConfig of a live test swarm of ``replicas`` per stage (MODEL updated by ``model``, written to
    ``tmp_path / "model.json"``): synthetic batches, no WAN delays, short timeouts; ``extra`` overrides keys."""
    (tmp_path / "model.json").write_text(json.dumps(MODEL | (model or {})))
    return swarm_config_from_dict(
        {
            "model_config": str(tmp_path / "model.json"),
            "replicas": replicas,
            "microbatches": 4,
            "in_flight": 2,
            "time_scale": 0.02,
            "data": "synthetic",
            "heartbeat_interval": 0.2,
            "peer_timeout": 5.0,
            "microbatch_timeout": 30,
            "iteration_timeout": 60,
            "recovery_timeout": 60,
            "request_timeout": 15,
            **extra,
        }
    )


def state_of(msg: Message) -> dict[str, torch.Tensor]:
    """The stage weights a WEIGHTS_RESPONSE carries (its ``w.`` tensors), by parameter name."""
    return W.split(msg.tensors, "w")


class Sent(list):
    """A ``send`` callable that records (peer, meta, tensors)."""

    def __call__(self, peer, mtype, iteration=-1, microbatch=-1, meta=None, tensors=None) -> None:
        self.append((peer, meta, tensors or {}))


def stage0_copies_of(stage: int, setting: str = "ours-plus", node_id: int | None = None) -> Stage0Copies:
    """A Stage0Copies of node 10 + stage, in a tiny swarm (4 transformer stages) whose supervisor has begun
    iteration 4; its sends are recorded in ``.ctx.send``."""
    module = torch.nn.ModuleDict({"embed_tokens": torch.nn.Embedding(4, 2), "norm": torch.nn.LayerNorm(2)})
    state = StageState(module, W.make_optimizer(module, 1e-3))
    membership = Membership(10 + stage, peers={0: {"stage": 0}}, members={0: [0], 1: [11], 4: [14]})
    n_stages = SwarmConfig(model_config="tiny_config.json").n_stages
    active = make_policy(setting).keeps_stage0_copy
    node = 10 + stage if node_id is None else node_id
    ctx = NodeContext(node, stage, AttemptClock(max_version=5), membership, Sent())
    return Stage0Copies(ctx, n_stages, active, state)


class FakeNode:
    """The small state a Recovery or a GradientSync gets (node 20 of stage 1, attempt 4, iteration 3); sends,
    rejections and give-ups are recorded."""

    def __init__(self) -> None:
        self.module = torch.nn.Linear(2, 2)
        self.state = StageState(self.module, W.make_optimizer(self.module, 1e-3))
        self.membership = Membership(20, peers={3: {"stage": 1}, 5: {"stage": 1}}, members={1: [3, 5]})
        self.clock = AttemptClock(attempt=4, iteration=3)
        model = SimpleNamespace(grad_clip=1.0, grad_norm_mode="paper", lr=1e-3, lr_scale=1.1, init_std=0.02)
        self.cfg = SimpleNamespace(
            request_timeout=60.0,
            max_attempts=2,
            mb_count=4,
            replicas=2,
            storage_id=9,
            init_seed=0,
            model=model,
        )
        self.sent: list[tuple[int, dict]] = []
        self.rejected: list[str] = []
        self.gave_up: list[str] = []
        self.done: list[tuple[StageState, dict]] = []
        self.ctx = NodeContext(20, 1, self.clock, self.membership, self.send)
        self.fetch = FetchContext(self.ctx, self.cfg, self.reject)

    def send(self, peer, mtype, iteration=-1, microbatch=-1, meta=None, tensors=None) -> None:
        self.sent.append((peer, meta))

    def reject(self, msg: Message, why: str) -> None:
        self.rejected.append(why)

    def recovery(self, plan: RecoveryPlan) -> Recovery:
        return Recovery(
            self.fetch, plan, self.state, lambda *done: self.done.append(done), self.gave_up.append
        )

    def gradient_sync(self) -> GradientSync:
        return GradientSync(self.ctx, self.state, self.cfg, lambda: 4)


def weights_answer(node: FakeNode, sender: int, request: str, **change) -> Message:
    """A WEIGHTS_RESPONSE from ``sender`` to ``node``'s ``request`` with its own weights (version 3);
    ``change`` replaces its ``meta`` keys or its ``tensors``."""
    tensors = {f"w.{k}": v.clone() for k, v in node.module.state_dict().items()}
    meta = {"stage": 1, "request": request, "version": 3, "grad_norm": 0.5, "lr": 1e-3, "step": 3}
    return Message(
        MessageType.WEIGHTS_RESPONSE,
        sender,
        meta=meta | change.get("meta", {}),
        tensors=change.get("tensors", tensors),
    )


class Attacker:
    """A raw PUSH socket to one swarm process, optionally holding the CURVE key of swarm identity ``as_id``."""

    def __init__(self, sup: Supervisor, target: int, as_id: int | None, key: str = "token") -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 0)
        keys = (
            sup.state.keys
        )  # the supervisor's: every identity's key (a machine's token derives its own only)
        assert keys is not None
        address = sup.address if target == SUPERVISOR_ID else sup.node_address(target)
        assert address is not None
        if key == "token":
            self.sock.curve_serverkey = keys.public_key(target).encode()
            self.sock.curve_secretkey = keys.secret_key(as_id)
            self.sock.curve_publickey = keys.public_key(as_id).encode()
        elif key == "random":
            public, secret = zmq.curve_keypair()
            self.sock.curve_serverkey = keys.public_key(target).encode()
            self.sock.curve_secretkey, self.sock.curve_publickey = secret, public
        self.sock.connect(address)

    def send(self, *msgs: Message) -> None:
        for msg in msgs:
            self.sock.send_multipart([bytes(f) for f in encode(msg)])

    def close(self) -> None:
        time.sleep(0.3)  # let libzmq hand the frames over before linger-0 close
        self.sock.close(0)
        self.ctx.term()


def wait_until(cond, sup: Supervisor, thread: threading.Thread | None = None, timeout: float = 90.0) -> None:
    """Poll ``cond()`` every 50 ms; fail when the swarm's thread (``sup.thread`` by default) stops or after
    ``timeout`` s."""
    thread = thread or sup.thread  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while not cond():
        assert thread.is_alive(), "the swarm stopped"
        assert time.monotonic() < deadline, "timed out waiting for the swarm"
        time.sleep(0.05)


def node_report(sup: Supervisor, node: int) -> dict:
    """The last statistics ``node`` reported to the supervisor ({} before its first)."""
    return sup.results.reports.get(node, {})


def after_commits(sup: Supervisor, n: int = 2) -> None:
    """Wait until ``n`` more iterations are committed (the reports are fresh and the swarm is alive)."""
    rows = len(sup.results.rows)
    wait_until(lambda: len(sup.results.rows) >= rows + n, sup)


def running_swarm(tmp: Path) -> Iterator[Supervisor]:
    """A live 2-stage × 2-replica ``ours`` swarm in ``tmp`` that has committed two iterations; shut down in order
    after the yield (the module fixtures of the insider tests)."""
    cfg = live_config(tmp, replicas=2, model={"n_stages": 2}, microbatch_timeout=10, iteration_timeout=40)
    sup = Supervisor(cfg, "ours", {}, iterations=10_000, run_dir=tmp / "run", vocab_size=300)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(sup.run()), daemon=True)
    thread.start()
    sup.thread = thread  # type: ignore[attr-defined]
    sup.result = result  # type: ignore[attr-defined]
    wait_until(lambda: len(sup.results.rows) >= 2, sup, thread)
    yield sup
    sup.iterations = 0  # finish the current iteration, then shut down in order
    thread.join(timeout=60)
