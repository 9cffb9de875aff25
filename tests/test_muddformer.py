"""MUDDFormer (nanochat/connections/muddformer.py), plain and PrePostDANorm: the pre-norm
residual at init, the dense connections against a transcription of the reference's equations,
causality, gradients (every weight; fp64 gradcheck), KV-cache decoding, the published
parameter counts, its flag, and a run killed and resumed bitwise through the real CLI."""

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from nanochat.connections.backends.ops import RMS_EPS
from nanochat.gpt import GPT, GPTConfig, build_model, model_config_from_depth
from test_gpt import randomize
from test_train_e2e import base, kill_resume_and_compare  # noqa: F401 (base: a fixture)
import wiring_checks
from wiring_checks import assert_causal, assert_decode_matches, assert_one_error_line, assert_refused, prenorm_logits

VOCAB = 64
FORMS = [False, True]  # mudd_prepost_norm


def form_id(prepost):
    return "prepost" if prepost else "plain"


def tiny(n_layer=3, prepost=False):
    cfg = GPTConfig(sequence_len=16, vocab_size=VOCAB, n_layer=n_layer, n_head=2, n_kv_head=2, n_embd=32,
                    hc="muddformer", mudd_prepost_norm=prepost)
    return build_model(cfg, "cpu")


def connection_params(model):
    return dict(model.connections.named_parameters())


