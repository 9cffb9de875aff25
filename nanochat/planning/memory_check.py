"""The memory estimate (nanochat/planning/memory.py) held to real memory, on the CPU: the peak of a real
training step beside the estimate, for every variant and option, eagerly and compiled, and the
GPU figures of the variants relative to the residual baseline.

The CPU has no allocator statistics (RSS counts the allocator's caches and the libraries), so a
real step's peak is the sum of live tensor bytes, by torch's `MemTracker` over real tensors.
Compiled means the partition torch.compile makes (`memory.aot_step`: Inductor's decompositions,
the min-cut partitioner, as backend "aot_eager_decomp_partition") run op by op on real tensors,
without code generation; the estimate is then taken with `inductor=False`. Inductor's fusion, which the GPU
estimate assumes, can only be held to a GPU's `max_memory_allocated` (scripts.gpu_check).
"""

import torch

from nanochat.planning import memory
from nanochat.connections import VARIANTS
from nanochat.gpt import build_model, model_config_from_depth

# Every variant, then the options of the HC family on KromHC (the options apply to every HC
# variant alike: one carrier measures what they add).
CASES = [(v, {}) for v in VARIANTS] + [("kromhc", {"hc_expand": "lss"}), ("kromhc", {"hc_reduce": "learned"}),
                                       ("kromhc", {"hc_pre": "delayed"}), ("kromhc", {"hc_recompute": True})]
# The CPU sizes: (depth, sequence length, device batch); width 64 (head dim 32), vocab 512.
SIZES = [(2, 64, 2), (2, 128, 4)]
EAGER_TOLERANCE, COMPILED_TOLERANCE = 0.10, 0.15


def case_label(variant, options):
    return variant + "".join(f" {k}={v}" for k, v in options.items())


def small_config(variant, options, depth, seq_len):
    return memory.traced_config(model_config_from_depth(depth, 512, seq_len, aspect_ratio=32, head_dim=32,
                                                        hc=variant, **options))


def measured_step_peak(config, device_batch, compile):
    """Peak live tensor bytes of a real fp32 forward and backward on the CPU, parameters and
    buffers excluded (what `memory.step_peak` estimates). Compiled: the partition of
    `memory.aot_step` on real tensors (MemTracker, a dispatch mode, cannot watch a
    torch.compile'd module: dynamo runs it eagerly under one), after a first step that traces it."""
    torch.manual_seed(0)
    model = build_model(config, "cpu")
    step = memory.aot_step(model)[0] if compile else model
    idx = torch.randint(0, config.vocab_size, (device_batch, config.sequence_len))
    if compile:
        step(idx, idx).backward()
        model.zero_grad(set_to_none=True)
    return memory.tracked_peak(model, lambda: step(idx, idx).backward())


def check_rows(cases=CASES, sizes=SIZES, modes=(False, True)):
    """[(label, mode, size, estimated bytes, measured bytes, relative error)] over the cases."""
    rows = []
    for variant, options in cases:
        for depth, seq_len, batch in sizes:
            config = small_config(variant, options, depth, seq_len)
            for compile in modes:
                est = memory.step_peak(config, batch, compile=compile, cuda=False, inductor=False)
                real = measured_step_peak(config, batch, compile)
                rows.append((case_label(variant, options), "compiled" if compile else "eager",
                             f"D={depth} T={seq_len} B={batch}", est, real, est / real - 1))
    return rows


def gpu_rows(variants, depth=12, batch=32, seq_len=2048, world_size=8, vocab_size=32768, modes=(True, False)):
    """[(variant, mode, Estimate, ratio to the first variant's peak in that mode)]: the GPU
    figures (bf16, CUDA's dtype rules, per rank)."""
    rows = []
    for compile in modes:
        first = None
        for variant in variants:
            config = model_config_from_depth(depth, vocab_size, seq_len, hc=variant)
            est = memory.estimate(config, batch, world_size, compile=compile)
            first = first or est
            rows.append((variant, "compiled" if compile else "eager", est, est.peak / first.peak))
    return rows


def outside_tolerance(rows):
    """The rows of check_rows whose error exceeds their mode's tolerance."""
    return [r for r in rows if abs(r[5]) > (COMPILED_TOLERANCE if r[1] == "compiled" else EAGER_TOLERANCE)]

