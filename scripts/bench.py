"""Benchmark of the connection path: step time, tokens/s and activation memory of every
connection variant, with ratios to `residual` and to `mhc` measured in the same run.

Two benchmarks, forward + backward each (no optimizer step):
  layer  one connection layer in isolation on the state its variant carries (streams X of
         shape (B, T, n, C); frac: m fractions (B, T, m, C/m); attnres: the partial block)
         around a cheap fixed branch F, so that the connection's own cost dominates:
           --branch linear  F(u) = u @ M, a frozen C x C matrix (the default)
           --branch scale   F(u) = u / 2 (no branch cost at all)
         The layer is the one the variant's SPEC names (bench_layer): sub-layer 0 (the
         attention slot) unless the wiring works at block ends, where it is the first block
         end (sub-layer 1; its label says "(layer 1)"). So `residual` includes its l_resid /
         l_x0 re-mix with x0, and attnres reads one source (the embedding): its reads grow
         with the blocks before them, which the model benchmark includes.
  model  the whole GPT (--depth, --width or --aspect-ratio, --head-dim, --seq-len,
         --batch, --vocab-size) on random tokens: loss, then backward.

Backends: --hc-kernels torch,liger benches every HC variant once per stream-op backend
(`hc_kernels`: the ops of nanochat/connections/backends/ops.py, or Liger-Kernel's fused Triton
kernels, CUDA only); `x torch` is each row's time over the same variant's torch row.
--hc-pre current,delayed does the same for DeepSeek-V4.1's delayed pre-weights (the layer
benchmark then hands the layer the pre-weights a previous layer would carry in).
Each variant runs the backends, pre-weights and --recompute settings its SPEC declares
(`backends`, `options`) and skips the others, one line each: the wirings whose layers are not
hc.HyperConnection have no Liger or fused kernels, and only some take recompute.

Compiled (--compile), each row also counts the kernels Inductor generated for its forward
and backward (torch._inductor.metrics.generated_kernel_count over the first step): what the
compiler made of the code, e.g. whether delayed pre-weights let it fuse the post mix of one
layer with the projection and pre mix of the next.

Timing: --warmup untimed steps per variant, then --reps timed steps, interleaved across
variants (each repetition times every variant once, in rotating order) so that load
changes on a shared machine hit all variants alike. Reported: the median, min, max and
the inter-quartile spread (IQR / median). tokens/s = B * T / median step time.

Memory, measured in one extra step after the timing:
  saved   bytes of the tensors autograd keeps for backward, counted exactly with
          torch.autograd.graph.saved_tensors_hooks (distinct storages; parameters and
          buffers excluded; inputs of a non-reentrant checkpoint are held outside the
          hooks and are not counted, but X, the only one here, is saved by the mixes
          anyway). Device-independent: the number that activation memory scales with.
  peak    CUDA only: torch.cuda.max_memory_allocated over one step minus what was
          allocated before it (activations, gradients, workspaces).

Traffic (--traffic; scripts/bench_traffic.py, nanochat/planning/traffic.py): instead of timing, the
bytes the connection moves per token and sub-layer at D=12 for the residual baseline and every
HC variant of --variants on every backend of --hc-kernels (default torch, liger and fused),
forward and backward, counted from the compiled partition and the kernels' own loads and
stores (Triton's interpreter, on the CPU, minutes), beside the floor and with the step each
predicts against the residual step of docs/gpu_check.json:
  python -m scripts.bench --traffic --variants kromhc mhc --out traffic.json

Profile (--profile K): after the timing, one more step of each case under torch.profiler and
its K kernels with the most self time (ops on the CPU), printed and in the JSON
("top_kernels"): which kernel a ratio comes from (scripts/bench_profile.py).

Inference (--bench infer, or prefill / decode alone; scripts/bench_infer.py): prefill
tokens/s at --prefill-lens (default 128 512 2048) and decode ms per token (--new-tokens 128
after a --prompt-len 512 prompt) at --infer-batches (default 1 8), through the KV cache as
evaluation and generation run it, in every mode of --modes (eager, compiled, and on CUDA
cudagraphs: decode steps replayed as CUDA graphs; default: eager,compiled on the CPU, all
three on CUDA), with x residual, x mhc and x eager in the same run.

On this CPU (eager fp32, one thread by default):
  python -m scripts.bench --bench model --depth 4 --head-dim 64 --seq-len 256 --batch 4 --vocab-size 4096
  python -m scripts.bench --bench layer --width 384 --seq-len 512 --batch 4
On a GPU (bf16 autocast by default on CUDA):
  python -m scripts.bench --device cuda --compile --depth 12 --seq-len 2048 --batch 16 --out bench_d12.json
  python -m scripts.bench --device cuda --compile --depth 12 --seq-len 2048 --batch 16 --recompute both
  python -m scripts.bench --device cuda --compile --bench layer --width 768 --seq-len 2048 --batch 32 \
      --variants residual hc_identity mhc kromhc --hc-kernels torch,liger
  python -m scripts.bench --bench infer --device cuda --depth 12 --head-dim 128 --vocab-size 32768 --out infer.json
  python -m scripts.bench --bench infer --depth 4 --aspect-ratio 32 --head-dim 32 --prefill-lens 128 512 \
      --infer-batches 1 --reps 3          # the CPU demo's size
"""

