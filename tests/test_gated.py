"""The gated residual: the layer and the mixer equal the release's update written out; pre-norm at
init (the body moved off its init); causal; every parameter gets a gradient; fp64 gradcheck; the
parameter count; configuration errors; KV-cache decoding of the other forms. The default form's
HF export and decoding: test_variant_contract.py."""

import math

import pytest
import torch
import torch.nn.functional as F

from nanochat import connections
from wiring_checks import (assert_causal, assert_decodes_as_the_full_forward, assert_diagnostics,
                           assert_equals_prenorm_at_init, assert_every_connection_parameter_gets_a_gradient,
                           assert_gradcheck, assert_params_match_spec, assert_resumes_bitwise,
                           assert_train_flag_error, fp64_frame, random_branches, tiny, tiny_config, tokens)


def reference_read(read, X):
    """xhat_j = RMSNorm(X_j)(1 + g_j); m = sigmoid(W_up SiLU(W_down vec(xhat) / n)); u = mean_j m_j xhat_j."""
    n, C = X.shape[-2:]
    xhat = X / X.pow(2).mean(-1, keepdim=True).sqrt() * (1 + read.norm_weight)
    v = xhat.reshape(*X.shape[:-2], n * C) / n
    m = torch.sigmoid(torch.einsum("btr,kr->btk", F.silu(torch.einsum("btk,kr->btr", v, read.down)), read.up))
    return (m.reshape(xhat.shape) * xhat).mean(-2), v


def test_matches_the_releases_update():
    """Every sub-layer: X_j + w_j F(u), w = 2 sigmoid(W_inj vec(xhat) / n); then the mixer's u."""
    conn, X0 = fp64_frame("gated", seed=6, n_embd=8, hc_streams=3, gated_rank=2)
    branches = random_branches(4, 8)
    X = X0[..., None, :].expand(2, 3, 3, 8)
    for layer, f in zip(conn.layers, branches):
        u, v = reference_read(layer.read, X)
        w = 2 * torch.sigmoid(torch.einsum("btk,kn->btn", v, layer.inject))
        X = X + w[..., None] * f(u)[..., None, :]
    expected = reference_read(conn.reduce, X)[0]
    torch.testing.assert_close(conn(X0, branches), expected, atol=1e-6, rtol=1e-6)  # our norm's epsilon


def test_init_gates_are_one_half_and_one():
    layer = connections.build(tiny_config("gated", hc_streams=4)).layers[0]
    layer.init_weights()
    h_pre, h_post, h_res = layer.coefficients(torch.randn(1, 2, 4, 32))
    torch.testing.assert_close(h_pre, torch.full_like(h_pre, 0.5 / 4))
    torch.testing.assert_close(h_post, torch.ones_like(h_post))
    assert torch.equal(h_res[0, 0], torch.eye(4))
    bound = math.sqrt(3 / 128)
    assert layer.read.down.abs().max() <= bound and layer.read.down.std() > bound / 3


@pytest.mark.parametrize("fields", [dict(), dict(hc_streams=2, gated_rank=1, hc_norm_weight=False)], ids=str)
def test_equals_prenorm_at_init_and_is_causal(fields):
    assert_equals_prenorm_at_init("gated", **fields)
    assert_causal(tiny("gated", **fields), tokens())
    assert_diagnostics(tiny("gated", **fields))


def test_gradients_gradcheck_and_parameter_count():
    assert_every_connection_parameter_gets_a_gradient(tiny("gated"))
    assert_gradcheck("gated", hc_streams=2, gated_rank=2)
    assert_params_match_spec("gated")
    assert_params_match_spec("gated", hc_streams=3, gated_rank=5, hc_norm_weight=False)


def test_kv_cache_decode_equals_the_full_forward():
    """The default (rank C / 8, with g): test_engine.py."""
    assert_decodes_as_the_full_forward("gated", gated_rank=1, hc_norm_weight=False)


def test_default_rank_is_the_releases_ratio():
    assert tiny_config("gated").gated_rank == 4  # 32 / 8
    assert connections.VARIANTS["gated"].default_rank(2560) == 320


@pytest.mark.parametrize("overrides, message", [
    (dict(gated_rank=-1), "gated_rank=-1 must be a whole number >= 1"),
    (dict(hc_streams=1), "needs hc_streams >= 2"),
    (dict(hc_reduce="learned"), "does not apply to hc='gated'"),
    (dict(hc_recompute=True), "hc_recompute=True does not apply to hc='gated'"),
    (dict(hc_kernels="liger"), "does not run hc='gated'"),
])
def test_bad_configurations_are_one_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config("gated", **overrides)


def test_flags_error_and_resume():
    assert_train_flag_error(("--hc", "gated", "--hc-reduce", "learned"), ("error:", "hc='gated'"))
    assert_resumes_bitwise("--hc", "gated")
