"""The authors' JSON config format as typed, validated dataclasses.

A config file of the paper's release (paper §5 and the release's ``*_config.json``) is accepted unchanged:

    {"dataset": "OpenWebText", "architecture": "LLaMa", "validation": 10, "dmodel": 1024, "num_heads": 16,
     "n_layers_per_stage": 4, "n_stages": 6, "seq_l": 1024, "batch_size": 16, "mb_count": 4, "lr_scale": 1.2,
     "max_iterations": 10000, "lr": 3e-4, "5": 0.0009, "10": 0.002, "16": 0.004, "33": 0.01}

The keys "5", "10", "16", "33" are per-iteration stage-failure probabilities for those failure rates in %/h (they
sit next to "lr" but are not learning rates). Keys of our own (``eval_interval``, ``seed``, ``tokenizer``, …) take
the defaults below when absent. Every invalid value raises :class:`ConfigError` with one sentence naming the key,
the value and what was expected.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkfree.config_files import ConfigFileError, read_mapping
from checkfree.failures.rates import PROBABILITY_RANGE
from checkfree.schemas import fields as F

ARCHITECTURES = ("LLaMa", "GPT")
HUB_DATASET_NAMES = ("TinyStories", "OpenWebText", "RedPajama")
GRAD_NORM_MODES = ("paper", "clipped")
_FAILURE_KEY = re.compile(r"^\d+(\.\d+)?$")
REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"
CONFIG_ALIASES = {
    "1.5B_config.json": "1_5B_config_6x4.json",
    "500M_GPT_config.json": "500M_config_gpt.json",
}
"""Names checkfree shipped before it took the authors' file names (configs/README.md) → the file they load now."""
DATASET_SPELLINGS = {"RedPyjamas": "RedPajama"}
"""The authors' spellings of a dataset name (their current 1_5B_config.json) → checkfree's name."""


class ConfigError(ValueError):
    """A config value a user wrote is invalid; the message is one sentence naming it."""


MAX_SEED = 2**63
"""Seeds lie in [0, 2^63): torch.manual_seed and numpy take them as 64-bit integers."""


def _bounds(schema: Any) -> dict[str, Any]:
    """Field metadata: the key's schema (type and range, checkfree.schemas.fields), checked by pydantic."""
    return {"schema": schema}


POSITIVE = _bounds(F.count(1, F.MAX_ITERATIONS))
"""An interval in iterations, ≥ 1."""
NON_NEGATIVE = _bounds(F.count(0, F.MAX_ITERATIONS))
"""An interval or count in iterations that may be 0."""
SEED = _bounds(F.count(0, MAX_SEED - 1, "an integer in [0, 2^63)"))
"""A seed: an integer in [0, 2^63)."""
POSITIVE_NUMBER = _bounds(F.number(0.0, 1e6, above=True))
NAME = _bounds(F.name())


