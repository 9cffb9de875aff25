"""Compile every Triton kernel of `--hc-kernels fused` and `--hc-kernels liger` ahead of time for
sm_80 and sm_90 at D=12 shapes, without a GPU, and check their resources (nanochat/planning/kernel_aot.py):
no register spills, shared memory within each target's limit, and for every kernel that moves
the streams at least two waves of an H100's SMs and the bytes in flight per SM that an H100
(sm_90) or an A100 (sm_80) needs at its bandwidth (nanochat/planning/in_flight.py). Per target the
table shows programs per SM and KiB in flight per SM, and for sm_90 the ratio to an H200's
need.

python -m scripts.kernel_check                 # the table; exit 1 when a check fails
python -m scripts.kernel_check --markdown FILE # also the table as Markdown (docs/kernels.md)
python -m scripts.kernel_check --json FILE     # also every kernel's resources and the bandwidth
                                               # its bytes in flight allow per GPU
                                               # (docs/kernels.json, read by bench --traffic)

Needs Triton (pip install -e '.[kernels]'), a few GB of memory (the D=12 tensors the
launches are recorded with) and a few minutes; not TRITON_INTERPRET, which replaces the
kernels with Python.
"""

import argparse
import os
import time

from nanochat.cli import run
from nanochat.common import text_table


def build_parser():
    p = argparse.ArgumentParser(prog="python -m scripts.kernel_check", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--markdown", default="", help="also write the table as Markdown to this path")
    p.add_argument("--json", default="", help="also write every kernel's resources and estimate as JSON to this path")
    p.add_argument("--backends", nargs="+", choices=("fused", "liger"), default=["fused", "liger"],
                   help="whose kernels (default both; liger needs Liger-Kernel installed)")
    p.add_argument("--targets", nargs="+", type=int, choices=(80, 90), default=[80, 90],
                   help="compute capabilities to compile for (default 80 90: A100; H100 and H200)")
    return p


def rows(compiled, targets):
    from nanochat.planning import in_flight
    from nanochat.planning import kernel_aot
    out = []
    for k in compiled:
        cells = [f"{k.backend} {k.name}", k.what, ", ".join(k.workloads) if len(k.workloads) <= 3
                 else f"{len(k.workloads)} workloads", f"{k.programs:,}"]
        for cc in targets:
            if cc not in k.resources:  # not launched there (TMA's loads: sm_90 only)
                cells += [""] * 5
                continue
            r, e = k.resources[cc], kernel_aot.estimate(k, cc)
            cells += [str(r["regs"]), str(r["spill"]), f"{r['shared'] / 1024:.1f}", str(e.programs_per_sm),
                      f"{e.per_sm / 1024:.1f}"]
        if 90 in targets:
            cells.append(f"{kernel_aot.estimate(k, 90, in_flight.H200).ratio:.2f}" if 90 in k.resources else "")
        out.append(cells)
    return out


def header(targets):
    per_target = ("regs", "spill B", "smem KiB", "progs/SM", "KiB in flight/SM")
    return (["kernel", "seam", "launched by", "programs"] + [f"sm_{cc} {h}" for cc in targets for h in per_target]
            + (["x H200 need"] if 90 in targets else []))


def markdown(head, body):
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body]) + "\n"


def main(argv=None):
    args = build_parser().parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("error: TRITON_INTERPRET=1 replaces the kernels with Python; unset it to compile them")
    from nanochat.planning import kernel_aot
    from nanochat.connections.backends import liger
    if "liger" in args.backends and not liger.AVAILABLE:
        raise SystemExit("error: Liger-Kernel is not installed: pip install -e '.[kernels]', or --backends fused")
    t0 = time.perf_counter()
    compiled = kernel_aot.compile_all(kernel_aot.record_all(args.backends), args.targets)
    head, body = header(args.targets), rows(compiled, args.targets)
    print(text_table(head, body))
    n = kernel_aot.D12
    import triton
    print(f"\n{len(compiled)} kernels at D=12 (n={n['n']}, C={n['C']}, {n['B']} x {n['T']} tokens), compiled by Triton "
          f"{triton.__version__} for {', '.join(f'sm_{cc}' for cc in args.targets)} in {time.perf_counter() - t0:.0f} s")
    from nanochat.planning import in_flight
    needs = ", ".join(f"{g.name} {in_flight.need_per_sm(g) / 1024:.1f} KiB"
                      for g in (in_flight.A100, in_flight.H100, in_flight.H200))
    print(f"bytes in flight per SM needed at peak (bandwidth x {in_flight.LATENCY_S * 1e9:.0f} ns / SMs): {needs}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(head, body))
        print(f"wrote {args.markdown}")
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump(dict(triton=triton.__version__, kernels=[kernel_aot.record(k) for k in compiled]), f, indent=1)
            f.write("\n")
        print(f"wrote {args.json}")
    problems = kernel_aot.failures(compiled)
    for line in problems:
        print(f"FAIL: {line}")
    if problems:
        raise SystemExit(1)
    print("no spills, shared memory within limits, every stream kernel at least "
          f"{kernel_aot.MIN_PROGRAMS} programs and its need of bytes in flight")
    return compiled


if __name__ == "__main__":
    run(main)
