"""Tokenizers: a byte-level BPE trained on the corpus (offline default), a hub tokenizer ("llama2", "gpt2"),
or a local tokenizer.json / tokenizer directory. Every one is saved as a directory that
``transformers.AutoTokenizer.from_pretrained`` loads, and encodes documents with ``encode_batch`` (encoding
megabytes as one string is slow, STACK.md)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from checkfree.data.sources import DataUnavailableError, hub_reachable

logger = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (EOS_TOKEN,)
MIN_BPE_VOCAB = 256 + len(SPECIAL_TOKENS)


@dataclass(frozen=True)
class HubTokenizer:
    """A tokenizer of the Hugging Face hub that configs name ("llama2", "gpt2")."""

    repos: tuple[str, ...]
    """Repositories tried in order (meta-llama is gated, needs a token; its mirror is public)."""
    vocab_size: int
    """``len(tokenizer)``: the vocabulary of a model built for it, known without loading it (the memory
    estimate, a dry run's parameter counts)."""


HUB_TOKENIZERS: dict[str, HubTokenizer] = {
    "llama2": HubTokenizer(("meta-llama/Llama-2-7b-hf", "NousResearch/Llama-2-7b-hf"), 32000),
    "gpt2": HubTokenizer(("openai-community/gpt2", "gpt2"), 50257),
}
"""The one table of hub tokenizers, by the name a config's ``tokenizer`` gives."""
_EOS_CANDIDATES = (EOS_TOKEN, "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>")


@dataclass
class LoadedTokenizer:
    """A tokenizer ready to encode: the ``tokenizers.Tokenizer`` backend and the ids the corpus needs."""

    backend: Any  # tokenizers.Tokenizer
    eos_id: int
    vocab_size: int
    """len(tokenizer) including added special tokens: every id it emits is below this."""

    def encode(self, docs: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each document, EOS appended (no BOS); int64 arrays."""
        encode_batch = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        out = []
        for enc in encode_batch(list(docs), add_special_tokens=False):
            ids = np.empty(len(enc.ids) + 1, dtype=np.int64)
            ids[:-1] = enc.ids
            ids[-1] = self.eos_id
            out.append(ids)
        return out


def check_tokenizer_name(tokenizer: str, vocab_size: int) -> str:
    """Classify ``DataSpec.tokenizer`` as "bpe", "hub" or "path" and check its settings; raises ValueError."""
    if tokenizer == "bpe":
        if vocab_size < MIN_BPE_VOCAB:
            raise ValueError(
                f"vocab_size {vocab_size} is too small for a byte-level BPE tokenizer; expected at least "
                f"{MIN_BPE_VOCAB} (256 byte tokens + {len(SPECIAL_TOKENS)} special token)."
            )
        return "bpe"
    if tokenizer.lower() in HUB_TOKENIZERS:
        return "hub"
    if Path(tokenizer).expanduser().exists():
        return "path"
    raise ValueError(
        f"tokenizer {tokenizer!r} is unknown; expected 'bpe', 'llama2', 'gpt2', or the path of a tokenizer.json "
        "file or a tokenizer directory."
    )


def tokenizer_fingerprint(tokenizer: str, kind: str, vocab_size: int) -> str:
    """Part of the cache key: the name (+ vocab_size for "bpe", + file contents for a path)."""
    digest = hashlib.sha256(f"{kind}|{tokenizer}".encode())
    if kind == "bpe":
        digest.update(str(vocab_size).encode())
    elif kind == "path":
        path = Path(tokenizer).expanduser()
        files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
        for p in files:
            digest.update(p.name.encode() + b"\0" + p.read_bytes())
    return digest.hexdigest()


def train_bpe(docs: Iterable[str], vocab_size: int, out_dir: Path) -> LoadedTokenizer:
    """Train a byte-level BPE (``<|endoftext|>`` = id 0 = EOS/BOS/pad) on ``docs`` and save it to ``out_dir``.
    Deterministic given the documents (checked by tests). ~0.8 s for the 5 MB Shakespeare corpus at 4096."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    if tok.get_vocab_size() < vocab_size:
        logger.warning(
            "BPE stopped at %d tokens (< vocab_size %d): the corpus is small",
            tok.get_vocab_size(),
            vocab_size,
        )
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, pad_token=EOS_TOKEN
    )
    fast.save_pretrained(str(out_dir))
    return _loaded(fast)


def load_tokenizer(tokenizer: str, kind: str, out_dir: Path, hf_cache_dir: Path) -> LoadedTokenizer:
    """Load a hub ("llama2", "gpt2") or local tokenizer and save a copy to ``out_dir``. Hub tokenizers come from
    ``hf_cache_dir`` when present there, else are downloaded; raises DataUnavailableError at once when the hub
    is unreachable, ValueError when a local tokenizer is unusable (not a fast tokenizer, no EOS token)."""
    if kind == "hub":
        fast = _load_hub_tokenizer(tokenizer, hf_cache_dir)
    else:
        fast = _load_path_tokenizer(Path(tokenizer).expanduser())
    fast.save_pretrained(str(out_dir))
    return _loaded(fast, source=tokenizer)


def _load_hub_tokenizer(name: str, hf_cache_dir: Path) -> Any:
    from transformers import AutoTokenizer

    repos = HUB_TOKENIZERS[name.lower()].repos
    for repo in repos:  # a copy fetched earlier needs no network
        try:
            return AutoTokenizer.from_pretrained(repo, cache_dir=str(hf_cache_dir), local_files_only=True)
        except OSError:
            pass
    if not hub_reachable():
        raise DataUnavailableError(
            f"tokenizer {name!r} ({repos[0]}) needs the Hugging Face hub, which this machine cannot reach; "
            'set "tokenizer" to "bpe" to train one on the corpus, or to a local tokenizer.json or tokenizer directory.'
        )
    errors = []
    for repo in repos:
        try:
            return AutoTokenizer.from_pretrained(repo, cache_dir=str(hf_cache_dir))
        except Exception as exc:  # gated repositories, network errors
            errors.append(f"{repo}: {type(exc).__name__}: {exc}")
    raise DataUnavailableError(f"tokenizer {name!r} could not be downloaded ({'; '.join(errors)}).")


def _load_path_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        if path.is_dir():
            fast = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        else:
            fast = PreTrainedTokenizerFast(tokenizer_file=str(path))
    except Exception as exc:
        raise ValueError(
            f"tokenizer {str(path)!r} could not be loaded ({type(exc).__name__}: {exc}); expected a tokenizer.json "
            "file or a directory saved by save_pretrained."
        ) from exc
    if fast.eos_token_id is None:
        vocab = fast.get_vocab()
        eos = next((t for t in _EOS_CANDIDATES if t in vocab), None)
        if eos is None:
            raise ValueError(
                f"tokenizer {str(path)!r} has no end-of-text token; expected one of {', '.join(_EOS_CANDIDATES)}."
            )
        fast.eos_token = eos
    return fast


def _loaded(fast: Any, source: str = "bpe") -> LoadedTokenizer:
    backend = getattr(fast, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"tokenizer {source!r} is not a fast (tokenizers-backed) tokenizer; expected one.")
    if fast.eos_token_id is None:
        raise ValueError(f"tokenizer {source!r} has no EOS token; expected one to separate documents.")
    return LoadedTokenizer(backend=backend, eos_id=int(fast.eos_token_id), vocab_size=len(fast))
