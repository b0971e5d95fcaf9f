"""The supervisor's journal: its control state on disk, so that a supervisor that dies can be resumed
(``swarm run --resume RUN_DIR``; docs/swarm.md, "Resuming a run whose supervisor died").

``<run_dir>/journal.json`` (mode 0600: it holds the swarm secret, like the join token) is rewritten atomically
(a temporary file in the run directory, written, ``fsync``-ed, renamed over the journal, the directory
``fsync``-ed), so a reader sees the previous journal or the new one, never half of one, even when the machine
loses power. The supervisor writes it

* at every committed iteration, and just *before* it broadcasts ``commit`` (the commit's *intent*: the attempt,
  its iteration, members, every pipeline's ``ITERATION_END`` and every node's ``ready``), so a resumed supervisor
  can finish a commit some nodes stepped and others did not (checkfree.swarm.supervisor.adoption);
* before a node starts (its id reserved: never handed out twice) and once it runs (its pid and the start time of
  its process, checkfree.swarm.process_identity: a resumed supervisor signals only these processes, by pid);
* before a scheduled crash fires (it never fires twice), after an eviction, a rollback and a resume, and when the
  run ends (``status``).

What it holds (``checkfree-swarm-journal-v1``): the options the run was started with (``options``: what
``swarm run --resume`` reads instead of a command line), the supervisor's control state
(:meth:`SupervisorState.to_json <checkfree.swarm.supervisor.state.SupervisorState.to_json>`: roster, iteration,
attempt counter, schedule clock, crashes fired, retry counts, checkpoints stored, the attempt begun), the swarm
secret (``swarm_secret``, Z85; None with ``--insecure``) and the ids whose keys were revoked, the commit intent,
the results so far (every attribute of :class:`~checkfree.swarm.supervisor.results.Results`, so throughput.json
covers the whole run), the node processes (``processes``: node → [pid, start time]), the recovery kills fired,
the supervisor's address, port, pid and start time, and how many times the run was resumed.

:class:`Journal` writes; :func:`read_journal` reads and checks (one sentence per problem, as a
:class:`JournalError`, a ``ValueError``: ``swarm run`` exits 2). :func:`encode_results` / :func:`decode_results`
turn a Results into plain data and back, generically: a field a later version adds travels with the others.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import zmq
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from checkfree import jsonio
from checkfree.recovery.record import RecoveryRecord
from checkfree.schemas.errors import short, validate
from checkfree.schemas.limits import InputLimitError, check_json_depth
from checkfree.swarm.process_identity import start_time
from checkfree.swarm.supervisor.journal_schema import JournalRecord
from checkfree.swarm.wire.auth import SwarmKeys

# the results (and torch, which they import) only where they are encoded or decoded: a resume checks its journal
# before anything imports torch, and starts the forkserver's imports beside its own (checkfree.swarm.forkserver)
if TYPE_CHECKING:
    from checkfree.swarm.hosts import LocalHost
    from checkfree.swarm.supervisor.recovery_kills import RecoveryKill
    from checkfree.swarm.supervisor.results import Results
    from checkfree.swarm.supervisor.state import SupervisorState

JOURNAL_FILE = "journal.json"
JOURNAL_FORMAT = "checkfree-swarm-journal-v1"
MAX_JOURNAL_BYTES = 64 << 20
"""The largest journal a resume reads: 64 MiB (a run's journal grows by its results: about 1 kB per iteration)."""
KEY_DIRS = ("keys", "join_tokens")
"""The run directory's folders of secrets (node key files, join tokens): a resume refuses them readable by others."""
OPTION_EXTRAS: dict[str, type] = {
    "schedule_sha256": str,
    "recovery_kills_sha256": str,
    "config_sha256": str,
    "started_files": dict,
}
"""Journaled options that are no flag of ``swarm run`` (digests of the files it started with), and their type."""


class _File(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    path: Annotated[StrictStr, Field(min_length=1, max_length=4096)]
    sha256: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]


class StartedFiles(BaseModel):
    """``options.started_files``: the swarm and model config files a run started with (:func:`started_files`)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    config: _File
    model_config_file: _File = Field(alias="model_config")


class JournalError(ValueError):
    """A journal is missing, unreadable, of another format, or does not fit this swarm; the text names the file."""


def write_atomic(path: Path, text: str, mode: int = 0o600) -> int:
    """Replace ``path`` by ``text`` atomically and durably (temporary file → fsync → rename → fsync of the
    directory); the file gets ``mode``. Returns the bytes written.

    Raises:
        OSError: the run directory cannot be written.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = text.encode("utf-8")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # an old temporary file keeps its mode otherwise
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return len(data)


@dataclass
class JournalSources:
    """What the journal is written from (module docstring): the supervisor's state, its results so far, its host
    (the node processes' pids and start times), the options the run was started with, its address and port, and
    the recovery kills (checkfree.swarm.supervisor.recovery_kills) whose ``fired`` flags are journaled."""

    state: SupervisorState
    results: Results
    host: LocalHost
    options: dict[str, Any]
    address: str
    port: int
    recovery_kills: list[RecoveryKill]


class Journal:
    """Writes ``<run_dir>/journal.json`` from its sources (module docstring).

    Args:
        run_dir: the run directory. sources: what the journal holds (:class:`JournalSources`; the results'
            ``journal`` counters are updated at each write). enabled: False writes nothing (``bench_swarm.py``
            measures what the journal costs).

    Attributes:
        writes, seconds, nbytes: journal writes so far, the seconds they took and the bytes they wrote.
    """

    def __init__(self, run_dir: Path, sources: JournalSources, enabled: bool = True) -> None:
        self.path = Path(run_dir) / JOURNAL_FILE
        self.sources, self.enabled = sources, enabled
        self.writes, self.seconds, self.nbytes = 0, 0.0, 0

    def content(self) -> dict[str, Any]:
        """What journal.json holds now (plain data, strict JSON but for non-finite losses, which
        :func:`checkfree.jsonio.dumps` writes as null with their reason)."""
        src = self.sources
        state, keys = src.state, src.state.keys
        src.results.journal_cost(self.writes, self.seconds, self.nbytes)
        processes = {}
        for node in list(src.host.procs):
            ident = src.host.identity(node)
            if ident is not None:
                processes[str(node)] = list(ident)
        return {
            "status": state.status,
            "options": src.options,
            "supervisor": {"pid": os.getpid(), "started": start_time(os.getpid())},
            "address": src.address,
            "port": src.port,
            "swarm_secret": secret_of(keys),
            "revoked_keys": sorted(keys.revoked) if keys is not None else [],
            "state": state.to_json(),
            "intent": state.intent.to_json() if state.intent is not None else None,
            "results": encode_results(src.results),
            "processes": processes,
            "recovery_kills": [kill.fired for kill in src.recovery_kills],
            "resumes": state.resumes,
        }

    def write(self, why: str) -> None:
        """Write the journal now (``why``: what happened, kept in the file).

        Raises:
            OSError: the run directory cannot be written (the run stops: a supervisor that cannot journal could
                not be resumed).
        """
        if not self.enabled:
            return
        t0 = time.perf_counter()
        data = {"format": JOURNAL_FORMAT, "why": why, "written": time.time(), **self.content()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.nbytes += write_atomic(self.path, jsonio.dumps(data))
        self.writes += 1
        self.seconds += time.perf_counter() - t0


def read_journal(run_dir: Path) -> dict[str, Any]:
    """The journal of the run in ``run_dir``, trusted only once checked: a regular file owned by this user and
    readable by nobody else (like every key file of the run: :func:`check_private`), at most
    :data:`MAX_JOURNAL_BYTES` and :data:`~checkfree.schemas.limits.MAX_DEPTH` deep, and every field of the
    schema (checkfree.swarm.supervisor.journal_schema) typed and bounded.

    Raises:
        JournalError: no journal, unreadable, readable by others or owned by another user, too large or deep, not
            JSON, another format, or a field missing, unknown, of the wrong type or out of bounds (one sentence
            naming the file, the field, the value and what was expected).
    """
    path = Path(run_dir) / JOURNAL_FILE
    if not Path(run_dir).is_dir():
        raise JournalError(
            f"--resume {run_dir}: no such directory; expected the run directory of a swarm run."
        )
    if not path.is_file():
        raise JournalError(
            f"--resume {run_dir}: it holds no {JOURNAL_FILE}; expected the run directory of a swarm run whose "
            "supervisor journals its state (every swarm run does, unless it was started before journals existed)."
        )
    try:
        text = read_private(path, MAX_JOURNAL_BYTES, "the journal")
        check_json_depth(text, str(path))
        data = jsonio.loads(text)
    except InputLimitError as exc:
        raise JournalError(str(exc)) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, JournalError):
            raise
        raise JournalError(
            f"{path} cannot be read ({type(exc).__name__}); expected the swarm's journal."
        ) from None
    if not isinstance(data, dict) or data.get("format") != JOURNAL_FORMAT:
        raise JournalError(f"{path} is not a {JOURNAL_FORMAT} journal; expected one written by `swarm run`.")
    validate(JournalRecord, data, str(path), JournalError)
    for sub in KEY_DIRS:  # the run's other secrets: a resume (and its nodes) read them
        folder = Path(run_dir) / sub
        if folder.is_dir():
            for key_file in sorted(folder.iterdir()):
                check_private(key_file, "a key file")
    return data


def check_private(path: Path, what: str, st: os.stat_result | None = None) -> None:
    """Refuse ``path`` unless it is a regular file (no symbolic link) owned by this user that no one else may read
    or write (mode 0600 or stricter): it holds the swarm's secret or a node's key.

    Raises:
        JournalError: one sentence with the command that fixes it (``chmod 600 PATH``), or naming the owner.
    """
    if st is None:
        try:
            st = os.lstat(path)
        except OSError as exc:
            raise JournalError(f"{what} {path} cannot be read ({exc.strerror}).") from None
    if not stat.S_ISREG(st.st_mode):
        raise JournalError(
            f"{what} {path} is not a regular file (a symbolic link or a folder); expected the file the run wrote."
        )
    if st.st_uid != os.getuid():
        raise JournalError(
            f"{what} {path} is owned by uid {st.st_uid}, not by this user (uid {os.getuid()}); a resume trusts "
            f"only files its own user wrote: resume as that user, or `chown {os.getuid()} {path}` if it is yours."
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise JournalError(
            f"{what} {path} has mode {mode:04o}, readable or writable by others, and it holds the swarm's "
            f"secret; expected mode 0600: run `chmod 600 {path}` (and start a new run if others may have read it)."
        )


def read_private(path: Path, limit: int, what: str) -> str:
    """The UTF-8 text of ``path``, read only after :func:`check_private` of the very file opened (no symbolic
    link followed) and only if it holds at most ``limit`` bytes.

    Raises:
        JournalError: :func:`check_private`'s refusals. InputLimitError: larger than ``limit`` bytes.
        OSError, UnicodeDecodeError: unreadable, not UTF-8.
    """
    check_private(path, what)  # a symbolic link is refused here, with its sentence
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)  # and the file opened is the one checked
    try:
        check_private(path, what, os.fstat(fd))
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise InputLimitError(
            f"{what} {path} is larger than {limit:,} bytes; expected the journal of a run (at most {limit:,} bytes)."
        )
    return data.decode("utf-8")


# ------------------------------------------------------------------------------ what the run started with


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (hex).

    Raises:
        OSError: it cannot be read.
    """
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def config_digest(config: dict[str, Any]) -> str:
    """SHA-256 of a resolved swarm config (``SwarmConfig.to_json``, the model inline) as canonical JSON."""
    return hashlib.sha256(jsonio.dumps(config, sort_keys=True).encode("utf-8")).hexdigest()


def started_files(config_file: Path, model_file: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The options a journal keeps so that a resume trains on what the run started with: the swarm config file and
    the model config file (absolute path and SHA-256 of their bytes) and the digest of the resolved config.

    Raises:
        OSError: a file cannot be read.
    """
    files = {
        "config": {"path": str(Path(config_file).resolve()), "sha256": file_digest(config_file)},
        "model_config": {"path": str(Path(model_file).resolve()), "sha256": file_digest(model_file)},
    }
    return {"started_files": files, "config_sha256": config_digest(config)}


def check_started_files(data: dict[str, Any], run_dir: Path) -> None:
    """Refuse a journal whose config is not the one its run started with: the resolved config
    (``state.config``) must have the digest journaled at the start, and the swarm config and model config files
    it was made from must still hold the bytes they held then.

    Raises:
        JournalError: the journal predates these digests, names another config, or a file changed or is gone
            (one sentence naming it).
    """
    options, path = data["options"], Path(run_dir) / JOURNAL_FILE
    files, digest = options.get("started_files"), options.get("config_sha256")
    try:
        ok = validate(StartedFiles, files, f"{path} (options.started_files)", JournalError)
    except JournalError:
        if files is None:
            raise JournalError(
                f"{path} holds no digest of the config its run started with (a journal of an older checkfree); "
                "expected one that does: a resume checks the config it trains on."
            ) from None
        raise
    if digest != config_digest(data["state"]["config"]):
        raise JournalError(
            f"{path}: its config (state.config) is not the one the run started with (its SHA-256 differs from "
            "options.config_sha256); expected the journal as the supervisor wrote it."
        )
    for name, entry in (("config", ok.config), ("model_config", ok.model_config_file)):
        try:
            now = file_digest(entry.path)
        except OSError as exc:
            raise JournalError(
                f"the {name.replace('_', ' ')} {entry.path} the run in {run_dir} started with cannot be read "
                f"({exc.strerror}); expected the file it started with."
            ) from None
        if now != entry.sha256:
            raise JournalError(
                f"the {name.replace('_', ' ')} {entry.path} changed since the run in {run_dir} started (SHA-256 "
                f"{now[:12]}…, journaled {entry.sha256[:12]}…); expected the file it started with."
            )


def check_options(options: dict[str, Any], parser: argparse.ArgumentParser, source: str) -> None:
    """Refuse journaled options (``options``) that ``swarm run``'s ``parser`` could not have produced: an unknown
    key, or a value of another type than its option's (an int, a finite float, a string or path, a flag, a list
    of strings, one of its choices), so that a resume reads them as a command line.

    Raises:
        JournalError: one sentence naming ``source``, the option and the value.
    """
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    for key, value in options.items():
        if key in OPTION_EXTRAS:
            if not (value is None or isinstance(value, OPTION_EXTRAS[key])):
                raise JournalError(
                    f"{source}: options.{key} is {short(value)}; expected {OPTION_EXTRAS[key].__name__}."
                )
            continue
        action = actions.get(key)
        if action is None:
            raise JournalError(
                f"{source}: options.{key} is no option of `swarm run`; expected only its options."
            )
        want = _option_fits(action, value)
        if want is not None:
            raise JournalError(f"{source}: options.{key} is {short(value)}; expected {want}.")


def _option_fits(action: argparse.Action, value: Any) -> str | None:
    """None if ``value`` is what ``action`` stores, else what it stores (for the error)."""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return None if isinstance(value, bool) else "true or false"
    if isinstance(action, argparse._AppendAction):
        ok = isinstance(value, list) and len(value) <= 1000 and all(isinstance(v, str) for v in value)
        return None if ok else "a list of strings"
    if value is None or value == action.default:
        return None
    if action.choices is not None:
        return None if value in action.choices else f"one of {sorted(map(str, action.choices))}"
    if action.type is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and -1 <= value <= 1 << 31
        return None if ok else "an integer in [-1, 2,147,483,648] or null"
    if action.type is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return None if ok else "a finite number or null"
    return None if isinstance(value, str) and len(value) <= 4096 else "a string or null"


def keys_of(data: dict[str, Any]) -> SwarmKeys | None:
    """The swarm's keys from a journal (None: the run is ``--insecure``), with the revoked ids.

    Raises:
        JournalError: the secret is not 40 Z85 characters.
    """
    secret = data.get("swarm_secret")
    if secret is None:
        return None
    try:
        keys = SwarmKeys(zmq.utils.z85.decode(str(secret).encode("ascii")))
    except (ValueError, UnicodeEncodeError):
        raise JournalError(
            "the journal's swarm_secret is not 40 Z85 characters; the journal is damaged."
        ) from None
    keys.revoked = set(data.get("revoked_keys", []))
    return keys


def secret_of(keys: SwarmKeys | None) -> str | None:
    """The swarm secret as the journal holds it (Z85 text; None with ``--insecure``)."""
    return None if keys is None else zmq.utils.z85.encode(keys.secret_bytes()).decode("ascii")


# ---------------------------------------------------------------------------------------------- the results


def encode_results(results: Results) -> dict[str, Any]:
    """Every field of ``results`` but its config (:meth:`Results.journal_fields`), as plain data (int-keyed dicts,
    sets and crash records tagged so that :func:`decode_results` restores them); its clock becomes ``elapsed_s``
    (seconds of the results' clock now, or None before training started) and ``written_wall`` (epoch seconds now).

    Raises:
        TypeError: a field holds an object the journal cannot write (a field added to Results must be plain
            data, a CrashRecord or a RecoveryRecord).
    """
    out = {name: _encode(value, name) for name, value in results.journal_fields().items()}
    out["elapsed_s"] = results.elapsed()
    out["written_wall"] = time.time()
    return out


def decode_results(results: Results, data: dict[str, Any]) -> None:
    """Restore into ``results`` what :func:`encode_results` wrote (:meth:`Results.restore`); its clock continues
    where it was, the time since the journal was written (the outage) included.

    Raises:
        JournalError: the data is not what :func:`encode_results` writes.
    """
    try:
        fields = {k: v for k, v in data.items() if k not in ("elapsed_s", "written_wall")}
        elapsed = data["elapsed_s"]
        if elapsed is not None:
            elapsed = float(elapsed) + max(0.0, time.time() - float(data["written_wall"]))
        results.restore(fields, _restored, elapsed)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise JournalError(
            f"the journal's results cannot be read back ({exc}); the journal is damaged."
        ) from None


def _encode(value: Any, where: str) -> Any:
    from checkfree.swarm.supervisor.results import CrashRecord

    if isinstance(value, CrashRecord):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        fields["recovery"] = value.recovery.to_json() if value.recovery is not None else None
        return {"__crash__": fields}
    if isinstance(value, RecoveryRecord):
        return {"__record__": value.to_json()}
    if isinstance(value, dict):
        if value and all(isinstance(k, int) and not isinstance(k, bool) for k in value):
            return {"__int_keys__": [[k, _encode(v, where)] for k, v in value.items()]}
        if not all(isinstance(k, str) for k in value):
            raise TypeError(
                f"Results.{where} is a dict with keys of mixed types; the journal cannot write it"
            )
        return {k: _encode(v, where) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return {"__set__": [_encode(v, where) for v in sorted(value)]}
    if isinstance(value, (list, tuple)):
        return [_encode(v, where) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if hasattr(value, "__dict__") and not callable(
        value
    ):  # a record object of Results (its plain attributes)
        return {"__attrs__": {k: _encode(v, f"{where}.{k}") for k, v in vars(value).items()}}
    raise TypeError(f"Results.{where} holds a {type(value).__name__}; the journal writes only plain data")


def _restored(current: Any, value: Any) -> Any:
    """A field's value from its journaled ``value``: an object's attributes go into the object the field holds
    (``current``, returned); anything else is decoded."""
    if isinstance(value, dict) and set(value) == {"__attrs__"}:
        for key, item in value["__attrs__"].items():
            setattr(current, key, _restored(getattr(current, key, None), item))
        return current
    return _decode(value)


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"__crash__"}:
        from checkfree.swarm.supervisor.results import CrashRecord

        fields = dict(value["__crash__"])
        record = fields.pop("recovery")
        return CrashRecord(
            **fields, recovery=RecoveryRecord.from_json(record) if record is not None else None
        )
    if set(value) == {"__record__"}:
        return RecoveryRecord.from_json(value["__record__"])
    if set(value) == {"__int_keys__"}:
        return {int(k): _decode(v) for k, v in value["__int_keys__"]}
    if set(value) == {"__set__"}:
        return {_decode(v) for v in value["__set__"]}
    return {k: _decode(v) for k, v in value.items()}
