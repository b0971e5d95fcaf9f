"""DataSpec → Corpus: documents → tokenizer → token ids cached once on disk, memory-mapped on later calls.

Cache layout (one entry per content hash of inputs + spec, so a changed spec builds a new entry and an old
one stays usable):

    <cache_dir>/<name>-<key16>/train.bin    packed training ids (uint16 if vocab ≤ 65535, else uint32)
                               val.bin      packed held-out ids
                               meta.json    key, spec, counts, dtype, vocab_size, eos_id (written last)
                               tokenizer/   AutoTokenizer-loadable directory
    <cache_dir>/<name>-<key16>.lock         filelock: one builder among concurrent ranks

An entry is built in a temporary sibling directory and renamed into place, so a reader never sees half a file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from checkfree.data import sources
from checkfree.data import tokenizer as tok_mod
from checkfree.data.sources import Source

logger = logging.getLogger(__name__)

CACHE_FORMAT = 1
HOLDOUT_BYTES_PER_TOKEN = 8
"""For "bpe": the tokenizer is trained without the first documents of the seeded order that hold
8 × (validation tokens) bytes, so the documents later held out for validation were not seen by it."""
HUB_BYTES_PER_TOKEN = 5
"""Bytes of hub text streamed per wanted token (English ≈ 4 bytes/token for Llama-2/GPT-2)."""
DEFAULT_HUB_TRAIN_TOKENS = 100_000_000
ENCODE_CHUNK_DOCS = 1024
LOCK_TIMEOUT_S = 4 * 3600.0


@dataclass(frozen=True)
class DataSpec:
    """What to train on and how to tokenize it (SPEC §6 "Data")."""

    dataset: str
    """"Shakespeare" (bundled, offline default), "TinyStories", "OpenWebText", "RedPajama" (hub streaming),
    or a path / directory / glob of local .txt/.jsonl/.json/.parquet files."""
    tokenizer: str = "bpe"
    """"bpe" (byte-level BPE trained on the corpus, cached), "llama2" / "gpt2" (hub), or a tokenizer path."""
    vocab_size: int = 4096
    """Vocabulary of the "bpe" tokenizer (ignored otherwise)."""
    seq_len: int = 128
    """Tokens per training sequence (a window holds seq_len + 1 tokens: inputs and shifted labels)."""
    validation_sequences: int = 64
    """Held-out sequences of seq_len + 1 tokens, from documents never used for training."""
    max_train_tokens: int | None = None
    """Cap on training tokens (hub datasets: how many to stream and cache; default 100 M there)."""
    seed: int = 42
    """Seed of the validation hold-out and of the hub stream shuffle (paper: 42)."""
    cache_dir: Path = Path(".cache/checkfree")
    """Where caches go (pass an absolute path); nothing is written elsewhere."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "cache_dir", Path(self.cache_dir).expanduser())
        for name in ("vocab_size", "seq_len", "validation_sequences"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"DataSpec.{name} is {value!r}; expected a positive integer.")
        if self.max_train_tokens is not None and (
            not isinstance(self.max_train_tokens, int) or self.max_train_tokens < 1
        ):
            raise ValueError(
                f"DataSpec.max_train_tokens is {self.max_train_tokens!r}; expected None or >= 1."
            )


@dataclass(frozen=True, eq=False)
class Corpus:
    """Token ids ready for batching. ``train``/``val`` are 1-D memory-mapped arrays of packed documents, each
    followed by ``eos_id``."""

    name: str
    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    """Model vocabulary size: every id in train/val is below it."""
    eos_id: int
    tokenizer_dir: Path
    """Directory loadable with ``AutoTokenizer.from_pretrained`` / ``PreTrainedTokenizerFast.from_pretrained``."""
    tokenizer: str
    path: Path
    """The cache entry directory."""

    def describe(self) -> str:
        """One line: dataset, token counts, vocabulary."""
        return (
            f"{self.name}: {len(self.train):,} training + {len(self.val):,} validation tokens, "
            f"vocab {self.vocab_size} ({self.tokenizer}), eos id {self.eos_id}"
        )


def prepare_corpus(spec: DataSpec) -> Corpus:
    """Load, tokenize and cache ``spec``'s corpus once; later calls memory-map the cache (~ms).

    Safe when several ranks call it at once: one builds under a file lock, the others wait and then map.
    A corrupted or partial cache entry is rebuilt (with a warning). Raises ValueError for bad inputs (unknown
    dataset, no matching files, unsupported extension, rows without "text", vocab_size too small, corpus too
    small for the hold-out) and DataUnavailableError when a hub dataset/tokenizer cannot be reached.
    """
    kind = tok_mod.check_tokenizer_name(spec.tokenizer, spec.vocab_size)
    source = sources.resolve_source(spec.dataset)
    key = _cache_key(spec, source, kind)
    entry = spec.cache_dir / f"{_slug(source.name)}-{key[:16]}"
    corpus, _ = _open_entry(entry, key, spec)
    if corpus is not None:
        return corpus
    from filelock import FileLock, Timeout

    spec.cache_dir.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(entry) + ".lock", timeout=LOCK_TIMEOUT_S):
            corpus, problem = _open_entry(entry, key, spec)
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
    corpus, problem = _open_entry(entry, key, spec)
    if corpus is None:
        raise RuntimeError(f"the data cache {entry} is unreadable right after building it: {problem}")
    return corpus


