"""Corpus → tokenizer → cached token ids → per-rank batches (SPEC §6 "Data").

``prepare_corpus(DataSpec(...))`` loads documents (bundled Shakespeare, local files, or a streamed hub dataset),
trains or loads a tokenizer, tokenizes once into an on-disk cache and memory-maps it; ``BatchSource`` and
``validation_batches`` turn the token streams into deterministic batches.
"""

from checkfree.data.batches import BatchSource, epochs, train_token_budget, validation_batches
from checkfree.data.corpus import Corpus, DataSpec, load_documents, prepare_corpus, verify_corpus
from checkfree.data.shards import TokenStream
from checkfree.data.sources import HUB_DATASETS, DataUnavailableError, shakespeare_files
from checkfree.data.tokenizer import EOS_TOKEN, HUB_TOKENIZERS

__all__ = [
    "EOS_TOKEN",
    "HUB_DATASETS",
    "HUB_TOKENIZERS",
    "BatchSource",
    "Corpus",
    "TokenStream",
    "DataSpec",
    "DataUnavailableError",
    "load_documents",
    "prepare_corpus",
    "shakespeare_files",
    "epochs",
    "train_token_budget",
    "validation_batches",
    "verify_corpus",
]
