"""One command that measures nanochat-hc on a single GPU with no network, using whatever
torch is installed there (no scripts/setup_env.sh; wandb is not needed):

    python -m scripts.gpu_check [--out DIR]

writes DIR/gpu_check.json and DIR/gpu_check.md (DIR made if missing; both rewritten after
every case, so a run cut off from outside still leaves what it measured):
  env        GPU, torch, CUDA/cuDNN/Triton versions, the SDPA backend picked for the windowed
             ("S", explicit mask) and full-context ("L", is_causal) layers
  attention  one attention kernel, forward + backward, at T = 2048 for the S (W = T/2) and L
             windows: FlexAttention with its block mask vs SDPA
  model      whole-model forward + backward step of every variant at D = 6 and D = 12 (n = 4,
             compiled, bf16, device batch 32 or the largest that fits: an OOM halves it):
             time, tokens/s, MFU, peak memory beside the memory planner's estimate, ratios to
             residual and to mHC per token, residual with full-causal attention everywhere as
             the windowing reference, and each case's top kernels in one profiled step
  grads      one connection layer per variant, gradients compiled vs eager (bf16 autocast)
  train      a 20-step scripts.base_train run (uncompiled model) of every variant on a
             generated corpus (shards and tokenizer written locally), ending with val bpb,
             samples through the KV cache and connection diagnostics
  kernels    --hc-kernels torch, liger and fused (Liger-Kernel's stream kernels and ours; the
             kernels extra): first the whole model at D = 12 (batch 32), the compiled residual
             baseline once, then KromHC and mHC fused, torch, liger, then every other HC variant
             on the first backend that runs it, each compiled, timed interleaved with the
             baseline, profiled and written as it ends; then one connection layer of every HC
             variant at C = 768, T = 2048, B = 32; with x residual, x torch, peak memory, top
             kernels and the first step's seconds (its compile). Late, so the time budget may
             leave it for a second call (--sections kernels, which runs it first)
  pre        delayed pre-weights (DeepSeek-V4.1's single-pass mHC, --hc-pre delayed) against the
             paper's, mHC and KromHC, whole model at the first depth: time and the kernels
             Inductor generates for each (what fusing the post mix of one layer with the next
             layer's projection and pre mix buys on this GPU)
  infer      inference of every variant (scripts.bench --bench infer): prefill tokens/s at
             T = 2048 and decode ms per token (128 tokens after a 512-token prompt), batch 1
             and 8, eager vs compiled vs CUDA graphs (decode steps replayed), at D = 6 with
             ratios to residual, to mHC and to eager. Last, so the budget may leave it for a
             second call (--sections infer)
Timing comes from scripts/bench (interleaved repetitions, median, IQR spread). Sized for
10 minutes on one H100, most of it compilation (18 compiled models), D6 before D12: a case
starts only if its estimated seconds end within --time-budget (default 540: the 600 s a
device's command may run, less a margin for the last interleaved timing and the report).
The estimate (`Budget`) is the longest time per unit
measured so far for the kind of case (a layer of a compiled model, a compiled connection
layer, a base_train run), before any the profile's prior (on a GPU 10 s, 20 s and 90 s:
guesses, until measured); every case's estimate and wall time are in the JSON ("cases").
What is left is listed as skipped, for a second call with --sections, --depths or
--variants (and another --out).

Without CUDA (or with --tiny) the same sections run at toy sizes, uncompiled models (the
connection layers are still traced by dynamo, without code generation) and forward-only
attention (FlexAttention has no backward on CPU): a check that the command works, not a
measurement.
"""

import argparse
import gc
import json
import os
import platform
import random
import statistics
import tempfile
import time
from contextlib import nullcontext

import torch

from nanochat import connections, gpt
from nanochat.cli import positive_int, run
from nanochat.common import get_peak_flops, single_gpu_device, synchronize, text_table
from scripts import bench, bench_infer, bench_profile

SECTIONS = ("env", "attention", "model", "grads", "train", "kernels", "pre", "infer")
VARIANTS = bench.VARIANTS
FULL_CAUSAL = "residual (full causal)"
TOP_KERNELS = 6  # kernels listed per model case: where a ratio to residual comes from

# Sizes per profile. gpu: the paper's D6/D12 models (head dim 128, T 2048, device batch 32).
PROFILES = {
    "gpu": dict(depths=[6, 12], batch=32, seq_len=2048, vocab=32768, head_dim=128, aspect=64, warmup=2, reps=5,
                attn=dict(B=32, H=6, T=2048, D=128), layer=dict(batch=8, seq_len=1024, width=768),
                train=["--depth", "4", "--max-seq-len", "512", "--device-batch-size", "16",
                       "--total-batch-size", "8192", "--eval-tokens", "16384"], vocab_train=4096, corpus_docs=6000,
                kernel_layer=dict(batch=32, seq_len=2048, width=768), kernel_model=dict(batch=32, seq_len=2048),
                infer=dict(depth=6, prefill_lens=[2048], batches=[1, 8], prompt_len=512, new_tokens=128),
                priors=dict(model=10, layer=20, train=90)),
    "tiny": dict(depths=[1, 2], batch=2, seq_len=64, vocab=256, head_dim=16, aspect=32, warmup=0, reps=1,
                 attn=dict(B=1, H=2, T=256, D=16), layer=dict(batch=2, seq_len=16, width=32),
                 train=["--depth", "2", "--aspect-ratio", "32", "--head-dim", "32", "--max-seq-len", "64",
                        "--window-pattern", "SL", "--device-batch-size", "4", "--total-batch-size", "256",
                        "--eval-tokens", "512", "--device-type", "cpu"], vocab_train=512, corpus_docs=600,
                 kernel_layer=dict(batch=2, seq_len=16, width=32), kernel_model=dict(batch=1, seq_len=16, depth=1),
                 infer=dict(depth=1, prefill_lens=[16], batches=[1, 2], prompt_len=8, new_tokens=4),
                 priors={}),
}


