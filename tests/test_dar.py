"""Delta attention residuals: pre-norm at init with the zero gate (every source form), and with
every gate where the sources sum to h; the release's gate inits; the first sub-layer reads x0
itself; a block's MLP reads only completed blocks (the factory's block sources); a transcription
of the cited lines of both sources for every source and gate form; causal; every parameter but
the first sub-layer's gets a gradient; fp64 gradcheck; the paper's and the factory's parameter
counts; configuration errors; KV-cache decoding of the other forms. The default form's HF export
and decoding: test_variant_contract.py."""

import math

import pytest
import torch

from nanochat import connections
from wiring_checks import (assert_causal, assert_decodes_as_the_full_forward, assert_diagnostics,
                           assert_equals_prenorm_at_init, assert_every_connection_parameter_gets_a_gradient,
                           assert_gradcheck, assert_params_match_spec, assert_resumes_bitwise,
                           assert_train_flag_error, fp64_frame, prenorm_logits, random_branches, tiny,
                           tiny_config, tokens, with_moved_body)

SOURCES = ("full", "block", "block_partial")
GATES = ("zero", "none", "sigmoid_scalar", "sigmoid_vector")


@pytest.mark.parametrize("source", SOURCES)
def test_zero_gate_equals_prenorm_at_init(source):
    assert_equals_prenorm_at_init("dar", dar_source=source, dar_gate="zero")


@pytest.mark.parametrize("gate", ("none", "sigmoid_scalar", "sigmoid_vector"))
@pytest.mark.parametrize("source", ("full", "block_partial"))
def test_other_gates_are_prenorm_at_init_through_the_branch_norm_where_the_sources_sum_to_h(source, gate):
    """The sources sum to h, so a zero-query read is h / N and the branch reads (1 + g/N) h
    (g the same on every channel at init, sigmoid(-2) for both sigmoid gates): its RMSNorm
    removes the scale. Once a query moves, the read differs."""
    assert_equals_prenorm_at_init("dar", dar_source=source, dar_gate=gate)
    model = with_moved_body("dar", dar_source=source, dar_gate=gate)
    with torch.no_grad():
        model.connections.layers[3].read.query.normal_()
    idx = tokens()
    assert not torch.allclose(model(idx), prenorm_logits(model, idx), atol=1e-3)


def test_block_sources_are_not_prenorm_at_init_with_a_gate():
    """With the factory's block sources a block's MLP reads the block's start (x0 and the
    completed deltas), not h: only the zero gate starts as pre-norm."""
    model = with_moved_body("dar", dar_source="block", dar_gate="none")
    idx = tokens()
    assert not torch.allclose(model(idx), prenorm_logits(model, idx), atol=1e-3)


def test_gates_start_as_the_release_states():
    """sigmoid_scalar: logit -2; sigmoid_vector: W = 0, b = -2, so g = sigmoid(-2) on every
    channel whatever h; zero: 0."""
    for gate, value in (("zero", 0.0), ("sigmoid_scalar", -2.0)):
        layer = connections.build(tiny_config("dar", dar_gate=gate)).layers[1]
        layer.init_weights()
        assert layer.gate.logit.tolist() == [value]
    layer = connections.build(tiny_config("dar", dar_gate="sigmoid_vector")).layers[1]
    layer.init_weights()
    assert layer.gate.weight.abs().max() == 0 and layer.gate.bias.eq(-2.0).all()
    g = layer.gate(torch.randn(2, 3, 32))
    torch.testing.assert_close(g, torch.full_like(g, 1 / (1 + math.exp(2.0))))
    assert connections.build(tiny_config("dar", dar_gate="none")).layers[1].gate is None


def first_branch_input(source, gate):
    """What the first sub-layer receives, with every connection parameter moved off its init."""
    conn, x0 = fp64_frame("dar", seed=3, dar_source=source, dar_gate=gate)
    seen = []

    def record(u):
        seen.append(u)
        return torch.tanh(u)

    conn(x0, [record] + random_branches(3, 32))
    return seen[0], x0


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("source", SOURCES)
def test_the_first_sub_layer_reads_x0_itself(source, gate):
    """The release feeds the stream unchanged where no delta exists yet (not x0 + g x0)."""
    u, x0 = first_branch_input(source, gate)
    torch.testing.assert_close(u, x0, atol=0, rtol=0)


def test_a_blocks_mlp_reads_its_own_partial_only_with_block_partial():
    """block (the factory's): a block's MLP reads x0 and the completed block deltas, so its
    read does not depend on the block's own attention output; block_partial (ours) adds it."""
    # sources per sub-layer: x0 itself; x0 (+ attn_0); x0, delta_0; x0, delta_0 (+ attn_1)
    for source, counts in (("block", [1, 1, 2, 2]), ("block_partial", [1, 2, 2, 3])):
        model = with_moved_body("dar", n_layer=2, dar_source=source)
        with model.connections.capture() as records, torch.no_grad():
            model(tokens())
        assert [r["source_weights"].shape[-1] for r in records["layers"]] == counts, source


