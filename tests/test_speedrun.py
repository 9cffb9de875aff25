"""speedrun.sh's run loop (scripts/speedrun_lib.sh) at tiny size: a config that fails in
training and a run whose evaluation fails do not stop the run after them; each is recorded
with the log line that says why, the report marks them failed, and the loop returns non-zero.
A preemption signal stops the loop as resumable, and the same command continues the run.
Also the line picked from a log as the reason."""

import json
import os
import signal
import subprocess
import sys
import time

import launch
import pytest
from test_report import row, table
from test_seeds import TINY_CONFIG
from test_train_e2e import REPO, env_for, make_base

from nanochat import checkpoint_manager as ckpt
from nanochat.cluster.failure import reason
from nanochat.cluster.preempt import EXIT_PREEMPTED

# The real functions, with base_eval of one run replaced by a failing stand-in.
DRIVER = r"""
set -euo pipefail
source scripts/speedrun_lib.sh
real_launch() { python "$@"; }
launch() {
    if [ "$2" = scripts.base_eval ] && [ "$4" = t_kromhc ]; then
        echo "evaluating t_kromhc"; echo "error: simulated evaluation failure"; return 3
    fi
    real_launch "$@"
}
NPROC=1 WANDB_RUN=dummy
PLAN_ARGS=(--configs "$@" --runs-root "$NANOCHAT_BASE_DIR/runs" --gpu-check "$NANOCHAT_BASE_DIR/gpu_check.json")
TRAIN_ARGS=()
EVALS=bpb
EVAL_ARGS=(--split-tokens 512 --device-batch-size 4 --device-type cpu)
python -m scripts.plan "${PLAN_ARGS[@]}" --tsv "$NANOCHAT_BASE_DIR/plan.tsv"
status=0
run_all "$NANOCHAT_BASE_DIR/plan.tsv" || status=$?
python -m scripts.report --runs "${RUN_DIRS[@]}" --configs "$@" --out "$NANOCHAT_BASE_DIR/report"
echo "failed: ${FAILED[*]}"
exit "$status"
"""


def test_reason_is_the_line_that_says_why():
    assert reason("step 1\nerror: --depth must be positive\nbye\n") == "error: --depth must be positive"
    assert reason("Traceback (most recent call last):\n  File x\nValueError: bad\n") == "ValueError: bad"
    assert reason("step 9\nterminate called without an active exception\n") == \
        "terminate called without an active exception"
    assert reason("step 1\nstep 2\n") == "step 2" and reason("") is None


