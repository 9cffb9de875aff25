"""Training on a cluster, through the real CLI, with gloo ranks started as torchrun starts
them (RANK, WORLD_SIZE, MASTER_ADDR, ...), so that each rank's exit status is seen: 4 and 8
ranks reproduce one process; a checkpoint resumes on 2 ranks, then again on 4; 8 ranks on a
val split of 4 row groups give one process's val bpb; a SIGTERM to one rank of two saves,
exits resumably, and the resumed run equals the uninterrupted one bit for bit; a corrupt
row group that only rank 1 reads ends both ranks at once with rank 1's error."""

import json
import os
import sys
import time

import pyarrow.parquet as pq
import launch
import pytest
import torch
from test_optim import _free_port
from test_train_e2e import REPO, TINY, env_for, final_state, make_base, train, train_records

from nanochat import checkpoint_manager as ckpt
from nanochat.data.local import write_corpus
from nanochat.data.shards import VAL_SHARD, parquets_iter_batched, shard_name, write_shard
from nanochat.cluster.preempt import EXIT_PREEMPTED

pytestmark = pytest.mark.slow

DOC = ("The stream connections mix n copies of the residual state with a doubly stochastic "
       "matrix, so the mean of the streams is preserved through depth. ") * 3
# 4 steps of 512 tokens; val bpb at the end over 40 rows of 64 tokens
ARGS = ["--hc", "kromhc", "--num-iterations", "8", "--eval-every", "-1", "--eval-tokens", str(40 * 64)]


def start_ranks(base, world, *args, code=None, timeout=300):
    """Start `world` ranks of base_train (or of the program `code`, given the same argv) and
    wait for all of them; returns [(exit status, stdout, stderr)] by rank and the seconds taken."""
    env = dict(env_for(base), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(world))
    program = ["-c", code] if code else ["-m", "scripts.base_train"]
    logs = os.path.join(base, f"launch_{time.time_ns()}")
    os.makedirs(logs)
    procs, started = [], time.time()
    for r in range(world):
        out, err = open(os.path.join(logs, f"{r}.out"), "w"), open(os.path.join(logs, f"{r}.err"), "w")
        procs.append(launch.Popen([sys.executable, *program, *TINY, *args], cwd=REPO, stdout=out, stderr=err,
                                  env=dict(env, RANK=str(r), LOCAL_RANK=str(r))))
    try:
        for p in procs:
            p.wait(timeout=max(1, started + timeout - time.time()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    elapsed = time.time() - started
    read = lambda r, ext: open(os.path.join(logs, f"{r}.{ext}")).read()
    return [(p.returncode, read(r, "out"), read(r, "err")) for r, p in enumerate(procs)], elapsed


def succeeded(results):
    for r, (code, out, err) in enumerate(results):
        assert code == 0, f"rank {r} exited {code}:\n{out[-2000:]}\n{err[-3000:]}"
    return results[0][1]


def rewind(run_dir, step):
    """Make `step` the run's latest checkpoint, as if the run had stopped there."""
    for name in os.listdir(run_dir):
        if name.startswith(("model_", "optim_", "meta_")) and int(name.split("_")[1].split(".")[0]) > step:
            os.remove(os.path.join(run_dir, name))
    ckpt.atomic_write(os.path.join(run_dir, "latest"), f"{step}\n")


def assert_losses_close(records, reference):
    assert [r["step"] for r in records] == [r["step"] for r in reference]
    for got, want in zip(records, reference):  # the same batches, summed in another order
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-5), got["step"]


def summary_of(base, tag):
    return json.load(open(os.path.join(base, "runs", tag, "summary.json")))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, small_corpus_dir, tokenizer_dir):
    """A base directory whose train split is one document repeated (every row alike, so any
    number of ranks sees one process's batches) and whose val split is 64 real documents in
    4 row groups of 16; and the one-process run on it."""
    tmp = tmp_path_factory.mktemp("cluster")
    data = tmp / "data"
    write_corpus([DOC] * 400, str(data), {"source": "test"}, rows_per_group=16, shard_chars=60_000)
    docs = [d for batch in parquets_iter_batched("train", data_dir=small_corpus_dir) for d in batch][:64]
    write_shard(str(data / shard_name(VAL_SHARD)), docs, rows_per_group=16)
    assert pq.ParquetFile(data / shard_name(VAL_SHARD)).num_row_groups == 4
    base = make_base(tmp, str(data), tokenizer_dir)
    train(base, *ARGS, "--model-tag", "single")
    return base


