"""The CUDA dry run: the model, inference and the optimizer on fake CUDA tensors under
CUDA's own autocast rules (tests/cuda_dryrun.py). Skipped on a `+cpu` build of torch; the CI
runs this file on CUDA builds of the pin, of the GPU machines' torch and of the floor
(docs/tests.md "Supported torch, the CUDA side, the kernels").

What it holds: on every torch, every variant's stream between layers, into the reduce and
out of it is the activation dtype (bf16), whatever rms_norm's autocast rule (fp32 on CUDA
from torch 2.12 on); nothing of stream or MLP width is saved for backward in fp32; the KV
cache decodes; the optimizer steps; the memory estimate's emulation of CUDA's rules saves what
CUDA autocast saves; --fp8's layers keep float8 tensors for backward and their three matmuls
pass _scaled_mm's CUDA checks (layouts, widths, formats)."""

from collections import Counter
from contextlib import nullcontext

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.autograd.graph import saved_tensors_hooks

from nanochat import engine, fp8, optim
from nanochat.planning import memory
from nanochat.planning import memory_check as check
from nanochat.gpt import EagerSteps
from tests.cuda_dryrun import GPU, H100, cuda_autocast, fake_cuda, fake_cuda_model, needs_fake_cuda
from tests.test_stream_dtype import CASES, case_id

pytestmark = needs_fake_cuda
B, T = 2, 32


def tokens(t=T):
    return torch.zeros(B, t, dtype=torch.long, device=GPU)


