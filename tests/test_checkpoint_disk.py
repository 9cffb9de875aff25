"""Disk use of a run: --keep-checkpoints pruning (the final checkpoint and `latest` always
stay), a save that fails for lack of space (the previous checkpoint stays loadable and the
run stops with one error line), and --resume after pruning."""

import errno
import json
import os
import sys

import launch
import pytest

from nanochat import checkpoint_manager as ckpt

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fake_save(run_dir, step, world_size=1):
    meta = {"step": step, "world_size": world_size}
    for rank in range(world_size):
        ckpt.save_rank_files(run_dir, step, rank, {"rank": rank}, model_state={"step": step} if rank == 0 else None,
                             meta=meta if rank == 0 else None)
    ckpt.mark_latest(run_dir, step)


def steps_on_disk(run_dir):
    return sorted({int(name.split("_")[1].split(".")[0]) for name in os.listdir(run_dir)
                   if name.startswith(("model_", "optim_", "meta_"))})


@pytest.mark.parametrize("keep, kept", [(2, [3, 4, 5]), (0, [5]), (1, [4, 5]), (-1, [1, 2, 3, 4, 5])])
def test_prune_keeps_the_most_recent_the_final_and_latest(tmp_path, keep, kept):
    run = str(tmp_path)
    for step in range(1, 5):
        fake_save(run, step, world_size=2)
        ckpt.prune(run, keep, final_step=5)
        assert ckpt.latest_step(run) == step and step in steps_on_disk(run)
        assert len(steps_on_disk(run)) == (step if keep < 0 else min(step, max(keep, 1)))
    fake_save(run, 5, world_size=2)
    ckpt.prune(run, keep, final_step=5)
    # the final checkpoint plus the `keep` most recent intermediate ones
    assert steps_on_disk(run) == kept
    assert all(ckpt.is_complete(run, s) for s in kept)


def test_prune_removes_torn_saves_behind_latest_and_never_latest(tmp_path):
    run = str(tmp_path)
    fake_save(run, 1)
    # a save of step 2 killed after its optimizer file: not complete, `latest` stays at 1
    ckpt.save_rank_files(run, 2, 0, {"rank": 0})
    assert ckpt.prune(run, 0) == [] and ckpt.latest_step(run) == 1 and steps_on_disk(run) == [1, 2]
    fake_save(run, 3)
    assert ckpt.prune(run, 0) == [1, 2] and steps_on_disk(run) == [3]
    # `latest` names an older step (e.g. put back by hand): it is kept whatever K says
    ckpt.atomic_write(os.path.join(run, "latest"), "3\n")
    fake_save(run, 4)
    ckpt.atomic_write(os.path.join(run, "latest"), "3\n")
    assert ckpt.prune(run, 0) == [] and steps_on_disk(run) == [3, 4]


def test_a_failed_save_deletes_its_files_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    run = str(tmp_path)
    fake_save(run, 1)
    real = ckpt.atomic_write

    def full_disk(path, data):
        if os.path.basename(path).startswith("model_"):
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real(path, data)

    monkeypatch.setattr(ckpt, "atomic_write", full_disk)
    with pytest.raises(OSError, match="No space left"):
        ckpt.save_rank_files(run, 2, 0, {"rank": 0}, model_state={"step": 2}, meta={"step": 2, "world_size": 1})
    assert steps_on_disk(run) == [1] and ckpt.latest_step(run) == 1
    assert not [name for name in os.listdir(run) if ".tmp." in name]
    assert ckpt.load_model_state(run, 1, "cpu") == {"step": 1}


def test_dir_size_and_human_bytes(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 3000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"x" * 100)
    assert ckpt.dir_size(str(tmp_path)) == 3100
    assert ckpt.human_bytes(3100) == "3.0 KiB" and ckpt.human_bytes(512) == "512 B"
    assert ckpt.human_bytes(5 * 2**30) == "5.0 GiB"


# ----------------------------------------------------------------------------- through base_train

