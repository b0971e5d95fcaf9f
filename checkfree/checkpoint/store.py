"""Universal run checkpoints: per-layer safetensors + a JSON of metadata, atomic, checksummed.

Layout of one checkpoint directory ``<root>/iter_0000100/`` (named by the effective iteration)::

    meta.json               format, iterations, config, world size, layer → stage map, per-file sha256 and size
    meta.sha256             sha256 of meta.json's bytes (so a flipped byte in the metadata is caught too)
    stage0.safetensors      embedding + final norm + head: "param/<name>", "exp_avg/<name>", "exp_avg_sq/<name>",
                            "step/<name>" (Adam state per parameter, absent before the first step)
    layer_0000.safetensors  global transformer block 0, same key scheme with the block-local name
    …
    extra.safetensors       RNG state ("rng/torch", "rng/cuda") and strategy tensors

Because blocks are stored by their index in the unsplit model (DeepSpeed UCP's idea), a checkpoint of 4 stages ×
3 layers resumes into 6 stages × 2 layers, and under another data-parallel world size (every rank holds the same
replica; the data position is the effective iteration).

Writes go to a temporary directory that is renamed into place after every file is fsync'ed, so a crash (even
SIGKILL) mid-save leaves the previous checkpoints intact. Loading verifies every checksum, name and shape before
touching the model and refuses a truncated or corrupt checkpoint with one sentence naming the file: a checkpoint
is loaded whole or not at all.

A :class:`Snapshot` can also be taken *by reference* (``capture(..., copy=False)``) and copied later with
:func:`materialize`: parameters and Adam state do not change between an iteration's start and its optimizer step,
so the copy can run while forward/backward do (DataStates-LLM's lazy snapshot).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from checkfree import jsonio
from checkfree.training_state import TrainingState

FORMAT = "checkfree-universal-v2"
META_SUM = "meta.sha256"
_DIR_RE = re.compile(r"^iter_(\d{7,})$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated, corrupt or does not fit the model; one sentence says which."""


def _is_count(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _is_number_list(value: Any, length: int) -> bool:
    return (
        isinstance(value, list)
        and len(value) == length
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    )


def meta_type_problem(meta: dict[str, Any]) -> str | None:
    """None when every field a restore reads has its type; else "'<key>' = <value>; expected <type>"."""

    def bad(key: str, expected: str) -> str:
        return f"{key!r} = {meta.get(key)!r}; expected {expected}"

    for key in ("iteration", "effective_iteration"):
        if not _is_count(meta[key], 0):
            return bad(key, "an integer >= 0")
    for key in ("n_stages", "n_layers_per_stage"):
        if not _is_count(meta[key], 1):
            return bad(key, "a positive integer")
    files = meta["files"]
    if not isinstance(files, dict) or not all(
        isinstance(info, dict) and isinstance(info.get("sha256"), str) and _is_count(info.get("bytes"), 0)
        for info in files.values()
    ):
        return bad("files", 'an object {"<file>": {"sha256": str, "bytes": int}}')
    for key in ("lr_multipliers", "grad_norms"):
        if key in meta and not _is_number_list(meta[key], meta["n_stages"] + 1):
            return bad(key, f"a list of {meta['n_stages'] + 1} numbers (one per stage)")
    if "config" in meta and not isinstance(meta["config"], dict):
        return bad("config", "an object")
    if "data" in meta and not isinstance(meta["data"], dict | None):
        return bad("data", "an object")
    return None


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest (lowest effective iteration) first; temporaries ignored."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _DIR_RE.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def _read_meta(path: Path) -> dict[str, Any]:
    meta_path, sum_path = path / "meta.json", path / META_SUM
    if not meta_path.is_file():
        raise CheckpointError(
            f"checkpoint {path} has no meta.json; expected a directory written by checkfree "
            "(an interrupted save never leaves one under its final name)."
        )
    raw = meta_path.read_bytes()
    if not sum_path.is_file():
        raise CheckpointError(f"checkpoint file {sum_path} is missing; the metadata cannot be verified.")
    if hashlib.sha256(raw).hexdigest() != sum_path.read_text().strip():
        raise CheckpointError(
            f"checkpoint file {meta_path} fails its sha256 check ({sum_path}): it is corrupt."
        )
    try:
        meta = jsonio.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"checkpoint file {meta_path} is not valid JSON: it is corrupt.") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise CheckpointError(f"checkpoint {path} has format {got!r}; expected {FORMAT!r}.")
    missing = [
        k
        for k in ("iteration", "effective_iteration", "n_stages", "n_layers_per_stage", "files")
        if k not in meta
    ]
    if missing:
        raise CheckpointError(f"checkpoint file {meta_path} lacks the keys {missing}: it is corrupt.")
    problem = meta_type_problem(meta)
    if problem:
        raise CheckpointError(f"checkpoint file {meta_path} has {problem}.")
    return meta