def transcription(conn, x0, branches, source, gate):
    """The update as the sources write it, per sub-layer l with h the stream:
    - sources (the factory, depth_attention.py l.134-146): x0 and every earlier output (full),
      or x0 and h_end - h_start of every completed block (block); block_partial (ours) adds,
      at a block's MLP, h - h_start;
    - the read (the release's delta_attn_res): h_attn = h + sum_i softmax_i(q . RMSNorm_g(v_i)) v_i,
      and h itself where there is no source yet (the first sub-layer, l.264-268);
    - the gate (the release's _apply_gate, l.450-465): u = (1 - g) h + g h_attn with
      g = sigmoid(logit) (sigmoid_scalar), sigmoid(W h + b) (sigmoid_vector), the learned
      scalar itself (zero: the release's learnable_alpha), and u = h_attn ungated (none:
      the release's bias gate in its delta modes);
    - h <- h + F_l(u)."""
    h, outputs, deltas, block_start = x0, [], [], x0
    for l, (layer, f) in enumerate(zip(conn.layers, branches)):
        if l == 0:
            u = h
        else:
            V = [x0, *outputs] if source == "full" else [x0, *deltas]
            if source == "block_partial" and l % 2:
                V.append(h - block_start)
            S = torch.stack(V)
            K = S / S.pow(2).mean(-1, keepdim=True).sqrt() * layer.read.gain
            h_attn = h + (torch.softmax((K * layer.read.query).sum(-1), dim=0)[..., None] * S).sum(0)
            if gate == "none":
                u = h_attn
            else:
                g = {"zero": lambda: layer.gate.logit,
                     "sigmoid_scalar": lambda: torch.sigmoid(layer.gate.logit),
                     "sigmoid_vector": lambda: torch.sigmoid(h @ layer.gate.weight.T + layer.gate.bias)}[gate]()
                u = (1 - g) * h + g * h_attn
        y = f(u)
        outputs.append(y)
        h = h + y
        if l % 2:
            deltas.append(h - block_start)
            block_start = h
    return h


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("source", SOURCES)
def test_matches_a_transcription_of_the_sources(source, gate):
    conn, x0 = fp64_frame("dar", seed=9, n_layer=3, dar_source=source, dar_gate=gate)
    branches = random_branches(6, 32)
    torch.testing.assert_close(conn(x0, branches), transcription(conn, x0, branches, source, gate),
                               atol=1e-6, rtol=1e-6)  # our norm's epsilon


@pytest.mark.parametrize("source, gate", [("full", "zero"), ("block", "sigmoid_vector"),
                                          ("block_partial", "sigmoid_scalar")])
def test_causal_gradients_gradcheck_and_parameter_count(source, gate):
    fields = dict(dar_source=source, dar_gate=gate)
    assert_causal(tiny("dar", **fields), tokens())
    assert_diagnostics(tiny("dar", **fields))
    assert_every_connection_parameter_gets_a_gradient(tiny("dar", **fields))  # the first site: SPEC dead
    assert_gradcheck("dar", n_layer=2, **fields)
    assert_params_match_spec("dar", **fields)
    assert_params_match_spec("dar", hc_norm_weight=False, **fields)


@pytest.mark.parametrize("source, gate", [("block", "sigmoid_vector"), ("full", "none"),
                                          ("block_partial", "sigmoid_scalar")])
def test_kv_cache_decode_equals_the_full_forward(source, gate):
    """The default (full, zero gate): test_engine.py."""
    assert_decodes_as_the_full_forward("dar", dar_source=source, dar_gate=gate)


def test_parameter_counts_are_the_published_ones():
    """The paper: 2d per sub-layer, 114K at 28 layers x d1024; hyper-connection-factory's tiny
    table: 12.3K for dar and dar-block at 12 layers x 256 (with the zero gate's scalar); the
    release's input-dependent gate: a d x d projection and its bias per sub-layer."""
    spec = connections.VARIANTS["dar"].SPEC
    assert spec["params"](tiny_config("dar", n_layer=28, n_embd=1024, dar_gate="none")) == 56 * 2 * 1024 == 114_688
    for source in SOURCES:
        assert round(spec["params"](tiny_config("dar", n_layer=12, n_embd=256, dar_source=source)) / 1e3, 1) == 12.3
    assert spec["params"](tiny_config("dar", n_layer=28, n_embd=1024, dar_gate="sigmoid_vector")) == \
        114_688 + 56 * (1024 * 1024 + 1024)


@pytest.mark.parametrize("overrides, message", [
    (dict(dar_source="delta_v"), "unknown dar_source='delta_v'"),
    (dict(dar_gate="bias"), "unknown dar_gate='bias'"),
    (dict(hc_streams=4), "got hc_streams=4. Drop --hc-streams"),
])
def test_bad_configurations_are_one_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config("dar", **overrides)


def test_flags_error_and_resume():
    assert_train_flag_error(("--hc", "mhar", "--dar-gate", "zero"), ("error:", "only applies to hc='dar'"))
    assert_resumes_bitwise("--hc", "dar", "--dar-source", "block")
