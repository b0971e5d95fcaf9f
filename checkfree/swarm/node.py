"""One swarm node = one process = one stage replica: join, serve microbatches, average gradients, recover.

Life of a node (``python -m checkfree.swarm.node --id N --stage S --location L --bootstrap ADDR
--key-file FILE``; ``--insecure`` instead of the key file for plain TCP):

1. **Join**: connect to the bootstrap (the supervisor), send JOIN (stage, location, address). The WELCOME
   reply carries the resolved swarm config, the peer table and the checkpoint version; the node connects to
   every peer (full mesh, each link WAN-emulated by :class:`SwarmNetEm`) and builds its stage.
2. **Recover** (replacements only, ``--replacement``): ask the setting's plan (checkfree.swarm.strategies)
   which stages to fetch, send WEIGHTS_REQUEST to a serving node of each (or the storage node), combine the
   answers with the shared recovery math (``copy_state`` / ``weighted_average``) and report ``serving``.
   A rejected or error answer, or a source that leaves the peer table, sends the request to the next
   candidate at once; an unanswered one after ``request_timeout``; after ``max_attempts`` rounds the node
   reports ``recovery_failed`` and exits (the supervisor retries).
3. **Iterate**, driven by the supervisor's CONTROL commands, one *epoch* per attempt of an iteration:
   ``begin`` (stage 0 starts its pipeline, see checkfree.swarm.worker) → every node forwards/backwards what
   arrives → stage 0 sends ITERATION_END → ``sync``: the replicas of each stage average their gradients
   (checkfree.swarm.gradient_sync: node-id order, bit-identical on every replica, divided by the number of
   pipelines), record the unclipped norm ω (SPEC §2), clip and report ``ready`` → ``commit``: Adam
   step (and, on checkpoint iterations, the designated replica ships weights + Adam state to storage) →
   ``committed``. ``abort`` drops the epoch's activations and gradients; nothing has been stepped.
4. **Serve weights** at any time to a peer the supervisor lists (a request from one not yet listed waits,
   bounded, for the next ``peers``; the node never dials an unlisted requester): WEIGHTS_REQUEST →
   WEIGHTS_RESPONSE with the weights, the last gradient norm, and (if asked) Adam's moments, step and lr. Under ``ours-plus`` stage 0 also pushes its embedding
   and head to stages 1 and S after each step, and those serve the copies to a stage-0 replacement
   (checkfree.swarm.stage0_copies).
5. **Leave** on ``shutdown`` (final stats to the supervisor), or exit by itself when the supervisor has
   been silent for ``peer_timeout`` seconds: a node never outlives its swarm.

Every message passes the wire format and its schema (checkfree.swarm.control) in the transport; the
dispatch tables (``handlers`` by message type, ``commands`` by CONTROL command, accepted from the supervisor
only) route it. A peer message that still makes no sense (a wrong stage, an unknown microbatch, a bad shape,
NaN weights, an implausible epoch or version) raises ``ProtocolError``, is logged and counted in
``bad_messages``, and the node keeps serving. Any other exception is a bug: the node exits non-zero with the
traceback in its log, and the supervisor replaces it like any crash.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from checkfree.swarm import control
from checkfree.swarm import weights as W
from checkfree.swarm.auth import Identity, read_key_file
from checkfree.swarm.config import swarm_config_from_dict
from checkfree.swarm.devices import prepare_device
from checkfree.swarm.early import FutureBuffer
from checkfree.swarm.gradient_sync import GradientSync
from checkfree.swarm.netem import NetEm
from checkfree.swarm.pipeline_driver import PipelineDriver
from checkfree.swarm.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError
from checkfree.swarm.recovering import Recovery, Rollback
from checkfree.swarm.stage0_copies import Stage0Copies
from checkfree.swarm.staging import HostStaging
from checkfree.swarm.strategies import RecoveryPlan, make_recovery
from checkfree.swarm.transport import Transport, TransportError
from checkfree.swarm.worker import StageWorker, build_stage

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 120.0
"""Seconds a new node waits for the supervisor's WELCOME before it gives up."""
MAX_WAITING_REQUESTS = 64
"""WEIGHTS_REQUESTs from peers not yet listed (or before serving) kept at most; a flood of them is dropped."""
FUTURE_EPOCHS = 4
"""An epoch more than this far ahead of the node's last ``begin`` is implausible (dropped and counted)."""


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
    """A stage replica. Args: ids and addresses as on the command line; ``cache_dir``: data cache;
    ``identity``: its CURVE keypair and keyring (None: unauthenticated, ``--insecure``)."""

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
        identity: Identity | None = None,
        device: str = "cpu",
    ):
        self.device = prepare_device(device)  # cpu, or cuda:N (checkfree.swarm.devices)
        self.staging = HostStaging(self.device)  # device tensors <-> host bytes (checkfree.swarm.staging)
        self.id, self.stage, self.location = node_id, stage, location
        self.bootstrap, self.replacement = bootstrap, replacement
        self.cache_dir = cache_dir
        self.netem = SwarmNetEm(time_scale=0.0)
        self.transport = Transport(
            node_id, bind_host=bind_host, netem=self.netem, identity=identity, validate=control.check
        )
        self.address = self.transport.address
        if advertise_host:
            self.address = f"tcp://{advertise_host}:{self.address.rsplit(':', 1)[1]}"
        self.peers: dict[int, dict[str, Any]] = {}
        self.epoch, self.iteration, self.version = -1, -1, 0
        self.max_version = 0
        """Highest weights version a peer may claim: iterations the supervisor has begun (plausibility)."""
        self.members: dict[int, list[int]] = {}
        self.future = FutureBuffer()
        self.waiting = FutureBuffer(MAX_WAITING_REQUESTS, MAX_WAITING_REQUESTS * 1024)
        """WEIGHTS_REQUESTs that arrived before this node serves or before the supervisor listed the sender."""
        self.grad_norm = 1.0  # ω before any completed iteration (SPEC §2)
        self.serving = False
        self.done = False
        self.bad_messages = 0
        self.step_s = 0.0
        self.task: Recovery | Rollback | None = None
        self.stage0_copies = Stage0Copies(self)
        self.gradients = GradientSync(self)
        self.handlers: dict[MessageType, Callable[[Message], None]] = {
            MessageType.FORWARD: self._on_pipeline,
            MessageType.BACKWARD: self._on_pipeline,
            MessageType.GRADIENTS: self.gradients.on_gradients,
            MessageType.WEIGHTS_REQUEST: self._on_weights_request,
            MessageType.WEIGHTS_RESPONSE: self._on_weights_response,
            MessageType.CONTROL: self._on_control,
            MessageType.STAGE0_COPY: self.stage0_copies.on_copy,
        }
        """Message type → handler; JOIN / LEAVE / ITERATION_END / CHECKPOINT addressed to a node are dropped."""
        self.commands: dict[str, Callable[[dict[str, Any]], None]] = {
            "peers": self._on_peers,
            "begin": self._begin,
            "sync": self._sync,
            "commit": self._commit,
            "abort": self._abort,
            "checkpoint": self._checkpoint,
            "rollback": self._rollback,
            "shutdown": self._shutdown,
        }
        """CONTROL command (from the supervisor only) → handler."""

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> int:
        """Join, (recover,) serve until shutdown; returns the process exit code.

        A bug (any exception but the protocol's validation error) propagates: the process exits non-zero
        with the traceback in its log, and the supervisor replaces it like any crash.
        """
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
                try:  # the supervisor planned this loss event once; a replacement never re-plans
                    plan = RecoveryPlan.from_json(welcome.meta.get("plan"), self.cfg.n_stages)
                except ValueError as exc:
                    self.give_up(f"the WELCOME holds no usable recovery plan ({exc})")
                    time.sleep(0.5)  # let the report leave
                    return 4
                self.task = Recovery(self, plan, welcome.meta["checkpoint_version"])
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
            if msg.sender == SUPERVISOR_ID and msg.meta.get("command") == "welcome":
                return msg
            early = self.waiting if msg.type == MessageType.WEIGHTS_REQUEST else self.future
            try:
                early.add(msg)
            except ProtocolError as exc:
                self.reject(msg, str(exc))
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
        self.max_version = meta["iteration"]
        # the supervisor's last begun epoch: a peer's FORWARD for the next one may arrive before our "begin"
        self.epoch = meta["epoch"]
        self._on_peers(meta)
        self.members = {int(s): ids for s, ids in meta["members"].items()}
        self.vocab_size = meta["vocab_size"]
        self.module = build_stage(
            self.model_cfg, self.stage, self.vocab_size, self.cfg.init_seed, self.device
        )
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
            meta=control.control("serving", stage=self.stage, version=self.version, record=record),
        )
        self._replay_requests()

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
        """Send to a connected peer; a peer that is gone is logged (the supervisor handles the death).

        ``meta`` gets this node's ``stage`` unless it is a CONTROL message or names one.
        """
        meta = meta if meta is not None else {}
        if mtype != MessageType.CONTROL:
            meta.setdefault("stage", self.stage)
        try:
            tensors = self.staging.to_host(tensors or {})  # host bytes; valid until the next send
            self.transport.send(peer, Message(mtype, self.id, iteration, microbatch, meta, tensors))
        except TransportError as exc:  # a peer gone meanwhile: the timeouts recover
            log.warning("node %d: could not send %s to %d: %s", self.id, mtype.name, peer, exc)

    def _on_peers(self, meta: dict[str, Any]) -> None:
        """Admit the listed keys, connect to every listed peer ([id, stage, location, address]) and forget
        peers no longer listed; then answer requests that were waiting for their sender to be listed."""
        if "keys" in meta and self.transport.identity is not None:
            self.transport.identity.keyring.update({int(k): v for k, v in meta["keys"].items()})
        listed = set()
        for pid, stage, location, address in meta["peers"]:
            if pid == self.id or pid < 0:
                continue
            old = self.peers.get(pid)
            if old is None or old["address"] != address:
                try:
                    self.transport.connect(pid, address)
                except TransportError as exc:
                    log.warning("node %d: cannot dial peer %d: %s", self.id, pid, exc)
                    continue
                self.netem.set_location(pid, location)
            listed.add(pid)
            self.peers[pid] = {"stage": stage, "location": location, "address": address}
        for pid in set(self.peers) - listed:
            self.peers.pop(pid)
            self.transport.disconnect(pid)
        if self.serving:
            self._replay_requests()
        if self.task is not None:
            self.task.peers_changed()

    def _replay(self, keep: Callable[[Message], bool]) -> None:
        for msg in self.future.take(keep):
            self.dispatch(msg)

    def _replay_requests(self) -> None:
        for msg in self.waiting.take(lambda m: m.sender in self.peers):
            self.dispatch(msg)

    def plausible_version(self, version: int) -> bool:
        """A weights version a peer may hold: not ahead of the iterations the supervisor has begun."""
        return version <= max(self.max_version, self.iteration + 1)

    def dispatch(self, msg: Message) -> None:
        """Route one message through the handler table; a message a handler rejects (ProtocolError: nonsense
        from a peer) is logged and counted in ``bad_messages``. Any other exception is a bug: it propagates."""
        handler = self.handlers.get(msg.type)
        if handler is None:
            self.reject(msg, f"a node takes no {msg.type.name}")
            return
        msg.tensors = self.staging.to_device(msg.tensors)  # compute (and recovery math) where the stage lives
        try:
            handler(msg)
        except ProtocolError as exc:
            self.reject(msg, str(exc))

    def reject(self, msg: Message, why: str) -> None:
        """Count and log a peer message that does not fit (the node keeps serving)."""
        self.bad_messages += 1
        log.warning("node %d: dropped a %s from %d: %s", self.id, msg.type.name, msg.sender, why)

    def epoch_of(self, msg: Message) -> int | None:
        """The message's epoch; None (dropped) when stale, buffered when it is ahead of this node.

        Raises:
            ProtocolError: the epoch is more than FUTURE_EPOCHS ahead of the supervisor's last ``begin``, or
                the buffer for future epochs is full (count or bytes).
        """
        epoch = msg.meta["epoch"]
        if epoch > self.epoch:
            if epoch > self.epoch + FUTURE_EPOCHS:
                raise ProtocolError(f"epoch {epoch} is implausibly far ahead of this node's {self.epoch}")
            self.future.add(msg)
            return None
        return epoch if epoch == self.epoch else None

    # ------------------------------------------------------------------ pipeline and gradients

    def _on_pipeline(self, msg: Message) -> None:
        if not self.serving or self.epoch_of(msg) is None:
            return
        route, pos, pipeline = msg.meta["route"], msg.meta["pos"], msg.meta["pipeline"]
        key = (pipeline, msg.microbatch)
        tensor = msg.tensors["activations" if msg.type == MessageType.FORWARD else "gradients"]
        m = self.model_cfg
        if (
            tensor.dtype != torch.float32
            or tensor.dim() != 3
            or tensor.shape[-1] != m.dmodel
            or not 0 < tensor.shape[0] <= m.batch_size
            or not 0 < tensor.shape[1] <= m.seq_l
        ):
            raise ProtocolError(
                f"tensor is {tuple(tensor.shape)} {tensor.dtype}; expected (<= {m.batch_size}, <= {m.seq_l}, "
                f"{m.dmodel}) float32"
            )
        if not 0 <= pos <= len(route) or len(route) != self.cfg.n_stages + 1:
            raise ProtocolError(f"route {route[:8]} position {pos} does not fit {self.cfg.n_stages} stages")
        if self.driver is not None:
            self.driver.on_message(msg, route, pos, key, tensor)
            return
        if pos >= len(route) or route[pos] != self.id or pos == 0:
            raise ProtocolError(f"route position {pos} of {route[:8]} is not this node")
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
                raise ProtocolError(f"no saved forward for pipeline {key[0]} microbatch {key[1]}")
            self.send(
                route[pos - 1],
                MessageType.BACKWARD,
                self.iteration,
                msg.microbatch,
                {**meta, "pos": pos - 1},
                {"gradients": grad},
            )

    def _begin(self, meta: dict[str, Any]) -> None:
        if meta["epoch"] <= self.epoch:
            raise ProtocolError(f"begin of epoch {meta['epoch']}; this node is at epoch {self.epoch} already")
        self.epoch, self.iteration = meta["epoch"], meta["iteration"]
        self.max_version = max(self.max_version, self.iteration)
        self.members = {int(s): ids for s, ids in meta["members"].items()}
        self.worker.reset()
        self.gradients.reset()
        self.stage0_copies.push()  # holders that joined since the last step
        if self.driver is not None:
            self.driver.begin()
        self.future.drop_before(self.epoch)
        self._replay(lambda m: m.meta.get("epoch") == self.epoch)

    def _sync(self, meta: dict[str, Any]) -> None:
        if meta["epoch"] == self.epoch:
            self.gradients.start()

    def _commit(self, meta: dict[str, Any]) -> None:
        if meta["epoch"] != self.epoch or self.gradients.reduced != self.epoch:
            raise ProtocolError(
                f"commit of epoch {meta['epoch']}; this node is at epoch {self.epoch} and has reduced the "
                f"gradients of epoch {self.gradients.reduced}"
            )
        self.gradients.reduced = -1  # one step per epoch
        t0 = time.thread_time()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step_s += time.thread_time() - t0  # CPU seconds
        self.version, self.grad_norm = meta["iteration"] + 1, self.gradients.norm
        self.max_version = max(self.max_version, self.version)
        if self.id in meta.get("checkpoint_senders", []):
            self.send_checkpoint()
        self.stage0_copies.push()
        self.worker.reset()
        self.send(
            SUPERVISOR_ID,
            MessageType.CONTROL,
            self.iteration,
            meta=control.control("committed", epoch=self.epoch, **self.report()),
        )

    def _abort(self, meta: dict[str, Any]) -> None:
        if meta["epoch"] == self.epoch:
            self.worker.reset()
            self.gradients.reset()
            if self.driver is not None:
                self.driver.abort()

    def _checkpoint(self, meta: dict[str, Any]) -> None:
        if self.id in meta["checkpoint_senders"]:
            self.send_checkpoint()

    def _rollback(self, meta: dict[str, Any]) -> None:
        if meta["version"] > self.max_version:
            raise ProtocolError(f"rollback to version {meta['version']}, beyond {self.max_version}")
        self.task = Rollback(self, meta["version"])
        self.task.start()

    def report(self) -> dict[str, Any]:
        """Cumulative stats for the supervisor: bytes per message type, compute seconds, bad messages."""
        stats = self.transport.stats
        return {
            "sent_bytes": stats["sent_bytes"],
            "sent_messages": stats["sent_messages"],
            "dropped_malformed": stats["dropped_malformed"],
            "dropped_spoofed": stats["dropped_spoofed"],
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
            MessageType.CHECKPOINT,
            self.iteration,
            meta=self.weights_meta(),
            tensors=W.stage_tensors(self.module, self.opt),
        )

    def _on_weights_request(self, msg: Message) -> None:
        """Answer a listed peer with this stage's weights (or the stage-0 copy it names); a request from a
        peer the supervisor has not listed yet waits in the future buffer (the next ``peers`` replays it):
        a node dials only the peers the supervisor lists."""
        meta = msg.meta
        if not self.serving or msg.sender not in self.peers and msg.sender != SUPERVISOR_ID:
            self.waiting.add(msg)  # answered once this node serves and the requester is listed
            return
        reply = {"request": meta["request"], **self.weights_meta()}
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
        if self.task is None:
            raise ProtocolError("a weights answer, but this node is not fetching weights")
        self.task.on_response(msg)

    def recovered(self, record: dict[str, Any]) -> None:
        """Called by a finished Recovery: serve."""
        self._serve(record)

    def restored(self, record: dict[str, Any]) -> None:
        """Called by a finished Rollback: report to the supervisor."""
        self.task = None
        meta = control.control("restored", version=record["version"], bytes=record["bytes"], record=record)
        self.send(SUPERVISOR_ID, MessageType.CONTROL, meta=meta)

    def give_up(self, reason: str) -> None:
        log.error("node %d: %s", self.id, reason)
        self.send(SUPERVISOR_ID, MessageType.CONTROL, meta=control.control("recovery_failed", reason=reason))
        self.task = None

    # ------------------------------------------------------------------ supervisor commands

    def _on_control(self, msg: Message) -> None:
        if msg.sender != SUPERVISOR_ID:
            raise ProtocolError("CONTROL from a node; only the supervisor commands")
        command = msg.meta["command"]
        handler = self.commands.get(command)
        if handler is None:
            raise ProtocolError(f"command {command!r} is not for a node")
        handler(msg.meta)

    def _shutdown(self, meta: dict[str, Any]) -> None:
        self.send(SUPERVISOR_ID, MessageType.CONTROL, meta=control.control("final", **self.report()))
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
    parser.add_argument("--key-file", type=Path, help="this node's CURVE key file (checkfree.swarm.auth)")
    parser.add_argument(
        "--insecure", action="store_true", help="plain TCP, no authentication (single-machine debugging)"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N (checkfree.swarm.devices)")
    args = parser.parse_args(argv)
    if (args.key_file is None) == (not args.insecure):
        parser.error("give exactly one of --key-file FILE and --insecure")
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s node{args.id} %(levelname)s %(name)s: %(message)s",
    )
    torch.set_num_threads(1)
    identity = None if args.insecure else read_key_file(args.key_file, args.id)
    if args.stage == -1:
        from checkfree.swarm.storage import StorageNode

        storage = StorageNode(
            args.id, args.location, args.bootstrap, args.bind_host, args.advertise_host, identity
        )
        return storage.run()
    node = Node(
        args.id,
        args.stage,
        args.location,
        args.bootstrap,
        args.bind_host,
        args.advertise_host,
        args.replacement,
        args.cache_dir,
        identity,
        args.device,
    )
    return node.run()


if __name__ == "__main__":
    sys.exit(main())
