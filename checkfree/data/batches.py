"""Deterministic batches from a packed token stream: training batches per (step, rank) and fixed validation
batches. The data position of training is just the step, so resume and rollback restore it exactly."""

from __future__ import annotations

import numpy as np
import torch

from checkfree.data.corpus import Corpus


def windows(tokens: np.ndarray, seq_len: int, indices: np.ndarray) -> torch.Tensor:
    """Rows ``tokens[i*(seq_len+1) : (i+1)*(seq_len+1)]`` for each window index i → (len(indices), seq_len+1)
    int64."""
    width = seq_len + 1
    rows = np.stack([np.asarray(tokens[int(i) * width : (int(i) + 1) * width]) for i in indices])
    return torch.from_numpy(rows.astype(np.int64))


def train_token_budget(
    max_iterations: int, mb_count: int, batch_size: int, seq_len: int, world_size: int = 1
) -> int:
    """Training tokens a run consumes from the packed stream: max_iterations × mb_count × batch_size × W
    sequences, each a window of seq_len + 1 tokens (inputs and shifted labels) → max_iterations × (tokens per
    iteration) × W × (seq_len + 1) / seq_len. Raises ValueError for a non-positive argument."""
    values = {"max_iterations": max_iterations, "mb_count": mb_count, "batch_size": batch_size}
    values |= {"seq_len": seq_len, "world_size": world_size}
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"train_token_budget got {name} {value}; expected a positive integer.")
    return max_iterations * mb_count * batch_size * world_size * (seq_len + 1)


def epochs(budget_tokens: int, stream_tokens: int, seq_len: int) -> float:
    """How many passes over a stream of ``stream_tokens`` a budget of ``budget_tokens`` makes: sequences needed
    ÷ whole windows of seq_len + 1 tokens in the stream (BatchSource drops a partial last window). Raises
    ValueError when the stream holds no whole window."""
    windows_per_epoch = stream_tokens // (seq_len + 1)
    if windows_per_epoch < 1:
        raise ValueError(
            f"a stream of {stream_tokens} tokens holds no window of seq_len + 1 = {seq_len + 1} tokens."
        )
    return budget_tokens / (seq_len + 1) / windows_per_epoch


class BatchSource:
    """Deterministic training batches: batch(step) is a pure function of (step, rank); the data position is just
    `step`, so resume and rollback restore it exactly.

    The packed stream is cut into non-overlapping windows of seq_len + 1 tokens. Each epoch visits them in a
    permutation drawn from ``np.random.default_rng([seed, epoch])`` (never global RNG). Row ``r`` of rank
    ``k``'s batch at ``step`` is global sample ``g = (step * world_size + k) * batch_size + r``: window
    ``perm[g // n][g % n]`` with n = sequences_per_epoch, so the ranks' shares in a step are disjoint and
    together cover a contiguous slice of the permutation, wrapping into the next epoch's permutation.
    The trainer calls ``batch(iteration * mb_count + microbatch)``.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        seq_len: int,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
    ) -> None:
        if seq_len < 1 or batch_size < 1 or world_size < 1:
            raise ValueError(
                f"BatchSource got seq_len {seq_len}, batch_size {batch_size}, world_size {world_size}; "
                "expected positive integers."
            )
        if not 0 <= rank < world_size:
            raise ValueError(
                f"BatchSource rank {rank} is outside 0..{world_size - 1} (world_size {world_size})."
            )
        if tokens.ndim != 1:
            raise ValueError(f"BatchSource expects a 1-D token stream; got shape {tuple(tokens.shape)}.")
        self._n = len(tokens) // (seq_len + 1)
        if self._n == 0:
            raise ValueError(
                f"the training stream has {len(tokens)} tokens, fewer than one sequence of seq_len + 1 = "
                f"{seq_len + 1}; use more data or a shorter seq_len."
            )
        self.tokens = tokens
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self._perms: dict[int, np.ndarray] = {}

    @property
    def sequences_per_epoch(self) -> int:
        """Number of windows of seq_len + 1 tokens in the stream (a partial last window is dropped)."""
        return self._n

    def permutation(self, epoch: int) -> np.ndarray:
        """Window order of ``epoch`` (int64, length sequences_per_epoch); the two latest are kept."""
        perm = self._perms.get(epoch)
        if perm is None:
            perm = np.random.default_rng([self.seed, epoch]).permutation(self._n)
            if len(self._perms) >= 2:
                self._perms.pop(next(iter(self._perms)))
            self._perms[epoch] = perm
        return perm

    def indices(self, step: int) -> np.ndarray:
        """Window indices of this rank's batch at ``step`` → (batch_size,) int64."""
        if step < 0:
            raise ValueError(f"batch step {step} is negative; expected a step >= 0.")
        first = (step * self.world_size + self.rank) * self.batch_size
        g = first + np.arange(self.batch_size, dtype=np.int64)
        epochs, pos = np.divmod(g, self._n)
        out = np.empty(self.batch_size, dtype=np.int64)
        for epoch in np.unique(epochs):
            mask = epochs == epoch
            out[mask] = self.permutation(int(epoch))[pos[mask]]
        return out

    def batch(self, step: int) -> torch.Tensor:
        """Training sequences → (batch_size, seq_len + 1) int64; inputs = [:, :-1], labels = [:, 1:]."""
        return windows(self.tokens, self.seq_len, self.indices(step))


def validation_batches(corpus: Corpus, batch_size: int, n_batches: int, seq_len: int) -> list[torch.Tensor]:
    """The first batch_size × n_batches held-out windows of ``corpus.val``, in order → n_batches tensors of
    (batch_size, seq_len + 1) int64; the same on every rank and every run. Raises ValueError when the held-out
    set is smaller than that."""
    if batch_size < 1 or n_batches < 1:
        raise ValueError(
            f"validation_batches got batch_size {batch_size}, n_batches {n_batches}; expected positive integers."
        )
    available = len(corpus.val) // (seq_len + 1)
    needed = batch_size * n_batches
    if available < needed:
        raise ValueError(
            f"the held-out set of {corpus.name} has {available} sequences of seq_len + 1 = {seq_len + 1} tokens, "
            f"but validation asks for {n_batches} batches × {batch_size} = {needed}; raise "
            "DataSpec.validation_sequences or lower the validation batches."
        )
    rows = windows(corpus.val, seq_len, np.arange(needed))
    return list(rows.split(batch_size))
