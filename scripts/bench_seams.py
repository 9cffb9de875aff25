"""Time the fused seam kernels (`--hc-kernels fused`) under other tilings on one GPU: tokens
per program, warps, and channels per chunk, forward and backward, with or without TMA's loads
(nanochat/connections/backends/fused.py).

    python -m scripts.bench_seams [--variants kromhc mhc] [--tilings 32,4,128,64 32,4,128,64,tma ...]
                                  [--out DIR] [--model]

Each variant's workload is a two-block trunk at D=12 shapes (n = 4, C = 768, 32 x 2048 tokens;
its entry, three middle and exit seams: what one layer of the model runs, five times), with
identity sub-layers and random projection weights. Per tiling: forward and forward + backward
ms (CUDA events, median), and the largest relative difference of the output and of every
gradient from the first tiling's (a tiling must compute the same function). Every kernel of
every tiling is compiled before the timing, in parallel threads through Triton's own cache
(nanochat/planning/kernel_aot.py specializes each launch as the JIT will), so the sweep costs about one
compile. The trunk on the torch backend is timed beside it as the reference. Writes
DIR/bench_seams.json after every tiling; --model then measures the whole model at D=12 with the
fastest tiling (scripts.gpu_check's kernels section, fused only), into the same DIR.

Without CUDA it runs at toy sizes under TRITON_INTERPRET=1: a check that it works, not a
measurement.
"""

import argparse
import concurrent.futures
import contextlib
import json
import os
import statistics
import time

import torch

from nanochat.cli import nonneg_int, positive_int, run
from nanochat.common import single_gpu_device

# After the kernels' own (the reference), the likeliest first: a seam program is a chain of
# dependent chunk steps, so more tokens or channels per chunk and more programs per SM
OTHER_TILINGS = ["64,4,64,32", "16,8,128,64", "32,4,128,64", "64,8,128,64", "16,4,128,64", "32,8,256,128",
                 "16,2,64,32", "32,8,128,64", "16,4,256,128"]
SIZES = {"gpu": dict(B=32, T=2048, C=768, n=4), "tiny": dict(B=2, T=24, C=40, n=4)}


TMA = "tma"


def tiling(text):
    """(BLOCK_T, WARPS, CHUNK_FWD, CHUNK_BWD), and TMA last where the kernels are to load the
    streams through TMA (fused.TMA: on sm_90 and later)."""
    parts = text.split(",")
    tail = (TMA,) if parts[-1] == TMA else ()
    try:
        values = tuple(int(v) for v in parts[:len(parts) - len(tail)])
    except ValueError:
        values = ()
    if len(values) != 4 or any(v < 1 or v & (v - 1) for v in values):
        raise argparse.ArgumentTypeError("expected four powers of two, BLOCK_T,WARPS,CHUNK_FWD,CHUNK_BWD, and "
                                         f"optionally ,{TMA}; got {text!r}")
    return values + tail


def default_tilings():
    """The kernels' own tiling, then the same through TMA, then the others."""
    from nanochat.connections.backends import fused
    own = fused.tiling()
    return [own, own + (TMA,)] + [t for t in map(tiling, OTHER_TILINGS) if t != own]


def apply(t):
    """Compile and launch the seam kernels at tiling `t` from now on."""
    from nanochat.connections.backends import fused
    fused.set_tiling(*t[:4])
    fused.set_tma(TMA in t)


