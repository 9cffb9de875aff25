"""The stream state in the compute dtype, for every variant and option.

Under CPU bf16 autocast (with bf16 embeddings, as on CUDA) the state between layers and at
the reduce is bf16, the residual baseline's included (CUDA's autocast rules, which differ,
are held by the CUDA dry run, tests/test_cuda_dryrun.py): nanochat multiplies its stream by 0-dim
scalars (`resid_lambdas[i] * x`), which keep bf16, where shape-(1,) ones would promote the
stream to fp32 from the first block on. And an fp64 model (the gradient checks) computes in
fp64 throughout: no fp32 constant rounds its state."""

import pytest
import torch

from nanochat.connections import VARIANTS
from nanochat.gpt import GPTConfig, build_model, norm

VOCAB = 300
# Every registered variant as configured by default, and the options that change the state.
CASES = [dict(hc=name) for name in VARIANTS] + [
    dict(hc="residual", value_embeds=False), dict(hc="kromhc", hc_recompute=True), dict(hc="kromhc", hc_pre="delayed"),
    dict(hc="mhc", hc_reduce="learned"), dict(hc="mhc_lite", hc_expand="lss"), dict(hc="laurel", laurel_form="rw"),
    dict(hc="dar", dar_source="block", dar_gate="sigmoid_vector")]


def case_id(case):
    return "-".join(str(v) for v in case.values())


def tiny(**fields):
    torch.manual_seed(0)
    cfg = GPTConfig(sequence_len=16, vocab_size=VOCAB, n_layer=2, n_head=2, n_kv_head=2, n_embd=32,
                    window_pattern="SL", **fields)
    model = build_model(cfg, "cpu")
    with torch.no_grad():  # away from the zero-initialized projections and unit scalars
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def state_dtypes(model, idx):
    """The dtype of the state each layer receives, then the one the reduce receives."""
    seen = []
    for layer in model.connections.layers:
        step = layer.step
        layer.step = lambda X, branch, x0, carry, step=step: seen.append(X.dtype) or step(X, branch, x0, carry)
    hook = model.connections.reduce.register_forward_pre_hook(lambda module, args: seen.append(args[0].dtype))
    try:
        logits = model(idx)
    finally:
        hook.remove()
        for layer in model.connections.layers:
            del layer.step
    return seen, logits


def bf16_embeddings(model):
    """As build_model does on CUDA: the embedding tables in bf16."""
    model.cast_embeddings(torch.bfloat16)
    return model


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_state_stays_bf16_under_autocast(case):
    model = bf16_embeddings(tiny(**case))
    idx = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        seen, _ = state_dtypes(model, idx)
    assert len(seen) == 2 * model.config.n_layer + 1
    assert seen == [torch.bfloat16] * len(seen)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_state_stays_bf16_without_autocast_on_the_2026_07_trunk(case, monkeypatch):
    """2026-07 has no autocast: bf16 tables (its compute dtype) and layers that cast their weights;
    every wiring's state stays bf16 all the same (no fp32 parameter promotes it)."""
    monkeypatch.setenv("NANOCHAT_DTYPE", "bfloat16")
    model = tiny(**case, trunk="2026-07")
    assert model.transformer.wte.weight.dtype == torch.bfloat16
    idx = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    seen, logits = state_dtypes(model, idx)
    assert seen == [torch.bfloat16] * (2 * model.config.n_layer + 2)  # the reduce twice: the end, the backout
    assert logits.dtype == torch.float32  # the softcap and the loss in fp32, as 92d63d4's .float()


def nanochats_forward(model, idx):
    """nanochat's GPT.forward at the paper's commit, transcribed: x0 = norm(wte(idx)), then
    before block i x = resid_lambdas[i] * x + x0_lambdas[i] * x0 with (n_layer,) lambdas
    indexed to 0-dim scalars, then x = x + attn(norm(x)); x = x + mlp(norm(x))."""
    starts = model.connections.layers[::2]
    resid_lambdas = torch.cat([layer.l_resid.detach() for layer in starts])
    x0_lambdas = torch.cat([layer.l_x0.detach() for layer in starts])
    T = idx.size(1)
    cos, sin = model.cos[:, :T], model.sin[:, :T]
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else cos.dtype
    cos, sin = cos.to(dtype), sin.to(dtype)
    x = x0 = norm(model.transformer.wte(idx))
    for i, block in enumerate(model.transformer.h):
        x = resid_lambdas[i] * x + x0_lambdas[i] * x0
        ve = model.value_embeds[str(i)](idx) if str(i) in model.value_embeds else None
        x = x + block.attn(norm(x), ve, (cos, sin), model.window_sizes[i], None)
        x = x + block.mlp(norm(x))
    logits = model.lm_head(norm(x))[..., :VOCAB].float()
    return 15 * torch.tanh(logits / 15)


def test_the_residual_row_computes_nanochats_block_under_autocast():
    model = bf16_embeddings(tiny(hc="residual"))
    idx = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ours, theirs = model(idx), nanochats_forward(model, idx)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_an_fp64_model_computes_in_fp64(case):
    model = tiny(**case).double()
    idx = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(3))
    seen, logits = state_dtypes(model, idx)
    assert seen == [torch.float64] * len(seen)
    # Not rounded to fp32 on the way: fp32's answer differs from fp64's by far more than
    # fp64's own rounding, and fp64's is the one both approximate.
    fp32 = tiny(**case)(idx).double()
    assert not torch.equal(logits, fp32)
    assert torch.allclose(logits, fp32, atol=1e-4)


def test_delayed_pre_reads_stream_zero_exactly_in_fp64():
    """The first layer's delayed pre-weights are the one-hot of stream 0: its branch input is
    x0 itself, to the last bit, in fp64 as in fp32."""
    model = tiny(hc="kromhc", hc_pre="delayed").double()
    idx = torch.randint(0, VOCAB, (1, 16), generator=torch.Generator().manual_seed(4))
    inputs = []
    hook = model.transformer.h[0].attn.register_forward_pre_hook(lambda module, args: inputs.append(args[0]))
    model(idx)
    hook.remove()
    x0 = norm(model.transformer.wte(idx))
    assert inputs[0].dtype == torch.float64
    assert torch.equal(inputs[0], norm(x0))


@pytest.mark.parametrize("case", [dict(hc="frac"), dict(hc="attnres")], ids=case_id)
def test_frac_and_attnres_layers_pass_gradcheck_in_fp64(case):
    model = tiny(**case).double()
    layer = model.connections.layers[0]
    X = model.connections.expand(torch.randn(1, 3, 32, dtype=torch.float64)).detach().requires_grad_()
    weight = torch.randn(32, 32, dtype=torch.float64) / 32 ** 0.5

    def step(X):
        return layer(X, lambda u: torch.tanh(u @ weight))

    assert torch.autograd.gradcheck(step, (X,))
