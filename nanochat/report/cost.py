"""The report's "Cost" section: what each connection costs, per depth and relative to the
residual baseline, in training (from the runs' summary.json: median step time and peak
memory) and in inference (from an inference benchmark's JSON, `scripts.bench --bench infer
--out FILE`: prefill and decode time, eager and compiled), beside the published anchors with
their settings. Inference rows the benchmark did not measure say so, with the command that
measures them."""

import json
from pathlib import Path

from nanochat import connections
from nanochat.report.format import MISSING, fmt, md_table
from nanochat.report.runs import method_label, method_order
from nanochat.studies.stats import geomean

# The command that measures the inference rows at a depth (the CPU demo's width rule; on a
# GPU the paper's head dim and vocabulary).
INFER_COMMAND = ("python -m scripts.bench --bench infer --depth {depth} --out infer_bench.json  "
                 "(CPU demo size: add --aspect-ratio 32 --head-dim 32; on a GPU: --device cuda --head-dim 128 "
                 "--vocab-size 32768), then python -m scripts.report ... --infer-bench infer_bench.json")

# Published costs of hyper-connections (setting, what, value as a multiple of the residual
# baseline), with their sources. None of them is our configuration: they bound what fused
# kernels and overlap buy at scale.
ANCHORS = [
    ("DeepSeek mHC (arXiv 2512.24880)", "n = 4, 27B MoE, fused kernels, selective recompute, DualPipe overlap",
     "training time", "1.067x"),
    ("xHC authors", "fused mHC kernels, no pipeline overlap", "training time", "~1.15x"),
    ("xHC authors", "fused mHC kernels", "prefill time", "1.114x (+11.4 %)"),
    ("Marin (marin-community/marin #7409)", "identity-HC, 4 streams, MoE on TPU, two-layer rematerialisation, "
     "d512 / d768", "step time", "1.07x / 1.10x"),
    ("unfused compiled mHC harness", "85M parameters, pure PyTorch under torch.compile", "throughput / peak memory",
     "0.49x / 1.31x"),
    ("vLLM (vllm-project/vllm #56503)", "eager DeepSeek serving trace on MI355X", "share of GPU time in mHC's "
     "Sinkhorn", "37.5 %"),
]


def load_infer_bench(path):
    """The rows of a `scripts.bench --bench infer` JSON with its settings, or None when no
    path is given. A file that is not such a benchmark raises ValueError."""
    if path is None:
        return None
    data = json.loads(Path(path).read_text())
    rows = [r for r in data.get("results", []) if r.get("bench") in ("prefill", "decode")]
    if not rows:
        raise ValueError(f"{path} holds no prefill or decode rows: write it with "
                         "python -m scripts.bench --bench infer --out FILE")
    return {"path": str(path), "depth": data["args"]["depth"], "width": data.get("width"), "env": data.get("env", {}),
            "args": data["args"], "rows": rows}


def infer_ratio(bench, variant, kind, mode):
    """Geometric mean over the measured shapes of the variant's time over residual's."""
    return geomean(r["time_vs_residual"] for r in bench["rows"]
                   if r["variant"] == variant and r["bench"] == kind and r["mode"] == mode and not r.get("fallback"))


def _ratio(value, reference):
    return value / reference if value is not None and reference else None


def training_mode(run):
    compiled = run.config.get("compile")
    if compiled is None:
        compiled = (run.summary or {}).get("device") == "cuda"
    return "compiled" if compiled else "eager"


def cost_table(runs, depth, bench):
    """Per variant at `depth`: training step time and peak memory over the residual run's,
    prefill and decode time over residual's in the inference benchmark (eager and compiled)."""
    group = sorted((r for r in runs if r.depth == depth and r.summary and not r.options), key=method_order)
    seen, picked = set(), []
    for r in group:  # one run per variant (the first seed)
        if r.variant not in seen:
            seen.add(r.variant)
            picked.append(r)
    variants = [r.variant for r in picked]
    bench = bench if bench and bench["depth"] == depth else None
    if bench:
        variants += [v for v in dict.fromkeys(r["variant"] for r in bench["rows"]) if v not in variants]
    if not variants:
        return None
    order = list(connections.VARIANTS)
    variants.sort(key=lambda v: order.index(v) if v in order else len(order))
    base = next((r for r in picked if r.variant == "residual"), None)
    modes = [m for m in ("eager", "compiled", "cudagraphs") if bench and any(r["mode"] == m for r in bench["rows"])]
    header = ["Method", "train mode", "step time", "peak mem"]
    header += [f"{kind} {mode}" for kind in ("prefill", "decode") for mode in modes or ["eager", "compiled"]]
    rows = []
    for variant in variants:
        run = next((r for r in picked if r.variant == variant), None)
        cells = [method_label(run) if run else connections.label(variant),
                 training_mode(run) if run else MISSING]
        for key in ("step_time", "peak_mem_mib"):
            value = _ratio(run.summary.get(key), base.summary.get(key)) if run and base else None
            cells.append(fmt(value, ".2f") + ("x" if value is not None else ""))
        for kind in ("prefill", "decode"):
            for mode in modes or ["eager", "compiled"]:
                value = infer_ratio(bench, variant, kind, mode) if bench else None
                cells.append(fmt(value, ".2f") + ("x" if value is not None else ""))
        rows.append(cells)
    notes = ["Each cell is the variant's cost over the residual baseline's (1.00x = no extra cost). Training: the "
             "median step time and the peak memory of the run (summary.json; on a CPU the peak is the process's "
             "resident high-water mark, weights and data included), eager or compiled as the run trained."]
    if bench:
        a, env = bench["args"], bench["env"]
        notes.append(f"Inference: `{Path(bench['path']).name}` ({env.get('device', '?')} {env.get('dtype', '')}, "
                     f"torch {env.get('torch', '?')}, random weights of the same shape: depth {a['depth']}, "
                     f"C={bench['width']}, vocab {a['vocab_size']}): prefill of T in {a['prefill_lens']}, decode of "
                     f"{a['new_tokens']} tokens after {a['prompt_len']}, B in {a['infer_batches']}; the geometric "
                     "mean over these shapes of the variant's time over residual's in the same run and mode.")
        missing = [m for m in ("eager", "compiled") if m not in modes]
        if missing:
            notes.append(f"Not measured: {' and '.join(missing)} inference (`--modes {','.join(missing)}`): "
                         + INFER_COMMAND.format(depth=depth))
    else:
        notes.append("Inference not measured at this depth: " + INFER_COMMAND.format(depth=depth))
    return md_table(header, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes)


def anchors_table():
    return ("Published costs (settings differ from ours; fused kernels and pipeline overlap are what close the gap "
            "at scale):\n\n" + md_table(("Source", "Setting", "Measure", "HC over baseline"), ANCHORS))


def cost_section(runs, depths, bench):
    """The section's markdown: one table per depth with runs or an inference benchmark, then
    the published anchors."""
    parts = []
    for depth in sorted(set(depths) | ({bench["depth"]} if bench else set())):
        table = cost_table(runs, depth, bench)
        if table:
            parts += [f"### D={depth}", table]
    if not parts:
        parts.append("No run with a summary and no inference benchmark: nothing measured. "
                     + INFER_COMMAND.format(depth="DEPTH"))
    parts.append(anchors_table())
    return "\n\n".join(parts)