def build_parser():
    p = argparse.ArgumentParser(prog="python -m scripts.gpu_check", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--out", default=".", help="directory for gpu_check.json and gpu_check.md, made if missing "
                                              "(default: .)")
    p.add_argument("--tiny", action="store_true", help="toy sizes (the default without CUDA)")
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS), metavar="S",
                   help=f"what to run (default: all: {' '.join(SECTIONS)})")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS), metavar="V",
                   help="connection variants (default: all)")
    p.add_argument("--backends", nargs="+", choices=("torch", "liger", "fused", "fused-split"),
                   default=["torch", "liger", "fused", "fused-split"], metavar="K",
                   help="stream paths of the kernels section (default all: torch liger fused fused-split, the last "
                        "the fused seams' split design)")
    p.add_argument("--depths", nargs="+", type=positive_int(), help="model depths (default 12 6; tiny: 1 2)")
    p.add_argument("--batch", type=positive_int(), help="device batch of the model section (default 32; halved on OOM)")
    p.add_argument("--reps", type=positive_int(), help="timed repetitions per case (default 5; tiny: 1)")
    p.add_argument("--train-steps", type=positive_int(), default=20, help="base_train steps per variant (default 20)")
    p.add_argument("--time-budget", type=positive_int(), default=540,
                   help="seconds within which every case must end by its estimate; what would not is listed "
                        "as skipped (default 540)")
    return p


# ----------------------------------------------------------------------------- sections

class Budget:
    """The run's time budget: a case starts only if it is expected to end within it, else it
    is skipped and listed, so that the command ends in time with a report (a later run with
    --sections/--depths fills in). A case of `size` units of its `kind` is expected to take
    size times the longest seconds per unit of the finished cases of that kind, or, before
    any has finished, the prior: compilation dominates, and its time per unit (a model's
    layer, a connection layer) is what one run can learn about this machine."""

    def __init__(self, seconds, priors):
        self.end = time.time() + seconds
        self.priors = priors
        self.skipped = []
        self.cases = {}  # what -> kind, size, estimate_s, and wall_s once finished
        self._running = None  # (what, start time)

    def allows(self, what, kind, size=1):
        done = [c["wall_s"] / c["size"] for c in self.cases.values()
                if c["kind"] == kind and c["size"] and "wall_s" in c]
        estimate = size * (max(done) if done else self.priors.get(kind, 0))
        self.cases[what] = {"kind": kind, "size": size, "estimate_s": round(estimate, 1)}
        if time.time() + estimate > self.end:
            self.skipped.append(what)
            return False
        self._running = (what, time.time())
        return True

    def close(self):
        """The running case has ended: its section has yielded, returned or failed."""
        if self._running is not None:
            what, start = self._running
            self.cases[what]["wall_s"] = round(time.time() - start, 1)
            self._running = None


def env_info(device):
    from nanochat.planning.memory import code_fingerprint
    # "code": the digest of the model and connection code measured (the memory cache's key), so
    # that a committed result can be told apart from the code it no longer describes.
    info = {"torch": torch.__version__, "python": platform.python_version(), "device": device.type,
            "code": code_fingerprint(),
            "backward_pass_autocast": getattr(torch._functorch.config, "backward_pass_autocast", None)}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device.type != "cuda":
        info["device_name"] = platform.processor() or platform.machine()
        return info
    info.update(device_name=torch.cuda.get_device_name(device),
                capability=".".join(map(str, torch.cuda.get_device_capability(device))),
                cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                memory_gib=round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1))
    # Which fused SDPA kernel the S (explicit mask) and L (is_causal) layers get on this stack.
    names = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn"}
    q = torch.randn(1, 6, 2048, 128, device=device, dtype=torch.bfloat16)
    mask, _ = gpt.attention_mask(2048, 2048, 1024, device)
    try:
        info["sdpa_backend_S"] = names.get(torch._fused_sdp_choice(q, q, q, mask), "?")
        info["sdpa_backend_L"] = names.get(torch._fused_sdp_choice(q, q, q, is_causal=True), "?")
    except (AttributeError, RuntimeError) as e:  # a private API: report, do not fail
        info["sdpa_backend_S"] = info["sdpa_backend_L"] = f"unknown ({type(e).__name__})"
    return info


