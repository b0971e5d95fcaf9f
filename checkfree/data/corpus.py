"""DataSpec → Corpus: documents → tokenizer → token ids cached once on disk in shards, memory-mapped later.

Cache layout (one entry per content hash of the inputs and the spec, so a changed spec builds a new entry and an
old one stays usable; the token budget is not part of the key: a larger budget extends an entry):

    <cache_dir>/<name>-<key16>/meta.json         key, spec, dtype, vocab, eos id, val and shard records (sha256)
                               tokenizer/        AutoTokenizer-loadable directory
                               val.bin           packed held-out ids (uint16 if vocab ≤ 65,535, else uint32)
                               train-00000.bin   packed training ids, one file per ~32 MB of text (checkfree.data.build)
    <cache_dir>/<name>-<key16>.lock              filelock: one builder among concurrent ranks

Every file is written atomically and meta.json lists only complete shards, so a build killed at any moment resumes
at its next shard (checkfree.data.build). Opening checks each file's size (milliseconds); :func:`verify_corpus`
checks every sha256.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from checkfree import jsonio
from checkfree.data import build, shards, sources
from checkfree.data import tokenizer as tok_mod
from checkfree.data.build import (
    CACHE_FORMAT,
    HOLDOUT_BYTES_PER_TOKEN,
    read_meta,
    train_token_target,
    val_target,
)
from checkfree.data.shards import TokenStream
from checkfree.data.sources import Source
from checkfree.data.spec import DataSpec

logger = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 4 * 3600.0


@dataclass(frozen=True, eq=False)
class Corpus:
    """Token ids ready for batching: 1-D memory-mapped streams of packed documents, each followed by ``eos_id``."""

    name: str
    train: TokenStream
    """The training stream over the cache's shards, cut at ``DataSpec.max_train_tokens``."""
    val: np.ndarray
    vocab_size: int
    """Model vocabulary size: every id in train/val is below it."""
    eos_id: int
    tokenizer_dir: Path
    """Directory loadable with ``AutoTokenizer.from_pretrained`` / ``PreTrainedTokenizerFast.from_pretrained``."""
    tokenizer: str
    path: Path
    """The cache entry directory."""
    exhausted: bool = True
    """Whether ``train`` holds the whole corpus (False: the cache stopped at the token budget)."""

    def describe(self) -> str:
        """One line: dataset, token counts, vocabulary."""
        return (
            f"{self.name}: {len(self.train):,} training + {len(self.val):,} validation tokens, "
            f"vocab {self.vocab_size} ({self.tokenizer}), eos id {self.eos_id}"
        )


def prepare_corpus(spec: DataSpec) -> Corpus:
    """Load, tokenize and cache ``spec``'s corpus once; later calls memory-map the cache (~ms).

    Safe when several ranks call it at once: one builds under a file lock, the others wait and then map. A build
    killed part-way resumes at its next shard; a corrupted shard is rebuilt from there, a corrupted entry from
    scratch (with a warning). Raises ValueError for bad inputs (unknown dataset, no matching files, unsupported
    extension, rows without "text", vocab_size too small, corpus too small for the hold-out) and
    DataUnavailableError when a hub dataset/tokenizer cannot be reached.
    """
    kind = tok_mod.check_tokenizer_name(spec.tokenizer, spec.vocab_size)
    source = sources.resolve_source(spec.dataset)
    key = _cache_key(spec, source, kind)
    entry = spec.cache_dir / f"{_slug(source.name)}-{key[:16]}"
    corpus, _ = _open_entry(entry, key, spec, source)
    if corpus is not None:
        return corpus
    from filelock import FileLock, Timeout

    spec.cache_dir.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(entry) + ".lock", timeout=LOCK_TIMEOUT_S):
            corpus, problem = _open_entry(entry, key, spec, source)
            if corpus is not None:
                return corpus
            if problem:
                logger.warning("rebuilding the data cache %s: %s", entry, problem)
            _build(spec, source, kind, key, entry)
    except Timeout as exc:
        raise RuntimeError(
            f"waited {LOCK_TIMEOUT_S:.0f} s for another process to build the data cache {entry}; "
            f"remove {entry}.lock if no process is building it."
        ) from exc
    corpus, problem = _open_entry(entry, key, spec, source)
    if corpus is None:
        raise RuntimeError(f"the data cache {entry} is unreadable right after building it: {problem}")
    return corpus


