"""Inference as evaluation and generation run it: a trained GPT behind one object
(`Inference`) that scores rows (CORE, bits per byte, lm-eval's log-likelihoods) and
generates tokens, eagerly or compiled.

Compiled (`compile=True`, the default on CUDA), three graph families, each compiled once:
  score    model(idx[, targets]) with dynamic batch and length (torch.compile dynamic=True):
           one graph per guard region, not per prompt length. Dynamo specializes a batch
           of 1 apart from larger ones and splits lengths at the attention windows (a
           windowed layer takes an explicit mask only past its window): at most
           2 x (number of distinct windows + 1) graphs (tests/test_engine.py checks the
           bound); CORE on the CPU demo's d4 model (one window) built 4. The model runs
           FlexAttention only at its training length (gpt.CausalSelfAttention), SDPA at
           every other: a block mask per length would make a dynamic length static.
  prefill  the prompt through a StaticKVCache, dynamic length: the same bound.
  decode   one token per row through the StaticKVCache: static shapes, so every step
           replays one graph; on CUDA under CUDA graphs (mode="reduce-overhead"): the
           step's hundreds of small kernels (mHC's Sinkhorn alone launches dozens per
           layer) become one launch. One graph per (batch, cache capacity); capacities are
           powers of two (at least 64), and the caches are kept and reused, so their
           storage (marked static) is the same on every call.
If compiling or running a compiled graph fails (a device or torch version the compiler
does not support), a single warning line is printed and everything runs eagerly from
then on, with the same results.

Eager and compiled agree to float rounding (fp32 on the CPU: logits within 1e-4, the same
greedy tokens, the same CORE; tests/test_engine.py).
"""

import functools

import torch

from nanochat.common import print0
from nanochat.gpt import EagerSteps, StaticKVCache

MIN_CAPACITY = 64
# Errors that are the caller's, not the compiler's: re-raised, never a reason to fall back.
CALLER_ERRORS = (ValueError, torch.OutOfMemoryError, KeyboardInterrupt)


COMPILE_HELP = ("torch.compile the evaluation (one graph per shape family; decode steps under CUDA graphs on "
                "CUDA); --no-compile runs it eagerly. Default: on for CUDA, off elsewhere (compiling costs more "
                "than it saves in a small CPU evaluation). A failed compilation falls back to eager with one "
                "warning")


def compile_default(device_type):
    """--compile's default: on for CUDA (launch-bound eager decoding), off on the CPU, where
    a small evaluation never earns its compilation back. Measured on a 2-core CPU (the CPU
    demo's d4 mHC model, fp32, CORE at 16 examples per task over 18 tasks): the same CORE to
    the last digit, 4 graphs costing ~300 s of CPU time, then scoring ~1.7x faster than
    eager (~0.055 s saved per example): break-even near 5,000 examples, i.e. a full CORE run
    rather than the demo's 288."""
    return device_type == "cuda"


def cache_capacity(length, limit):
    """The StaticKVCache length for `length` tokens: the next power of two (at least
    MIN_CAPACITY), capped at `limit` (the rotary table)."""
    capacity = MIN_CAPACITY
    while capacity < length:
        capacity *= 2
    if length > limit:
        raise ValueError(f"sequence of {length} tokens exceeds the rotary table ({limit})")
    return min(capacity, limit)


def graph_count():
    """Graphs dynamo has compiled in this process so far (all compiled functions)."""
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


# The compiled functions: three code objects, so that each keeps its own graphs and options.
def _score(model, idx, targets=None, loss_reduction="mean"):
    return model(idx, targets, loss_reduction=loss_reduction)


def _prefill(model, idx, cache):
    return model(idx, kv_cache=cache)


def _decode(model, idx, cache):
    return model(idx, kv_cache=cache)


@functools.cache
def _compiled(family, backend, cuda_graphs):
    """The compiled function of a family, one per settings for the whole process: graphs
    are keyed by the model passed in, and two Inference objects over one model (e.g. the
    benchmark's compiled and cudagraphs modes) share the graphs they have in common."""
    eager = {"score": _score, "prefill": _prefill, "decode": _decode}[family]
    if family == "decode":
        return torch.compile(eager, dynamic=False, backend=backend, mode="reduce-overhead" if cuda_graphs else None)
    return torch.compile(eager, dynamic=True, backend=backend)


