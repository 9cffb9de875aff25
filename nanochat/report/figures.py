"""The report's figures in the KromHC paper's styles (PNG): loss and loss-gap curves (mean
over seeds with a band of one standard deviation), gradient norms, parameters per HC layer
against n."""

import math
import statistics

from matplotlib.figure import Figure

from nanochat import connections
from nanochat.report import paper
from nanochat.report.runs import method_label, seeds_of
from nanochat.report.tables import PARAMS_VS_N_CURVES, hc_params_per_layer, row_name

# EMA factor for the loss-gap and gradient-norm curves. The paper smooths with an EMA but
# does not give its factor; 0.98 (a ~50-step memory) keeps 7000-step curves readable.
EMA_BETA = 0.98


def ema(values, beta=EMA_BETA):
    """Bias-corrected exponential moving average and exponentially weighted variance."""
    mean = var = 0.0
    means, variances = [], []
    for t, x in enumerate(values, start=1):
        delta = x - mean
        mean += (1 - beta) * delta
        var = beta * (var + (1 - beta) * delta * delta)
        correction = 1 - beta ** t
        means.append(mean / correction)
        variances.append(var / correction)
    return means, variances


def series(run, kind, key):
    rows = [row for row in run.metrics.get(kind, []) if row.get(key) is not None]
    return [row["step"] for row in rows], [row[key] for row in rows]


def add_legend(ax):
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def save_figure(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def seed_band(curves):
    """Mean and sample std over seeds of several (steps, values) curves, at the steps all of
    them hold (std None for a single curve)."""
    common = set(curves[0][0]).intersection(*(set(steps) for steps, _ in curves[1:]))
    steps = sorted(common)
    at = [dict(zip(*c)) for c in curves]
    rows = [[a[s] for a in at] for s in steps]
    mean = [statistics.fmean(r) for r in rows]
    std = [statistics.stdev(r) for r in rows] if len(curves) > 1 else None
    return steps, mean, std


def _draw(ax, curves, label, **style):
    """One row's curve: the mean over its seeds, shaded ± one std when it has several."""
    curves = [c for c in curves if c[0]]
    if not curves:
        return
    steps, mean, std = seed_band(curves)
    line, = ax.plot(steps, mean, label=label, lw=1, **style)
    if std is not None:
        ax.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                        color=line.get_color(), alpha=0.2)


def _label(members):
    return f"{method_label(members[0])} ({row_name(members)})"


def plot_curves(rows, path, title):
    """Training loss (smoothed) and val BPB against steps, one line per row of seeds."""
    fig = Figure(figsize=(11, 4))
    ax_loss, ax_bpb = fig.subplots(1, 2)
    for members in rows:
        _draw(ax_loss, [series(r, "train", "loss_smooth") for r in members], _label(members))
        _draw(ax_bpb, [series(r, "val", "bpb") for r in members], _label(members), marker=".")
    for ax, ylabel in ((ax_loss, "train loss (smoothed)"), (ax_bpb, "val BPB")):
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    add_legend(ax_loss)
    fig.suptitle(title)
    return save_figure(fig, path)


def _gap(run, reference, kind, key, smooth):
    """run minus reference at the steps both logged. No interpolation: val BPB is sparse and
    curved, and a straight line between two evaluations would invent a gap."""
    steps, values = series(run, kind, key)
    ref_steps, ref_values = series(reference, kind, key)
    if smooth:
        values, ref_values = ema(values)[0], ema(ref_values)[0]
    ref = dict(zip(ref_steps, ref_values))
    common = [(s, v - ref[s]) for s, v in zip(steps, values) if s in ref]
    return [s for s, _ in common], [g for _, g in common]


def _pairs(members, reference):
    """(run, reference run) with the same seeds; each run against the first reference run when
    no seed is shared."""
    ref_by_seed = {seeds_of(r): r for r in reference}
    pairs = [(m, ref_by_seed[seeds_of(m)]) for m in members if seeds_of(m) in ref_by_seed]
    return pairs or [(m, reference[0]) for m in members]


