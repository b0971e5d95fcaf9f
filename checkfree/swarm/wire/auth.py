"""Who may talk to the swarm: per-swarm CURVE keys, the join token, and the ZAP check (ZeroMQ's own crypto).

Every link is a ZeroMQ CURVE connection (Curve25519 key exchange, XSalsa20-Poly1305 per message, RFC 26):
each swarm process has one keypair; its PULL socket is a CURVE server and its PUSH sockets are CURVE
clients that must know the server's public key. A ZAP authenticator (``zmq.auth.thread.ThreadAuthenticator``)
on every process admits only the public keys in that process's :class:`KeyRing` (key → node id); a peer whose
key is not there cannot complete the handshake, so not one of its bytes reaches the application. libzmq
stamps each received message with the authenticated key (the ``User-Id`` frame property); the transport drops
and counts (``stats['dropped_spoofed']``) a message whose header ``sender`` is not the id bound to that key.

Keys. The supervisor draws a 32-byte swarm secret ``S`` per run (``secrets.token_bytes``). The keypair of
identity ``i`` (a node id, -1 for the supervisor, ``LAUNCHER_ID_BASE + START`` for a launcher) has the secret
key HMAC-SHA256(S, "checkfree-swarm-key:i"); its public key is Curve25519's base-point multiple
(``zmq.curve_public``). Only the supervisor and the launchers hold ``S``: a node process gets its own secret key
only (a key file, mode 0600, written by whoever starts it) and learns its peers' public keys from the
supervisor (WELCOME / ``peers``: every live node plus the next :data:`KEY_WINDOW` replacement ids, so a
replacement is admitted before it dials). A node therefore can speak only as itself.

Eviction. The supervisor evicts a node that misbehaves (checkfree.swarm.supervisor.conduct): it revokes the
node's id in its own :class:`KeyRing`, in its :class:`SwarmKeys` (key files it writes afterwards do not list it;
a launcher on another machine does not know, so its nodes admit the id until their WELCOME) and, through
``revoked`` in every WELCOME and ``peers``, in every node's keyring. A revoked id is never admitted
again, whatever a later ``keys`` lists. Its next connection fails the ZAP check; a connection it holds already
is not closed by libzmq, but every message on it is dropped (its key no longer maps to an id, so the sender
binding fails: ``dropped_spoofed``).

The join token (``<run_dir>/join_token.json``, mode 0600, written by the supervisor) holds the bootstrap
address, the supervisor's public key and ``S``. A second machine needs it to host nodes (``swarm run
--bootstrap-token FILE``); treat it like an SSH private key: whoever holds it can act as any node.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path

import zmq
from zmq.auth.thread import ThreadAuthenticator

from checkfree import jsonio

log = logging.getLogger(__name__)

ZAP_DOMAIN = "checkfree-swarm"
KEY_WINDOW = 32
"""Replacement ids admitted ahead of their spawn (a replacement must be admitted before it dials)."""
TOKEN_VERSION = 1


class AuthError(ValueError):
    """A join token or key file is missing, unreadable or malformed; the text names the file and the field."""


class SwarmKeys:
    """Per-identity CURVE keypairs derived from the swarm secret ``S`` (32 bytes)."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) != 32:
            raise AuthError(f"swarm secret is {len(secret)} bytes; expected 32.")
        self._secret = secret
        self._public: dict[int, str] = {}
        self.revoked: set[int] = set()
        """Evicted ids: key files written from now on do not admit them."""

    @classmethod
    def new(cls) -> SwarmKeys:
        """A fresh swarm: a new random secret."""
        return cls(secrets.token_bytes(32))

    def secret_key(self, ident: int) -> bytes:
        """The Z85 CURVE secret key of identity ``ident``."""
        raw = hmac.new(self._secret, f"checkfree-swarm-key:{ident}".encode(), hashlib.sha256).digest()
        return zmq.utils.z85.encode(raw)

    def public_key(self, ident: int) -> str:
        """The Z85 CURVE public key of identity ``ident`` (40 characters)."""
        if ident not in self._public:
            self._public[ident] = zmq.curve_public(self.secret_key(ident)).decode("ascii")
        return self._public[ident]

    def secret_bytes(self) -> bytes:
        """The 32-byte swarm secret (what the join token and the supervisor's journal hold, both mode 0600)."""
        return self._secret

    def identity(self, ident: int, keyring: KeyRing | None = None) -> Identity:
        """The keypair of ``ident`` plus a keyring (a fresh one admitting only the supervisor if None)."""
        ring = keyring if keyring is not None else KeyRing({-1: self.public_key(-1)})
        return Identity(ident, self.public_key(ident), self.secret_key(ident), ring)

    def write_token(self, path: Path, bootstrap: str) -> None:
        """Write the join token (mode 0600) for other machines' launchers."""
        data = {
            "version": TOKEN_VERSION,
            "bootstrap": bootstrap,
            "supervisor_key": self.public_key(-1),
            "swarm_secret": zmq.utils.z85.encode(self._secret).decode("ascii"),
        }
        _write_private(path, data)

    def write_key_file(self, path: Path, ident: int, admit_upto: int = 0) -> None:
        """Write one node's key file (mode 0600): its own secret key and the public keys it admits from
        its first moment: the supervisor's and those of ids 0 .. max(``ident``, ``admit_upto``) + KEY_WINDOW.
        ``admit_upto`` is the supervisor's next replacement id: every node that can be alive when this one
        starts has a lower id, so none is refused before WELCOME tells this node about it."""
        upto = max(ident, admit_upto) + KEY_WINDOW
        data = {
            "node": ident,
            "secret_key": self.secret_key(ident).decode("ascii"),
            "supervisor_key": self.public_key(-1),
            "keys": {str(i): self.public_key(i) for i in range(upto + 1) if i not in self.revoked},
        }
        _write_private(path, data)


