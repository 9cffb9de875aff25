"""The report's "Beyond the paper" section: runs of what the field adopted after the KromHC
paper (the HC options, and variants outside its family), each beside the run it changes:
the same variant, depth and n in the paper's configuration (for an option), or the
variant's natural baseline (for a new variant). The paper has no numbers for any of them."""

from nanochat import connections
from nanochat.report.format import MISSING, NOT_APPLICABLE, fmt, fmt_seeds, md_table, signed
from nanochat.report.runs import (beyond_paper, collapse_stats, core_score, has_h_res, method_label, method_order,
                                  params, stale_collapse_line, train_loss, val_bpb)
from nanochat.report.tables import residual_reference, row_members, row_name, row_runs, row_status, same_factors

OPTION_SOURCES = [
    "**LSS** (`--hc-expand lss`): Learned Stream Scaling (arXiv 2606.03483): each stream starts as a learned "
    "(n, C) scale of the embedding, init xavier-uniform + `--hc-lss-init` (0.6) as the source; it trains with the "
    "other connection parameters at `--hc-lr` without weight decay, where the source decays it by 0.1.",
    "**learned head** (`--hc-reduce learned`): DeepSeek-V4's `hc_head`, sigmoid weights from the final streams "
    "instead of their sum, fp32; our init (W = 0, b = 0) starts it exactly as the sum after the final norm.",
    "**delayed pre** (`--hc-pre delayed`): DeepSeek-V4.1's single-pass mHC: layer j's projection yields the "
    "pre-weights layer j+1 applies, layer 0 reads stream 0, the last layer's fold the final state; no parameter "
    "added; the pre bias's +1 sits at the home stream of the layer that applies it (our choice).",
]
# What the report says of a variant beyond the paper where its SPEC line (label, flag, source,
# description) is not enough: the choices its source leaves open.
VARIANT_SOURCES = {
    "go_mhc": "**go-mHC** (`--hc go_mhc`, `--hc-go-s 2`; arXiv 2604.02309): H_res = (1/s) block sums of Q∘Q for the Cayley "
    "transform Q = (I − A)(I + A)⁻¹ of a skew-symmetric A (n·s × n·s, fp32 inverse), exactly doubly stochastic. "
    "Ours: A comes from the HC projection x'W (the source publishes no LM wiring), and H_res starts e⁻⁸ from I "
    "like mHC's, not at I, which is a stationary point of the map (zero gradient to A).",
    "frac": "**Frac-Connections** (`--hc frac`, `--hc-streams` = m fractions; arXiv 2503.14125): the dynamic form "
    "(per-fraction RMS norms, tanh, rescales s_α and s_β, static B, Y, A); the state is the hidden state split into "
    "m fractions, and the model starts exactly as the residual one. The paper decays its dynamic weights; here no "
    "connection parameter is decayed.",
    "attnres": "**Block AttnRes** (`--hc attnres`, `--attnres-block-size`; arXiv 2603.15031), a baseline, not an HC variant: "
    "each sub-layer reads a softmax mix of the embedding and the block sums through a zero-initialised "
    "pseudo-query with RMS-normed keys, and a final read gives the output; default blocks of ⌈2D/8⌉ sub-layers "
    "(3 at D=12, the paper's ~8 blocks), 1 = Full AttnRes. Its stream and doubly-stochastic measures are n/a.",
}


def variant_sources():
    """One line per registered variant beyond the paper: its note, or its SPEC's."""
    return [VARIANT_SOURCES.get(name) or f"**{spec.label}** (`--hc {name}`; {spec.source}): {spec.description}."
            for name, spec in connections.specs().items() if spec.beyond_paper]


def counterpart(run, runs):
    """The found run this one is read against, or None."""
    if run.options:
        same = [o for o in runs if o.found and not beyond_paper(o) and o.variant == run.variant
                and o.depth == run.depth and o.n == run.n and o.alpha_shared == run.alpha_shared
                and (run.variant != "kromhc" or same_factors(o, run))]
    else:
        # the declared baseline in its own plain configuration, whichever table it belongs to
        # (pre-norm is itself a run beyond the paper)
        base = connections.spec(run.variant).baseline if run.variant in connections.VARIANTS else "residual"
        same = [o for o in runs if o.found and not o.options and o.variant == base and o.depth == run.depth
                and (not connections.spec(base).streams or o.n == run.n)]
    return sorted(same, key=method_order)[0] if same else None


def beyond_table(runs, groups=None):
    rows = []
    for r in sorted((r for r in row_runs(runs, groups) if beyond_paper(r)), key=lambda r: (r.depth or 0, method_order(r))):
        members = row_members(r, groups)
        ref = residual_reference(runs, r.depth)
        delta = None if ref is None or params(r) is None else (params(r) - params(ref)) / 1e3
        other = counterpart(r, runs)
        d_loss = d_bpb = None
        if other is not None and r.found:
            loss, bpb = train_loss(r), val_bpb(r)
            d_loss = None if loss is None or train_loss(other) is None else loss - train_loss(other)
            d_bpb = None if bpb is None or val_bpb(other) is None else bpb - val_bpb(other)
        stats = collapse_stats(r)[0] or {}
        collapse = ((NOT_APPLICABLE, NOT_APPLICABLE) if not has_h_res(r.variant) else
                    (fmt(stats.get("effective_streams_mean"), ".2f"), fmt(stats.get("offdiag_mass_mean"), ".3f")))
        rows.append((method_label(r), row_name(members), fmt(r.depth, "d"), fmt(r.n, "d"), row_status(members),
                     fmt(delta, ".1f"), fmt_seeds([train_loss(m) for m in members]),
                     fmt_seeds([val_bpb(m) for m in members]), fmt_seeds([core_score(m)[0] for m in members], ".2f"),
                     other.name if other else MISSING, signed(d_loss, ".3f"), signed(d_bpb, ".3f"), *collapse))
    header = ("Method", "Run", "D", "n", "Status", "ΔParams (K)", "Train loss", "Val BPB", "CORE", "against",
              "Δ loss", "Δ BPB", "eff. streams", "off-diag")
    notes = ["Not in the KromHC paper: no paper numbers. ΔParams against the residual run of the same depth; "
             "Δ against the run named in 'against' (the same variant in the paper's configuration, or a new "
             "variant's baseline), first seeds. eff. streams and off-diag: means over layers, as in 'Stream "
             "collapse' (`bash speedrun.sh frontier` trains the configs of `configs/frontier/`)."]
    stale = stale_collapse_line([r for r in row_runs(runs, groups) if beyond_paper(r) and has_h_res(r.variant)])
    notes += [stale] if stale else []
    text = md_table(header, rows) + "\n\n" if rows else "No run beyond the paper yet (`bash speedrun.sh frontier`).\n\n"
    return text + "\n".join(f"- {n}" for n in notes + OPTION_SOURCES + variant_sources())