def watch_states(model):
    """Record the dtype of the state each layer receives, of the state into the reduce and
    of what the reduce returns (the head's input before its norm)."""
    seen = []
    for layer in model.connections.layers:
        step = layer.step
        layer.step = lambda X, branch, x0, carry, step=step: seen.append(X.dtype) or step(X, branch, x0, carry)
    reduce = model.connections.reduce
    reduce.register_forward_pre_hook(lambda module, args: seen.append(args[0].dtype))
    reduce.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    return seen


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_stream_is_bf16_under_cuda_autocast(case, monkeypatch):
    with fake_cuda(monkeypatch):
        model = fake_cuda_model(**case)
        assert model.transformer.wte.weight.dtype == torch.bfloat16  # as init_weights makes it on CUDA
        seen = watch_states(model)
        with cuda_autocast():
            logits = model(tokens())
    assert len(seen) == 2 * model.config.n_layer + 2
    assert seen == [torch.bfloat16] * len(seen), seen
    assert logits.dtype == torch.float32 and logits.device.type == "cuda"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_2026_07_stream_is_bf16_without_autocast(case, monkeypatch):
    """The 2026-07 trunk on an sm_90 GPU: bf16 tables from its compute dtype, no autocast, every
    layer casting its weight; the state stays bf16 (the reduce runs twice: the end, the backout)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (H100.major, H100.minor))
    monkeypatch.delenv("NANOCHAT_DTYPE")  # the tests' fp32 override: here the GPU's own compute dtype
    with fake_cuda(monkeypatch):
        model = fake_cuda_model(**case, trunk="2026-07")
        assert model.transformer.wte.weight.dtype == torch.bfloat16
        seen = watch_states(model)
        logits = model(tokens())
    assert len(seen) == 2 * model.config.n_layer + 4
    assert seen == [torch.bfloat16] * len(seen), seen
    assert logits.dtype == torch.float32 and logits.device.type == "cuda"
    # (Its optimizer step is not run here: nanochat's order of operations takes AdamW's step size
    # through add_'s alpha, a Python number when eager, which a fake tensor cannot give; compiled,
    # as on a GPU, it is traced. tests/test_optim_2026.py runs that step.)


@pytest.mark.parametrize("case", [dict(hc="residual"), dict(hc="kromhc"), dict(hc="mhc"), dict(hc="frac"),
                                  dict(hc="attnres")], ids=case_id)
def test_no_fp32_activation_is_saved(case, monkeypatch):
    """CUDA autocast runs pow (relu(h).square()) and rms_norm (torch >= 2.12) in fp32; what
    backward keeps of the model's activations (C wide, the n x C streams, the MLP's 4C, the
    heads' q and k) stays bf16 on every torch. (fp32: the connections' coefficients, the logits.)"""
    saved = []

    def pack(t):
        saved.append((t.dtype, tuple(t.shape)))
        return t

    with fake_cuda(monkeypatch):
        model = fake_cuda_model(**case)
        widths = (model.config.n_embd, 4 * model.config.n_embd, model.head_dim)
        with cuda_autocast(), saved_tensors_hooks(pack, lambda t: t):
            model(tokens()).sum()
    wide = [(dtype, shape) for dtype, shape in saved if len(shape) > 2 and shape[:2] == (B, T) and shape[-1] in widths]
    assert wide and all(dtype == torch.bfloat16 for dtype, _ in wide), [s for s in wide if s[0] != torch.bfloat16]


@pytest.mark.parametrize("case", [dict(hc="residual"), dict(hc="kromhc"), dict(hc="go_mhc"), dict(hc="attnres"),
                                  dict(hc="frac")], ids=case_id)
def test_prefill_and_decode_through_the_static_cache(case, monkeypatch):
    with fake_cuda(monkeypatch), torch.no_grad():
        model = fake_cuda_model(**case)
        with cuda_autocast():
            steps = EagerSteps(model)
            cache = steps.cache(1, 24)
            assert cache.k[0].dtype == torch.bfloat16 and cache.k[0].device.type == "cuda"
            prefill = steps.step(tokens(16)[:1], cache)
            decode = steps.step(tokens(1)[:1], cache)
    assert prefill.shape == (1, 16, 300) and decode.shape == (1, 1, 300)


def test_compiled_inference_on_cuda_keeps_the_model_and_its_caches(monkeypatch):
    """On CUDA compiled inference decodes under CUDA graphs from kept caches of power-of-two
    capacity; building it changes nothing on the model (its FlexAttention stays)."""
    with fake_cuda(monkeypatch), torch.no_grad():
        model = fake_cuda_model(hc="kromhc", attention="flex")
        inference = engine.Inference(model, compile=True)
        with cuda_autocast():
            cache = inference.cache(2, 40)
            assert inference.cache(2, 50) is cache
    assert inference.cuda_graphs and {block.attn.attention for block in model.transformer.h} == {"flex"}
    assert cache.max_len == engine.MIN_CAPACITY and cache.k[0].dtype == torch.bfloat16 and cache.pos.device.type == "cuda"


def test_scoring_a_prompt_longer_than_the_training_length(monkeypatch):
    """Evaluation prompts of any length: SDPA with an explicit window mask past the window."""
    with fake_cuda(monkeypatch), torch.no_grad():
        model = fake_cuda_model(hc="kromhc", attention="flex")
        with cuda_autocast():
            for t in (20, 32, 48):
                assert model(tokens(t)).shape == (B, t, 300)


@pytest.mark.parametrize("case", [dict(hc="residual"), dict(hc="kromhc")], ids=case_id)
def test_the_optimizer_steps_on_fake_gradients(case, monkeypatch):
    """Eager kernels (compiling needs a GPU); the groups, dtypes and state of a CUDA run:
    bf16 embedding tables and their AdamW state, fp32 elsewhere (torch.cuda answers as an
    H100 where the optimizer asks for the compute dtype)."""
    monkeypatch.setattr(optim, "COMPILE_ON_CUDA", False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (H100.major, H100.minor))
    with fake_cuda(monkeypatch):
        model = fake_cuda_model(**case)
        opt = optim.build_optimizer(model.param_groups(), world_size=1)
        for p in model.parameters():
            p.grad = torch.empty_like(p)
        opt.step(measure_grad_norm=True)
        state = opt.state[model.transformer.wte.weight]
    assert state and all(t.dtype == torch.bfloat16 for t in state.values() if torch.is_tensor(t) and t.dim())
    assert all(t.device.type == "cuda" for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim())


@pytest.mark.parametrize("hc", ["kromhc", "mhc"])
def test_each_projection_is_one_op_from_bf16_streams_to_fp32(hc, monkeypatch):
    """Under CUDA autocast every HC layer's projection reaches the dispatcher as one
    nanochat::project call, which takes the bf16 stream itself (no fp32 copy made outside it)
    and returns fp32: the op torch.compile keeps opaque, where its own multiply-and-sum form of
    the projection ran at a few hundred threads on an H200 (docs/gpu_measured.md)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Calls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if str(func) == "nanochat.project.default":
                self.seen.append((args[0].dtype, args[1].dtype, out[0].dtype, out[1].dtype))
            return out

    with fake_cuda(monkeypatch):
        model = fake_cuda_model(hc=hc)
        with cuda_autocast(), Calls() as calls:
            model(tokens())
    f32, bf16 = torch.float32, torch.bfloat16
    assert calls.seen == [(bf16, f32, f32, f32)] * (2 * model.config.n_layer), calls.seen


