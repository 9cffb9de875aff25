"""The report's tables in the KromHC paper's layout (Tables 3-9), ours beside the paper's
numbers from `nanochat.report.paper` wherever a run matches a paper row."""

import math

from nanochat import connections
from nanochat.report import paper
from nanochat.report.format import MISSING, NOT_APPLICABLE, fmt, fmt_seeds, md_table, relative_pct, signed
from nanochat.report.runs import (core_score, has_h_res, is_default_factors, is_main, method_label, method_order,
                                  paper_key, params, stability, task_accuracy, train_loss, val_bpb)

# H_res doubly stochastic by construction (mhc to its Sinkhorn tolerance, the others exactly).
DOUBLY_STOCHASTIC = ("mhc", "mhc_lite", "kromhc", "go_mhc")


def runs_table(runs):
    rows = []
    for r in sorted(runs, key=lambda r: (r.depth or 0, method_order(r))):
        factors = "x".join(map(str, r.factors)) if r.factors else MISSING
        alpha = ("shared" if r.alpha_shared else "per factor") if r.variant == "kromhc" else MISSING
        rows.append((r.name, method_label(r), fmt(r.depth, "d"), fmt(r.n, "d"), factors, alpha,
                     f"{fmt(r.last_step, 'd')} / {fmt(r.num_iterations, 'd')}",
                     r.status, r.summary.get("device", MISSING) if r.summary else MISSING))
    return md_table(("Run", "Method", "D", "n", "Factors", "alpha_res", "Steps", "Status", "Device"), rows)


def residual_reference(runs, depth):
    """The complete residual run at this depth whose parameter count is known, or None."""
    refs = [r for r in runs if r.depth == depth and r.variant == "residual" and params(r) is not None]
    return refs[0] if refs else None


def delta_params(r, ref):
    """ΔParams of run r against the residual run `ref`, in thousands: "--" for a residual run
    itself, MISSING where either count is unknown."""
    if r.variant == "residual":
        return "--"
    if ref is None or params(r) is None:
        return MISSING
    return fmt((params(r) - params(ref)) / 1e3, ".1f")


def row_members(r, groups):
    """The runs of r's row (r and the runs that differ from it only in their seeds)."""
    return groups.get(r.name, [r]) if groups else [r]


def row_runs(runs, groups):
    """The first run of each row (all runs when there are no groups)."""
    return [r for r in runs if not groups or r.name in groups]


def row_name(members):
    return members[0].name + (f" (+{len(members) - 1} seed{'s' if len(members) > 2 else ''})" if len(members) > 1 else "")


def row_status(members):
    statuses = [m.status for m in members]
    if len(set(statuses)) == 1:
        return statuses[0]
    return "; ".join(f"{m.name}: {st}" for m, st in zip(members, statuses))