@pytest.mark.slow
def test_one_failure_does_not_stop_the_others(tmp_path, small_corpus_dir, tokenizer_dir):
    base = make_base(tmp_path, small_corpus_dir, tokenizer_dir)
    configs = []
    for name, body in (("t_bad", 'hc = "no_such_variant"\n'), ("t_kromhc", 'hc = "kromhc"\nhc_streams = 4\n'),
                       ("t_residual", 'hc = "residual"\n')):
        path = tmp_path / f"{name}.toml"
        path.write_text(TINY_CONFIG + body + f'model_tag = "{name}"\n')
        configs.append(str(path))
    env = env_for(base)
    env = launch.shell_env(env)  # `python`: forked from the test process (tests/launch.py)
    proc = subprocess.run(["bash", "-c", DRIVER, "driver", *configs], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "run 1 of 3: t_bad" in out and "run 3 of 3: t_residual" in out
    assert "failed: t_bad (training) t_kromhc (evaluation)" in out
    runs = tmp_path / "base" / "runs"
    bad = json.loads((runs / "t_bad" / "failed.json").read_text())
    assert bad["stage"] == "training" and bad["exit_status"] != 0
    assert bad["reason"].startswith("error:") and "no_such_variant" in bad["reason"]
    krom = json.loads((runs / "t_kromhc" / "failed.json").read_text())
    assert krom == {"stage": "evaluation", "exit_status": 3, "reason": "error: simulated evaluation failure",
                    "log": str(tmp_path / "base" / "logs" / "t_kromhc.eval.log")}
    assert (runs / "t_kromhc" / "summary.json").is_file()  # its training stands
    assert (runs / "t_residual" / "eval.json").is_file() and not (runs / "t_residual" / "failed.json").exists()
    readme = (tmp_path / "base" / "report" / "README.md").read_text()
    listed = table(readme.split("## Runs", 1)[1])
    assert row(listed, Run="t_kromhc")["Status"] == "failed (evaluation): error: simulated evaluation failure"
    assert row(listed, Run="t_bad")["Status"].startswith("failed (training): error:")
    assert row(listed, Run="t_residual")["Status"] == "complete"


# speedrun_lib with evaluation and diagnostics, tested elsewhere, stood in for by files that
# say they succeeded; training through the real launch.
REAL_TRAINING = r"""
set -euo pipefail
source scripts/speedrun_lib.sh
eval "lib_$(declare -f launch)"
launch() {
    if [ "$2" = scripts.base_eval ]; then
        echo '{}' > "$NANOCHAT_BASE_DIR/runs/$4/eval.json"
        echo '{}' > "$NANOCHAT_BASE_DIR/runs/$4/hc_stats.json"
        return 0
    fi
    lib_launch "$@"
}
"""
# The real loop.
PREEMPT_DRIVER = REAL_TRAINING + r"""
NPROC=$1 WANDB_RUN=dummy
shift
PLAN_ARGS=(--configs "$@" --runs-root "$NANOCHAT_BASE_DIR/runs" --gpu-check "$NANOCHAT_BASE_DIR/gpu_check.json")
TRAIN_ARGS=(--device-type cpu)
EVALS=bpb EVAL_ARGS=()
python -m scripts.plan "${PLAN_ARGS[@]}" --tsv "$NANOCHAT_BASE_DIR/plan.tsv"
run_all "$NANOCHAT_BASE_DIR/plan.tsv"
"""


@pytest.mark.slow
def test_a_preempted_mode_stops_resumably_and_the_same_command_continues(tmp_path, small_corpus_dir, tokenizer_dir):
    """SIGUSR1 to the loop (as SLURM's --signal=B:USR1 reaches a batch script that passes it
    on) while torchrun trains on 2 ranks: the workers save, the loop exits with status 75 and
    records no failure. Run again on one process (the requeued job got a smaller node), the
    run resumes from that checkpoint and finishes."""
    base = make_base(tmp_path, small_corpus_dir, tokenizer_dir)
    config = tmp_path / "t_pre.toml"
    config.write_text(TINY_CONFIG.replace("num_iterations = 3", "num_iterations = 24")
                      + 'hc = "kromhc"\nmodel_tag = "t_pre"\n')
    env = env_for(base)
    env = launch.shell_env(env)  # `python`: forked from the test process (tests/launch.py)
    run = os.path.join(base, "runs", "t_pre")
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        driver = subprocess.Popen(["bash", "-c", PREEMPT_DRIVER, "driver", "2", str(config)], cwd=REPO, env=env,
                                  stdout=out, stderr=err)
        metrics, deadline = os.path.join(run, "metrics.jsonl"), time.time() + 180
        while driver.poll() is None and time.time() < deadline and not (
                os.path.exists(metrics) and open(metrics).read().count('"train"') >= 2):
            time.sleep(0.05)
        driver.send_signal(signal.SIGUSR1)
        driver.wait(timeout=180)
    logs = (tmp_path / "out").read_text() + (tmp_path / "err").read_text()
    assert driver.returncode == EXIT_PREEMPTED, logs[-3000:]
    assert "speedrun: preempted (SIGUSR1, during the training of t_pre); run the same command again" in logs
    assert not os.path.exists(os.path.join(run, "failed.json")) and not os.path.exists(os.path.join(run, "summary.json"))
    step = ckpt.latest_step(run)
    assert 2 <= step < 24 and json.load(open(os.path.join(run, "preempted.json")))["step"] == step
    train_log = open(os.path.join(base, "logs", "t_pre.train.log")).read()
    assert "SIGUSR1 received" in train_log and f"saved the checkpoint of step {step} of 24" in train_log

    proc = subprocess.run(["bash", "-c", PREEMPT_DRIVER, "driver", "1", str(config)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    train_log = open(os.path.join(base, "logs", "t_pre.train.log")).read()
    assert "resuming on 1 ranks a checkpoint written by 2" in train_log and f"resumed from step {step}" in train_log
    assert json.load(open(os.path.join(run, "summary.json")))["complete"]
    records = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(24))


# The lm-eval step of run_all for a run already trained and evaluated: scripts.lm_eval stood in
# for by `launch` (its exit status from LM_EVAL_STATUS), scripts.plan's progress line stubbed.
LM_EVAL_DRIVER = r"""
set -euo pipefail
source scripts/speedrun_lib.sh
launch() { echo "launched: $*" >> "$NANOCHAT_BASE_DIR/launched"; echo "error: simulated lm-eval failure"; \
           return "$LM_EVAL_STATUS"; }
python() { if [ "$2" = scripts.plan ]; then echo "run 1 of 1"; else command python "$@"; fi; }
NPROC=1 WANDB_RUN=dummy PLAN_ARGS=() TRAIN_ARGS=() EVALS=bpb EVAL_ARGS=()
LM_EVAL_ARGS=(--tasks "$TASKS" --include-path "$TASK_DIR")
lm_eval_ready
echo "LM_EVAL=$LM_EVAL"
status=0
run_all "$NANOCHAT_BASE_DIR/plan.tsv" || status=$?
echo "failed: ${FAILED[*]}"
exit "$status"
"""


def lm_eval_driver(tmp_path, tasks, status):
    base = tmp_path / "base"
    run_dir = base / "runs" / "t_done"
    run_dir.mkdir(parents=True)
    for name in ("summary.json", "eval.json", "hc_stats.json"):
        (run_dir / name).write_text("{}")
    (base / "plan.tsv").write_text("configs/none.toml\tt_done\tall\n")
    task_dir = tmp_path / "tasks"
    task_dir.mkdir(exist_ok=True)
    (task_dir / "local.yaml").write_text(f"task: local\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                                         f"    test: {task_dir / 'local.jsonl'}\n" + LM_EVAL_TASK)
    (task_dir / "local.jsonl").write_text('{"query": "a", "choices": ["b", "c"], "gold": 0}\n')
    (task_dir / "hub.yaml").write_text("task: hub\ndataset_path: allenai/ai2_arc\ndataset_name: ARC-Easy\n"
                                       + LM_EVAL_TASK)
    # offline: conftest.py sets HF_HUB_OFFLINE and HF_DATASETS_OFFLINE for the session and its subprocesses
    env = dict(os.environ, NANOCHAT_BASE_DIR=str(base), LM_EVAL="1", LM_EVAL_STATUS=str(status), TASKS=tasks,
               TASK_DIR=str(task_dir))
    env = launch.shell_env(env)  # `python`: forked from the test process (tests/launch.py)
    proc = subprocess.run(["bash", "-c", LM_EVAL_DRIVER], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    launched = base / "launched"
    return proc, run_dir, launched.read_text() if launched.exists() else ""


LM_EVAL_TASK = ("test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{query}}\"\n"
                "doc_to_choice: choices\ndoc_to_target: gold\n")


def test_lm_eval_runs_after_core_and_a_failure_is_recorded(tmp_path):
    pytest.importorskip("lm_eval", reason="needs the eval extra: pip install -e '.[eval]'")
    proc, run_dir, launched = lm_eval_driver(tmp_path, "local", status=4)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "LM_EVAL=1" in out and "failed: t_done (lm-eval)" in out, out
    assert launched.startswith("launched: -m scripts.lm_eval --model-tag t_done --tasks local --include-path")
    failure = json.loads((run_dir / "failed.json").read_text())
    assert failure["stage"] == "lm-eval" and failure["reason"] == "error: simulated lm-eval failure"


def test_without_the_task_data_speedrun_says_so_and_goes_on(tmp_path):
    pytest.importorskip("lm_eval", reason="needs the eval extra: pip install -e '.[eval]'")
    proc, run_dir, launched = lm_eval_driver(tmp_path, "hub", status=4)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "speedrun: LM_EVAL=1 but the lm-eval task data could not be loaded (no network?)" in out
    assert "LM_EVAL=0" in out and launched == "" and not (run_dir / "failed.json").exists()


def dry_run(tmp_path, mode, **env):
    """`bash speedrun.sh MODE --dry-run` for 8 GPUs, without the memory estimates (test_plan.py's)."""
    full = dict(os.environ, NANOCHAT_BASE_DIR=str(tmp_path / "base"), NPROC="8", PLAN_MEMORY="0", **env)
    full["PATH"] = os.path.dirname(sys.executable) + os.pathsep + full["PATH"]
    proc = subprocess.run(["bash", "speedrun.sh", mode, "--dry-run"], cwd=REPO, env=full, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tsv = (tmp_path / "base" / f"speedrun_{mode}.tsv").read_text().splitlines()
    return proc.stdout, [line.split("\t")[0] for line in tsv]


def test_frontier_trains_the_runs_its_runs_are_read_against(tmp_path):
    """The frontier's configs, then what the plan derives from the registry for them
    (scripts.plan --baselines-of), each once."""
    from glob import glob

    from nanochat.planning import plan
    _, configs = dry_run(tmp_path, "frontier", PLAN_GPU="H100")
    frontier = sorted(glob("configs/frontier/*.toml", root_dir=REPO))
    assert configs[:len(frontier)] == frontier
    assert configs[len(frontier):] == plan.baseline_configs([os.path.join(REPO, c) for c in frontier])[0]
    for config in frontier:  # every run's comparison is trained
        assert plan.variant_config(plan.read_against(os.path.join(REPO, config)), 12) in configs, config
    assert "configs/paper/d12_residual.toml" in configs and len(set(configs)) == len(configs)


def test_the_plan_for_a_gpu_named_as_the_readme_names_it(tmp_path):
    """PLAN_GPU=H200 (the README's name; nvidia-smi says "NVIDIA H200") prices the runs the
    committed measurement made from it, and their unmeasured family members from KromHC's."""
    from nanochat import measurements
    device = json.loads(measurements.GPU_CHECK.read_text())["env"]["device_name"]
    out, _ = dry_run(tmp_path, "paper-d12", PLAN_GPU=device.removeprefix("NVIDIA ").lower())
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("paper_d12_")}
    source = f"(docs/gpu_check.json, {device})"
    assert source in rows["paper_d12_kromhc"] and "≈" not in rows["paper_d12_kromhc"]
    for tag in ("paper_d12_hc", "paper_d12_mhc", "paper_d12_mhc_lite"):
        assert f"from kromhc {source}" in rows[tag] and "≈" in rows[tag], rows[tag]
