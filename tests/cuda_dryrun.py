"""The CUDA dry run's tools: the CUDA side of the code executed on a machine without a GPU.

Two stand-ins, each as close to the real thing as a CPU allows:
- fake CUDA tensors (`FakeTensorMode`): shapes, dtypes and devices of every op on `cuda:0`
  without memory or kernels, under CUDA's own autocast rules, switched on directly
  (`torch.autocast("cuda")` disables itself when no GPU is visible). The dtype rules differ
  from the CPU's (CUDA runs pow, sum, softmax and, from torch 2.12, rms_norm in fp32), which
  is why the dry run exists. Slicing a fake CUDA tensor needs a CUDA build of torch (PyPI's
  wheels run on a CPU); on a `+cpu` build these tests skip (docs/tests.md "Supported torch, the CUDA side, the kernels": the
  CI runs them on the CUDA builds). The autograd engine refuses a backward on fake CUDA
  tensors without a device, so what backward depends on is read off the forward: the tensors
  saved for it.
- `one_gpu`: `torch.cuda` patched to behave as one visible GPU that checks its arguments as
  the real one does, for the setup code of the tools (up to their first kernel).
"""

import os
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from nanochat import gpt

# With its index: a bare "cuda" makes torch ask the driver for the current device.
GPU = torch.device("cuda", 0)


def fake_cuda_indexes():
    """Can this torch index a fake CUDA tensor without a driver? Not a `+cpu` build, nor
    torch 2.9 (its indexing reaches the CUDA runtime); the CUDA builds of 2.11 and 2.13 can."""
    if not torch.backends.cuda.is_built():
        return False
    try:
        with FakeTensorMode():
            torch.zeros(2, 2, device=GPU)[None, :, None]
        return True
    except Exception:  # whatever the runtime raises without a driver: the answer is no
        return False


FAKE_CUDA = fake_cuda_indexes()
# Set by scripts/test.sh under TORCH_BUILD=cuda: there a skip would hide a broken venv, so the
# tests run (and fail) instead.
REQUIRED = os.environ.get("NANOCHAT_REQUIRE_FAKE_CUDA") == "1"
needs_fake_cuda = pytest.mark.skipif(
    not (FAKE_CUDA or REQUIRED),
    reason="fake CUDA tensors need a CUDA build of torch >= 2.11 (TORCH_BUILD=cuda bash scripts/test.sh "
           "tests/test_cuda_*.py)")


@contextmanager
def cuda_autocast(dtype=torch.bfloat16):
    """CUDA autocast's state switched on directly, as torch.autocast("cuda") would on a GPU."""
    before = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", before[0])
        torch.set_autocast_dtype("cuda", before[1])
        torch.clear_autocast_cache()


def flex_stand_in(q, k, v, block_mask=None, enable_gqa=False):
    """In place of eager CUDA FlexAttention (compiled on first use, which needs a GPU): checks
    what the kernel requires of its inputs and returns an output of the kernel's shape."""
    assert q.device.type == k.device.type == v.device.type == "cuda"
    assert q.dtype == k.dtype == v.dtype, f"flex_attention needs one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
    assert block_mask is not None
    return torch.empty_like(q)


RANDOM_INITS = ("normal_", "uniform_", "kaiming_uniform_", "xavier_uniform_")


@contextmanager
def fake_cuda(monkeypatch):
    """Fake CUDA tensors, with eager FlexAttention replaced by `flex_stand_in` and no random
    initialization (fake values mean nothing, and torch 2.9 seeds the real CUDA generator to
    draw them, which needs a driver)."""
    monkeypatch.setattr(gpt, "_flex_kernel", lambda device_type: flex_stand_in)
    for name in RANDOM_INITS:
        monkeypatch.setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
    with FakeTensorMode():
        yield


def fake_cuda_model(**fields):
    """A tiny model built on fake cuda:0 (call inside `fake_cuda`): construction and
    init_weights as on a GPU (bf16 embedding tables, FlexAttention block masks), no memory.
    `fields` add to the config or replace its sizes (--fp8 converts widths from 128 on)."""
    sizes = dict(sequence_len=32, vocab_size=300, n_layer=2, n_head=2, n_kv_head=2, n_embd=32, window_pattern="SL")
    cfg = gpt.GPTConfig(**{**sizes, **fields})
    with GPU:
        model = gpt.GPT(cfg)
        model.init_weights()
    return model


H100 = SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=80 * 2**30, major=9, minor=0,
                       multi_processor_count=132)


class FakeEvent:
    """torch.cuda.Event's timing interface; every interval reads 1 ms."""

    def __init__(self, enable_timing=False, **kwargs):
        self.enable_timing = enable_timing

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        assert self.enable_timing and other.enable_timing, "elapsed_time needs enable_timing=True events"
        return 1.0


@pytest.fixture
def one_gpu(monkeypatch):
    """torch.cuda as one visible H100: device arguments checked as torch checks them
    (`set_device` resolves its argument with the index required), memory figures of zero.
    Yields a namespace recording the devices made current."""
    seen = SimpleNamespace(set_devices=[])

    def index(device, optional=False):
        i = torch.cuda._utils._get_device_index(device, optional=optional)
        if not 0 <= i < 1:
            raise RuntimeError(f"CUDA error: invalid device ordinal {i} (one GPU visible)")
        return i

    def set_device(device):
        seen.set_devices.append(index(device))

    def answers(value):  # a torch.cuda query about one device: the device checked, then the answer
        def query(device=None):
            index(device, optional=True)
            return value
        return query

    for name, value in {
        "is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
        "set_device": set_device, "synchronize": answers(None), "get_device_properties": answers(H100),
        "get_device_name": answers(H100.name), "get_device_capability": answers((H100.major, H100.minor)),
        "max_memory_allocated": answers(0), "memory_allocated": answers(0), "reset_peak_memory_stats": answers(None),
        "empty_cache": lambda: None, "Event": FakeEvent,
    }.items():
        monkeypatch.setattr(torch.cuda, name, value)
    yield seen