def main_table(runs, depth, groups=None):
    """Table 3 layout for one depth: ours beside the paper's numbers; runs that differ only
    in their seeds (groups, from `seed_groups`) share a row of mean ± std."""
    ref = residual_reference(runs, depth)
    notes, rows, core_from_training, core_partial = [], [], [], []
    for r in sorted((r for r in row_runs(runs, groups) if r.depth == depth and is_main(r)), key=method_order):
        members = row_members(r, groups)
        p = paper.MAIN.get(paper_key(r)) if paper_key(r) else None
        delta = delta_params(r, ref)
        if delta not in ("--", MISSING):
            if params(r, "hc") is not None and params(ref, "hc") is not None and \
                    params(r) - params(r, "hc") != params(ref) - params(ref, "hc"):
                delta += " †"
                notes.append(f"† {r.name}: the non-HC parameters differ from {ref.name} (another vocab or width), "
                             "so its ΔParams is not the connection's cost alone.")
        for m in members:
            source = core_score(m)[1]
            if source and source != "core.json":
                core_from_training.append(m.name)
            elif source and m.core.get("partial"):
                core_partial.append(f"{m.name} ({len(m.core.get('tasks', {}))})")
        rows.append((
            method_label(r), row_name(members), row_status(members),
            delta, "--" if p and p.delta_params_k is None else fmt(p.delta_params_k if p else None, ".0f"),
            fmt_seeds([train_loss(m) for m in members]), fmt(p.train_loss if p else None),
            fmt_seeds([val_bpb(m) for m in members]), fmt(p.val_bpb if p else None),
            fmt_seeds([core_score(m)[0] for m in members]), fmt(p.core if p else None),
        ))
    if not rows:
        return None
    header = ("Method", "Run", "Status", "ΔParams (K)", "paper", "Train loss", "paper",
              "Val BPB", "paper", "CORE", "paper")
    text = [md_table(header, rows)]
    if ref is None:
        notes.insert(0, f"No complete residual run at D={depth}: ΔParams cannot be computed.")
    else:
        notes.insert(0, f"ΔParams = params.total of the run minus that of {ref.name} (summary.json).")
    if core_from_training:
        notes.append("CORE from the in-training evaluation (possibly sub-sampled; no core.json from "
                     "scripts.base_eval): " + ", ".join(core_from_training) + ".")
    if core_partial:
        notes.append("CORE averages only the tasks the eval bundle held (core.json: partial; tasks in "
                     "parentheses), not all 22: " + ", ".join(core_partial) + ".")
    if depth not in paper.PAPER_DEPTHS:
        notes.append(f"The paper reports D=6 and D=12 only: no paper numbers for D={depth} "
                     "(see 'The paper's numbers' below).")
    return "\n\n".join(text + ["\n".join(f"- {n}" for n in dict.fromkeys(notes))])


def trunk_table(runs, depth, groups=None):
    """The results of one trunk's runs at one depth other than the paper's trunk (every wiring,
    one row per seed group): ours only, since the paper trained none on it. ΔParams is against
    that trunk's residual run at the depth."""
    ref = residual_reference(runs, depth)
    rows = []
    for r in sorted((r for r in row_runs(runs, groups) if r.depth == depth and r.variant is not None),
                    key=method_order):
        members = row_members(r, groups)
        delta = delta_params(r, ref)
        rows.append((method_label(r), row_name(members), row_status(members), delta,
                     fmt_seeds([train_loss(m) for m in members]), fmt_seeds([val_bpb(m) for m in members]),
                     fmt_seeds([core_score(m)[0] for m in members])))
    if not rows:
        return None
    note = (f"ΔParams = params.total of the run minus that of {ref.name} (summary.json)." if ref is not None else
            f"No complete residual run at D={depth} on this trunk: ΔParams cannot be computed.")
    return md_table(("Method", "Run", "Status", "ΔParams (K)", "Train loss", "Val BPB", "CORE"), rows) + "\n\n" + note


def task_average(run, columns):
    """(mean accuracy of the tasks present, whether some are missing); (None, False) if none is."""
    accs = [task_accuracy(run, label) for _, label in columns]
    present = [a for a in accs if a is not None]
    return (sum(present) / len(present) if present else None), 0 < len(present) < len(accs)


