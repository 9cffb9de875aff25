"""Training through the real CLI: every variant, exact resume after SIGKILL, a kill in the
middle of a checkpoint write, non-finite losses, bad flags. Several ranks: test_train_cluster.py
(and, through torchrun, test_speedrun.py)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import launch
import pytest
import torch

from nanochat import checkpoint_manager as ckpt
from nanochat.gpt import GPT, GPTConfig

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = ["--depth", "2", "--aspect-ratio", "32", "--head-dim", "32", "--max-seq-len", "64",
        "--window-pattern", "SL", "--device-batch-size", "4", "--total-batch-size", "512",
        "--eval-every", "-1", "--eval-tokens", "512", "--core-metric-every", "-1", "--sample-every", "-1",
        "--hc-stats-every", "-1", "--device-type", "cpu"]


def make_base(tmp_path, corpus_dir, tokenizer_dir):
    base = tmp_path / "base"
    base.mkdir()
    shutil.copytree(corpus_dir, base / "base_data")
    shutil.copytree(tokenizer_dir, base / "tokenizer")
    return str(base)


def env_for(base):
    env = dict(os.environ, NANOCHAT_BASE_DIR=base, OMP_NUM_THREADS="1", WANDB_MODE="disabled",
               NANOCHAT_DTYPE="float32", PYTHONPATH=REPO)
    env.pop("RANK", None)
    env.pop("TRITON_INTERPRET", None)  # set for the in-process kernel tests (conftest); a user's run lacks it
    return env


def train(base, *args, check=True, timeout=300):
    proc = launch.run([sys.executable, "-m", "scripts.base_train", *TINY, *args], cwd=REPO, env=env_for(base),
                      capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"base_train failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def train_records(base, tag):
    with open(os.path.join(base, "runs", tag, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["kind"] == "train"]


def final_state(base, tag):
    run = os.path.join(base, "runs", tag)
    return ckpt.load_model_state(run, ckpt.latest_step(run), "cpu")


@pytest.fixture
def base(tmp_path, small_corpus_dir, tokenizer_dir):
    return make_base(tmp_path, small_corpus_dir, tokenizer_dir)


# The command's records per kind of connection: the single-stream baseline, a free H_res, a
# Sinkhorn one and a permutation mixture (every registered wiring trains in
# tests/test_connections_train.py, and the later ones through this command below).
@pytest.mark.parametrize("variant", ["residual", "hc", "mhc", "kromhc"])
def test_each_kind_of_connection_trains_and_writes_its_run(base, variant):
    train(base, "--hc", variant, "--num-iterations", "3", "--model-tag", variant,
          "--eval-every", "3", "--hc-stats-every", "3")
    run = os.path.join(base, "runs", variant)
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["complete"] and summary["step"] == 3 and summary["hc"] == variant
    assert summary["hc_streams"] == (1 if variant == "residual" else 4)
    assert summary["val_bpb"] > 0 and summary["params"]["hc"] > 0
    records = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    assert [r["step"] for r in records if r["kind"] == "train"] == [0, 1, 2]
    assert all(r["grad_norm"] > 0 and r["hc_grad_norm"] is not None for r in records if r["kind"] == "train")
    assert any(r["kind"] == "val" for r in records)
    if variant != "residual":
        hc = [r for r in records if r["kind"] == "hc"]
        assert hc and hc[-1]["n"] == 4 and "composite_col_mae" in hc[-1]
    assert ckpt.latest_step(run) == 3
    assert_compute_records(run, summary, records, steps=3)
    config = open(os.path.join(run, "config.toml")).read()
    assert f'hc = "{variant}"' in config


def assert_compute_records(run, summary, records, steps, batch=512):
    """What a compute multiplier reads: FLOPs per token as GPT.estimate_flops gives them for
    the run's model, tokens over all ranks, FLOPs = that x tokens, cumulative on every val record."""
    meta = ckpt.load_meta(run, ckpt.latest_step(run))
    with torch.device("meta"):
        expected = GPT(GPTConfig(**meta["model_config"])).estimate_flops()
    fpt = summary["flops_per_token"]
    assert fpt == expected and summary["tokens"] == steps * batch and summary["total_flops"] == fpt * steps * batch
    vals = [r for r in records if r["kind"] == "val"]
    assert vals and all(r["tokens"] == r["step"] * batch and r["flops"] == fpt * r["tokens"] for r in vals)
    assert vals[-1]["step"] == steps and vals[-1]["train_seconds"] == summary["train_seconds"] > 0
    assert summary["wall_seconds"] >= summary["train_seconds"] and summary["world_size"] == meta["world_size"]
    assert summary["device_name"] and summary["dataset"] and summary["tokenizer"].startswith("512 tokens, ")


