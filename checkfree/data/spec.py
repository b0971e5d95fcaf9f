"""What to train on and how to tokenize it: the :class:`DataSpec` every data module takes (docs/paper.md §6 "Data")."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from checkfree.config import Config


def default_cache_dir() -> Path:
    """Token and tokenizer cache of the simulator and the swarm: $CHECKFREE_CACHE, else ~/.cache/checkfree."""
    return Path(os.environ.get("CHECKFREE_CACHE", Path.home() / ".cache" / "checkfree")).resolve()


@dataclass(frozen=True)
class DataSpec:
    """What to train on and how to tokenize it (docs/paper.md §6 "Data")."""

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
    """Training tokens the run needs: the cache tokenizes documents until it holds this many (and the corpus view
    stops there); None = the whole local corpus (hub datasets: 100 M). A later, larger budget extends the cache."""
    seed: int = 42
    """Seed of the validation hold-out and of the hub stream shuffle (paper: 42)."""
    cache_dir: Path = Path(".cache/checkfree")
    """Where caches go (pass an absolute path); nothing is written elsewhere."""
    num_proc: int | None = None
    """Tokenizer worker processes (``datasets`` ``map(num_proc=…)``); None = the CPU count (at most 8)."""

    @classmethod
    def from_config(
        cls, cfg: Config, *, max_train_tokens: int | None, cache_dir: Path | None = None
    ) -> DataSpec:
        """The spec of a run config (docs/paper.md §6 "Data"): its dataset, tokenizer, vocabulary, sequence length,
        ``validation`` × ``batch_size`` held-out sequences and ``data_seed``.

        Args:
            max_train_tokens: the training tokens to cache (the simulator's token budget, checkfree/sim/launch.py;
                the swarm passes the config's ``max_train_tokens``); None: the whole local corpus.
            cache_dir: where caches go, as given; None: :func:`default_cache_dir`.
        """
        return cls(
            dataset=cfg.dataset,
            tokenizer=cfg.tokenizer_name,
            vocab_size=cfg.vocab_size,
            seq_len=cfg.seq_l,
            validation_sequences=cfg.validation * cfg.batch_size,
            max_train_tokens=max_train_tokens,
            seed=cfg.data_seed,
            cache_dir=default_cache_dir() if cache_dir is None else cache_dir,
        )

    def __post_init__(self) -> None:
        object.__setattr__(self, "cache_dir", Path(self.cache_dir).expanduser())
        for name in ("vocab_size", "seq_len", "validation_sequences"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"DataSpec.{name} is {value!r}; expected a positive integer.")
        if self.num_proc is not None and (not isinstance(self.num_proc, int) or self.num_proc < 1):
            raise ValueError(f"DataSpec.num_proc is {self.num_proc!r}; expected None or >= 1.")
        if self.max_train_tokens is not None and (
            not isinstance(self.max_train_tokens, int) or self.max_train_tokens < 1
        ):
            raise ValueError(
                f"DataSpec.max_train_tokens is {self.max_train_tokens!r}; expected None or >= 1."
            )