import argparse
import itertools
import json
import math
import os
import platform
import statistics
import sys
import time
from contextlib import nullcontext

import torch
from torch import nn

from nanochat import connections
from nanochat.cli import int_at_least, nonneg_int, positive_even_int, positive_int, run
from nanochat.common import device_name, single_gpu_device, synchronize, text_table
from nanochat.connections.hc_layer import PRES
from nanochat.connections.backends import auto
from nanochat.connections.backends.ops import KERNELS
from nanochat.gpt import COMPILE_MODES, GPTConfig, build_model, compiled
from scripts import bench_infer, bench_profile, bench_traffic

VARIANTS = tuple(connections.VARIANTS)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
INFER_BENCHES = ("infer", "prefill", "decode")


def build_parser():
    p = argparse.ArgumentParser(prog="python -m scripts.bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    variants = list(connections.VARIANTS)  # the registry as it is now (a test may register one)
    p.add_argument("--variants", nargs="+", default=variants, choices=variants, metavar="V",
                   help=f"variants to compare (default: all: {' '.join(variants)})")
    p.add_argument("--streams", type=positive_int(), default=4, help="n for the hyper-connection variants (default 4)")
    p.add_argument("--factors", type=int_at_least(2), nargs="*", default=[],
                   help="kromhc factors (default: prime factors of n)")
    p.add_argument("--sk-iters", type=positive_int(), default=20, help="mhc Sinkhorn-Knopp iterations (default 20)")
    p.add_argument("--recompute", choices=("off", "on", "both"), default="off",
                   help="hc_recompute for the HC variants; 'both' benches each variant with and without")
    p.add_argument("--hc-kernels", type=choice_list((*KERNELS, "fused-split")), default=["torch"],
                   metavar="K[,K]",
                   help="stream-op backends to compare, e.g. torch,liger,fused,fused-split (default torch; fused-split: "
                        "the fused seams' split design; liger and fused need CUDA and pip install -e '.[kernels]')")
    p.add_argument("--hc-pre", type=choice_list(PRES), default=["current"], metavar="P[,P]",
                   help="pre-weights of the HC variants to compare: current (the paper), delayed (DeepSeek-V4.1), "
                        "or current,delayed (default current)")
    p.add_argument("--bench", choices=("layer", "model", "both", *INFER_BENCHES), default="both",
                   help="layer, model or both (training: forward + backward); infer, prefill or decode (inference)")
    p.add_argument("--prefill-lens", type=positive_int(), nargs="+", default=[128, 512, 2048], metavar="T",
                   help="inference: prompt lengths of the prefill benchmark (default 128 512 2048)")
    p.add_argument("--infer-batches", type=positive_int(), nargs="+", default=[1, 8], metavar="B",
                   help="inference: rows per prefill / decode step (default 1 8)")
    p.add_argument("--prompt-len", type=positive_int(), default=512, help="decode: prompt length (default 512)")
    p.add_argument("--new-tokens", type=positive_int(), default=128, help="decode: tokens generated (default 128)")
    p.add_argument("--modes", type=choice_list(bench_infer.MODES), default=None, metavar="M[,M]",
                   help="inference: eager, compiled, cudagraphs (CUDA); default eager,compiled on the CPU, all "
                        "three on CUDA")
    p.add_argument("--branch", choices=("linear", "scale"), default="linear", help="the layer benchmark's F")
    p.add_argument("--batch", type=positive_int(), default=4, help="B, sequences per step (default 4)")
    p.add_argument("--seq-len", type=positive_int(), default=256, help="T (default 256)")
    p.add_argument("--width", type=positive_int({0: "from the depth"}), default=0,
                   help="C (0 = the default: depth * aspect ratio rounded up to the head dim)")
    p.add_argument("--depth", type=positive_int(), default=4, help="model depth (transformer blocks; default 4)")
    p.add_argument("--aspect-ratio", type=positive_int(), default=64,
                   help="width = depth * aspect ratio (default 64, nanochat)")
    p.add_argument("--head-dim", type=positive_even_int(), default=64,
                   help="attention head dim, even (default 64; nanochat uses 128)")
    p.add_argument("--vocab-size", type=positive_int(), default=4096, help="model vocabulary (default 4096)")
    p.add_argument("--window-pattern", default="SSSL")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--dtype", choices=("auto", *DTYPES), default="auto",
                   help="compute dtype: auto = bf16 (autocast) on CUDA, fp32 on CPU")
    p.add_argument("--compile", action="store_true", help="torch.compile (dynamic=False) the layer / model")
    p.add_argument("--compile-mode", choices=COMPILE_MODES, default="whole",
                   help="with --compile, the model whole (one graph) or regionally (each repeated sub-layer, "
                        "connection layer and the head once: GPT.compile_regions); default whole")
    p.add_argument("--threads", type=positive_int(), default=1,
                   help="torch.set_num_threads (default 1: steadier CPU timings on a shared machine)")
    p.add_argument("--warmup", type=nonneg_int(), default=3, help="untimed steps per variant (default 3)")
    p.add_argument("--reps", type=positive_int(), default=10, help="timed steps per variant (default 10)")
    p.add_argument("--traffic", action="store_true",
                   help="count the bytes per token and sub-layer at D=12 of each variant and backend instead of "
                        "timing (Triton's interpreter; minutes)")
    p.add_argument("--profile", type=nonneg_int(), default=0, metavar="K",
                   help="after the timing, profile one more step of each case and list its K kernels (ops on "
                        "the CPU) with the most self time (default 0: no profile)")
    p.add_argument("--seed", type=nonneg_int(), default=0)
    p.add_argument("--out", "--json", dest="out", default="", help="write the results as JSON to this path")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.width and args.width % args.head_dim:
        p.error(f"--width {args.width} is not a multiple of --head-dim {args.head_dim}")
    return args


