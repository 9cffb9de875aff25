"""Fixtures for the whole suite, built once per session: real text in shard format and a
small tokenizer trained on it.

offline_corpus_dir  the offline corpus (Python's own documentation, ~4.5 MB)
small_corpus_dir    ~300 of its documents in many small shards and row groups (16 docs
                    each), so that loaders cross files and epochs within a few batches
tokenizer_dir       a 512-token BPE trained on the offline corpus (with token_bytes.pt)
"""

import os

# Triton's interpreter, so that the fused-kernel tests (test_liger.py) run Liger's Triton
# kernels on CPU tensors. It must be set before triton is first imported (torch._dynamo
# imports it; triton.language defines its own jit helpers at import), hence here, before
# any test module. The suite is CPU-only: nothing else runs Triton.
os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

from nanochat.data.local import build_offline_corpus, write_corpus  # noqa: E402
from nanochat.data.shards import parquets_iter_batched  # noqa: E402
from nanochat.tokenizer import Tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def offline_corpus_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("offline_corpus"))
    build_offline_corpus(directory)
    return directory


@pytest.fixture(scope="session")
def small_corpus_dir(tmp_path_factory, offline_corpus_dir):
    docs = [d for batch in parquets_iter_batched("val", data_dir=offline_corpus_dir) for d in batch][:300]
    directory = str(tmp_path_factory.mktemp("small_corpus"))
    write_corpus(docs, directory, {"source": "offline", "subset": "small"}, rows_per_group=16, shard_chars=60_000)
    return directory


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, offline_corpus_dir):
    texts = (d for batch in parquets_iter_batched("train", data_dir=offline_corpus_dir) for d in batch)
    directory = str(tmp_path_factory.mktemp("tokenizer"))
    Tokenizer.train_from_iterator(texts, 512).save(directory)
    return directory
