"""Circulant hyper-connections: H_res exactly doubly stochastic (every row and column holds the n
shift weights); the layer equals the source's map written out; its init; pre-norm at init once
phi is zero, and close to it with the source's random phi; causal; every parameter gets a
gradient; fp64 gradcheck; the source's parameter count; configuration errors; KV-cache decoding
of the other forms. The default form's HF export and decoding: test_variant_contract.py."""

import math

import pytest
import torch

from nanochat import connections
from wiring_checks import (assert_causal, assert_decodes_as_the_full_forward, assert_diagnostics,
                           assert_equals_prenorm_at_init, assert_every_connection_parameter_gets_a_gradient,
                           assert_gradcheck, assert_params_match_spec, assert_resumes_bitwise,
                           assert_train_flag_error, moved, prenorm_logits, random_branches, tiny, tiny_config,
                           tokens, with_moved_body)


def layers(n=4, C=8, n_layer=2, beta=1.0, **fields):
    conn = connections.build(tiny_config("cmhc", n_layer=n_layer, n_embd=C, hc_streams=n, cmhc_beta=beta, **fields))
    conn.init_weights()
    return conn.layers


@pytest.mark.parametrize("n", (2, 3, 4, 5))
def test_h_res_is_exactly_doubly_stochastic(n):
    layer = moved(layers(n=n)[1], scale=30.0)
    X = torch.randn(2, 3, n, 8)
    z = layer.logits(X)[..., 2 * n:]
    c = layer.shift_weights(z)
    h_res = layer.coefficients(X)[2]
    for rows in (h_res, h_res.transpose(-1, -2)):  # each row and each column holds c, permuted
        torch.testing.assert_close(rows.sort(-1).values, c.sort(-1).values.unsqueeze(-2).expand_as(rows),
                                   atol=0, rtol=0)
    assert (h_res.sum(-1) - 1).abs().max() < 1e-6 and (h_res.sum(-2) - 1).abs().max() < 1e-6
    assert (torch.diagonal(h_res, dim1=-2, dim2=-1) >= 1 - layer.gamma).all()  # the leak


def test_matches_the_sources_map():
    """X' = H_res X + H_post^T F(H_pre X) with h = a (phi v) / r + b, r = |v| / sqrt(nC),
    H_pre = sigmoid, H_post = 2 sigmoid, c = (1 - gamma) e_0 + gamma softmax(z) and
    H_res = sum_k c_k Pi^k, written from the manuscript (Pi: stream t receives t - 1)."""
    n, C = 4, 8
    layer = moved(layers(n=n, C=C, hc_norm_weight=False)[1]).double()
    X = torch.randn(2, 3, n, C, dtype=torch.float64)
    f = random_branches(1, C)[0]
    v = X.flatten(-2)
    r = v.norm(dim=-1, keepdim=True) / math.sqrt(n * C)
    h = layer.alpha.repeat_interleave(n) * (v @ layer.weight) / r + layer.bias  # a_pre, a_post, a_res
    H_pre, H_post = torch.sigmoid(h[..., :n]), 2 * torch.sigmoid(h[..., n:2 * n])
    gamma = 1.0 / 8  # beta / (2 L) with beta = 1, L = 4 sub-layers (2 blocks)
    c = gamma * torch.softmax(h[..., 2 * n:], dim=-1)
    c[..., 0] += 1 - gamma
    Pi = torch.roll(torch.eye(n, dtype=torch.float64), 1, dims=0)
    H_res = sum(c[..., k, None, None] * torch.linalg.matrix_power(Pi, k) for k in range(n))
    expected = H_res @ X + H_post[..., None] * f((H_pre[..., None, :] @ X).squeeze(-2))[..., None, :]
    torch.testing.assert_close(layer(X, f), expected, atol=1e-6, rtol=1e-6)  # our norm's epsilon