def _write_private(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(jsonio.dumps(data))


def _read_json(path: Path, what: str, fields: tuple[str, ...]) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AuthError(
            f"{what} {path} cannot be read ({type(exc).__name__}); expected a JSON file."
        ) from None
    for key in fields:
        if not isinstance(data, dict) or not isinstance(data.get(key), (str, int)):
            raise AuthError(f"{what} {path} lacks field {key!r}; expected a file written by the swarm.")
    return data


def read_token(path: Path) -> tuple[SwarmKeys, str]:
    """The swarm keys and the bootstrap address from a join token.

    Raises:
        AuthError: the file is missing, not JSON, or a field is missing or malformed.
    """
    data = _read_json(path, "join token", ("bootstrap", "supervisor_key", "swarm_secret"))
    try:
        keys = SwarmKeys(zmq.utils.z85.decode(data["swarm_secret"].encode("ascii")))
    except (ValueError, UnicodeEncodeError, AttributeError):
        raise AuthError(f"join token {path}: swarm_secret is not 40 Z85 characters.") from None
    if keys.public_key(-1) != data["supervisor_key"]:
        raise AuthError(
            f"join token {path}: supervisor_key does not match swarm_secret; the file is damaged."
        )
    return keys, str(data["bootstrap"])


def read_key_file(path: Path, ident: int) -> Identity:
    """A node's identity from its key file (admitting only the supervisor until WELCOME).

    Raises:
        AuthError: the file is missing, malformed, or for another node.
    """
    data = _read_json(path, "key file", ("node", "secret_key", "supervisor_key"))
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


class RefusalLog:
    """Rate-limited log of ZAP refusals: a peer retrying with an unknown key is refused on every attempt
    (hundreds a second), so only each key's first refusal gets a line (for the first
    :data:`REFUSAL_KEYS_NAMED` keys), and the rest at most one summary line per ``every`` seconds with their
    count. ``refused``: every refusal so far; ``flush`` logs what no line counted yet.
    """

    def __init__(self, every: float = REFUSAL_SUMMARY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self.clock = every, clock
        self.refused = 0
        """Connections refused so far."""
        self._named: set[bytes] = set()
        self._pending = 0
        self._pending_keys: set[bytes] = set()
        self._since = clock()

    def refuse(self, key: bytes) -> None:
        """One refused connection from ``key`` (Z85 public key)."""
        self.refused += 1
        if key not in self._named and len(self._named) < REFUSAL_KEYS_NAMED:
            self._named.add(key)
            log.warning("auth: refused a connection from an unknown CURVE key %s", key[:12])
            return
        if not self._pending:
            self._since = self.clock()  # a summary covers at least ``every`` seconds
        self._pending += 1
        if len(self._pending_keys) <= REFUSAL_KEYS_NAMED:
            self._pending_keys.add(key)
        if self.clock() - self._since >= self.every:
            self.flush()

    def flush(self) -> None:
        """Log the refusals no line counted yet (one summary line), if any."""
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
