"""Clean exits on a busy machine: base_train and base_eval, run again and again while two
other processes keep both cores busy, always exit 0 without a native abort at interpreter
exit (a prefetch thread still inside the tokenizer or pyarrow when Python finalizes)."""

import os
import subprocess
import sys

import pytest

from tests.test_train_e2e import TINY, env_for, make_base

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ABORTS = ("terminate called", "Fatal Python error", "Aborted", "core dumped")


def check(proc, what):
    assert proc.returncode == 0, f"{what} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert not any(a in proc.stderr for a in ABORTS), f"{what}:\n{proc.stderr[-3000:]}"


def test_train_and_eval_exit_cleanly_while_the_cores_are_busy(tmp_path, small_corpus_dir, tokenizer_dir):
    base = make_base(tmp_path, small_corpus_dir, tokenizer_dir)
    env = env_for(base)
    # One busy loop per core, at the lowest priority: they take every cycle the runs leave,
    # so the runs are preempted all the time, yet the test stays short.
    busy = [subprocess.Popen([sys.executable, "-c", "import os\nos.nice(19)\nwhile True: pass"])
            for _ in range(os.cpu_count() or 2)]
    try:
        for i in range(3):
            # the val loader of the final evaluation and the train loader are both live at exit
            proc = subprocess.run([sys.executable, "-m", "scripts.base_train", *TINY, "--num-iterations", "2",
                                   "--eval-every", "1", "--model-tag", f"load{i}"],
                                  cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
            check(proc, f"base_train run {i}")
        for i in range(3):
            proc = subprocess.run([sys.executable, "-m", "scripts.base_eval", "--model-tag", f"load{i}", "--eval",
                                   "bpb", "--device-batch-size", "2", "--split-tokens", "1024",
                                   "--device-type", "cpu"],
                                  cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
            check(proc, f"base_eval run {i}")
            assert "val bpb" in proc.stdout and "train bpb" in proc.stdout
    finally:
        for p in busy:
            p.kill()
            p.wait()