def task_table(runs, depth, columns, paper_rows, groups=None):
    """Tables 4/5 layout: for each row of runs (one per seed group) ours and, when it matches,
    the paper's row beneath."""
    header = ("Method", "Run", "Avg") + tuple(h for h, _ in columns)
    rows, partial, filled = [], [], False
    for r in sorted((r for r in row_runs(runs, groups) if r.depth == depth and is_main(r)), key=method_order):
        members = row_members(r, groups)
        averages = [task_average(m, columns) for m in members]
        filled |= any(a is not None for a, _ in averages)
        avg = fmt_seeds([a for a, _ in averages], ".1f")
        if any(missing for _, missing in averages):
            avg += "*"
            partial.append(r.name)
        rows.append((method_label(r), row_name(members), avg)
                    + tuple(fmt_seeds([task_accuracy(m, label) for m in members], ".1f") for _, label in columns))
        key = paper_key(r)
        if key in paper_rows:
            filled = True
            rows.append((f"{method_label(r)} (paper)", "", *(fmt(v, ".1f") for v in paper_rows[key])))
    if not filled:  # nothing to show: e.g. training-only runs (a ladder's) at a depth the paper lacks
        return None
    notes = ["Accuracy in percent; Avg is the mean of the tasks shown, as in the paper."]
    if partial:
        notes.append("* averaged over the tasks present only (" + ", ".join(partial) + "); "
                     "a dash is a task missing from core.json (e.g. not in the eval bundle).")
    return md_table(header, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes)


def n_scaling_table(runs, depth):
    """Table 6 layout: KromHC (all-2 factors, shared alpha) at each width n."""
    group = [r for r in runs if r.depth == depth and r.variant == "kromhc" and r.alpha_shared
             and r.n is not None and is_default_factors(r.factors, r.n)]
    ns = sorted({r.n for r in group} | (set(paper.N_SCALING_DELTA_PARAMS_M) if depth == paper.N_SCALING_DEPTH else set()))
    if len(ns) < 2:
        return None
    ref = residual_reference(runs, depth)
    base = next((r for r in group if r.n == paper.PAPER_STREAMS and r.found), None)
    rows = []
    for n in ns:
        runs_n = [r for r in group if r.n == n] or [None]
        for r in runs_n:
            measured = None
            if r is not None and ref is not None and params(r) is not None:
                measured = (params(r) - params(ref)) / 1e6
            # The width of the run, else the paper's width for this depth (rows not run).
            model_dim = (r.summary or {}).get("model_dim") if r else None
            if model_dim is None:
                model_dim = paper.SCALE_HYPERPARAMS.get(depth, {}).get("model_dim")
            formula = None
            if model_dim is not None:
                norm_weight = bool(r.config.get("hc_norm_weight", True)) if r else True
                per_layer = hc_params_per_layer("kromhc", n, model_dim, factors=r.factors if r else None,
                                                norm_weight=norm_weight)
                formula = 2 * depth * per_layer / 1e6
            gap_loss = gap_bpb = None
            if r is not None and base is not None and r is not base:
                gap_loss = _diff(train_loss(r), train_loss(base))
                gap_bpb = _diff(val_bpb(r), val_bpb(base))
            p = paper.N_SCALING_DELTA_PARAMS_M.get(n) if depth == paper.N_SCALING_DEPTH else None
            rows.append((fmt(n, "d"), r.name if r else MISSING, r.status if r else "not run",
                         fmt(measured, ".2f"), fmt(formula, ".2f"), fmt(p, ".2f"),
                         fmt(train_loss(r) if r else None), fmt(val_bpb(r) if r else None),
                         fmt(core_score(r)[0] if r else None), signed(gap_loss, ".3f"), signed(gap_bpb, ".3f")))
    header = ("n", "Run", "Status", "ΔParams (M)", "formula (M)", "paper (M)", "Train loss", "Val BPB",
              "CORE", "Δloss vs n=4", "ΔBPB vs n=4")
    notes = ["ΔParams: measured against the residual run of the same depth"
             + (f" ({ref.name})" if ref else " (none found, so a dash)") + "; formula: 2·D HC layers × "
             "`hc_layer_params` (with the RMSNorm weight unless the run turned it off)."]
    if depth == paper.N_SCALING_DEPTH:
        notes.append("Paper: " + paper.N_SCALING_NOTE + ".")
        notes.append(f"{paper.N_SCALING_FIGURE} shows the gaps as curves only: {paper.N_SCALING_CLAIM}.")
    return md_table(header, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes)


def _diff(a, b):
    return None if a is None or b is None else a - b