def verify_corpus(corpus: Corpus) -> list[str]:
    """Files of ``corpus``'s cache whose sha256 differs from meta.json (empty: the cache verifies)."""
    meta = json.loads((corpus.path / "meta.json").read_text())
    return shards.verify(corpus.path, [meta["val"], *meta["shards"]])


def load_documents(spec: DataSpec) -> list[str]:
    """The documents of ``spec.dataset`` in corpus order (before hold-out and tokenization); local data only."""
    source = sources.resolve_source(spec.dataset)
    return sources.load_local_documents(source.files, spec.cache_dir / "hf")


def _cache_key(spec: DataSpec, source: Source, kind: str) -> str:
    fields = {
        "format": CACHE_FORMAT,
        "source": source.fingerprint,
        "tokenizer": tok_mod.tokenizer_fingerprint(spec.tokenizer, kind, spec.vocab_size),
        "val_tokens": val_target(spec),
        "seed": spec.seed,
        "txt_document_chars": sources.TXT_DOCUMENT_CHARS,
        "holdout_bytes_per_token": HOLDOUT_BYTES_PER_TOKEN,
    }
    return hashlib.sha256(jsonio.dumps(fields, sort_keys=True).encode()).hexdigest()


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_.")[-40:].lower() or "corpus"


def _open_entry(entry: Path, key: str, spec: DataSpec, source: Source) -> tuple[Corpus | None, str | None]:
    """(corpus, None) for a usable entry; (None, why) for a damaged one; (None, None) when absent or short of
    the token target (the build then resumes or extends it)."""
    meta, problem = read_meta(entry, key)
    if meta is None:
        return None, problem
    dtype = np.dtype(meta["dtype"])
    records = meta["shards"]
    good = shards.check_sizes(entry, records, dtype)
    if good < len(records):
        rec = records[good]
        return None, f"{entry / rec['file']} is missing or does not hold {rec['tokens']} tokens"
    total = sum(int(r["tokens"]) for r in records)
    target = train_token_target(spec, source)
    if not meta["exhausted"] and (target is None or total < target):
        return None, None
    if total < spec.seq_len + 1:
        raise ValueError(
            f"dataset {spec.dataset!r} leaves {total} training tokens after holding out {meta['val']['tokens']} "
            f"validation tokens; expected at least seq_len + 1 = {spec.seq_len + 1} (use more data or fewer "
            "validation_sequences)."
        )
    maps = [np.memmap(entry / r["file"], dtype=dtype, mode="r", shape=(int(r["tokens"]),)) for r in records]
    # every shard holds at least one document, hence at least its EOS: no empty (unmappable) files
    val = np.memmap(entry / "val.bin", dtype=dtype, mode="r", shape=(int(meta["val"]["tokens"]),))
    corpus = Corpus(
        name=str(meta["name"]),
        train=TokenStream(maps, spec.max_train_tokens),
        val=val,
        vocab_size=int(meta["vocab_size"]),
        eos_id=int(meta["eos_id"]),
        tokenizer_dir=entry / "tokenizer",
        tokenizer=spec.tokenizer,
        path=entry,
        exhausted=bool(meta["exhausted"]),
    )
    return corpus, None


def _build(spec: DataSpec, source: Source, kind: str, key: str, entry: Path) -> None:
    """Build, resume or extend the entry (under the lock); see checkfree.data.build."""
    build.build_entry(spec, source, kind, key, entry)