def choice_list(choices):
    """An argparse type: a comma-separated list of some of `choices`, without repeats."""
    def parse(text):
        names = [k.strip() for k in text.split(",") if k.strip()]
        if not names or any(k not in choices for k in names):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(choices)}, got {text!r}")
        return list(dict.fromkeys(names))
    return parse


# ----- building what is timed -----

def model_width(args):
    if args.width:
        return args.width
    return math.ceil(args.depth * args.aspect_ratio / args.head_dim) * args.head_dim


def declared_settings(variant, recomputes, backends, pres):
    """(recompute settings, backends, pre-weights) of the asked ones that the variant takes
    (SPEC options and backends); one line naming what it skips, if anything. Without any
    asked backend it runs on torch, without any asked setting it runs without it."""
    spec = connections.spec(variant)
    takes = dict(recompute=[r for r in recomputes if not r or "hc_recompute" in spec.options],
                 backends=[k for k in backends if spec.takes(k)],
                 pres=[p for p in pres if p == "current" or "hc_pre" in spec.options])
    asked = dict(recompute=recomputes, backends=backends, pres=pres)
    flags = dict(recompute="--recompute on", backends="--hc-kernels", pres="--hc-pre")
    skipped = [flags[what] + ("" if what == "recompute" else " " + ",".join(v for v in asked[what]
                                                                          if v not in takes[what]))
               for what in asked if len(takes[what]) < len(asked[what])]
    if skipped:
        print(f"bench: {variant} skips {'; '.join(skipped)} (not in its SPEC options / backends)", flush=True)
    return takes["recompute"] or [False], takes["backends"] or ["torch"], takes["pres"] or ["current"]


