"""Universal run checkpoints: per-layer safetensors + a JSON of metadata, atomic, checksummed.

Layout of one checkpoint directory ``<root>/iter_0000100/``::

    meta.json               format, iterations, config, layer → stage map, per-file sha256 and size, …
    stage0.safetensors      embedding + final norm + head: "param/<name>", "exp_avg/<name>", "exp_avg_sq/<name>",
                            "step/<name>"
    layer_0000.safetensors  global transformer block 0, same key scheme with the block-local name
    …
    extra.safetensors       RNG state and strategy tensors

Because blocks are stored by their index in the unsplit model, a checkpoint of 4 stages × 3 layers resumes into
6 stages × 2 layers (or another data-parallel world size: every rank holds the same replica).

Writes go to a temporary directory that is renamed into place after every file is fsync'ed, so a crash (even
SIGKILL) mid-save leaves the previous checkpoints intact. Loading verifies every checksum before touching the model
and refuses a truncated or corrupt checkpoint with one sentence naming the file.
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
from safetensors.torch import load_file, save_file

from checkfree.training_state import TrainingState

log = logging.getLogger(__name__)

FORMAT = "checkfree-universal-v1"
_DIR_RE = re.compile(r"^iter_(\d{7,})$")
_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated, corrupt or does not fit the model; one sentence says which."""


@dataclass
class Snapshot:
    """An in-memory copy of everything a checkpoint holds (taken between optimizer steps)."""

    iteration: int
    effective_iteration: int
    files: dict[str, dict[str, torch.Tensor]]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for f in self.files.values() for t in f.values())


def _optimizer_tensors(opt: torch.optim.Optimizer, names: list[str]) -> dict[str, dict[str, torch.Tensor]]:
    """Adam state per parameter name: {"exp_avg": …, "exp_avg_sq": …, "step": …} (empty before a step)."""
    params = [p for g in opt.param_groups for p in g["params"]]
    out = {}
    for name, p in zip(names, params, strict=True):
        st = opt.state.get(p)
        if st:
            out[name] = {k: (v if torch.is_tensor(v) else torch.tensor(float(v))) for k, v in st.items()}
    return out


def capture(state: TrainingState, n_layers_per_stage: int, config: dict[str, Any],
            extra: dict[str, torch.Tensor] | None = None, strategy: str = "") -> Snapshot:
    """Copy the training state into a :class:`Snapshot` (tensors cloned to CPU, so training may go on)."""
    files: dict[str, dict[str, torch.Tensor]] = {}
    layer_stage: dict[str, int] = {}
    for s, (stage, opt) in enumerate(zip(state.stages, state.optimizers, strict=True)):
        names = [n for n, _ in stage.named_parameters()]
        opt_state = _optimizer_tensors(opt, names)
        for name, p in stage.named_parameters():
            if s == 0:
                fname, local = "stage0", name
            else:
                m = _LAYER_RE.match(name)
                g = (s - 1) * n_layers_per_stage + int(m.group(1))
                fname, local = f"layer_{g:04d}", m.group(2)
                layer_stage[str(g)] = s
            f = files.setdefault(fname, {})
            f[f"param/{local}"] = p.detach().to("cpu", copy=True)
            for k, v in opt_state.get(name, {}).items():
                f[f"{k}/{local}"] = v.detach().to("cpu", copy=True).reshape(v.shape)
    extra_tensors = {"rng/torch": torch.get_rng_state()}
    extra_tensors.update(extra or {})
    files["extra"] = {k: v.detach().to("cpu", copy=True) for k, v in extra_tensors.items()}
    meta = {
        "format": FORMAT, "iteration": state.iteration, "effective_iteration": state.effective_iteration,
        "n_stages": state.n_stages, "n_layers_per_stage": n_layers_per_stage, "layer_stage": layer_stage,
        "lr_multipliers": list(state.lr_multipliers), "grad_norms": list(state.grad_norms),
        "strategy": strategy, "config": config,
    }
    return Snapshot(state.iteration, state.effective_iteration, files, meta)


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


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def write_snapshot(snapshot: Snapshot, root: Path, keep: int = 2) -> Path:
    """Write ``snapshot`` atomically as ``root/iter_<effective iteration>`` and keep the newest ``keep``.

    Returns the checkpoint directory. The directory appears only once complete (tmp dir + fsync + rename).
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(snapshot.effective_iteration)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    checksums = {}
    for fname, tensors in snapshot.files.items():
        path = tmp / f"{fname}.safetensors"
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
        _fsync(path)
        checksums[path.name] = {"sha256": _sha256(path), "bytes": path.stat().st_size}
    meta = dict(snapshot.meta, files=checksums)
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    _fsync(tmp / "meta.json")
    if final.exists():  # re-saving the same effective iteration after a rollback
        shutil.rmtree(final)
    os.rename(tmp, final)
    dir_fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    prune(root, keep)
    return final


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first (temporary directories are ignored)."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _DIR_RE.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def prune(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints and any stale temporary directories."""
    for p in list_checkpoints(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(p, ignore_errors=True)
    for p in root.glob(".tmp-*"):
        if not p.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(p, ignore_errors=True)


def read_checkpoint(path: Path) -> Snapshot:
    """Read and verify a checkpoint directory (every file's size and sha256) into memory.

    Raises:
        CheckpointError: missing directory or meta.json, unknown format, a file missing, truncated or corrupt.
    """
    path = Path(path)
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        raise CheckpointError(f"checkpoint {path} has no meta.json; expected a directory written by checkfree "
                              "(an interrupted save never leaves one under its final name).")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError:
        raise CheckpointError(f"checkpoint {meta_path} is not valid JSON; the checkpoint is corrupt.") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {meta.get('format')!r}; expected {FORMAT!r}.")
    files = {}
    for name, info in meta["files"].items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint file {f} is missing.")
        if f.stat().st_size != info["bytes"]:
            raise CheckpointError(f"checkpoint file {f} has {f.stat().st_size} bytes, expected {info['bytes']}: "
                                  "it is truncated or corrupt.")
        if _sha256(f) != info["sha256"]:
            raise CheckpointError(f"checkpoint file {f} fails its sha256 check: it is corrupt.")
        files[name.removesuffix(".safetensors")] = load_file(str(f))
    return Snapshot(meta["iteration"], meta["effective_iteration"], files, meta)


def _load_optimizer(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], locals_: list[str]) -> None:
    """Adam state from "<key>/<local name>" tensors; parameters are in ``named_parameters`` order."""
    sd = opt.state_dict()
    sd["state"] = {idx: {k: tensors[f"{k}/{local}"].clone() for k in ("step", "exp_avg", "exp_avg_sq")}
                   for idx, local in enumerate(locals_) if f"step/{local}" in tensors}
    opt.load_state_dict(sd)


