"""Frac-Connections: at init the model computes what the pre-norm residual computes; the
layer against a plain transcription of the paper's Alg. 2 (forward and gradients, also with
hc_recompute); the state is a view of the hidden state; the parameter count (the paper's
formula, 46,992 at D = 12, m = 4); its configuration errors."""

import math

import pytest
import torch
import torch.nn.functional as F

from nanochat import connections
from nanochat.connections.diagnostics import collect_hc_stats, frac_layer_params, model_hc_params
from nanochat.gpt import GPTConfig, build_model
from test_connections import assert_matches_reference, hc_config, make_branch

VOCAB = 64


def tiny(hc, **kw):
    torch.manual_seed(0)
    cfg = GPTConfig(sequence_len=16, vocab_size=VOCAB, n_layer=2, n_head=2, n_kv_head=2, n_embd=32, hc=hc, **kw)
    return build_model(cfg, "cpu")


def test_frac_model_at_init_equals_the_residual_model():
    """Same transformer weights (away from their init, so every branch matters), connections
    at init: the residual baseline (l_resid = 1, l_x0 = 0) and frac (B = 1, Y = A = I) give
    the same logits."""
    residual, frac = tiny("residual"), tiny("frac")
    with torch.no_grad():
        for name, p in residual.named_parameters():
            if not name.startswith("connections."):
                p.add_(0.1 * torch.randn_like(p))
    weights = {k: v for k, v in residual.state_dict().items() if not k.startswith("connections.")}
    assert frac.load_state_dict(weights, strict=False).unexpected_keys == []
    idx = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = residual(idx), frac(idx)
    assert expected.std() > 0.1  # the branches really contribute
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def reference_layer(layer, X, branch):
    """The paper's Alg. 2 written out per fraction: H (B, T, m, d)."""
    m, d = layer.m, layer.d
    s_beta, s_alpha = layer.scale
    rows_beta, rows_y, rows_a = [], [], []
    for i in range(m):
        hbar = F.rms_norm(X[..., i, :], (d,), layer.norm_weight)
        z = torch.tanh(hbar @ layer.weight)  # (B, T, 2m + 1)
        rows_beta.append(s_beta * z[..., 0] + layer.static[i, 0])
        rows_y.append(s_alpha * z[..., 1:m + 1] + layer.static[i, 1:m + 1])
        rows_a.append(s_alpha * z[..., m + 1:] + layer.static[i, m + 1:])
    beta, Y, A = torch.stack(rows_beta, -1), torch.stack(rows_y, -2), torch.stack(rows_a, -2)
    # mix_h = alpha^T H: rows 0..m-1 the branch input, rows m..2m-1 the residual
    inputs = [sum(Y[..., i, j, None] * X[..., i, :] for i in range(m)) for j in range(m)]
    residual = [sum(A[..., i, j, None] * X[..., i, :] for i in range(m)) for j in range(m)]
    y = branch(torch.cat(inputs, dim=-1))
    return torch.stack([beta[..., j, None] * y[..., j * d:(j + 1) * d] + residual[j] for j in range(m)], dim=-2)


def random_frac_layer(m, C, seed, recompute=False):
    conn = connections.build(hc_config("frac", m, C, n_layer=1, recompute=recompute))
    conn.init_weights()
    layer = conn.layers[0]
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    return layer


