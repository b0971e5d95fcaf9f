"""The swarm's topology config: stages, replicas, microbatches, WAN, timeouts (docs/paper.md §8).

A swarm config is a small JSON (or YAML) file (``configs/swarm_tiny.json``, ``configs/swarm_paper.json``)::

    {"model_config": "tiny_config.json", "replicas": 2, "microbatches": 4, "in_flight": 2,
     "locations": null, "storage_location": "Iowa", "checkpoint_every": 10, "time_scale": 1.0}

Node ids (docs/paper.md §8): the swarm has ``S + 1`` stages (stage 0 = embedding, head, data and loss; transformer
stages 1..S from the model config's ``n_stages``) and ``replicas`` nodes per stage, ids ``0 ..
(S+1)·R − 1``; node ``n`` holds stage ``n // R`` and is replica ``n % R`` of it. Each stage-0 node drives
one pipeline (pipeline ``p`` = replica index ``p``). The storage node of the ``checkpoint`` setting has id
``(S+1)·R``; replacements take fresh ids above it. Node ``n`` sits at ``locations[n % len(locations)]``
(default: the paper's seven-location geo set); a replacement inherits its predecessor's location.
Nothing here is specific to 7 × 3: any S ≥ 1 and R ≥ 1 work (``ours-plus`` needs S ≥ 4).

``checkpoint_every`` is the checkpoint baseline's K, the name the simulator's config gives it too; the key's old
name ``checkpoint_interval`` (which in the simulator's config is the interval of its resume checkpoints, another
thing) is still read, with a one-line note (:data:`RENAMED`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, StrictFloat, StrictInt, StrictStr

from checkfree.config import Config, ConfigError, config_from_dict, load_config, resolve_config_path
from checkfree.config_files import ConfigFileError, read_mapping
from checkfree.loss import FUSED_LOSS_CHOICES
from checkfree.schemas import fields as F
from checkfree.swarm.topology import LocationTable, load_locations, location_of

SETTINGS = ("no_failure", "checkpoint", "ours", "ours-plus", "checkfree", "checkfree_plus", "ladder")
"""The ``SETTING`` argument of run_throughput.sh (docs/paper.md §8)."""
DATA_SOURCES = ("corpus", "synthetic")
MAX_ATTEMPTS = 1000


def _bounds(schema: Any) -> dict[str, Any]:
    """Field metadata: the key's type and range (checkfree.schemas.fields), checked by pydantic."""
    return {"schema": schema}


NAME = _bounds(F.name())
SECONDS = _bounds(F.number(0.0, F.MAX_SECONDS, above=True))
MAX_SLOWDOWN = 1000.0
"""The largest slowdown factor a swarm config or a schedule may give a slot (checkfree.swarm.slowdown)."""
SLOWDOWN = _bounds(
    Annotated[
        dict[
            Annotated[StrictStr, Field(pattern=r"^\d{1,7}$")],
            Annotated[StrictFloat | StrictInt, Field(ge=1.0, le=MAX_SLOWDOWN, allow_inf_nan=False)],
        ],
        Field(
            max_length=F.MAX_SWARM_NODES,
            description=f'an object {{"<slot>": factor}} with factors in [1, {MAX_SLOWDOWN:g}]',
        ),
    ]
    | None
)


