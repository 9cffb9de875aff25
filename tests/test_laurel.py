"""LAuReL: each form equals pre-norm at init and the paper's update written out once trained;
causal; every parameter gets a gradient; fp64 gradcheck; the factory's parameter count; its
configuration errors; KV-cache decoding of the other forms. The default form's HF export and
decoding: test_variant_contract.py."""

import math

import pytest
import torch

from nanochat import connections
from wiring_checks import (assert_causal, assert_decodes_as_the_full_forward, assert_diagnostics,
                           assert_equals_prenorm_at_init, assert_every_connection_parameter_gets_a_gradient,
                           assert_gradcheck, assert_params_match_spec, assert_resumes_bitwise,
                           assert_train_flag_error, fp64_frame, random_branches, tiny, tiny_config, tokens)

FORMS = ("rw", "lr", "rw_lr")


def fields(form, rank=4):
    """The config of a form; the rank belongs to the low-rank forms only."""
    return dict(laurel_form=form) | ({} if form == "rw" else dict(laurel_rank=rank))


@pytest.mark.parametrize("form", FORMS)
def test_equals_prenorm_at_init(form):
    assert_equals_prenorm_at_init("laurel", **fields(form))


@pytest.mark.parametrize("form", FORMS)
def test_matches_the_papers_update_once_trained(form):
    """x_{l+1} = alpha F(x_l) + beta (x_l + x_l A B), written from the paper with
    (alpha, beta) = 2 softmax(w) (no w: 1, 1; no A, B: no low-rank term)."""
    conn, x0 = fp64_frame("laurel", seed=4, n_layer=2, **fields(form, rank=3))
    branches = random_branches(4, 32)
    x = x0
    for layer, f in zip(conn.layers, branches):
        alpha, beta = (2 * torch.exp(layer.w) / torch.exp(layer.w).sum()) if "rw" in form else (1.0, 1.0)
        low_rank = torch.einsum("btc,cr,dr->btd", x, layer.A, layer.B) if "lr" in form else 0.0
        x = alpha * f(x) + beta * (x + low_rank)
    torch.testing.assert_close(conn(x0, branches), x, atol=1e-12, rtol=1e-12)


def test_the_low_rank_init_is_column_orthogonal():
    layer = connections.build(tiny_config("laurel", laurel_rank=4)).layers[0]
    layer.init_weights()
    A = layer.A
    C, r = A.shape
    expected = torch.tensor([[1 / math.sqrt(r * C) if i % r == j else 0.0 for j in range(r)] for i in range(C)])
    torch.testing.assert_close(A, expected, atol=0, rtol=0)
    torch.testing.assert_close(A.t() @ A, torch.eye(r) * (C // r) / (r * C))  # orthogonal columns
    assert not layer.B.any() and not layer.w.any()


@pytest.mark.parametrize("form", FORMS)
def test_causal_gradients_gradcheck_and_parameter_count(form):
    assert_causal(tiny("laurel", **fields(form)), tokens())
    assert_diagnostics(tiny("laurel", **fields(form)))
    assert_every_connection_parameter_gets_a_gradient(tiny("laurel", **fields(form)))
    assert_gradcheck("laurel", **fields(form, rank=2))
    assert_params_match_spec("laurel", **fields(form))


@pytest.mark.parametrize("form", ("rw", "lr"))
def test_kv_cache_decode_equals_the_full_forward(form):
    """The default form: test_engine.py."""
    assert_decodes_as_the_full_forward("laurel", **fields(form))


def test_parameter_count_is_the_factorys():
    """hyper-connection-factory's tiny table: laurel-rw-lr 196.7K at 12 layers x 256, r = 16."""
    spec = connections.VARIANTS["laurel"].SPEC
    count = spec["params"](tiny_config("laurel", n_layer=12, n_embd=256))
    assert count == 24 * (2 * 16 * 256 + 2) and round(count / 1e3, 1) == 196.7


@pytest.mark.parametrize("overrides, message", [
    (dict(laurel_form="pa"), "unknown laurel_form='pa'"),
    (dict(laurel_rank=0), "laurel_rank=0 must be a whole number from 1 to the width 32"),
    (dict(laurel_rank=33), "from 1 to the width 32"),
    (dict(laurel_form="rw", laurel_rank=8), "applies to the low-rank forms"),
    (dict(hc_streams=4), "got hc_streams=4. Drop --hc-streams"),
])
def test_bad_configurations_are_one_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config("laurel", **overrides)


def test_its_fields_belong_to_it():
    with pytest.raises(ValueError, match="laurel_rank=8 only applies to hc='laurel'"):
        tiny_config("prenorm", laurel_rank=8)


def test_flags_error_and_resume():
    assert_train_flag_error(("--hc", "laurel", "--laurel-form", "rw", "--laurel-rank", "8"),
                            ("error:", "laurel_rank=8 applies to the low-rank forms"))
    assert_resumes_bitwise("--hc", "laurel", "--laurel-rank", "4")