def has_streams(variant):
    """n streams (SPEC state "streams"): --streams and --recompute apply."""
    return connections.spec(variant).streams


def make_config(args, variant, recompute, n_layer, kernels="torch", pre="current"):
    C = model_width(args)
    hc = has_streams(variant)
    own = getattr(connections.VARIANTS[variant], "FIELDS", {})
    try:
        return GPTConfig(sequence_len=args.seq_len, vocab_size=args.vocab_size, n_layer=n_layer,
                         n_head=C // args.head_dim, n_kv_head=C // args.head_dim, n_embd=C,
                         window_pattern=args.window_pattern, hc=variant, hc_streams=args.streams if hc else 0,
                         hc_factors=list(args.factors) if "hc_factors" in own else [],
                         hc_sk_iters=args.sk_iters, hc_recompute=recompute and hc, hc_pre=pre,
                         **(auto.fields(kernels) if kernels in auto.PATHS else dict(hc_kernels=kernels)))
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


class LayerUnderTest(nn.Module):
    """One connection layer around the fixed branch; forward(X, x0, carry) -> X_next (carry:
    what a previous layer hands this one, None for the paper's layers)."""

    def __init__(self, layer, C, branch):
        super().__init__()
        self.layer = layer
        if branch == "linear":
            self.branch = nn.Linear(C, C, bias=False)
            nn.init.normal_(self.branch.weight, std=C ** -0.5)
            self.branch.weight.requires_grad_(False)
        else:
            self.branch = lambda u: 0.5 * u

    def forward(self, X, x0, carry):
        return self.layer.step(X, self.branch, x0, carry)[0]


def layer_case(args, variant, recompute, device, dtype, autocast, kernels="torch", pre="current"):
    """dict(module, step, forward, tokens, n, layer) for one layer on random streams, its
    stream ops on the `kernels` backend (hc_kernels): the layer its SPEC names (bench_layer,
    sub-layer 0 unless the wiring works at block ends), called alone."""
    cfg = make_config(args, variant, recompute, n_layer=1, kernels=kernels, pre=pre)
    conn = connections.build(cfg)
    conn.to(device)
    conn.init_weights()
    C, B, T, n = cfg.n_embd, args.batch, args.seq_len, cfg.hc_streams
    index = connections.spec(variant).bench_layer
    module = LayerUnderTest(conn.layers[index], C, args.branch).to(device)
    g = torch.Generator(device=device).manual_seed(args.seed)
    x0 = torch.randn(B, T, C, device=device, generator=g).to(dtype)
    X = conn.expand(x0)
    X = (X + 0.1 * torch.randn(X.shape, device=device, generator=g).to(dtype)).detach().requires_grad_()
    grad_out = torch.randn(X.shape, device=device, generator=g).to(dtype)
    # Delayed pre-weights: the fp32 (B, T, n) read weights the previous layer computed.
    carry = torch.rand(B, T, n, device=device, generator=g) if pre == "delayed" else None
    run = torch.compile(module, dynamic=False) if args.compile else module

    def forward():
        with autocast:
            return run(X, x0, carry)

    def step():
        module.zero_grad(set_to_none=True)
        X.grad = None
        forward().backward(grad_out)

    return dict(module=module, step=step, forward=forward, tokens=B * T, n=n, inputs=(X, x0, carry), grad_out=grad_out,
                layer=index)