def alpha_table(runs):
    """Figure 6 ablation: KromHC with one alpha_res per factor versus the shared one."""
    per_factor = [r for r in runs if r.variant == "kromhc" and not r.alpha_shared]
    rows = []
    for r in sorted(per_factor, key=lambda r: (r.depth or 0, r.n or 0, r.name)):
        shared = [s for s in runs if s.variant == "kromhc" and s.alpha_shared and s.depth == r.depth
                  and s.n == r.n and same_factors(s, r)]
        for s in shared or [None]:
            for run, label in ((s, "shared"), (r, "per factor")):
                if run is None:
                    rows.append((fmt(r.depth, "d"), fmt(r.n, "d"), label, MISSING, "not run",
                                 MISSING, MISSING, MISSING, MISSING, MISSING))
                    continue
                d_loss = _diff(train_loss(r), train_loss(s)) if s and run is r else None
                d_bpb = _diff(val_bpb(r), val_bpb(s)) if s and run is r else None
                rows.append((fmt(run.depth, "d"), fmt(run.n, "d"), label, run.name, run.status,
                             fmt(train_loss(run)), fmt(val_bpb(run)), fmt(core_score(run)[0]),
                             signed(d_loss, ".3f"), signed(d_bpb, ".3f")))
    claim = f"Paper ({paper.ALPHA_FIGURE}, D={paper.ALPHA_DEPTH}, n={paper.ALPHA_STREAMS}, curves only): {paper.ALPHA_CLAIM}."
    if not rows:
        return "No run with a per-factor alpha_res.\n\n- " + claim
    header = ("D", "n", "alpha_res", "Run", "Status", "Train loss", "Val BPB", "CORE",
              "Δloss vs shared", "ΔBPB vs shared")
    return md_table(header, rows) + "\n\n- " + claim


def same_factors(a, b):
    fa, fb = a.factors, b.factors
    if is_default_factors(fa, a.n) and is_default_factors(fb, b.n):
        return True
    return fa is not None and fb is not None and sorted(fa) == sorted(fb)


def _factor_key(run):
    return (2,) * int(math.log2(run.n)) if run.factors is None else tuple(sorted(run.factors, reverse=True))


def factorization_table(runs):
    """Appendix ablation: KromHC factorizations of the same n (paper: 2x2x2 versus 4x2 at n = 8)."""
    krom = [r for r in runs if r.variant == "kromhc" and r.alpha_shared and r.n]
    groups = {}
    for r in krom:
        if r.factors is None and 2 ** int(math.log2(r.n)) != r.n:
            continue  # default factorization of a non-power of two: nothing to compare it with here
        groups.setdefault((r.depth, r.n), []).append(r)
    rows, deltas = [], []
    for (depth, n), group in sorted(groups.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1])):
        if len({_factor_key(r) for r in group}) < 2:
            continue
        for r in sorted(group, key=lambda r: (_factor_key(r), r.name)):
            rows.append((fmt(depth, "d"), fmt(n, "d"), "x".join(map(str, _factor_key(r))), r.name, r.status,
                         fmt(train_loss(r)), fmt(val_bpb(r)), fmt(core_score(r)[0])))
        fine, coarse = (next((r for r in group if _factor_key(r) == f), None) for f in paper.FACTORIZATION_COMPARED)
        if n == paper.FACTORIZATION_STREAMS and fine and coarse:
            paper_here = depth == paper.FACTORIZATION_DEPTH
            deltas.append((fmt(depth, "d"), fmt(n, "d"), "train loss", signed(_diff(train_loss(fine), train_loss(coarse)), ".3f"),
                           signed(paper.FACTORIZATION_DELTA["train_loss"], ".3f") if paper_here else MISSING))
            deltas.append((fmt(depth, "d"), fmt(n, "d"), "val BPB", signed(_diff(val_bpb(fine), val_bpb(coarse)), ".3f"),
                           signed(paper.FACTORIZATION_DELTA["val_bpb"], ".3f") if paper_here else MISSING))
    claim = (f"Paper ({paper.FACTORIZATION_SECTION}, D={paper.FACTORIZATION_DEPTH}, n={paper.FACTORIZATION_STREAMS}): "
             f"2x2x2 minus 4x2 = {paper.FACTORIZATION_DELTA['train_loss']:+.3f} train loss, "
             f"{paper.FACTORIZATION_DELTA['val_bpb']:+.3f} val BPB.")
    if not rows:
        return "No two KromHC runs of the same depth and n with different factorizations.\n\n- " + claim
    text = md_table(("D", "n", "Factors", "Run", "Status", "Train loss", "Val BPB", "CORE"), rows)
    if deltas:
        text += "\n\n2x2x2 minus 4x2:\n\n" + md_table(("D", "n", "Metric", "Ours", "paper"), deltas)
    return text + "\n\n- " + claim