@dataclass
class Config:
    """One training run's configuration (paper keys first, then ours)."""

    # --- the authors' keys (docs/paper.md §6) ---
    dataset: str = field(default="Shakespeare", metadata=NAME)
    """Corpus: "TinyStories" | "OpenWebText" | "RedPajama" (HF streaming), "Shakespeare" (offline), or a path/glob."""
    architecture: str = field(default="LLaMa", metadata=NAME)
    """"LLaMa" (LlamaForCausalLM blocks) or "GPT" (GPT2LMHeadModel blocks)."""
    validation: int = field(default=8, metadata=_bounds(F.count(1, 1_000_000)))
    """Validation batches (of batch_size sequences) per evaluation."""
    dmodel: int = field(default=128, metadata=_bounds(F.count(1, 65_536)))
    """Model width d."""
    num_heads: int = field(default=4, metadata=_bounds(F.count(1, 1024)))
    """Attention heads; must divide dmodel."""
    n_layers_per_stage: int = field(default=2, metadata=_bounds(F.count(1, 1024)))
    """Transformer blocks per stage."""
    n_stages: int = field(default=4, metadata=_bounds(F.count(1, F.MAX_STAGES)))
    """Transformer stages S (stage 0, the embedding and head, is extra)."""
    seq_l: int = field(default=128, metadata=_bounds(F.count(1, 1 << 20)))
    """Sequence length in tokens."""
    batch_size: int = field(default=8, metadata=_bounds(F.count(1, 1 << 16)))
    """Sequences per microbatch (per data-parallel rank)."""
    mb_count: int = field(default=4, metadata=_bounds(F.count(1, F.MAX_MICROBATCHES)))
    """Microbatches per iteration; each microbatch's loss is divided by mb_count."""
    lr_scale: float = field(default=1.1, metadata=POSITIVE_NUMBER)
    """Learning-rate multiplier of a freshly recovered stage (paper §4: 1.1)."""
    max_iterations: int = field(default=500, metadata=NON_NEGATIVE)
    """Iterations (optimizer steps) to train."""
    lr: float = field(default=1e-3, metadata=POSITIVE_NUMBER)
    """Base learning rate (Adam)."""
    failure_probabilities: dict[str, float] = field(default_factory=dict)
    """Per-iteration stage-failure probability keyed by the failure rate in %/h ("5", "10", "16", "33")."""

    # --- our keys ---
    eval_interval: int = field(default=500, metadata=POSITIVE)
    """Iterations between validations (paper: 500)."""
    log_interval: int = field(default=10, metadata=POSITIVE)
    """Iterations between console lines."""
    checkpoint_interval: int = field(default=500, metadata=NON_NEGATIVE)
    """Iterations between run checkpoints used to resume (START_ITER > 0); 0 = only at the end."""
    keep_checkpoints: int = field(default=2, metadata=_bounds(F.count(1, 1000)))
    """How many run checkpoints to keep."""
    seed: int = field(default=0, metadata=SEED)
    """Seed for model init and failure draws (failures use their own generator)."""
    data_seed: int = field(default=42, metadata=SEED)
    """Seed of the data order (paper: shuffle seed 42)."""
    tokenizer: str = field(default="auto", metadata=NAME)
    """"bpe" (byte-level BPE trained on the corpus, offline), "llama2", "gpt2", a tokenizer path, or "auto"
    ("llama2" for the paper's hub datasets, as in the paper; "bpe" otherwise)."""
    vocab_size: int = field(default=4096, metadata=_bounds(F.count(1, 1 << 21)))
    """Vocabulary size of the "bpe" tokenizer."""
    max_train_tokens: int | None = field(default=None, metadata=_bounds(F.count(1, 10**13) | None))
    """Cap on the training tokens to stream and cache (None = enough for max_iterations from a hub dataset, all of a
    local corpus)."""
    grad_clip: float = field(default=1.0, metadata=POSITIVE_NUMBER)
    """Per-stage gradient-norm clipping threshold (paper: 1.0)."""
    grad_norm_mode: str = field(default="paper", metadata=NAME)
    """CheckFree weights ω: "paper" = unclipped gradient norm; "clipped" = the release's post-clip norm + 1e-4."""
    warmup_iterations: int = field(default=500, metadata=NON_NEGATIVE)
    """GPT only: linear warm-up iterations before cosine decay to 0.1·lr (paper §6)."""
    init_std: float = field(default=0.02, metadata=POSITIVE_NUMBER)
    """Standard deviation of the N(0, std) initialisation."""
    checkpoint_every: int = field(default=0, metadata=NON_NEGATIVE)
    """K of the checkpoint baselines (``checkpoint``/``one``): iterations between their checkpoints; 0 = by model
    size as in the paper (docs/paper.md §5): 50 below 200 M parameters, 100 below 1 B, 40 above."""
    checkpoint_rule: str = field(default="effective", metadata=NAME)
    """When the checkpoint baselines checkpoint (checkfree.recovery.checkpoint): "effective" = every K effective
    iterations; "authors" = at wall-clock multiples of K, a failure losing its position in the interval (the
    authors' checkpoint_simulation.py)."""
    checkpoint_paper_interval: int = field(default=0, metadata=NON_NEGATIVE)
    """"authors" rule: the paper iterations that K of ours stand for (each failure is placed at one of them);
    0 = K (each iteration one of the paper's)."""
    save_mode: str = field(default="async", metadata=NAME)
    """How the checkpoint baselines save: "sync" (blocking write to disk), "async" (snapshot during
    forward/backward, background flush, DataStates-LLM) or "memory" (RAM only, Gemini)."""
    snapshot_every: int = field(default=0, metadata=NON_NEGATIVE)
    """``ec_snapshot``: iterations between in-memory snapshots (REFT); 0 = the same default as checkpoint_every."""
    redundant_measure_every: int = field(default=10, metadata=NON_NEGATIVE)
    """``redundant``: iterations between timings of the extra forward of the next stage (Bamboo); 0 = never."""
    ladder_rungs: str = field(default="ec_snapshot,neighbour,random", metadata=NAME)
    """``ladder``: the rungs kept, comma-separated, from redundant, ec_snapshot, neighbour, random."""
    ladder_max_stale: int = field(default=0, metadata=NON_NEGATIVE)
    """``ladder``: oldest usable erasure-coded snapshot, in iterations; 0 = any (it is ≤ snapshot_every old)."""

    @property
    def tokenizer_name(self) -> str:
        """The tokenizer actually used ("auto" resolved)."""
        if self.tokenizer != "auto":
            return self.tokenizer
        return "llama2" if self.dataset in HUB_DATASET_NAMES else "bpe"

    @property
    def n_layers(self) -> int:
        return self.n_layers_per_stage * self.n_stages

    @property
    def tokens_per_iteration(self) -> int:
        """Tokens per iteration per data-parallel rank."""
        return self.batch_size * self.mb_count * self.seq_l

    def to_json(self) -> dict[str, Any]:
        """The resolved config in the authors' layout (failure keys at top level) plus our keys."""
        d = dataclasses.asdict(self)
        probs = d.pop("failure_probabilities")
        d.update(probs)
        return d


