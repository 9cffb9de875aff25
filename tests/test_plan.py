"""The plan of a speedrun mode: runs per seed with their flags, progress read from run
directories, throughput from finished runs or gpu_check.json, GPU-hours and the ETA line."""

import json

import pytest

from nanochat import gpus, measurements
from nanochat.planning import plan, sizing, throughput
from nanochat.report import format as report_format
from scripts import plan as plan_cli


def write_config(directory, tag, hc="mhc", depth=12, steps=100, batch=1000, **extra):
    path = directory / f"{tag}.toml"
    lines = [f'model_tag = "{tag}"', f'hc = "{hc}"', f"depth = {depth}", f"num_iterations = {steps}",
             f"total_batch_size = {batch}"] + [f"{k} = {v}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def finish(runs_root, tag, hc, depth, tok_per_sec, world_size=1, hc_streams=4, device="cuda", device_name=None):
    run = runs_root / tag
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({
        "complete": True, "step": 100, "hc": hc, "depth": depth, "hc_streams": hc_streams,
        "tok_per_sec": tok_per_sec, "world_size": world_size, "device": device, "device_name": device_name}))


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
    d6 = write_config(tmp_path, "d6", hc="residual", depth=6)  # no relative of it measured
    root = tmp_path / "runs"
    finish(root, "a", "mhc", 12, 8000.0, world_size=8)  # 1000 tokens/s per GPU
    measured = throughput.measured_from_runs(root)
    runs = plan.plan_runs([a, k, d6], seeds=2, runs_root=root)
    # a_s1: 100 steps x 1000 tokens on 4 GPUs at 1000 tokens/s each.
    assert plan.seconds_left(runs[3], measured, nproc=4) == pytest.approx(100 * 1000 / 4000)
    assert throughput.find_throughput(runs[1], measured)[1] == "≈"  # KromHC priced from mHC's run: marked ≈
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
    from_check = throughput.read_gpu_check(check)
    assert [(m.variant, m.depth, m.per_gpu) for m in from_check] == [("kromhc", 6, 3000.0), ("mhc", 12, 500.0)]
    assert plan.seconds_left(runs[2], from_check, 1) == pytest.approx(100 * 1000 / 3000)
    check.write_text(json.dumps({"profile": "tiny", "model": model}))  # CPU toy sizes: no estimate
    assert throughput.read_gpu_check(check) == []
    check.write_text("[not json")
    assert throughput.read_gpu_check(check) == []


def test_gpu_check_kernel_rows_price_their_own_backend(tmp_path):
    """The kernels section's whole-model rows count as measurements of their backend: a torch
    run is priced from the torch row, never from a fused one."""
    k = write_config(tmp_path, "k", hc="kromhc")
    f = write_config(tmp_path, "f", hc="kromhc", hc_kernels="\"fused\"")
    r = write_config(tmp_path, "r", hc="residual")
    runs = plan.plan_runs([k, f, r], seeds=1)
    check = tmp_path / "gpu_check.json"
    rows = [dict(run="model D12", variant="residual", kernels="torch", tokens_per_s=4000.0),
            dict(run="model D12", variant="kromhc", kernels="fused", tokens_per_s=2500.0),
            dict(run="model D12", variant="kromhc", kernels="liger"),  # failed: no rate, skipped
            dict(run="layer", variant="kromhc", kernels="torch", tokens_per_s=9e9)]  # one layer: not a model
    check.write_text(json.dumps({"profile": "gpu", "kernels": {"rows": rows}}))
    measured = throughput.read_gpu_check(check)
    assert [(m.variant, m.depth, m.n, m.kernels) for m in measured] == [("residual", 12, 1, "torch"),
                                                                        ("kromhc", 12, 4, "fused")]
    assert throughput.find_throughput(runs[1], measured) == (measured[1], "measured")
    # the torch run: no torch measurement of its family, so residual's, marked as assumed
    assert throughput.find_throughput(runs[0], measured) == (measured[0], "another")
    assert throughput.rate_cell(measured[0], "another", runs[0]) == "assumed 4.00K as residual (gpu_check.json)"
    assert throughput.find_throughput(runs[2], measured) == (measured[0], "measured")