def test_exact_resume_after_sigkill(base):
    kill_resume_and_compare(base, ["--hc", "kromhc", "--num-iterations", "8", "--save-every", "2"])


@pytest.mark.parametrize("variant, flags", [("go_mhc", ["--hc-go-s", "1"]), ("frac", ["--hc-streams", "2"]),
                                            ("attnres", ["--attnres-block-size", "3"])],
                         ids=["go_mhc", "frac", "attnres"])
def test_later_variants_train_and_resume_exactly_after_sigkill(base, variant, flags):
    """go_mhc, frac and attnres through the real CLI with their own flags: a complete run with
    its diagnostics, and the same run killed and resumed, bitwise."""
    args = ["--hc", variant, *flags, "--num-iterations", "8", "--save-every", "2", "--eval-every", "8",
            "--hc-stats-every", "8"]
    kill_resume_and_compare(base, args)
    run = os.path.join(base, "runs", "straight")
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["complete"] and summary["hc"] == variant and summary["val_bpb"] > 0 and summary["params"]["hc"] > 0
    assert {"go_mhc": lambda: summary["hc_go_s"] == 1, "frac": lambda: summary["hc_streams"] == 2,
            "attnres": lambda: summary["attnres_block_size"] == 3 and summary["hc_streams"] == 1}[variant]()
    # the run's own wiring's fields, not the others' (checkpoint.config_record)
    assert ("hc_go_s" in summary) == (variant == "go_mhc") and "dar_gate" not in summary
    hc = [r for r in map(json.loads, open(os.path.join(run, "metrics.jsonl"))) if r["kind"] == "hc"]
    assert hc and hc[-1]["variant"] == variant
    if variant == "attnres":
        assert hc[-1]["doubly_stochastic"] == "not applicable" and len(hc[-1]["layers"]) == 4
    else:
        assert hc[-1]["composite_row_mae"] < (1e-5 if variant == "go_mhc" else 1.0)