def test_four_ranks_equal_one_process_and_resume_on_two_then_four(cluster):
    base, run = cluster, os.path.join(cluster, "runs", "elastic")
    single = train_records(base, "single")
    out = succeeded(start_ranks(base, 4, *ARGS, "--device-batch-size", "2", "--save-every", "2", "--keep-checkpoints",
                           "-1", "--model-tag", "elastic")[0])
    assert "checked before step 0: 4 rank(s)" in out and "val rows per rank 10-10 of 40" in out
    assert_losses_close(train_records(base, "elastic"), single)
    assert summary_of(base, "elastic")["val_bpb"] == pytest.approx(summary_of(base, "single")["val_bpb"], rel=1e-5)
    straight = final_state(base, "elastic")

    rewind(run, 4)  # 4 -> 2 ranks from step 4
    out = succeeded(start_ranks(base, 2, *ARGS, "--device-batch-size", "2", "--save-every", "2", "--keep-checkpoints",
                           "-1", "--model-tag", "elastic", "--resume", "true")[0])
    assert "resuming on 2 ranks a checkpoint written by 4" in out and "not bitwise" in out
    assert "resumed from step 4" in out and json.load(open(os.path.join(run, "meta_000008.json")))["world_size"] == 2
    assert_losses_close(train_records(base, "elastic"), single)

    rewind(run, 6)  # 2 -> 4 ranks from step 6
    out = succeeded(start_ranks(base, 4, *ARGS, "--device-batch-size", "2", "--model-tag", "elastic", "--resume",
                           "true")[0])
    assert "resuming on 4 ranks a checkpoint written by 2" in out
    assert_losses_close(train_records(base, "elastic"), single)
    # the LR schedule continued: the final weights are the uninterrupted 4-rank run's
    resumed = final_state(base, "elastic")
    for k in straight:
        torch.testing.assert_close(resumed[k], straight[k], rtol=1e-4, atol=1e-5)
    # tokens and FLOPs count over all ranks, and carry across the resumes on 2 and 4 ranks
    single, elastic = summary_of(base, "single"), summary_of(base, "elastic")
    assert elastic["world_size"] == 4 and single["world_size"] == 1
    assert (elastic["tokens"], elastic["total_flops"]) == (single["tokens"], single["total_flops"]) == \
        (8 * 512, single["flops_per_token"] * 8 * 512)


def test_eight_ranks_on_four_val_row_groups_equal_one_process(cluster):
    base = cluster
    out = succeeded(start_ranks(base, 8, *ARGS, "--device-batch-size", "1", "--model-tag", "eight")[0])
    assert "val rows per rank 5-5 of 40" in out
    assert_losses_close(train_records(base, "eight"), train_records(base, "single"))
    assert summary_of(base, "eight")["val_bpb"] == pytest.approx(summary_of(base, "single")["val_bpb"], rel=1e-5)


SIGNALS = """
import os, signal, sys
from nanochat import gpt
from nanochat import checkpoint_manager as checkpoint
from scripts import base_train
rank = int(os.environ["RANK"])
real_forward, calls = gpt.GPT.forward, [0]
def forward(self, idx, targets=None, **kw):
    if targets is not None and self.training:
        calls[0] += 1
        if rank == 1 and calls[0] == 7:   # rank 1 only, in the middle of step 3 (two micro-batches a step)
            os.kill(os.getpid(), signal.SIGTERM)
    return real_forward(self, idx, targets, **kw)
gpt.GPT.forward = forward
real_write = checkpoint.atomic_write
def write(path, data):
    if os.path.basename(path) in ("model_000004.pt", "meta_000004.json", "optim_000004_rank1.pt"):
        os.kill(os.getpid(), signal.SIGTERM)   # signals while the checkpoint is being written
    return real_write(path, data)
checkpoint.atomic_write = write
base_train.cli(sys.argv[1:])
"""


