"""The plain pre-norm residual: the trunk against its formula, no parameters, causal, fp64
gradcheck, the residual baseline at its init equals it, its configuration errors and an exact
resume. The checks every wiring runs (these included) live in tests/wiring_checks.py; every
registered variant's default form also goes through tests/test_variant_contract.py (bench,
hc_report, the plan, the report, the HF export, KV decoding)."""

import pytest
import torch

from nanochat import connections
from test_gpt import randomize
from wiring_checks import (assert_causal, assert_diagnostics, assert_gradcheck, assert_params_match_spec,
                           assert_resumes_bitwise, assert_train_flag_error, prenorm_logits,
                           random_branches, tiny, tiny_config, tokens, with_moved_body)


# ----- pre-norm itself

def test_prenorm_is_x_plus_f_of_x_per_sub_layer():
    """The trunk against the formula written out: x <- x + F_l(x) for l = 1 .. 2 * n_layer."""
    conn = connections.build(tiny_config("prenorm", n_layer=3))
    x0 = torch.randn(2, 5, 32, dtype=torch.float64)
    branches = random_branches(6, 32)
    x = x0
    for f in branches:
        x = x + f(x)
    torch.testing.assert_close(conn(x0, branches), x, atol=0, rtol=0)


def test_prenorm_has_no_parameters_is_causal_and_passes_gradcheck():
    model = randomize(tiny("prenorm"))
    assert_params_match_spec("prenorm")
    assert not list(model.connections.parameters())
    assert_causal(model, tokens())
    assert_diagnostics(model)
    assert_gradcheck("prenorm")  # in x0 alone


def test_prenorm_differs_from_the_residual_row_only_by_its_scalars():
    """nanochat's residual with l_resid = 1 and l_x0 = 0 (its init) is pre-norm exactly."""
    model = with_moved_body("residual")
    idx = tokens()
    torch.testing.assert_close(model(idx), prenorm_logits(model, idx), atol=0, rtol=0)
    with torch.no_grad():
        model.connections.layers[2].l_x0.fill_(0.5)
    assert not torch.allclose(model(idx), prenorm_logits(model, idx))


@pytest.mark.parametrize("overrides, message", [
    (dict(hc_streams=4), "hc=.prenorm. has one stream; got hc_streams=4"),
    (dict(hc_recompute=True), "hc_recompute=True does not apply to hc='prenorm'"),
    (dict(hc_kernels="liger"), "does not run hc='prenorm'"),
    (dict(hc_expand="lss"), "does not apply to hc='prenorm'"),
    (dict(attnres_block_size=2), "only applies to hc='attnres'"),
])
def test_bad_configurations_are_one_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config("prenorm", **overrides)


def test_prenorm_flags_error_and_resume():
    assert_train_flag_error(("--hc", "prenorm", "--hc-streams", "4"), ("error:", "--hc-streams"))
    assert_resumes_bitwise("--hc", "prenorm")
