"""DenseFormer (nanochat/connections/denseformer.py): the pre-norm residual at init, the
depth-weighted averages against a transcription of the paper's equations, causality,
gradients (every alpha; fp64 gradcheck), KV-cache decoding, its parameter count, its flags,
and a run killed and resumed bitwise through the real CLI."""

import pytest
import torch
from torch.func import functional_call

from nanochat.gpt import GPT, GPTConfig, build_model, model_config_from_depth
from test_gpt import randomize
from test_train_e2e import base, kill_resume_and_compare  # noqa: F401 (base: a fixture)
import wiring_checks
from wiring_checks import assert_causal, assert_decode_matches, assert_one_error_line, assert_refused, prenorm_logits

VOCAB = 64
SHAPES = [dict(), dict(dwa_dilation=2), dict(dwa_period=2), dict(dwa_dilation=2, dwa_period=3)]


def shape_id(shape):
    return "-".join(f"{k[4:]}{v}" for k, v in shape.items()) or "default"


def tiny(n_layer=4, **fields):
    cfg = GPTConfig(sequence_len=16, vocab_size=VOCAB, n_layer=n_layer, n_head=2, n_kv_head=2, n_embd=32,
                    hc="denseformer", **fields)
    return build_model(cfg, "cpu")


def alphas(model):
    return {name: p for name, p in model.named_parameters() if name.endswith(".alpha")}


def random_alphas(model, seed=2):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in alphas(model).values():
            p.copy_(torch.randn(p.shape, generator=g))
    return model


def tokens(seed=0, T=12):
    return wiring_checks.tokens(seed, VOCAB, T)


def reference_logits(model, idx):
    """The paper's equations over the model's own sub-layers: X_0 = x0; block i computes
    X_i = Block_i(Y_{i-1}); Y_i = sum_j A[i, j] X_j with A[i] holding alpha_i at S_i (and
    A[i, i] = 1 where the period skips the average): one row of a lower-triangular matrix."""
    cfg, L = model.config, model.config.n_layer
    A = torch.zeros(L + 1, L + 1, dtype=torch.float64)
    for i in range(1, L + 1):
        layer = model.connections.layers[2 * i - 1]
        if layer.alpha is None:
            A[i, i] = 1.0
        else:
            for a, j in zip(layer.alpha.detach().double(), range(i % cfg.dwa_dilation, i + 1, cfg.dwa_dilation)):
                A[i, j] = a

    def dense(x0, branches):
        X, y = [x0], x0
        for i in range(1, L + 1):
            h = y + branches[2 * i - 2](y)
            X.append(h + branches[2 * i - 1](h))
            y = torch.einsum("j,j...->...", A[i, :i + 1].to(x0.dtype), torch.stack(X))
        return y

    real, model.connections.forward = model.connections.forward, dense
    try:
        return model(idx)
    finally:
        model.connections.forward = real


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_equals_prenorm_at_init(shape):
    """Shared weights off their init (zero output projections would hide any wiring), the
    alphas at theirs: the logits of the pre-norm residual, exactly."""
    model = randomize(tiny(**shape), seed=1)
    model.connections.init_weights()
    with torch.no_grad():
        torch.testing.assert_close(model(tokens()), prenorm_logits(model, tokens()), rtol=0, atol=1e-6)


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_averages_match_the_papers_equations(shape):
    model = random_alphas(randomize(tiny(**shape), seed=3))
    with torch.no_grad():
        ours, ref = model(tokens()), reference_logits(model, tokens())
        assert not torch.allclose(ours, prenorm_logits(model, tokens()), atol=1e-3)  # the alphas matter
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_is_causal():
    assert_causal(random_alphas(randomize(tiny(dwa_dilation=2), seed=4)), tokens())


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_alpha_gets_a_gradient(shape):
    model = random_alphas(randomize(tiny(**shape), seed=5))
    model(tokens(), tokens(1)).backward()
    grads = {name: p.grad for name, p in alphas(model).items()}
    assert grads and all(g is not None and bool((g != 0).all()) for g in grads.values()), grads


def test_gradcheck_fp64():
    model = random_alphas(randomize(tiny(n_layer=3, dwa_dilation=2), seed=6)).double()
    names = list(alphas(model))
    idx = tokens(T=4)[:1]

    def logits(*values):
        return functional_call(model, dict(zip(names, values)), (idx,))

    inputs = tuple(p.detach().clone().requires_grad_() for p in alphas(model).values())
    assert torch.autograd.gradcheck(logits, inputs, eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_kv_cache_decoding_equals_the_full_forward(shape):
    assert_decode_matches(random_alphas(randomize(tiny(**shape), seed=7)), tokens())


def test_parameter_count_is_the_papers():
    """L_b (L_b + 3) / 2 alphas at dilation and period 1: 90 at 12 blocks."""
    config = model_config_from_depth(12, 32768, 2048, hc="denseformer")
    with torch.device("meta"):
        assert GPT(config).param_counts()["connections"] == 90 == 12 * 15 // 2
    assert tiny(n_layer=4, dwa_dilation=2).param_counts()["connections"] == 1 + 2 + 2 + 3  # |S_1..4| at k = 2
    assert tiny(n_layer=4, dwa_period=2).param_counts()["connections"] == 3 + 5  # blocks 2 and 4 only


@pytest.mark.parametrize("argv, message", [
    (["--hc", "denseformer", "--dwa-dilation", "0"], "argument --dwa-dilation: "),
    (["--hc", "denseformer", "--dwa-period", "-1"], "argument --dwa-period: "),
    (["--hc", "denseformer", "--dwa-period", "two"], "argument --dwa-period: "),
])
def test_bad_flag_values_are_one_error_line(capsys, argv, message):
    assert_one_error_line(capsys, argv, message)


@pytest.mark.parametrize("argv, message", [
    (["--hc", "kromhc", "--dwa-period", "2"], "dwa_period=2 only applies to hc='denseformer'"),
    (["--hc", "denseformer", "--hc-streams", "4"], "hc='denseformer' has one state"),
    (["--hc", "denseformer", "--hc-expand", "lss"], "does not apply to hc='denseformer'"),
    (["--hc", "denseformer", "--hc-recompute", "true"], "hc_recompute=True does not apply to hc='denseformer'"),
])
def test_flags_that_do_not_apply_are_refused(argv, message):
    assert_refused(argv, message, VOCAB)


@pytest.mark.slow
def test_resumes_bitwise_after_sigkill(base):  # noqa: F811 (the fixture)
    kill_resume_and_compare(base, ["--hc", "denseformer", "--dwa-dilation", "2", "--num-iterations", "8",
                                   "--save-every", "2"])
