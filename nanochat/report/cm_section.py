"""The compute-multiplier study in words and pictures: the markdown that `scripts.compare`
writes to compare.md and the report's "Compute multiplier" section shows, and its two
figures (final bpb against FLOPs with the baseline's fitted curve; CM against compute, our
ladder-final reading beside nanochat's per-tag one).
"""

import math
from pathlib import Path

from matplotlib.figure import Figure

from nanochat import trunks
from nanochat.studies.isoflop import is_grid_run
from nanochat.report.cm import compare, pool, select_groups
from nanochat.report.figures import add_legend
from nanochat.report.format import MISSING, md_table
from nanochat.report.isoflop_section import isoflop_markdown

MEANINGS = [
    "- **CM (ladder-final)**, the default: the compute the baseline needs to reach the variant's final bpb, "
    "read off the baseline's finished runs over its depth ladder fitted as L(C) = a + b·C^-c, over the "
    "variant's own training FLOPs. > 1: the variant reaches that bpb with less compute. `?`: the anchor lies "
    "outside the bpb range of the baseline's finals (the fit is extrapolated).",
    "- **wall-clock CM**: the same in seconds of training steps (evaluations excluded); computed only when every "
    "run was timed on the same device name and count.",
    "- **nanochat CM (per tag)**: nanochat PR #800's reading, without its rounding: the baseline's val curve at "
    "the same depth in log-log segments, first crossing, `?` where the boundary segment is extended. It reads "
    "one run's trajectory, not finished runs: a better variant is always read off the baseline's last eval "
    "segment extended (its slope set by where the last evaluations fall in the warmdown), a worse one off "
    "mid-run points that lack the warmdown. On curves with a known 1.2x (LR-annealing loss model, "
    "tests/test_compute_multiplier.py) it read 1.16-1.38 where the ladder-final CM read within 1.5 %; it is "
    "here to set beside nanochat's numbers, not to decide.",
    "- Intervals: 95 %, the t-interval over seeds of ln CM; with one seed, a stated estimate (the delta method, "
    "σ(ln CM) ≈ σ_bpb / |dL/d ln C|). 'Exceeds the noise' is decided with Holm-Bonferroni over the variants "
    "compared (and, per depth, over every variant and depth).",
    "- FLOPs: `GPT.estimate_flops` per token x tokens: 6 per matmul weight, connection projections included; "
    "stream mixes and Sinkhorn not counted (`python -m scripts.hc_report --params` shows their share).",
]


def _cm(value, flag=False, spec=".3f"):
    return MISSING if value is None else format(value, spec) + ("?" if flag else "")


def _ci(interval):
    return "" if not interval else f" [{interval[0]:.3f}, {interval[1]:.3f}]"


def _seconds(value):
    return MISSING if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _flops(value):
    return MISSING if value is None else f"{value:.3g}"


def markdown(study, figures=()):
    """compare.md / the report section's text for one study."""
    r = study.result
    messages = r.get("messages", [])
    parts = ["\n".join(f"- `{m}`" for m in messages)] if messages else []
    law, base = study.law, r.get("baseline", {})
    if base.get("runs"):
        parts.append(f"Baseline: {len(base['runs'])} run(s) at depths {', '.join(map(str, base['depths']))}"
                     + (f"; finals fitted as {law.describe()}" if law is not None else "; no ladder fit")
                     + (f"; timed on {r['device']}" if r.get("device") else "") + ".")
    for name, v in r.get("variants", {}).items():
        header = ["Depth", "Seeds", "bpb", "FLOPs", "Train s", "CM (ladder-final)", "wall-clock CM", "nanochat CM"]
        rows = []
        for row in v["per_depth"]:
            rows.append([row["depth"], row["seeds"], f"{row['bpb']:.4f}", _flops(row["flops"]),
                         _seconds(row["seconds"]),
                         ("below the fit's floor" if row.get("below_floor") else
                          _cm(row["cm"], row["extrapolated"]) + _ci(row["cm_ci"])),
                         _cm(row["wall_cm"], row["extrapolated"]),
                         _cm(row["nanochat_cm"], row["nanochat_extrapolated"])])
        parts.append(f"#### {name}\n\n" + md_table(header, rows))
        notes = []
        if v["ladder_cm"] is not None:
            verdict = ""
            if "beyond_noise" in v:
                verdict = (" — beyond the noise" if v["beyond_noise"] else " — within the noise") + \
                    f" (Holm-Bonferroni over {r['holm']['ladder_family']} variant(s), 5 % family-wise)"
            notes.append(f"- Ladder-level CM: **{v['ladder_cm']:.3f}**{_ci(v['ladder_ci'])}"
                         + (f" ({v['ladder_ci_kind']})" if v["ladder_ci_kind"] else " (interval unknown)") + verdict
                         + (f"; wall-clock {v['wall_ladder_cm']:.3f}" if v.get("wall_ladder_cm") else "") + ".")
        kinds = sorted({row["cm_ci_kind"] for row in v["per_depth"] if row["cm_ci_kind"]})
        if kinds:
            notes.append("- Per-depth intervals: " + "; ".join(kinds) + ".")
        beyond = [str(row["depth"]) for row in v["per_depth"] if row.get("beyond_noise")]
        tested = [row for row in v["per_depth"] if "beyond_noise" in row]
        if tested:
            notes.append(f"- Depths whose CM exceeds the noise after Holm-Bonferroni over "
                         f"{r['holm']['per_depth_family']} readings: {', '.join(beyond) if beyond else 'none'}.")
        rebuilt = sorted({f for row in v["per_depth"] for f in row["reconstructed"]})
        if rebuilt:
            notes.append(f"- Reconstructed (runs from before these were recorded): {', '.join(rebuilt)}.")
        if notes:
            parts.append("\n".join(notes))
    parts += [f"![{Path(f).stem}]({Path(f).name})" for f in figures]
    return "\n\n".join(parts)