def plot_gap(rows, reference, path, title):
    """Figure 4 style: EMA of the raw training loss minus the reference's, and the val BPB gap;
    over seeds, the mean of the paired gaps shaded ± one std."""
    fig = Figure(figsize=(11, 4))
    ax_loss, ax_bpb = fig.subplots(1, 2)
    for members in rows:
        if members[0] is reference[0]:
            continue
        pairs = _pairs(members, reference)
        _draw(ax_loss, [_gap(r, ref, "train", "loss", smooth=True) for r, ref in pairs], _label(members))
        _draw(ax_bpb, [_gap(r, ref, "val", "bpb", smooth=False) for r, ref in pairs], _label(members), marker=".")
    for ax, ylabel in ((ax_loss, "Δ train loss (EMA)"), (ax_bpb, "Δ val BPB")):
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_xlabel("step")
        ax.set_ylabel(f"{ylabel} vs {row_name(reference)}")
        ax.grid(alpha=0.3)
    add_legend(ax_loss)
    fig.suptitle(title)
    return save_figure(fig, path)


def plot_grad_norms(group, path, title):
    """Figure 8 style: raw total gradient norm and the HC parameters' gradient norm."""
    fig = Figure(figsize=(11, 4))
    ax_total, ax_hc = fig.subplots(1, 2)
    for r in group:
        ax_total.plot(*series(r, "train", "grad_norm"), label=f"{method_label(r)} ({r.name})", lw=0.7)
        ax_hc.plot(*series(r, "train", "hc_grad_norm"), label=f"{method_label(r)} ({r.name})", lw=0.7)
    for ax, ylabel in ((ax_total, "gradient norm (all parameters)"), (ax_hc, "gradient norm (connection parameters)")):
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    add_legend(ax_total)
    fig.suptitle(title)
    return save_figure(fig, path)


def plot_grad_tail(group, path, title):
    """Figure 5 style: EMA of the gradient norm with a band of one EMA standard deviation,
    over the last 2000/7000 of each run (the paper's zoom window, scaled to the run length)."""
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for r in group:
        steps, values = series(r, "train", "grad_norm")
        if not steps:
            continue
        mean, var = ema(values)
        start = steps[-1] * (1 - paper.GRAD_ZOOM_FRACTION)
        keep = [i for i, s in enumerate(steps) if s >= start]
        xs = [steps[i] for i in keep]
        lo = [mean[i] - math.sqrt(var[i]) for i in keep]
        hi = [mean[i] + math.sqrt(var[i]) for i in keep]
        line, = ax.plot(xs, [mean[i] for i in keep], label=f"{method_label(r)} ({r.name})", lw=1)
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("step")
    ax.set_ylabel("gradient norm (EMA)")
    ax.grid(alpha=0.3)
    add_legend(ax)
    ax.set_title(title)
    return save_figure(fig, path)


def plot_params_vs_n(path):
    """Figure 3: parameters per HC layer against n at C = 512, KromHC with 2x...x2 factors, and
    go-mHC beside the paper's curves."""
    C = paper.PARAMS_VS_N_C
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for variant in PARAMS_VS_N_CURVES:
        if variant == "kromhc":
            ns = [n for n in range(2, 17) if 2 ** int(math.log2(n)) == n]
            counts = [hc_params_per_layer(variant, n, C, factors=[paper.PARAMS_VS_N_FACTOR] * int(math.log2(n)))
                      for n in ns]
        else:
            ns = list(range(2, 17))
            counts = [hc_params_per_layer(variant, n, C) for n in ns]
        extra = "" if variant in paper.PARAMS_VS_N_METHODS else " (s=2, not in the paper)"
        ax.plot(ns, counts, marker="o", label=connections.label(variant) + extra)
    ax.set_yscale("log")
    ax.set_xlabel("residual streams n")
    ax.set_ylabel(f"parameters per HC layer (C={C})")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(paper.PARAMS_VS_N_FIGURE)
    return save_figure(fig, path)
