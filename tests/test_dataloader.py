"""The best-fit loader on a small real-text corpus (many files of 16-document row groups):
batch layout, packing, exact resume (start, mid-stream, across a file boundary, across an
epoch rollover), the state not running ahead of next(), disjoint rank streams, the val
loader, and clear errors."""

import json
import os
import shutil
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from nanochat.dataloader import BestFitLoader, build_val_loader
from nanochat.data.shards import DatasetError, list_parquet_files, parquets_iter_batched, shard_name
from nanochat.tokenizer import get_tokenizer

SMALL = dict(B=2, T=128, split="train", buffer_size=16, tokenizer_batch_size=5)  # chunks unaligned with row groups


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return get_tokenizer(tokenizer_dir)


@pytest.fixture(scope="module")
def reference(tok, small_corpus_dir):
    """An uninterrupted run past the first epoch: batches and the state before each."""
    loader = BestFitLoader(tok, data_dir=small_corpus_dir, **SMALL)
    states, batches = [], []
    while loader.epoch < 2 or len(batches) < epoch_start(states) + 8:
        states.append(json.loads(json.dumps(loader.state_dict())))
        batches.append(_numpy(next(loader)))
        assert len(batches) < 2000
    states.append(loader.state_dict())
    loader.close()
    return states, batches


def epoch_start(states):
    return next((k for k, s in enumerate(states) if s["epoch"] == 2), 10**9)


def _numpy(batch):
    x, y = batch
    return x.numpy().copy(), y.numpy().copy()


def take(loader, n):
    return [_numpy(next(loader)) for _ in range(n)]


def same(a, b):
    return len(a) == len(b) and all(np.array_equal(x1, x2) and np.array_equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))


def test_rows_are_bos_aligned_whole_documents_without_padding(tok, small_corpus_dir):
    B, T = 4, 256
    with BestFitLoader(tok, B, T, "train", data_dir=small_corpus_dir, buffer_size=32) as loader:
        batches = take(loader, 6)
        stats, efficiency = loader.stats, loader.packing_efficiency
    bos = tok.get_bos_token_id()
    texts = [d for batch in parquets_iter_batched("train", data_dir=small_corpus_dir) for d in batch]
    docs = [tuple(ids) for ids in tok.encode(texts, prepend=bos)]
    whole = set(docs)
    for x, y in batches:
        assert x.shape == y.shape == (B, T) and x.dtype == y.dtype == np.int64
        assert (x[:, 1:] == y[:, :-1]).all()
        assert ((0 <= x) & (x < tok.get_vocab_size())).all()
        for row in np.concatenate([x, y[:, -1:]], axis=1).tolist():
            assert row[0] == bos
            starts = [i for i, t in enumerate(row) if t == bos] + [len(row)]
            pieces = [tuple(row[a:b]) for a, b in zip(starts, starts[1:])]
            assert all(p in whole for p in pieces[:-1])  # whole documents, then...
            assert any(d[:len(pieces[-1])] == pieces[-1] for d in docs)  # ...one whole or cropped at the end
    assert stats["tokens_kept"] == 6 * B * (T + 1)  # every slot holds a document token: no padding
    print(f"packing efficiency at T={T}: {efficiency:.3f} of the tokens read were kept "
          f"({stats['docs']} documents, {stats['tokens_cropped']} tokens cropped)")
    assert efficiency == stats["tokens_kept"] / (stats["tokens_kept"] + stats["tokens_cropped"])
    assert 0.4 < efficiency < 1.0


def test_best_fit_choice(tok, small_corpus_dir):
    """Each piece is the largest buffered document that fits, else the shortest, cropped."""
    with BestFitLoader(tok, 1, 64, "train", data_dir=small_corpus_dir, buffer_size=24) as loader:
        next(loader)
        for room in (65, 30, 7, 1):
            lengths = [len(ids) for _, _, ids in loader._docs.values()]
            fitting = [n for n in lengths if n <= room]
            piece = loader._take(room)
            assert len(piece) == (max(fitting) if fitting else room)


def test_resume_is_exact(tok, small_corpus_dir, reference):
    states, batches = reference
    across_file = next(k for k, s in enumerate(states)
                       if s["cursor"] and s["cursor"][1] > 0 and any(f < s["cursor"][1] for f, _, _ in s["buffer"]))
    across_epoch = epoch_start(states)
    assert 0 < across_file < across_epoch < len(batches) - 5
    for k in (0, 1, 3, across_file, across_epoch):
        with BestFitLoader(tok, data_dir=small_corpus_dir, state=states[k], **SMALL) as loader:
            assert loader.state_dict() == states[k]  # the rebuilt buffer is the saved one
            assert loader.epoch == states[k]["epoch"]
            assert same(take(loader, 5), batches[k:k + 5]), f"resumed at batch {k}"
            assert loader.state_dict() == states[k + 5]
    assert states[across_epoch]["epoch"] == 2 and states[across_epoch - 1]["epoch"] == 1