class Inference:
    """A GPT for evaluation: `inference(idx, targets=None, loss_reduction="mean")` is the
    model's forward, `generate(...)` GPT.generate's; `config`, `rotary_len` and `model`
    pass through. compile: torch.compile the three families (module docstring);
    cuda_graphs: decode under CUDA graphs (default: on CUDA, when compiling); backend:
    torch.compile's ("aot_eager" traces and functionalizes like Inductor without generating
    code: what the tests use to cover every variant at the cost of one trace). The model is
    left as it was given: its modules and their settings are not changed."""

    def __init__(self, model, compile=False, cuda_graphs=None, backend="inductor"):
        self.model = model
        self.config = model.config
        self.rotary_len = model.rotary_len
        self.device = model.lm_head.weight.device
        self.compile = compile
        self.cuda_graphs = compile and (self.device.type == "cuda" if cuda_graphs is None else cuda_graphs)
        self.fallback = None  # why compiled inference was abandoned, once it was
        self._caches = {}
        self._graphs_at_start = graph_count()
        if compile:
            # one entry per shape family and cache capacity; dynamo's default limit (8 per
            # code object) would otherwise send the later ones to eager without a word
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            self._compiled = {family: _compiled(family, backend, self.cuda_graphs and family == "decode")
                              for family in ("score", "prefill", "decode")}
        self._eager = {"score": _score, "prefill": _prefill, "decode": _decode}

    def graphs(self):
        """Graphs compiled since this object was made."""
        return graph_count() - self._graphs_at_start

    def _run(self, family, *args, **kwargs):
        if self.compile and self.fallback is None:
            try:
                return self._compiled[family](self.model, *args, **kwargs)
            except CALLER_ERRORS:
                raise
            except Exception as e:  # the compiler's failure: evaluate eagerly from here on
                first = (str(e).strip().splitlines() or [""])[0][:160]
                self.fallback = f"{type(e).__name__}: {first}"
                print0(f"warning: compiled inference failed ({self.fallback}); continuing eagerly")
        return self._eager[family](self.model, *args, **kwargs)

    def __call__(self, idx, targets=None, loss_reduction="mean"):
        return self._run("score", idx, targets, loss_reduction=loss_reduction)

    # ----- generation: GPT.generate's `steps` -----

    def cache(self, batch_size, length):
        """A reset StaticKVCache for `length` tokens: compiled, the kept one of its capacity
        bucket (the same storage on every call); eager, one of exactly that length."""
        if not self.compile or self.fallback is not None:
            return EagerSteps(self.model).cache(batch_size, length)
        capacity = cache_capacity(length, self.rotary_len)
        dtype = self.model.activation_dtype(torch.empty(0, device=self.device))
        key = (batch_size, capacity, dtype)
        cache = self._caches.get(key)
        if cache is None:
            cfg = self.config
            # ordinary tensors even when first asked for under inference_mode (generate): a
            # kept cache is written again later, possibly outside it
            with torch.inference_mode(False):
                cache = self._caches[key] = StaticKVCache(batch_size, cfg.n_layer, cfg.n_kv_head,
                                                          self.model.head_dim, capacity, self.device, dtype,
                                                          smear_dim=self.model.smear_dim)
        cache.reset()
        return cache

    def step(self, ids, cache):
        """Logits of ids (B, T) after what `cache` holds: a prefill for T > 1, else a decode step."""
        if ids.size(1) > 1:
            return self._run("prefill", ids, cache)
        if self.cuda_graphs:
            # a new replay may overwrite the previous step's output: the caller has read it
            torch.compiler.cudagraph_mark_step_begin()
            return self._run("decode", ids, cache).clone()
        return self._run("decode", ids, cache)

    def generate(self, tokens, max_tokens, temperature=1.0, top_k=None, seed=42):
        return self.model.generate(tokens, max_tokens, temperature=temperature, top_k=top_k, seed=seed, steps=self)
