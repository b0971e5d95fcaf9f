"""Token shards on disk: atomic writes, a read-only view over many shards, and verification.

A token cache holds ``val.bin`` and ``train-00000.bin``, ``train-00001.bin``, … : flat arrays of token ids
(uint16 when the vocabulary fits in 65,535 ids, else uint32), as nanoGPT's ``prepare.py`` writes them. Every file
is written to ``NAME.tmp``, fsynced and renamed, so a file that exists under its final name is complete; the cache's
``meta.json`` (also replaced atomically) lists each shard with its token count and sha256, so a shard that was
renamed but never listed (a kill between the two steps) is simply written again.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from checkfree import jsonio


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id < vocab_size fits (vocab_size ≤ 65,536), else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 65536 else np.uint32)


def sha256_of(path: Path) -> str:
    """sha256 of a file's bytes (about 1 s per GB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` so that ``path`` is either absent or complete: tmp file, fsync, rename."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def write_json_atomic(path: Path, obj: dict[str, Any]) -> None:
    """``write_atomic`` of ``obj`` as indented JSON."""
    write_atomic(path, jsonio.dumps(obj, indent=1).encode())


def write_ids(path: Path, ids: np.ndarray, dtype: np.dtype) -> dict[str, Any]:
    """Write token ids atomically as ``dtype``; returns the shard record {"file", "tokens", "sha256"}.
    Raises ValueError when an id does not fit ``dtype``."""
    limit = np.iinfo(dtype).max
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) > limit):
        raise ValueError(f"token id {int(ids.max())} does not fit the cache dtype {dtype.name}.")
    data = np.ascontiguousarray(ids, dtype=dtype)
    write_atomic(path, memoryview(data).cast("B"))
    return {"file": path.name, "tokens": len(data), "sha256": hashlib.sha256(memoryview(data)).hexdigest()}


def check_sizes(directory: Path, records: list[dict[str, Any]], dtype: np.dtype) -> int:
    """How many leading records have a file of exactly tokens × itemsize bytes (the cheap check on open)."""
    for i, rec in enumerate(records):
        path = directory / rec["file"]
        if not path.is_file() or path.stat().st_size != int(rec["tokens"]) * dtype.itemsize:
            return i
    return len(records)


def verify(directory: Path, records: list[dict[str, Any]]) -> list[str]:
    """Files among ``records`` whose sha256 differs from the recorded one (empty when all verify)."""
    return [rec["file"] for rec in records if sha256_of(directory / rec["file"]) != rec["sha256"]]


class TokenStream:
    """The training token stream as one read-only 1-D array over memory-mapped shards, cut at ``limit`` tokens.

    Supports ``len``, ``dtype``, ``shape``, ``ndim``, slicing with step 1 (returns an ndarray, crossing shard
    boundaries), ``max()`` and ``np.asarray`` (which reads every shard: tests and small corpora only).
    """

    ndim = 1

    def __init__(self, shards: list[np.memmap], limit: int | None = None):
        if not shards:
            raise ValueError("TokenStream needs at least one shard; got none.")
        self.shards = shards
        self.dtype = shards[0].dtype
        self._starts = np.cumsum([0] + [len(s) for s in shards])
        total = int(self._starts[-1])
        self._len = total if limit is None else min(total, limit)

    def __len__(self) -> int:
        return self._len

    @property
    def shape(self) -> tuple[int]:
        return (self._len,)

    def __getitem__(self, index: slice | int) -> np.ndarray | Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            if step != 1:
                raise ValueError(f"TokenStream slices take step 1; got step {step}.")
            return self._read(start, max(start, stop))
        i = int(index) + (self._len if int(index) < 0 else 0)
        if not 0 <= i < self._len:
            raise IndexError(f"token index {index} is outside a stream of {self._len} tokens.")
        return self._read(i, i + 1)[0]

    def _read(self, start: int, stop: int) -> np.ndarray:
        first = int(np.searchsorted(self._starts, start, side="right")) - 1
        parts = []
        pos = start
        k = first
        while pos < stop:
            lo = pos - int(self._starts[k])
            hi = min(stop, int(self._starts[k + 1])) - int(self._starts[k])
            parts.append(np.asarray(self.shards[k][lo:hi]))
            pos = int(self._starts[k]) + hi
            k += 1
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.empty(0, dtype=self.dtype)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self._read(0, self._len)
        return out.astype(dtype) if dtype is not None else np.array(out)

    def max(self) -> Any:
        """Largest id in the stream (reads every shard)."""
        return max(np.asarray(self.shards[k][: self._len - int(self._starts[k])]).max() for k in self._used())

    def _used(self) -> range:
        return range(int(np.searchsorted(self._starts, self._len, side="left")) or 1)