def model_case(args, variant, recompute, device, dtype, autocast, kernels="torch", pre="current"):
    cfg = make_config(args, variant, recompute, n_layer=args.depth, kernels=kernels, pre=pre)
    torch.manual_seed(args.seed)
    model = build_model(cfg, device)
    if dtype == torch.bfloat16:
        model.cast_embeddings(dtype)  # as build_model does on CUDA: bf16 x0, as in training there
    g = torch.Generator(device=device).manual_seed(args.seed)
    idx = torch.randint(0, args.vocab_size, (args.batch, args.seq_len), device=device, generator=g)
    targets = torch.randint(0, args.vocab_size, (args.batch, args.seq_len), device=device, generator=g)
    run = compiled(model, args.compile_mode) if args.compile else model

    def forward():
        with autocast:
            return run(idx, targets)

    def step():
        model.zero_grad(set_to_none=True)
        forward().backward()

    return dict(module=model, step=step, forward=forward, tokens=args.batch * args.seq_len, n=cfg.hc_streams)


# ----- measuring -----

def allow_compiled_cases(count):
    """Each compiled case is one more graph of the same forward code; past dynamo's
    recompile limit (8 per code object) the others would silently run eagerly."""
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 2 * count)


def time_interleaved(cases, warmup, reps, device):
    """{label: [seconds per step]}: each repetition runs every case once, starting from a
    different case each time."""
    for case in cases.values():
        for _ in range(warmup):
            case["step"]()
    times = {label: [] for label in cases}
    labels = list(cases)
    for r in range(reps):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            synchronize(device)
            t0 = time.perf_counter()
            cases[label]["step"]()
            synchronize(device)
            times[label].append(time.perf_counter() - t0)
    return times


def saved_tensor_bytes(module, forward):
    """Bytes of distinct storages autograd saves for backward during one forward,
    parameters and buffers excluded."""
    state = {t.untyped_storage().data_ptr() for t in (*module.parameters(), *module.buffers())}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in state:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    del out
    return sum(seen.values())


def peak_step_mib(module, step, device):
    if device.type != "cuda":
        return None
    module.zero_grad(set_to_none=True)
    synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def summarize(seconds, tokens):
    ms = sorted(1e3 * s for s in seconds)
    median = statistics.median(ms)
    q1, q3 = (statistics.quantiles(ms, n=4)[i] for i in (0, 2)) if len(ms) > 1 else (ms[0], ms[0])
    return {"times_ms": ms, "median_ms": median, "min_ms": ms[0], "max_ms": ms[-1],
            "spread_pct": 100 * (q3 - q1) / median, "tokens_per_s": tokens / (median / 1e3)}


