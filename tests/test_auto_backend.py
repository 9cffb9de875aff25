"""hc_kernels = auto (nanochat/connections/backends/auto.py): a training run takes the backend a
GPU of its name measured fastest for its variant against the torch path, torch elsewhere, and
says which in one line."""

import json

import torch

from nanochat.connections.backends import auto
from nanochat.gpt import GPTConfig
from nanochat.train_config import parse_args

H200 = "NVIDIA H200"
STEPS = {(H200, "kromhc", "torch"): 2.04, (H200, "kromhc", "fused"): 1.58, (H200, "mhc", "fused"): 4.84,
         (H200, "hc", "torch"): 1.9, (H200, "hc", "fused"): 2.3}


def test_the_fastest_measured_backend_against_torch():
    choice = auto.choose("kromhc", H200, ["torch", "fused"], STEPS)
    assert choice.backend == "fused"
    assert "fused for kromhc on NVIDIA H200, measured 1.58x" in choice.note and "torch 2.04x" in choice.note
    assert auto.choose("hc", H200, ["torch", "fused"], STEPS).backend == "torch"  # measured slower


def test_torch_where_nothing_compares_a_kernel_backend_with_it():
    mhc = auto.choose("mhc", H200, ["torch", "fused"], STEPS)  # fused measured, torch not
    assert mhc.backend == "torch" and "measured: fused 4.84x" in mhc.note
    other_gpu = auto.choose("kromhc", "NVIDIA H100 80GB HBM3", ["torch", "fused"], STEPS)
    assert other_gpu.backend == "torch" and "measured: nothing" in other_gpu.note
    assert auto.choose("kromhc", None, ["torch", "fused"], STEPS).backend == "torch"


def test_a_backend_that_cannot_run_here_is_never_chosen():
    assert auto.choose("kromhc", H200, ["torch"], STEPS).backend == "torch"


def test_measurements_are_read_from_gpu_check_files(tmp_path):
    """Per (GPU name, variant, backend) the fastest of its rows over every file; files that are
    absent or not JSON give nothing."""
    def write(name, device, rows):
        (tmp_path / name).write_text(json.dumps({"env": {"device_name": device}, "kernels": {"rows": rows}}))
    write("a.json", H200, [{"variant": "residual", "kernels": "torch", "time_vs_residual": 1.0},
                           {"variant": "kromhc", "kernels": "fused", "time_vs_residual": 4.3}])
    write("b.json", H200, [{"variant": "kromhc", "kernels": "fused", "time_vs_residual": 1.6},
                           {"variant": "kromhc", "kernels": "fused", "time_vs_residual": 0}])  # a failed case
    (tmp_path / "c.json").write_text("not json")
    steps = auto.measured_steps(["a.json", "b.json", "c.json", "missing.json"], root=tmp_path)
    assert steps == {(H200, "kromhc", "fused"): 1.6}


def test_the_committed_measurements_pick_fused_for_kromhc_on_an_h200():
    """What docs/gpu_measured.md records: KromHC's D=12 step 1.58x residual's on the fused seams
    against 2.04x on torch; mHC's torch path not measured beside them."""
    steps = auto.measured_steps()
    assert round(steps[(H200, "kromhc", "fused")], 2) == 1.58 and round(steps[(H200, "kromhc", "torch")], 2) == 2.04
    assert auto.choose("kromhc", H200, ["torch", "fused"]).backend == "fused"
    assert auto.choose("mhc", H200, ["torch", "fused"]).backend == "torch"


