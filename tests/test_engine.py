"""Inference (nanochat/engine.py, gpt.StaticKVCache): the static-cache decode equals the full
forward at every position for every variant and option; the compiled paths (score, prefill,
decode) give the eager logits and greedy tokens for every variant, compiled once for all of
them; the graph count of a CORE run; the eager fallback with one warning line."""

import functools

import pytest
import torch
from torch import nn

from nanochat import connections, engine
from nanochat.connections import VARIANTS
from nanochat.core_eval import evaluate_core
from nanochat.gpt import GPTConfig, StaticKVCache, build_model
from test_core_eval import REAL_BUNDLE, ByteTokenizer, needs_real_bundle

VOCAB = 64
STREAMLESS = tuple(name for name, spec in connections.specs().items() if not spec.streams)
# Every variant with its defaults, then every HC option (delayed pre-weights, DeepSeek-V4's
# learned head, Learned Stream Scaling) on an HC variant of its own.
CASES = [(v, {}) for v in VARIANTS] + [
    ("mhc", dict(hc_pre="delayed")), ("kromhc", dict(hc_reduce="learned")), ("hc", dict(hc_expand="lss")),
]
CASE_IDS = [v + "".join(f"-{value}" for value in opts.values()) for v, opts in CASES]


def tiny_model(variant, n_layer=2, seq_len=16, seed=0, vocab=VOCAB, window_pattern="SL", **options):
    """A model whose every weight is non-zero (init zeroes the output projections and the
    connection projections; random values exercise every path)."""
    cfg = GPTConfig(sequence_len=seq_len, vocab_size=vocab, n_layer=n_layer, n_head=2, n_kv_head=1, n_embd=32,
                    window_pattern=window_pattern, hc=variant, hc_streams=0 if variant in STREAMLESS else 4,
                    hc_sk_iters=3,
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
    all (tracing costs seconds per variant and graph on a small CPU, Inductor's code
    generation ~30 s per graph); kv_cache is a list with one StaticKVCache per model."""

    def __init__(self):
        super().__init__()
        self.models = nn.ModuleList(tiny_model(v, n_layer=1, **opts) for v, opts in CASES)
        first = self.models[0]
        self.config, self.rotary_len, self.lm_head, self.head_dim = first.config, first.rotary_len, first.lm_head, \
            first.head_dim

    def forward(self, idx, kv_cache):
        return torch.stack([m(idx, kv_cache=c) for m, c in zip(self.models, kv_cache)])


def test_compiled_decode_equals_eager_for_every_variant():
    """Every variant and option in one decode graph (traced and functionalized as Inductor
    would see it, without its code generation): the same logits and greedy tokens as eager,
    step after step through the StaticKVCache, and one graph for all steps (the position is
    a tensor: no recompile per token)."""
    every = EveryVariant()
    torch._dynamo.reset()
    inference = engine.Inference(every, compile=True, backend="aot_eager")
    gen = torch.Generator().manual_seed(3)
    prompt, fed = torch.randint(0, VOCAB, (2, 10), generator=gen), torch.randint(0, VOCAB, (2, 4), generator=gen)

    def decode(step):
        caches = [StaticKVCache(2, 1, 1, every.head_dim, 16, "cpu", torch.float32) for _ in every.models]
        out = [every(prompt, caches)]  # the prefill, eagerly for both
        out += [step(fed[:, t:t + 1], caches) for t in range(fed.size(1))]
        return torch.cat(out, dim=2)

    with torch.no_grad():
        eager, compiled = decode(every), decode(inference.step)
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
    assert torch.equal(compiled.argmax(-1), eager.argmax(-1))
    assert inference.fallback is None and inference.graphs() == 1


def test_inductor_decode_equals_eager():
    """Inductor's code for the decode step (one static graph; the path CUDA graphs replay):
    greedy tokens from <|bos|>-like one-token prompts as eager's, the step logits within 1e-4
    (fp32), and a cache kept from generation (made under inference_mode) reused outside it."""
    model = tiny_model("mhc", n_layer=1)
    torch._dynamo.reset()
    compiled, eager = engine.Inference(model, compile=True), engine.Inference(model)
    for prompt in ([3], [9]):
        assert list(compiled.generate(prompt, 6, temperature=0)) == list(eager.generate(prompt, 6, temperature=0))
    assert compiled.graphs() == 1 and compiled.fallback is None
    with torch.no_grad():
        cache_c, cache_e = compiled.cache(1, 5), eager.cache(1, 5)
        for token in (7, 3, 2):
            ids = torch.tensor([[token]])
            torch.testing.assert_close(compiled.step(ids, cache_c), eager.step(ids, cache_e), atol=1e-4, rtol=1e-4)
    assert compiled.graphs() == 2  # no_grad is another global state than generate's inference_mode


@needs_real_bundle
def test_compiled_core_equals_eager_within_a_bounded_number_of_graphs():
    """CORE on two bundle tasks (multiple choice with 2 options, language modeling; 4 items
    each) through the score graph, as dynamo captures it (the graph count is dynamo's; the
    numerics of compiled code are the tests above): the same accuracies as eager, in at most
    2 x (windows + 1) graphs: rows of every length, not one per prompt."""
    model = tiny_model("kromhc", n_layer=1, vocab=320, seq_len=64, window_pattern="L")
    torch._dynamo.reset()
    compiled = engine.Inference(model, compile=True, backend="eager")
    kw = dict(max_per_task=4, tasks="copa,lambada_openai", max_seq_len=model.rotary_len)
    with torch.no_grad():
        eager_core = evaluate_core(model, ByteTokenizer(), "cpu", str(REAL_BUNDLE), **kw)
        compiled_core = evaluate_core(compiled, ByteTokenizer(), "cpu", str(REAL_BUNDLE), **kw)
    assert compiled_core["results"] == eager_core["results"]
    assert compiled_core["core_metric"] == eager_core["core_metric"]
    windows = len(set(model.window_sizes))
    assert 1 <= compiled.graphs() <= 2 * (windows + 1) and compiled.fallback is None


def test_a_failing_compiler_falls_back_to_eager_with_one_warning(monkeypatch, capsys):
    def broken(fn, **kwargs):
        def call(*args, **kw):
            raise RuntimeError("CUDA error: no kernel image is available for execution on the device")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    # the compiled functions are made once per process: make them again with the broken
    # compiler, and drop those afterwards
    monkeypatch.setattr(engine, "_compiled", functools.cache(engine._compiled.__wrapped__))
    model = tiny_model("kromhc")
    runner = engine.Inference(model, compile=True)
    idx = torch.randint(0, VOCAB, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(runner(idx), model(idx))
        tokens = list(runner.generate([1, 2, 3], 4, temperature=0))
        runner(idx)
    assert tokens == list(model.generate([1, 2, 3], 4, temperature=0))
    warnings = [line for line in capsys.readouterr().out.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "continuing eagerly" in warnings[0] and "no kernel image" in warnings[0]
    assert runner.fallback.startswith("RuntimeError: CUDA error")


def test_a_callers_error_is_not_a_compiler_failure(monkeypatch):
    model = tiny_model("residual")
    runner = engine.Inference(model, compile=True, backend="eager")
    with pytest.raises(ValueError, match="rotary table"):
        runner(torch.zeros(1, model.rotary_len + 1, dtype=torch.long))
    assert runner.fallback is None


def test_compiled_scores_of_a_flex_model_take_one_graph_for_every_length():
    """FlexAttention builds a block mask per length; compiled evaluation runs the windowed
    layers on SDPA instead, so lengths past the window (8) share one graph."""
    model = tiny_model("residual", attention="flex")
    expected = {}
    with torch.no_grad():
        for T in (10, 12, 14):
            expected[T] = model(torch.arange(T).repeat(2, 1) % VOCAB)
    torch._dynamo.reset()
    compiled = engine.Inference(model, compile=True, backend="eager")
    assert {block.attn.attention for block in model.transformer.h} == {"sdpa"}
    with torch.no_grad():
        for T, logits in expected.items():
            torch.testing.assert_close(compiled(torch.arange(T).repeat(2, 1) % VOCAB), logits, atol=1e-5, rtol=1e-5)
    assert compiled.graphs() == 1


def test_compile_defaults():
    assert engine.compile_default("cuda") and not engine.compile_default("cpu")
    model = tiny_model("residual")
    assert not engine.Inference(model, compile=True).cuda_graphs  # on the CPU: nothing to replay