_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
_TYPES = typing.get_type_hints(Config)
"""Key → its declared type: the key lists below are derived from the dataclass, never written out."""


def _keys(kind: Any) -> tuple[str, ...]:
    """The keys of type ``kind`` (in field order)."""
    return tuple(name for name in _FIELDS if _TYPES[name] == kind)


_INT_KEYS = frozenset(_keys(int))
_FLOAT_KEYS = frozenset(_keys(float))
_STR_KEYS = frozenset(_keys(str))
_OPTIONAL_INT_KEYS = frozenset(_keys(int | None))
"""Positive integer or null (``max_train_tokens``)."""


@functools.cache
def _schema() -> type:
    """The pydantic model of the typed keys (checkfree.schemas): each key's type and range from its field's
    ``schema`` metadata, strict, unknown keys refused (built on first use)."""
    from pydantic import ConfigDict, create_model

    keys = {name: (f.metadata["schema"], ...) for name, f in _FIELDS.items() if "schema" in f.metadata}
    return create_model("ModelConfigKeys", __config__=ConfigDict(strict=True, extra="forbid"), **keys)


SAVE_MODES = ("sync", "async", "memory")
LADDER_RUNGS = ("redundant", "ec_snapshot", "neighbour", "random")
"""The simulator's rungs of the ``ladder`` strategy, most exact first."""


def parse_ladder_rungs(text: str) -> tuple[str, ...]:
    """The ``ladder`` rungs named in ``text`` (comma-separated), in ladder order.

    Raises:
        ValueError: an unknown or repeated rung, or neither ``neighbour`` nor ``random`` (the rungs that always
            apply), so that some loss could find no source.
    """
    names = [t.strip() for t in text.split(",") if t.strip()]
    if any(n not in LADDER_RUNGS for n in names) or len(set(names)) != len(names):
        raise ValueError(
            f"ladder_rungs {text!r} is invalid; expected distinct names from {', '.join(LADDER_RUNGS)}, "
            "comma-separated."
        )
    if not {"neighbour", "random"} & set(names):
        raise ValueError(
            f"ladder_rungs {text!r} has neither 'neighbour' nor 'random'; one must end the ladder."
        )
    return tuple(r for r in LADDER_RUNGS if r in names)