@dataclass
class SwarmConfig:
    """One swarm topology (every field has a one-line meaning; times in seconds)."""

    model_config: str = field(default="tiny_config.json", metadata=NAME)
    """Model config (the authors' JSON format), resolved against the working directory, then configs/."""
    replicas: int = field(default=2, metadata=_bounds(F.count(1, F.MAX_REPLICAS)))
    """Nodes per stage R (stage 0 included: R pipelines)."""
    microbatches: int | None = field(default=None, metadata=_bounds(F.count(1, F.MAX_MICROBATCHES) | None))
    """Microbatches per pipeline per iteration (None = the model config's mb_count)."""
    in_flight: int = field(default=2, metadata=_bounds(F.count(1, F.MAX_MICROBATCHES)))
    """At most this many microbatches of one pipeline between embed and its last backward."""
    locations: list[str] | None = field(default=None, metadata=_bounds(F.names(F.MAX_SWARM_NODES) | None))
    """Geo set: node n sits at locations[n % len]; None = the table's default_geo (docs/paper.md §8)."""
    locations_file: str | None = field(default=None, metadata=_bounds(F.name() | None))
    """Latency/bandwidth table (JSON); None = the one shipped in checkfree/swarm/locations.json."""
    storage_location: str = field(default="Iowa", metadata=NAME)
    """Location of the checkpoint storage node."""
    checkpoint_every: int = field(default=100, metadata=_bounds(F.count(1, F.MAX_ITERATIONS)))
    """``checkpoint`` setting: every stage's weights and Adam state go to storage every K iterations."""
    time_scale: float = field(default=1.0, metadata=_bounds(F.number(0.0, 1e6)))
    """Multiplies every emulated WAN delay (1 = real time, 0 = no emulation)."""
    crash_point: float = field(default=0.5, metadata=_bounds(F.number(0.0, 10.0)))
    """A scheduled crash fires this fraction of the last iteration's time after the iteration begins, at the
    latest when its forward phase ends (checkfree.swarm.supervisor.attempts)."""
    heartbeat_interval: float = field(default=0.5, metadata=SECONDS)
    """Seconds between heartbeats on every link."""
    peer_timeout: float = field(default=5.0, metadata=SECONDS)
    """A peer silent this long is dead (heartbeat failure detection)."""
    microbatch_timeout: float = field(default=60.0, metadata=SECONDS)
    """A stage-0 node reports a stall when a microbatch has not come back within this time."""
    iteration_timeout: float = field(default=300.0, metadata=SECONDS)
    """An attempt of an iteration that has not committed in this time is aborted and redone."""
    recovery_timeout: float = field(default=180.0, metadata=SECONDS)
    """A replacement that does not serve within this time (process start included) is killed and retried."""
    request_timeout: float = field(default=60.0, metadata=SECONDS)
    """A weights request unanswered in this time is sent to another source."""
    max_attempts: int = field(default=5, metadata=_bounds(F.count(1, MAX_ATTEMPTS)))
    """Attempts per iteration (and tries per replacement) before the run stops with an error."""
    supervisor_grace: float = field(default=120.0, metadata=SECONDS)
    """A node (or the storage node, or a launcher) whose supervisor fell silent keeps its stage and waits this long
    for a resumed supervisor (``swarm run --resume``) before it exits (docs/swarm.md)."""
    data: str = field(default="corpus", metadata=NAME)
    """Stage-0 batches: "corpus" (checkfree.data, the model config's dataset) or "synthetic" (tests)."""
    fused_loss: str = field(default="auto", metadata=_bounds(F.name("'auto', 'on' or 'off'")))
    """Stage 0's loss through Liger-Kernel's fused linear cross-entropy: "auto" (on a CUDA node where liger-kernel
    is), "on" (or a refusal before anything starts) or "off"; the simulator's ``--fused-loss`` (checkfree/loss.py)."""
    seed: int | None = field(
        default=None, metadata=_bounds(F.count(0, 2**63 - 1, "an integer in [0, 2^63)") | None)
    )
    """Model init seed (None = the model config's seed); replicas of a stage start identical."""
    eval_interval: int | None = field(default=None, metadata=_bounds(F.count(0, F.MAX_ITERATIONS) | None))
    """Iterations between validations of the pipeline on the model config's fixed validation batches, also at
    iteration 0 and at the end, as the simulator (None = the model config's ``eval_interval``; 0 = none)."""
    snapshot_every: int = field(default=0, metadata=_bounds(F.count(0, F.MAX_ITERATIONS)))
    """A consolidated snapshot (every stage's weights and Adam state) every N committed iterations, written in the
    background into the run directory's ``snapshots/`` (0 = none)."""
    slowdown: dict[str, float] | None = field(default=None, metadata=SLOWDOWN)
    """Slowdown emulation (tests, benches): slot (an initial node id) → factor ≥ 1; the slot's node sleeps
    (factor − 1) × the measured seconds of each forward and backward it computes (checkfree.swarm.slowdown);
    None = none. A schedule can turn a slot slow later (its ``slowdowns``)."""
    model_json: InitVar[dict[str, Any] | None] = None
    """The model config inline (as sent to nodes); None = load ``model_config``."""

    def __post_init__(self, model_json: dict[str, Any] | None) -> None:
        check_keys(
            {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        )  # before a field is used
        self.model: Config = (
            config_from_dict(model_json, "swarm model config")
            if model_json is not None
            else load_config(self.model_config)
        )
        self._validate()

    # ------------------------------------------------------------------ derived topology

    @property
    def n_stages(self) -> int:
        """Transformer stages S (stage 0 is extra)."""
        return self.model.n_stages

    @property
    def mb_count(self) -> int:
        """Microbatches per pipeline per iteration."""
        return self.microbatches or self.model.mb_count

    @property
    def n_nodes(self) -> int:
        """Nodes of the initial swarm: (S + 1) · R."""
        return (self.n_stages + 1) * self.replicas

    @property
    def storage_id(self) -> int:
        """Node id of the checkpoint storage node."""
        return self.n_nodes

    @property
    def first_replacement_id(self) -> int:
        return self.n_nodes + 1

    @property
    def init_seed(self) -> int:
        return self.model.seed if self.seed is None else self.seed

    @property
    def validation_every(self) -> int:
        """Iterations between validations (``eval_interval``, else the model config's); 0 = no validation."""
        return self.model.eval_interval if self.eval_interval is None else self.eval_interval

    def stage_of(self, node: int) -> int:
        """Stage of an initial node id (``node // R``)."""
        return node // self.replicas

    def geo(self, table: LocationTable | None = None) -> tuple[str, ...]:
        table = table or self.location_table()
        return tuple(self.locations) if self.locations else table.default_geo

    def location_of(self, node: int, table: LocationTable | None = None) -> str:
        """Location of an initial node id (docs/paper.md §8: id mod number of locations)."""
        return location_of(node, self.geo(table))

    def location_table(self) -> LocationTable:
        return load_locations(self.locations_file)

    def tokens_per_iteration(self) -> int:
        """Training tokens per iteration over all pipelines."""
        return self.replicas * self.mb_count * self.model.batch_size * self.model.seq_l

    def to_json(self) -> dict[str, Any]:
        """The resolved config (model config inlined under ``model``), as sent to nodes in WELCOME."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["model"] = self.model.to_json()
        return d

    def _validate(self) -> None:
        if self.n_nodes > F.MAX_SWARM_NODES:
            raise ConfigError(
                f"swarm config: (n_stages + 1) x replicas = ({self.n_stages} + 1) x {self.replicas} = "
                f"{self.n_nodes:,} nodes; expected at most {F.MAX_SWARM_NODES:,}."
            )
        if self.data not in DATA_SOURCES:
            raise ConfigError(f"swarm config: 'data' is {self.data!r}; expected one of {list(DATA_SOURCES)}.")
        if self.fused_loss not in FUSED_LOSS_CHOICES:
            raise ConfigError(
                f"swarm config: 'fused_loss' is {self.fused_loss!r}; expected one of {list(FUSED_LOSS_CHOICES)}."
            )
        table = self.location_table()
        for name in [*(self.locations or []), self.storage_location]:
            if name not in table.names:
                raise ConfigError(
                    f"swarm config: location {name!r} is not in the table; expected one of "
                    f"{sorted(table.names)}."
                )
        bad = sorted(int(k) for k in self.slowdown or {} if int(k) >= self.n_nodes)
        if bad:
            raise ConfigError(
                f"swarm config: 'slowdown' names slot {bad[0]}; expected slots 0..{self.n_nodes - 1} "
                "(the initial node ids)."
            )
        if self.peer_timeout <= 2 * self.heartbeat_interval:
            raise ConfigError(
                f"swarm config: 'peer_timeout' {self.peer_timeout} s is not above twice "
                f"'heartbeat_interval' {self.heartbeat_interval} s; live peers would look dead."
            )


_FIELDS = {f.name for f in dataclasses.fields(SwarmConfig)}
_DESCRIPTIONS = {f.name: F.describe(f.metadata["schema"]) for f in dataclasses.fields(SwarmConfig)}
"""Field → what it expects, in words (its schema's description)."""


def check_keys(raw: dict[str, Any], source: str = "swarm config") -> None:
    """Check the swarm config keys in ``raw`` (those it gives) against their types and ranges.

    Raises:
        ConfigError: the first wrong value, one sentence naming ``source``, the key, the value and what was expected.
    """
    from checkfree.schemas.errors import validate_as

    validate_as(_schema(), raw, source, ConfigError, _DESCRIPTIONS)


@functools.cache
def _schema() -> Any:
    """The pydantic adapter of a swarm config's keys (type and range from each field's ``schema`` metadata)."""
    from pydantic import TypeAdapter
    from typing_extensions import TypedDict  # pydantic needs it before Python 3.12

    fields = {f.name: f.metadata["schema"] for f in dataclasses.fields(SwarmConfig)}
    return TypeAdapter(TypedDict("SwarmConfigKeys", fields, total=False))  # type: ignore[operator]


RENAMED = {"checkpoint_interval": "checkpoint_every"}
"""Old swarm config key → its name now; the old one is still read, with a note."""


def renamed_keys(raw: dict[str, Any], source: str, notes: list[str] | None = None) -> dict[str, Any]:
    """``raw`` with every old key of :data:`RENAMED` under its new name; ``notes`` gets one sentence per old key.

    Raises:
        ConfigError: ``raw`` gives a key under both names.
    """
    out = dict(raw)
    for old, new in RENAMED.items():
        if old not in out:
            continue
        if new in out:
            raise ConfigError(
                f"{source}: gives both {old!r} and {new!r}; expected only {new!r} ({old!r} is its old name)."
            )
        out[new] = out.pop(old)
        if notes is not None:
            notes.append(f"{source}: {old!r} is now called {new!r}; read as {new} = {out[new]!r}.")
    return out


def swarm_config_from_dict(
    raw: dict[str, Any], source: str = "swarm config", notes: list[str] | None = None
) -> SwarmConfig:
    """Build a validated :class:`SwarmConfig` (unknown keys are an error; ``model`` is ignored; an old key name of
    :data:`RENAMED` is read under its new one, with a sentence in ``notes``).

    Raises:
        ConfigError: a key is unknown or given under both names, or a value is invalid. FileNotFoundError: the model
            config is missing.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a JSON object, got {type(raw).__name__}.")
    raw = renamed_keys(raw, source, notes)
    unknown = sorted(set(raw) - _FIELDS - {"model", "description"})
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r}; expected some of {sorted(_FIELDS)}.")
    keys = {k: v for k, v in raw.items() if k in _FIELDS}
    check_keys(keys, source)
    return SwarmConfig(**keys, model_json=raw.get("model"))


def load_swarm_config(
    path: str | Path, overrides: dict[str, Any] | None = None, notes: list[str] | None = None
) -> SwarmConfig:
    """Load a swarm config file, JSON or YAML (working directory first, then configs/), and apply ``overrides``;
    ``notes`` receives a sentence per key the file gives twice and per old key name (:data:`RENAMED`) of the file
    or the overrides.

    Raises:
        FileNotFoundError, ConfigError: one sentence naming the file or value.
    """
    resolved = resolve_config_path(path)
    try:
        raw = read_mapping(resolved, "swarm config", notes)
    except ConfigFileError as e:
        raise ConfigError(str(e)) from None
    raw.pop("model", None)
    raw = renamed_keys(raw, f"swarm config {resolved}", notes)
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    raw.update(renamed_keys(given, "--set", notes))
    return swarm_config_from_dict(raw, str(resolved))


def node_range(n_nodes: int, start: int, end: int | None, config: str | Path | None = None) -> int:
    """END of the initial node ids START..END−1 that one machine starts (None: up to the last node, ``n_nodes``).

    Raises:
        ValueError: the range is empty or outside the swarm's nodes (naming the ``config`` file when given).
    """
    end = n_nodes if end is None else end
    if not 0 <= start < end <= n_nodes:
        source = f" ({config})" if config is not None else ""
        raise ValueError(
            f"node range START {start} .. END {end} does not fit the swarm's nodes 0..{n_nodes - 1}{source}; "
            f"expected 0 <= START < END <= {n_nodes}."
        )
    return end


def machines_option(text: str | None, n_nodes: int | None = None) -> list[tuple[int, int]] | None:
    """``--machines START:END,...`` as ranges (None: not given), each within the swarm's ``n_nodes`` initial nodes
    (when given; else below checkfree.schemas.fields.MAX_NODES), checked before anything is sized by them.

    Raises:
        ValueError: a range is not START:END with integers START < END within those bounds (one sentence).
    """
    from checkfree.schemas.fields import MAX_NODES, MAX_SWARM_NODES

    if text is None:
        return None
    limit = MAX_NODES if n_nodes is None else n_nodes
    parts = text.split(",")
    if len(parts) > MAX_SWARM_NODES:
        raise ValueError(
            f"--machines names {len(parts):,} ranges; expected at most one per node ({MAX_SWARM_NODES:,})."
        )
    out = []
    for part in parts:
        bounds = [b.strip() for b in part.strip().split(":")]
        if len(bounds) != 2 or not all(b.isdigit() and len(b) <= len(str(limit)) for b in bounds):
            raise ValueError(
                f"--machines part {part[:40]!r} is not START:END; expected e.g. --machines 4:7,7:10."
            )
        start, end = int(bounds[0]), int(bounds[1])
        if not start < end <= limit:
            whose = " (the swarm's nodes)" if n_nodes is not None else ""
            raise ValueError(
                f"--machines part {part!r} is not a range START < END <= {limit:,}{whose}; expected e.g. "
                "--machines 4:7,7:10."
            )
        out.append((start, end))
    return out


def route(pipeline: int, members: dict[int, list[int]], n_stages: int, order: list[int]) -> list[int] | None:
    """Node ids one microbatch of ``pipeline`` visits: [stage-0 node, node of order[0], node of order[1], …].

    ``members`` maps stage → its serving node ids sorted by replica slot. The node of stage s is the one at
    the pipeline's replica index if that slot serves, else another serving replica (round-robin); ``None``
    when the pipeline's stage-0 node or a whole stage is missing.
    """
    stage0 = members.get(0, [])
    if pipeline >= len(stage0):
        return None
    path = [stage0[pipeline]]
    for s in order:
        nodes = members.get(s, [])
        if not nodes:
            return None
        path.append(nodes[pipeline % len(nodes)])
    return path
