"""--fp8 (nanochat/fp8.py) on the CPU, where torch runs _scaled_mm: the three matmuls equal
products of operands quantized by hand with torch's float8 dtypes, each in its format and
accumulation mode; backward keeps float8 tensors only; convert takes the projections and the
head and nothing of the gates or the connections; evaluation's plain layers give the model's
own outputs; FLOPs and the memory planner see the converted model. (The CUDA side, on fake
CUDA tensors: tests/test_cuda_dryrun.py.)"""

import pytest
import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from nanochat import fp8, gpt
from nanochat.planning import memory

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
M, K, N = 32, 128, 64  # tokens, in, out


@pytest.fixture(autouse=True)
def base_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(tmp_path))  # the memory estimate's disk cache


def by_hand(t, dtype):
    """(t in the float8 `dtype`, t as those float8 values stand for it, in fp64): the tensorwise
    recipe as stated (the format's largest value over t's largest magnitude, in fp64 then fp32;
    the fp32 product clamped to the format's range), apart from nanochat/fp8.py."""
    top = torch.finfo(dtype).max
    scale = torch.tensor(top / t.abs().max().item(), dtype=torch.float32)
    q = torch.clamp(t.float() * scale, -top, top).to(dtype)
    return q, q.double() / scale.double()


def layer(out_features=N, in_features=K, seed=0):
    torch.manual_seed(seed)
    return fp8.Float8Linear(nn.Linear(in_features, out_features, bias=False))


def same_bits(a, b):
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_quantize_is_the_tensorwise_recipe():
    torch.manual_seed(0)
    x = torch.randn(M, K) * 3
    for dtype in (E4M3, E5M2):
        q, inv = fp8.quantize(x, dtype)
        expected, _ = by_hand(x, dtype)
        assert same_bits(q, expected)
        assert q.float().abs().max() == torch.finfo(dtype).max  # the largest magnitude lands on the format's top
        assert inv.dtype == torch.float32 and inv.dim() == 0
        assert inv.item() == pytest.approx(x.abs().max().item() / torch.finfo(dtype).max, rel=1e-6)
    q, inv = fp8.quantize(torch.zeros(4, 16), E4M3)  # a zero-initialized projection at step 0
    assert torch.isfinite(inv) and q.float().eq(0).all()


