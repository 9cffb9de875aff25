"""The report's stream-collapse section: does each run use its n streams, and does H_res mix
them? A table of the measures of connections/collapse.py at the end of training, and two
figures: the measures against depth (each layer's input, from the final diagnostics) and
against training step (their mean over layers, logged every --hc-stats-every steps), so the
early "seeding" stage that 2026 studies describe is visible or not."""

from matplotlib.figure import Figure

from nanochat.report.figures import add_legend, save_figure
from nanochat.report.format import MISSING, fmt, md_table
from nanochat.connections.collapse import MEASURE_VERSION
from nanochat.report.runs import collapse_stats, method_label, method_order, single_state, stale_collapse_line

# (key in the diagnostics, axis label): the two measures the figures show.
FIGURE_MEASURES = (("effective_streams", "effective streams (distinct directions)"),
                   ("offdiag_mass", "H_res off-diagonal mass 1 - tr/n"))


def hc_runs(runs, depth=None):
    """The found runs with several streams (the residual baseline and Attention Residuals keep one
    state: nothing to collapse)."""
    return sorted((r for r in runs if r.found and r.variant is not None and not single_state(r.variant)
                   and (depth is None or r.depth == depth)), key=lambda r: (r.depth or 0, method_order(r)))


def collapse_table(runs):
    rows, sources = [], []
    for r in hc_runs(runs):
        stats, source = collapse_stats(r)
        if not stats or "effective_streams_mean" not in stats:
            rows.append((method_label(r), r.name, fmt(r.depth, "d"), fmt(r.n, "d"), *[MISSING] * 9))
            continue
        if source != "hc_stats.json":
            sources.append(r.name)
        final = stats.get("final") or {}
        dominant = MISSING if not final else f"{final['dominant_share']:.2f} (stream {final['dominant_stream']})"
        rows.append((method_label(r), r.name, fmt(r.depth, "d"), fmt(stats.get("n"), "d"),
                     fmt(stats["effective_streams_mean"], ".2f"), fmt(final.get("effective_streams"), ".2f"), dominant,
                     fmt(final.get("stream_cosine"), ".2f"), fmt(stats.get("read_effective_mean"), ".2f"),
                     fmt(stats.get("write_effective_mean"), ".2f"), fmt(stats.get("offdiag_mass_mean"), ".3f"),
                     fmt(stats.get("perm_distance_mean"), ".3f"), source))
    if not rows:
        return None
    header = ("Method", "Run", "D", "n", "eff. streams", "final", "dominant (final)", "cosine (final)", "reads",
              "writes", "off-diag", "to perm.", "source")
    notes = ["Means over the tokens of one validation batch (nanochat/connections/collapse.py). eff. streams: how many "
             "distinct directions the streams span at each layer's input (the participation ratio of the squared "
             "singular values of each token's n x C streams: n copies or scaled copies count as 1, n orthogonal "
             "streams of equal energy as n), in [1, n], averaged over layers; final: the state before the streams "
             "are folded; dominant: the largest energy share and the stream that holds it most often (1/n for "
             "copies); cosine: between two streams (1 for copies of the embedding).",
             "reads / writes: the effective number of coefficients in H_pre / H_post (how evenly a layer weights "
             "the streams, whatever they hold); off-diag: 1 − tr(H_res)/n "
             "(0 for the identity, 1 for a permutation that moves every stream); to perm.: 1 − the best "
             "permutation's mean entry (0 when H_res is a permutation); both averaged over layers.",
             "The residual baseline and Block AttnRes keep one state and are not listed; Frac-Connections' "
             "streams are the m fractions of one hidden state, not copies. Near-identity H_res after training and one "
             "dominant stream are what 2026 studies report (arXiv 2606.03483, 2603.20896); these numbers say "
             "whether these runs show it."]
    if sources:
        notes.append("From the last training-time diagnostic (no hc_stats.json): " + ", ".join(sources) + ".")
    stale = stale_collapse_line(hc_runs(runs))
    if stale:
        notes.append(stale)
    return md_table(header, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes)


def depth_curve(run, key):
    """(layer indices, values) of one measure at the end of training (the final diagnostics)."""
    layers = (collapse_stats(run)[0] or {}).get("layers", [])
    points = [(layer["index"], layer[key]) for layer in layers if layer.get(key) is not None]
    return tuple(map(list, zip(*points))) if points else ([], [])


def step_curve(run, key):
    """(steps, values) of one measure's mean over layers along training, from the training log's
    records of this version of the measures (collapse.MEASURE_VERSION) alone."""
    rows = [row for row in run.metrics.get("hc", []) if row.get("collapse_version", 1) == MEASURE_VERSION
            and row.get(f"{key}_mean") is not None]
    return [row["step"] for row in rows], [row[f"{key}_mean"] for row in rows]


def plot_collapse(runs, curve, xlabel, ylabel_suffix, path, title):
    """Each measure of FIGURE_MEASURES in its own panel, one line per run: curve(run, key)
    gives the (x, y) points (depth_curve or step_curve)."""
    fig = Figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    for ax, (key, ylabel) in zip(axes, FIGURE_MEASURES):
        for r in runs:
            xs, ys = curve(r, key)
            if xs:
                ax.plot(xs, ys, marker=".", lw=1, label=f"{method_label(r)} ({r.name})")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel + ylabel_suffix)
        ax.grid(alpha=0.3)
    add_legend(axes[0])
    fig.suptitle(title)
    return save_figure(fig, path)


def collapse_section(runs, out):
    """The section's markdown: the table, and the figures it writes into `out`."""
    table = collapse_table(runs)
    if table is None:
        return "No run with several streams."
    parts = [table]
    for depth in sorted({r.depth for r in hc_runs(runs) if r.depth is not None}):
        group = hc_runs(runs, depth)
        if any(depth_curve(r, "effective_streams")[0] for r in group):
            path = plot_collapse(group, depth_curve, "HC layer (attention and MLP alternate)", "",
                                 out / f"collapse_depth_d{depth}.png",
                                 f"D={depth}: stream collapse against depth, end of training")
            parts.append(f"![collapse against depth D={depth}]({path.name})")
        if any(step_curve(r, "effective_streams")[0] for r in group):
            path = plot_collapse(group, step_curve, "step", ", mean over layers",
                                 out / f"collapse_steps_d{depth}.png", f"D={depth}: stream collapse during training")
            parts.append(f"![collapse during training D={depth}]({path.name})")
    return "\n\n".join(parts)