def identity_table(runs):
    """Beyond the paper: HC with H_res fixed to I against the other methods of its depth and n."""
    rows = []
    for r in sorted((r for r in runs if r.variant == "hc_identity"), key=lambda r: (r.depth or 0, r.name)):
        others = [o for o in runs if o.depth == r.depth and o is not r and o.found and is_main(o)
                  and (o.variant == "residual" or o.n == r.n)]
        for o in sorted(others, key=method_order):
            rows.append((fmt(r.depth, "d"), r.name, f"{method_label(o)} ({o.name})",
                         signed(_diff(train_loss(r), train_loss(o)), ".3f"), signed(_diff(val_bpb(r), val_bpb(o)), ".3f"),
                         signed(_diff(core_score(r)[0], core_score(o)[0]), ".3f")))
    note = "- Not in the paper: it isolates what the stream mixing H_res buys over dynamic pre/post weights alone."
    if not rows:
        return "No hc_identity run.\n\n" + note
    return md_table(("D", "Run (H_res = I)", "minus", "Δ train loss", "Δ val BPB", "Δ CORE"), rows) + "\n\n" + note


def stability_table(runs):
    """Figure 2: composite residual products; paper values beside matching runs."""
    rows, sources, movement = [], [], []
    for r in sorted((r for r in runs if r.variant not in ("residual", None) and r.found),
                    key=lambda r: (r.depth or 0, method_order(r))):
        stats, source = stability(r)
        hc_params = fmt(params(r, "hc"), ",d")
        if not has_h_res(r.variant):
            rows.append((method_label(r), r.name, fmt(r.depth, "d"), hc_params, *[NOT_APPLICABLE] * 7))
            continue
        if stats is None:
            rows.append((method_label(r), r.name, fmt(r.depth, "d"), hc_params, MISSING, MISSING, MISSING, MISSING,
                         MISSING, MISSING, MISSING))
            continue
        if source != "hc_stats.json":
            sources.append(r.name)
        p = None
        if r.depth == paper.STABILITY_DEPTH and is_main(r) and r.variant in paper.STABILITY_COL_MAE:
            p = paper.STABILITY_COL_MAE[r.variant]
            p = ("≈" if r.variant in paper.STABILITY_APPROXIMATE else "") + f"{p:g}"
        moved = identity_distance(stats)
        if moved is not None:
            movement.append((r, moved, stats))
        rows.append((method_label(r), r.name, fmt(r.depth, "d"), hc_params, fmt(moved, ".3g"),
                     fmt(stats.get("composite_row_mae"), ".2e"), p or MISSING,
                     fmt(stats.get("composite_col_mae"), ".2e"),
                     fmt(stats.get("fwd_gain"), ".3g"), fmt(stats.get("bwd_gain"), ".3g"), source))
    if not rows:
        return None
    notes = ["MAE of the row (column) sums of the product of every HC layer's H_res, per token, against 1; "
             "gains: largest absolute row (forward) and column (backward) sum of that product.",
             "The paper's code stores A = H_res^T, so the column sums it plots are our row sums: its value "
             "stands beside our row MAE. Our mHC ends each Sinkhorn pass on columns, so its error shows in rows.",
             f"Paper ({paper.STABILITY_FIGURE}, D={paper.STABILITY_DEPTH}): a plot; mHC 'around 0.05', "
             "mHC-lite and KromHC zero."]
    if sources:
        notes.append("From the last training-time diagnostic (no hc_stats.json): " + ", ".join(sources) + ".")
    notes.insert(0, "HC params: the connection parameters of the run (summary.json). H_res − I: how far the "
                 "residual mixing left its identity init, the largest |H_res − I| entry of a layer, averaged over "
                 "tokens and layers (hc_identity keeps H_res = I: 0).")
    if any(not has_h_res(r.variant) for r in runs if r.found):
        notes.append("n/a: Block Attention Residuals is a baseline beside the HC family, without streams or H_res; "
                     "these measures do not apply to it (hc_report --checkpoint shows the weights its reads put "
                     "on their sources instead).")
    if movement:
        notes.append(stability_sentence(movement))
    header = ("Method", "Run", "D", "HC params", "H_res − I", "row MAE", "paper", "col MAE", "fwd gain", "bwd gain",
              "source")
    return md_table(header, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes)