def test_forward_is_the_product_of_the_e4m3_operands():
    torch.manual_seed(1)
    lin = layer()
    x = torch.randn(2, M // 2, K)
    y = lin(x)
    _, x_deq = by_hand(x.reshape(M, K), E4M3)
    _, w_deq = by_hand(lin.weight.detach(), E4M3)
    ref = (x_deq @ w_deq.T).reshape(2, M // 2, N)
    assert y.shape == (2, M // 2, N) and y.dtype == x.dtype
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    exact = x @ lin.weight.detach().T  # and e4m3 keeps it within a few percent of the exact product
    assert ((y - exact).norm() / exact.norm()).item() < 0.05


def test_backward_is_the_products_with_the_e5m2_gradient():
    torch.manual_seed(2)
    lin = layer()
    x = torch.randn(M, K, requires_grad=True)
    g = torch.randn(M, N)
    lin(x).backward(g)
    _, x_deq = by_hand(x.detach(), E4M3)
    _, w_deq = by_hand(lin.weight.detach(), E4M3)
    _, g_deq = by_hand(g, E5M2)
    for got, ref in ((x.grad, g_deq @ w_deq), (lin.weight.grad, g_deq.T @ x_deq)):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    exact = g @ lin.weight.detach()
    assert ((x.grad - exact).norm() / exact.norm()).item() < 0.1


def test_fast_accumulation_forward_only_and_the_operands_formats(monkeypatch):
    calls = []
    real = torch._scaled_mm

    def watched(a, b, **kwargs):  # (formats, fast accumulation, a row-major, b column-major)
        calls.append((a.dtype, b.dtype, kwargs["use_fast_accum"], a.is_contiguous(), b.t().is_contiguous()))
        return real(a, b, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", watched)
    x = torch.randn(M, K, requires_grad=True)
    layer()(x).sum().backward()  # the gradient of a sum arrives as an expand (stride 0)
    assert calls == [(E4M3, E4M3, True, True, True),  # y = x W^T
                     (E5M2, E4M3, False, True, True),  # dx = dy W
                     (E5M2, E4M3, False, True, True)]  # dW = dy^T x


def test_backward_keeps_only_float8_operands_and_their_scales():
    saved = []
    lin = layer()
    x = torch.randn(2, M // 2, K, requires_grad=True)
    with saved_tensors_hooks(lambda t: saved.append((t.dtype, tuple(t.shape))) or t, lambda t: t):
        lin(x)
    assert saved == [(E4M3, (M, K)), (torch.float32, ()), (E4M3, (N, K)), (torch.float32, ())]


def test_output_dtype_follows_autocast_or_the_input():
    lin = layer()
    x = torch.randn(M, K)
    assert lin(x.bfloat16()).dtype == torch.bfloat16  # 2026-07: activations carry the compute dtype
    with torch.autocast("cpu", dtype=torch.bfloat16):  # 2026-01: the plain layer's output under autocast
        assert lin(x).dtype == nn.Linear(K, N, bias=False)(x).dtype == torch.bfloat16


def tiny_model(trunk, seed=0):
    """Widths that convert (128; the head's 320 after padding) at two layers."""
    torch.manual_seed(seed)
    config = gpt.GPTConfig(sequence_len=32, vocab_size=300, n_layer=2, n_head=1, n_kv_head=1, n_embd=128,
                           trunk=trunk, attention="sdpa")
    return gpt.build_model(config, "cpu")


PROJECTIONS = ("attn.c_q", "attn.c_k", "attn.c_v", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


def test_convert_takes_the_projections_and_the_head_only():
    model = tiny_model("2026-07")
    model.connections.probe = nn.Linear(128, 128, bias=False)  # eligible by size, but a wiring's
    params = {name: id(p) for name, p in model.named_parameters()}
    flops = model.estimate_flops()
    converted, kept = fp8.convert(model)
    assert sorted(converted) == sorted(["lm_head"] + [f"transformer.h.{i}.{p}" for i in range(2) for p in PROJECTIONS])
    assert set(kept) == {"smear_gate", "transformer.h.1.attn.ve_gate"}  # the gates: 24 -> 1, 12 -> 1
    assert all(isinstance(model.get_submodule(name), fp8.Float8Linear) for name in converted)
    assert type(model.connections.probe) is nn.Linear and type(model.smear_gate) is gpt.Linear
    # the same parameters under the same names (checkpoints, optimizer state), the same FLOPs (MFU)
    assert {name: id(p) for name, p in model.named_parameters()} == params
    assert model.estimate_flops() == flops
    assert fp8.convert(model) == ([], kept)  # a converted layer is no longer an nn.Linear


@pytest.mark.parametrize("trunk,plain", [("2026-01", nn.Linear), ("2026-07", gpt.Linear)], ids=["2026-01", "2026-07"])
def test_disabled_runs_the_models_own_layers_and_restores(trunk, plain):
    model = tiny_model(trunk)
    idx = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before = model(idx)
        converted, _ = fp8.convert(model)
        layers = {name: model.get_submodule(name) for name in converted}
        trained = model(idx)
        with fp8.disabled(model):
            assert all(type(model.get_submodule(name)) is plain for name in converted)
            evaluated = model(idx)
        assert all(model.get_submodule(name) is layer for name, layer in layers.items())
        with pytest.raises(RuntimeError), fp8.disabled(model):
            raise RuntimeError("an evaluation that fails")
        assert all(model.get_submodule(name) is layer for name, layer in layers.items())
    assert torch.equal(evaluated, before)
    assert not torch.equal(trained, before) and torch.allclose(trained, before, atol=0.05)


def test_check_device_refuses_all_but_cuda_from_8_9(monkeypatch):
    with pytest.raises(SystemExit) as e:
        fp8.check_device("cpu")
    message = str(e.value.code)
    assert message.startswith("error: --fp8 needs a CUDA GPU of compute capability 8.9") and "\n" not in message
    assert "on cpu; drop --fp8" in message
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    for capability, refused in (((8, 0), True), ((8, 6), True), ((8, 9), False), ((9, 0), False), ((10, 0), False)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        if refused:
            with pytest.raises(SystemExit, match=rf"A100-SXM4-80GB \(compute capability {capability[0]}\."):
                fp8.check_device(torch.device("cuda", 0))
        else:
            assert fp8.check_device(torch.device("cuda", 0)) is None


def test_the_memory_estimate_is_the_real_fp8_steps_peak():
    """The planner traces the converted model (float8 saved tensors, the quantization's copies):
    its eager estimate is a real fp8 step's peak on the CPU (the same ops, on fake tensors: equal
    at this size), and the plain model's estimate, 6 % off it, is not."""
    config = memory.traced_config(gpt.model_config_from_depth(1, 128, 64, aspect_ratio=128, head_dim=128))
    batch = 2

    def measured(convert):
        torch.manual_seed(0)
        model = gpt.build_model(config, "cpu")
        if convert:
            fp8.convert(model)
        idx = torch.randint(0, config.vocab_size, (batch, config.sequence_len))
        return memory.tracked_peak(model, lambda: model(idx, idx).backward())

    plain, float8 = (memory.estimate(config, batch, compile=False, cuda=False, fp8=f).step for f in (False, True))
    real = measured(True)
    assert float8 == pytest.approx(real, rel=0.01)
    assert abs(plain / real - 1) > 0.05 and measured(False) == pytest.approx(plain, rel=0.01)
