"""Corpus → tokenizer → cached token ids → per-rank batches (docs/paper.md §6 "Data").

``prepare_corpus(DataSpec(...))`` loads documents (bundled Shakespeare, local files, or a streamed hub dataset),
trains or loads a tokenizer, tokenizes once into an on-disk cache and memory-maps it; ``BatchSource`` and
``validation_batches`` turn the token streams into deterministic batches.
"""