def plot_finals(study, path):
    """Final bpb against training FLOPs per variant (seed means), with the baseline's points and
    its fitted a + b·C^-c; open markers: extrapolated readings."""
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    base = [s for m in study.baseline.values() for s in m]
    ax.scatter([s.flops for s in base], [s.bpb for s in base], color="k", s=18, label="baseline runs", zorder=3)
    if study.law is not None and base:
        lo = min([s.flops for s in base] + [s.flops for m in study.variants.values() for c in m.values() for s in c])
        hi = max([s.flops for s in base] + [s.flops for m in study.variants.values() for c in m.values() for s in c])
        xs = [lo / 1.5 * (2.25 * hi / lo) ** (i / 99) for i in range(100)]  # the points, and a margin
        ax.plot(xs, [study.law.loss(x) for x in xs], color="k", lw=1, ls="--", label="baseline fit")
    for name, v in study.result.get("variants", {}).items():
        rows = v["per_depth"]
        line, = ax.plot([r["flops"] for r in rows], [r["bpb"] for r in rows], marker="o", ms=4, lw=1, label=name)
        mark_extrapolated(ax, rows, "bpb", line.get_color())
    return save(fig, ax, path, "training FLOPs", "final val bpb", "Final bpb against compute")


def plot_cm(study, path):
    """CM against the variant's FLOPs: the ladder-final reading (with its interval) and, dotted,
    nanochat's per-tag reading; a dashed line at 1; open markers extrapolated."""
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    ax.axhline(1.0, color="gray", ls="--", lw=1)
    for name, v in study.result.get("variants", {}).items():
        rows = [r for r in v["per_depth"] if r["cm"] is not None and math.isfinite(r["cm"])]
        if rows:
            line, = ax.plot([r["flops"] for r in rows], [r["cm"] for r in rows], marker="o", ms=4, lw=1.2,
                            label=f"{name} (ladder-final)")
            for r in rows:
                if r["cm_ci"]:
                    ax.plot([r["flops"]] * 2, r["cm_ci"], color=line.get_color(), lw=0.8)
            mark_extrapolated(ax, rows, "cm", line.get_color())
            color = line.get_color()
        else:
            color = None
        tagged = [r for r in v["per_depth"] if r["nanochat_cm"] is not None]
        if tagged:
            ax.plot([r["flops"] for r in tagged], [r["nanochat_cm"] for r in tagged], marker="s", ms=4, lw=1, ls=":",
                    color=color, mfc="white", label=f"{name} (nanochat per tag)")
    return save(fig, ax, path, "variant training FLOPs", "compute multiplier", "Compute multiplier against compute")


def mark_extrapolated(ax, rows, key, color):
    """An open marker over each row whose reading is extrapolated (a `?` in the tables)."""
    for r in rows:
        if r["extrapolated"]:
            ax.plot([r["flops"]], [r[key]], marker="o", ms=7, mfc="white", color=color)


def save(fig, ax, path, xlabel, ylabel, title):
    """Both figures' common end: log compute axis, labels, legend, the PNG."""
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    add_legend(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return Path(path)


def write_figures(study, out_dir, prefix="cm"):
    """The two figures into out_dir, each when it has something to draw."""
    rows = [row for v in study.result.get("variants", {}).values() for row in v["per_depth"]]
    out = Path(out_dir)
    figures = [plot_finals(study, out / f"{prefix}_finals.png")] if rows else []
    if any(row["cm"] is not None or row["nanochat_cm"] is not None for row in rows):
        figures.append(plot_cm(study, out / f"{prefix}_vs_compute.png"))
    return figures


def isoflop_subsection(runs, out_dir, figure="isoflop.png"):
    """The iso-FLOP frontier subsection of the report (nanochat/report/isoflop_section.py):
    markdown, or None when no run was trained to a FLOPs budget."""
    return isoflop_markdown(runs, out_dir, figure) or None


def cm_section(runs, out_dir, baseline_label="residual", trunk=trunks.DEFAULT):
    """The report's "Compute multiplier" section over all its runs, grouped by connection label;
    says what is missing when there are not enough runs for a reading. One section per trunk
    (the runs all of `trunk`): another trunk's figures carry its label in their names."""
    prefix = "cm" if trunk == trunks.DEFAULT else f"cm_{trunks.tag(trunk)}"
    messages = []
    # The iso-FLOP grid's runs (several per depth) have their own reading, the frontier below.
    spends = pool([r for r in runs if r.found and not is_grid_run(r)], messages)
    baseline, variants = select_groups(spends, baseline_label)
    depths = sorted({s.depth for s in baseline})
    need = []
    if len(depths) < 2:
        need.append(f"finished {baseline_label} runs at 2 or more depths for a ladder fit (found "
                    f"{len(depths)}{': ' + ', '.join(map(str, depths)) if depths else ''})")
    if not variants:
        need.append("finished runs of another connection")
    parts = []
    if need:
        parts.append("Not enough runs for the full study: it needs " + " and ".join(need) + ". "
                     f"`{'' if trunk == trunks.DEFAULT else f'TRUNK={trunk} '}bash speedrun.sh ladder` trains a "
                     "ladder; `python -m scripts.compare` reads any runs.")
    if baseline and variants:
        study = compare(spends, baseline, variants, messages, resamples=200)
        parts += [markdown(study, write_figures(study, out_dir, prefix)), "\n".join(MEANINGS)]
    extra = isoflop_subsection(runs, out_dir, "isoflop.png" if prefix == "cm" else f"{prefix}_isoflop.png")
    if extra:
        parts += ["### Iso-FLOP frontier", extra]
    return "\n\n".join(parts)