FULL_DISK_AT_STEP_4 = """
import errno, os, sys
from nanochat import checkpoint_manager as checkpoint
from scripts import base_train
from nanochat.cli import run
real = checkpoint.atomic_write
def full_disk(path, data):
    if os.path.basename(path) == "model_000004.pt":
        raise OSError(errno.ENOSPC, "No space left on device", path)
    return real(path, data)
checkpoint.atomic_write = full_disk
sys.argv[0] = "base_train"
run(lambda: base_train.main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_full_disk_stops_the_run_and_resume_continues_after_pruning(tmp_path, small_corpus_dir, tokenizer_dir):
    from tests.test_train_e2e import TINY, env_for, make_base, train, train_records
    base = make_base(tmp_path, small_corpus_dir, tokenizer_dir)
    args = [*TINY, "--num-iterations", "6", "--save-every", "1", "--keep-checkpoints", "1", "--model-tag", "full"]
    proc = launch.run([sys.executable, "-c", FULL_DISK_AT_STEP_4, *args], cwd=REPO, env=env_for(base),
                      capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "step 4 could not be written" in errors[0] and "No space left" in errors[0]
    assert "last complete checkpoint is step 3" in errors[0] and "--resume true" in errors[0]
    assert "saved checkpoint of step 3; run directory" in proc.stdout and "deleting step(s) 2" in proc.stdout
    run = os.path.join(base, "runs", "full")
    assert ckpt.latest_step(run) == 3 and steps_on_disk(run) == [3]
    model, meta = ckpt.load_model(run)
    assert meta["step"] == 3

    train(base, "--num-iterations", "6", "--save-every", "1", "--keep-checkpoints", "1", "--model-tag", "full",
          "--resume", "true")
    assert ckpt.latest_step(run) == 6 and steps_on_disk(run) == [5, 6]
    assert [r["step"] for r in train_records(base, "full")] == list(range(6))
    assert json.load(open(os.path.join(run, "summary.json")))["complete"]


OOM_AT_STEP_2 = """
import sys, torch
from nanochat import gpt
from scripts import base_train
real, calls = gpt.GPT.forward, []
def forward(self, idx, targets=None, **kwargs):
    calls.append(targets is not None)
    if calls.count(True) == 5:  # step 2's first micro-step (2 per step)
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB (simulated)")
    return real(self, idx, targets, **kwargs)
gpt.GPT.forward = forward
sys.argv[0] = "base_train"
base_train.cli(sys.argv[1:])
"""


@pytest.mark.slow
def test_out_of_memory_names_a_smaller_batch_and_the_run_resumes_at_it(tmp_path, small_corpus_dir, tokenizer_dir):
    """--device-batch-size auto on a CPU is the config's value; an out-of-memory step ends in
    one error line naming the next smaller batch, and --resume true at that batch finishes."""
    from tests.test_train_e2e import TINY, env_for, make_base, train, train_records
    base = make_base(tmp_path, small_corpus_dir, tokenizer_dir)
    config = tmp_path / "c.toml"
    config.write_text("device_batch_size = 4\n")
    args = [*TINY, "--config", str(config), "--device-batch-size", "auto", "--num-iterations", "4", "--save-every",
            "1", "--model-tag", "oom"]
    proc = launch.run([sys.executable, "-c", OOM_AT_STEP_2, *args], cwd=REPO, env=env_for(base),
                      capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "device batch 4: --device-batch-size auto sizes batches to a GPU's memory; on cpu" in proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: out of GPU memory at device batch 4, step 2"), errors
    assert "--device-batch-size 2 --resume true" in errors[0] and "checkpoint of step 2" in errors[0]
    train(base, "--num-iterations", "4", "--save-every", "1", "--model-tag", "oom", "--device-batch-size", "2",
          "--resume", "true")
    assert [r["step"] for r in train_records(base, "oom")] == list(range(4))
    assert json.load(open(os.path.join(base, "runs", "oom", "summary.json")))["complete"]
