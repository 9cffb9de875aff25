"""speedrun.sh on the 2026-07 trunk, as dry runs: the gpt2 mode plans nanochat's record run for
residual and KromHC (trunk 2026-07, fp8) with its GPU-hours; TRUNK=2026-07 moves the ladder's, the
grid's and the frontier's runs to that trunk under their own tags; TRUNK elsewhere is refused in one
line."""

import os
import subprocess
import sys

from test_train_e2e import REPO

H100 = "NVIDIA H100 80GB HBM3"


def speedrun(tmp_path, mode, **env):
    """`bash speedrun.sh MODE --dry-run` for 8 H100s, without the memory estimates (test_plan.py's):
    (the process, the run list's rows)."""
    full = dict(os.environ, NANOCHAT_BASE_DIR=str(tmp_path / "base"), NPROC="8", PLAN_GPU=H100, PLAN_MEMORY="0",
                **env)
    full["PATH"] = os.path.dirname(sys.executable) + os.pathsep + full["PATH"]
    proc = subprocess.run(["bash", "speedrun.sh", mode, "--dry-run"], cwd=REPO, env=full, capture_output=True,
                          text=True, timeout=120)
    tsv = tmp_path / "base" / f"speedrun_{mode}.tsv"
    return proc, [line.split("\t") for line in tsv.read_text().splitlines()] if tsv.is_file() else []


def flag(row, name):
    return row[row.index(name) + 1]


def test_gpt2_plans_the_record_run_for_residual_and_kromhc(tmp_path):
    proc, rows = speedrun(tmp_path, "gpt2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    assert [r[:3] for r in rows] == [["configs/gpt2/d24_residual.toml", "gpt2_d24_residual", "all"],
                                     ["configs/gpt2/d24_kromhc.toml", "gpt2_d24_kromhc", "all"]]
    assert next(line for line in out if "runs to train" in line).startswith("2 of 2 runs to train, on 8 x GPU: about ")
    for tag, variant in (("gpt2_d24_residual", "residual"), ("gpt2_d24_kromhc", "kromhc")):
        row = next(line.split() for line in out if line.startswith(tag + " "))
        assert row[1:3] == [variant, "24"] and float(row[-1]) > 0  # its GPU-hours
    assert "trunk 2026-07 (nanochat/trunks.py" in proc.stdout and "fp8 (--fp8" in proc.stdout
    assert next(line for line in out if line.startswith("fp8")).count("gpt2_d24_") == 2
    assert "speedrun: plan only" in proc.stdout and not (tmp_path / "base" / "base_data_climbmix").exists()


def test_trunk_moves_the_ladders_runs(tmp_path):
    proc, rows = speedrun(tmp_path, "ladder", TRUNK="2026-07", VARIANTS="residual,kromhc", LADDER_DEPTHS="6 8")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [r[1] for r in rows] == ["ladder_d6_residual_t2607", "ladder_d8_residual_t2607", "ladder_d6_kromhc_t2607",
                                    "ladder_d8_kromhc_t2607"]
    for row in rows:
        assert (flag(row, "--trunk"), flag(row, "--total-batch-size"), flag(row, "--target-param-data-ratio"),
                flag(row, "--model-tag")) == ("2026-07", "auto", "20.0", row[1])


def test_trunk_moves_the_grids_runs(tmp_path):
    """The iso-FLOP grid on 2026-07: its own tags (so that scripts.isoflop --trunk tells the
    trunks' grids apart), each run still spending its budget."""
    proc, rows = speedrun(tmp_path, "isoflop", TRUNK="2026-07", VARIANTS="residual", LADDER_DEPTHS="6 8",
                          FLOPS_BUDGETS="1e18")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [r[1] for r in rows] == ["isoflop_1e18_d6_residual_t2607", "isoflop_1e18_d8_residual_t2607"]
    for row in rows:
        assert (flag(row, "--trunk"), flag(row, "--target-flops"), flag(row, "--model-tag")) == \
            ("2026-07", "1e+18", row[1])


def test_trunk_moves_the_frontiers_runs_and_those_they_are_read_against(tmp_path):
    proc, rows = speedrun(tmp_path, "frontier", TRUNK="2026-07")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert rows and all(r[1].endswith("_t2607") and flag(r, "--trunk") == "2026-07" for r in rows)
    for row in rows:  # the trunk's batch and horizon, not the configs' 7000 steps of 2^19 tokens
        assert [flag(row, f"--{name}") for name in ("total-batch-size", "target-param-data-ratio", "num-iterations")] \
            == ["auto", "12.0", "-1"]
    assert "configs/paper/d12_residual.toml" in [r[0] for r in rows]  # the runs they are read against, moved too


def test_trunk_elsewhere_is_refused_in_one_line(tmp_path):
    proc, _ = speedrun(tmp_path, "paper-d12", TRUNK="2026-07")
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "speedrun: error: TRUNK=2026-07 applies to the ladder, isoflop and frontier modes only; unset it for paper-d12"]
    proc, _ = speedrun(tmp_path, "ladder", TRUNK="2026-7")
    assert proc.returncode == 2 and "unknown TRUNK '2026-7'; use 2026-01" in proc.stderr