def attention_section(prof, device, dtype):
    """Kernel time of one layer's attention (q, k, v -> y; + backward on CUDA) per window."""
    a, grad = prof["attn"], device.type == "cuda"
    T = a["T"]
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(a["B"], a["H"], T, a["D"], device=device, generator=g).to(dtype).requires_grad_(grad)
               for _ in range(3))
    dy = torch.randn_like(q)
    cases = {}
    for window_name, window in (("S", T // 2), ("L", T)):
        for backend, attend in (("sdpa", gpt.sdpa_attend), ("flex", gpt.flex_attend)):
            def step(attend=attend, window=window):
                if grad:
                    q.grad = k.grad = v.grad = None
                    attend(q, k, v, window).backward(dy)
                else:
                    with torch.no_grad():
                        attend(q, k, v, window)
            cases[f"{window_name} {backend}"] = dict(step=step, window_name=window_name, window=window,
                                                     backend=backend)
    times = bench.time_interleaved(cases, prof["warmup"], prof["reps"], device)
    rows = []
    for label, case in cases.items():
        summary = bench.summarize(times[label], a["B"] * T)
        rows.append({"label": label, "window": case["window"], "window_name": case["window_name"],
                     "backend": case["backend"], "pass": "fwd+bwd" if grad else "fwd", **a,
                     **{k: summary[k] for k in ("median_ms", "min_ms", "max_ms", "spread_pct")}})
    for row in rows:
        sdpa = next(r for r in rows if r["window_name"] == row["window_name"] and r["backend"] == "sdpa")
        row["vs_sdpa"] = row["median_ms"] / sdpa["median_ms"]
    return rows


def _bench_args(prof, depth, batch, window_pattern, compile_model):
    argv = ["--bench", "model", "--depth", str(depth), "--aspect-ratio", str(prof["aspect"]),
            "--head-dim", str(prof["head_dim"]), "--seq-len", str(prof["seq_len"]), "--batch", str(batch),
            "--vocab-size", str(prof["vocab"]), "--streams", "4", "--window-pattern", window_pattern]
    return bench.parse_args(argv + (["--compile"] if compile_model else []))


def _free_memory(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _fitting_case(prof, depth, variant, window_pattern, batch, device, dtype, autocast, compile_model):
    """bench's model case at the largest batch <= `batch` whose first step (the compile) fits."""
    while True:
        args = _bench_args(prof, depth, batch, window_pattern, compile_model)
        try:
            case = bench.model_case(args, variant, False, device, dtype, autocast)
            case["step"]()
            return case, batch
        except torch.OutOfMemoryError:
            if batch == 1:
                raise
        case = None  # freed once the exception (and the frames it holds) is gone
        _free_memory(device)
        batch //= 2


def estimated_step_mib(config, batch, compile_model, device):
    """nanochat/planning/memory.py's estimate of step_peak_mib (the step's peak above the parameters),
    beside the measurement so that the estimate can be corrected from it; None off CUDA, where
    nothing is measured."""
    if device.type != "cuda":
        return None
    from nanochat.planning.memory import cached_step_peak
    return cached_step_peak(config, batch, compile=compile_model) / 2**20


def model_section(prof, variants, device, dtype, autocast, compile_model, budget):
    """Per depth: every variant plus full-causal residual, timed interleaved in one run. Yields
    the rows so far after each case is compiled (the case, as the budget counts it: the
    interleaved timing belongs to its depth) and after each depth is timed."""
    rows = []
    peak_flops = get_peak_flops(device)
    for depth in prof["depths"]:
        cases = {}
        # residual and its full-causal twin first: the windowing target needs both
        plan = [(v, v, "SSSL") for v in variants]
        plan.insert(1 if "residual" in variants else 0, (FULL_CAUSAL, "residual", "L"))
        torch._dynamo.reset()  # the previous depth's graphs are done with
        bench.allow_compiled_cases(len(plan))
        for label, variant, pattern in plan:
            if not budget.allows(f"model D{depth} {label}", "model", depth):
                continue
            case, batch = _fitting_case(prof, depth, variant, pattern, prof["batch"], device, dtype, autocast,
                                        compile_model)
            cases[label] = dict(case, variant=variant, batch=batch, window_pattern=pattern)
            yield rows
        if not cases:
            continue
        times = bench.time_interleaved(cases, prof["warmup"], prof["reps"], device)
        depth_rows = []
        for label, case in cases.items():
            summary = bench.summarize(times[label], case["tokens"])
            model = case["module"]
            flops = model.estimate_flops()
            depth_rows.append({
                "depth": depth, "label": label, "variant": case["variant"], "window_pattern": case["window_pattern"],
                "width": model.config.n_embd, "n": case["n"], "batch": case["batch"], "seq_len": prof["seq_len"],
                "compiled": compile_model, **{k: summary[k] for k in ("median_ms", "spread_pct", "tokens_per_s")},
                "ms_per_token": summary["median_ms"] / case["tokens"], "flops_per_token": flops,
                "mfu_pct": 100 * flops * summary["tokens_per_s"] / peak_flops if peak_flops != float("inf") else None,
                "param_mib": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20,
                "step_peak_mib": bench.peak_step_mib(model, case["step"], device),
                "estimate_step_mib": estimated_step_mib(model.config, case["batch"], compile_model, device),
                "top_kernels": bench_profile.top_ops(case["step"], device, TOP_KERNELS, synchronize)})
        for row in depth_rows:
            for key, ref_label in (("vs_residual", "residual"), ("vs_mhc", "mhc"), ("vs_full_causal", FULL_CAUSAL)):
                ref = next((r for r in depth_rows if r["label"] == ref_label), None)
                row[key] = row["ms_per_token"] / ref["ms_per_token"] if ref else None
        rows += depth_rows
        cases = None
        _free_memory(device)
        yield rows
    yield rows


def grads_section(prof, variants, device, dtype, autocast, compile_backend, budget):
    """Relative gap |g_compiled - g_eager| / |g_eager| of X's and every parameter's gradient
    through one connection layer, the projection weight away from its zero init; yields the
    rows after each variant."""
    layer = prof["layer"]
    rows = []
    for variant in variants:
        if not budget.allows(f"grads {variant}", "layer"):
            continue
        args = bench.parse_args(["--bench", "layer", "--width", str(layer["width"]), "--head-dim",
                                 str(prof["head_dim"]), "--seq-len", str(layer["seq_len"]), "--batch",
                                 str(layer["batch"]), "--streams", "4"])
        case = bench.layer_case(args, variant, False, device, dtype, autocast)
        module, inputs = case["module"], case["inputs"]
        X = inputs[0]
        weight = getattr(module.layer, "weight", None)
        if weight is not None:
            with torch.no_grad():
                weight.normal_(0, 0.05, generator=torch.Generator(device=device).manual_seed(1))

        def grads(run):
            module.zero_grad(set_to_none=True)
            X.grad = None
            with autocast:
                out = run(*inputs)
            out.backward(case["grad_out"])
            named = {"X": X.grad, **{n: p.grad for n, p in module.named_parameters() if p.grad is not None}}
            return {n: g.double().clone() for n, g in named.items()}

        torch._dynamo.reset()
        eager, compiled = grads(module), grads(torch.compile(module, dynamic=False, backend=compile_backend))
        gaps = {n: ((compiled[n] - g).norm() / g.norm().clamp_min(1e-30)).item() for n, g in eager.items()}
        rows.append({"variant": variant, "backend": compile_backend, "max_rel_gap": max(gaps.values()),
                     "worst": max(gaps, key=gaps.get), "gaps": gaps})
        _free_memory(device)
        yield rows
    yield rows


# Words for the generated corpus: documents of templated facts (arithmetic, lists, capitals),
# structured enough that a few training steps visibly lower the loss.
_CITIES = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo"), ("Egypt", "Cairo"),
           ("Peru", "Lima"), ("Kenya", "Nairobi"), ("Norway", "Oslo"), ("Chile", "Santiago"), ("India", "Delhi")]
_WORDS = "the a small large red blue quick slow river stone garden window music paper light water".split()
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"] + ["an", "el", "or", "ix", "um"]


def kernel_backends(device, wanted=("torch", "liger", "fused", "fused-split")):
    """(the stream paths of `wanted` that run here, {path: why not} for the others): torch
    always; liger and fused (either seam design) on CUDA (or under Triton's interpreter) when
    installed."""
    from nanochat.connections.backends import fused, liger
    ok, missing = ["torch"] if "torch" in wanted else [], {}
    for name, module, what in (("liger", liger, "Liger-Kernel"), ("fused", fused, "Triton"),
                               ("fused-split", fused, "Triton")):
        if name not in wanted:
            continue
        if not module.AVAILABLE:
            missing[name] = f"{what} not installed (pip install -e '.[kernels]')"
        elif not module.runs_on(device.type):
            missing[name] = f"no CUDA ({device.type})"
        else:
            ok.append(name)
    return ok, missing


# The whole-model cases after the residual baseline, in the order the GPU plan needs them:
# the paper's pair (KromHC, mHC) on every backend, ours first, the default second, Liger's last;
# then every other variant: one of n streams on the first backend that runs it (fused and liger
# refuse frac and gated), any other (the zoo's wirings) on torch, the only one it has.
STREAM_ORDER = ("fused", "fused-split", "torch", "liger")
PAPER_PAIR = ("kromhc", "mhc")


def stream_plan(variants, backends):
    """[(variant, [backends to try, in order])] of the whole-model cases: one entry per
    (KromHC or mHC, backend), then one per other variant but residual with the backends it
    declares (SPEC backends) as its fallbacks."""
    order = [b for b in STREAM_ORDER if b in backends]
    plan = [(v, [b]) for b in order for v in PAPER_PAIR if v in variants]
    return plan + [(v, [b for b in order if connections.runs_on(v, b)] or ["torch"]) for v in variants
                   if v not in (*PAPER_PAIR, "residual")]


def _model_case(prof, depth, variant, kernels, device, dtype, autocast, compile_model):
    args = _bench_args(prof, depth, prof["kernel_model"]["batch"], "SSSL", compile_model)
    args.seq_len = prof["kernel_model"]["seq_len"]
    return bench.model_case(args, variant, False, device, dtype, autocast, kernels)


def _stream_row(case, base, variant, kernels, device, prof, peak_flops):
    """Compile the case (its first step), time it interleaved with the compiled baseline, and
    measure its peak and its top kernels: one row, whose ratio to residual is within one
    timing of the two."""
    kernel_count, compile_s = bench.compiled_kernels(case)
    times = bench.time_interleaved({"residual": base, "case": case}, prof["warmup"], prof["reps"], device)
    summary, ref = (bench.summarize(times[k], case["tokens"]) for k in ("case", "residual"))
    flops = case["module"].estimate_flops()
    return {"variant": variant, "kernels": kernels, "n": case["n"], "compile_s": compile_s,
            "compiled_kernels": kernel_count,
            **{k: summary[k] for k in ("median_ms", "spread_pct", "tokens_per_s")},
            "residual_ms": ref["median_ms"], "time_vs_residual": summary["median_ms"] / ref["median_ms"],
            "mfu_pct": 100 * flops * summary["tokens_per_s"] / peak_flops if peak_flops != float("inf") else None,
            "peak_step_mib": bench.peak_step_mib(case["module"], case["step"], device),
            "top_kernels": bench_profile.top_ops(case["step"], device, TOP_KERNELS, synchronize)}


def kernels_section(prof, variants, wanted, device, dtype, autocast, compile_model, budget):
    """--hc-kernels torch, liger and fused, what matters most first: the whole model at the
    largest depth (D=12 on a GPU, the model section's batch), the compiled residual baseline
    once, then each case of `stream_plan` compiled, timed interleaved with the baseline,
    profiled and freed (a row per case, written as it ends: a cut-off run keeps every case
    before it); then one connection layer of every HC variant (C=768, T=2048, B=32 on a GPU)
    on every backend, timed interleaved by scripts.bench. Rows: x residual, x torch, peak
    memory, the first step's seconds (its compile). Yields the result after each case."""
    backends, missing = kernel_backends(device, wanted)
    out = {"available": bool(set(backends) - {"torch"}), "backends": backends, "missing": missing, "rows": [],
           "errors": [], "layer": dict(prof["kernel_layer"]),
           # the largest depth; tiny: one layer, as the interpreter runs every kernel program by program
           "depth": prof["kernel_model"].get("depth", max(prof["depths"])),
           "batch": prof["kernel_model"]["batch"]}
    if not out["available"]:
        out["reason"] = "; ".join(f"{k}: {why}" for k, why in missing.items())
        yield out
        return
    depth, peak_flops = out["depth"], get_peak_flops(device)
    label = f"model D{depth}"
    torch._dynamo.reset()
    plan = stream_plan(variants, backends)
    bench.allow_compiled_cases(1 + len(plan))
    base = None
    if plan and budget.allows(f"kernels {label} residual", "model", depth):
        base = _model_case(prof, depth, "residual", "torch", device, dtype, autocast, compile_model)
        kernel_count, compile_s = bench.compiled_kernels(base)
        out["rows"].append({"run": label, "depth": depth, "variant": "residual", "kernels": "torch", "n": base["n"],
                            "compile_s": compile_s,
                            "compiled_kernels": kernel_count, "time_vs_residual": 1.0,
                            "peak_step_mib": bench.peak_step_mib(base["module"], base["step"], device),
                            "top_kernels": bench_profile.top_ops(base["step"], device, TOP_KERNELS, synchronize)})
        yield out
    for variant, tries in plan if base else []:
        if not budget.allows(f"kernels {label} {variant} [{tries[0]}]", "model", depth):
            continue
        for kernels in tries:
            try:
                case = _model_case(prof, depth, variant, kernels, device, dtype, autocast, compile_model)
            except SystemExit:  # bench's one line for a config this backend refuses: the next one
                continue
            try:
                out["rows"].append(dict(_stream_row(case, base, variant, kernels, device, prof, peak_flops),
                                        run=label, depth=depth))
            except Exception as e:  # one case's failure must not hide the others
                out["errors"].append(f"{label} {variant} [{kernels}]: {type(e).__name__}: {e}")
            break
        else:
            out["errors"].append(f"{label} {variant}: none of {', '.join(tries)} builds it")
        case = None
        _free_memory(device)
        _fill_stream_ratios(out["rows"])
        _baseline_timing(out["rows"], base, peak_flops)
        yield out
    base = None
    _free_memory(device)
    hc_variants = [v for v in variants if set(connections.spec(v).backends) - {"torch"}]  # those with stream kernels
    layer = out["layer"]
    # a layer called alone runs its read and its post mix as two seams of their own, the same in
    # both seam designs: one fused row
    layer_paths = [b for b in backends if b != "fused-split"]
    if hc_variants and budget.allows("kernels layer", "layer", len(layer_paths) * len(hc_variants)):
        argv = ["--bench", "layer", "--width", str(layer["width"]), "--seq-len", str(layer["seq_len"]),
                "--batch", str(layer["batch"]), "--variants", *hc_variants, "--hc-kernels", ",".join(layer_paths),
                "--warmup", str(prof["warmup"]), "--reps", str(prof["reps"]), "--head-dim", str(prof["head_dim"]),
                "--streams", "4"] + (["--compile"] if compile_model else [])
        torch._dynamo.reset()
        rows = bench.run_bench(bench.parse_args(argv), "layer", device, dtype, autocast)
        out["rows"] += [dict(r, run="layer") for r in rows]
    yield out


def _baseline_timing(rows, base, peak_flops):
    """The baseline row's own timing: its median over every pair it was timed in (spread:
    their range)."""
    pairs = [r["residual_ms"] for r in rows if "residual_ms" in r]
    if pairs:
        ms = statistics.median(pairs)
        rate = base["tokens"] / (ms / 1e3)
        rows[0].update(median_ms=ms, tokens_per_s=rate, spread_pct=100 * (max(pairs) - min(pairs)) / ms,
                       mfu_pct=100 * base["module"].estimate_flops() * rate / peak_flops
                       if peak_flops != float("inf") else None)


def _fill_stream_ratios(rows):
    """time_vs_torch of each whole-model row: its ratio to residual over that of the same
    variant on the torch backend (each measured against the same compiled baseline)."""
    for row in rows:
        ref = next((r for r in rows if r["variant"] == row["variant"] and r["kernels"] == "torch"
                    and "time_vs_residual" in r), None)
        row["time_vs_torch"] = row["time_vs_residual"] / ref["time_vs_residual"] if ref and "time_vs_residual" in row else None


def pre_section(prof, variants, device, dtype, autocast, compile_model, budget):
    """--hc-pre current vs delayed, whole model at the first depth (mHC and KromHC among the
    variants asked for), timed interleaved by scripts.bench, with the kernels each compiles to."""
    chosen = [v for v in ("mhc", "kromhc") if v in variants]
    if not chosen or not budget.allows("pre", "model", prof["depths"][0] * 2 * len(chosen)):
        return []
    argv = ["--bench", "model", "--depth", str(prof["depths"][0]), "--aspect-ratio", str(prof["aspect"]),
            "--head-dim", str(prof["head_dim"]), "--seq-len", str(prof["seq_len"]),
            "--batch", str(max(1, prof["batch"] // 2)), "--vocab-size", str(prof["vocab"]), "--streams", "4",
            "--warmup", str(prof["warmup"]), "--reps", str(prof["reps"]), "--hc-pre", "current,delayed",
            "--variants", *chosen] + (["--compile"] if compile_model else [])
    torch._dynamo.reset()
    rows = bench.run_bench(bench.parse_args(argv), "model", device, dtype, autocast)
    for row in rows:
        current = next(r for r in rows if r["variant"] == row["variant"] and r["pre"] == "current")
        row["time_vs_current"] = row["median_ms"] / current["median_ms"]
    return rows


def infer_section(prof, variants, device, dtype, autocast, budget):
    """scripts.bench --bench infer over every variant: eager, compiled and (CUDA) CUDA graphs;
    eager only without CUDA (a compiled graph costs minutes on a small CPU)."""
    size = prof["infer"]
    # on CUDA every variant compiles for two modes (compiled, cudagraphs), forward only
    if not budget.allows("infer", "model", size["depth"] * len(variants) * 2 if device.type == "cuda" else 0):
        return []
    modes = "eager,compiled,cudagraphs" if device.type == "cuda" else "eager"
    argv = ["--bench", "infer", "--depth", str(size["depth"]), "--aspect-ratio", str(prof["aspect"]),
            "--head-dim", str(prof["head_dim"]), "--vocab-size", str(prof["vocab"]), "--streams", "4",
            "--prefill-lens", *map(str, size["prefill_lens"]), "--infer-batches", *map(str, size["batches"]),
            "--prompt-len", str(size["prompt_len"]), "--new-tokens", str(size["new_tokens"]),
            "--warmup", str(prof["warmup"]), "--reps", str(prof["reps"]), "--modes", modes, "--variants", *variants]
    torch._dynamo.reset()
    args = bench.parse_args(argv)
    return bench_infer.run_infer(args, ["prefill", "decode"], device, dtype, autocast, bench)


def generated_documents(count, seed=0):
    rng = random.Random(seed)
    # A few thousand pseudo-words give the tokenizer something to merge beyond digits.
    words = _WORDS + ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    docs = []
    for _ in range(count):
        sentences = []
        for _ in range(rng.randint(8, 30)):
            kind = rng.randrange(4)
            if kind == 0:
                a, b = rng.randint(0, 99), rng.randint(0, 99)
                sentences.append(f"{a} plus {b} is {a + b}.")
            elif kind == 1:
                country, city = rng.choice(_CITIES)
                sentences.append(f"The capital of {country} is {city}.")
            elif kind == 2:
                start = rng.randint(0, 50)
                sentences.append("Counting: " + ", ".join(str(start + i) for i in range(rng.randint(3, 8))) + ".")
            else:
                sentences.append(" ".join(rng.choice(words) for _ in range(rng.randint(4, 10))).capitalize() + ".")
        docs.append(" ".join(sentences))
    return docs


def train_section(prof, variants, steps, device, budget):
    """scripts.base_train, in this process, on a generated corpus in a temporary directory;
    yields the rows after each variant."""
    from nanochat.data.local import write_corpus
    from nanochat.tokenizer import Tokenizer
    from scripts import base_train

    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as base:
        previous = os.environ.get("NANOCHAT_BASE_DIR")
        os.environ["NANOCHAT_BASE_DIR"] = base
        try:
            docs = generated_documents(prof["corpus_docs"])
            write_corpus(docs, os.path.join(base, "base_data"), {"source": "generated"}, rows_per_group=64,
                         shard_chars=200_000)
            Tokenizer.train_from_iterator(iter(docs), prof["vocab_train"]).save(os.path.join(base, "tokenizer"))
            for variant in variants:
                if not budget.allows(f"train {variant}", "train"):
                    continue
                # Uncompiled: the compiled model is measured above, and compiling six more models
                # would not fit the time budget; the optimizer kernels still compile on CUDA.
                argv = prof["train"] + ["--hc", variant, "--num-iterations", str(steps), "--model-tag", variant,
                                        "--eval-every", "-1", "--core-metric-every", "-1", "--save-every", "-1",
                                        "--compile", "false"]
                t0 = time.time()
                row = {"variant": variant, "steps": steps}
                try:
                    base_train.main(argv)
                    with open(os.path.join(base, "runs", variant, "summary.json")) as f:
                        summary = json.load(f)
                    with open(os.path.join(base, "runs", variant, "metrics.jsonl")) as f:
                        losses = [r["loss"] for r in map(json.loads, f) if r["kind"] == "train"]
                    row.update(ok=True, first_loss=losses[0], last_loss=losses[-1], val_bpb=summary["val_bpb"],
                               tok_per_sec=summary["tok_per_sec"], step_time=summary["step_time"],
                               peak_mem_mib=summary["peak_mem_mib"])
                except (Exception, SystemExit) as e:  # one variant's failure must not hide the others
                    row.update(ok=False, error=f"{type(e).__name__}: {e}")
                    gc.unfreeze()  # base_train stops the collector for its loop; a failure leaves it so
                    gc.enable()
                row["wall_s"] = time.time() - t0
                rows.append(row)
                _free_memory(device)
                yield rows
        finally:
            if previous is None:
                os.environ.pop("NANOCHAT_BASE_DIR", None)
            else:
                os.environ["NANOCHAT_BASE_DIR"] = previous
    yield rows


# ----------------------------------------------------------------------------- report

def _f(value, spec):
    return "-" if value is None else format(value, spec)


def md_table(header, rows):
    """The report's markdown table; a console table in a code block where matplotlib (which
    nanochat.report imports) is not installed, so the GPU machine's report never fails."""
    try:
        from nanochat.report.format import md_table as table
    except ImportError:
        return "```\n" + text_table(header, rows) + "\n```"
    return table(header, rows)


def markdown(result):
    env, lines = result["env"], ["# gpu_check", ""]
    measured = env.get("device") == "cuda"
    lines.append(f"{env.get('device_name')} ({env.get('device')}), torch {env.get('torch')}, CUDA {env.get('cuda')}, "
                 f"cuDNN {env.get('cudnn')}, Triton {env.get('triton')}; profile `{result['profile']}`; "
                 f"model code {env.get('code')}.")
    if not measured:
        lines.append("\n**No CUDA device: toy sizes, a check that the command runs. These are not GPU numbers.**")
    if "sdpa_backend_S" in env:
        lines.append(f"\nSDPA picks `{env['sdpa_backend_S']}` for S layers (explicit mask) and "
                     f"`{env['sdpa_backend_L']}` for L layers (is_causal).")
    lines.append(f"backward_pass_autocast = `{env.get('backward_pass_autocast')}`.")
    if result.get("attention"):
        r0 = result["attention"][0]
        lines += ["", f"## Attention, one layer ({r0['pass']}), B={r0['B']} H={r0['H']} T={r0['T']} D={r0['D']}", "",
                  md_table(["window", "backend", "median ms", "spread", "x sdpa"],
                           [[f"{r['window_name']} ({r['window']})", r["backend"], f"{r['median_ms']:.3f}",
                             f"{r['spread_pct']:.1f}%", f"{r['vs_sdpa']:.3f}"] for r in result["attention"]]),
                  "", "The model uses flex only for S layers (attention=flex|auto on CUDA); L layers always use SDPA."]
    if result.get("model"):
        lines += ["", "## Whole model, forward + backward (no optimizer)", "",
                  md_table(["D", "variant", "B", "median ms", "spread", "tok/s", "MFU %", "x residual", "x mhc",
                            "x full-causal", "step peak MiB", "estimate MiB", "params MiB"],
                           [[r["depth"], r["label"], r["batch"], f"{r['median_ms']:.1f}", f"{r['spread_pct']:.1f}%",
                             f"{r['tokens_per_s']:,.0f}", _f(r["mfu_pct"], ".1f"), _f(r["vs_residual"], ".3f"),
                             _f(r["vs_mhc"], ".3f"), _f(r["vs_full_causal"], ".3f"), _f(r["step_peak_mib"], ",.0f"),
                             _f(r.get("estimate_step_mib"), ",.0f"), f"{r['param_mib']:,.0f}"]
                            for r in result["model"]]),
                  "", "Ratios are per token (batches may differ after an OOM halving); compiled: "
                  f"{result['model'][0]['compiled']}."]
        profiled = [r for r in result["model"] if r.get("top_kernels")]
        if profiled:
            lines += ["", f"Where each step's time goes: the {TOP_KERNELS} kernels with the most self time in one "
                      "profiled step (torch.profiler)", "",
                      md_table(["D", "variant", "kernel", "calls", "ms", "share"],
                               [[r["depth"] if i == 0 else "", r["label"] if i == 0 else "", f"`{op['name'][:90]}`",
                                 op["calls"], f"{op['ms']:.2f}", f"{100 * op['share']:.0f}%"]
                                for r in profiled for i, op in enumerate(r["top_kernels"])])]
    if result.get("grads"):
        lines += ["", "## Compiled vs eager gradients, one connection layer (bf16 autocast)", "",
                  md_table(["variant", "compile backend", "max rel. gap", "worst tensor"],
                           [[r["variant"], r["backend"], f"{r['max_rel_gap']:.2e}", r["worst"]]
                            for r in result["grads"]])]
    kernels = result.get("kernels")
    if kernels and not kernels["available"]:
        lines += ["", "## Stream kernels: torch, liger, fused, fused-split", "", f"Not measured: {kernels['reason']}."]
    elif kernels:
        layer = kernels["layer"]
        lines += ["", "## Stream kernels: torch, liger, fused, fused-split (--hc-kernels, --hc-seam)", "",
                  md_table(["run", "variant", "kernels", "median ms", "spread", "tok/s", "MFU %", "x residual",
                            "x torch", "saved MiB", "peak MiB", "first step s"],
                           [[r["run"], r["variant"], r["kernels"], _f(r.get("median_ms"), ".3f"),
                             _f(r.get("spread_pct"), ".1f"), _f(r.get("tokens_per_s"), ",.0f"),
                             _f(r.get("mfu_pct"), ".1f"), _f(r.get("time_vs_residual"), ".3f"),
                             _f(r.get("time_vs_torch"), ".3f"),
                             _f(r["saved_bytes"] / 2**20 if "saved_bytes" in r else None, ",.1f"),
                             _f(r.get("peak_step_mib"), ",.0f"), _f(r.get("compile_s"), ".1f")]
                            for r in kernels["rows"]]),
                  "", f"model: the whole model at D={kernels['depth']}, B={kernels.get('batch')}, forward + backward, "
                  "compiled once each and timed interleaved with the compiled residual baseline (its row: the median "
                  "over those pairs; spread there: their range); first step s: the compile. layer: one connection "
                  f"layer, B={layer['batch']} T={layer['seq_len']} C={layer['width']}. Backends: "
                  f"{', '.join(kernels['backends'])}" + "".join(f"; not {k}: {why}" for k, why in kernels["missing"].items())
                  + "."]
        profiled = [r for r in kernels["rows"] if r.get("top_kernels")]
        if profiled:
            lines += ["", f"The {TOP_KERNELS} kernels with the most self time in one profiled step of each whole-model "
                      "case (torch.profiler)", "",
                      md_table(["variant", "kernels", "kernel", "calls", "ms", "share"],
                               [[r["variant"] if i == 0 else "", r["kernels"] if i == 0 else "",
                                 f"`{op['name'][:90]}`", op["calls"], f"{op['ms']:.2f}", f"{100 * op['share']:.0f}%"]
                                for r in profiled for i, op in enumerate(r["top_kernels"])])]
    if result.get("pre"):
        lines += ["", "## Delayed pre-weights (--hc-pre), whole model", "",
                  md_table(["variant", "pre", "median ms", "spread", "x current", "kernels generated"],
                           [[r["variant"], r["pre"], f"{r['median_ms']:.3f}", f"{r['spread_pct']:.1f}%",
                             f"{r['time_vs_current']:.3f}", _f(r.get("compiled_kernels"), "d")]
                            for r in result["pre"]]),
                  "", "kernels generated: by Inductor for the compiled forward and backward (none uncompiled)."]
    if result.get("infer"):
        r0 = result["infer"][0]
        lines += ["", "## Inference: prefill and decode through the KV cache", "",
                  md_table(["bench", "variant", "mode", "B", "T", "median ms", "spread", "tok/s", "ms/token",
                            "x residual", "x mhc", "x eager", "peak MiB"],
                           [[r["bench"], r["variant"], r["mode"] + (" (fell back)" if r["fallback"] else ""),
                             r["batch"], r["seq_len"], f"{r['median_ms']:.3f}", f"{r['spread_pct']:.1f}%",
                             f"{r['tokens_per_s']:,.0f}", _f(r.get("ms_per_token"), ".3f"),
                             _f(r["time_vs_residual"], ".3f"), _f(r["time_vs_mhc"], ".3f"),
                             _f(r["time_vs_eager"], ".3f"), _f(r["peak_mib"], ",.0f")] for r in result["infer"]]),
                  "", f"Decode: {r0.get('new_tokens') or result['sizes']['infer']['new_tokens']} new tokens after the "
                  "T-token prompt; cudagraphs: compiled, decode steps replayed as CUDA graphs (nanochat/engine.py)."]
    if result.get("train"):
        lines += ["", "## base_train on a generated corpus", "",
                  md_table(["variant", "steps", "ok", "loss first -> last", "val bpb", "tok/s", "step s", "wall s"],
                           [[r["variant"], r["steps"], "yes" if r["ok"] else "NO: " + r["error"][:80],
                             f"{r['first_loss']:.3f} -> {r['last_loss']:.3f}" if r["ok"] else "-",
                             _f(r.get("val_bpb"), ".4f"), _f(r.get("tok_per_sec"), ",.0f"),
                             _f(r.get("step_time"), ".3f"), f"{r['wall_s']:.0f}"] for r in result["train"]])]
    lines += ["", "Seconds per section: " + ", ".join(f"{k} {v:.0f}" for k, v in result["elapsed_s"].items())]
    cases = result["cases"]
    finished = [f"{what} {c['estimate_s']:.0f} -> {c['wall_s']:.0f}" for what, c in cases.items() if "wall_s" in c]
    if finished:
        lines += ["", "Seconds per case, estimated -> taken: " + ", ".join(finished)]
    if result["skipped"]:
        lines += ["", "Skipped (time budget; run them with --sections / --depths / --variants): "
                  + ", ".join(what + (f" (estimated {cases[what]['estimate_s']:.0f} s)" if what in cases else "")
                              for what in result["skipped"])]
    if result["errors"]:
        lines += ["", "## Errors", ""] + [f"- {e}" for e in result["errors"]]
    return "\n".join(lines) + "\n"


def write(result, out):
    with open(os.path.join(out, "gpu_check.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out, "gpu_check.md"), "w") as f:
        f.write(markdown(result))


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        parser.error(f"--out {args.out!r}: cannot make that directory ({e.strerror}); pass another path")
    cuda = torch.cuda.is_available()
    profile = "tiny" if args.tiny or not cuda else "gpu"
    prof = dict(PROFILES[profile])
    for key in ("depths", "batch", "reps"):
        if getattr(args, key) is not None:
            prof[key] = getattr(args, key)
    device = single_gpu_device() if cuda and profile == "gpu" else torch.device("cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    autocast = torch.amp.autocast(device_type=device.type, dtype=dtype) if dtype != torch.float32 else nullcontext()
    compile_model = device.type == "cuda"
    budget = Budget(args.time_budget, prof["priors"])
    result = {"profile": profile, "args": vars(args), "sizes": prof, "env": env_info(device), "elapsed_s": {},
              "errors": [], "skipped": budget.skipped, "cases": budget.cases}
    # each section's result so far, after each of its cases (one for the last three)
    sections = {
        "attention": lambda: [attention_section(prof, device, dtype)],
        "model": lambda: model_section(prof, args.variants, device, dtype, autocast, compile_model, budget),
        "grads": lambda: grads_section(prof, args.variants, device, dtype, autocast,
                                       "inductor" if compile_model else "eager", budget),
        "train": lambda: train_section(prof, args.variants, args.train_steps, device, budget),
        "kernels": lambda: kernels_section(prof, args.variants, args.backends, device, dtype, autocast,
                                                   compile_model, budget),
        "pre": lambda: [pre_section(prof, args.variants, device, dtype, autocast, compile_model, budget)],
        "infer": lambda: [infer_section(prof, args.variants, device, dtype, autocast, budget)],
    }
    for name in SECTIONS[1:]:
        if name not in args.sections:
            continue
        print(f"gpu_check: {name} ...", flush=True)
        t0 = time.time()
        try:
            for partial in sections[name]():  # a section yields as each of its cases ends
                budget.close()
                result[name] = partial
                write(result, args.out)  # after every case: a run killed from outside keeps it
        except Exception as e:  # report and go on: the other sections still measure something
            result["errors"].append(f"{name}: {type(e).__name__}: {e}")
        budget.close()
        if name == "kernels":  # a case's failure is kept there, the other cases still run
            result["errors"] += [f"kernels: {e}" for e in result.get("kernels", {}).get("errors", [])]
        result["elapsed_s"][name] = time.time() - t0
        _free_memory(device)
        write(result, args.out)
    write(result, args.out)
    print(markdown(result))
    print(f"wrote {os.path.join(args.out, 'gpu_check.json')} and gpu_check.md")
    failed = result["errors"] or any(not r["ok"] for r in result.get("train", []))
    if failed:
        raise SystemExit("error: some checks failed; see the Errors section of gpu_check.md")


if __name__ == "__main__":
    run(main)
