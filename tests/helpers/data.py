"""Tiny corpora and configs over them, written into a test's tmp_path."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from checkfree.data.corpus import DataSpec

WORDS = "the king queen sword crown night day love death fool ghost castle storm sea letter ring".split()


def write_tiny_corpus(root: Path, n_files: int = 24, words: int = 300, seed: int = 0) -> list[Path]:
    """n_files .txt files of pseudo-random English-ish words; each file is one document (short of 16 KB)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in range(n_files):
        lines = []
        for _ in range(words // 10):
            lines.append(" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), 10)) + ".")
        text = f"Document {f}.\n" + "\n".join(lines) + "\n"
        path = root / f"doc_{f:02d}.txt"
        path.write_text(text)
        paths.append(path)
    return paths


def data_spec(tmp_path: Path, dataset: str | None = None, **kw) -> DataSpec:
    """A DataSpec of the tiny corpus in ``tmp_path / "txt"`` (written if absent) or of ``dataset``, cached in
    ``tmp_path / "cache"`` (vocabulary 300, sequences of 16 tokens, 4 validation sequences unless ``kw`` says)."""
    if dataset is None:
        dataset = str(tmp_path / "txt")
        if not (tmp_path / "txt").exists():
            write_tiny_corpus(tmp_path / "txt")
    kw.setdefault("vocab_size", 300)
    kw.setdefault("seq_len", 16)
    kw.setdefault("validation_sequences", 4)
    return DataSpec(dataset, cache_dir=tmp_path / "cache", **kw)


def micro_config(tmp_path: Path) -> Path:
    """A 4-stage model config (d 32, vocab 300) over a tiny corpus in ``tmp_path / "txt"``: tmp_path/micro.json."""
    write_tiny_corpus(tmp_path / "txt", n_files=24)
    cfg = {
        "dataset": str(tmp_path / "txt"),
        "architecture": "LLaMa",
        "validation": 2,
        "dmodel": 32,
        "num_heads": 2,
        "n_layers_per_stage": 1,
        "n_stages": 4,
        "seq_l": 16,
        "batch_size": 2,
        "mb_count": 2,
        "lr_scale": 1.1,
        "max_iterations": 4,
        "lr": 3e-3,
        "eval_interval": 2,
        "log_interval": 1,
        "checkpoint_interval": 0,
        "vocab_size": 300,
    }
    path = tmp_path / "micro.json"
    path.write_text(json.dumps(cfg))
    return path