@pytest.mark.parametrize("case", [dict(hc="kromhc"), dict(hc="mhc", hc_pre="delayed"), dict(hc="go_mhc"),
                                  dict(hc="go_mhc", hc_go_s=3),
                                  dict(hc="mhc_lite", hc_expand="lss", hc_reduce="learned"),
                                  dict(hc="kromhc", hc_seam="split", hc_stream_checkpoint=2)], ids=case_id)
def test_fused_seams_keep_bf16_streams_and_fp32_coefficients(case, monkeypatch):
    """hc_kernels='fused' on CUDA: the trunk runs as seams (the custom ops' fake forms on fake
    CUDA tensors: shapes and dtypes as their kernels write them), one per boundary (an off-chip
    H_res, go-mHC's beyond m = n s = 8, adds a reading seam per layer); streams, the sub-layers' inputs and outputs bf16 in and
    out, coefficients fp32; nothing stream- or C-wide saved for backward in fp32."""
    from nanochat.connections.backends import fused
    seams, saved = [], []
    real = fused._seam

    def watched(*args):
        out = real(*args)
        seams.append(([a.dtype if torch.is_tensor(a) else None for a in args[:5]],
                      [t.dtype if t.numel() else None for t in out], [t.device.type for t in out if t.numel()]))
        return out

    def pack(t):
        saved.append((t.dtype, tuple(t.shape)))
        return t

    monkeypatch.setattr(fused, "_seam", watched)
    with fake_cuda(monkeypatch):
        model = fake_cuda_model(hc_kernels="fused", **case)
        with cuda_autocast(), saved_tensors_hooks(pack, lambda t: t):
            logits = model(tokens())
    layers = 2 * model.config.n_layer
    off_chip = case["hc"] == "go_mhc" and model.config.hc_streams * model.config.hc_go_s > 8
    assert len(seams) == layers + 1 + (layers if off_chip else 0)
    f32, bf16 = torch.float32, torch.bfloat16
    for inputs, outputs, devices in seams:
        assert inputs[0] == bf16 and inputs[1] in (None, bf16), inputs  # the streams, the sub-layer's output
        assert all(d in (None, f32) for d in inputs[2:]), inputs  # h_post, h_res, read weights
        # (x_next, u, coefficients...), each present only where that seam writes it
        assert outputs[0] in (None, bf16) and outputs[1] in (None, bf16), outputs
        assert all(d in (None, f32) for d in outputs[2:]), outputs
        assert set(devices) == {"cuda"}
    C = model.config.n_embd
    # activations token-major and C wide (not a parameter such as the projection weight, n C x k)
    wide = [(dtype, shape) for dtype, shape in saved if dtype.is_floating_point and len(shape) > 1
            and shape[-1] == C and (shape[0] == B * T or shape[:2] == (B, T))]
    assert wide and all(dtype == bf16 for dtype, _ in wide), [s for s in wide if s[0] != bf16]
    assert logits.dtype == f32