def random_weights(model, seed=2):
    """Every connection weight off its init (W2 = 0 would make the dynamic part vanish)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.connections.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g) + (p if p.ndim == 1 else 0))
    return model


def tokens(seed=0, T=12):
    return wiring_checks.tokens(seed, VOCAB, T)


def rms(v):
    return F.rms_norm(v, (v.shape[-1],), eps=RMS_EPS)


def reference_logits(model, idx):
    """The equations over the model's own sub-layers and weights: after block i,
    dw = GELU(RMSNorm(X_{i+1}) W1) W2 + a, X^c = sum_j dw[c, j] S_j over the stacked sources
    S (the outputs, or with PrePostDANorm their scaled norms, each state then the newest
    output plus its mix, the R mix post-normed); block i + 1 reads attention from (X^Q, X^K,
    X^V) and adds to X^R."""
    L, prepost, layers = model.config.n_layer, model.config.mudd_prepost_norm, model.connections.layers

    def dense(x0, branches):
        X, (q, k, v, r) = [x0], (x0,) * 4
        for i in range(L):
            h = r + branches[2 * i]((q, k, v))
            out = h + branches[2 * i + 1](h)
            X.append(out)
            layer = layers[2 * i + 1]
            if prepost:
                scales = [layers[1].source_scale[0]] + [layers[2 * j - 1].source_scale[-1] for j in range(1, i + 2)]
                S = torch.stack([rms(x) * g for x, g in zip(X, scales)])
            else:
                S = torch.stack(X)
            ways = 1 if i == L - 1 else 4
            dw = (F.gelu(rms(out) @ layer.w1) @ layer.w2 + layer.a).unflatten(-1, (ways, i + 2))
            M = torch.einsum("btcs,sbtd->cbtd", dw, S)
            if prepost:
                M = torch.cat([M[:-1], (rms(M[-1]) * layer.post_scale)[None]]) + out
            q, k, v, r = (M[0], M[1], M[2], M[3]) if ways == 4 else (None, None, None, M[0])
        return r

    real, model.connections.forward = model.connections.forward, dense
    try:
        return model(idx)
    finally:
        model.connections.forward = real


@pytest.mark.parametrize("prepost", FORMS, ids=form_id)
def test_equals_prenorm_at_init(prepost):
    """Shared weights off their init (zero output projections would hide any wiring), the
    connection at its own: the logits of the pre-norm residual."""
    model = randomize(tiny(prepost=prepost), seed=1)
    model.connections.init_weights()
    with torch.no_grad():
        torch.testing.assert_close(model(tokens()), prenorm_logits(model, tokens()), rtol=0, atol=1e-6)


@pytest.mark.parametrize("prepost", FORMS, ids=form_id)
def test_dense_connections_match_the_reference_equations(prepost):
    model = random_weights(randomize(tiny(prepost=prepost), seed=3)).double()  # fp64: see the KV-cache test
    with torch.no_grad():
        ours, ref = model(tokens()), reference_logits(model, tokens())
        assert not torch.allclose(ours, prenorm_logits(model, tokens()), atol=1e-3)  # the weights matter
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("prepost", FORMS, ids=form_id)
def test_is_causal(prepost):
    assert_causal(random_weights(randomize(tiny(prepost=prepost), seed=4)), tokens())


@pytest.mark.parametrize("prepost", FORMS, ids=form_id)
def test_every_connection_weight_gets_a_gradient(prepost):
    model = random_weights(randomize(tiny(prepost=prepost), seed=5))
    model(tokens(), tokens(1)).backward()
    grads = {name: p.grad for name, p in connection_params(model).items()}
    assert grads and all(g is not None and bool(g.abs().sum() > 0) for g in grads.values()), \
        [name for name, g in grads.items() if g is None or not g.abs().sum() > 0]


@pytest.mark.parametrize("prepost", FORMS, ids=form_id)
def test_gradcheck_fp64(prepost):
    model = random_weights(randomize(tiny(n_layer=2, prepost=prepost), seed=6)).double()
    names = [name for name in connection_params(model) if not name.endswith("w1")]  # W1 (C x K) is the bulk
    idx = tokens(T=3)[:1]
    full = {f"connections.{n}": p for n, p in connection_params(model).items()}

    def logits(*values):
        return functional_call(model, {**full, **{f"connections.{n}": v for n, v in zip(names, values)}}, (idx,))

    inputs = tuple(connection_params(model)[n].detach().clone().requires_grad_() for n in names)
    assert torch.autograd.gradcheck(logits, inputs, eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("prepost", FORMS, ids=form_id)
def test_kv_cache_decoding_equals_the_full_forward(prepost):
    """In fp64: the random dense weights amplify fp32's different summation orders of a full
    forward and a decode step (3e-5 seen), so fp32 would need a tolerance a real mismatch fits in."""
    assert_decode_matches(random_weights(randomize(tiny(prepost=prepost), seed=7)).double(), tokens(), tol=1e-10)


@pytest.mark.parametrize("depth, width, prepost, published", [(12, 768, False, 610_689), (12, 256, False, 217_473),
                                                              (12, 512, False, 414_081), (24, 1024, True, 2_405_445)])
def test_parameter_counts_are_the_published_ones(depth, width, prepost, published):
    """The reference harness's counts: 610.7K at 12 x 768, 217.5K at 12 x 256, 414.1K at
    12 x 512, and 2.405M with PrePostDANorm at 24 x 1024 (its body's K and V norm weights
    apart: ours have none)."""
    config = model_config_from_depth(depth, 32768, 2048, aspect_ratio=width // depth, hc="muddformer",
                                     mudd_prepost_norm=prepost)
    assert config.n_embd == width
    with torch.device("meta"):
        assert GPT(config).param_counts()["connections"] == published


@pytest.mark.parametrize("argv, message", [
    (["--hc", "muddformer", "--mudd-prepost-norm", "maybe"], "argument --mudd-prepost-norm: "),
])
def test_bad_flag_values_are_one_error_line(capsys, argv, message):
    assert_one_error_line(capsys, argv, message)


@pytest.mark.parametrize("argv, message", [
    (["--hc", "kromhc", "--mudd-prepost-norm", "true"], "mudd_prepost_norm=True only applies to hc='muddformer'"),
    (["--hc", "muddformer", "--hc-streams", "4"], "hc='muddformer' has one state"),
    (["--hc", "muddformer", "--hc-pre", "delayed"], "does not apply to hc='muddformer'"),
    (["--hc", "muddformer", "--hc-kernels", "liger"], "does not run hc='muddformer'"),
])
def test_flags_that_do_not_apply_are_refused(argv, message):
    assert_refused(argv, message, VOCAB)


@pytest.mark.slow
def test_resumes_bitwise_after_sigkill(base):  # noqa: F811 (the fixture)
    kill_resume_and_compare(base, ["--hc", "muddformer", "--mudd-prepost-norm", "true", "--num-iterations", "8",
                                   "--save-every", "2"])
