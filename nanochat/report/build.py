"""report/README.md and its figures from run directories, in the KromHC paper's layout.

Reads only what training, evaluation and speedrun leave in a run directory (config.toml,
metrics.jsonl, summary.json, core.json, lm_eval.json, hc_stats.json, failed.json) and writes
the paper's tables (ours beside the paper's numbers wherever a run matches a paper row by
configuration, `nanochat.report.tables`) and PNG figures in the paper's styles (`nanochat.report.figures`).
Nothing is invented: a value that no file holds is printed as a dash, runs that were expected
but not found are listed, runs without summary.json are marked incomplete, and runs that
speedrun recorded as failed say why. Runs that differ only in their seeds form one row
(`nanochat.report.runs.seed_groups`, `nanochat.studies.stats`).

Runs of another trunk than the paper's (config.toml's `trunk`, docs/trunks.md) get sections of
their own after the paper's: their runs, results per depth and compute multiplier, never a row,
ratio or difference beside a run of another trunk.
"""

from pathlib import Path

from nanochat import trunks
from nanochat.report import paper
from nanochat.report.figures import plot_curves, plot_gap, plot_grad_norms, plot_grad_tail, plot_params_vs_n, series
from nanochat.report.beyond import beyond_table
from nanochat.report.published import published_table
from nanochat.report.cm_section import cm_section
from nanochat.report.collapse import collapse_section
from nanochat.report.cost import cost_section
from nanochat.report.harness import harness_section
from nanochat.report.runs import beyond_paper, by_trunk, is_default_factors, is_main, method_order, seed_groups
from nanochat.report.seeds import seed_table, task_sentence
from nanochat.report.tables import (alpha_table, corpus_lines, factorization_table, fidelity_notes, identity_table,
                                    main_table, n_scaling_table, other_runs_table, paper_reference, params_vs_n_table,
                                    runs_table, same_factors, stability_table, system_table, task_average, task_table,
                                    trunk_table)

# What each trunk is, for its sections' heading (nanochat/trunks.py).


def select_reference(group, reference):
    """The run that gaps are measured against: a run name, else the first run of that variant."""
    by_name = [r for r in group if r.name == reference]
    by_variant = [r for r in group if r.variant == reference]
    found = [r for r in by_name + by_variant if r.metrics]
    return found[0] if found else None


