"""The iso-FLOP frontier from the grid's runs (`speedrun.sh isoflop`): per budget and connection
label the compute-optimal size (nanochat/studies/isoflop.py's parabola in ln params), the frontier over
budgets, and the CM along it against the baseline's frontier. `scripts.isoflop` prints and writes
it; the report shows it as a subsection of "Compute multiplier" when grid runs exist
(`isoflop_markdown`, through cm_section's hook).

Runs enter by config: trained to a FLOPs budget (target_flops > 0, no explicit steps). Labels are
compare's connection labels (nanochat/report/compute.py), so that the ladder and the grid name a
connection alike.
"""

import math
from pathlib import Path

from nanochat.studies import isoflop
from nanochat.studies.compute_multiplier import LadderError
from nanochat.report.compute import connection_label
from nanochat.report.format import fmt, md_table

BASELINE_LABEL = "residual"


def study(runs, baseline_label=BASELINE_LABEL):
    """(result as JSON-ready dict, frontier {label: [Optimum]}, baseline law or None). The dict:
    {"baseline": label, "baseline_fit": text or None, "messages": [...], "variants": {label:
    {"frontier": [{"budget", "params", "bpb", "sizes", "fitted", "extrapolated", "parabola",
    "points": [[params, bpb, depth], ...]}], "frontier_cm": [{"budget", "bpb", "cm",
    "extrapolated"}] or None for the baseline}}}."""
    points, skipped = isoflop.grid_points(runs, connection_label)
    messages = [f"warning: {name} skipped: unfinished, or no final val bpb or params in summary.json"
                for name in skipped]
    front = isoflop.frontier(points, messages)
    law, cms = None, {}
    if baseline_label in front:
        try:
            law, _ = isoflop.frontier_cm(front[baseline_label], front[baseline_label])
            for label, opts in front.items():
                if label != baseline_label:
                    cms[label] = isoflop.frontier_cm(front[baseline_label], opts)[1]
        except LadderError as e:
            messages.append(f"warning: no CM along the frontier: the baseline's frontier: {e}")
    elif front:
        messages.append(f"warning: no CM along the frontier: no {baseline_label} runs in the grid")
    variants = {}
    for label, opts in front.items():
        variants[label] = {
            "frontier": [{"budget": o.budget, "params": o.params, "bpb": o.bpb, "sizes": o.sizes, "fitted": o.fitted,
                          "extrapolated": o.extrapolated,
                          "parabola": [o.parabola.p2, o.parabola.p1, o.parabola.p0],
                          "points": [list(p) for p in points[(label, o.budget)]]} for o in opts],
            "frontier_cm": None if label == baseline_label or label not in cms else
            [{"budget": c.budget, "bpb": c.bpb, "cm": c.cm, "extrapolated": c.extrapolated} for c in cms[label]],
        }
    result = {"baseline": baseline_label, "baseline_fit": law.describe() if law else None,
              "messages": messages, "variants": variants}
    return result, front, law


def nearest_depth(result_row):
    """The trained depth whose size is closest (in ln params) to the optimum."""
    return min(result_row["points"], key=lambda p: abs(math.log(p[0] / result_row["params"])))[2]


def flagged(value, flag, spec=".3f"):
    return fmt(value, spec) + ("?" if flag and value is not None else "")


def rows(result):
    """[label, budget, sizes, N* (M), nearest depth, L*, CM] per variant and budget."""
    out = []
    for label, v in result["variants"].items():
        cms = {c["budget"]: c for c in v["frontier_cm"] or []}
        for o in v["frontier"]:
            c = cms.get(o["budget"])
            out.append([label, f"{o['budget']:.3g}", o["sizes"], flagged(o["params"] / 1e6, o["extrapolated"], ".1f"),
                        nearest_depth(o), flagged(o["bpb"], not o["fitted"], ".4f"),
                        "baseline" if label == result["baseline"] else
                        (flagged(c["cm"], c["extrapolated"]) if c else fmt(None))])
    return out


HEADER = ["connection", "budget (FLOPs)", "sizes", "N* (M params)", "nearest D", "L* (val bpb)", "CM on the frontier"]
NOTE = ("Per budget, final val bpb against ln(scaling params) fitted with a parabola: its vertex is the "
        "compute-optimal size N* and its value L* (Chinchilla's approach 2). CM on the frontier: the baseline's "
        "frontier fitted as L(C) = a + b·C^-c, a variant's L* read against it, over the budget. `?`: N* outside "
        "the sizes trained, L* where the fit has no minimum (the best run stands in), or a CM read outside the "
        "baseline frontier's bpb range.")


def write_figure(result, law, path):
    """Two panels: final bpb against params per budget (colour) and connection (marker) with
    the fitted parabolas and their vertices; L* against budget per connection with the
    baseline's fitted frontier."""
    import numpy as np
    from matplotlib.figure import Figure
    fig = Figure(figsize=(11, 4.2))
    ax, bx = fig.subplots(1, 2)
    budgets = sorted({o["budget"] for v in result["variants"].values() for o in v["frontier"]})
    colors = {b: f"C{i % 10}" for i, b in enumerate(budgets)}
    markers = "osD^v<>p*h"
    for k, (label, v) in enumerate(result["variants"].items()):
        marker = markers[k % len(markers)]
        for o in v["frontier"]:
            params = [p[0] for p in o["points"]]
            ax.scatter(params, [p[1] for p in o["points"]], color=colors[o["budget"]], marker=marker, s=18,
                       label=f"{label}, {o['budget']:.3g}")
            x = np.linspace(math.log(min(params)), math.log(max(params)), 60)
            p2, p1, p0 = o["parabola"]
            ax.plot(np.exp(x), p2 * x * x + p1 * x + p0, color=colors[o["budget"]], lw=0.8)
            ax.scatter([o["params"]], [o["bpb"]], color=colors[o["budget"]], marker="x", s=40)
        frontier = v["frontier"]
        bx.plot([o["budget"] for o in frontier], [o["bpb"] for o in frontier], marker=marker, label=label)
    if law is not None:
        grid = np.geomspace(budgets[0], budgets[-1], 100)
        bx.plot(grid, law.loss(grid), "k--", lw=1, label=f"{result['baseline']} fit")
    ax.set(xscale="log", xlabel="scaling params", ylabel="final val bpb", title="iso-FLOP curves (x: vertex)")
    bx.set(xscale="log", xlabel="training FLOPs (budget)", ylabel="L*: val bpb at N*", title="compute-optimal frontier")
    for a in (ax, bx):
        a.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def isoflop_markdown(runs, out_dir, figure="isoflop.png"):
    """The report's iso-FLOP subsection (cm_section's hook puts it under "Compute multiplier"):
    the frontier table, its note and figure (out_dir/figure), and what was skipped; "" when no
    run was trained to a FLOPs budget."""
    result, front, law = study(runs)
    parts = []
    if front:
        parts += [md_table(HEADER, rows(result)), NOTE]
        if result["baseline_fit"]:
            parts.append(f"Baseline frontier: {result['baseline_fit']}.")
        parts.append(f"![iso-FLOP frontier]({write_figure(result, law, Path(out_dir) / figure).name})")
    parts += [f"- {m}" for m in result["messages"]]
    return "\n\n".join(parts)