def restore(snapshot: Snapshot, state: TrainingState, n_layers_per_stage: int) -> bool:
    """Load ``snapshot`` into ``state``, which may use another stage layout with the same total layers.

    Returns True when the layout is the checkpoint's own (per-stage LR multipliers and gradient norms are then
    restored too; otherwise they restart at 1.0, the paper's value before any iteration).

    Raises:
        CheckpointError: the checkpoint's layers or shapes do not fit the model.
    """
    meta = snapshot.meta
    total = meta["n_stages"] * meta["n_layers_per_stage"]
    if total != state.n_stages * n_layers_per_stage:
        raise CheckpointError(f"checkpoint has {total} transformer layers; the model has "
                              f"{state.n_stages} × {n_layers_per_stage} = {state.n_stages * n_layers_per_stage}.")
    with torch.no_grad():
        for s, stage in enumerate(state.stages):
            names = [n for n, _ in stage.named_parameters()]
            locals_, sources = [], []
            for n in names:
                if s == 0:
                    locals_.append(n)
                    sources.append(snapshot.files["stage0"])
                else:
                    m = _LAYER_RE.match(n)
                    g = (s - 1) * n_layers_per_stage + int(m.group(1))
                    locals_.append(m.group(2))
                    sources.append(snapshot.files[f"layer_{g:04d}"])
            for (n, p), local, src in zip(stage.named_parameters(), locals_, sources, strict=True):
                t = src.get(f"param/{local}")
                if t is None or t.shape != p.shape:
                    raise CheckpointError(f"checkpoint tensor for stage {s} parameter {n!r} is missing or has "
                                          f"shape {None if t is None else tuple(t.shape)}; expected "
                                          f"{tuple(p.shape)}.")
                p.copy_(t)
            merged: dict[str, torch.Tensor] = {}
            for local, src in zip(locals_, sources, strict=True):
                for k in ("step", "exp_avg", "exp_avg_sq"):
                    if f"{k}/{local}" in src:
                        merged[f"{k}/{local}"] = src[f"{k}/{local}"]
            _load_optimizer(state.optimizers[s], merged, locals_)
    state.iteration = snapshot.iteration
    state.effective_iteration = snapshot.effective_iteration
    same_layout = meta["n_stages"] == state.n_stages
    n = len(state.stages)
    state.lr_multipliers = list(meta["lr_multipliers"]) if same_layout else [1.0] * n
    state.grad_norms = list(meta["grad_norms"]) if same_layout else [1.0] * n
    for s, opt in enumerate(state.optimizers):
        for g in opt.param_groups:
            g["lr"] = state.base_lr * state.lr_multipliers[s]
    if "rng/torch" in snapshot.files.get("extra", {}):
        torch.set_rng_state(snapshot.files["extra"]["rng/torch"])
    return same_layout