def test_tma_scratch_comes_from_the_cuda_allocator(monkeypatch):
    """The descriptors TMA's seams make on chip need global scratch, which Triton asks the
    allocator we set for: bytes on the current CUDA device (fused._tma_scratch_ready)."""
    triton = pytest.importorskip("triton")
    from nanochat.connections.backends import fused
    allocators = []
    monkeypatch.setattr(triton, "set_allocator", allocators.append)
    fused._tma_scratch_ready.cache_clear()
    try:
        assert fused._tma_scratch_ready()
    finally:
        fused._tma_scratch_ready.cache_clear()
    with fake_cuda(monkeypatch):
        scratch = allocators[0](384, 128, None)
    assert (scratch.device.type, scratch.dtype, scratch.numel()) == ("cuda", torch.int8, 384)


def test_the_memory_estimates_emulated_rules_save_what_cuda_autocast_saves():
    """The memory estimate traces on the CPU with CUDA's fp32 rules emulated (nanochat/planning/memory.py):
    the forward's saved activations (token-major ones; attention's internals differ by kernel)
    have the shapes and dtypes that real CUDA autocast on fake CUDA tensors gives them."""
    config = memory.traced_config(check.small_config("kromhc", {}, 2, 64))

    def saved(device):
        seen = Counter()

        def pack(t):
            if tuple(t.shape[:2]) == (2, 64):
                seen[(tuple(t.shape), t.dtype)] += 1
            return t

        on_cuda = device.type == "cuda"
        with FakeTensorMode(), device:
            model = memory._fake_model(config, bf16=True)
            idx = torch.randint(0, config.vocab_size, (2, 64))
            autocast = cuda_autocast() if on_cuda else torch.autocast("cpu", dtype=torch.bfloat16)
            rules = nullcontext() if on_cuda else memory.cuda_rules(compile=False)
            with rules, autocast, saved_tensors_hooks(pack, lambda t: t):
                model(idx, idx)
        return set(seen)

    assert saved(torch.device("cpu")) == saved(GPU)


@pytest.mark.parametrize("trunk", ["2026-01", "2026-07"])
def test_fp8_layers_keep_float8_for_backward_and_pass_cudas_checks(trunk, monkeypatch):
    """--fp8 on CUDA (nanochat/fp8.py): under 2026-01's autocast and 2026-07's bf16 activations,
    each converted layer keeps its input and weight in e4m3 for backward, the logits stay fp32;
    forward's and backward's _scaled_mm calls (backward called directly:
    fake CUDA tensors have no autograd backward) pass CUDA's checks of layouts and widths and
    return the activations' dtype."""
    monkeypatch.delenv("NANOCHAT_DTYPE", raising=False)  # the compute dtype an H100 gets: bf16
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (H100.major, H100.minor))
    saved = Counter()

    def pack(t):
        if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            saved[(t.dtype, tuple(t.shape), t.device.type)] += 1
        return t

    with fake_cuda(monkeypatch):
        model = fake_cuda_model(n_embd=128, n_head=1, n_kv_head=1, trunk=trunk)
        converted, kept = fp8.convert(model)
        with cuda_autocast() if trunk == "2026-01" else nullcontext(), saved_tensors_hooks(pack, lambda t: t):
            logits = model(tokens())
        layers = [model.get_submodule(name) for name in converted]
        x = torch.empty(B * T, 128, dtype=torch.bfloat16, device=GPU)
        y, kept_for_backward = fp8.forward_matmul(x, model.lm_head.weight)
        grad_x, grad_w = fp8.backward_matmuls(torch.empty_like(y), kept_for_backward)
    assert len(converted) == 6 * 2 + 1 and kept  # the gates stay
    expected = Counter()
    for layer in layers:
        expected[(torch.float8_e4m3fn, (B * T, layer.in_features), "cuda")] += 1
        expected[(torch.float8_e4m3fn, (layer.out_features, layer.in_features), "cuda")] += 1
    assert saved == expected
    assert logits.dtype == torch.float32 and logits.shape == (B, T, 300) and logits.device.type == "cuda"
    head = tuple(model.lm_head.weight.shape)
    assert (y.dtype, tuple(y.shape)) == (torch.bfloat16, (B * T, head[0]))
    assert (grad_x.dtype, tuple(grad_x.shape), grad_w.dtype, tuple(grad_w.shape)) == \
        (torch.bfloat16, (B * T, 128), torch.bfloat16, head)