def test_the_committed_measurement_prices_its_runs_and_their_family_on_its_gpu(tmp_path, capsys):
    k = write_config(tmp_path, "k", hc="kromhc")
    m = write_config(tmp_path, "m", hc="mhc")
    check = tmp_path / "gpu_check.json"
    rows = [dict(run="model D12", variant="residual", kernels="torch", tokens_per_s=4000.0),
            dict(run="model D12", variant="kromhc", kernels="torch", tokens_per_s=2000.0)]
    check.write_text(json.dumps({"profile": "gpu", "env": {"device_name": "NVIDIA H200"}, "kernels": {"rows": rows}}))
    assert throughput.committed_measurement("NVIDIA H100 80GB HBM3", check) == []  # another GPU's numbers: none
    measured = throughput.committed_measurement("nvidia h200", check)
    assert {m.source for m in measured} == {"docs/gpu_check.json, NVIDIA H200"}
    runs = plan.plan_runs([k, m], seeds=1)
    assumption = throughput.assumption_for("NVIDIA H200")
    assert throughput.find_throughput(runs[0], measured, assumption) == (measured[1], "measured")
    # mHC, not measured: from KromHC's, its family's member on its backend, never residual's
    assert throughput.find_throughput(runs[1], measured, assumption) == (measured[1], "≈")
    text = plan.plan_table(runs, measured, 8, assumption=assumption)
    assert "measured in docs/gpu_check.json, NVIDIA H200: kromhc D12, residual D12" in text
    assert "≈ 2.00K from kromhc (docs/gpu_check.json, NVIDIA H200)" in text
    assert "assumed" not in text.splitlines()[0]
    # the committed file itself was measured on a GPU and names it
    committed = json.loads(measurements.GPU_CHECK.read_text())
    assert throughput.committed_measurement(committed["env"]["device_name"])


def test_cli_writes_the_run_list_and_refuses_bad_input(tmp_path, capsys):
    a = write_config(tmp_path, "a")
    tsv = tmp_path / "plan.tsv"
    root = tmp_path / "runs"
    plan_cli.main(["--configs", a, "--seeds", "2", "--runs-root", str(root), "--gpu-check", str(tmp_path / "none.json"),
                   "--tsv", str(tsv)])
    assert tsv.read_text().splitlines() == [f"{a}\ta\tall", f"{a}\ta_s1\tall\t--model-tag\ta_s1\t--seed\t43"]
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
    assert [report_format.format_duration(s) for s in (5, 754, 4 * 3600 + 300, None)] == ["5s", "12m34s", "4h05m", "—"]


