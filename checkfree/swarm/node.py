"""One swarm node = one process = one stage replica: join, serve microbatches, average gradients, recover.

Life of a node (``python -m checkfree.swarm.node --id N --stage S --location L --bootstrap ADDR``):

1. **Join**: connect to the bootstrap (the supervisor), send JOIN (stage, location, address). The WELCOME
   reply carries the resolved swarm config, the peer table and the checkpoint version; the node connects to
   every peer (full mesh, each link WAN-emulated by :class:`SwarmNetEm`) and builds its stage.
2. **Recover** (replacements only, ``--replacement``): ask the setting's plan (checkfree.swarm.strategies)
   which stages to fetch, send WEIGHTS_REQUEST to a serving node of each (or the storage node), combine the
   answers with the shared recovery math (``copy_state`` / ``weighted_average``) and report ``serving``.
   An unanswered request is re-sent to the next candidate after ``request_timeout``; after
   ``max_attempts`` rounds the node reports ``recovery_failed`` and exits (the supervisor retries).
3. **Iterate**, driven by the supervisor's CONTROL commands, one *epoch* per attempt of an iteration:
   ``begin`` (stage 0 starts its pipeline, see checkfree.swarm.worker) → every node forwards/backwards what
   arrives → stage 0 sends ITERATION_END → ``sync``: the replicas of each stage average their gradients
   (checkfree.swarm.gradient_sync: node-id order, bit-identical on every replica, divided by the number of
   pipelines), record the unclipped norm ω (SPEC §2), clip and report ``ready`` → ``commit``: Adam
   step (and, on checkpoint iterations, the designated replica ships weights + Adam state to storage) →
   ``committed``. ``abort`` drops the epoch's activations and gradients; nothing has been stepped.
4. **Serve weights** at any time: WEIGHTS_REQUEST → WEIGHTS_RESPONSE with the weights, the last gradient
   norm, and (if asked) Adam's moments, step and lr. Under ``ours-plus`` stage 0 also pushes its embedding
   and head to stages 1 and S after each step, and those serve the copies to a stage-0 replacement
   (checkfree.swarm.stage0_copies).
5. **Leave** on ``shutdown`` (final stats to the supervisor), or exit by itself when the supervisor has
   been silent for ``peer_timeout`` seconds: a node never outlives its swarm.

Peer messages that pass the wire format but make no sense (wrong stage, unknown microbatch, bad shape) are
dropped with a warning and counted in ``bad_messages``; the node keeps serving.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch

from checkfree.swarm import weights as W
from checkfree.swarm.config import swarm_config_from_dict
from checkfree.swarm.gradient_sync import GradientSync
from checkfree.swarm.netem import NetEm
from checkfree.swarm.pipeline_driver import PipelineDriver
from checkfree.swarm.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError
from checkfree.swarm.recovering import Recovery, Rollback
from checkfree.swarm.stage0_copies import Stage0Copies
from checkfree.swarm.strategies import RecoveryImpossible, make_recovery
from checkfree.swarm.transport import Transport, TransportError
from checkfree.swarm.worker import StageWorker, build_stage

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 120.0
"""Seconds a new node waits for the supervisor's WELCOME before it gives up."""
MAX_FUTURE = 2000
"""Messages of a not-yet-begun epoch buffered at most (a flood of them is dropped)."""


class SwarmNetEm(NetEm):
    """NetEm for swarm links; the supervisor's control plane (id -1) is not emulated (it is measurement
    scaffolding, not part of the paper's protocol)."""

    def reserve(self, src: int, dst: int, nbytes: int, now: float | None = None) -> float:
        if src < 0 or dst < 0:
            return self.clock() if now is None else now
        return super().reserve(src, dst, nbytes, now)

    def latency_only(self, src: int, dst: int, now: float | None = None) -> float:
        if src < 0 or dst < 0:
            return self.clock() if now is None else now
        return super().latency_only(src, dst, now)