# A composite sum error below this is float32 rounding over a few layers, not a broken constraint.
ROUNDING = 1e-5


def identity_distance(stats):
    """Mean over layers of each layer's mean (over tokens) largest |H_res - I| entry, or None."""
    layers = [layer["identity_dist"] for layer in stats.get("layers", []) if layer.get("identity_dist") is not None]
    return sum(layers) / len(layers) if layers else None


def stability_sentence(movement):
    """What the Figure-2 columns show, in words: whether H_res moved, and which exactly doubly
    stochastic variants keep their composite sums at rounding while mHC's drift."""
    moved = [f"{method_label(r)} {d:.3g}" for r, d, _ in movement if r.variant != "hc_identity"]
    exact, drift = [], []
    for r, _, stats in movement:
        if r.variant not in DOUBLY_STOCHASTIC:
            continue
        error = max(stats.get("composite_row_mae") or 0.0, stats.get("composite_col_mae") or 0.0)
        (exact if error < ROUNDING else drift).append(f"{method_label(r)} ({error:.1e})")
    text = "H_res left its identity init by " + ", ".join(moved) + "." if moved else ""
    if exact:
        text += " Composite row/column sums at rounding (< 1e-5): " + ", ".join(exact) + "."
    if drift:
        text += " Composite sums off by more than rounding: " + ", ".join(drift) + "."
    return text.strip() + (" Losses can tie while these differ: the paper's point is the "
                           "constraint, which holds or drifts whatever the loss.")