def test_ladder_and_isoflop_runs_are_derived_from_their_configs(tmp_path):
    """Each config at each depth under its own tag, the horizon flags base_train reads, and the
    steps base_train would compute (num_iterations_for on the model of those settings)."""
    k = write_config(tmp_path, "d12_kromhc", hc="kromhc", vocab_size=512, max_seq_len=64, head_dim=32)
    r = write_config(tmp_path, "d12_residual", hc="residual", vocab_size=512, max_seq_len=64, head_dim=32)
    ladder = plan.plan_runs(plan.ladder_specs([r, k], [2, 4], ratio=20), seeds=2)
    assert [x.tag for x in ladder[:4]] == ["ladder_d2_residual", "ladder_d4_residual", "ladder_d2_kromhc",
                                          "ladder_d4_kromhc"]
    assert ladder[1].flags == ["--depth", "4", "--num-iterations", "-1", "--target-flops", "-1.0",
                               "--target-param-data-ratio", "20.0", "--model-tag", "ladder_d4_residual"]
    assert ladder[5].tag == "ladder_d4_residual_s1" and ladder[5].flags[-4:] == [
        "--model-tag", "ladder_d4_residual_s1", "--seed", str(plan.DEFAULT_SEED + 1)]
    assert ladder[1].steps is None and ladder[1].depth == 4 and not ladder[1].train_only

    import torch

    from nanochat.gpt import GPT
    from nanochat.train_config import model_config_for, parse_args
    args = parse_args(["--config", r, "--depth", "4"])
    with torch.device("meta"):
        model = GPT(model_config_for(args, 512))
    sizing.resolve(ladder[1])
    assert ladder[1].steps == int(20 * model.num_scaling_params()) // 1000
    assert ladder[1].flops_per_token == model.estimate_flops()
    assert ladder[1].flops == ladder[1].steps * 1000 * model.estimate_flops()

    grid = plan.plan_runs(plan.isoflop_specs([k], [2, 4], [2e9, 6.5e10], train_only=True))
    assert [x.tag for x in grid] == ["isoflop_2e9_d2_kromhc", "isoflop_2e9_d4_kromhc", "isoflop_6.5e10_d2_kromhc",
                                     "isoflop_6.5e10_d4_kromhc"]
    assert grid[3].train_only and grid[3].flags[4:8] == ["--target-flops", "65000000000.0",
                                                         "--target-param-data-ratio", "-1.0"]
    for run in grid:  # every run of a budget spends it, to one step
        sizing.resolve(run)
        assert abs(run.flops - float(run.flags[5])) <= run.flops_per_token * run.batch / 2
    with pytest.raises(ValueError, match="share the run directory ladder_d2_kromhc"):
        plan.plan_runs(plan.ladder_specs([k, k], [2], ratio=20))


def test_gpu_hours_from_an_assumed_mfu_where_nothing_was_measured(tmp_path):
    """H100: 989e12 FLOP/s dense bf16; at 40 % MFU a run costs tokens x FLOPs per token /
    (0.4 x 989e12) GPU-seconds, labelled as an assumption; a measurement wins over it."""
    k = write_config(tmp_path, "d12_kromhc", hc="kromhc", vocab_size=512, max_seq_len=64, head_dim=32)
    runs = plan.plan_runs(plan.ladder_specs([k], [2, 4], ratio=20), runs_root=tmp_path / "runs")
    h100 = throughput.assumption_for("NVIDIA H100 80GB HBM3")
    assert (h100.peak, h100.mfu) == (989e12, 0.4)
    assert throughput.assumption_for("Some Future GPU") is None and throughput.assumption_for("") is None
    gpu_seconds = [sizing.resolve(r).flops / (0.4 * 989e12) for r in runs]
    assert plan.seconds_left(runs[0], [], 8, h100) == pytest.approx(gpu_seconds[0] / 8)
    text = plan.plan_table(runs, [], 8, assumption=h100)
    assert text.splitlines()[0] == (f"2 of 2 runs to train, on 8 x GPU: about {sum(gpu_seconds) / 3600:.2f} "
                                    f"GPU-hours, {report_format.format_duration(sum(gpu_seconds) / 8)} of training "
                                    "(assumed, see below)")
    assert "assumed: 40% MFU of the NVIDIA H100 80GB HBM3's peak bf16 989 TFLOP/s" in text
    assert "cannot" not in text
    measured = [throughput.Throughput("kromhc", 2, 4, 1000.0, "run x")]
    assert throughput.find_throughput(runs[0], measured, h100)[1] == "measured"
    # D=4 from the D=2 run, its tokens/s scaled by the FLOPs per token at D=2 over at D=4
    rate, kind = throughput.find_throughput(runs[1], measured, h100)
    assert kind == "≈" and rate.per_gpu == pytest.approx(1000.0 * runs[0].flops_per_token / runs[1].flops_per_token)
    assert "≈ " + report_format.format_count(rate.per_gpu) + " from kromhc D2 (run x)" in plan.plan_table(
        runs, measured, 8, assumption=h100)
    line = plan.progress_line(runs, 1, [], 8, h100)
    assert line.startswith("run 1 of 2: ladder_d2_kromhc; training left for the mode: ") and "assumed MFU" in line


