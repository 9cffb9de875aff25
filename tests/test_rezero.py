"""ReZero: the trunk is h <- h + alpha F(h) written out; alpha starts at 0, so the model starts
as x0 -> head; the output projections start at std 1/sqrt(fan_in), and from the true init every
alpha gets a gradient (none would with nanochat's zero projections); the sub-layers are called
raw; causal; fp64 gradcheck; the paper's parameter count; KV-cache decoding; configuration
errors; an exact resume. The default form's HF export and the other contract checks:
test_variant_contract.py."""

import math

import pytest
import torch

from wiring_checks import (assert_causal, assert_decodes_as_the_full_forward, assert_diagnostics,
                           assert_every_connection_parameter_gets_a_gradient, assert_gradcheck,
                           assert_params_match_spec, assert_resumes_bitwise, assert_sublayers_called_raw,
                           assert_train_flag_error, fp64_frame, handed, random_branches, tiny, tiny_config,
                           tokens, with_moved_body)


def test_the_trunk_is_a_scaled_residual():
    """x_{i+1} = x_i + alpha_i F(x_i), the paper's Eq. for every sub-layer (alphas moved off 0)."""
    conn, x0 = fp64_frame("rezero", n_layer=3)
    branches = random_branches(6, 32)
    h = x0
    for layer, f in zip(conn.layers, branches):
        h = h + layer.alpha * f(h)
    torch.testing.assert_close(conn(x0, branches), h, atol=1e-12, rtol=1e-12)


def test_it_starts_as_the_embedding_with_random_output_projections():
    model = tiny("rezero")
    x0, _, out = handed(model)
    torch.testing.assert_close(out, x0, atol=0, rtol=0)  # alpha = 0: every layer the identity
    for block in model.transformer.h:
        for proj in (block.attn.c_proj, block.mlp.c_proj):
            fan_in = proj.weight.shape[1]
            assert proj.weight.abs().max() <= math.sqrt(3 / fan_in)
            assert abs(proj.weight.std().item() * math.sqrt(fan_in) - 1) < 0.1
    assert tiny("prenorm").transformer.h[0].attn.c_proj.weight.abs().max() == 0  # other wirings: nanochat's zero


def alpha_gradients(model):
    idx = tokens()
    model(idx[:, :-1], idx[:, 1:]).backward()
    return torch.cat([layer.alpha.grad for layer in model.connections.layers])


def test_every_alpha_learns_from_the_true_init_and_none_would_with_zero_projections():
    assert (alpha_gradients(tiny("rezero")) != 0).all()
    dead = tiny("rezero")
    with torch.no_grad():
        for block in dead.transformer.h:
            block.attn.c_proj.weight.zero_()
            block.mlp.c_proj.weight.zero_()
    assert (alpha_gradients(dead) == 0).all()


def test_the_sub_layers_are_called_raw():
    assert_sublayers_called_raw(with_moved_body("rezero"))


def test_causal_gradients_gradcheck_and_parameter_count():
    assert_causal(with_moved_body("rezero"), tokens())
    assert_diagnostics(tiny("rezero"))
    assert_every_connection_parameter_gets_a_gradient(tiny("rezero"))
    assert_gradcheck("rezero", n_layer=2)
    assert_params_match_spec("rezero")
    assert sum(p.numel() for p in tiny("rezero", n_layer=12).connections.parameters()) == 24  # one alpha each


def test_kv_cache_decode_equals_the_full_forward():
    assert_decodes_as_the_full_forward("rezero")


@pytest.mark.parametrize("overrides, message", [
    (dict(hc_streams=4), "hc=.rezero. has one stream; got hc_streams=4"),
    (dict(hc_kernels="liger"), "does not run hc='rezero'"),
    (dict(hc_pre="delayed"), "does not apply to hc='rezero'"),
    (dict(cmhc_beta=1.0), "only applies to hc='cmhc'"),
])
def test_bad_configurations_are_one_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config("rezero", **overrides)


def test_flags_error_and_resume():
    assert_train_flag_error(("--hc", "rezero", "--hc-streams", "4"), ("error:", "--hc-streams"))
    assert_resumes_bitwise("--hc", "rezero")
