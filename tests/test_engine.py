"""Inference (nanochat/engine.py, gpt.StaticKVCache): the static-cache decode equals the full
forward at every position for every variant and option; the compiled paths (score, prefill,
decode) give the eager logits and greedy tokens for every variant, compiled once for all of
them; the graph count of a CORE run; the eager fallback with one warning line."""

import pytest
import torch
from torch import nn

from nanochat import engine
from nanochat.connections import VARIANTS
from nanochat.gpt import GPTConfig, StaticKVCache, build_model

VOCAB = 64
STREAMLESS = ("residual", "attnres")
# Every variant with its defaults, then every HC option (delayed pre-weights, DeepSeek-V4's
# learned head, Learned Stream Scaling) on an HC variant of its own.
CASES = [(v, {}) for v in VARIANTS] + [
    ("mhc", dict(hc_pre="delayed")), ("kromhc", dict(hc_reduce="learned")), ("hc", dict(hc_expand="lss")),
]
CASE_IDS = [v + "".join(f"-{value}" for value in opts.values()) for v, opts in CASES]


def tiny_model(variant, n_layer=2, seq_len=16, seed=0, **options):
    """A model whose every weight is non-zero (init zeroes the output projections and the
    connection projections; random values exercise every path)."""
    cfg = GPTConfig(sequence_len=seq_len, vocab_size=VOCAB, n_layer=n_layer, n_head=2, n_kv_head=1, n_embd=32,
                    window_pattern="SL", hc=variant, hc_streams=0 if variant in STREAMLESS else 4, hc_sk_iters=3,
                    **options)
    torch.manual_seed(seed)
    model = build_model(cfg, "cpu")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


@pytest.mark.parametrize("variant, options", CASES, ids=CASE_IDS)
def test_static_cache_decode_equals_the_full_forward(variant, options):
    """A prefill longer than the S window (8), then one token at a time past the training
    context (16): every position's logits equal the full forward's."""
    model = tiny_model(variant, **options)
    idx = torch.randint(0, VOCAB, (2, 22), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx)
        cache = StaticKVCache(2, 2, 1, model.head_dim, 24, "cpu", torch.float32)
        steps = [model(idx[:, :10], kv_cache=cache)] + [model(idx[:, t:t + 1], kv_cache=cache) for t in range(10, 22)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=2e-5, rtol=1e-5)
    assert int(cache.pos) == 22


def test_static_cache_reset_and_its_limits():
    model = tiny_model("kromhc")
    idx = torch.randint(0, VOCAB, (1, 12))
    cache = StaticKVCache(1, 2, 1, model.head_dim, 16, "cpu", torch.float32)
    with torch.no_grad():
        first = model(idx, kv_cache=cache)
        cache.reset()  # the old keys stay in the buffer, masked out
        torch.testing.assert_close(model(idx[:, :5], kv_cache=cache), first[:, :5])
        with pytest.raises(ValueError, match="unpadded"):
            model(idx, kv_cache=cache, padding_mask=torch.ones(1, 17, dtype=torch.bool))
        with pytest.raises(ValueError, match="rotary table"):
            model(idx, kv_cache=StaticKVCache(1, 2, 1, model.head_dim, model.rotary_len + 1, "cpu", torch.float32))
    assert engine.cache_capacity(3, 160) == 64 and engine.cache_capacity(65, 160) == 128
    assert engine.cache_capacity(150, 160) == 160
    with pytest.raises(ValueError, match="rotary table"):
        engine.cache_capacity(161, 160)


class EveryVariant(nn.Module):
    """One tiny model per case behind one forward, so that a single compilation covers them
    all (a compiled graph costs ~30 s on a small CPU; one per variant would cost minutes)."""

    def __init__(self):
        super().__init__()
        self.models = nn.ModuleList(tiny_model(v, n_layer=1, **opts) for v, opts in CASES)
        self.config = self.models[0].config
        self.rotary_len = self.models[0].rotary_len
        self.lm_head = self.models[0].lm_head
        self.head_dim = self.models[0].head_dim

    def forward(self, idx, targets=None, loss_reduction="mean", kv_cache=None):
        caches = kv_cache or [None] * len(self.models)
        return torch.stack([m(idx, kv_cache=c) for m, c in zip(self.models, caches)])

    def activation_dtype(self, idx):
        return torch.float32


class Caches(list):
    """One StaticKVCache per model of EveryVariant, seen by Inference as one cache."""
    static = True


@pytest.fixture(scope="module")
def every_variant():
    return EveryVariant()


def test_compiled_scores_and_greedy_tokens_equal_eager_for_every_variant(every_variant, monkeypatch):
    """Inductor, fp32: the score graph's logits (all variants at once, within 1e-4), and greedy
    decoding through the compiled prefill and decode graphs: the same tokens as eager."""
    torch._dynamo.reset()
    compiled = engine.Inference(every_variant, compile=True)
    eager = engine.Inference(every_variant, compile=False)
    idx = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(compiled(idx), eager(idx), atol=1e-4, rtol=1e-4)
    assert compiled.fallback is None and compiled.graphs() == 1
