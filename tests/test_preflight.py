"""The checks every rank makes before step 0 (nanochat/planning/preflight.py), on facts as ranks on
different nodes would gather them: another tokenizer, other train shards, a run directory a
rank cannot write or that another node does not share, each one error naming the rank."""

import os
import re
import types

import pytest
import torch

from nanochat.planning import preflight


def facts_of(tmp_path, rank, host="node-a", token_bytes=None, files=("shard_00000.parquet",), val_rows=5):
    loader = types.SimpleNamespace(files=list(files), plan=[(0, rank)] * (3 + rank))
    rows = types.SimpleNamespace(rows=[None] * val_rows, total=9)
    facts = preflight.rank_facts(rank, str(tmp_path), torch.ones(512) if token_bytes is None else token_bytes,
                                 loader, rows)
    return dict(facts, host=host)


def test_matching_ranks_pass_and_are_summed_up(tmp_path):
    facts = [facts_of(tmp_path, 0), facts_of(tmp_path, 1, val_rows=4)]
    preflight.check(facts, str(tmp_path), 0)
    assert preflight.summary(facts) == (
        "checked before step 0: 2 rank(s) on 1 host(s); train row groups per rank 3-4; val rows per rank 4-5 of 9; "
        "the same 512-token tokenizer and train shards on every rank; run directory writable and shared")
    for rank in (0, 1):
        preflight.remove_probe(str(tmp_path), rank)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("other, message", [
    (dict(token_bytes=torch.ones(300)), "rank 1 (node-b) has another tokenizer (300 tokens) than rank 0"),
    (dict(files=("shard_00000.parquet", "shard_00001.parquet")), "rank 1 (node-b) sees 2 train shards, rank 0"),
])
def test_another_node_with_other_files_is_named(tmp_path, other, message):
    facts = [facts_of(tmp_path, 0), facts_of(tmp_path, 1, host="node-b", **other)]
    with pytest.raises(SystemExit, match=re.escape(message)):
        preflight.check(facts, str(tmp_path), 0)


def test_a_run_directory_not_shared_or_not_writable(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "VISIBLE_WITHIN_S", 0)
    facts = [facts_of(tmp_path, 0), facts_of(tmp_path, 1, host="node-b")]
    preflight.remove_probe(str(tmp_path), 1)  # as if written on node-b's own disk
    with pytest.raises(SystemExit, match=r"rank 0 \(.*\) cannot see the files rank\(s\) 1 \(node-b\) wrote"):
        preflight.check(facts, str(tmp_path), 0)
    taken = tmp_path / "taken"
    taken.write_text("a file where the run directory should be")
    with pytest.raises(SystemExit, match="rank 0 cannot write to the run directory .*taken"):
        facts_of(taken, 0)
