"""Who may talk to the swarm: per-swarm CURVE keys, the join token, and the ZAP check (ZeroMQ's own crypto).

Every link is a ZeroMQ CURVE connection (Curve25519 key exchange, XSalsa20-Poly1305 per message, RFC 26):
each swarm process has one keypair; its PULL socket is a CURVE server and its PUSH sockets are CURVE
clients that must know the server's public key. A ZAP authenticator (``zmq.auth.thread.ThreadAuthenticator``)
on every process admits only the public keys in that process's :class:`KeyRing` (key → node id); a peer whose
key is not there cannot complete the handshake, so not one of its bytes reaches the application. libzmq
stamps each received message with the authenticated key (the ``User-Id`` frame property); the transport drops
and counts (``stats['dropped_spoofed']``) a message whose header ``sender`` is not the id bound to that key.

Keys. The supervisor draws a 32-byte swarm secret ``S`` per run (``secrets.token_bytes``). Each machine gets a
secret of its own, ``S_m`` = HMAC-SHA256(S, "checkfree-swarm-machine:" + its share of the ids), and the keypair of
identity ``i`` (a node id, -1 for the supervisor, ``LAUNCHER_ID_BASE + START`` for a launcher) has the secret key
HMAC-SHA256(S_m, "checkfree-swarm-key:i") where ``m`` is the machine ``i`` belongs to (the supervisor's own
machine, its nodes and the storage node use ``S`` itself); its public key is Curve25519's base-point multiple
(``zmq.curve_public``). Only the supervisor holds ``S``. A node process gets its own secret key only (a key file,
mode 0600, written by whoever starts it) and learns its peers' public keys from the supervisor (WELCOME / ``peers``:
every live node plus each machine's next :data:`KEY_WINDOW` replacement ids, so a replacement is admitted before it
dials). A node therefore can speak only as itself.

**Per-machine admission** (:class:`MachineLayout`, :class:`MachineKeys`). A *machine* is one range of initial
node ids START..END−1 that one launcher hosts (the supervisor's own machine hosts its local range and the storage
node), named by its START. The supervisor assigns every node id to one machine: an initial id to the machine whose
range holds it, and the replacement ids in stripes, ``first + offset + every·k`` (``every`` = the number of
machines, ``offset`` = the machine's place in START order); a replacement of a slot takes the next id of its
machine's stripe. A machine's join token holds ``S_m`` and its share, not ``S``: from it one can derive the keys
of that machine's ids and of no other, so a leaked token lets its holder speak only as the nodes the supervisor
gave that machine, and a key made from it for another machine's node is refused by every ZAP check (counted:
``RefusalLog``). We chose keys derived per machine over binding keys to addresses in the ZAP check: an address
says nothing on one host or behind NAT, and a key is what CURVE proves already. Revoking a machine (``swarm
revoke``) revokes every id of its share everywhere and retires its stripe (checkfree.swarm.supervisor.machines).

Eviction. The supervisor evicts a node that misbehaves (checkfree.swarm.supervisor.conduct): it revokes the
node's id in its own :class:`KeyRing`, in its :class:`SwarmKeys` (key files it writes afterwards do not list it)
and, through ``revoked`` in every WELCOME and ``peers``, in every node's keyring. A revoked id is never admitted
again, whatever a later ``keys`` lists. Its next connection fails the ZAP check; a connection it holds already
is not closed by libzmq, but every message on it is dropped (its key no longer maps to an id, so the sender
binding fails: ``dropped_spoofed``).

The join tokens (``<run_dir>/join_tokens/machine<START>.json``, mode 0600, one per other machine, written by the
supervisor) hold the bootstrap address, the supervisor's public key, the machine's share and ``S_m``. Machine START
needs its token to host its nodes (``swarm run --join-token FILE``); treat it like an SSH private key: whoever
holds it can act as that machine's nodes (and no other's).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import zmq
from zmq.auth.thread import ThreadAuthenticator

from checkfree import jsonio

log = logging.getLogger(__name__)

ZAP_DOMAIN = "checkfree-swarm"
KEY_WINDOW = 32
"""Replacement ids of each machine admitted ahead of their spawn (a replacement must be admitted before it
dials)."""
TOKEN_VERSION = 2
"""Version 2: a machine's own secret and share; version 1 held the swarm secret."""
LAUNCHER_ID_BASE = 1_000_000
"""Launcher ids are LAUNCHER_ID_BASE + START (they never collide with node ids)."""
_Z85_KEY = re.compile(r"[0-9A-Za-z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}\Z")