def system_table(runs, depth):
    """Table 9 layout: tokens/s, step time and peak memory, relative to the mHC run of this depth."""
    group = sorted((r for r in runs if r.depth == depth and is_main(r) and r.summary), key=method_order)
    if not group:
        return None
    ref = next((r for r in group if r.variant == paper.SYSTEM_REFERENCE), None)
    rows, notes = [], []
    rs = ref.summary if ref else {}
    for r in group:
        s = r.summary
        p = paper.SYSTEM.get(r.variant) if depth == paper.SYSTEM_DEPTH else None
        if ref and (s.get("device"), s.get("world_size")) != (rs.get("device"), rs.get("world_size")):
            notes.append(f"{r.name} ran on {s.get('device')} x{s.get('world_size')}, the mHC run on "
                         f"{rs.get('device')} x{rs.get('world_size')}: its relative numbers compare hardware too.")
        cells = [method_label(r), r.name, f"{s.get('device', MISSING)} x{s.get('world_size', MISSING)}"]
        for key, spec, paper_value in (("tok_per_sec", ",.0f", p and p.throughput_pct),
                                       ("step_time", ".4f", p and p.step_time_pct),
                                       ("peak_mem_mib", ",.0f", p and p.memory_pct)):
            ours = "(ref)" if r is ref else signed(relative_pct(s.get(key), rs.get(key)))
            theirs = "(ref)" if p and r.variant == paper.SYSTEM_REFERENCE else signed(paper_value if p else None)
            cells += [fmt(s.get(key), spec), ours, theirs]
        rows.append(cells)
    header = ("Method", "Run", "Device", "tok/s", "Δ% vs mHC", "paper", "step time (s)", "Δ%", "paper",
              "peak mem (MiB)", "Δ%", "paper")
    notes.insert(0, "Medians over the steps after warm-up (summary.json); Δ% is relative to the mHC run "
                 + (f"({ref.name})." if ref else "— none at this depth, so a dash."))
    if depth == paper.SYSTEM_DEPTH:
        notes.append(f"Paper ({paper.SYSTEM_TABLE}): pure PyTorch, n=4, 8 RTX PRO 6000 GPUs.")
    return md_table(header, rows) + "\n\n" + "\n".join(f"- {n}" for n in dict.fromkeys(notes))


def other_runs_table(runs, placed):
    # Runs neither found nor configured are already listed as missing, with nothing to show.
    rest = [r for r in runs if r.name not in placed and r.variant is not None]
    if not rest:
        return None
    rows = [(method_label(r), r.name, fmt(r.depth, "d"), r.status, fmt(train_loss(r)), fmt(val_bpb(r)),
             fmt(core_score(r)[0])) for r in sorted(rest, key=lambda r: (r.depth or 0, method_order(r)))]
    return md_table(("Method", "Run", "D", "Status", "Train loss", "Val BPB", "CORE"), rows)


def paper_reference():
    """The paper's Tables 3-5 in full, for runs at depths the paper did not train."""
    rows = []
    for (depth, method), p in paper.MAIN.items():
        rows.append((fmt(depth, "d"), connections.label(method),
                     "--" if p.delta_params_k is None else f"{p.delta_params_k:.0f}",
                     f"{p.train_loss:.3f}", f"{p.val_bpb:.3f}", f"{p.core:.3f}"))
    text = [f"{paper.MAIN_TABLE}:", md_table(("D", "Method", "ΔParams (K)", "Train loss", "Val BPB", "CORE"), rows)]
    for title, columns, table in ((paper.COMMONSENSE_TABLE, paper.COMMONSENSE_COLUMNS, paper.COMMONSENSE),
                                  (paper.LANGUAGE_TABLE, paper.LANGUAGE_COLUMNS, paper.LANGUAGE)):
        header = ("D", "Method", "Avg") + tuple(h for h, _ in columns)
        body = [(fmt(d, "d"), connections.label(m)) + tuple(f"{v:.1f}" for v in vals) for (d, m), vals in table.items()]
        text += [f"{title} (accuracy %):", md_table(header, body)]
    text.append(f"- {paper.COMMONSENSE_TABLE}: the paper's Avg for mHC-lite at D=6 (41.0) is not the mean of its "
                "row (40.87); every other Avg matches its row within rounding.")
    return "\n\n".join(text)


def hc_params_per_layer(variant, n, C, factors=None, norm_weight=True):
    """Parameters of one HC layer, from the project's single formula in connections.diagnostics."""
    from nanochat.connections.diagnostics import hc_layer_params
    return hc_layer_params(variant, n, C, factors=factors, norm_weight=norm_weight)


# The params-vs-n figure's curves: the paper's, and go-mHC (s = 2) beside them (not in the paper).
PARAMS_VS_N_CURVES = (*paper.PARAMS_VS_N_METHODS, "go_mhc")