def kill_resume_and_compare(base, args):
    """Train `args` straight (tag 'straight'), then again (tag 'killed') with a SIGKILL after
    its checkpoint of step 4, resume it: losses and final weights equal bitwise."""
    train(base, *args, "--model-tag", "straight")
    proc = launch.Popen([sys.executable, "-m", "scripts.base_train", *TINY, *args, "--model-tag", "killed"],
                        cwd=REPO, env=env_for(base), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = os.path.join(base, "runs", "killed")
    deadline = time.time() + 240
    while time.time() < deadline and (ckpt.latest_step(run) or 0) < 4 and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = ckpt.latest_step(run)
    assert killed_at is not None and 4 <= killed_at < 8, f"the kill came too late (latest {killed_at})"
    train(base, *args, "--model-tag", "killed", "--resume", "true")
    straight, resumed = train_records(base, "straight"), train_records(base, "killed")
    assert [r["step"] for r in resumed] == list(range(8))
    assert [r["loss"] for r in resumed] == [r["loss"] for r in straight]  # bitwise
    a, b = final_state(base, "straight"), final_state(base, "killed")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the compute records continue across the resume: the same cumulative counts as the straight run
    summaries = [json.load(open(os.path.join(base, "runs", tag, "summary.json"))) for tag in ("straight", "killed")]
    expected = (8 * 512, summaries[0]["flops_per_token"] * 8 * 512)
    assert [(s["tokens"], s["total_flops"]) for s in summaries] == [expected] * 2
    killed = [r for r in map(json.loads, open(os.path.join(base, "runs", "killed", "metrics.jsonl")))]
    assert_compute_records(os.path.join(base, "runs", "killed"), summaries[1], killed, steps=8)


def test_resume_refuses_a_changed_config(base):
    train(base, "--num-iterations", "2", "--model-tag", "r")
    proc = train(base, "--num-iterations", "2", "--model-tag", "r", "--resume", "true", "--hc", "mhc", check=False)
    assert proc.returncode != 0 and "changed settings" in proc.stderr and "Traceback" not in proc.stderr
    proc = train(base, "--num-iterations", "2", "--model-tag", "r", check=False)
    assert proc.returncode != 0 and "--resume" in proc.stderr


KILL_MID_SAVE = """
import os, sys
from nanochat import checkpoint_manager as checkpoint
from scripts import base_train
real = checkpoint.atomic_write
def dying_write(path, data):
    if os.path.basename(path) == "model_000004.pt":
        with open(path + ".tmp.partial", "wb") as f:   # half a file on disk, then the power goes
            f.write(data[: len(data) // 2])
        os.kill(os.getpid(), 9)
    return real(path, data)
checkpoint.atomic_write = dying_write
base_train.main(sys.argv[1:])
"""


def test_kill_during_checkpoint_write_keeps_previous_checkpoint(base):
    args = [*TINY, "--num-iterations", "6", "--save-every", "2", "--model-tag", "torn"]
    proc = launch.run([sys.executable, "-c", KILL_MID_SAVE, *args], cwd=REPO, env=env_for(base),
                      capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL
    run = os.path.join(base, "runs", "torn")
    assert ckpt.latest_step(run) == 2
    model, meta = ckpt.load_model(run)
    assert meta["step"] == 2
    train(base, "--num-iterations", "6", "--save-every", "2", "--model-tag", "torn", "--resume", "true")
    assert ckpt.latest_step(run) == 6
    assert [r["step"] for r in train_records(base, "torn")] == list(range(6))


NAN_AT_STEP_3 = """
import sys
import torch
from nanochat import gpt
from scripts import base_train
real_forward, calls = gpt.GPT.forward, [0]
def forward(self, idx, targets=None, **kw):
    out = real_forward(self, idx, targets, **kw)
    if targets is not None and self.training:
        calls[0] += 1
        if calls[0] == 7:   # the 7th training micro-batch: step 3 (two micro-batches per step)
            out = out * float("nan")
    return out
gpt.GPT.forward = forward
base_train.main(sys.argv[1:])
"""


def test_non_finite_loss_stops_and_names_the_step(base):
    args = [*TINY, "--num-iterations", "6", "--save-every", "2", "--model-tag", "nan"]
    proc = launch.run([sys.executable, "-c", NAN_AT_STEP_3, *args], cwd=REPO, env=env_for(base),
                      capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "non-finite training loss" in proc.stderr and "at step 3" in proc.stderr
    assert "last good checkpoint is step 2" in proc.stderr
    run = os.path.join(base, "runs", "nan")
    model, meta = ckpt.load_model(run)
    assert meta["step"] == 2 and all(torch.isfinite(p).all() for p in model.parameters())


INF_AFTER_STEP_0 = """
import sys
import torch
from nanochat import optim
from scripts import base_train
real_build = optim.build_optimizer
def build_optimizer(groups, world_size):
    opt = real_build(groups, world_size)
    real_step = opt.step
    def step(*args, **kwargs):   # the update of step 0 leaves an infinite weight
        out = real_step(*args, **kwargs)
        with torch.no_grad():
            groups[0]["params"][0].view(-1)[0] = float("inf")
        return out
    opt.step = step
    return opt
optim.build_optimizer = build_optimizer
base_train.main(sys.argv[1:])
"""


def test_non_finite_parameters_are_never_saved(base):
    proc = launch.run([sys.executable, "-c", INF_AFTER_STEP_0, *TINY, "--num-iterations", "4", "--save-every",
                           "1", "--model-tag", "inf"], cwd=REPO, env=env_for(base), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "non-finite parameters at step 1" in proc.stderr
    assert ckpt.latest_step(os.path.join(base, "runs", "inf")) is None


@pytest.mark.parametrize("flags, message", [
    (["--total-batch-size", "1000"], "--total-batch-size"),
    (["--hc", "kromhc", "--hc-streams", "7"], "7"),
    (["--hc", "mhc_lite", "--hc-streams", "8"], "mhc_lite"),
    (["--window-pattern", "SXL"], "window_pattern"),
    (["--depth", "two"], "argument --depth: expected a positive integer, got 'two'"),
    (["--depth", "0"], "argument --depth: expected a positive integer, got '0'"),
    (["--embedding-lr", "inf"], "argument --embedding-lr: expected a number >= 0"),
    (["--attention", "fa3"], "argument --attention"),
    (["--attention", "flex"], "trains on CUDA only"),
    (["--hc", "kromhc", "--hc-kernels", "liger"], "runs Triton kernels on CUDA only"),
    (["--hc", "frac", "--hc-streams", "5"], "choose hc_streams among 2, 4, 8, 16"),
])
def test_bad_flags_give_one_clear_error(base, flags, message):
    proc = train(base, "--num-iterations", "1", *flags, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