def test_sigterm_to_one_rank_saves_and_the_resumed_run_is_bitwise(tmp_path, small_corpus_dir, tokenizer_dir):
    base = make_base(tmp_path, small_corpus_dir, tokenizer_dir)
    args = ["--hc", "kromhc", "--num-iterations", "6", "--device-batch-size", "2"]
    succeeded(start_ranks(base, 2, *args, "--model-tag", "straight")[0])
    results, _ = start_ranks(base, 2, *args, "--model-tag", "stopped", code=SIGNALS)
    assert [code for code, _, _ in results] == [EXIT_PREEMPTED] * 2, results
    out = results[0][1]
    assert "preempted (SIGTERM received): saved the checkpoint of step 4 of 6" in out
    assert "--resume true" in out and "SIGTERM received again: ignored" in out
    run = os.path.join(base, "runs", "stopped")
    assert ckpt.latest_step(run) == 4 and not os.path.exists(os.path.join(run, "summary.json"))
    assert json.load(open(os.path.join(run, "preempted.json")))["step"] == 4
    assert [r["step"] for r in train_records(base, "stopped")] == [0, 1, 2, 3]

    succeeded(start_ranks(base, 2, *args, "--model-tag", "stopped", "--resume", "true")[0])
    assert not os.path.exists(os.path.join(run, "preempted.json"))
    straight, resumed = train_records(base, "straight"), train_records(base, "stopped")
    assert [r["loss"] for r in resumed] == [r["loss"] for r in straight] and len(resumed) == 6  # bitwise
    a, b = final_state(base, "straight"), final_state(base, "stopped")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_corrupt_row_group_on_rank_1_ends_both_ranks_with_its_error(tmp_path, small_corpus_dir, tokenizer_dir):
    base = make_base(tmp_path, small_corpus_dir, tokenizer_dir)
    shard = os.path.join(base, "base_data", shard_name(0))
    chunk = pq.ParquetFile(shard).metadata.row_group(1).column(0)  # rank 1 of 2 reads row group 1
    with open(shard, "r+b") as f:
        f.seek(chunk.data_page_offset + 8)
        f.write(b"\xff" * (chunk.total_compressed_size - 16))
    results, elapsed = start_ranks(base, 2, "--num-iterations", "4", "--dist-timeout", "300", "--model-tag", "bad")
    assert [code for code, _, _ in results] == [1, 1], results
    errors = [[line for line in err.splitlines() if line.startswith("error:")] for _, _, err in results]
    assert len(errors[1]) == 1 and errors[1][0].startswith("error: corrupt shard: row group 1 of")
    assert errors[0] == [f"error: rank 1: {errors[1][0].removeprefix('error: ')}"]
    assert "Traceback" not in results[0][2] + results[1][2]
    assert elapsed < 60  # not the 300 s collective timeout


BEFORE_EVALUATIONS = """
import os, signal, sys
from scripts import base_train
real_log = base_train.MetricsLog.log
def log(self, kind, step, **values):
    real_log(self, kind, step, **values)
    if kind == "train" and step == 1:
        os.kill(os.getpid(), signal.SIGTERM)   # after step 1's own stop vote, before step 2's evaluations
base_train.MetricsLog.log = log
base_train.cli(sys.argv[1:])
"""


def test_a_signal_before_due_evaluations_saves_first_and_they_run_on_resume(tmp_path, small_corpus_dir, tokenizer_dir):
    """Evaluations take minutes (CORE) and torchrun waits only so long after a SIGTERM: a stop
    requested since the step's vote is agreed on before them, and the resumed run does them."""
    base = make_base(tmp_path, small_corpus_dir, tokenizer_dir)
    args = ["--num-iterations", "4", "--eval-every", "2", "--model-tag", "evals"]
    results, _ = start_ranks(base, 1, *args, code=BEFORE_EVALUATIONS)
    assert [code for code, _, _ in results] == [EXIT_PREEMPTED], results
    run = os.path.join(base, "runs", "evals")
    records = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    assert ckpt.latest_step(run) == 2 and [(r["kind"], r["step"]) for r in records if r["kind"] == "val"] == [("val", 0)]
    succeeded(start_ranks(base, 1, *args, "--resume", "true")[0])
    records = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    assert [r["step"] for r in records if r["kind"] == "val"] == [0, 2, 4]
