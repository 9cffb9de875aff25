"""Post-norm: the trunk is h <- RMSNorm_g(h + F(h)) written out; the model calls its sub-layers
raw (not on norm(h)); x0 passes unchanged at init; causal; every gain gets a gradient; fp64
gradcheck; the factory's parameter count and none without gains; KV-cache decoding with and
without gains; configuration errors; an exact resume. The default form's HF export and the
other contract checks: test_variant_contract.py."""

import pytest
import torch

from nanochat import connections
from wiring_checks import (assert_causal, assert_decodes_as_the_full_forward, assert_diagnostics,
                           assert_every_connection_parameter_gets_a_gradient, assert_gradcheck,
                           assert_params_match_spec, assert_resumes_bitwise, assert_sublayers_called_raw,
                           assert_train_flag_error, fp64_frame, handed, random_branches, tiny, tiny_config,
                           tokens, with_moved_body)


def rms(x):
    return x / x.pow(2).mean(-1, keepdim=True).add(torch.finfo(x.dtype).eps).sqrt()


@pytest.mark.parametrize("norm_weight", [True, False])
def test_the_trunk_is_the_norm_after_each_sum(norm_weight):
    """The original Transformer's Add & Norm per sub-layer (with the factory's RMSNorm gains)."""
    conn, x0 = fp64_frame("postnorm", n_layer=3, hc_norm_weight=norm_weight)
    branches = random_branches(6, 32)
    h = x0
    for layer, f in zip(conn.layers, branches):
        h = rms(h + f(h)) * (layer.gain if norm_weight else 1.0)
    torch.testing.assert_close(conn(x0, branches), h, atol=1e-12, rtol=1e-12)


def test_the_model_calls_its_sub_layers_raw():
    assert_sublayers_called_raw(with_moved_body("postnorm"))


def test_x0_passes_unchanged_at_init():
    """Zero output projections and unit gains: each step is norm(x0) = x0 (x0 is normed)."""
    x0, _, out = handed(tiny("postnorm"))
    torch.testing.assert_close(out, x0)


def test_causal_gradients_gradcheck_and_parameter_count():
    assert_causal(with_moved_body("postnorm"), tokens())
    assert_diagnostics(tiny("postnorm"))
    assert_every_connection_parameter_gets_a_gradient(tiny("postnorm"))
    assert_gradcheck("postnorm", n_layer=2)
    assert_params_match_spec("postnorm")
    assert_params_match_spec("postnorm", hc_norm_weight=False)


def test_parameter_count_is_the_factorys():
    """hyper-connection-factory's post-norm: one RMSNorm of width d per sub-layer, 6,144 at 12 x 256."""
    spec = connections.spec("postnorm")
    assert spec.params(tiny_config("postnorm", n_layer=12, n_embd=256)) == 24 * 256
    assert spec.params(tiny_config("postnorm", hc_norm_weight=False)) == 0


@pytest.mark.parametrize("norm_weight", [True, False])
def test_kv_cache_decode_equals_the_full_forward(norm_weight):
    assert_decodes_as_the_full_forward("postnorm", hc_norm_weight=norm_weight)


@pytest.mark.parametrize("overrides, message", [
    (dict(hc_streams=4), "hc=.postnorm. has one stream; got hc_streams=4"),
    (dict(hc_recompute=True), "hc_recompute=True does not apply to hc='postnorm'"),
    (dict(hc_expand="lss"), "does not apply to hc='postnorm'"),
    (dict(dar_gate="zero"), "only applies to hc='dar'"),
])
def test_bad_configurations_are_one_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config("postnorm", **overrides)


def test_flags_error_and_resume():
    assert_train_flag_error(("--hc", "postnorm", "--hc-streams", "4"), ("error:", "--hc-streams"))
    assert_resumes_bitwise("--hc", "postnorm")
