"""Checks that every wiring's test file runs on its own model (docs/connections.md, "Adding a
wiring"): the transcribed pre-norm residual to compare with at init, causality, KV-cache
decoding against the full forward, and its flags' errors."""

import pytest
import torch

from nanochat.gpt import KVCache
from nanochat.train_config import model_config_for, parse_args


def tokens(vocab, seed=0, T=12, rows=2):
    return torch.randint(0, vocab, (rows, T), generator=torch.Generator().manual_seed(seed))


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