def add_ratios(rows):
    """time_vs_residual / time_vs_mhc / time_vs_torch: median step time over that of
    `residual` (same benchmark), of `mhc` (same benchmark, recompute setting and backend)
    and of the same variant on the torch backend; None when absent."""
    for row in rows:
        peers = [r for r in rows if r["bench"] == row["bench"]]
        base = next((r for r in peers if r["variant"] == "residual"), None)
        mhc = next((r for r in peers if r["variant"] == "mhc" and r["recompute"] == row["recompute"]
                    and r["kernels"] == row["kernels"] and r["pre"] == row["pre"]), None)
        torch_row = next((r for r in peers if r["variant"] == row["variant"] and r["recompute"] == row["recompute"]
                          and r["kernels"] == "torch" and r["pre"] == row["pre"]), None)
        row["time_vs_residual"] = row["median_ms"] / base["median_ms"] if base else None
        row["time_vs_mhc"] = row["median_ms"] / mhc["median_ms"] if mhc else None
        row["time_vs_torch"] = row["median_ms"] / torch_row["median_ms"] if torch_row else None
        if row["bench"] == "model":
            # What each connection layer adds to activation memory over the baseline.
            row["extra_saved_bytes_per_layer"] = ((row["saved_bytes"] - base["saved_bytes"]) / row["hc_layers"]
                                                  if base else None)
    return rows


def compiled_kernels(case):
    """(kernels Inductor generates for the case's first step, that step's seconds: the
    compile, mostly)."""
    from torch._inductor import metrics
    metrics.reset()
    t0 = time.perf_counter()
    case["step"]()
    return metrics.generated_kernel_count, time.perf_counter() - t0


def run_bench(args, bench, device, dtype, autocast):
    """Rows of one benchmark ("layer" or "model"): every variant of args.variants, with and
    without recompute as args.recompute says, on every backend of args.hc_kernels and with
    every pre-weight setting of args.hc_pre (residual has no stream ops: torch, current only)."""
    build = layer_case if bench == "layer" else model_case
    settings = [False, True] if args.recompute == "both" else [args.recompute == "on"]
    cases = {}
    for variant in args.variants:
        recomputes, backends, pres = declared_settings(variant, settings, args.hc_kernels, args.hc_pre)
        for recompute, kernels, pre in itertools.product(recomputes, backends, pres):
            label = (variant + (" +recompute" if recompute else "") + (" +delayed pre" if pre == "delayed" else "")
                     + (f" [{kernels}]" if kernels != "torch" else "")
                     + (f" (layer {connections.spec(variant).bench_layer})"
                        if bench == "layer" and connections.spec(variant).bench_layer else ""))
            cases[label] = dict(variant=variant, recompute=recompute, kernels=kernels, pre=pre,
                                **build(args, variant, recompute, device, dtype, autocast, kernels, pre))
    if args.compile:
        allow_compiled_cases(len(cases))
        for case in cases.values():
            case["compiled_kernels"], case["compile_s"] = compiled_kernels(case)
    times = time_interleaved(cases, args.warmup, args.reps, device)
    rows = []
    for label, case in cases.items():
        rows.append({"bench": bench, "label": label, "variant": case["variant"], "recompute": case["recompute"],
                     "kernels": case["kernels"], "pre": case["pre"], "compiled_kernels": case.get("compiled_kernels"),
                     "compile_s": case.get("compile_s"), "compile_mode": args.compile_mode if args.compile else None,
                     "n": case["n"], "hc_layers": 2 * args.depth if bench == "model" else 1,
                     **summarize(times[label], case["tokens"]),
                     "saved_bytes": saved_tensor_bytes(case["module"], case["forward"]),
                     "peak_step_mib": peak_step_mib(case["module"], case["step"], device)})
        if args.profile:
            rows[-1]["top_kernels"] = bench_profile.top_ops(case["step"], device, args.profile, synchronize)
    for row in rows:
        row["saved_bytes_per_token"] = row["saved_bytes"] / cases[row["label"]]["tokens"]
    return add_ratios(rows)


# ----- output -----