def test_a_run_resolves_auto_before_it_builds_the_model(monkeypatch):
    monkeypatch.setattr(auto, "measured_steps", lambda: STEPS)
    monkeypatch.setattr(auto, "runnable", lambda config, device_type: ["torch", "fused"])
    cuda = torch.device("cuda")
    config, note = auto.resolve(GPTConfig(hc="kromhc", hc_kernels="auto", hc_stream_checkpoint=2), cuda, H200)
    assert (config.hc_kernels, config.hc_stream_checkpoint) == ("fused", 2)
    assert note.startswith("hc_kernels auto: fused")
    # torch chosen: the stream checkpoints are the fused seams' own, and the line says so
    config, note = auto.resolve(GPTConfig(hc="mhc", hc_kernels="auto", hc_stream_checkpoint=2), cuda, H200)
    assert (config.hc_kernels, config.hc_stream_checkpoint) == ("torch", 1)
    assert "--hc-stream-checkpoint 2 applies to the fused seams only" in note
    given, note = auto.resolve(GPTConfig(hc="kromhc", hc_kernels="torch"), cuda, H200)
    assert given.hc_kernels == "torch" and note is None


def test_a_single_state_wiring_resolves_silently_and_auto_is_the_default():
    config, note = auto.resolve(GPTConfig(hc="residual", hc_kernels="auto"), torch.device("cpu"), "a CPU")
    assert config.hc_kernels == "torch" and note is None
    assert parse_args([]).hc_kernels == "auto"


def test_kernel_backends_run_where_the_wiring_declares_them():
    assert auto.runnable(GPTConfig(hc="residual"), "cuda") == ["torch"]
    assert auto.runnable(GPTConfig(hc="frac"), "cuda") == ["torch"]  # SPEC backends: torch only


def test_the_split_seam_design_is_a_path_of_its_own(monkeypatch):
    """A measurement of the fused seams' split design ("fused-split") is chosen as that design."""
    monkeypatch.setattr(auto, "measured_steps", lambda: {**STEPS, (H200, "kromhc", "fused-split"): 1.31})
    monkeypatch.setattr(auto, "runnable", lambda config, device_type: ["torch", "fused", "fused-split"])
    config, note = auto.resolve(GPTConfig(hc="kromhc", hc_kernels="auto"), torch.device("cuda"), H200)
    assert (config.hc_kernels, config.hc_seam) == ("fused", "split") and "fused-split for kromhc" in note


def test_a_users_seam_design_is_kept(monkeypatch):
    """--hc-seam given with --hc-kernels auto: only that design's path competes with torch; with
    --hc-kernels fused and --hc-seam auto, the design a GPU of this name measured faster, else
    onepass; on the torch path the design is moot and set to onepass."""
    measured = {**STEPS, (H200, "kromhc", "fused-split"): 1.31}
    monkeypatch.setattr(auto, "measured_steps", lambda: measured)
    monkeypatch.setattr(auto, "runnable", lambda config, device_type: ["torch", "fused", "fused-split"])
    cuda = torch.device("cuda")
    config, note = auto.resolve(GPTConfig(hc="kromhc", hc_kernels="auto", hc_seam="onepass"), cuda, H200)
    assert (config.hc_kernels, config.hc_seam) == ("fused", "onepass") and "fused for kromhc" in note
    config, note = auto.resolve(GPTConfig(hc="kromhc", hc_kernels="fused", hc_seam="auto"), cuda, H200)
    assert (config.hc_kernels, config.hc_seam) == ("fused", "split")
    assert note == ("hc_seam auto: split for kromhc on NVIDIA H200, measured 1.31x residual's step "
                    "(the other design 1.58x)")
    config, note = auto.resolve(GPTConfig(hc="mhc", hc_kernels="fused", hc_seam="auto"), cuda, H200)
    assert config.hc_seam == "onepass" and "no GPU measurement compares the two designs for mhc" in note
    config, note = auto.resolve(GPTConfig(hc="kromhc", hc_kernels="torch", hc_seam="auto"), cuda, H200)
    assert (config.hc_kernels, config.hc_seam, note) == ("torch", "onepass", None)
    config, _ = auto.resolve(GPTConfig(hc="kromhc", hc_kernels="fused", hc_seam="split"), cuda, H200)
    assert config.hc_seam == "split"
    assert parse_args([]).hc_seam == "auto"