class Node:
    """A stage replica. Args: ids and addresses as on the command line; ``cache_dir``: data cache."""

    def __init__(
        self,
        node_id: int,
        stage: int,
        location: str,
        bootstrap: str,
        bind_host: str = "127.0.0.1",
        advertise_host: str | None = None,
        replacement: bool = False,
        cache_dir: Path | None = None,
    ):
        self.id, self.stage, self.location = node_id, stage, location
        self.bootstrap, self.replacement = bootstrap, replacement
        self.cache_dir = cache_dir
        self.netem = SwarmNetEm(time_scale=0.0)
        self.transport = Transport(node_id, bind_host=bind_host, netem=self.netem)
        self.address = self.transport.address
        if advertise_host:
            self.address = f"tcp://{advertise_host}:{self.address.rsplit(':', 1)[1]}"
        self.peers: dict[int, dict[str, Any]] = {}
        self.epoch, self.iteration, self.version = -1, -1, 0
        self.members: dict[int, list[int]] = {}
        self.future: list[Message] = []
        self.grad_norm = 1.0  # ω before any completed iteration (SPEC §2)
        self.serving = False
        self.done = False
        self.bad_messages = 0
        self.step_s = 0.0
        self.task: Recovery | Rollback | None = None
        self.stage0_copies = Stage0Copies(self)
        self.gradients = GradientSync(self)

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> int:
        """Join, (recover,) serve until shutdown; returns the process exit code."""
        try:
            self.transport.connect(SUPERVISOR_ID, self.bootstrap)
            self.send(
                SUPERVISOR_ID,
                MessageType.JOIN,
                meta={
                    "stage": self.stage,
                    "location": self.location,
                    "address": self.address,
                    "replacement": self.replacement,
                },
            )
            welcome = self._wait_welcome()
            if welcome is None:
                log.error(
                    "node %d: no WELCOME from %s within %.0f s; exiting",
                    self.id,
                    self.bootstrap,
                    JOIN_TIMEOUT_S,
                )
                return 3
            self._setup(welcome.meta)
            if self.replacement:
                try:
                    plan = self.strategy.plan(self.stage, self._lost_stages(), self.cfg.n_stages)
                except RecoveryImpossible as exc:
                    self.give_up(str(exc))
                    time.sleep(0.5)  # let the report leave
                    return 4
                self.task = Recovery(self, plan, welcome.meta.get("checkpoint_version", 0))
                self.task.start()
            else:
                self._serve({"rule": "initial"})
            while not self.done:
                msg = self.transport.recv(timeout=0.05)
                if msg is not None:
                    self.dispatch(msg)
                if self._tick():
                    return 3
            return 0
        finally:
            self.transport.close()

    def _wait_welcome(self) -> Message | None:
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while time.monotonic() < deadline:
            msg = self.transport.recv(timeout=0.1)
            if msg is None:
                continue
            if (
                msg.type == MessageType.CONTROL
                and msg.sender == SUPERVISOR_ID
                and msg.meta["command"] == "welcome"
            ):
                return msg
            self.future.append(msg)
        return None

    def _setup(self, meta: dict[str, Any]) -> None:
        self.cfg = swarm_config_from_dict(meta["config"], "WELCOME config")
        self.model_cfg = self.cfg.model
        self.strategy = make_recovery(meta["setting"])
        self.transport.heartbeat_interval = self.cfg.heartbeat_interval
        self.transport.peer_timeout = self.cfg.peer_timeout
        self.netem = SwarmNetEm(self.cfg.location_table(), self.cfg.geo(), time_scale=self.cfg.time_scale)
        self.transport.netem = self.netem
        self.storage_id = self.cfg.storage_id
        self._update_peers(meta["peers"])
        self.members = {int(s): ids for s, ids in meta["members"].items()}
        self.module = build_stage(self.model_cfg, self.stage, meta["vocab_size"], self.cfg.init_seed)
        self.opt = W.make_optimizer(self.module, self.model_cfg.lr)
        self.worker = StageWorker(self.module, self.stage)
        self.driver = PipelineDriver(self, meta) if self.stage == 0 else None
        log.info(
            "node %d: stage %d at %s, %s, %d peers, setting %s",
            self.id,
            self.stage,
            self.location,
            self.address,
            len(self.peers),
            self.strategy.name,
        )

    def _serve(self, record: dict[str, Any]) -> None:
        self.serving = True
        self.task = None
        self.send(
            SUPERVISOR_ID,
            MessageType.CONTROL,
            meta={"command": "serving", "stage": self.stage, "version": self.version, "record": record},
        )
        for msg in self._take_future(lambda m: m.type == MessageType.WEIGHTS_REQUEST):
            self.dispatch(msg)

    def _tick(self) -> bool:
        """Timeouts; True when the node must exit (its supervisor is gone)."""
        if SUPERVISOR_ID in self.transport.dead_peers():
            log.error(
                "node %d: the supervisor has been silent for %.1f s; exiting",
                self.id,
                self.transport.peer_timeout,
            )
            return True
        if self.task is not None:
            self.task.tick()
        if self.driver is not None:
            self.driver.tick()
        return False

    # ------------------------------------------------------------------ messaging

    def send(
        self,
        peer: int,
        mtype: MessageType,
        iteration: int = -1,
        microbatch: int = -1,
        meta: dict[str, Any] | None = None,
        tensors: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """Send to a connected peer; a peer that is gone is logged (the supervisor handles the death)."""
        meta = meta if meta is not None else {}
        meta.setdefault("stage", self.stage)
        try:
            self.transport.send(peer, Message(mtype, self.id, iteration, microbatch, meta, tensors or {}))
        except (TransportError, ProtocolError) as exc:  # a peer gone meanwhile: the timeouts recover
            log.warning("node %d: could not send %s to %d: %s", self.id, mtype.name, peer, exc)

    def _update_peers(self, rows: list[list[Any]]) -> None:
        """Connect to every listed peer ([id, stage, location, address]); forget peers no longer listed."""
        listed = set()
        for pid, stage, location, address in rows:
            if pid == self.id:
                continue
            listed.add(pid)
            old = self.peers.get(pid)
            if old is None or old["address"] != address:
                self.netem.set_location(pid, location)
                self.transport.connect(pid, address)
            self.peers[pid] = {"stage": stage, "location": location, "address": address}
        for pid in set(self.peers) - listed:
            self.peers.pop(pid)
            self.transport.disconnect(pid)

    def _take_future(self, keep) -> list[Message]:
        taken = [m for m in self.future if keep(m)]
        self.future = [m for m in self.future if not keep(m)]
        return taken

    def _lost_stages(self) -> set[int]:
        return {s for s in range(self.cfg.n_stages + 1) if not self.members.get(s)}

    def dispatch(self, msg: Message) -> None:
        """Route one message; nonsense from a peer is logged and counted, never fatal."""
        handler = {
            MessageType.FORWARD: self._on_pipeline,
            MessageType.BACKWARD: self._on_pipeline,
            MessageType.GRADIENTS: self.gradients.on_gradients,
            MessageType.WEIGHTS_REQUEST: self._on_weights_request,
            MessageType.WEIGHTS_RESPONSE: self._on_weights_response,
            MessageType.CONTROL: self._on_control,
            MessageType.STAGE0_COPY: self.stage0_copies.on_copy,
        }.get(msg.type)
        if handler is None:
            return  # JOIN / LEAVE / ITERATION_END addressed to a node: nothing to do
        try:
            handler(msg)
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError, AttributeError) as exc:
            self.bad_messages += 1
            log.warning(
                "node %d: dropped a %s from %d that does not fit: %s: %s",
                self.id,
                msg.type.name,
                msg.sender,
                type(exc).__name__,
                exc,
            )

    def epoch_of(self, msg: Message) -> int | None:
        """The message's epoch; None (dropped) when stale, buffered when it is ahead of this node."""
        epoch = msg.meta["epoch"]
        if not isinstance(epoch, int):
            raise ValueError(f"epoch is {epoch!r}; expected an integer")
        if epoch > self.epoch:
            if len(self.future) < MAX_FUTURE:
                self.future.append(msg)
            return None
        return epoch if epoch == self.epoch else None

    # ------------------------------------------------------------------ pipeline and gradients

    def _on_pipeline(self, msg: Message) -> None:
        if not self.serving or self.epoch_of(msg) is None:
            return
        route, pos, pipeline = msg.meta["route"], msg.meta["pos"], msg.meta["pipeline"]
        key = (int(pipeline), msg.microbatch)
        tensor = msg.tensors["activations" if msg.type == MessageType.FORWARD else "gradients"]
        if tensor.dtype != torch.float32 or tensor.dim() != 3 or tensor.shape[-1] != self.model_cfg.dmodel:
            raise ValueError(
                f"tensor is {tuple(tensor.shape)} {tensor.dtype}; expected (B, T, "
                f"{self.model_cfg.dmodel}) float32"
            )
        if self.driver is not None:
            self.driver.on_message(msg, route, pos, key, tensor)
            return
        if route[pos] != self.id:
            raise ValueError(f"route position {pos} names node {route[pos]}, not this node")
        meta = {"epoch": self.epoch, "route": route, "pipeline": pipeline}
        if msg.type == MessageType.FORWARD:
            out = self.worker.forward(key, tensor)
            nxt = pos + 1
            self.send(
                route[nxt % len(route)],
                MessageType.FORWARD,
                self.iteration,
                msg.microbatch,
                {**meta, "pos": nxt},
                {"activations": out},
            )
        else:
            grad = self.worker.backward(key, tensor)
            if grad is None:
                raise ValueError(f"no saved forward for pipeline {key[0]} microbatch {key[1]}")
            self.send(
                route[pos - 1],
                MessageType.BACKWARD,
                self.iteration,
                msg.microbatch,
                {**meta, "pos": pos - 1},
                {"gradients": grad},
            )

    def _begin(self, meta: dict[str, Any]) -> None:
        self.epoch, self.iteration = meta["epoch"], meta["iteration"]
        self.members = {int(s): ids for s, ids in meta["members"].items()}
        self.worker.reset()
        self.gradients.reset()
        self.stage0_copies.push()  # holders that joined since the last step
        if self.driver is not None:
            self.driver.begin()
        for msg in self._take_future(lambda m: m.meta.get("epoch") == self.epoch):
            self.dispatch(msg)
        self.future = [
            m
            for m in self.future
            if not (isinstance(m.meta.get("epoch"), int) and m.meta["epoch"] < self.epoch)
        ]

    def _commit(self, meta: dict[str, Any]) -> None:
        if meta["epoch"] != self.epoch:
            return
        t0 = time.thread_time()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step_s += time.thread_time() - t0  # CPU seconds
        self.version, self.grad_norm = meta["iteration"] + 1, self.gradients.norm
        if self.id in meta.get("checkpoint_senders", []):
            self.send_checkpoint()
        self.stage0_copies.push()
        self.worker.reset()
        self.send(
            SUPERVISOR_ID,
            MessageType.CONTROL,
            self.iteration,
            meta={"command": "committed", "epoch": self.epoch, **self.report()},
        )

    def report(self) -> dict[str, Any]:
        """Cumulative stats for the supervisor: bytes per message type, compute seconds, bad messages."""
        stats = self.transport.stats
        return {
            "sent_bytes": stats["sent_bytes"],
            "sent_messages": stats["sent_messages"],
            "dropped_malformed": stats["dropped_malformed"],
            "bad_messages": self.bad_messages,
            "compute": {**self.worker.compute, "step_cpu_s": self.step_s},
            "version": self.version,
        }

    # ------------------------------------------------------------------ weights and checkpoints

    def weights_meta(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "grad_norm": self.grad_norm,
            "lr": W.current_lr(self.opt),
            "step": W.adam_step(self.opt),
        }

    def send_checkpoint(self) -> None:
        """Ship weights + Adam state to the storage node (asynchronous: the send never blocks)."""
        self.send(
            self.storage_id,
            MessageType.WEIGHTS_RESPONSE,
            self.iteration,
            meta={**self.weights_meta(), "checkpoint": self.version},
            tensors=W.stage_tensors(self.module, self.opt),
        )

    def _on_weights_request(self, msg: Message) -> None:
        meta = msg.meta
        if not self.serving:
            self.future.append(msg)  # answered once this node serves
            return
        if msg.sender not in self.peers and isinstance(meta.get("address"), str):
            self.netem.set_location(msg.sender, str(meta.get("location", "")))
            self.transport.connect(msg.sender, meta["address"])
            self.peers[msg.sender] = {
                "stage": -1,
                "location": meta.get("location"),
                "address": meta["address"],
            }
        reply = {"request": meta.get("request", ""), **self.weights_meta()}
        if "part" in meta:  # a stage-0 replacement asks for the copy this node holds (CheckFree+)
            self.stage0_copies.answer(msg, reply)
            return
        if meta["stage"] != self.stage:
            self.send(msg.sender, MessageType.WEIGHTS_RESPONSE, meta={**reply, "error": "wrong stage"})
            return
        opt = self.opt if meta.get("optimizer") else None
        self.send(
            msg.sender, MessageType.WEIGHTS_RESPONSE, meta=reply, tensors=W.stage_tensors(self.module, opt)
        )

    def _on_weights_response(self, msg: Message) -> None:
        if self.task is not None:
            self.task.on_response(msg)

    def recovered(self, record: dict[str, Any]) -> None:
        """Called by a finished Recovery: serve."""
        self._serve(record)

    def restored(self, record: dict[str, Any]) -> None:
        """Called by a finished Rollback: report to the supervisor."""
        self.task = None
        self.send(SUPERVISOR_ID, MessageType.CONTROL, meta={"command": "restored", **record})

    def give_up(self, reason: str) -> None:
        log.error("node %d: %s", self.id, reason)
        self.send(SUPERVISOR_ID, MessageType.CONTROL, meta={"command": "recovery_failed", "reason": reason})
        self.task = None

    # ------------------------------------------------------------------ supervisor commands

    def _on_control(self, msg: Message) -> None:
        if msg.sender != SUPERVISOR_ID:
            raise ValueError("CONTROL from a node; only the supervisor commands")
        meta, command = msg.meta, msg.meta["command"]
        if command == "peers":
            self._update_peers(meta["peers"])
        elif command == "begin":
            self._begin(meta)
        elif command == "sync":
            if meta["epoch"] == self.epoch:
                self.gradients.start()
        elif command == "commit":
            self._commit(meta)
        elif command == "abort":
            if meta["epoch"] == self.epoch:
                self.worker.reset()
                self.gradients.reset()
                if self.driver is not None:
                    self.driver.abort()
        elif command == "checkpoint":
            if self.id in meta.get("checkpoint_senders", []):
                self.send_checkpoint()
        elif command == "rollback":
            self.task = Rollback(self, meta["version"])
            self.task.start()
        elif command == "shutdown":
            self._shutdown()
        else:
            raise ValueError(f"unknown command {command!r}")

    def _shutdown(self) -> None:
        self.send(SUPERVISOR_ID, MessageType.CONTROL, meta={"command": "final", **self.report()})
        deadline = time.monotonic() + 3.0
        while self.transport.stats["sent_messages"]["CONTROL"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # let the sender thread hand the last frames to libzmq
        self.done = True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m checkfree.swarm.node", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--id", type=int, required=True, help="this node's id (>= 0)")
    parser.add_argument(
        "--stage", type=int, required=True, help="stage it holds (0 = embedding/head; -1 = storage)"
    )
    parser.add_argument("--location", required=True, help="its location in the WAN table")
    parser.add_argument("--bootstrap", required=True, help="the supervisor's address, tcp://HOST:PORT")
    parser.add_argument("--bind-host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--advertise-host", help="host name peers should dial (when binding 0.0.0.0)")
    parser.add_argument(
        "--replacement", action="store_true", help="recover the stage from peers before serving"
    )
    parser.add_argument("--cache-dir", type=Path, help="data cache of stage-0 nodes")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s node{args.id} %(levelname)s %(name)s: %(message)s",
    )
    torch.set_num_threads(1)
    if args.stage == -1:
        from checkfree.swarm.storage import StorageNode

        return StorageNode(args.id, args.location, args.bootstrap, args.bind_host, args.advertise_host).run()
    node = Node(
        args.id,
        args.stage,
        args.location,
        args.bootstrap,
        args.bind_host,
        args.advertise_host,
        args.replacement,
        args.cache_dir,
    )
    return node.run()


if __name__ == "__main__":
    sys.exit(main())