def read_meta(path: Path) -> dict[str, Any]:
    """meta.json of a checkpoint directory, verified against meta.sha256 and type-checked (no tensor is read).

    Raises:
        CheckpointError: the directory does not exist (the message lists the checkpoints next to it), or its
            meta.json is missing, corrupt or has a field of the wrong type.
    """
    path = Path(path)
    if not path.is_dir():
        siblings = [p.name for p in list_checkpoints(path.parent)]
        listing = ", ".join(siblings) if siblings else f"none under {path.parent}"
        raise CheckpointError(f"checkpoint {path} does not exist; existing checkpoints: {listing}.")
    inside = list_checkpoints(path / "checkpoints")
    if inside and not (path / "meta.json").exists():
        names = ", ".join(str(p) for p in inside)
        raise CheckpointError(
            f"{path} is a run directory, not a checkpoint; expected one of its checkpoints: {names}."
        )
    return _read_meta(path)


log = logging.getLogger(__name__)

_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")
_OPT_KEYS = ("step", "exp_avg", "exp_avg_sq")


@dataclass
class Snapshot:
    """An in-memory copy of everything a checkpoint holds (taken between optimizer steps).

    ``files`` maps a file stem ("stage0", "layer_0003", "extra") to its tensors; ``meta`` is meta.json's content.
    """

    iteration: int
    effective_iteration: int
    files: dict[str, dict[str, torch.Tensor]]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data (what a save writes, metadata aside)."""
        return sum(t.numel() * t.element_size() for f in self.files.values() for t in f.values())


def file_of(stage: int, name: str, n_layers_per_stage: int) -> tuple[str, str]:
    """(file stem, name inside the file) of parameter ``name`` of stage ``stage``: ``("stage0", name)`` for stage 0,
    ``("layer_<g>", name in the block)`` for block i of transformer stage s ≥ 1, g = (s − 1)·L + i.

    Raises:
        CheckpointError: a transformer stage's parameter outside a block ``layers.<i>.``.
    """
    if stage == 0:
        return "stage0", name
    m = _LAYER_RE.match(name)
    if m is None:
        raise CheckpointError(
            f"stage {stage} parameter {name!r} is not inside a block 'layers.<i>.'; the "
            "universal layout cannot place it."
        )
    return f"layer_{(stage - 1) * n_layers_per_stage + int(m.group(1)):04d}", m.group(2)


def capture(
    state: TrainingState,
    n_layers_per_stage: int,
    config: dict[str, Any],
    extra: dict[str, torch.Tensor] | None = None,
    strategy: str = "",
    *,
    copy: bool = True,
    iteration: int | None = None,
    effective_iteration: int | None = None,
    world_size: int = 1,
) -> Snapshot:
    """Take the training state into a :class:`Snapshot`.

    Args:
        copy: True clones every tensor to CPU (training may go on at once). False keeps references to the live
            parameters and Adam state: call :func:`materialize` before the next optimizer step.
        iteration, effective_iteration: the positions to record (default: the state's).
        world_size: data-parallel replicas of the run (recorded only; a resume may use another).
    """
    files: dict[str, dict[str, torch.Tensor]] = {}
    layer_stage: dict[str, int] = {}
    take = (lambda t: t.detach().to("cpu", copy=True)) if copy else (lambda t: t.detach())
    for s, (stage, opt) in enumerate(zip(state.stages, state.optimizers, strict=True)):
        params = [p for g in opt.param_groups for p in g["params"]]
        for (name, p), q in zip(stage.named_parameters(), params, strict=True):
            if p is not q:
                raise CheckpointError(
                    f"stage {s}'s optimizer does not hold its parameters in named_parameters "
                    "order; build it with make_adam(stage, lr)."
                )
            fname, local = file_of(s, name, n_layers_per_stage)
            if fname != "stage0":
                layer_stage[str(int(fname.removeprefix("layer_")))] = s
            f = files.setdefault(fname, {})
            f[f"param/{local}"] = take(p)
            for k, v in opt.state.get(p, {}).items():
                if k in _OPT_KEYS:
                    f[f"{k}/{local}"] = take(v if torch.is_tensor(v) else torch.tensor(float(v)))
    rng = {"rng/torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["rng/cuda"] = torch.cuda.get_rng_state()
    files["extra"] = {**rng, **{k: take(v) for k, v in (extra or {}).items()}}
    it = state.iteration if iteration is None else iteration
    eff = state.effective_iteration if effective_iteration is None else effective_iteration
    meta = {
        "format": FORMAT,
        "iteration": it,
        "effective_iteration": eff,
        "world_size": world_size,
        "n_stages": state.n_stages,
        "n_layers_per_stage": n_layers_per_stage,
        "layer_stage": layer_stage,
        "lr_multipliers": list(state.lr_multipliers),
        "grad_norms": list(state.grad_norms),
        "strategy": strategy,
        "config": config,
    }
    return Snapshot(it, eff, files, meta)


def materialize(snapshot: Snapshot) -> Snapshot:
    """Replace every tensor of a by-reference snapshot by a CPU copy (in place); returns ``snapshot``."""
    for f in snapshot.files.values():
        for k, t in f.items():
            f[k] = t.to("cpu", copy=True)
    return snapshot


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_snapshot(snapshot: Snapshot, root: Path, keep: int = 2) -> Path:
    """Write ``snapshot`` atomically as ``root/iter_<effective iteration>`` and keep the newest ``keep``.

    Returns the checkpoint directory. It appears only once complete (temporary directory, fsync, rename). An
    existing checkpoint of the same name (a re-save after a rollback) is moved aside first and deleted after.

    Raises:
        CheckpointError: a file could not be written (e.g. the disk is full): one sentence naming the checkpoint,
            the bytes it needs and the last complete checkpoint; the temporary directory is removed.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(snapshot.effective_iteration)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        checksums = {}
        for fname, tensors in snapshot.files.items():
            path = tmp / f"{fname}.safetensors"
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
            _fsync(path)
            checksums[path.name] = {"sha256": _sha256(path), "bytes": path.stat().st_size}
        meta_bytes = jsonio.dumps(dict(snapshot.meta, files=checksums), indent=1).encode()
        (tmp / "meta.json").write_bytes(meta_bytes)
        (tmp / META_SUM).write_text(hashlib.sha256(meta_bytes).hexdigest() + "\n")
        for name in ("meta.json", META_SUM):
            _fsync(tmp / name)
    except (OSError, SafetensorError) as err:  # a full disk, a quota, a vanished mount
        shutil.rmtree(tmp, ignore_errors=True)
        needed = sum(t.numel() * t.element_size() for ts in snapshot.files.values() for t in ts.values())
        done = list_checkpoints(root)
        last = f"the last complete checkpoint is {done[-1]}" if done else "no complete checkpoint exists yet"
        reason = getattr(err, "strerror", None) or str(err).strip().splitlines()[0][:200]
        raise CheckpointError(
            f"could not write checkpoint {final} ({reason}): it needs about {needed / 2**20:.1f} MiB free in "
            f"{root}; {last}."
        ) from None
    trash = root / f".trash-{final.name}-{os.getpid()}"
    if final.exists():
        os.rename(final, trash)
    os.rename(tmp, final)
    _fsync(root)
    shutil.rmtree(trash, ignore_errors=True)
    prune(root, keep)
    return final


def prune(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints and stale temporary directories of other processes."""
    root = Path(root)
    for p in list_checkpoints(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(p, ignore_errors=True)
    for pattern in (".tmp-*", ".trash-*"):
        for p in root.glob(pattern):
            if not p.name.endswith(f"-{os.getpid()}"):
                shutil.rmtree(p, ignore_errors=True)


def check_files(path: Path, meta: dict[str, Any]) -> None:
    """Every file ``meta`` lists exists with the size it records: a cheap check (no hashing) that catches a missing
    or truncated file before a run commits to resuming; :func:`read_checkpoint` verifies the sha256 later.

    Raises:
        CheckpointError: a file missing or of another size, named with the size expected.
    """
    for name, info in meta["files"].items():
        f = Path(path) / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint file {f} is missing.")
        if f.stat().st_size != info["bytes"]:
            raise CheckpointError(
                f"checkpoint file {f} has {f.stat().st_size} bytes, expected {info['bytes']}: "
                "it is truncated or corrupt."
            )


def read_checkpoint(path: Path) -> Snapshot:
    """Read and verify a checkpoint directory (meta.json and every file's size and sha256) into memory.

    Raises:
        CheckpointError: missing directory or meta.json, unknown format, a file missing, truncated or corrupt.
    """
    path = Path(path)
    meta = read_meta(path)
    check_files(path, meta)
    files = {}
    for name, info in meta["files"].items():
        f = path / name
        if _sha256(f) != info["sha256"]:
            raise CheckpointError(f"checkpoint file {f} fails its sha256 check: it is corrupt.")
        try:
            files[name.removesuffix(".safetensors")] = load_file(str(f))
        except SafetensorError as e:
            raise CheckpointError(f"checkpoint file {f} is not a readable safetensors file ({e}).") from None
    return Snapshot(meta["iteration"], meta["effective_iteration"], files, meta)


def _stage_plan(
    snapshot: Snapshot, state: TrainingState, s: int, n_layers_per_stage: int
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], dict[int, dict[str, torch.Tensor]]]:
    """Checked (parameter, saved tensor) pairs and Adam state by parameter index for stage ``s``.

    Raises:
        CheckpointError: a file, tensor or shape the model needs is missing or differs.
    """
    pairs, opt_state = [], {}
    for idx, (name, p) in enumerate(state.stages[s].named_parameters()):
        fname, local = file_of(s, name, n_layers_per_stage)
        src = snapshot.files.get(fname)
        if src is None:
            raise CheckpointError(
                f"checkpoint has no {fname}.safetensors, which stage {s} parameter {name!r} needs."
            )
        t = src.get(f"param/{local}")
        if t is None or t.shape != p.shape:
            raise CheckpointError(
                f"checkpoint tensor for stage {s} parameter {name!r} is missing or has shape "
                f"{None if t is None else tuple(t.shape)}; expected {tuple(p.shape)}."
            )
        pairs.append((p, t))
        if f"step/{local}" in src:
            saved = {k: src.get(f"{k}/{local}") for k in _OPT_KEYS}
            if any(v is None for v in saved.values()) or saved["exp_avg"].shape != p.shape:
                raise CheckpointError(
                    f"checkpoint Adam state for stage {s} parameter {name!r} is incomplete or "
                    f"misshapen in {fname}.safetensors."
                )
            opt_state[idx] = saved
    return pairs, opt_state


def _apply(state: TrainingState, s: int, pairs: list, opt_state: dict[int, dict[str, torch.Tensor]]) -> None:
    with torch.no_grad():
        for p, t in pairs:
            p.copy_(t)
    opt = state.optimizers[s]
    sd = opt.state_dict()
    sd["state"] = {idx: {k: v.clone() for k, v in st.items()} for idx, st in opt_state.items()}
    opt.load_state_dict(sd)


def restore(snapshot: Snapshot, state: TrainingState, n_layers_per_stage: int) -> bool:
    """Load ``snapshot`` into ``state`` (weights, Adam state, positions, RNG), possibly into another stage layout
    with the same total layers. Nothing is changed unless every tensor fits.

    Sets ``state.iteration`` and ``state.effective_iteration`` from the snapshot (a rollback puts the wall-clock
    iteration back itself). Returns True when the layout is the checkpoint's own (per-stage LR multipliers and
    gradient norms are then restored too; otherwise they restart at 1.0, the paper's value before any iteration).

    Raises:
        CheckpointError: the checkpoint's layers or shapes do not fit the model.
    """
    meta = snapshot.meta
    total = meta["n_stages"] * meta["n_layers_per_stage"]
    if total != state.n_stages * n_layers_per_stage:
        raise CheckpointError(
            f"checkpoint has {total} transformer layers; the model has "
            f"{state.n_stages} × {n_layers_per_stage} = {state.n_stages * n_layers_per_stage}."
        )
    plans = [_stage_plan(snapshot, state, s, n_layers_per_stage) for s in range(len(state.stages))]
    for s, (pairs, opt_state) in enumerate(plans):
        _apply(state, s, pairs, opt_state)
    state.iteration = snapshot.iteration
    state.effective_iteration = snapshot.effective_iteration
    same_layout = meta["n_stages"] == state.n_stages
    n = len(state.stages)
    state.lr_multipliers = list(meta["lr_multipliers"]) if same_layout else [1.0] * n
    state.grad_norms = list(meta["grad_norms"]) if same_layout else [1.0] * n
    for s, opt in enumerate(state.optimizers):
        for g in opt.param_groups:
            g["lr"] = state.base_lr * state.lr_multipliers[s]
    extra = snapshot.files.get("extra", {})
    if "rng/torch" in extra:
        torch.set_rng_state(extra["rng/torch"])
    if "rng/cuda" in extra and torch.cuda.is_available():
        torch.cuda.set_rng_state(extra["rng/cuda"])
    return same_layout


def restore_stage(snapshot: Snapshot, state: TrainingState, stage: int, n_layers_per_stage: int) -> None:
    """Load only stage ``stage`` (weights, Adam state, LR multiplier) from a snapshot of the same layout.

    The other stages, the positions and the RNG are left alone (the ``one`` baseline, docs/paper.md §4).

    Raises:
        CheckpointError: the snapshot has another layout or the stage's tensors do not fit.
    """
    meta = snapshot.meta
    if (meta["n_stages"], meta["n_layers_per_stage"]) != (state.n_stages, n_layers_per_stage):
        raise CheckpointError(
            f"checkpoint layout {meta['n_stages']} × {meta['n_layers_per_stage']} differs from "
            f"the model's {state.n_stages} × {n_layers_per_stage}; one stage cannot be restored."
        )
    pairs, opt_state = _stage_plan(snapshot, state, stage, n_layers_per_stage)
    _apply(state, stage, pairs, opt_state)
    state.lr_multipliers[stage] = meta["lr_multipliers"][stage]
    for g in state.optimizers[stage].param_groups:
        g["lr"] = state.base_lr * state.lr_multipliers[stage]
