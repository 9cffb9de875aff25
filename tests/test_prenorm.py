"""The plain pre-norm residual, and the checks every wiring beyond the HC family runs against
it (the helpers below, beside tests/wiring_checks.py): equal to pre-norm at init with the
body's weights moved off their init, causal, a gradient on every connection parameter, fp64
gradcheck, KV-cache decoding, the diagnostics, the parameter count of its SPEC, one clear
error line for a bad flag, and an exact resume through the real CLI. Every registered
variant's default form also goes through tests/test_variant_contract.py (bench, hc_report,
the plan, the report, the HF export, KV decoding)."""

import pytest
import torch
from torch.func import functional_call

from nanochat import connections
from nanochat.connections.diagnostics import collect_hc_stats
from nanochat.gpt import GPTConfig, build_model
import wiring_checks
from test_cli_errors import TRAIN, assert_one_error, run_cli
from test_gpt import randomize
from test_train_e2e import base, kill_resume_and_compare  # noqa: F401 (a fixture)
from wiring_checks import assert_causal, assert_decode_matches, prenorm_logits

VOCAB = 64


def tiny_config(hc, n_layer=2, n_embd=32, **fields):
    return GPTConfig(sequence_len=16, vocab_size=VOCAB, n_layer=n_layer, n_head=2, n_kv_head=2, n_embd=n_embd,
                     window_pattern="SL", hc=hc, **fields)


def tiny(hc, seed=0, **fields):
    torch.manual_seed(seed)
    return build_model(tiny_config(hc, **fields), "cpu")


def tokens(seed=3):
    return wiring_checks.tokens(VOCAB, seed, T=16)


def assert_decodes_as_the_full_forward(hc, **fields):
    """Prefill, then one token at a time through the KV cache: the full forward's logits."""
    assert_decode_matches(randomize(tiny(hc, **fields), seed=4), tokens())


def with_moved_body(hc, **fields):
    """The wiring's model with the body (embeddings, sub-layers, head) moved off its init,
    where the zero output projections would make every wiring equal, and its connections at
    their init."""
    model = randomize(tiny(hc, **fields), seed=5)
    model.connections.init_weights()
    return model


def assert_equals_prenorm_at_init(hc, atol=1e-5, adjust=None, **fields):
    """Against the pre-norm residual over the same sub-layers (wiring_checks.prenorm_logits);
    `adjust(model)` may change the wiring's init first (a source whose init is random)."""
    model = with_moved_body(hc, **fields)
    if adjust is not None:
        adjust(model)
    idx = tokens()
    torch.testing.assert_close(model(idx), prenorm_logits(model, idx), atol=atol, rtol=atol)


def connection_gradients(model):
    """Gradients of a loss through a model moved off its init, by connection parameter name."""
    randomize(model, seed=7)
    idx = tokens()
    model(idx[:, :-1], idx[:, 1:]).backward()
    return {name: p.grad for name, p in model.connections.named_parameters()}


def assert_every_connection_parameter_gets_a_gradient(model, without=()):
    grads = connection_gradients(model)
    assert grads, "no connection parameters"
    for name, grad in grads.items():
        assert (grad is not None and grad.abs().sum() > 0) == (name not in without), name


def moved(module, seed=0, scale=1.0):
    """Every parameter of `module` moved off its init by scale * N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def fp64_trunk(hc, seed=0, **fields):
    """(the connections of a tiny config in fp64, moved off their init; an fp64 x0 for them)"""
    cfg = tiny_config(hc, **fields)
    conn = connections.build(cfg).double()
    conn.init_weights()
    x0 = torch.randn(2, 3, cfg.n_embd, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    return moved(conn, seed), x0


def random_branches(L, C, seed=11, dtype=torch.float64):
    """L fixed smooth branches u -> tanh(u M_l), standing in for the sub-layers."""
    g = torch.Generator().manual_seed(seed)
    mats = [(torch.randn(C, C, generator=g) / C ** 0.5).to(dtype) for _ in range(L)]
    return [lambda u, M=M: torch.tanh(u @ M) for M in mats]


def assert_gradcheck(hc, n_layer=1, n_embd=8, **fields):
    """fp64 gradcheck of the whole trunk (expand, every layer, reduce) in x0 and in every
    connection parameter, moved off its init."""
    cfg = tiny_config(hc, n_layer=n_layer, n_embd=n_embd, **fields)
    conn = connections.build(cfg).to_empty(device="cpu")
    conn.init_weights()
    conn.double()
    names = [name for name, _ in conn.named_parameters()]
    g = torch.Generator().manual_seed(2)
    params = [(p.detach() + 0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype)).requires_grad_()
              for p in conn.parameters()]
    x0 = torch.randn(1, 3, n_embd, generator=g, dtype=torch.float64, requires_grad=True)
    branches = random_branches(2 * n_layer, n_embd)

    def trunk(x0, *params):
        return functional_call(conn, dict(zip(names, params)), (x0, branches))

    assert torch.autograd.gradcheck(trunk, (x0, *params))


def assert_diagnostics(model):
    """The training-time diagnostics capture every layer of the model."""
    stats = collect_hc_stats(model, tokens())
    assert stats["variant"] == model.config.hc and len(stats["layers"]) == 2 * model.config.n_layer


def assert_params_match_spec(hc, **fields):
    model = tiny(hc, **fields)
    spec = connections.VARIANTS[hc].SPEC
    assert sum(p.numel() for p in model.connections.parameters()) == spec["params"](model.config)


def assert_resumes_bitwise(base, *flags):
    """Through base_train: killed after a checkpoint and resumed, the same losses and weights."""
    kill_resume_and_compare(base, [*flags, "--num-iterations", "8", "--save-every", "2"])


def assert_train_flag_error(base, flags, phrases):
    """base_train with these flags ends in one `error:` line containing the phrases."""
    assert_one_error(run_cli("scripts.base_train", *TRAIN, *flags, base=base), *phrases)


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
    (dict(hc_recompute=True), "hc_recompute does not apply to hc='prenorm'"),
    (dict(hc_kernels="liger"), "no kernels for hc='prenorm'"),
    (dict(hc_expand="lss"), "not hc='prenorm' \\(a single stream\\)"),
    (dict(attnres_block_size=2), "only applies to hc='attnres'"),
])
def test_bad_configurations_are_one_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config("prenorm", **overrides)


@pytest.mark.slow
def test_prenorm_flags_error_and_resume(base):  # noqa: F811 (the fixture)
    assert_train_flag_error(base, ("--hc", "prenorm", "--hc-streams", "4"), ("error:", "--hc-streams"))
    assert_resumes_bitwise(base, "--hc", "prenorm")