class AuthError(ValueError):
    """A join token or key file is missing, unreadable or malformed; the text names the file and the field."""


class Machine:
    """One machine's share of the swarm's node ids (module docstring, Per-machine admission).

    Args:
        start, end: the initial node ids START..END−1 it hosts (START names the machine).
        first, every, offset: its replacement ids are ``first + offset + every·k`` for k ≥ 0.
    """

    def __init__(self, start: int, end: int, first: int, every: int, offset: int) -> None:
        self.start, self.end, self.first, self.every, self.offset = start, end, first, every, offset

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Machine) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.start)

    @property
    def launcher(self) -> int:
        """The id of the launcher that hosts this machine's nodes."""
        return LAUNCHER_ID_BASE + self.start

    def owns(self, ident: int) -> bool:
        """Whether identity ``ident`` is one the supervisor gives this machine (its launcher's included)."""
        if ident == self.launcher or self.start <= ident < self.end:
            return True
        return ident >= self.first and (ident - self.first) % self.every == self.offset

    def replacement_ids(self, from_id: int, count: int) -> list[int]:
        """The first ``count`` replacement ids of this machine that are ≥ ``from_id``."""
        k = max(0, -(-(from_id - self.first - self.offset) // self.every))
        return [self.first + self.offset + self.every * (k + i) for i in range(count)]

    def describe(self) -> str:
        return f"machine {self.start} (nodes {self.start}..{self.end - 1})"

    def to_json(self) -> dict[str, int]:
        return {
            "start": self.start,
            "end": self.end,
            "first": self.first,
            "every": self.every,
            "offset": self.offset,
        }

    @classmethod
    def from_json(cls, data: object, where: str) -> Machine:
        """Raises: AuthError: ``data`` is not what :meth:`to_json` writes."""
        keys = ("start", "end", "first", "every", "offset")
        if not isinstance(data, dict) or set(data) != set(keys):
            raise AuthError(
                f"{where}: machine is not an object of {list(keys)}; expected a file written by the swarm."
            )
        values = [data[k] for k in keys]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise AuthError(f"{where}: machine holds {values}; expected non-negative integers.")
        m = cls(*values)
        if not (m.start < m.end <= m.first and m.offset < m.every):
            raise AuthError(
                f"{where}: machine {values} is not a share of a swarm's ids; the file is damaged."
            )
        return m


class MachineLayout:
    """Which machine each node id belongs to: the supervisor's own machine and the other machines, whose node
    ranges together cover the initial nodes 0..n_nodes−1 (module docstring, Per-machine admission).

    Args:
        n_nodes: the swarm's initial nodes. first: the first replacement id. local: START, END of the supervisor's
            own machine. remote: START, END of each other machine (None: one machine per range of nodes outside
            ``local``).

    Raises:
        ValueError: the ranges overlap, leave a node out, or reach outside 0..n_nodes−1 (one sentence).
    """

    def __init__(
        self, n_nodes: int, first: int, local: tuple[int, int], remote: list[tuple[int, int]] | None = None
    ) -> None:
        if remote is None:
            remote = [r for r in ((0, local[0]), (local[1], n_nodes)) if r[0] < r[1]]
        ranges = sorted([local, *remote])
        covered = [n for s, e in ranges for n in range(s, e)]
        if any(s >= e for s, e in ranges) or covered != list(range(n_nodes)):
            shown = ",".join(f"{s}:{e}" for s, e in sorted(remote))
            raise ValueError(
                f"--machines {shown} with this machine's nodes {local[0]}..{local[1] - 1} does not split the swarm's "
                f"nodes 0..{n_nodes - 1}; expected START:END ranges that, with START..END, cover each node once."
            )
        self.machines = [Machine(s, e, first, len(ranges), i) for i, (s, e) in enumerate(ranges)]
        self.own = next(m for m in self.machines if m.start == local[0])
        """The supervisor's own machine (its nodes, the storage node and its stripe use the swarm secret)."""
        self.revoked: set[int] = set()
        """STARTs of the machines revoked (``swarm revoke``): their stripes are retired."""

    def remote(self) -> list[Machine]:
        """The other machines, in START order."""
        return [m for m in self.machines if m is not self.own]

    def machine_of(self, ident: int) -> Machine:
        """The machine identity ``ident`` belongs to (the supervisor's own for -1, the storage node, and any id
        no other machine owns)."""
        return next((m for m in self.remote() if m.owns(ident)), self.own)

    def by_start(self, start: int) -> Machine | None:
        """The machine named ``start`` (None: no machine of this swarm)."""
        return next((m for m in self.machines if m.start == start), None)

    def replacement_id(self, machine: Machine, next_id: int, revoked: set[int]) -> int:
        """The id a new replacement on ``machine`` gets: the first of its stripe ≥ ``next_id`` not ``revoked``."""
        ids = machine.replacement_ids(next_id, len(revoked) + 1)
        return next(i for i in ids if i not in revoked)

    def window(self, next_id: int) -> list[int]:
        """Each machine's next :data:`KEY_WINDOW` replacement ids from ``next_id`` (a revoked machine's none)."""
        return sorted(
            i
            for m in self.machines
            if m.start not in self.revoked
            for i in m.replacement_ids(next_id, KEY_WINDOW)
        )


class SwarmKeys:
    """Per-identity CURVE keypairs derived from the swarm secret ``S`` (32 bytes): the supervisor's keys.

    Without a :attr:`layout` every identity's key comes from ``S`` (one machine); with one, from the secret of the
    machine it belongs to (module docstring).
    """

    def __init__(self, secret: bytes) -> None:
        if len(secret) != 32:
            raise AuthError(f"swarm secret is {len(secret)} bytes; expected 32.")
        self._secret = secret
        self._public: dict[int, str] = {}
        self.layout: MachineLayout | None = None
        """Which machine each id belongs to (:meth:`set_layout`)."""
        self.revoked: set[int] = set()
        """Evicted ids: key lists made from now on (:meth:`admitted`) leave them out."""

    @classmethod
    def new(cls) -> SwarmKeys:
        """A fresh swarm: a new random secret."""
        return cls(secrets.token_bytes(32))

    def set_layout(self, layout: MachineLayout) -> None:
        """Derive every identity's key from the secret of its machine in ``layout`` from now on."""
        self.layout, self._public = layout, {}

    def machine_secret(self, machine: Machine) -> bytes:
        """``S_m``, the 32-byte secret of ``machine`` (what its join token holds)."""
        share = ":".join(str(v) for v in machine.to_json().values())
        return hmac.new(self._secret, f"checkfree-swarm-machine:{share}".encode(), hashlib.sha256).digest()

    def secret_key(self, ident: int) -> bytes:
        """The Z85 CURVE secret key of identity ``ident`` (from its machine's secret)."""
        machine = self.layout.machine_of(ident) if self.layout is not None else None
        secret = (
            self._secret if machine is None or machine is self.layout.own else self.machine_secret(machine)
        )
        return _derive(secret, ident)

    def public_key(self, ident: int) -> str:
        """The Z85 CURVE public key of identity ``ident`` (40 characters)."""
        if ident not in self._public:
            self._public[ident] = zmq.curve_public(self.secret_key(ident)).decode("ascii")
        return self._public[ident]

    def secret_bytes(self) -> bytes:
        """The 32-byte swarm secret (what the supervisor's journal holds, mode 0600)."""
        return self._secret

    def identity(self, ident: int, keyring: KeyRing | None = None) -> Identity:
        """The keypair of ``ident`` plus a keyring (a fresh one admitting only the supervisor if None)."""
        ring = keyring if keyring is not None else KeyRing({-1: self.public_key(-1)})
        return Identity(ident, self.public_key(ident), self.secret_key(ident), ring)

    def machine_keys(self, machine: Machine) -> MachineKeys:
        """What ``machine``'s launcher holds: its secret and share (its join token)."""
        return MachineKeys(self.machine_secret(machine), machine, self.public_key(-1))

    def write_token(self, path: Path, bootstrap: str, machine: Machine) -> None:
        """Write ``machine``'s join token (mode 0600): the bootstrap address, the supervisor's public key, the
        machine's share of the ids and its secret; not the swarm secret."""
        data = {
            "version": TOKEN_VERSION,
            "bootstrap": bootstrap,
            "supervisor_key": self.public_key(-1),
            "machine": machine.to_json(),
            "machine_secret": zmq.utils.z85.encode(self.machine_secret(machine)).decode("ascii"),
        }
        _write_private(path, data)

    def admitted(self, live: Iterable[int], next_id: int, revoked: set[int] | None = None) -> dict[int, str]:
        """The public keys a node admits (WELCOME and ``peers``' ``keys``, key files): the ``live`` ids and each
        machine's next :data:`KEY_WINDOW` replacement ids from ``next_id`` (without a layout: ids ``next_id`` ..
        ``next_id`` + KEY_WINDOW − 1), none of them evicted or ``revoked``."""
        window = (
            self.layout.window(next_id) if self.layout is not None else range(next_id, next_id + KEY_WINDOW)
        )
        out = self.revoked | (revoked or set())
        return {i: self.public_key(i) for i in sorted({*live, *window}) if i not in out and i >= 0}

    def write_key_file(self, path: Path, ident: int, admitted: dict[int, str]) -> None:
        """Write node ``ident``'s key file (mode 0600): its own secret key, the supervisor's public key and the
        public keys it admits from its first moment (``admitted``, the supervisor's :meth:`admitted`: every node
        that can be alive when it starts, so none is refused before WELCOME tells it about them)."""
        _write_key_file(path, ident, self.secret_key(ident), self.public_key(-1), admitted)


class MachineKeys:
    """What one machine's launcher holds (its join token): the machine's secret ``S_m``, its share of the ids
    and the supervisor's public key. It derives the keys of its own ids only (module docstring).

    Args:
        secret: ``S_m`` (32 bytes). machine: its share. supervisor_key: the supervisor's public key (Z85).
    """

    def __init__(self, secret: bytes, machine: Machine, supervisor_key: str) -> None:
        if len(secret) != 32:
            raise AuthError(f"machine secret is {len(secret)} bytes; expected 32.")
        self._secret, self.machine, self.supervisor_key = secret, machine, supervisor_key

    def secret_key(self, ident: int) -> bytes:
        """The Z85 CURVE secret key of ``ident``, one of this machine's ids.

        Raises:
            AuthError: ``ident`` is not this machine's (a caller's bug: check :meth:`Machine.owns` first).
        """
        if not self.machine.owns(ident):
            raise AuthError(f"identity {ident} is not one of {self.machine.describe()}'s ids.")
        return _derive(self._secret, ident)

    def public_key(self, ident: int) -> str:
        """The Z85 CURVE public key of ``ident``: the supervisor's (-1) or one of this machine's ids."""
        if ident == -1:
            return self.supervisor_key
        return zmq.curve_public(self.secret_key(ident)).decode("ascii")

    def identity(self, ident: int, keyring: KeyRing | None = None) -> Identity:
        """The keypair of ``ident`` plus a keyring (a fresh one admitting only the supervisor if None)."""
        ring = keyring if keyring is not None else KeyRing({-1: self.supervisor_key})
        return Identity(ident, self.public_key(ident), self.secret_key(ident), ring)

    def write_key_file(self, path: Path, ident: int, admitted: dict[int, str]) -> None:
        """As :meth:`SwarmKeys.write_key_file`, for one of this machine's nodes."""
        _write_key_file(path, ident, self.secret_key(ident), self.supervisor_key, admitted)


def _derive(secret: bytes, ident: int) -> bytes:
    """The Z85 CURVE secret key of identity ``ident`` under ``secret`` (HMAC-SHA256)."""
    raw = hmac.new(secret, f"checkfree-swarm-key:{ident}".encode(), hashlib.sha256).digest()
    return zmq.utils.z85.encode(raw)


def _write_key_file(
    path: Path, ident: int, secret: bytes, supervisor_key: str, admitted: dict[int, str]
) -> None:
    data = {
        "node": ident,
        "secret_key": secret.decode("ascii"),
        "supervisor_key": supervisor_key,
        "keys": {str(i): key for i, key in sorted(admitted.items())},
    }
    _write_private(path, data)


def _write_private(path: Path, data: dict) -> None:
    """Write ``data`` as JSON to ``path`` (mode 0600) in one step: into a temporary file beside it, then renamed, so a
    reader (a second machine polling for its join token) sees the whole file or none, never an empty one."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(jsonio.dumps(data))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def _read_json(path: Path, what: str, fields: tuple[str, ...]) -> dict:
    from checkfree.schemas.limits import load_json

    try:
        data = load_json(path, what)  # at most 1 MiB and 32 deep (checkfree.schemas.limits)
    except OSError as exc:
        raise AuthError(
            f"{what} {path} cannot be read ({type(exc).__name__}); expected a JSON file."
        ) from None
    except ValueError as exc:  # too large, too deep, not UTF-8 or not JSON (one sentence naming the file)
        raise AuthError(f"{what} {path} cannot be read; {exc}") from None
    for key in fields:
        if not isinstance(data, dict) or not isinstance(data.get(key), (str, int)):
            raise AuthError(f"{what} {path} lacks field {key!r}; expected a file written by the swarm.")
    return data


def read_token(path: Path) -> tuple[MachineKeys, str]:
    """One machine's keys and the bootstrap address from its join token.

    Raises:
        AuthError: the file is missing, not JSON, of an older swarm (one secret for every machine), or a field is
            missing or malformed.
    """
    data = _read_json(path, "join token", ("bootstrap", "supervisor_key"))
    if "swarm_secret" in data or data.get("version") != TOKEN_VERSION:
        raise AuthError(
            f"join token {path} is of version {data.get('version')}; expected a machine's token (version "
            f"{TOKEN_VERSION}, <run_dir>/join_tokens/machine<START>.json of a supervisor of this version)."
        )
    from checkfree.schemas.errors import validate
    from checkfree.schemas.join_token import JoinToken

    validate(JoinToken, data, f"join token {path}", AuthError)  # every field typed and bounded, no other key
    machine = Machine.from_json(data.get("machine"), f"join token {path}")
    try:
        secret = zmq.utils.z85.decode(str(data.get("machine_secret")).encode("ascii"))
        keys = MachineKeys(secret, machine, str(data["supervisor_key"]))
    except (ValueError, UnicodeEncodeError):
        raise AuthError(f"join token {path}: machine_secret is not 40 Z85 characters.") from None
    if not _Z85_KEY.match(keys.supervisor_key):
        raise AuthError(
            f"join token {path}: supervisor_key is not a Z85 CURVE public key; the file is damaged."
        )
    return keys, str(data["bootstrap"])


def read_key_file(path: Path, ident: int) -> Identity:
    """A node's identity from its key file (admitting only the supervisor until WELCOME).

    Raises:
        AuthError: the file is missing, malformed, or for another node.
    """
    from checkfree.schemas.errors import validate
    from checkfree.schemas.join_token import KeyFile

    data = _read_json(path, "key file", ("node", "secret_key", "supervisor_key"))
    validate(KeyFile, data, f"key file {path}", AuthError)  # every field typed and bounded, no other key
    if data["node"] != ident:
        raise AuthError(f"key file {path} is for node {data['node']}; expected node {ident}.")
    secret = str(data["secret_key"]).encode("ascii")
    try:
        public = zmq.curve_public(secret).decode("ascii")
    except (zmq.ZMQError, ValueError):
        raise AuthError(f"key file {path}: secret_key is not a Z85 CURVE key.") from None
    keys = data.get("keys", {})
    if not isinstance(keys, dict) or not all(isinstance(k, str) and k.isdigit() for k in keys):
        raise AuthError(f"key file {path}: keys is not an object of node id -> public key.")
    ring = KeyRing({int(k): str(v) for k, v in keys.items()} | {-1: str(data["supervisor_key"])})
    return Identity(ident, public, secret, ring)


REFUSAL_SUMMARY_S = 10.0
"""Seconds between two summary lines of refused connections (after each key's first refusal)."""
REFUSAL_KEYS_NAMED = 16
"""Distinct refused keys named in a line of their own; further keys only enter the summaries' counts."""


def _timer(delay_s: float, fn: Callable[[], None]) -> None:
    """Call ``fn`` in ``delay_s`` seconds on a daemon thread (it dies with the process)."""
    timer = threading.Timer(delay_s, fn)
    timer.daemon = True
    timer.start()


class RefusalLog:
    """Rate-limited log of ZAP refusals, each logged when it happens or at most ``every`` seconds later: a peer
    retrying with an unknown key is refused on every attempt (hundreds a second), so only each key's first refusal
    gets a line at once (for the first :data:`REFUSAL_KEYS_NAMED` keys); any other refusal opens a summary window
    of ``every`` seconds, and one line with the window's count is logged when it closes (a timer: the line never
    waits for the next refusal or the transport's close). ``refused``: every refusal so far; ``flush`` logs what
    no line counted yet.

    Args:
        every: seconds of a summary window. clock: seconds (monotonic). schedule: ``schedule(delay_s, fn)`` calls
            ``fn`` in ``delay_s`` seconds (a daemon timer thread by default); tests replace both.
    """

    def __init__(
        self,
        every: float = REFUSAL_SUMMARY_S,
        clock: Callable[[], float] = time.monotonic,
        schedule: Callable[[float, Callable[[], None]], object] = _timer,
    ) -> None:
        self.every, self.clock, self.schedule = every, clock, schedule
        self.refused = 0
        """Connections refused so far."""
        self._lock = threading.Lock()  # the ZAP thread refuses, the timer thread and the transport flush
        self._named: set[bytes] = set()
        self._pending = 0
        self._pending_keys: set[bytes] = set()
        self._since = clock()

    def refuse(self, key: bytes) -> None:
        """One refused connection from ``key`` (Z85 public key)."""
        with self._lock:
            self.refused += 1
            if key not in self._named and len(self._named) < REFUSAL_KEYS_NAMED:
                self._named.add(key)
                log.warning("auth: refused a connection from an unknown CURVE key %s", key[:12])
                return
            now = self.clock()
            if not self._pending:  # a new window: its line is due ``every`` seconds from now
                self._since = now
                self.schedule(self.every, self._window_closed)
            self._pending += 1
            if len(self._pending_keys) <= REFUSAL_KEYS_NAMED:
                self._pending_keys.add(key)
            if now - self._since >= self.every:  # the timer is late (a loaded machine)
                self._flush()

    def _window_closed(self) -> None:
        with self._lock:
            self._flush()

    def flush(self) -> None:
        """Log the refusals no line counted yet (one summary line), if any."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            n_keys = len(self._pending_keys)
            log.warning(
                "auth: refused %d more connection(s) from %s unknown CURVE key(s) in the last %.0f s",
                self._pending,
                f"{n_keys}" if n_keys <= REFUSAL_KEYS_NAMED else f"more than {REFUSAL_KEYS_NAMED}",
                self.clock() - self._since,
            )
        self._pending, self._pending_keys, self._since = 0, set(), self.clock()


class KeyRing:
    """The public keys a process admits, bound to node ids; shared with the ZAP thread (lock-protected)."""

    def __init__(self, keys: dict[int, str] | None = None) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[int, str] = {}
        self._by_key: dict[str, int] = {}
        self._revoked: set[int] = set()
        self.refusals = RefusalLog()
        """The refused connections (count and rate-limited log); used by the ZAP thread only."""
        if keys:
            self.update(keys)

    def update(self, keys: dict[int, str]) -> None:
        """Admit (or re-bind) these ids' keys; a revoked id stays out."""
        with self._lock:
            for ident, key in keys.items():
                if ident in self._revoked:
                    continue
                old = self._by_id.get(ident)
                if old is not None:
                    self._by_key.pop(old, None)
                self._by_id[ident] = key
                self._by_key[key] = ident

    def revoke(self, idents: list[int] | set[int]) -> None:
        """Withdraw these ids' keys for good: their next handshake is refused, and a message on a connection they
        hold already no longer maps to an id (the transport drops it as spoofed)."""
        with self._lock:
            for ident in idents:
                self._revoked.add(ident)
                key = self._by_id.pop(ident, None)
                if key is not None:
                    self._by_key.pop(key, None)

    def revoked(self, ident: int) -> bool:
        with self._lock:
            return ident in self._revoked

    def key_of(self, ident: int) -> str | None:
        with self._lock:
            return self._by_id.get(ident)

    def owner(self, key: str | None) -> int | None:
        """The id bound to a public key, or None."""
        with self._lock:
            return self._by_key.get(key) if key is not None else None

    def callback(self, domain: str, key: bytes) -> bool:
        """ZAP: admit a connecting client whose Z85 public key is bound to an id here."""
        admitted = self.owner(key.decode("ascii", "replace")) is not None
        if not admitted:
            self.refusals.refuse(key)
        return admitted


class Identity:
    """One process's CURVE keypair (Z85) and the keyring of peers it admits."""

    def __init__(self, ident: int, public: str, secret: bytes, keyring: KeyRing) -> None:
        self.ident, self.public, self.secret, self.keyring = ident, public, secret, keyring
        keyring.update({ident: public})

    def start_authenticator(self, ctx: zmq.Context) -> ThreadAuthenticator:
        """Start a ZAP handler on ``ctx`` that admits exactly the keyring's keys."""
        auth = ThreadAuthenticator(ctx)
        auth.start()
        auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=self.keyring)
        return auth

    def make_server(self, sock: zmq.Socket) -> None:
        sock.curve_server = True
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public.encode("ascii")
        sock.zap_domain = ZAP_DOMAIN.encode("ascii")

    def make_client(self, sock: zmq.Socket, server_key: str) -> None:
        sock.curve_serverkey = server_key.encode("ascii")
        sock.curve_publickey = self.public.encode("ascii")
        sock.curve_secretkey = self.secret
