"""The plan of a speedrun mode: runs per seed with their flags, progress read from run
directories, throughput from finished runs or gpu_check.json, GPU-hours and the ETA line."""

import json

import pytest

from nanochat import plan
from scripts import plan as plan_cli


def write_config(directory, tag, hc="mhc", depth=12, steps=100, batch=1000, **extra):
    path = directory / f"{tag}.toml"
    lines = [f'model_tag = "{tag}"', f'hc = "{hc}"', f"depth = {depth}", f"num_iterations = {steps}",
             f"total_batch_size = {batch}"] + [f"{k} = {v}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def finish(runs_root, tag, hc, depth, tok_per_sec, world_size=1, hc_streams=4):
    run = runs_root / tag
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({
        "complete": True, "step": 100, "hc": hc, "depth": depth, "hc_streams": hc_streams,
        "tok_per_sec": tok_per_sec, "world_size": world_size, "device": "cuda"}))


def test_runs_per_seed_with_their_flags(tmp_path):
    a = write_config(tmp_path, "a", seed=7)
    b = write_config(tmp_path, "b", hc="residual")
    runs = plan.plan_runs([a, b], seeds=3)
    assert [r.tag for r in runs] == ["a", "b", "a_s1", "b_s1", "a_s2", "b_s2"]  # a full table after each pass
    assert runs[0].flags == [] and runs[1].flags == []  # seed 0 is the config as written
    assert runs[2].flags == ["--model-tag", "a_s1", "--seed", "8"]
    assert runs[5].flags == ["--model-tag", "b_s2", "--seed", str(plan.DEFAULT_SEED + 2)]
    both = plan.plan_runs([a], seeds=2, vary_data_order=True)
    assert both[1].tag == "a_s1_data" and both[1].flags[-2:] == ["--data-seed", "1"]
    assert (runs[1].n, runs[0].n, runs[0].tokens) == (1, 4, 100 * 1000)
    with pytest.raises(ValueError):
        plan.plan_runs([a], seeds=0)


def test_progress_from_run_directories(tmp_path):
    a = write_config(tmp_path, "a")
    root = tmp_path / "runs"
    finish(root, "a", "mhc", 12, 1000.0)
    partial = root / "a_s1"
    partial.mkdir()
    rows = [{"step": s, "kind": "train"} for s in range(40)] + [{"step": 40, "kind": "val"}]
    (partial / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4')
    runs = plan.plan_runs([a], seeds=3, runs_root=root)
    assert [(r.finished, r.done_steps) for r in runs] == [(True, 100), (False, 40), (False, 0)]
    assert [r.tokens_left for r in runs] == [None, 60 * 1000, 100 * 1000]


def test_gpu_hours_from_finished_runs_and_gpu_check(tmp_path):
    a = write_config(tmp_path, "a")  # mhc D=12
    k = write_config(tmp_path, "k", hc="kromhc")
    d6 = write_config(tmp_path, "d6", hc="kromhc", depth=6)
    root = tmp_path / "runs"
    finish(root, "a", "mhc", 12, 8000.0, world_size=8)  # 1000 tokens/s per GPU
    measured = plan.measured_from_runs(root)
    runs = plan.plan_runs([a, k, d6], seeds=2, runs_root=root)
    # a_s1: 100 steps x 1000 tokens on 4 GPUs at 1000 tokens/s each.
    assert plan.seconds_left(runs[3], measured, nproc=4) == pytest.approx(100 * 1000 / 4000)
    assert plan.find_throughput(runs[1], measured)[1] is True  # KromHC priced from mHC's run: marked ≈
    assert plan.seconds_left(runs[2], measured, 4) is None  # nothing measured at D=6
    text = plan.plan_table(runs, measured, nproc=4)
    assert "cannot estimate d6, d6_s1" in text and "finished" in text
    hours = 3 * 100 * 1000 / 1000 / 3600  # a_s1, k, k_s1: GPU-seconds = tokens / per-GPU rate
    assert f"about {hours:.2f} GPU-hours" in text
    assert plan.progress_line(runs, 3, measured, 4).startswith("run 3 of 6: d6; training left for the mode: at least")

    check = tmp_path / "gpu_check.json"
    entry = dict(label="kromhc", variant="kromhc", depth=6, n=4, tokens_per_s=3000.0, batch=32, median_ms=1.0)
    model = [entry,
             dict(entry, label="mhc", variant="mhc", depth=12, tokens_per_s=500),
             dict(entry, label="residual (full causal)", variant="residual", tokens_per_s=9e9),  # a reference row
             dict(entry, depth="six"),  # malformed: skipped
             "not an entry"]
    check.write_text(json.dumps({"profile": "gpu", "model": model}))
    from_check = plan.read_gpu_check(check)
    assert [(m.variant, m.depth, m.per_gpu) for m in from_check] == [("kromhc", 6, 3000.0), ("mhc", 12, 500.0)]
    assert plan.seconds_left(runs[2], from_check, 1) == pytest.approx(100 * 1000 / 3000)
    check.write_text(json.dumps({"profile": "tiny", "model": model}))  # CPU toy sizes: no estimate
    assert plan.read_gpu_check(check) == []
    check.write_text("[not json")
    assert plan.read_gpu_check(check) == []


def test_cli_writes_the_run_list_and_refuses_bad_input(tmp_path, capsys):
    a = write_config(tmp_path, "a")
    tsv = tmp_path / "plan.tsv"
    root = tmp_path / "runs"
    plan_cli.main(["--configs", a, "--seeds", "2", "--runs-root", str(root), "--gpu-check", str(tmp_path / "none.json"),
                   "--tsv", str(tsv)])
    assert tsv.read_text().splitlines() == [f"{a}\ta", f"{a}\ta_s1\t--model-tag\ta_s1\t--seed\t43"]
    assert "their cost cannot be estimated" in capsys.readouterr().out
    plan_cli.main(["--configs", a, "--seeds", "2", "--runs-root", str(root), "--gpu-check", "x", "--progress", "2"])
    assert capsys.readouterr().out.startswith("run 2 of 2: a_s1")
    for bad in (["--seeds", "0"], ["--seeds", "two"], ["--progress", "3"]):
        with pytest.raises(SystemExit) as e:
            plan_cli.main(["--configs", a, "--runs-root", str(root), "--gpu-check", "x", *bad])
        assert e.value.code != 0
    with pytest.raises(SystemExit, match="error: config .* not found"):
        plan_cli.main(["--configs", str(tmp_path / "missing.toml"), "--runs-root", str(root), "--gpu-check", "x"])


def test_format_duration():
    assert [plan.format_duration(s) for s in (5, 754, 4 * 3600 + 300, None)] == ["5s", "12m34s", "4h05m", "—"]
