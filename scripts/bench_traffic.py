"""scripts.bench --traffic: the bytes each stream-op backend moves per token and sub-layer at
D=12, forward and backward, for every HC variant beside the residual baseline, the floor, and
the step each predicts against the residual baseline's measured one (nanochat/planning/traffic.py)."""

import os
import sys

from nanochat import connections
from nanochat.common import text_table
from nanochat.connections.backends import auto

# The stream paths (backends/auto.PATHS): the fused seams in each design.
BACKENDS = ("torch", "liger", "fused", "fused-split")
# The predicted step against the residual baseline's, per variant (the KromHC paper's row and
# mHC's; every other HC variant 1.25x).
TARGETS = {"kromhc": 1.15, "mhc": 1.20}
OTHER_TARGET = 1.25


def interpreter_on():
    """Triton's interpreter runs the kernels being counted: it must be chosen before Triton
    is first imported."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        if "triton" in sys.modules:
            raise SystemExit("error: --traffic runs Triton's interpreter, which must be on before Triton is imported: "
                             "run with TRITON_INTERPRET=1")
        os.environ["TRITON_INTERPRET"] = "1"


def cases(args):
    """(variant, backend) pairs: the residual baseline, then each variant of --variants on
    each backend of --hc-kernels (default all three) that it runs on (SPEC backends) and with
    the pre-weights of --hc-pre where it takes them; a variant without stream kernels is
    counted on torch, one line saying what was left out, and one line names the single-state
    wirings left out."""
    backends = [k for k in args.hc_kernels if k in BACKENDS] if args.hc_kernels != ["torch"] else list(BACKENDS)
    out = [("residual", "torch")]
    single = [v for v in args.variants if v != "residual" and not connections.spec(v).streams]
    if single:
        print(f"skipped {', '.join(single)}: one state, no streams (SPEC state='single'): their traffic is the "
              "residual baseline's row plus their own reads, which --traffic does not count", flush=True)
    for variant in args.variants:
        if variant == "residual" or not connections.spec(variant).streams:
            continue
        takes = [k for k in backends if connections.runs_on(variant, auto.fields(k)["hc_kernels"])]
        if args.hc_pre[0] != "current" and not connections.takes_option(variant, "hc_pre"):
            print(f"skipped {variant}: it does not take hc_pre={args.hc_pre[0]!r} (SPEC options)", flush=True)
            continue
        if len(takes) < len(backends):
            print(f"skipped {variant} on {', '.join(k for k in backends if k not in takes)}: it runs on "
                  f"{', '.join(connections.spec(variant).backends)} (SPEC backends)", flush=True)
        out += [(variant, k) for k in takes]
    return out


# The wider trunks the predictions extend to: the paper's larger runs and nanochat's speedrun
# depths (traffic.depth_ratio).
DEPTHS = (20, 26)


def workload(variant, backend, pre):
    """kernel_aot's label of the run that launches a row's kernels (scripts.kernel_check --json):
    the variant, then " delayed" for delayed pre-weights and " split" for the split design."""
    return variant + (" delayed" if pre == "delayed" else "") + (" split" if backend == "fused-split" else "")


def in_flight_prediction(row, record, pre, step_ms, device, bandwidth, unit):
    """A row's step predicted with each Triton kernel's bytes moved at what its bytes in flight
    allow on `device` (record: measurements.kernels), and which kernels that slows or the
    record lacks."""
    from nanochat.planning import traffic
    allowed = traffic.allowed_bandwidths(record, workload(row["variant"], row["kernels"], pre), device)
    slower, unpriced = traffic.in_flight_extra(row["kernel_bytes"], allowed, bandwidth)
    return dict(predicted_in_flight=traffic.predicted_ratio(row["extra_c"] * unit + slower, step_ms, bandwidth),
                slower_bytes=slower, unpriced_kernels=unpriced,
                in_flight_limited_kernels=sorted(k for k in row["kernel_bytes"] if allowed.get(k, bandwidth) < bandwidth))


def run_traffic(args):
    interpreter_on()
    from nanochat import measurements
    from nanochat.planning import traffic
    step_ms, device = measurements.residual_step(depth=traffic.D12["n_layer"])
    bandwidth = traffic.bandwidth(device)
    record = measurements.kernels()
    if record is None:
        print("no docs/kernels.json (python -m scripts.kernel_check --json docs/kernels.json): the predictions "
              "leave out the bytes in flight", flush=True)
    unit = traffic.D12["C"] * traffic.ELEMENT
    rows = []
    for variant, backend in cases(args):
        path = dict(auto.fields(backend))
        kernels = path.pop("hc_kernels")
        found = traffic.connection_bytes(dict(hc=variant, hc_pre=args.hc_pre[0], **path) if variant != "residual"
                                         else dict(hc=variant), kernels)
        rows.append(dict(variant=variant, kernels=backend, fw_bytes=found["fw"], bw_bytes=found["bw"],
                         issued_bytes=found["issued"], total_c=(found["fw"] + found["bw"]) / unit,
                         reread_bytes=found["reread"], kernel_bytes=found["kernels"]))
        print(f"counted {variant} [{backend}]: {rows[-1]['total_c']:.1f} C", flush=True)
    residual = rows[0]["fw_bytes"] + rows[0]["bw_bytes"]
    for row in rows:
        row["extra_c"] = (row["fw_bytes"] + row["bw_bytes"] - residual) / unit
        row["predicted_vs_residual"] = traffic.predicted_ratio(row["extra_c"] * unit, step_ms, bandwidth)
        row["predicted_at_depth"] = {d: traffic.depth_ratio(row["predicted_vs_residual"], d) for d in DEPTHS}
        slower = 0.0
        if record is not None:
            row.update(in_flight_prediction(row, record, args.hc_pre[0], step_ms, device, bandwidth, unit))
            slower = row.pop("slower_bytes")
        # and with every second read of a program's own tile from memory, none from L2
        row["predicted_rereads_missing"] = traffic.predicted_ratio(row["extra_c"] * unit + slower + row["reread_bytes"],
                                                                   step_ms, bandwidth)
        row["target"] = None if row["variant"] == "residual" else TARGETS.get(row["variant"], OTHER_TARGET)
    return dict(rows=rows, residual_step_ms=step_ms, device=device, bandwidth=bandwidth, unit_bytes=unit,
                pre=args.hc_pre[0])


def print_traffic(result):
    unit = result["unit_bytes"]
    header = ["variant", "kernels", "fwd C", "bwd C", "total C", "extra C", "predicted x residual",
              "predicted, in flight", "re-read C", "predicted, re-reads missing", "target", "loads issued C",
              *(f"predicted at D={d}" for d in DEPTHS)]
    lines = [[r["variant"], r["kernels"], f"{r['fw_bytes'] / unit:.1f}", f"{r['bw_bytes'] / unit:.1f}",
              f"{r['total_c']:.1f}", f"{r['extra_c']:+.1f}", f"{r['predicted_vs_residual']:.3f}",
              f"{r['predicted_in_flight']:.3f}" if r.get("predicted_in_flight") else "-",
              f"{r['reread_bytes'] / unit:.1f}" if r.get("reread_bytes") else "-",
              f"{r['predicted_rereads_missing']:.3f}" if r.get("predicted_rereads_missing") else "-",
              "-" if r["target"] is None else f"<= {r['target']:.2f}",
              f"{r['issued_bytes'] / unit:.1f}" if r["issued_bytes"] else "-",
              *(f"{r['predicted_at_depth'][d]:.3f}" for d in DEPTHS)] for r in result["rows"]]
    print(f"\nbytes per token and sub-layer at D=12 (n=4, C=768, bf16 streams, {result['pre']} pre-weights), in units "
          f"of C = {unit} B; prediction: the residual step of docs/gpu_check.json ({result['residual_step_ms']:.1f} ms, "
          f"{result['device']}) plus the extra bytes at 80 % of {result['bandwidth'] / 1e12:.2f} TB/s")
    print(text_table(header, lines))
    print("floor (docs/kernels.md): residual about 8 C, an ideal fused HC layer about 29 C; 'loads issued' counts "
          "a tile read twice by a kernel twice (the distinct bytes assume the second read hits the cache); "
          "'in flight': each Triton kernel's bytes at the bandwidth its bytes in flight allow on this GPU "
          "(docs/kernels.json, nanochat/planning/in_flight.py), no more than 80 % of it; 're-read': the loads by which a "
          "program reads its own tile again, from L2 only while the resident programs' tiles fit it; 're-reads "
          "missing': in flight, and every re-read from memory")
    limited = sorted({k for r in result["rows"] for k in r.get("in_flight_limited_kernels", [])})
    if limited:
        print("kernels below the GPU's need of bytes in flight: " + "; ".join(k.replace("|", ": ") for k in limited))
    unpriced = sorted({k for r in result["rows"] for k in r.get("unpriced_kernels", [])})
    if unpriced:
        print("not in docs/kernels.json (priced at the GPU's bandwidth): " + "; ".join(unpriced))
