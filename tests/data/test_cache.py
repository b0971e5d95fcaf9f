"""The sharded token cache at scale: a build killed by SIGKILL resumes and verifies, uint32 ids, the token budget
and its epochs, and a budget-capped cache that a larger budget extends."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from checkfree.data import build as build_mod
from checkfree.data import sources
from checkfree.data.batches import epochs, train_token_budget
from checkfree.data.corpus import DataSpec, prepare_corpus, verify_corpus

from helpers import ROOT, sigkill_when
from helpers.data import WORDS, data_spec, write_tiny_corpus

SMALL_SHARDS = 2000  # characters of text per shard: ~one tiny document each


def _meta(entry: Path) -> dict:
    try:
        return json.loads((entry / "meta.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


@pytest.mark.timeout(120)
def test_a_build_killed_mid_way_resumes_at_its_next_shard_and_verifies(tmp_path, monkeypatch, caplog):
    write_tiny_corpus(tmp_path / "txt", n_files=30)
    spec = data_spec(tmp_path)
    child = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from checkfree.data import build, shards
        from checkfree.data.corpus import DataSpec, prepare_corpus
        build.SHARD_TEXT_BYTES = {SMALL_SHARDS}
        write = shards.write_ids
        def slow_write(*args, **kwargs):  # widen the window in which the kill lands between shards
            time.sleep(0.1)
            return write(*args, **kwargs)
        shards.write_ids = slow_write
        prepare_corpus(DataSpec({spec.dataset!r}, vocab_size=300, seq_len=16, validation_sequences=4,
                                cache_dir=Path({str(spec.cache_dir)!r})))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], cwd=ROOT, stderr=subprocess.PIPE)
    entries = lambda: [e for e in spec.cache_dir.glob("txt-*") if e.is_dir()]  # noqa: E731
    sigkill_when(
        proc,
        lambda: any(len(_meta(e).get("shards", [])) >= 3 for e in entries()),
        "the build wrote 3 shards",
        timeout=90,
        poll=0.01,
    )
    (entry,) = entries()
    before = _meta(entry)
    assert not before["exhausted"], "the build finished before the kill: widen the window"
    written = {r["file"]: (entry / r["file"]).stat().st_mtime_ns for r in before["shards"]}

    monkeypatch.setattr(build_mod, "SHARD_TEXT_BYTES", SMALL_SHARDS)
    with caplog.at_level(logging.INFO, logger="checkfree.data"):
        resumed = prepare_corpus(spec)
    assert f"resuming at shard {len(before['shards'])}" in caplog.text
    assert {f: (entry / f).stat().st_mtime_ns for f in written} == written  # kept, not rewritten
    assert verify_corpus(resumed) == []
    assert len(_meta(entry)["shards"]) > len(before["shards"])

    monkeypatch.setattr(build_mod, "SHARD_TEXT_BYTES", 1 << 30)  # one shard: the uninterrupted reference
    fresh = prepare_corpus(DataSpec(**{**spec.__dict__, "cache_dir": tmp_path / "fresh"}))
    assert np.array_equal(np.asarray(resumed.train), np.asarray(fresh.train))
    assert np.array_equal(resumed.val, fresh.val)
    first_shard = sorted(written)[0]
    with open(entry / first_shard, "r+b") as f:  # a flipped byte fails verification
        f.seek(3)
        byte = f.read(1)
        f.seek(3)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert verify_corpus(resumed) == [first_shard]


@pytest.mark.timeout(60)
def test_ids_above_65535_are_cached_as_uint32(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, "[UNK]": 1}
    vocab.update({f"filler{i}": i for i in range(2, 70_000 - len(WORDS))})
    vocab.update({w: 70_000 - len(WORDS) + k for k, w in enumerate(WORDS)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))

    corpus = prepare_corpus(data_spec(tmp_path, tokenizer=str(tmp_path / "tokenizer.json")))
    train = np.asarray(corpus.train)
    assert corpus.vocab_size == 70_000 and train.dtype == np.uint32 and corpus.val.dtype == np.uint32
    assert int(train.max()) > 65_535
    ids = set(np.unique(train).tolist()) | set(np.unique(corpus.val).tolist())
    assert {vocab[w] for w in WORDS} <= ids  # every word kept its id above 65,535, none wrapped around
    assert ids <= {0, 1} | {vocab[w] for w in WORDS}
    assert verify_corpus(corpus) == []


def test_token_budget_and_epochs_by_hand():
    # 500M at W = 4 (paper §6): 16 sequences × 4 microbatches × 1,025 tokens × 4 replicas per iteration
    assert train_token_budget(10_000, 4, 16, 1024, 4) == 10_000 * 262_400
    assert train_token_budget(400, 4, 8, 128, 2) == 400 * 4 * 8 * 2 * 129 == 3_302_400
    # the tiny config on Shakespeare: 3,302,400 tokens over 1,641,981 (12,728 windows of 129) = 2.011 epochs
    assert epochs(3_302_400, 1_641_981, 128) == pytest.approx(25_600 / 12_728)
    assert epochs(129 * 10, 129 * 20 + 128, 128) == 0.5  # a partial last window does not count
    with pytest.raises(ValueError, match="holds no window"):
        epochs(1000, 100, 128)
    with pytest.raises(ValueError, match="world_size 0"):
        train_token_budget(1, 1, 1, 1, 0)


@pytest.mark.timeout(60)
def test_extending_a_cache_rewrites_a_shard_whose_sha256_is_wrong(tmp_path, monkeypatch, caplog):
    write_tiny_corpus(tmp_path / "txt", n_files=30)
    monkeypatch.setattr(build_mod, "SHARD_TEXT_BYTES", SMALL_SHARDS)
    small = prepare_corpus(data_spec(tmp_path, max_train_tokens=3000))
    reference = np.asarray(small.train).copy()
    shard = small.path / _meta(small.path)["shards"][1]["file"]
    data = bytearray(shard.read_bytes())
    data[5] ^= 0xFF  # same size: only the sha256 tells
    shard.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="checkfree.data"):
        whole = prepare_corpus(data_spec(tmp_path))
    assert "rewriting shards 1.." in caplog.text
    assert verify_corpus(whole) == [] and np.array_equal(np.asarray(whole.train)[:3000], reference)


@pytest.mark.timeout(60)
def test_a_budget_caps_the_cache_and_a_larger_budget_extends_it(tmp_path, monkeypatch):
    write_tiny_corpus(tmp_path / "txt", n_files=30)
    monkeypatch.setattr(build_mod, "SHARD_TEXT_BYTES", SMALL_SHARDS)
    small = prepare_corpus(data_spec(tmp_path, max_train_tokens=1500))
    meta = _meta(small.path)
    assert len(small.train) == 1500 and not meta["exhausted"] and meta["train_tokens"] < 20_000
    first = {r["file"]: (small.path / r["file"]).stat().st_mtime_ns for r in meta["shards"]}
    t0 = time.perf_counter()
    whole = prepare_corpus(data_spec(tmp_path))
    assert whole.path == small.path and _meta(whole.path)["exhausted"]
    assert {f: (small.path / f).stat().st_mtime_ns for f in first} == first
    assert np.array_equal(np.asarray(whole.train)[:1500], np.asarray(small.train))
    assert time.perf_counter() - t0 < 30


@pytest.mark.timeout(60)
def test_an_endless_hub_stream_is_cached_up_to_the_budget_then_extended(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    pool = [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), 80)) for _ in range(50)]
    pulled: list[int] = []

    def endless(hub, seed, hf_cache_dir):  # stands in for datasets' streaming, shuffled hub rows
        i = 0
        while True:
            pulled.append(i)
            yield f"story {i}: {pool[i % len(pool)]}."
            i += 1

    monkeypatch.setattr(sources, "hub_reachable", lambda *a, **k: True)
    monkeypatch.setattr(sources, "_hub_rows", endless)
    monkeypatch.setattr(build_mod, "BPE_TRAIN_MAX_BYTES", 20_000)
    monkeypatch.setattr(build_mod, "SHARD_TEXT_BYTES", SMALL_SHARDS)
    spec = DataSpec(
        "TinyStories",
        vocab_size=300,
        seq_len=16,
        validation_sequences=4,
        max_train_tokens=2000,
        cache_dir=tmp_path / "cache",
    )
    small = prepare_corpus(spec)
    assert len(small.train) == 2000 and not small.exhausted
    assert max(pulled) < 200  # the stream was read as far as the budget needed, not to an end
    val_docs = int(np.sum(small.val == small.eos_id))
    assert 1 <= val_docs <= 3  # the first documents of the (shuffled) stream are the validation set
    bigger = prepare_corpus(DataSpec(**{**spec.__dict__, "max_train_tokens": 6000}))
    assert bigger.path == small.path and len(bigger.train) == 6000
    assert np.array_equal(np.asarray(bigger.train)[:2000], np.asarray(small.train))
    assert verify_corpus(bigger) == []