def write_report(runs, out_dir, reference="residual", notes=(), infer_bench=None):
    """Write out_dir/README.md and the figures beside it; return the README path: the paper's
    sections over the runs of the paper's trunk, then each other trunk's own.
    infer_bench: an inference benchmark (nanochat.report.cost.load_infer_bench) or None."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    others = by_trunk(runs)
    paper_trunk = others.pop(trunks.DEFAULT, [])
    parts = ["# nanochat-hc report",
             "Tables and figures in the layout of the KromHC paper (arXiv 2601.21579), from the run "
             "directories below. Our numbers first, the paper's beside them where a run matches a paper "
             "configuration (depth, method, n, KromHC factors, alpha_res sharing). A dash is a value no "
             "run file holds. CORE is on the paper's scale (x100)."]
    if others:
        parts.append(f"Runs of {len(others) + bool(paper_trunk)} trunk(s) (docs/trunks.md): "
                     + (f"the paper's sections read the {len(paper_trunk)} run(s) of trunk {trunks.DEFAULT}; "
                        if paper_trunk else "none on the paper's trunk; ")
                     + "; ".join(f"trunk {t} has its own sections ({len(m)} run(s))" for t, m in others.items())
                     + ". No table, ratio or compute multiplier reads runs of two trunks together.")
    if paper_trunk or not others:
        parts += paper_sections(paper_trunk, out, reference, notes, infer_bench)
    elif notes:
        parts += ["Missing:", "\n".join(f"- {n}" for n in notes)]
    for trunk, members in others.items():
        parts += trunk_sections(trunk, members, out)
    if paper_trunk or not others:
        parts += ["## The paper's numbers", paper_reference()]
    readme = out / "README.md"
    readme.write_text("\n\n".join(parts) + "\n")
    return readme


def trunk_sections(trunk, runs, out):
    """The sections of a trunk other than the paper's: its runs, one results table per depth with
    its loss curves, and its compute multiplier."""
    name = f"Trunk {trunk} ({trunks.TITLES.get(trunk, 'docs/trunks.md')})"
    parts = [f"## {name}: runs",
             "The paper trained nothing on this trunk: no paper numbers beside these, and every comparison "
             "below is between runs of this trunk.", runs_table(runs), corpus_lines(runs)]
    groups = seed_groups(runs)
    for depth in sorted({r.depth for r in runs if r.depth is not None}):
        table = trunk_table(runs, depth, groups)
        if table is None:
            continue
        parts += [f"### {name}: D={depth}", table]
        rows = [groups[r.name] for r in sorted(runs, key=method_order)
                if r.found and r.depth == depth and r.name in groups and r.metrics]
        if rows:
            path = plot_curves(rows, out / f"loss_{trunks.tag(trunk)}_d{depth}.png", f"trunk {trunk}, D={depth}")
            parts.append(f"![loss curves trunk {trunk} D={depth}]({path.name})")
    parts += [f"## {name}: compute multiplier", cm_section(runs, out, trunk=trunk)]
    return parts


def paper_sections(runs, out, reference, notes, infer_bench):
    """The sections in the paper's layout, over the runs of the paper's trunk."""
    found = [r for r in runs if r.found]
    missing = [r for r in runs if not r.found]
    depths = sorted({r.depth for r in runs if r.depth is not None})
    # The paper's sections read the runs in its configurations; the rest of the report reads all.
    paper_runs = [r for r in runs if not beyond_paper(r)]
    placed = set()
    parts = ["## Runs", runs_table(runs), corpus_lines(runs)]
    if missing or notes:
        lines = [f"- not found: `{r.path}`" for r in missing] + [f"- {n}" for n in notes]
        parts += ["Missing:", "\n".join(lines)]

    groups = seed_groups(runs)
    for depth in depths:
        main = main_table(paper_runs, depth, groups)
        if main is None:
            continue
        group = sorted((r for r in found if r.depth == depth and is_main(r) and r.name in groups), key=method_order)
        placed |= {r.name for r in paper_runs if r.depth == depth and is_main(r)}
        parts += [f"## Main results, D={depth} ({paper.MAIN_TABLE})", main]
        seeds = seed_table(paper_runs, depth, groups)
        if seeds and any(len(groups[r.name]) > 1 for r in found if r.depth == depth and r.name in groups):
            parts += [f"### Differences and seed noise, D={depth}", seeds]
        elif seeds:
            parts.append(seeds)  # one seed per row: the note alone
        if any(r.metrics for r in group):
            rows = [groups[r.name] for r in group]
            parts.append(f"![loss curves D={depth}]({plot_curves(rows, out / f'loss_d{depth}.png', f'D={depth}').name})")
            ref = select_reference(group, reference)
            if ref is not None and len(group) > 1:
                gap = plot_gap(rows, groups[ref.name], out / f"loss_gap_d{depth}.png",
                               f"D={depth}: gap to {ref.name} (Figure 4 style)")
                parts.append(f"![loss gap D={depth}]({gap.name})")
            if any(len(m) > 1 for m in rows):
                parts.append("- Rows with several seeds: the line is their mean, the band ± one standard deviation "
                             "(gaps: over the seed-paired differences); gradient norms: the first seed.")
            elif ref is None:
                parts.append(f"- No loss-gap figure at D={depth}: no run named or of variant '{reference}' with metrics.")
            grads = plot_grad_norms(group, out / f"grad_norm_d{depth}.png", f"D={depth} ({paper.GRAD_FULL_FIGURE} style)")
            parts.append(f"![gradient norms D={depth}]({grads.name})")
            hc_group = [r for r in group if r.variant != "residual" and series(r, "train", "grad_norm")[0]]
            if hc_group:
                tail = plot_grad_tail(hc_group, out / f"grad_norm_tail_d{depth}.png",
                                      f"D={depth}, last 2/7 of training ({paper.GRAD_ZOOM_FIGURE} style)")
                parts.append(f"![gradient norm tail D={depth}]({tail.name})")
            if depth == paper.STABILITY_DEPTH:
                parts.append(f"- Paper ({paper.GRAD_ZOOM_FIGURE}, {paper.GRAD_FULL_FIGURE}): {paper.GRAD_CLAIM}.")

    parts.append(f"## CORE tasks ({paper.COMMONSENSE_TABLE}, {paper.LANGUAGE_TABLE})")
    core_heading = len(parts)
    for depth in depths:
        for title, columns, table in (("Commonsense and reasoning", paper.COMMONSENSE_COLUMNS, paper.COMMONSENSE),
                                      ("Language modeling, BigBench, evaluation suite", paper.LANGUAGE_COLUMNS, paper.LANGUAGE)):
            text = task_table(paper_runs, depth, columns, table, groups)
            if text:
                sentence = task_sentence(paper_runs, depth, groups, lambda r, columns=columns: task_average(r, columns)[0])
                parts += [f"### {title}, D={depth}", text + "\n" + sentence]
    if len(parts) == core_heading:
        parts.append("- No run here has CORE task results, and the paper has none at these depths: "
                     "`python -m scripts.base_eval --model-tag TAG --eval core` measures them (the CPU demo "
                     "runs it when the CORE bundle can be downloaded or `NANOCHAT_EVAL_BUNDLE` names one).")

    parts += ["## lm-evaluation-harness (not in the paper)", harness_section(runs, groups)]
    parts += ["## Compute multiplier (not in the paper)", cm_section(runs, out)]

    parts.append(f"## Width of the residual stream ({paper.N_SCALING_TABLE}, {paper.N_SCALING_FIGURE})")
    scaling_depths = sorted(set(depths) | {paper.N_SCALING_DEPTH})
    for depth in scaling_depths:
        text = n_scaling_table(paper_runs, depth)
        if text is None:
            continue
        group = [r for r in paper_runs if r.depth == depth and r.variant == "kromhc" and r.alpha_shared and r.n
                 and is_default_factors(r.factors, r.n)]
        placed |= {r.name for r in group}
        parts += [f"### D={depth}", text]
        base = next((r for r in group if r.n == paper.PAPER_STREAMS and r.metrics), None)
        if base is not None and any(r.metrics and r.n != base.n for r in group):
            path = plot_gap([[r] for r in sorted((r for r in group if r.metrics), key=lambda r: r.n)], [base],
                            out / f"n_scaling_gap_d{depth}.png", f"KromHC width, D={depth}: gap to n=4 (Figure 4 style)")
            parts.append(f"![n scaling D={depth}]({path.name})")

    parts += ["## Ablations", f"### alpha_res shared or per factor ({paper.ALPHA_FIGURE})", alpha_table(paper_runs)]
    placed |= {r.name for r in paper_runs if r.variant == "kromhc" and not r.alpha_shared}
    for r in [r for r in paper_runs if r.found and r.variant == "kromhc" and not r.alpha_shared and r.metrics]:
        shared = [s for s in paper_runs if s.found and s.variant == "kromhc" and s.alpha_shared and s.depth == r.depth
                  and s.n == r.n and same_factors(s, r) and s.metrics]
        if shared:
            path = plot_gap([[shared[0]], [r]], [shared[0]], out / f"alpha_gap_{r.name}.png", f"{r.name} vs {shared[0].name}")
            parts.append(f"![alpha ablation {r.name}]({path.name})")
    parts += [f"### Factorization ({paper.FACTORIZATION_SECTION})", factorization_table(paper_runs)]
    placed |= {r.name for r in paper_runs if r.variant == "kromhc" and r.alpha_shared and r.factors is not None}
    parts += ["### H_res = I (not in the paper)", identity_table(paper_runs)]
    placed |= {r.name for r in paper_runs if r.variant == "hc_identity"}

    stab = stability_table(runs)
    parts += [f"## Stability of the composite residual map ({paper.STABILITY_FIGURE})", stab or "No HC run."]
    parts += ["## Stream collapse (not in the paper)", collapse_section(runs, out)]

    parts.append(f"## System metrics ({paper.SYSTEM_TABLE})")
    for depth in depths:
        text = system_table(paper_runs, depth)
        if text:
            parts += [f"### D={depth}", text]

    parts += ["## Cost: training and inference (not in the paper)", cost_section(runs, depths, infer_bench)]

    parts += [f"## Parameters per HC layer against n ({paper.PARAMS_VS_N_FIGURE})",
              f"C = {paper.PARAMS_VS_N_C}, KromHC factors all 2, with the RMSNorm weight "
              "(`nanochat.connections.diagnostics.hc_layer_params`).",
              params_vs_n_table(), f"![params vs n]({plot_params_vs_n(out / 'params_vs_n.png').name})"]

    parts += ["## Beyond the paper", beyond_table(runs, groups)]
    parts += ["### Published elsewhere: the wirings beyond the HC family in another harness",
              published_table(runs, groups)]
    placed |= {r.name for r in runs if beyond_paper(r)}
    other = other_runs_table(runs, placed)
    if other:
        parts += ["## Other runs", other]
    parts += ["## Fidelity notes", fidelity_notes(runs)]
    return parts