def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_table(rows, bench, args):
    C = model_width(args)
    if bench == "layer":
        branch = "F(u) = u @ M (frozen C x C)" if args.branch == "linear" else "F(u) = u / 2"
        title = f"one connection layer, B={args.batch} T={args.seq_len} C={C}, {branch}"
        mem_head = "saved MiB"
    else:
        title = f"whole model, depth {args.depth} C={C} head_dim={args.head_dim} T={args.seq_len} B={args.batch} " \
                f"vocab={args.vocab_size}"
        mem_head = "saved MiB (extra/HC layer)"
    header = ["variant", "n", "median ms", "spread", "min-max ms", "tok/s", "x residual", "x mhc", "x torch", mem_head,
              "peak MiB"] + (["kernels", "first step s"] if args.compile else [])
    lines = []
    for r in rows:
        saved = f"{r['saved_bytes'] / 2**20:.2f}"
        if bench == "model" and r["extra_saved_bytes_per_layer"] is not None:
            saved += f" ({r['extra_saved_bytes_per_layer'] / 2**20:+.2f})"
        lines.append([r["label"], str(r["n"]), f"{r['median_ms']:.2f}", f"{r['spread_pct']:.1f}%",
                      f"{r['min_ms']:.1f}-{r['max_ms']:.1f}", f"{r['tokens_per_s']:,.0f}",
                      fmt(r["time_vs_residual"], ".3f"), fmt(r["time_vs_mhc"], ".3f"), fmt(r["time_vs_torch"], ".3f"),
                      saved,
                      fmt(r["peak_step_mib"], ".1f")] + ([fmt(r["compiled_kernels"], "d"), fmt(r["compile_s"], ".1f")]
                                                         if args.compile else []))
    print(f"\n{title}")
    print(text_table(header, lines))


def resolve_device(args):
    name = args.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no CUDA device is visible; use --device cpu")
    triton_backends = [k for k in args.hc_kernels if k in ("liger", "fused")]
    if name != "cuda" and triton_backends and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit(f"error: --hc-kernels {triton_backends[0]} runs Triton kernels, which need --device cuda "
                         "(TRITON_INTERPRET=1 runs them on CPU, for checking only)")
    device = single_gpu_device() if name == "cuda" else torch.device(name)
    dtype = DTYPES[args.dtype] if args.dtype != "auto" else (torch.bfloat16 if name == "cuda" else torch.float32)
    return device, dtype


def main(argv=None):
    args = parse_args(argv)
    if args.traffic:
        result = bench_traffic.run_traffic(args)
        bench_traffic.print_traffic(result)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"args": vars(args), "env": {"torch": torch.__version__}, **result}, f, indent=1)
            print(f"wrote {args.out}")
        return result["rows"]
    torch.set_num_threads(args.threads)
    device, dtype = resolve_device(args)
    autocast = torch.amp.autocast(device_type=device.type, dtype=dtype) if dtype != torch.float32 else nullcontext()
    if args.bench in INFER_BENCHES:
        kinds = ["prefill", "decode"] if args.bench == "infer" else [args.bench]
        results = bench_infer.run_infer(args, kinds, device, dtype, autocast, sys.modules[__name__])
        bench_infer.print_infer(results, args, model_width(args), fmt)
        how = ",".join(args.modes or bench_infer.default_modes(device))
    else:
        benches = ["layer", "model"] if args.bench == "both" else [args.bench]
        results = []
        for bench in benches:
            rows = run_bench(args, bench, device, dtype, autocast)
            print_table(rows, bench, args)
            bench_profile.print_profile(rows)
            results += rows
        how = "compiled" if args.compile else "eager"
    print(f"\n{device.type} {str(dtype).replace('torch.', '')}, {how}, "
          f"{args.threads} thread(s), {args.reps} reps after {args.warmup} warm-up; spread = IQR / median")
    if args.out:
        env = {"torch": torch.__version__, "device": device.type, "dtype": str(dtype).replace("torch.", ""),
               "compile": args.compile if args.bench not in INFER_BENCHES else how, "threads": args.threads,
               "platform": platform.platform(),
               "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
               "device_name": device_name(device)}
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "env": env, "width": model_width(args), "results": results}, f, indent=1)
        print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    run(main)