def test_cli_of_the_ladder_and_the_grid(tmp_path, capsys):
    k = write_config(tmp_path, "d12_kromhc", hc="kromhc", vocab_size=512, max_seq_len=64, head_dim=32)
    common = ["--runs-root", str(tmp_path / "runs"), "--gpu-check", "x"]
    tsv = tmp_path / "plan.tsv"
    plan_cli.main(["--configs", k, "--ladder", k, "--depths", "2", "--ratio", "20", "--isoflop", k, "--budgets",
                   "1e9", "--train-only", "--tsv", str(tsv), "--gpu-name", "NVIDIA A100-SXM4-80GB", *common])
    rows = [line.split("\t")[:3] for line in tsv.read_text().splitlines()]
    assert rows == [[k, "d12_kromhc", "all"], [k, "ladder_d2_kromhc", "train"], [k, "isoflop_1e9_d2_kromhc", "train"]]
    assert "assumed: 40% MFU of the NVIDIA A100-SXM4-80GB's peak bf16 312 TFLOP/s" in capsys.readouterr().out
    plan_cli.main(["--ladder", k, "--depths", "2", "--ratio", "20", "--gpu-name", "Mystery GPU", *common])
    assert "no peak FLOP/s known for GPU 'Mystery GPU'" in capsys.readouterr().out
    plan_cli.main(["--ladder", k, "--depths", "2", "--ratio", "20", "--shards", *common])
    assert capsys.readouterr().out.strip() == "1"
    for bad in ([], ["--ladder", k, "--ratio", "20"], ["--ladder", k, "--depths", "2"],
                ["--isoflop", k, "--depths", "2"], ["--ladder", k, "--depths", "2", "--ratio", "0"],
                ["--ladder", k, "--depths", "2", "--ratio", "20", "--mfu", "2"]):
        with pytest.raises(SystemExit) as e:
            plan_cli.main([*bad, *common])
        assert e.value.code == 2, bad