@contextlib.contextmanager
def tilings_restored():
    from nanochat.connections.backends import fused
    start, tma = fused.tiling(), fused.TMA
    try:
        yield
    finally:
        fused.set_tiling(*start)
        fused.set_tma(tma)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m scripts.bench_seams", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--variants", nargs="+", default=["kromhc", "mhc"], help="HC variants (default kromhc mhc)")
    p.add_argument("--tilings", nargs="+", type=tiling, default=default_tilings(),
                   metavar="T,W,F,B[,tma]", help="tokens per program, warps, forward and backward chunk, and tma "
                   "to load the streams through TMA (sm_90); the first is the reference (default: the kernels' own, "
                   "without and with TMA, then eight others)")
    p.add_argument("--reps", type=positive_int(), default=20, help="timed calls per case (default 20)")
    p.add_argument("--warmup", type=nonneg_int(), default=2,
                   help="untimed calls per case after its first, the check's (default 2)")
    p.add_argument("--out", default=".", help="directory for bench_seams.json (default .)")
    p.add_argument("--sweep-budget", type=positive_int(), default=600,
                   help="seconds after which no further tiling starts (default 600)")
    p.add_argument("--model", action="store_true", help="then the whole model at D=12 with the fastest tiling")
    p.add_argument("--time-budget", type=positive_int(), default=240,
                   help="seconds for the whole-model run after the sweep (scripts.gpu_check --time-budget)")
    return p


def config(variant, size, kernels):
    from nanochat.gpt import GPTConfig
    C = size["C"]
    return GPTConfig(sequence_len=size["T"], vocab_size=64, n_layer=2, n_head=1, n_kv_head=1, n_embd=C,
                     hc_streams=size["n"], hc_kernels=kernels, hc=variant)


def trunk(variant, size, kernels, device):
    """The connection trunk with random projection weights (the same for every tiling)."""
    from nanochat import connections
    conn = connections.build(config(variant, size, kernels)).to(device)
    conn.init_weights()
    g = torch.Generator(device="cpu").manual_seed(0)
    with torch.no_grad():
        for p in conn.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return conn


def inputs(size, device, dtype):
    g = torch.Generator(device="cpu").manual_seed(1)
    x0 = torch.randn(size["B"], size["T"], size["C"], generator=g).to(device, dtype).requires_grad_(True)
    grad = torch.randn(size["B"], size["T"], size["C"], generator=g).to(device, dtype)
    return x0, grad


def step(conn, x0, grad, backward):
    out = conn(x0, [lambda u: u] * len(conn.layers))
    if backward:
        out.backward(grad)
    return out


def results(conn, x0, grad):
    """The output and every gradient, in fp64 on the CPU."""
    conn.zero_grad(set_to_none=True)
    x0.grad = None
    out = step(conn, x0, grad, True)
    named = {"out": out, "x0": x0.grad, **{n: p.grad for n, p in conn.named_parameters() if p.grad is not None}}
    return {k: v.detach().double().cpu() for k, v in named.items()}


def rel_gap(a, b):
    return max(((a[k] - b[k]).norm() / b[k].norm().clamp_min(1e-30)).item() for k in b)


def time_ms(fn, warmup, reps, device):
    """Median ms of `fn` (events on CUDA, the clock elsewhere) after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def precompile(variants, tilings, device):
    """Compile every seam kernel of every (variant, tiling) into Triton's cache, in threads:
    the launches are recorded at D=12 on the CPU and specialized as the JIT will (kernel_aot),
    so the timed calls find their binaries there. Returns the seconds it took."""
    import triton

    from nanochat.planning import kernel_aot
    from nanochat.connections.backends import fused
    cc = torch.cuda.get_device_capability(device)
    cc = cc[0] * 10 + cc[1]
    t0 = time.time()
    launches = []
    with tilings_restored():
        for t in tilings:
            apply(t)
            for variant in variants:
                with kernel_aot.recording(variant, "fused", launches, fused.TMA):
                    kernel_aot.run_fused(dict(hc=variant))
    distinct = {kernel_aot.launch_key(launch): launch for launch in launches}

    def build(launch):
        target, src, options, _ = kernel_aot.specialize(launch, cc)
        triton.compile(src, target=target, options=options.__dict__)

    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(build, distinct.values()))
    return time.time() - t0, len(distinct)


def sweep(args, device, size, out, t0):
    """Every tiling on every variant, tilings outer (a budget cut leaves whole tilings)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    data, first = {v: inputs(size, device, dtype) for v in args.variants}, {}
    for variant, (x0, grad) in data.items():
        reference = trunk(variant, size, "torch", device)
        out["torch_backend"][variant] = {
            "forward_ms": time_ms(lambda: step(reference, x0, grad, False), args.warmup, args.reps, device),
            "step_ms": time_ms(lambda: step(reference, x0, grad, True), args.warmup, args.reps, device)}
    reference = None
    with tilings_restored():
        for t in args.tilings:
            if time.time() - t0 > args.sweep_budget:
                out["skipped"].append(list(t))
                continue
            apply(t)
            for variant, (x0, grad) in data.items():
                row = {"variant": variant, "tiling": list(t)}
                try:
                    conn = trunk(variant, size, "fused", device)
                    got = results(conn, x0, grad)
                    first.setdefault(variant, got)
                    row.update(max_rel_gap=rel_gap(got, first[variant]),
                               forward_ms=time_ms(lambda: step(conn, x0, grad, False), args.warmup, args.reps, device),
                               step_ms=time_ms(lambda: step(conn, x0, grad, True), args.warmup, args.reps, device))
                    row["x_torch"] = row["step_ms"] / out["torch_backend"][variant]["step_ms"]
                except Exception as e:  # a tiling that does not compile or run: listed, the sweep goes on
                    row["error"] = f"{type(e).__name__}: {e}"[:500]
                conn = None
                out["rows"].append(row)
                write(out, args.out)