def params_vs_n_table():
    C = paper.PARAMS_VS_N_C
    rows = []
    for n in (2, 4, 8, 16):
        factors = [paper.PARAMS_VS_N_FACTOR] * int(math.log2(n))
        rows.append((str(n),) + tuple(f"{hc_params_per_layer(v, n, C, factors=factors if v == 'kromhc' else None):,}"
                                      for v in PARAMS_VS_N_CURVES))
    return (md_table(("n",) + tuple(connections.label(v) for v in PARAMS_VS_N_CURVES), rows)
            + "\n\n- go-mHC (block size s = 2) is not in the paper's figure: its R = ns(ns − 1)/2 res logits grow "
              "as n², like mHC's, not factorially.")


def corpus_lines(runs):
    """What the runs trained on, one line per corpus, from the corpus.json base_train writes
    beside config.toml (runs from before it existed are listed as unknown)."""
    by_corpus = {}
    for r in runs:
        if r.found:
            by_corpus.setdefault(r.corpus["description"] if r.corpus else "unknown (no corpus.json)", []).append(r.name)
    return "\n".join(f"- Trained on {corpus}: {', '.join(names)}" for corpus, names in by_corpus.items())


def fidelity_notes(runs):
    """What a reader must know before comparing our numbers with the paper's."""
    sized = sorted(r.name for r in runs if r.found and r.config.get("value_embeds") is False)
    d6, d12 = (paper.MODEL_SIZES_M[d] for d in (6, 12))
    pin6, pin12 = (paper.PIN_SIZES_M[d] for d in (6, 12))
    fit6, fit12 = (paper.SIZE_MATCHED_SIZES_M[d] for d in (6, 12))
    vocab = paper.SIZE_MATCHED_LAYOUT["vocab_size"]
    lines = [
        "- **The Residual row is nanochat's baseline** as nanochat trains it: per-block scalars "
        "`x = l_resid * x + l_x0 * x0`, init 1 and 0 (the paper's appendix), x0 in AdamW at `--scalar-lr` 0.5 "
        "and resid at 0.005 (the paper's \"LR for residual connections\"; the paper lists no x0 LR), betas "
        "(0.8, 0.95), both scaled by the batch-size LR factor. nanochat's pin later used x0 beta1 0.96 and x0 "
        "init 0.1 (`--x0-beta1 0.96` gives the former). The HC variants train every connection parameter at "
        "`--hc-lr` 0.005.",
        f"- **Model size, an open question.** The paper states ~{d6}M (D=6) and ~{d12}M (D=12) parameters and "
        f"sets its step counts from them (~20 tokens per parameter). nanochat at the pin (vocab 32,768, value "
        f"embeddings) has {pin6}M / {pin12}M; a {vocab:,}-token vocab without value embeddings has {fit6}M / "
        f"{fit12}M. Our configs follow nanochat at the pin. The size-matched variant: "
        f"`python -m scripts.tok_train --vocab-size {vocab}`, then "
        f"`python -m scripts.base_train --config configs/paper/d12_kromhc.toml --vocab-size {vocab} "
        "--value-embeds false --model-tag paper_d12_kromhc_sized` (likewise for each config). "
        + (f"Runs here in that layout: {', '.join(sized)}." if sized else "No run here uses that layout."),
        "- **By design, unlike the paper's code:** bits per byte count each token's raw bytes "
        "(nanochat's pin counted byte fragments as U+FFFD, 3 bytes): our bpb reads about +0.05 % higher; "
        "the validation shard is pinned (`shard_01822`) where nanochat takes whichever sorts last on disk: "
        "an absolute offset of about ±0.001 bpb shared by every variant; nanochat is assumed at commit "
        "4d8dbaf (2026-01-30), the last before the paper, although the paper's text (x0 init 0, beta1 0.8) "
        "matches the code of 2026-01-18 to 01-24 more closely.",
    ]
    return "\n".join(lines)