@pytest.mark.parametrize("m, recompute", [(2, False), (4, False), (4, True)])
def test_layer_matches_the_papers_algorithm(m, recompute):
    C = 16
    layer, ref = random_frac_layer(m, C, 3, recompute), random_frac_layer(m, C, 3)
    branch = make_branch(C)
    X1, X2 = (torch.randn(2, 3, m, C // m, generator=torch.Generator().manual_seed(5)).requires_grad_()
              for _ in range(2))
    R = torch.randn(2, 3, m, C // m, generator=torch.Generator().manual_seed(6))
    assert_matches_reference(layer(X1, branch), reference_layer(ref, X2, branch), X1, X2, layer, ref, R)


def test_coefficients_follow_the_h_convention():
    layer = random_frac_layer(4, 16, 7)
    X = torch.randn(2, 3, 4, 4)
    h_pre, h_post, h_res = layer.coefficients(X)
    assert h_pre.shape == h_res.shape == (2, 3, 4, 4) and h_post.shape == (2, 3, 4)
    branch = make_branch(16)
    u = (h_pre @ X).flatten(-2)
    expected = h_res @ X + h_post[..., None] * branch(u).unflatten(-1, (4, 4))
    torch.testing.assert_close(layer(X, branch), expected, atol=1e-6, rtol=1e-6)


def test_state_is_a_view_of_the_hidden_state():
    conn = connections.build(hc_config("frac", 4, 16, n_layer=1))
    x0 = torch.randn(2, 3, 16)
    X = conn.expand(x0)
    assert X.shape == (2, 3, 4, 4) and X.data_ptr() == x0.data_ptr()
    assert torch.equal(X[..., 1, :], x0[..., 4:8])
    assert conn.reduce(X).data_ptr() == x0.data_ptr() and torch.equal(conn.reduce(X), x0)


def test_bf16_state_stays_bf16_with_fp32_coefficients():
    layer = random_frac_layer(4, 16, 8)
    X = torch.randn(2, 3, 4, 4).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(X, torch.tanh)
        coefficients = layer.coefficients(X)
    assert out.dtype == torch.bfloat16 and all(c.dtype == torch.float32 for c in coefficients)


def test_parameter_count_is_the_papers_formula():
    assert frac_layer_params(4, 768) == 192 * 9 + 4 * 9 + 2 + 192 == 1958
    assert model_hc_params("frac", 4, 768, 12) == 46_992
    assert model_hc_params("frac", 4, 384, 6) == 11_976
    assert frac_layer_params(4, 768, norm_weight=False) == 1958 - 192
    for m, norm_weight in ((2, True), (4, True), (8, False)):
        model = tiny("frac", hc_streams=m, hc_norm_weight=norm_weight)
        count = sum(p.numel() for p in model.connections.parameters())
        assert count == model_hc_params("frac", m, 32, 2, norm_weight=norm_weight)
    # the paper's own check, OLMo-1B (d = 2048, 16 layers, m = 4): 165,056
    assert 32 * frac_layer_params(4, 2048) == 165_056


def test_diagnostics_measure_a_as_h_res():
    stats = collect_hc_stats(tiny("frac"), torch.randint(0, VOCAB, (1, 8)))
    assert stats["n"] == 4 and stats["composite_row_mae"] == 0 and stats["fwd_gain"] == 1
    assert stats["layers"][0]["h_pre_mean"] == torch.eye(4).tolist()  # Y^T = I at init


@pytest.mark.parametrize("overrides, message", [
    (dict(hc_streams=5), "5 does not divide 32; choose hc_streams among 2, 4, 8, 16"),
    (dict(hc_streams=1), "hc_streams >= 2"),
    (dict(hc_kernels="liger"), "does not run hc='frac'"),
    (dict(hc_expand="lss"), "does not apply to hc='frac'"),
    (dict(hc_pre="delayed"), "does not apply to hc='frac'"),
    (dict(hc_factors=[2, 2]), "only applies to hc='kromhc'"),
])
def test_bad_configurations_are_one_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(sequence_len=16, vocab_size=64, n_layer=1, n_head=2, n_kv_head=2, n_embd=32, hc="frac",
                  **overrides)


def test_trains_a_fixed_batch_and_every_parameter_moves():
    model = tiny("frac")
    g = torch.Generator().manual_seed(1)
    batch = torch.randint(0, VOCAB, (4, 17), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    before = {k: v.detach().clone() for k, v in model.connections.named_parameters()}
    losses = []
    for _ in range(30):
        loss = model(batch[:, :-1], batch[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0] and math.isfinite(losses[-1])
    assert all(not torch.equal(p, before[k]) for k, p in model.connections.named_parameters())
