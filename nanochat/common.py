"""Process-level plumbing shared by every module: device and dtype choice, torchrun-aware
distributed init and teardown (with the failure watchdog), rank-0 printing and console
tables, the base directory, seeding, and the device's peak FLOP/s for MFU (nanochat/gpus.py)."""

import os
import random
import logging
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from nanochat import gpus
from nanochat.cluster import watchdog

logger = logging.getLogger("nanochat")


def base_dir():
    """Where data, tokenizer, runs and eval bundles live: $NANOCHAT_BASE_DIR or ~/.cache/nanochat."""
    path = os.environ.get("NANOCHAT_BASE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "nanochat")
    os.makedirs(path, exist_ok=True)
    return path


def autodetect_device_type():
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32,
           "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16}


def compute_dtype(device_type):
    """bf16 on CUDA with native bf16 matmuls (sm80+), fp32 elsewhere; env NANOCHAT_DTYPE overrides."""
    override = os.environ.get("NANOCHAT_DTYPE")
    if override:
        if override not in _DTYPES:
            raise ValueError(f"NANOCHAT_DTYPE={override!r} is not one of {sorted(_DTYPES)}")
        return _DTYPES[override]
    if device_type == "cuda" and torch.cuda.get_device_capability()[0] >= 8:
        return torch.bfloat16
    return torch.float32


@dataclass
class DistInfo:
    ddp: bool
    rank: int
    local_rank: int
    world_size: int

    @property
    def master(self):
        return self.rank == 0


def get_dist_info():
    """Read torchrun's environment; a plain `python` launch is rank 0 of 1."""
    if all(k in os.environ for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")):
        return DistInfo(True, int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"]))
    return DistInfo(False, 0, 0, 1)


def print0(*args, **kwargs):
    if int(os.environ.get("RANK", 0)) == 0:
        print(*args, **kwargs, flush=True)


def text_table(header, rows):
    """A console table: first column left-aligned, the others right-aligned, a rule under
    the header."""
    cells = [[str(c) for c in r] for r in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(cells[0]), line(["-" * w for w in widths]), *map(line, cells[1:])])


def seed_everything(seed):
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def compute_init(device_type="", seed=42, timeout_s=None):
    """Pick the device, start the process group under torchrun (nccl on CUDA, gloo
    elsewhere; collectives wait `timeout_s` seconds at most, torch's default when None) with
    the watchdog that stops every rank when one fails, seed, and enable TF32. Returns
    (dist_info, device)."""
    device_type = device_type or autodetect_device_type()
    if device_type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device-type cuda was asked for but no CUDA device is visible; use --device-type cpu")
    if device_type == "mps" and not torch.backends.mps.is_available():
        raise SystemExit("error: --device-type mps was asked for but MPS is not available; use --device-type cpu")
    info = get_dist_info()
    if device_type == "cuda":
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
        # TF32 for the fp32 matmuls that remain (the connection coefficients): the
        # setting that actually takes effect on current PyTorch.
        torch.set_float32_matmul_precision("high")
    else:
        device = torch.device(device_type)
    if info.ddp and not dist.is_initialized():
        timeout = None if timeout_s is None else timedelta(seconds=timeout_s)
        if device_type == "cuda":
            dist.init_process_group("nccl", device_id=device, timeout=timeout)
        else:
            dist.init_process_group("gloo", timeout=timeout)
        dist.barrier()
        watchdog.start(info.rank, info.world_size)
    seed_everything(seed)
    return info, device


def single_gpu_device():
    """The device of a one-GPU tool (bench, gpu_check): the current CUDA device, by index
    (torch.cuda.set_device refuses a bare "cuda"), made current, with TF32 for fp32 matmuls
    as in training (compute_init)."""
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    torch.set_float32_matmul_precision("high")
    return device


def compute_cleanup():
    watchdog.stop()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def peak_memory_mib(device):
    """Peak memory of this process: CUDA max allocated, else the OS high-water mark (RSS)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return rss_kib / 1024


def device_name(device):
    """The accelerator's model name (CUDA), else the CPU's: wall-clock comparisons between runs
    hold only on the same name and count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:  # Linux names the CPU model here; platform.processor() only says x86_64
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            return names[0]
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine() or device.type


def get_peak_flops(device):
    """Peak bf16 FLOP/s of the device, or inf when unknown (MFU then reads 0)."""
    if device.type != "cuda":
        return float("inf")
    return gpus.peak_flops(torch.cuda.get_device_name(device))
