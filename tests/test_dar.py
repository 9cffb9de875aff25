"""Delta attention residuals: pre-norm at init with the zero gate (full and block sources); the
paper's update written out for every source and gate form; causal; every parameter but the first
read's gets a gradient; fp64 gradcheck; the paper's and the factory's parameter counts;
configuration errors; KV-cache decoding of the other forms. The default form's HF export and
decoding: test_variant_contract.py."""

import pytest
import torch

from nanochat import connections
from test_prenorm import (assert_causal, assert_decodes_as_the_full_forward, assert_diagnostics,
                          assert_equals_prenorm_at_init,
                          assert_every_connection_parameter_gets_a_gradient, assert_gradcheck,
                          assert_params_match_spec, assert_resumes_bitwise, assert_train_flag_error,
                          base, fp64_trunk, random_branches, tiny, tiny_config, tokens, with_moved_body)  # noqa: F401
from wiring_checks import prenorm_logits

SOURCES = ("full", "block")
GATES = ("zero", "none", "sigmoid_scalar", "sigmoid_vector")
FIRST_READ = ("layers.0.read.query", "layers.0.read.gain")  # a softmax over x0 alone: no gradient


@pytest.mark.parametrize("source", SOURCES)
def test_zero_gate_equals_prenorm_at_init(source):
    assert_equals_prenorm_at_init("dar", dar_source=source)


@pytest.mark.parametrize("source", SOURCES)
def test_ungated_reads_are_prenorm_at_init_through_the_branch_norm(source):
    """The sources sum to h, so a zero-query read is h / N and the branch reads (1 + g/N) h:
    its RMSNorm removes the scale, whatever the gate. Once a query moves, the read differs."""
    assert_equals_prenorm_at_init("dar", dar_source=source, dar_gate="none")
    model = with_moved_body("dar", dar_source=source, dar_gate="none")
    with torch.no_grad():
        model.connections.layers[3].read.query.normal_()
    idx = tokens()
    assert not torch.allclose(model(idx), prenorm_logits(model, idx), atol=1e-3)


def reference_trunk(conn, x0, branches, source, gate):
    """h_{l+1} = h_l + F_l(h_l + g_l r_l), r_l = sum_i softmax_i(w_l . RMSNorm_g(v_i)) v_i over
    v_0 = x0 and the earlier outputs (full) or the deltas h_end - h_start of the earlier blocks
    and, inside a block, h_l - h_start (block)."""
    h, outputs, block_starts = x0, [], [x0]
    for l, (layer, f) in enumerate(zip(conn.layers, branches)):
        if source == "full":
            V = [x0, *outputs]
        else:
            deltas = [b - a for a, b in zip(block_starts, block_starts[1:])]
            V = [x0, *deltas] + ([h - block_starts[-1]] if l % 2 else [])
        S = torch.stack(V)
        K = S / S.pow(2).mean(-1, keepdim=True).sqrt() * layer.read.gain
        r = (torch.softmax((K * layer.read.query).sum(-1), dim=0)[..., None] * S).sum(0)
        g = {"none": 1.0, "zero": layer.gate if gate == "zero" else None}.get(gate)
        if g is None:
            g = torch.sigmoid(layer.gate)
        y = f(h + g * r)
        outputs.append(y)
        h = h + y
        if l % 2:
            block_starts.append(h)
    return h


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("source", SOURCES)
def test_matches_the_papers_update(source, gate):
    conn, x0 = fp64_trunk("dar", seed=9, n_layer=3, dar_source=source, dar_gate=gate)
    branches = random_branches(6, 32)
    torch.testing.assert_close(conn(x0, branches), reference_trunk(conn, x0, branches, source, gate),
                               atol=1e-6, rtol=1e-6)  # our norm's epsilon


@pytest.mark.parametrize("source, gate", [("full", "zero"), ("block", "sigmoid_vector")])
def test_causal_gradients_gradcheck_and_parameter_count(source, gate):
    fields = dict(dar_source=source, dar_gate=gate)
    assert_causal(tiny("dar", **fields), tokens())
    assert_diagnostics(tiny("dar", **fields))
    assert_every_connection_parameter_gets_a_gradient(tiny("dar", **fields), without=FIRST_READ)
    assert_gradcheck("dar", n_layer=2, **fields)
    assert_params_match_spec("dar", **fields)
    assert_params_match_spec("dar", hc_norm_weight=False, **fields)


@pytest.mark.parametrize("source, gate", [("block", "sigmoid_vector"), ("full", "none")])
def test_kv_cache_decode_equals_the_full_forward(source, gate):
    """The default (full, zero gate): test_engine.py."""
    assert_decodes_as_the_full_forward("dar", dar_source=source, dar_gate=gate)


def test_parameter_counts_are_the_published_ones():
    """The paper: 2d per sub-layer, 114K at 28 layers x d1024; hyper-connection-factory's tiny
    table: 12.3K for dar and dar-block at 12 layers x 256 (with the zero gate's scalar)."""
    spec = connections.VARIANTS["dar"].SPEC
    assert spec["params"](tiny_config("dar", n_layer=28, n_embd=1024, dar_gate="none")) == 56 * 2 * 1024 == 114_688
    for source in SOURCES:
        assert round(spec["params"](tiny_config("dar", n_layer=12, n_embd=256, dar_source=source)) / 1e3, 1) == 12.3


@pytest.mark.parametrize("overrides, message", [
    (dict(dar_source="delta_v"), "unknown dar_source='delta_v'"),
    (dict(dar_gate="bias"), "unknown dar_gate='bias'"),
    (dict(hc_streams=4), "got hc_streams=4. Drop --hc-streams"),
])
def test_bad_configurations_are_one_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config("dar", **overrides)


@pytest.mark.slow
def test_flags_error_and_resume(base):  # noqa: F811 (the fixture)
    assert_train_flag_error(base, ("--hc", "mhar", "--dar-gate", "none"), ("error:", "only applies to hc='dar'"))
    assert_resumes_bitwise(base, "--hc", "dar", "--dar-source", "block")
