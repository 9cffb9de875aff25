"""The checks every wiring's test file runs on its own model (docs/connections.md, "Adding a
wiring"), in one place: a tiny config and model, the transcribed pre-norm residual to compare
with at init (the body moved off its init first), causality, a gradient on every connection
parameter, an fp64 gradcheck of the frame, KV-cache decoding against the full forward, the
diagnostics, the parameter count of its SPEC, its flags' errors (one `error:` line), and an
exact resume from the checkpoint base_train writes."""

import contextlib
import io
import tempfile

import pytest
import torch
from torch.func import functional_call

from nanochat import checkpoint_manager as ckpt
from nanochat import connections
from nanochat.connections import liveness
from nanochat.connections.diagnostics import collect_hc_stats
from nanochat.gpt import GPTConfig, KVCache, build_model
from nanochat.optim import build_optimizer
from nanochat.train_config import model_config_for, parse_args
from test_cli_errors import TRAIN
from test_gpt import randomize

VOCAB = 64


def tokens(seed=3, vocab=VOCAB, T=16, rows=2):
    return torch.randint(0, vocab, (rows, T), generator=torch.Generator().manual_seed(seed))


def tiny_config(hc, n_layer=2, n_embd=32, **fields):
    return GPTConfig(sequence_len=16, vocab_size=VOCAB, n_layer=n_layer, n_head=2, n_kv_head=2, n_embd=n_embd,
                     window_pattern="SL", hc=hc, **fields)


def tiny(hc, seed=0, **fields):
    torch.manual_seed(seed)
    return build_model(tiny_config(hc, **fields), "cpu")


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
    """Gradients of a loss through a model moved off its init, by connection parameter name,
    in fp64 (the model is made fp64): rounding then sits ten orders below the live gradients,
    so that each declared slice can be judged on its own."""
    randomize(model, seed=7).double()
    idx = tokens()
    model(idx[:, :-1], idx[:, 1:]).backward()
    return {name: p.grad if p.grad is not None else torch.zeros_like(p)
            for name, p in model.connections.named_parameters()}


def assert_every_connection_parameter_gets_a_gradient(model):
    """Every part of the connection parameters (a parameter, or a slice its SPEC `parts`
    declares: the pre, post and res columns of an HC layer) gets a live gradient (well above
    rounding: liveness.py, in fp64) but the parts its wiring declares dead (SPEC dead), which
    must be dead: a gradient that is rounding noise fails here as an absent one does, and so
    does a stale declaration."""
    grads = connection_gradients(model)
    assert grads, "no connection parameters"
    spec = connections.spec(model.config.hc)
    rows = liveness.report(grads, spec.dead_parameters(model.config), spec.judged_parts(model.config), torch.float64)
    wrong = liveness.surprises(rows)
    assert not wrong, "\n".join(f"{r['name']} ({r['part']}): gradient norm {r['norm']:.2e} against "
                                f"{liveness.threshold(r['scale'], dtype=torch.float64):.2e} to be live" for r in wrong)


def moved(module, seed=0, scale=1.0):
    """Every parameter of `module` moved off its init by scale * N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def fp64_frame(hc, seed=0, **fields):
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
    """fp64 gradcheck of the whole frame (expand, every layer, reduce) in x0 and in every
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

    def frame(x0, *params):
        return functional_call(conn, dict(zip(names, params)), (x0, branches))

    assert torch.autograd.gradcheck(frame, (x0, *params))


def assert_diagnostics(model):
    """The training-time diagnostics capture every layer of the model."""
    stats = collect_hc_stats(model, tokens())
    assert stats["variant"] == model.config.hc and len(stats["layers"]) == 2 * model.config.n_layer


def assert_params_match_spec(hc, **fields):
    model = tiny(hc, **fields)
    spec = connections.VARIANTS[hc].SPEC
    assert sum(p.numel() for p in model.connections.parameters()) == spec["params"](model.config)


