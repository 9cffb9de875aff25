"""The tools' device setup on CUDA, up to their first kernel, with torch.cuda patched to one
visible GPU (tests/cuda_dryrun.py): runs on every build of torch."""

import json

import pytest
import torch

from nanochat import common
from scripts import bench, gpu_check
from tests.cuda_dryrun import one_gpu  # noqa: F401 (a fixture)


def test_bench_takes_the_gpu_by_index(one_gpu):  # noqa: F811
    device, dtype = bench.resolve_device(bench.parse_args(["--device", "cuda"]))
    assert device == torch.device("cuda", 0) and dtype == torch.bfloat16
    assert one_gpu.set_devices == [0]


def test_bench_auto_finds_the_gpu(one_gpu):  # noqa: F811
    device, _ = bench.resolve_device(bench.parse_args(["--device", "auto"]))
    assert device == torch.device("cuda", 0)


def test_gpu_check_gets_past_its_setup(one_gpu, tmp_path, monkeypatch):  # noqa: F811
    """Up to the env section, whose first kernel is the SDPA backend probe: the device it is
    handed is the GPU, by index."""
    handed = []
    monkeypatch.setattr(gpu_check, "env_info", lambda device: handed.append(device) or {"device": device.type})
    gpu_check.main(["--out", str(tmp_path), "--sections", "env"])
    assert handed == [torch.device("cuda", 0)] and one_gpu.set_devices == [0]
    assert json.loads((tmp_path / "gpu_check.json").read_text())["profile"] == "gpu"


def test_training_takes_the_local_rank(one_gpu, monkeypatch):  # noqa: F811
    monkeypatch.setenv("NANOCHAT_DTYPE", "bfloat16")
    info, device = common.compute_init("cuda")
    assert device == torch.device("cuda", info.local_rank) and one_gpu.set_devices == [info.local_rank]


class Loaded(Exception):
    """Raised in place of loading a checkpoint: the first kernel of an evaluation."""


def test_evaluation_loads_its_model_onto_the_gpu(one_gpu, tmp_path, monkeypatch):  # noqa: F811
    from nanochat import checkpoint_manager as checkpoint
    from scripts import base_eval
    monkeypatch.delenv("NANOCHAT_DTYPE", raising=False)
    where = []

    def load_model(run_dir, step=None, device=None):
        where.append(device)
        raise Loaded

    monkeypatch.setattr(checkpoint, "load_model", load_model)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(Loaded):
        base_eval.main(["--run-dir", str(run_dir), "--eval", "bpb", "--device-type", "cuda"])
    assert where == [torch.device("cuda", 0)] and common.compute_dtype("cuda") == torch.bfloat16
