"""Multi-head attention residuals: one head is attnres in its per-sub-layer form (block size 1), to
the bit; pre-norm at init through the norms; H heads equal the paper's per-head read written out
(full-width RMS norm, then the heads' slices); causal; every parameter but the first read's gets
a gradient; fp64 gradcheck; the parameter count; configuration errors; KV-cache decoding of the
other forms. The default form's HF export and decoding: test_variant_contract.py."""

import pytest
import torch

from nanochat import connections
from wiring_checks import (assert_causal, assert_decodes_as_the_full_forward, assert_diagnostics,
                           assert_equals_prenorm_at_init, assert_every_connection_parameter_gets_a_gradient,
                           assert_gradcheck, assert_params_match_spec, assert_resumes_bitwise,
                           assert_train_flag_error, fp64_frame, random_branches, tiny, tiny_config, tokens)
from test_gpt import randomize


def test_one_head_is_attnres_with_block_size_one():
    attnres = randomize(tiny("attnres", attnres_block_size=1), seed=2)
    mhar = tiny("mhar", mhar_heads=1)
    mhar.load_state_dict(attnres.state_dict())
    idx = tokens()
    assert torch.equal(mhar(idx), attnres(idx))
    two_heads = tiny("mhar", mhar_heads=2)
    two_heads.load_state_dict(attnres.state_dict())
    assert not torch.allclose(two_heads(idx), attnres(idx))


@pytest.mark.parametrize("H", (1, 2))
def test_the_mean_of_the_sources_is_prenorm_through_the_norms(H):
    """The sources sum to pre-norm's h: the zero-query reads are h / N, which the sub-layers'
    RMSNorm and the model's final norm do not tell from h."""
    assert_equals_prenorm_at_init("mhar", mhar_heads=H)


def reference_read(read, sources, H):
    """alpha^h_i = softmax_i(q_[h] . RMSNorm_g(s_i)_[h]); read_[h] = sum_i alpha^h_i s_i,[h]."""
    S = torch.stack(sources)  # (N, B, T, C)
    K = S / S.pow(2).mean(-1, keepdim=True).sqrt() * read.gain
    N, B, T, C = S.shape
    logits = (K * read.query).reshape(N, B, T, H, C // H).sum(-1)
    alpha = torch.softmax(logits, dim=0)
    return (alpha[..., None] * S.reshape(N, B, T, H, C // H)).sum(0).reshape(B, T, C)


@pytest.mark.parametrize("H", (1, 2, 4))
def test_matches_the_papers_per_head_read(H):
    conn, x0 = fp64_frame("mhar", seed=8, n_layer=2, mhar_heads=H)
    branches = random_branches(4, 32)
    sources = [x0]
    for layer, f in zip(conn.layers, branches):
        sources.append(f(reference_read(layer.read, sources, H)))
    torch.testing.assert_close(conn(x0, branches), reference_read(conn.reduce, sources, H), atol=1e-6, rtol=1e-6)


def test_zero_queries_read_the_mean():
    conn = connections.build(tiny_config("mhar", n_layer=2, mhar_heads=4))
    conn.init_weights()
    seen = []
    x0 = torch.randn(1, 2, 32)
    branches = [lambda u, f=f: seen.append(u) or f(u) for f in random_branches(4, 32, dtype=torch.float32)]
    conn(x0, branches)
    torch.testing.assert_close(seen[1], (x0 + branches[0](x0)) / 2)


def test_causal_gradients_gradcheck_and_parameter_count():
    assert_causal(tiny("mhar"), tokens())
    assert_diagnostics(tiny("mhar"))
    assert_every_connection_parameter_gets_a_gradient(tiny("mhar"))  # the first read: SPEC dead
    assert_gradcheck("mhar", n_layer=1, mhar_heads=2)
    assert_params_match_spec("mhar")
    assert_params_match_spec("mhar", hc_norm_weight=False)
    assert sum(p.numel() for p in tiny("mhar").connections.parameters()) == 5 * 2 * 32  # 2C per read, 4 + final


def test_kv_cache_decode_equals_the_full_forward():
    """The default (n_kv_head heads): test_engine.py."""
    assert_decodes_as_the_full_forward("mhar", mhar_heads=4)


def test_default_heads_are_the_kv_heads():
    assert tiny_config("mhar").mhar_heads == 2


@pytest.mark.parametrize("overrides, message", [
    (dict(mhar_heads=3), "mhar_heads=3 does not divide n_embd=32"),
    (dict(mhar_heads=-1), "must be a whole number of heads"),
    (dict(hc_streams=4), "got hc_streams=4. Drop --hc-streams"),
])
def test_bad_configurations_are_one_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config("mhar", **overrides)


def test_flags_error_and_resume():
    assert_train_flag_error(("--hc", "mhar", "--mhar-heads", "3"), ("error:", "mhar_heads=3 does not divide"))
    assert_resumes_bitwise("--hc", "mhar")
