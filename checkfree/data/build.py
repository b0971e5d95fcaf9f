"""Building a token cache the way nanoGPT's ``prepare.py`` does, resumable and in bounded memory.

    1. hold-out: the documents are counted (sizes only), a seeded permutation picks the validation candidates (the
       first documents of the order holding 8 × the validation tokens in bytes); a hub stream, already shuffled
       (docs/paper.md §6: buffer 10,000, seed 42), gives its first documents instead.
    2. tokenizer: "bpe" trains a byte-level BPE on at most BPE_TRAIN_MAX_BYTES of the other documents; hub or
       local tokenizers are loaded. val.bin and meta.json are written.
    3. shards: the remaining documents stream in corpus order; every SHARD_TEXT_BYTES of text are tokenized with
       ``datasets.Dataset.map(batched=True, num_proc=N)`` and written as one ``train-NNNNN.bin`` (atomically),
       then meta.json lists the shard. Building stops when the training stream holds the token target (the run's
       budget) or the corpus ends.

Memory holds one shard of text and its ids (~32 MB of text), never the corpus. A build killed at any point
restarts at step 1 if meta.json was not written yet, else at its next shard; a later run with a larger budget
continues the same way.
"""

from __future__ import annotations

import array
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from checkfree.data import shards, sources
from checkfree.data import tokenizer as tok_mod
from checkfree.data.sources import Source
from checkfree.data.spec import DataSpec

logger = logging.getLogger(__name__)

CACHE_FORMAT = 2
HOLDOUT_BYTES_PER_TOKEN = 8
"""For "bpe": the tokenizer is trained without the first documents of the seeded order that hold
8 × (validation tokens) bytes, so the documents later held out for validation were not seen by it."""
DEFAULT_HUB_TRAIN_TOKENS = 100_000_000
SHARD_TEXT_BYTES = 32 << 20
"""Characters of text per training shard (~8–10 M tokens)."""
BPE_TRAIN_MAX_BYTES = 32 << 20
"""The "bpe" tokenizer trains on at most this much text (the whole 5 MB Shakespeare corpus)."""
CHARS_PER_TOKEN_BOUND = 6
"""Near the token budget a shard is cut after 6 × (missing tokens) characters (English: ~3–4 chars/token)."""
ENCODE_BATCH_DOCS = 64
PARALLEL_MIN_CHARS = 1 << 20
"""Shards with less text than this are tokenized in-process (a worker pool costs ~0.5 s to start)."""


def val_target(spec: DataSpec) -> int:
    """Validation tokens: validation_sequences × (seq_len + 1)."""
    return spec.validation_sequences * (spec.seq_len + 1)


def train_token_target(spec: DataSpec, source: Source) -> int | None:
    """Training tokens the cache must hold: the budget, 100 M for a hub dataset without one, None = all."""
    if spec.max_train_tokens is not None:
        return spec.max_train_tokens
    return DEFAULT_HUB_TRAIN_TOKENS if source.hub is not None else None


def iter_documents(spec: DataSpec, source: Source) -> Iterator[str]:
    """The documents of ``source`` in corpus order, streamed (a hub dataset: its seeded shuffled stream)."""
    hf_cache = spec.cache_dir / "hf"
    if source.hub is not None:
        return sources.stream_hub_documents(source.hub, spec.seed, hf_cache)
    return sources.iter_local_documents(source.files, hf_cache)


