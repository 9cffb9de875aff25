"""speedrun.sh's compute-multiplier modes: `ladder` and `isoflop` print their plan with the
GPU-hours (an assumed MFU where nothing was measured) and stop under PLAN_ONLY=1 or --dry-run;
and the same functions (scripts/speedrun_lib.sh: study_plan_args, run_all, study_report) train
a tiny ladder and a tiny grid on CPU and end in scripts.compare's and scripts.isoflop's JSON
(skipping finished runs and resuming interrupted ones is run_all's, tested in test_speedrun.py)."""

import json
import os
import subprocess
import sys

import launch
import pytest
from test_seeds import TINY_CONFIG
from test_speedrun import REAL_TRAINING
from test_train_e2e import REPO, env_for, make_base

H100 = "NVIDIA H100 80GB HBM3"


def speedrun(tmp_path, *args, **env):
    # PLAN_MEMORY=0: the plan's memory estimates (test_plan.py) would trace each of the 24 models
    full = dict(os.environ, NANOCHAT_BASE_DIR=str(tmp_path / "base"), NPROC="8", PLAN_GPU=H100, PLAN_MEMORY="0",
                **env)
    full["PATH"] = os.path.dirname(sys.executable) + os.pathsep + full["PATH"]
    return subprocess.run(["bash", "speedrun.sh", *args], cwd=REPO, env=full, capture_output=True, text=True,
                          timeout=300)


def test_plan_only_prints_the_ladder_and_the_grid_with_their_gpu_hours(tmp_path):
    proc = speedrun(tmp_path, "ladder", PLAN_ONLY="1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    plan_line = next(line for line in out.splitlines() if "runs to train" in line)
    assert plan_line.startswith("24 of 24 runs to train, on 8 x GPU: about ") and "(assumed, see below)" in plan_line
    for tag in ("ladder_d6_residual", "ladder_d12_kromhc", "ladder_d16_mhc_lite", "ladder_d10_mhc"):
        assert tag in out
    assert f"assumed: 40% MFU of the {H100}'s peak bf16 989 TFLOP/s" in out
    assert "speedrun: plan only" in out and not (tmp_path / "base" / "base_data").exists()  # nothing downloaded
    tsv = (tmp_path / "base" / "speedrun_ladder.tsv").read_text().splitlines()
    assert tsv[0].split("\t")[:3] == ["configs/paper/d12_residual.toml", "ladder_d6_residual", "all"]

    proc = speedrun(tmp_path, "isoflop", "--dry-run", VARIANTS="residual,kromhc", LADDER_DEPTHS="6 8 10",
                    FLOPS_BUDGETS="1e17 1e18", PLAN_MFU="0.3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "12 of 12 runs to train, on 8 x GPU" in proc.stdout and "isoflop_1e18_d8_kromhc" in proc.stdout
    assert "assumed: 30% MFU" in proc.stdout
    rows = [line.split("\t") for line in (tmp_path / "base" / "speedrun_isoflop.tsv").read_text().splitlines()]
    assert {r[2] for r in rows} == {"train"} and "--target-flops" in rows[0]

    bad = speedrun(tmp_path, "ladder", "--dry-run", VARIANTS="residual,nonesuch")
    assert bad.returncode != 0 and "error: no config for variant 'nonesuch'" in bad.stderr
    assert "kromhc" in bad.stderr.splitlines()[-1]
    bad = speedrun(tmp_path, "ladder", "--dryrun")
    assert bad.returncode == 2 and "unknown argument '--dryrun'" in bad.stderr


# The real functions; evaluation and diagnostics of the ladder's runs, tested elsewhere, only
# have to succeed here (the grid's runs are training-only anyway), and the progress line.
DRIVER = REAL_TRAINING + r"""
# The "run k of N" line (test_plan.py's) stubbed: it would start one more process per run.
python() { if [[ " $* " == *" --progress "* ]]; then echo "run $*"; else command python "$@"; fi; }
NPROC=1 WANDB_RUN=dummy TRAIN_ARGS=(--device-type cpu) EVALS=bpb EVAL_ARGS=()
MODE=$1
PLAN_ARGS=(--runs-root "$NANOCHAT_BASE_DIR/runs" --gpu-check "$NANOCHAT_BASE_DIR/gpu_check.json")
study_plan_args "$MODE"
python -m scripts.plan "${PLAN_ARGS[@]}" --tsv "$NANOCHAT_BASE_DIR/$MODE.tsv"
run_all "$NANOCHAT_BASE_DIR/$MODE.tsv"
study_report "$MODE"
"""


@pytest.mark.slow
def test_ladder_and_grid_train_on_cpu_and_end_in_their_summaries(tmp_path, small_corpus_dir, tokenizer_dir):
    base = make_base(tmp_path, small_corpus_dir, tokenizer_dir)
    configs = {}
    for variant, extra in (("residual", ""), ("kromhc", "hc_streams = 4\n")):
        path = tmp_path / f"d2_{variant}.toml"
        path.write_text(TINY_CONFIG + f'hc = "{variant}"\n{extra}model_tag = "t_{variant}"\n')
        configs[variant] = str(path)
    env = env_for(base)
    env = launch.shell_env(env)  # `python`: forked from the test process (tests/launch.py)
    env["REPORT_DIR"] = str(tmp_path / "report")

    def drive(mode, **extra):
        proc = subprocess.run(["bash", "-c", DRIVER, "driver", mode], cwd=REPO, env={**env, **extra},
                              capture_output=True, text=True, timeout=600)
        return proc.returncode, proc.stdout + proc.stderr

    # Ladder: residual and KromHC at depths 1 and 2, 0.05 tokens per scaling parameter (vocab 512:
    # 28,672 and 131,072 scaling params, so 2 and 12 steps of 512 tokens).
    ladder = dict(VARIANTS=f"{configs['residual']},{configs['kromhc']}", LADDER_DEPTHS="1 2", LADDER_RATIO="0.05")
    code, out = drive("ladder", **ladder)
    assert code == 0, out[-4000:]
    runs = tmp_path / "base" / "runs"
    summaries = {t: json.loads((runs / t / "summary.json").read_text())
                 for t in ("ladder_d1_residual", "ladder_d2_residual", "ladder_d1_kromhc", "ladder_d2_kromhc")}
    assert [s["num_iterations"] for s in summaries.values()] == [2, 12, 2, 12]
    assert summaries["ladder_d2_kromhc"]["depth"] == 2 and summaries["ladder_d2_kromhc"]["hc"] == "kromhc"
    assert (runs / "ladder_d2_kromhc" / "eval.json").is_file() and (runs / "ladder_d2_kromhc" / "hc_stats.json").is_file()
    result = json.loads((tmp_path / "report" / "compare.json").read_text())
    assert [row["depth"] for row in result["variants"]["kromhc"]["per_depth"]] == [1, 2]
    assert (tmp_path / "report" / "compare" / "compare.md").is_file()

    # Grid: residual at depths 1-3 for one budget of 2e9 FLOPs, training only.
    code, out = drive("isoflop", VARIANTS=configs["residual"], LADDER_DEPTHS="1 2 3", FLOPS_BUDGETS="2e9")
    assert code == 0, out[-4000:]
    grid = [runs / f"isoflop_2e9_d{d}_residual" for d in (1, 2, 3)]
    assert all((g / "summary.json").is_file() and not (g / "eval.json").exists() for g in grid)
    frontier = json.loads((tmp_path / "report" / "isoflop.json").read_text())["variants"]["residual"]["frontier"]
    assert len(frontier) == 1 and frontier[0]["budget"] == 2e9 and frontier[0]["sizes"] == 3