def _check_type(key: str, value: Any, source: str) -> Any:
    if key in _INT_KEYS:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{source}: {key!r} is {value!r}; expected an integer.")
        return value
    if key in _FLOAT_KEYS:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"{source}: {key!r} is {value!r}; expected a finite number.")
        return float(value)
    if key in _STR_KEYS:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{source}: {key!r} is {value!r}; expected a non-empty string.")
        return value
    if key in _OPTIONAL_INT_KEYS:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{source}: {key!r} is {value!r}; expected a positive integer or null.")
        return value
    raise AssertionError(key)


def _validate(cfg: Config, source: str) -> None:
    from checkfree.schemas.errors import validate

    schema = _schema()
    validate(schema, {k: getattr(cfg, k) for k in schema.model_fields}, source, ConfigError)
    if cfg.architecture not in ARCHITECTURES:
        raise ConfigError(
            f"{source}: 'architecture' is {cfg.architecture!r}; expected one of {list(ARCHITECTURES)}."
        )
    if cfg.dmodel % cfg.num_heads:
        raise ConfigError(
            f"{source}: 'dmodel' {cfg.dmodel} is not divisible by 'num_heads' {cfg.num_heads}; "
            "expected dmodel = heads × head size."
        )
    if cfg.architecture == "LLaMa" and (cfg.dmodel // cfg.num_heads) % 2:
        raise ConfigError(
            f"{source}: head size dmodel/num_heads = {cfg.dmodel // cfg.num_heads} is odd; "
            "RoPE needs an even head size."
        )
    if cfg.grad_norm_mode not in GRAD_NORM_MODES:
        raise ConfigError(
            f"{source}: 'grad_norm_mode' is {cfg.grad_norm_mode!r}; expected one of {list(GRAD_NORM_MODES)}."
        )
    try:
        parse_ladder_rungs(cfg.ladder_rungs)
    except ValueError as e:
        raise ConfigError(f"{source}: {e}") from None
    if cfg.save_mode not in SAVE_MODES:
        raise ConfigError(f"{source}: 'save_mode' is {cfg.save_mode!r}; expected one of {list(SAVE_MODES)}.")
    if cfg.tokenizer_name == "bpe" and cfg.vocab_size < 260:
        raise ConfigError(f"{source}: 'vocab_size' is {cfg.vocab_size}; a byte-level BPE needs at least 260.")
    for key, p in cfg.failure_probabilities.items():
        if not 0.0 <= p < 1.0:
            raise ConfigError(
                f"{source}: failure probability {key!r} is {p}; expected a per-iteration "
                f"probability in {PROBABILITY_RANGE}."
            )


def config_from_dict(raw: dict[str, Any], source: str = "config") -> Config:
    """Build a validated :class:`Config` from the authors' JSON layout (unknown keys are an error).

    Raises:
        ConfigError: a key is unknown or a value has the wrong type or range.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a JSON object of config keys, got {type(raw).__name__}.")
    kwargs: dict[str, Any] = {}
    probs: dict[str, float] = {}
    for key, value in raw.items():
        if _FAILURE_KEY.match(key):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"{source}: failure probability {key!r} is {value!r}; expected a number.")
            probs[key] = float(value)
        elif key == "failure_probabilities":
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: 'failure_probabilities' is {value!r}; expected an object.")
            for k, v in value.items():
                if not _FAILURE_KEY.match(str(k)) or isinstance(v, bool) or not isinstance(v, int | float):
                    raise ConfigError(
                        f"{source}: failure probability {k!r}: {v!r} is invalid; expected "
                        '"<rate %/h>": <probability>.'
                    )
                probs[str(k)] = float(v)
        elif key in _FIELDS:
            kwargs[key] = _check_type(key, value, source)
        else:
            known = ", ".join(sorted(k for k in _FIELDS if k != "failure_probabilities"))
            raise ConfigError(
                f"{source}: unknown key {key!r}; expected one of: {known}, or a failure-rate key "
                'such as "16".'
            )
    cfg = Config(**kwargs, failure_probabilities=probs)
    _validate(cfg, source)
    return cfg


MAX_SET_CHARS = 1 << 16
"""Longest ``--set`` VALUE, in characters (a name, a number, a short list)."""


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items (simulator and swarm) → {key: the JSON value, or the raw string when VALUE is not
    JSON}; the keys and the values' types and ranges are checked where the overrides are applied.

    Raises:
        ValueError: an item without ``=`` or with an empty key, a VALUE longer than :data:`MAX_SET_CHARS` or nested
            deeper than 32 lists and objects (checked before it is parsed).
    """
    from checkfree.schemas.limits import check_json_depth

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item[:60]!r} is malformed; expected KEY=VALUE.")
        if len(value) > MAX_SET_CHARS:
            raise ValueError(
                f"--set {key[:60]}=… is {len(value):,} characters long; expected a value of at most "
                f"{MAX_SET_CHARS:,}."
            )
        check_json_depth(value, f"--set {key[:60]}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def resolve_config_path(name: str | Path, cwd: Path | None = None, notes: list[str] | None = None) -> Path:
    """CONFIG resolves against the working directory, then the repository's ``configs/``, then the names
    checkfree shipped before (:data:`CONFIG_ALIASES`; ``notes`` receives a sentence naming the new file). Only a
    bare file name (or ``configs/NAME``) falls back to ``configs/``: a path into another directory is that file
    or none, never a shipped config of the same name.

    Raises:
        FileNotFoundError: no location holds the file.
    """
    p = Path(name)
    candidates = [p if p.is_absolute() else (cwd or Path.cwd()) / p]
    if not p.is_absolute() and p.parent in (Path("."), Path("configs")):
        candidates.append(CONFIG_DIR / p.name)
    else:
        if not candidates[0].is_file():
            raise FileNotFoundError(
                f"config {str(name)!r} not found: the path does not exist; expected the path of a JSON or YAML file "
                "(a bare name such as tiny_config.json is also looked for in configs/)."
            )
    for c in candidates:
        if c.is_file():
            return c.resolve()
    alias = CONFIG_ALIASES.get(p.name)
    if alias is not None and (CONFIG_DIR / alias).is_file():
        if notes is not None:
            notes.append(f"config {p.name!r} is now named {alias!r} (configs/README.md); loading {alias}.")
        return (CONFIG_DIR / alias).resolve()
    raise FileNotFoundError(
        f"config {str(name)!r} not found in the working directory or in {CONFIG_DIR}; "
        "expected a JSON or YAML file such as configs/tiny_config.json."
    )


def load_config(
    name: str | Path, overrides: dict[str, Any] | None = None, warnings: list[str] | None = None
) -> Config:
    """Load, override (CLI values win) and validate a config file, JSON or YAML (checkfree.config_files).

    A config file must give ``n_stages`` (a ``--set n_stages=…`` override counts): the authors' configs all do,
    and the model's depth and the failure unit follow from it, so a file that leaves it out is refused rather
    than silently trained with the dataclass default of 4 stages. :func:`config_from_dict` keeps the defaults.

    ``warnings`` (when given) receives one sentence per key that the file gives twice, and a note when the name
    is one checkfree shipped before (:data:`CONFIG_ALIASES`) or the dataset is spelled the authors' way
    (:data:`DATASET_SPELLINGS`).

    Raises:
        FileNotFoundError: the file does not exist.
        ConfigError: the file is not UTF-8 JSON or YAML, is not a mapping, gives no ``n_stages``, or a value is
            invalid.
    """
    found: list[str] = []
    path = resolve_config_path(name, notes=found)
    try:
        raw = read_mapping(path, "config", found)
    except ConfigFileError as e:
        raise ConfigError(str(e)) from None
    if warnings is not None:
        warnings.extend(found)
    raw.update({k: v for k, v in (overrides or {}).items() if v is not None})
    if "n_stages" not in raw:
        raise ConfigError(
            f"config {path} has no 'n_stages' (the number of transformer stages, which sets the model's depth "
            'with n_layers_per_stage); give it, e.g. "n_stages": 4, or pass --set n_stages=4.'
        )
    spelled = raw.get("dataset")
    if isinstance(spelled, str) and spelled in DATASET_SPELLINGS:
        raw["dataset"] = DATASET_SPELLINGS[spelled]
        if warnings is not None:
            warnings.append(
                f"dataset {spelled!r} is the authors' spelling of {raw['dataset']!r}; training on it."
            )
    return config_from_dict(raw, source=f"config {path.name}")