def read_meta(entry: Path, key: str) -> tuple[dict[str, Any] | None, str | None]:
    """(meta, None) when the entry's meta.json, tokenizer and val.bin are sound (shards are not checked here);
    (None, why) for a broken entry; (None, None) when there is no meta.json yet."""
    meta_path = entry / "meta.json"
    if not meta_path.exists():
        return None, None
    try:
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != CACHE_FORMAT or meta.get("key") != key:
            return None, f"{meta_path} belongs to another spec or cache format"
        dtype = np.dtype(meta["dtype"])
        if shards.check_sizes(entry, [meta["val"]], dtype) != 1 or int(meta["val"]["tokens"]) < 1:
            return None, f"{entry / 'val.bin'} is missing or does not hold {meta['val']['tokens']} tokens"
        if not (entry / "tokenizer" / "tokenizer.json").is_file():
            return None, f"{entry / 'tokenizer'} has no tokenizer.json"
        for rec in meta["shards"]:
            int(rec["tokens"]), int(rec["end_doc"]), str(rec["file"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"{meta_path} is corrupted ({type(exc).__name__}: {exc})"
    return meta, None


def build_entry(spec: DataSpec, source: Source, kind: str, key: str, entry: Path) -> None:
    """Build, resume or extend the cache entry ``entry`` (the caller holds its lock)."""
    meta, _ = read_meta(entry, key)
    if meta is None:
        if entry.exists():
            shutil.rmtree(entry)
        entry.mkdir(parents=True)
        meta = _build_prefix(spec, source, kind, key, entry)
    else:  # resume or extend: keep the listed shards up to the first whose size or sha256 is wrong
        good = shards.check_sizes(entry, meta["shards"], np.dtype(meta["dtype"]))
        bad = set(shards.verify(entry, meta["shards"][:good]))
        good = next((i for i, r in enumerate(meta["shards"][:good]) if r["file"] in bad), good)
        if good < len(meta["shards"]):
            logger.warning("data cache %s: rewriting shards %d.. (damaged or missing)", entry, good)
            meta["shards"] = meta["shards"][:good]
            meta["exhausted"] = False
            meta["train_tokens"] = sum(int(r["tokens"]) for r in meta["shards"])
            meta["train_documents"] = sum(int(r["documents"]) for r in meta["shards"])
            shards.write_json_atomic(entry / "meta.json", meta)  # never list a damaged shard again
    _extend(spec, source, entry, meta)


def _build_prefix(spec: DataSpec, source: Source, kind: str, key: str, entry: Path) -> dict[str, Any]:
    """Hold-out, tokenizer, val.bin and the first meta.json (no shards yet)."""
    t0 = time.perf_counter()
    tokenizer = None
    if kind != "bpe":  # a hub tokenizer fails fast, before minutes of streaming
        tokenizer = tok_mod.load_tokenizer(spec.tokenizer, kind, entry / "tokenizer", spec.cache_dir / "hf")
    excluded, texts, n_docs = _holdout(spec, source)
    t_docs = time.perf_counter()
    if tokenizer is None:
        docs = _bpe_documents(iter_documents(spec, source), set(excluded))
        tokenizer = tok_mod.train_bpe(docs, spec.vocab_size, entry / "tokenizer")
    t_tok = time.perf_counter()
    val_ids, picked = _validation_ids(spec, excluded, texts, tokenizer, n_docs)
    dtype = shards.token_dtype(tokenizer.vocab_size)
    meta = {
        "format": CACHE_FORMAT,
        "key": key,
        "name": source.name,
        "spec": {k: str(v) if isinstance(v, Path) else v for k, v in spec.__dict__.items()},
        "dtype": dtype.name,
        "vocab_size": tokenizer.vocab_size,
        "eos_id": tokenizer.eos_id,
        "documents": n_docs,
        "val": shards.write_ids(entry / "val.bin", val_ids, dtype),
        "val_tokens": len(val_ids),
        "val_documents": len(picked),
        "val_document_indices": sorted(picked),
        "shards": [],
        "train_tokens": 0,
        "train_documents": 0,
        "exhausted": False,
        "seconds": {
            "documents": round(t_docs - t0, 3),
            "tokenizer": round(t_tok - t_docs, 3),
            "tokenize": round(time.perf_counter() - t_tok, 3),
        },
    }
    shards.write_json_atomic(entry / "meta.json", meta)
    return meta


def _holdout(spec: DataSpec, source: Source) -> tuple[list[int], dict[int, str], int | None]:
    """Validation candidates in order, their texts, and the document count (None for a hub stream)."""
    budget = HOLDOUT_BYTES_PER_TOKEN * val_target(spec)
    if source.hub is not None:
        texts: dict[int, str] = {}
        size = 0
        for i, doc in enumerate(iter_documents(spec, source)):
            texts[i] = doc
            size += len(doc.encode("utf-8"))
            if size >= budget:
                break
        return list(texts), texts, None
    sizes = np.fromiter((len(d.encode("utf-8")) for d in iter_documents(spec, source)), dtype=np.int64)
    n = len(sizes)
    if n < 2:
        raise ValueError(
            f"dataset {spec.dataset!r} yields {n} document(s); expected at least 2 so that validation "
            "documents can be held out from training."
        )
    excluded: list[int] = []
    size = 0
    for i in np.random.default_rng(spec.seed).permutation(n)[: n // 2]:
        if size >= budget:
            break
        excluded.append(int(i))
        size += int(sizes[i])
    wanted = set(excluded)
    texts = {i: d for i, d in enumerate(iter_documents(spec, source)) if i in wanted}
    return excluded, texts, n


def _bpe_documents(docs: Iterable[str], excluded: set[int]) -> Iterator[str]:
    size = 0
    for i, doc in enumerate(docs):
        if i in excluded:
            continue
        yield doc
        size += len(doc)
        if size >= BPE_TRAIN_MAX_BYTES:
            logger.info("the BPE tokenizer trains on the first %d MB of text", BPE_TRAIN_MAX_BYTES >> 20)
            return


def _validation_ids(
    spec: DataSpec,
    excluded: list[int],
    texts: dict[int, str],
    tokenizer: tok_mod.LoadedTokenizer,
    n_docs: int | None,
) -> tuple[np.ndarray, set[int]]:
    """Whole candidate documents, in order, until they hold the validation tokens (EOS included)."""
    target = val_target(spec)
    parts: list[np.ndarray] = []
    picked: set[int] = set()
    total = 0
    for start in range(0, len(excluded), 64):
        chunk = excluded[start : start + 64]
        for i, ids in zip(chunk, tokenizer.encode([texts[i] for i in chunk]), strict=True):
            parts.append(ids)
            picked.add(i)
            total += len(ids)
            if total >= target:
                return np.concatenate(parts), picked
    raise ValueError(
        f"dataset {spec.dataset!r} is too small: the documents it can hold out ({len(excluded)} of "
        f"{n_docs if n_docs is not None else 'a stream of'} documents) hold {total} tokens, fewer than the "
        f"{target} validation tokens (validation_sequences × (seq_len + 1) = {spec.validation_sequences} × "
        f"{spec.seq_len + 1}); use more data or fewer validation_sequences."
    )


def _extend(spec: DataSpec, source: Source, entry: Path, meta: dict[str, Any]) -> None:
    """Write training shards until the stream holds the token target or the corpus ends."""
    target = train_token_target(spec, source)
    total = sum(int(r["tokens"]) for r in meta["shards"])
    if meta["exhausted"] or (target is not None and total >= target):
        return
    start = int(meta["shards"][-1]["end_doc"]) if meta["shards"] else 0
    if meta["shards"]:
        logger.info(
            "data cache %s: resuming at shard %d (%d training tokens written)",
            entry,
            len(meta["shards"]),
            total,
        )
    picked = set(meta["val_document_indices"])
    encoder = _ShardEncoder(entry, meta, spec.num_proc or min(8, os.cpu_count() or 1))
    docs: list[str] = []
    chars = 0
    last = start - 1
    for i, doc in enumerate(iter_documents(spec, source)):
        if i < start or i in picked:
            continue
        docs.append(doc)
        chars += len(doc)
        last = i
        missing = None if target is None else target - total
        if chars >= SHARD_TEXT_BYTES or (missing is not None and chars >= missing * CHARS_PER_TOKEN_BOUND):
            total += encoder.write(docs, end_doc=i + 1)
            docs, chars = [], 0
            if target is not None and total >= target:
                return
    if docs:
        total += encoder.write(docs, end_doc=last + 1)
    meta["exhausted"] = True
    shards.write_json_atomic(entry / "meta.json", meta)
    logger.info("data cache %s: complete, %d training tokens in %d shards", entry, total, len(meta["shards"]))


class _ShardEncoder:
    """Tokenizes one shard of documents with ``datasets`` map and appends it to the entry (shard, then meta)."""

    def __init__(self, entry: Path, meta: dict[str, Any], num_proc: int):
        self.entry, self.meta, self.num_proc = entry, meta, num_proc
        self.tokenizer_file = str(entry / "tokenizer" / "tokenizer.json")
        self.dtype = np.dtype(meta["dtype"])

    def write(self, docs: list[str], end_doc: int) -> int:
        t0 = time.perf_counter()
        k = len(self.meta["shards"])
        parallel = self.num_proc > 1 and sum(len(d) for d in docs) >= PARALLEL_MIN_CHARS
        ids = encode_documents(
            docs, self.tokenizer_file, int(self.meta["eos_id"]), self.dtype, self.num_proc if parallel else 1
        )
        rec = shards.write_ids(self.entry / f"train-{k:05d}.bin", ids, self.dtype)
        rec.update(documents=len(docs), end_doc=end_doc)
        meta = self.meta
        meta["shards"].append(rec)
        meta["train_tokens"] += rec["tokens"]
        meta["train_documents"] += len(docs)
        meta["seconds"]["tokenize"] = round(meta["seconds"]["tokenize"] + time.perf_counter() - t0, 3)
        shards.write_json_atomic(self.entry / "meta.json", meta)
        logger.info(
            "data cache %s: shard %d, %d documents, %d tokens", self.entry, k, len(docs), rec["tokens"]
        )
        return rec["tokens"]


_WORKER_TOKENIZERS: dict[str, Any] = {}


def _encode_rows(batch: dict[str, list[str]], tokenizer_file: str, eos_id: int, dtype: str) -> dict[str, Any]:
    """``datasets`` map function: a batch of documents → one row holding their ids, each followed by EOS."""
    tok = _WORKER_TOKENIZERS.get(tokenizer_file)
    if tok is None:
        from tokenizers import Tokenizer

        tok = _WORKER_TOKENIZERS[tokenizer_file] = Tokenizer.from_file(tokenizer_file)
    encode_batch = getattr(tok, "encode_batch_fast", tok.encode_batch)
    flat = array.array("I")  # a C buffer: ~3× cheaper than filling numpy from Python lists
    for encoding in encode_batch(batch["text"], add_special_tokens=False):
        flat.extend(encoding.ids)
        flat.append(eos_id)
    ids = np.frombuffer(flat, dtype=np.uint32)
    if len(ids) and int(ids.max()) > np.iinfo(dtype).max:
        raise ValueError(f"token id {int(ids.max())} does not fit the cache dtype {dtype}.")
    return {"ids": [ids.astype(dtype).tobytes()]}  # raw bytes: Arrow stores them without per-element work


def encode_documents(
    docs: list[str], tokenizer_file: str, eos_id: int, dtype: np.dtype, num_proc: int
) -> np.ndarray:
    """Ids of ``docs`` (each followed by EOS) → 1-D ``dtype`` array, via ``datasets`` ``map(batched=True,
    num_proc=num_proc)`` (worker processes when num_proc > 1, each with a single-threaded tokenizer)."""
    import datasets

    if num_proc > 1:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per worker process
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        out = datasets.Dataset.from_dict({"text": docs}).map(
            _encode_rows,
            batched=True,
            batch_size=ENCODE_BATCH_DOCS,
            num_proc=num_proc if num_proc > 1 else None,
            remove_columns=["text"],
            keep_in_memory=True,
            fn_kwargs={"tokenizer_file": tokenizer_file, "eos_id": eos_id, "dtype": dtype.name},
        )
    finally:
        if bars:
            datasets.enable_progress_bars()
    return np.frombuffer(b"".join(out.data.column("ids").to_pylist()), dtype=dtype)