def assert_resumes_bitwise(*flags, steps=2):
    """The wiring's whole training state saved as base_train saves it (nanochat/checkpoint_manager.py:
    the model, the optimizer, the RNG), loaded into a model and an optimizer built afresh as
    base_train resumes: the next steps' losses and the weights after them equal the
    uninterrupted run's bitwise. In this process: the command's resume around that (a SIGKILL,
    the loaders, the records) is the same for every wiring and runs through the real CLI in
    tests/test_train_e2e.py."""
    config = model_config_for(parse_args([*TRAIN, "--depth", "2", *flags]), VOCAB)
    batches = [tokens(seed=s, T=config.sequence_len + 1) for s in range(2 * steps)]

    def fresh(seed):
        torch.manual_seed(seed)
        model = build_model(config, "cpu")
        return model, build_optimizer(model.param_groups(), world_size=1)

    def train(model, optimizer, batch):
        loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        optimizer.step()
        model.zero_grad(set_to_none=True)
        return loss.item()

    model, optimizer = fresh(0)
    for batch in batches[:steps]:
        train(model, optimizer, batch)
    with tempfile.TemporaryDirectory() as run:
        ckpt.save_rank_files(run, steps, 0, optimizer.state_dict(), model_state=model.state_dict(),
                             meta={"rng": ckpt.encode_rng_state()})
        straight = [train(model, optimizer, batch) for batch in batches[steps:]]
        resumed_model, resumed_optimizer = fresh(1)  # another init: everything must come from the checkpoint
        resumed_model.load_state_dict(ckpt.load_model_state(run, steps, "cpu"), strict=True)
        resumed_optimizer.load_state_dict(ckpt.load_optimizer_state(run, steps, 0, "cpu"))
        ckpt.restore_rng_state(ckpt.load_meta(run, steps)["rng"])
    resumed = [train(resumed_model, resumed_optimizer, batch) for batch in batches[steps:]]
    assert resumed == straight
    a, b = model.state_dict(), resumed_model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def assert_train_flag_error(flags, phrases):
    """base_train's flags refused before any work, in one `error:` line containing the phrases:
    argparse's line, or the configuration's ValueError, which base_train prints as one line
    (`error: ...`; tests/test_cli_errors.py runs that path through the real command). In this
    process: a command per wiring costs seconds that say nothing more."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            model_config_for(parse_args([*TRAIN, *flags]), VOCAB)
        except SystemExit:
            message = err.getvalue()
        except ValueError as e:
            message = f"error: {e}"
        else:
            pytest.fail(f"base_train accepted {flags}")
    assert len([line for line in message.splitlines() if "error:" in line]) == 1, message
    for phrase in phrases:
        assert phrase in message, (phrase, message)


def prenorm_logits(model, idx):
    """The plain pre-norm residual over the model's own sub-layers, transcribed: x = x0, then
    x + F(x) per sub-layer, the head on norm(x)."""
    def plain(x0, branches):
        x = x0
        for branch in branches:
            x = x + branch(x)
        return x

    real, model.connections.forward = model.connections.forward, plain
    try:
        return model(idx)
    finally:
        model.connections.forward = real


def handed(model):
    """(x0, branches, the connections' output) of one forward of `model` on tokens(): what the
    model hands its connections and what they return."""
    seen, real = {}, model.connections.forward

    def keep(x0, branches):
        seen.update(x0=x0, branches=branches, out=real(x0, branches))
        return seen["out"]

    model.connections.forward = keep
    try:
        with torch.no_grad():
            model(tokens())
    finally:
        model.connections.forward = real
    return seen["x0"], seen["branches"], seen["out"]


def assert_sublayers_called_raw(model):
    """The model hands the wiring its sub-layers themselves (SPEC sublayer_prenorm=False): the
    first MLP branch on a state of RMS 3 is the MLP on that state, not on its norm."""
    branches = handed(model)[1]
    u = 3 * torch.randn(2, 16, model.config.n_embd, generator=torch.Generator().manual_seed(0))
    mlp = model.transformer.h[0].mlp
    with torch.no_grad():
        torch.testing.assert_close(branches[1](u), mlp(u))
        assert not torch.allclose(mlp(u), mlp(torch.nn.functional.rms_norm(u, (u.size(-1),))), atol=1e-3)


def assert_causal(model, idx, at=6):
    """Changing token `at` leaves every earlier position's logits as they were, bitwise."""
    changed = idx.clone()
    changed[:, at] = (changed[:, at] + 1) % model.config.vocab_size
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert torch.equal(a[:, :at], b[:, :at]) and not torch.allclose(a[:, at:], b[:, at:])


def assert_decode_matches(model, idx, prefix=4, tol=1e-5):
    """A prefill of `prefix` tokens then one token at a time through the KV cache gives the
    full forward's logits (in the model's dtype)."""
    dtype = next(model.parameters()).dtype
    B, T = idx.shape
    with torch.no_grad():
        full = model(idx)
        cache = KVCache(B, model.config.n_layer, model.config.n_kv_head, model.head_dim, T, "cpu", dtype)
        steps = [model(idx[:, :prefix], kv_cache=cache)] + [model(idx[:, t:t + 1], kv_cache=cache)
                                                            for t in range(prefix, T)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=tol, atol=tol)


def assert_one_error_line(capsys, argv, message):
    """base_train's parser refuses argv with one `error:` line naming the flag."""
    with pytest.raises(SystemExit):
        parse_args(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("python -m scripts.base_train: error: " + message) and "Traceback" not in "\n".join(err)


def assert_refused(argv, message, vocab=64):
    """Settings that parse but do not apply: one ValueError at configuration time."""
    with pytest.raises(ValueError, match=message):
        model_config_for(parse_args(argv), vocab)