def load_documents(spec: DataSpec) -> list[str]:
    """The documents of ``spec.dataset`` in corpus order (before hold-out and tokenization)."""
    return _documents(spec, sources.resolve_source(spec.dataset))


def _documents(spec: DataSpec, source: Source) -> list[str]:
    hf_cache = spec.cache_dir / "hf"
    if source.hub is not None:
        wanted = (spec.max_train_tokens or DEFAULT_HUB_TRAIN_TOKENS) + _val_target(spec)
        return sources.stream_hub_documents(source.hub, wanted * HUB_BYTES_PER_TOKEN, spec.seed, hf_cache)
    return sources.load_local_documents(source.files, hf_cache)


def _val_target(spec: DataSpec) -> int:
    return spec.validation_sequences * (spec.seq_len + 1)


def _cache_key(spec: DataSpec, source: Source, kind: str) -> str:
    fields = {
        "format": CACHE_FORMAT,
        "source": source.fingerprint,
        "tokenizer": tok_mod.tokenizer_fingerprint(spec.tokenizer, kind, spec.vocab_size),
        "val_tokens": _val_target(spec),
        "max_train_tokens": spec.max_train_tokens,
        "seed": spec.seed,
        "txt_document_chars": sources.TXT_DOCUMENT_CHARS,
        "holdout_bytes_per_token": HOLDOUT_BYTES_PER_TOKEN,
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_.")[-40:].lower() or "corpus"


def _open_entry(entry: Path, key: str, spec: DataSpec) -> tuple[Corpus | None, str | None]:
    """(corpus, None) for a valid entry; (None, why) for a broken one; (None, None) when absent."""
    meta_path = entry / "meta.json"
    if not entry.exists():
        return None, None
    try:
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != CACHE_FORMAT or meta.get("key") != key:
            return None, f"{meta_path} belongs to another spec or cache format"
        dtype = np.dtype(meta["dtype"])
        arrays = {}
        for split in ("train", "val"):
            path = entry / f"{split}.bin"
            n = int(meta[f"{split}_tokens"])
            if not path.is_file() or path.stat().st_size != n * dtype.itemsize or n < 1:
                return None, f"{path} is missing or does not hold {n} tokens"
            arrays[split] = np.memmap(path, dtype=dtype, mode="r", shape=(n,))
        if not (entry / "tokenizer" / "tokenizer.json").is_file():
            return None, f"{entry / 'tokenizer'} has no tokenizer.json"
        corpus = Corpus(
            name=str(meta["name"]),
            train=arrays["train"],
            val=arrays["val"],
            vocab_size=int(meta["vocab_size"]),
            eos_id=int(meta["eos_id"]),
            tokenizer_dir=entry / "tokenizer",
            tokenizer=spec.tokenizer,
            path=entry,
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"{meta_path} is corrupted ({type(exc).__name__}: {exc})"
    return corpus, None


def _build(spec: DataSpec, source: Source, kind: str, key: str, entry: Path) -> None:
    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=entry.name + ".tmp-", dir=spec.cache_dir))
    try:
        hf_cache = spec.cache_dir / "hf"
        tokenizer = None
        if kind != "bpe":  # a hub tokenizer fails fast, before minutes of streaming
            tokenizer = tok_mod.load_tokenizer(spec.tokenizer, kind, tmp / "tokenizer", hf_cache)
        docs = _documents(spec, source)
        t_docs = time.perf_counter()
        if len(docs) < 2:
            raise ValueError(
                f"dataset {spec.dataset!r} yields {len(docs)} document(s); expected at least 2 so that validation "
                "documents can be held out from training."
            )
        order = np.random.default_rng(spec.seed).permutation(len(docs))
        target = _val_target(spec)
        if tokenizer is None:
            excluded = _tokenizer_holdout(docs, order, target)
            train_docs = (d for i, d in enumerate(docs) if i not in excluded)
            tokenizer = tok_mod.train_bpe(train_docs, spec.vocab_size, tmp / "tokenizer")
        t_tok = time.perf_counter()
        dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 65535 else np.uint32)
        val_ids, val_docs = _hold_out(spec, docs, order, target, tokenizer)
        train_docs_iter = (d for i, d in enumerate(docs) if i not in val_docs)
        n_val = _write_ids(tmp / "val.bin", iter([val_ids]), dtype, None)
        n_train = _write_ids(
            tmp / "train.bin", _encode_chunks(tokenizer, train_docs_iter), dtype, spec.max_train_tokens
        )
        if n_train < spec.seq_len + 1:
            raise ValueError(
                f"dataset {spec.dataset!r} leaves {n_train} training tokens after holding out {n_val} validation "
                f"tokens; expected at least seq_len + 1 = {spec.seq_len + 1} (use more data or fewer "
                "validation_sequences)."
            )
        t_end = time.perf_counter()
        meta = {
            "format": CACHE_FORMAT,
            "key": key,
            "name": source.name,
            "spec": {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(spec).items()},
            "dtype": dtype.name,
            "train_tokens": n_train,
            "val_tokens": n_val,
            "train_documents": len(docs) - len(val_docs),
            "val_documents": len(val_docs),
            "vocab_size": tokenizer.vocab_size,
            "eos_id": tokenizer.eos_id,
            "seconds": {
                "documents": round(t_docs - t_start, 3),
                "tokenizer": round(t_tok - t_docs, 3),
                "tokenize": round(t_end - t_tok, 3),
            },
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        if entry.exists():
            shutil.rmtree(entry)
        tmp.rename(entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info(
        "built data cache %s: %d train + %d val tokens (%d + %d documents), vocab %d, in %.1f s "
        "(documents %.1f s, tokenizer %.1f s, tokenize %.1f s)",
        entry,
        n_train,
        n_val,
        meta["train_documents"],
        meta["val_documents"],
        tokenizer.vocab_size,
        t_end - t_start,
        *meta["seconds"].values(),
    )


def _tokenizer_holdout(docs: list[str], order: np.ndarray, target: int) -> set[int]:
    """Indices of the first documents of ``order`` holding HOLDOUT_BYTES_PER_TOKEN × target bytes (at most half
    of the documents): the BPE never sees them, and the validation documents are taken from their front."""
    excluded: set[int] = set()
    size = 0
    for i in order[: len(docs) // 2]:
        if size >= HOLDOUT_BYTES_PER_TOKEN * target:
            break
        excluded.add(int(i))
        size += len(docs[i].encode("utf-8"))
    return excluded


def _hold_out(
    spec: DataSpec, docs: list[str], order: np.ndarray, target: int, tokenizer: tok_mod.LoadedTokenizer
) -> tuple[np.ndarray, set[int]]:
    """Take whole documents in the seeded ``order`` until they hold ``target`` tokens (EOS included)."""
    parts: list[np.ndarray] = []
    picked: set[int] = set()
    total = 0
    for start in range(0, len(order), 64):
        chunk = [int(i) for i in order[start : start + 64]]
        for i, ids in zip(chunk, tokenizer.encode([docs[i] for i in chunk]), strict=True):
            parts.append(ids)
            picked.add(i)
            total += len(ids)
            if total >= target:
                break
        if total >= target:
            break
    need = f"{target} validation tokens (validation_sequences × (seq_len + 1) = {spec.validation_sequences} × {spec.seq_len + 1})"
    if total < target:
        raise ValueError(
            f"dataset {spec.dataset!r} is too small: its {len(docs)} documents hold {total} tokens, fewer than "
            f"the {need} plus training; use more data or fewer validation_sequences."
        )
    if len(picked) == len(docs):
        raise ValueError(
            f"dataset {spec.dataset!r} is too small: holding out {need} takes all its {len(docs)} documents and "
            "leaves none for training; use more data or fewer validation_sequences."
        )
    return np.concatenate(parts), picked


def _encode_chunks(tokenizer: tok_mod.LoadedTokenizer, docs: Iterator[str]) -> Iterator[np.ndarray]:
    chunk: list[str] = []
    for doc in docs:
        chunk.append(doc)
        if len(chunk) == ENCODE_CHUNK_DOCS:
            yield np.concatenate(tokenizer.encode(chunk))
            chunk = []
    if chunk:
        yield np.concatenate(tokenizer.encode(chunk))


def _write_ids(path: Path, chunks: Iterator[np.ndarray], dtype: np.dtype, cap: int | None) -> int:
    """Append id chunks to ``path`` as ``dtype`` (checking the range), stopping at ``cap`` tokens."""
    limit = np.iinfo(dtype).max
    n = 0
    with open(path, "wb") as f:
        for ids in chunks:
            if cap is not None:
                ids = ids[: cap - n]
            if len(ids) and (ids.min() < 0 or ids.max() > limit):
                raise ValueError(f"token id {int(ids.max())} does not fit the cache dtype {dtype.name}.")
            f.write(ids.astype(dtype).tobytes())
            n += len(ids)
            if cap is not None and n >= cap:
                break
    return n