def test_memory_per_rank_and_the_device_batch_on_a_named_gpu(tmp_path, capsys, monkeypatch):
    """The plan's memory columns: the estimate at the device batch each run will use, chosen as
    base_train's auto chooses it on the GPU named, and one error line for a run that fits at no
    batch. The GPU's memory is set between the estimates at batch 4 and 8 of the tiny model."""
    from nanochat.planning import memory
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(tmp_path))  # the estimates' disk cache
    k = write_config(tmp_path, "k", hc="kromhc", depth=2, steps=10, batch=1024, vocab_size=512, max_seq_len=64,
                     head_dim=32, aspect_ratio=32, device_batch_size=8, compile="false")
    run = plan.plan_runs([k])[0]
    from nanochat.gpt import model_config_from_depth
    config = model_config_from_depth(2, 512, 64, aspect_ratio=32, head_dim=32, hc="kromhc")
    est = {b: memory.estimate(config, b, 2, 1024 // (b * 64 * 2), compile=False) for b in (8, 4)}
    room = (est[8].needed + est[4].needed) // 2
    fit = sizing.fit(run, 2, room, auto=True)
    assert (fit.batch, fit.estimate.peak) == (4, est[4].peak)
    assert sizing.memory_cells(fit) == (f"{est[4].peak / memory.GIB:.1f} GiB", "4 (auto)")
    assert sizing.memory_cells(sizing.fit(run, 2, room, auto=False))[1] == "8 (too big)"  # the config's, told
    table = plan.plan_table([run], [], 2, memory=sizing.Memory("Test GPU", room, True))
    assert "peak per rank" in table and "4 (auto)" in table and "the Test GPU's" in table
    assert sizing.refused([run], 2, sizing.Memory("Test GPU", room, True)) is None
    tiny = sizing.Memory("Tiny GPU", 1024, True)
    assert sizing.fit(run, 2, 1024, auto=True).batch is None
    assert sizing.refused([run], 2, tiny).startswith("error: k cannot fit on the Tiny GPU")

    common = ["--configs", k, "--nproc", "2", "--runs-root", str(tmp_path / "runs"), "--gpu-check", "x", "--memory"]
    plan_cli.main([*common, "--auto-batch", "--gpu-name", "NVIDIA A100-SXM4-40GB"])
    assert "8 (auto)" in capsys.readouterr().out  # 40 GiB holds the tiny model's batch of 8
    monkeypatch.setattr(gpus, "GPUS", (gpus.GPU("Tiny", memory_gib=1e-6),))
    with pytest.raises(SystemExit, match="^error: k cannot fit on the Tiny GPU .* even at device batch 1"):
        plan_cli.main([*common, "--auto-batch", "--gpu-name", "Tiny GPU"])


@pytest.mark.parametrize("name, device, same", [
    ("H200", "NVIDIA H200", True), ("h200 ", "NVIDIA H200", True), ("nvidia-h200", "NVIDIA H200", True),
    ("H100", "NVIDIA H100 80GB HBM3", True), ("H100 SXM", "NVIDIA H100 80GB HBM3", True),
    ("H100", "NVIDIA H100 NVL", False), ("H100", "NVIDIA H100 PCIe", False), ("H100", "NVIDIA H200", False),
    ("H200", "NVIDIA GH200 480GB", False),
    ("A100 40GB", "NVIDIA A100-SXM4-40GB", True), ("A100 40GB", "NVIDIA A100-SXM4-80GB", False),
    ("a100 80 GB", "NVIDIA A100-SXM4-80GB", True), ("A100 80GB", "NVIDIA A100 80GB PCIe", False),
    ("A100", "NVIDIA A100-SXM4-80GB", True), ("A100", "NVIDIA A100-SXM4-40GB", False),  # a bare A100 is 80 GB
    ("L40S", "NVIDIA L40S", True), ("L40", "NVIDIA L40S", False),
    ("RTX PRO 6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", True),
    ("RTX PRO 6000", "NVIDIA RTX 6000 Ada Generation", False), ("", "NVIDIA H200", False),
])
def test_gpu_names_as_the_readme_writes_them(name, device, same):
    assert gpus.same_gpu(name, device) is same


def test_the_committed_measurement_answers_the_readmes_short_names(tmp_path):
    check = tmp_path / "gpu_check.json"
    rows = [dict(run="model D12", variant="kromhc", kernels="torch", tokens_per_s=2000.0)]
    check.write_text(json.dumps({"profile": "gpu", "env": {"device_name": "NVIDIA H200"}, "kernels": {"rows": rows}}))
    for name in ("H200", "h200", "NVIDIA-H200"):
        assert [m.source for m in throughput.committed_measurement(name, check)] == ["docs/gpu_check.json, NVIDIA H200"]
    for name in ("H100", "H200 NVL", "GH200"):
        assert throughput.committed_measurement(name, check) == []
    # the same names, in any case, have the GPU's peak and memory for what nothing measured
    from nanochat.planning.memory import GIB
    assert throughput.assumption_for("h200").peak == throughput.assumption_for("NVIDIA H200").peak == 989e12
    assert sizing.memory_for("a100 40GB", auto=True).bytes == 40 * GIB


def test_an_unmeasured_wiring_is_priced_from_its_measured_family_on_its_backend(tmp_path, monkeypatch):
    """mHC at D=2 with KromHC measured at D=2 and D=4: KromHC's D=2 number, marked "≈ from
    kromhc", never residual's; a fused run from the fused measurement; pre-norm (a family of its
    own, nothing of it measured) at the assumed MFU; with its family's only measurement at
    another depth, that one scaled by FLOPs per token."""
    small = dict(vocab_size=512, max_seq_len=64, head_dim=32)
    mhc, hc_fused, prenorm, mhc_d4 = runs = plan.plan_runs([
        write_config(tmp_path, "mhc", hc="mhc", depth=2, **small),
        write_config(tmp_path, "hc_fused", hc="hc", depth=2, hc_kernels='"fused"', **small),
        write_config(tmp_path, "prenorm", hc="prenorm", depth=2, **small),
        write_config(tmp_path, "mhc_d4", hc="mhc", depth=4, **small)])
    committed = "docs/gpu_check.json, GPU"
    residual, krom_d4, krom_d2, mhc_fused = measured = [
        throughput.Throughput("residual", 2, 1, 9000.0, committed, exact_only=True),
        throughput.Throughput("kromhc", 4, 4, 3000.0, committed, exact_only=True),
        throughput.Throughput("kromhc", 2, 4, 2000.0, committed, exact_only=True),
        throughput.Throughput("mhc", 2, 4, 1500.0, committed, kernels="fused", exact_only=True)]
    h100 = throughput.assumption_for("H100")
    assert throughput.find_throughput(mhc, measured, h100) == (krom_d2, "≈")  # the same depth first
    assert throughput.find_throughput(mhc_d4, measured, h100) == (krom_d4, "≈")
    assert throughput.find_throughput(hc_fused, measured, h100) == (mhc_fused, "≈")  # its backend's
    assert throughput.find_throughput(prenorm, measured, h100)[1] == "assumed"
    text = plan.plan_table(runs, measured, 8, assumption=h100)
    assert "≈ 2.00K from kromhc (docs/gpu_check.json, GPU)" in text and "≈ 1.50K from mhc" in text
    assert "(partly assumed, see below)" in text.splitlines()[0]

    # only D=2 measured: D=4 from it, scaled by mHC's FLOPs per token at D=2 over at D=4
    rate, kind = throughput.find_throughput(mhc_d4, [krom_d2], h100)
    assert kind == "≈" and (rate.variant, rate.depth) == ("kromhc", 2)
    assert rate.per_gpu == pytest.approx(2000.0 * sizing.resolve(mhc).flops_per_token / mhc_d4.flops_per_token)
    assert throughput.rate_cell(rate, kind, mhc_d4).startswith(f"≈ {report_format.format_count(rate.per_gpu)} from kromhc D2 (")

    # no family measured: a run directory's residual number prices it as before, said to be assumed
    run_dir = throughput.Throughput("residual", 2, 1, 9000.0, "run r")
    assert throughput.find_throughput(mhc, [run_dir], h100) == (run_dir, "another")
    assert "assumed 9.00K as residual (run r)" in plan.plan_table([mhc], [run_dir], 8, assumption=h100)

    # the family is the wiring's declaration: without one, KromHC's number is not mHC's
    monkeypatch.setattr(throughput, "family_of", lambda variant: None)
    assert throughput.find_throughput(mhc, measured, h100)[1] == "assumed"


def test_frontier_baselines_come_from_the_registry(tmp_path, monkeypatch, capsys):
    """Each frontier run's comparison run (its SPEC baseline, an option's plain variant) and
    residual, those not among the configs, found as speedrun's variant_config finds them."""
    from glob import glob

    from nanochat import connections
    frontier = sorted(glob(str(plan.REPO / "configs/frontier/*.toml")))
    paper = [f"configs/paper/d12_{v}.toml" for v in ("residual", "mhc", "mhc_lite", "kromhc")]
    assert plan.baseline_configs(frontier) == (paper, [])  # prenorm's run is itself a frontier config
    assert plan.read_against(plan.REPO / "configs/frontier/d12_kromhc_lss.toml") == "kromhc"  # an option
    assert plan.read_against(plan.REPO / "configs/frontier/d12_go_mhc.toml") == "mhc"  # its SPEC baseline
    assert plan.read_against(plan.REPO / "configs/frontier/d12_rezero.toml") == "prenorm"

    # a wiring whose baseline is hc: hc's config joins the list
    monkeypatch.setitem(connections.VARIANTS["go_mhc"].SPEC, "baseline", "hc")
    found, _ = plan.baseline_configs(frontier)
    assert found == [paper[0], "configs/paper/d12_hc.toml", *paper[1:]]
    static = write_config(tmp_path, "static", hc="static_hc")  # tests/wirings: baseline hc, depth 12
    odd = write_config(tmp_path, "odd", hc="go_mhc", depth=7)
    assert plan.baseline_configs([static, odd]) == (
        ["configs/paper/d12_residual.toml", "configs/paper/d12_hc.toml"], ["residual at D=7", "hc at D=7"])

    plan_cli.main(["--baselines-of", static, odd])
    out, err = capsys.readouterr()
    assert out.splitlines() == ["configs/paper/d12_residual.toml", "configs/paper/d12_hc.toml"]
    assert err.startswith("plan: no config for residual at D=7, hc at D=7 in configs/paper")
    with pytest.raises(SystemExit, match="error: config .* not found"):
        plan_cli.main(["--baselines-of", str(tmp_path / "missing.toml")])


def test_only_measurements_on_the_named_gpu_price_a_run(tmp_path, capsys):
    """A user's tiny CPU run of an outside wiring (a family of its own) priced its D12 H200 run
    at 51 tokens/s, 19,972 GPU-hours instead of about 2, even with --gpu-name H200. A CPU run,
    and a run on another GPU, price no GPU run; the named GPU's own does; the CPU demo (--unit
    CPU) reads CPU runs."""
    config = write_config(tmp_path, "laurel", hc="laurel", depth=12, steps=1000, batch=524288)
    root = tmp_path / "runs"
    finish(root, "try_laurel", "laurel", 2, 51.04453641602367, device="cpu", device_name="AMD EPYC 7B13")
    finish(root, "h100", "laurel", 12, 9e5, device_name="NVIDIA H100 80GB HBM3")
    assert [m.source for m in throughput.measured_from_runs(root, "H200")] == []
    assert [m.source for m in throughput.measured_from_runs(root)] == ["run h100 on NVIDIA H100 80GB HBM3"]
    assert [m.per_gpu for m in throughput.measured_from_runs(root, device="cpu")] == [51.04453641602367]
    argv = ["--configs", config, "--runs-root", str(root), "--gpu-check", str(tmp_path / "none.json")]
    plan_cli.main([*argv, "--gpu-name", "H200"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("laurel "))
    assert "try_laurel" not in out and "h100" not in out and " assumed " in row, out
    assert float(row.split()[-1]) == 0.30, row  # 524M tokens at 40 % MFU of an H200's 989 TFLOP/s
    finish(root, "h200", "laurel", 12, 4e5, device_name="NVIDIA H200")
    plan_cli.main([*argv, "--gpu-name", "H200"])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("laurel "))
    assert "400.00K (run h200 on NVIDIA H200)" in row
    plan_cli.main([*argv, "--unit", "CPU"])  # the demo's plan: its own CPU runs, formatted
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("laurel "))
    assert "≈ 2.05 from laurel D2 (run try_laurel on AMD EPYC 7B13)" in row, row  # scaled by FLOPs to D12


def test_small_rates_are_formatted_and_another_n_is_said_to_be_unscaled(tmp_path):
    assert [report_format.format_count(v) for v in (51.04453641602367, 0.5, 512, 2500.0)] == ["51", "0.5", "512", "2.50K"]
    run = plan.plan_runs([write_config(tmp_path, "k8", hc="kromhc", hc_streams=8)])[0]
    measured = throughput.Throughput("mhc", 12, 4, 2000.0, "gpu_check.json")
    assert throughput.find_throughput(run, [measured])[1] == "≈"
    assert throughput.rate_cell(measured, "≈", run) == "≈ 2.00K from mhc n=4, taken as measured (gpu_check.json)"
    assert "taken as measured, not scaled" in throughput.LEGEND