def fastest(rows, variants, reference_gap=2e-2):
    """The tiling with the least summed step time over the variants, among those that ran for
    every variant within `reference_gap` of the first tiling's numbers (bf16 rounding)."""
    totals = {}
    for r in rows:
        if "error" not in r and r["max_rel_gap"] <= reference_gap:
            totals.setdefault(tuple(r["tiling"]), {})[r["variant"]] = r["step_ms"]
    whole = {t: sum(v.values()) for t, v in totals.items() if set(v) == set(variants)}
    return min(whole, key=whole.get) if whole else None


def write(out, directory):
    with open(os.path.join(directory, "bench_seams.json"), "w") as f:
        json.dump(out, f, indent=1)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    from nanochat import connections
    unknown = [v for v in args.variants if v not in connections.VARIANTS or not connections.runs_on(v, "fused")]
    if unknown:
        parser.error(f"--variants: {', '.join(unknown)} has no fused seams; choose among "
                     + " ".join(v for v in connections.VARIANTS if connections.runs_on(v, "fused")))
    os.makedirs(args.out, exist_ok=True)
    cuda = torch.cuda.is_available()
    if not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("no CUDA device: run on a GPU, or with TRITON_INTERPRET=1 for a toy-size check")
    # TF32 for the projection's products, as in training: the kernels' dots follow that setting
    device = single_gpu_device() if cuda else torch.device("cpu")
    size = SIZES["gpu" if cuda else "tiny"]
    out = {"size": size, "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "tilings": [list(t) for t in args.tilings], "torch_backend": {}, "rows": [], "skipped": []}
    t0 = time.time()
    if cuda:
        try:
            out["precompile_s"], out["kernels"] = precompile(args.variants, args.tilings, device)
        except Exception as e:  # the timed calls then compile on first use
            out["precompile_error"] = f"{type(e).__name__}: {e}"[:500]
    sweep(args, device, size, out, t0)
    out["fastest"] = fastest(out["rows"], args.variants)
    write(out, args.out)
    for r in out["rows"]:
        print(r["variant"], r["tiling"], r.get("error") or
              f"fwd {r['forward_ms']:.2f} ms, fwd+bwd {r['step_ms']:.2f} ms, x torch {r['x_torch']:.3f}, "
              f"gap {r['max_rel_gap']:.1e}")
    print("torch backend:", out["torch_backend"], "fastest:", out["fastest"])
    if args.model and out["fastest"] and cuda:
        from scripts import gpu_check
        apply(out["fastest"])
        gpu_check.main(["--out", args.out, "--sections", "kernels", "--backends", "fused", "--variants", "residual",
                        *args.variants, "--time-budget", str(args.time_budget)])


if __name__ == "__main__":
    run(main)