def test_init_is_the_sources():
    n, C = 4, 8
    layer = layers(n=n, C=C)[0]
    assert layer.alpha.tolist() == pytest.approx([0.01] * 3)
    assert abs(layer.weight.std().item() - 0.02 / math.sqrt(n * C)) < 0.2 * 0.02 / math.sqrt(n * C)
    with torch.no_grad():
        layer.weight.zero_()
    h_pre, h_post, h_res = layer.coefficients(torch.randn(1, 2, n, C))
    gamma = 1.0 / 8  # beta = 1 over 2 * 4 sub-layers
    torch.testing.assert_close(h_pre, torch.full_like(h_pre, 1 / n))
    torch.testing.assert_close(h_post, torch.ones_like(h_post))
    torch.testing.assert_close(h_res[0, 0], (1 - gamma) * torch.eye(n) + gamma / n)


def zero_phi(model):
    with torch.no_grad():
        for layer in model.connections.layers:
            layer.weight.zero_()


def test_pre_norm_at_init_with_phi_zero_and_close_with_the_sources_phi():
    assert_equals_prenorm_at_init("cmhc", adjust=zero_phi, cmhc_beta=1.0)
    model = with_moved_body("cmhc", cmhc_beta=1.0)
    idx = tokens()
    gap = (model(idx) - prenorm_logits(model, idx)).abs().max().item()
    assert 0 < gap < 1e-2


def test_causal_gradients_gradcheck_and_parameter_count():
    assert_causal(tiny("cmhc", cmhc_beta=1.0), tokens())
    assert_diagnostics(tiny("cmhc", cmhc_beta=1.0))
    assert_every_connection_parameter_gets_a_gradient(tiny("cmhc", cmhc_beta=1.0))
    assert_gradcheck("cmhc", hc_streams=3, cmhc_beta=1.0)
    assert_params_match_spec("cmhc")
    assert_params_match_spec("cmhc", hc_streams=3, hc_norm_weight=False)


@pytest.mark.parametrize("options", [dict(cmhc_beta=1.0), dict(hc_pre="delayed"),
                                     dict(hc_expand="lss", hc_reduce="learned")], ids=str)
def test_kv_cache_decode_equals_the_full_forward(options):
    """Another beta and the HC options (the default: test_engine.py)."""
    assert_decodes_as_the_full_forward("cmhc", **options)


def test_parameter_count_is_the_sources():
    """The manuscript: nC * 3n + 3n + 1 per sub-layer, 36,877 at n = 4, C = 768 (no norm weight);
    ours has the family's three alphas where the source has one: 2 more."""
    layer = connections.build(tiny_config("cmhc", hc_streams=4, hc_norm_weight=False)).layers[0]
    assert connections.VARIANTS["cmhc"].layer_params(4, 768, norm_weight=False) == 36_877 + 2
    assert sum(p.numel() for p in layer.parameters()) == connections.VARIANTS["cmhc"].layer_params(4, 32, False)


@pytest.mark.parametrize("overrides, message", [
    (dict(cmhc_beta=-1.0), "cmhc_beta=-1.0 must be a finite number >= 0"),
    (dict(cmhc_beta=float("inf")), "cmhc_beta=inf must be a finite number >= 0"),
    (dict(cmhc_beta=float("nan")), "must be a finite number"),
    (dict(hc_streams=1), "needs hc_streams >= 2"),
])
def test_bad_configurations_are_one_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config("cmhc", **overrides)


@pytest.mark.parametrize("beta, n_layer, gamma", [(4.0, 6, 1 / 6), (4.0, 12, 1 / 12), (1.0, 2, 1 / 8), (0.0, 2, 0.0),
                                                   (4.0, 1, 1.0)])
def test_the_leak_is_beta_over_the_sub_layers_at_most_one(beta, n_layer, gamma):
    """gamma = min(1, beta / (2 L)), L the residual sub-layers (two per block) as the source's code
    counts them; its runs: beta = 4 at 6 blocks, gamma = 1/6."""
    conn = connections.build(tiny_config("cmhc", n_layer=n_layer, n_embd=8, cmhc_beta=beta))
    assert [layer.gamma for layer in conn.layers] == pytest.approx([gamma] * 2 * n_layer)


def test_its_field_belongs_to_it():
    with pytest.raises(ValueError, match="cmhc_beta=2.0 only applies to hc='cmhc'"):
        tiny_config("mhc", cmhc_beta=2.0)


def test_flags_error_and_resume():
    assert_train_flag_error(("--hc", "cmhc", "--cmhc-beta", "inf"), ("error:", "--cmhc-beta"))
    assert_resumes_bitwise("--hc", "cmhc")
