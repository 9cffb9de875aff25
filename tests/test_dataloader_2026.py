"""The 2026-07 trunk's batches are nanochat 92d63d4's: our BestFitLoader with batch_refill (and
no order_seed) against the batches its own loader yields on the same corpus and tokenizer,
recorded in tests/goldens/dataloader_92d63d4.json by tests/goldens/upstream_dataloader.py
(which says how to regenerate it and builds the corpus and the tokenizer used here)."""

import json
import os
import sys

import pytest

from nanochat.dataloader import BestFitLoader
from nanochat.data.shards import corpus_source, list_parquet_files, write_shard
from nanochat.tokenizer import SPECIAL_TOKENS, Tokenizer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "goldens"))
import upstream_dataloader as golden_corpus  # noqa: E402

GOLDEN = json.load(open(os.path.join(os.path.dirname(__file__), "goldens", "dataloader_92d63d4.json")))
RUNS = GOLDEN["runs"]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """The golden's shards in our format, without a marker, as nanochat's download leaves them."""
    directory = tmp_path_factory.mktemp("climbmix")
    for name, docs in golden_corpus.shard_files():
        write_shard(str(directory / name), docs, rows_per_group=golden_corpus.CORPUS["row_group"])
    return str(directory)


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(golden_corpus.mergeable_ranks(), golden_corpus.PATTERN)


def batches(loader, n):
    with loader:
        return [golden_corpus.batch_digest(x.numpy(), y.numpy()) for x, y in (next(loader) for _ in range(n))]


def loader_for(tok, corpus_dir, run, **kwargs):
    return BestFitLoader(tok, run["B"], run["T"], run["split"], rank=run["rank"], world_size=run["world_size"],
                         data_dir=corpus_dir, **golden_corpus.LOADER, **kwargs)


def test_the_golden_corpus_is_ours(tok, corpus_dir):
    """The golden was made from this corpus, read as ClimbMix (val = shard_06542), and this tokenizer."""
    assert (GOLDEN["seed"], GOLDEN["corpus"], GOLDEN["loader"]) == \
        (golden_corpus.SEED, golden_corpus.CORPUS, golden_corpus.LOADER)
    assert list(golden_corpus.SPECIALS) == SPECIAL_TOKENS
    assert tok.special_tokens == golden_corpus.special_tokens()
    assert corpus_source(corpus_dir) == "climbmix"
    assert [os.path.basename(p) for p in list_parquet_files("val", corpus_dir)] == ["shard_06542.parquet"]


@pytest.mark.parametrize("run", RUNS, ids=[f"{r['split']}-B{r['B']}T{r['T']}-rank{r['rank']}of{r['world_size']}"
                                           for r in RUNS])
def test_batches_are_nanochats(tok, corpus_dir, run):
    got = batches(loader_for(tok, corpus_dir, run, batch_refill=True), run["batches"])
    first_differing = next((k for k, (a, b) in enumerate(zip(got, run["sha256"])) if a != b), None)
    assert first_differing is None, f"batch {first_differing} of {run['batches']} differs from nanochat's"


def test_refilling_by_document_packs_other_batches(tok, corpus_dir):
    """The default (2026-01) refill is not nanochat's: batch_refill is what makes the batches equal."""
    run = RUNS[0]
    assert batches(loader_for(tok, corpus_dir, run), run["batches"]) != run["sha256"]


def test_a_resumed_loader_goes_on_with_nanochats_batches(tok, corpus_dir):
    run, k = RUNS[1], 7
    with loader_for(tok, corpus_dir, run, batch_refill=True) as loader:
        for _ in range(k):
            next(loader)
        state = json.loads(json.dumps(loader.state_dict()))
    assert state["batch_refill"] is True and len(state["buffer"]) >= golden_corpus.LOADER["buffer_size"]
    resumed = loader_for(tok, corpus_dir, run, batch_refill=True, state=state)
    assert batches(resumed, run["batches"] - k) == run["sha256"][k:]
    with pytest.raises(ValueError, match="batch_refill"):
        loader_for(tok, corpus_dir, run, state=state)