def test_state_does_not_run_ahead_of_next(tok, small_corpus_dir):
    with BestFitLoader(tok, data_dir=small_corpus_dir, **SMALL) as loader:
        take(loader, 2)
        before = loader.state_dict()
        time.sleep(0.5)  # the prefetch thread reads and tokenizes ahead meanwhile
        assert loader.state_dict() == before
        assert json.loads(json.dumps(before)) == before


def test_ranks_read_disjoint_row_groups(tok, small_corpus_dir):
    everything = {(f, rg) for f, path in enumerate(list_parquet_files("train", small_corpus_dir))
                  for rg in range(pq.ParquetFile(path).num_row_groups)}
    loaders = [BestFitLoader(tok, rank=r, world_size=2, data_dir=small_corpus_dir, **SMALL) for r in range(2)]
    plans = [set(loader.plan) for loader in loaders]
    assert plans[0].isdisjoint(plans[1]) and plans[0] | plans[1] == everything
    assert [f for f, _ in loaders[0].plan] == sorted(f for f, _ in loaders[0].plan)  # file order
    seen = [set(), set()]
    for _ in range(20):
        for r, loader in enumerate(loaders):
            next(loader)
            state = loader.state_dict()
            seen[r] |= {(f, rg) for f, rg, _ in state["buffer"]} | {tuple(state["cursor"][1:3])}
    for r in range(2):
        assert seen[r] <= plans[r] and all(rg % 2 == r for _, rg in seen[r])
    assert not same(take(loaders[0], 1), take(loaders[1], 1))
    for loader in loaders:
        loader.close()


def test_epoch_rollover_is_announced_once(tok, small_corpus_dir, capsys):
    with BestFitLoader(tok, 2, 128, "train", data_dir=small_corpus_dir, buffer_size=8) as loader:
        while loader.epoch < 3:
            next(loader)
    out = capsys.readouterr().out
    assert out.count("starting epoch 2") == 1 and out.count("starting epoch 3") == 1


def test_val_loader_is_fresh_each_time(tok, small_corpus_dir):
    runs = []
    for _ in range(2):
        with build_val_loader(tok, 2, 64, data_dir=small_corpus_dir, buffer_size=8) as loader:
            assert loader.files == [shard_name(1822)]
            runs.append(take(loader, 3))
    assert same(*runs)


def test_errors_name_the_problem(tok, small_corpus_dir, tmp_path):
    with pytest.raises(DatasetError, match="no shards in"):
        BestFitLoader(tok, 2, 64, "train", data_dir=tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(small_corpus_dir, broken)
    with open(broken / shard_name(1), "r+b") as f:
        f.truncate(os.path.getsize(broken / shard_name(1)) // 2)
    with pytest.raises(DatasetError, match=r"corrupt shard: .*shard_00001"):
        BestFitLoader(tok, 2, 64, "train", data_dir=broken)
    with pytest.raises(DatasetError, match="rank 5 of 8 has nothing to read"):
        BestFitLoader(tok, 2, 64, "val", rank=5, world_size=8, data_dir=small_corpus_dir)
    with pytest.raises(ValueError, match="rank 2 is not in 0..1"):
        BestFitLoader(tok, 2, 64, "train", rank=2, world_size=2, data_dir=small_corpus_dir)
    with pytest.raises(ValueError, match="must be positive"):
        BestFitLoader(tok, 0, 64, "train", data_dir=small_corpus_dir)

    with BestFitLoader(tok, data_dir=small_corpus_dir, **SMALL) as loader:
        next(loader)
        state = loader.state_dict()
    with pytest.raises(ValueError, match="world_size=1 but this loader has 2"):
        BestFitLoader(tok, data_dir=small_corpus_dir, state=state, rank=0, world_size=2, **SMALL)
    with pytest.raises(ValueError, match="buffer_size"):
        BestFitLoader(tok, data_dir=small_corpus_dir, state=state, **dict(SMALL, buffer_size=32))
    with pytest.raises(DatasetError, match="files changed"):
        BestFitLoader(tok, data_dir=small_corpus_dir, state=dict(state, files=state["files"][:-1]), **SMALL)
    with pytest.raises(RuntimeError, match="closed"):
        next(loader)


def test_small_split_is_not_cycled_to_fill_the_buffer(tok, small_corpus_dir):
    docs = sum(len(b) for b in parquets_iter_batched("val", data_dir=small_corpus_dir))
    with build_val_loader(tok, 1, 16, data_dir=small_corpus_dir) as loader:
        assert loader.buffer_size == docs < 1000
        next(loader)
        assert loader.epoch == 1
        assert loader.state_dict()["cursor"][0] == 1  # nothing of epoch 2 was read yet
