"""The compute-multiplier study over runs: who is the baseline, which runs are a variant's
ladder, every reading of nanochat/studies/compute_multiplier.py per variant and depth, the intervals
and Holm-Bonferroni, and what could not be computed (as one `error:`/`warning:` line each).
`scripts.compare` prints and writes it; the report's "Compute multiplier" section shows it.

Seeds of one (connection label, depth) pool: they are the runs `<tag>`, `<tag>_s<k>` and
`<tag>_s<k>_data` that differ only in their seeds (nanochat.report.runs.seed_groups).
"""

import math
from collections import Counter
from dataclasses import dataclass, field

from nanochat.studies import compute_multiplier as cm
from nanochat.report.compute import spend_of, tag_of
from nanochat.report.runs import seed_groups
from nanochat.studies.stats import geomean, holm

BASELINE_LABEL = "residual"


@dataclass
class Study:
    """What compare computes: `result` is the JSON (see scripts/compare.py), `messages` the
    error and warning lines, `law`/`wall_law` the baseline fits (None when not possible)."""
    baseline: dict  # depth -> [Spend]
    variants: dict  # name -> {depth: [Spend]}
    result: dict = field(default_factory=dict)
    messages: list = field(default_factory=list)
    law: object = None
    wall_law: object = None

    @property
    def errors(self):
        return [m for m in self.messages if m.startswith("error:")]


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def pool(runs, messages):
    """[Spend] of the finished runs, one warning per run that cannot enter (named, skipped),
    and runs of one (label, depth) reduced to one group of seeds."""
    spends = []
    for r in runs:
        spend, why = spend_of(r)
        if spend is None:
            messages.append(f"warning: {r.name} skipped: {why}")
        else:
            spends.append(spend)
    groups = seed_groups([r for r in runs if r.name in {s.name for s in spends}])
    group_of = {m.name: first for first, members in groups.items() for m in members}
    kept = []
    cells = {}
    for s in spends:
        cells.setdefault((s.label, s.depth), []).append(s)
    for (label, depth), members in cells.items():
        by_group = Counter(group_of[s.name] for s in members)
        if len(by_group) > 1:
            main, _ = max(by_group.items(), key=lambda kv: (kv[1], kv[0]))
            dropped = [s.name for s in members if group_of[s.name] != main]
            messages.append(f"warning: {label} at depth {depth}: runs {', '.join(dropped)} differ from "
                            f"{main} in more than their seeds (another horizon or setting); left out, "
                            "compare them with --select or --baseline/--variant")
            members = [s for s in members if group_of[s.name] == main]
        kept += members
    return kept


def check_comparable(spends, messages):
    """bpb compares only on one trunk, one corpus and one tokenizer: an error line when they are mixed."""
    for what, key in (("trunks", lambda s: s.trunk), ("datasets", lambda s: s.dataset),
                      ("tokenizers", lambda s: s.tokenizer)):
        kinds = {}
        for s in spends:
            if key(s) is not None:
                kinds.setdefault(key(s), []).append(s.name)
        if len(kinds) > 1:
            listed = "; ".join(f"{k}: {', '.join(v[:3])}{' ...' if len(v) > 3 else ''}" for k, v in kinds.items())
            messages.append(f"error: mixed {what} ({listed}): bits per byte do not compare across them; "
                            "select runs of one with --select or --baseline/--variant")


def select_groups(spends, baseline_label=BASELINE_LABEL, baseline_tags=None, variant_tags=None):
    """(baseline [Spend], {variant name: [Spend]}). Given tags (a tag takes its seed runs too),
    those runs; else by connection label: the baseline's label, and every other label a variant
    of its own."""
    def pick(tags):
        return [s for s in spends if s.name in tags or tag_of(s.name) in tags]

    baseline = pick(baseline_tags) if baseline_tags is not None else [s for s in spends if s.label == baseline_label]
    if variant_tags is not None:
        return baseline, {name: pick(tags) for name, tags in variant_tags.items()}
    taken = {s.name for s in baseline}
    labels = {s.label for s in baseline} | {baseline_label}
    variants = {}
    for s in spends:
        if s.name not in taken and s.label not in labels:
            variants.setdefault(s.label, []).append(s)
    return baseline, dict(sorted(variants.items()))


def noise_sigma(cells, law):
    """(sigma of final bpb, where it came from) for one-seed intervals: the pooled seed spread
    of the cells with 2 or more seeds, else the baseline fit's residual (when it has degrees of
    freedom), else (None, why)."""
    sq, dof = 0.0, 0
    for members in cells:
        if len(members) > 1:
            values = [s.bpb for s in members]
            m = sum(values) / len(values)
            sq += sum((v - m) ** 2 for v in values)
            dof += len(values) - 1
    if dof:
        return math.sqrt(sq / dof), f"the seed spread of final bpb ({dof} degrees of freedom)"
    if law is not None and law.points > 3 and law.rms > 0:
        return law.rms * math.sqrt(law.points / (law.points - 3)), "the baseline fit's residual"
    return None, "no other seeds nor a fit with degrees of freedom to take the bpb noise from"


def _fit(points, messages, what):
    flops = [p[0] for p in points]
    try:
        return cm.fit_saturating_power_law(flops, [p[1] for p in points])
    except cm.LadderError as e:
        messages.append(f"warning: {what}: {e}")
        return None


def same_device(spends):
    """The one device set ('<name> x <count>') every run was timed on, or None."""
    devices = {s.device for s in spends}
    return devices.pop() if len(devices) == 1 and None not in devices else None


def compare(spends, baseline, variants, messages=None, resamples=400):
    """The study of `variants` ({name: [Spend]}) against `baseline` ([Spend])."""
    messages = [] if messages is None else messages
    base_cells = {}
    for s in baseline:
        base_cells.setdefault(s.depth, []).append(s)
    var_cells = {name: {} for name in variants}
    for name, members in variants.items():
        for s in members:
            var_cells[name].setdefault(s.depth, []).append(s)
    study = Study(base_cells, var_cells, messages=messages)
    if not baseline:
        messages.append("error: no finished baseline run: train the baseline ladder first, or name its runs with "
                        "--baseline TAG,TAG,... (or --baseline-label LABEL)")
        return _finish(study, {})
    if not any(variants.values()):
        messages.append("error: no finished variant run to compare with the baseline: name some with "
                        "--variant NAME=TAG,TAG,...")
        return _finish(study, {})
    check_comparable(baseline + [s for m in variants.values() for s in m], messages)
    if study.errors:
        return _finish(study, {})

    depths = sorted(base_cells)
    if len(depths) < 2:
        messages.append(f"warning: the baseline has finished runs at {len(depths)} depth "
                        f"({', '.join(map(str, depths))}): a ladder fit needs 2 or more; only the "
                        "nanochat-compatible per-tag CM (same depth) is computed")
    else:
        study.law = _fit([(s.flops, s.bpb) for s in baseline], messages, "baseline ladder (FLOPs)")
    everyone = baseline + [s for m in variants.values() for s in m]
    device = same_device(everyone)
    if device is None:
        kinds = sorted({s.device or "unrecorded" for s in everyone})
        messages.append(f"warning: wall-clock CM refused: the runs were not timed on one device set "
                        f"({'; '.join(kinds)}); "
                        "it compares seconds only on the same GPU model and count")
    elif study.law is not None and all(s.seconds for s in baseline):  # the same finals, in seconds
        study.wall_law = _fit([(s.seconds, s.bpb) for s in baseline], messages, "baseline ladder (seconds)")
    sigma, sigma_source = noise_sigma(list(base_cells.values()) + [c for v in var_cells.values() for c in v.values()],
                                      study.law)

    out = {}
    for name, cells in var_cells.items():
        if not cells:
            messages.append(f"warning: variant {name}: no finished run selected")
            continue
        shared = [d for d in cells if d in base_cells]
        if not shared:
            messages.append(f"warning: variant {name} has no depth the baseline has (variant: "
                            f"{', '.join(map(str, sorted(cells)))}; baseline: {', '.join(map(str, depths))}): "
                            "no nanochat-compatible per-tag CM")
        out[name] = _variant(study, cells, sigma, sigma_source, resamples)
    return _finish(study, out, device)


def _variant(study, cells, sigma, sigma_source, resamples):
    """One variant's JSON: its per-depth readings and its ladder-level CM."""
    law, wall_law = study.law, study.wall_law
    base_finals = [s.bpb for m in study.baseline.values() for s in m]
    points = [s for m in cells.values() for s in m]
    level = None if law is None else cm.ladder_level_cm(law, [s.flops for s in points], [s.bpb for s in points])
    if sigma is None and level is not None and len(cells) >= 2:
        # one seed everywhere and a baseline fit without residual: the variant's own scatter
        # about L(k*C) over its depths (noise, and any change of its CM with depth)
        residuals = [s.bpb - float(law.loss(level * s.flops)) for s in points]
        sigma = math.sqrt(sum(r * r for r in residuals) / (len(residuals) - 1))
        sigma_source = f"the variant's scatter about L(k·C) over its {len(cells)} depths"
    per_depth = []
    for depth in sorted(cells):
        members = cells[depth]
        row = {"depth": depth, "label": members[0].label, "runs": [s.name for s in members], "seeds": len(members),
               "bpb": _mean(s.bpb for s in members), "flops": _mean(s.flops for s in members),
               "seconds": _mean(s.seconds for s in members), "cm": None, "cm_ci": None, "cm_ci_kind": None,
               "cm_p": None, "wall_cm": None, "extrapolated": None, "nanochat_cm": None,
               "nanochat_extrapolated": None, "reconstructed": sorted({f for s in members for f in s.reconstructed})}
        if law is not None:
            readings = [cm.ladder_cm(law, base_finals, s.flops, s.bpb) for s in members]
            row["cm"] = geomean(r.cm for r in readings)
            # an anchor at or below the fit's floor a: no baseline compute reaches it (JSON has no inf)
            row["below_floor"] = any(math.isinf(r.cm) for r in readings)
            row["extrapolated"] = not (min(base_finals) <= row["bpb"] <= max(base_finals))
            iv = cm.t_interval([r.cm for r in readings])
            if iv is None and row["cm"] is not None:
                iv = cm.delta_interval(law, row["cm"], row["bpb"], sigma, sigma_source)
            if iv is not None:
                row["cm_ci"], row["cm_ci_kind"], row["cm_p"] = [iv.low, iv.high], iv.kind, iv.p
            elif row["cm"] is not None:
                row["cm_ci_kind"] = f"unknown: one seed, and {sigma_source}" if sigma is None else "unknown"
        if wall_law is not None and all(s.seconds for s in members):
            row["wall_cm"] = geomean(cm.ladder_cm(wall_law, base_finals, s.seconds, s.bpb).cm for s in members)
        if depth in study.baseline:
            row.update(_per_tag(study.baseline[depth], members))
        per_depth.append(row)

    result = {"label": per_depth[0]["label"], "per_depth": per_depth, "ladder_cm": None, "ladder_ci": None,
              "ladder_ci_kind": None, "ladder_p": None, "wall_ladder_cm": None}
    if law is not None:
        result["ladder_cm"] = level
        iv = _ladder_interval(study, cells, per_depth, resamples)
        if iv is not None:
            result["ladder_ci"], result["ladder_ci_kind"], result["ladder_p"] = [iv.low, iv.high], iv.kind, iv.p
    if wall_law is not None and all(s.seconds for s in points):
        result["wall_ladder_cm"] = cm.ladder_level_cm(wall_law, [s.seconds for s in points], [s.bpb for s in points])
    return result


def _per_tag(base_members, members):
    """nanochat's per-tag reading of each variant seed against the baseline seed of the same
    seeds (else the baseline's first), geometric mean over seeds; flagged if any extrapolates."""
    by_seed = {s.seed: s for s in base_members}
    readings = []
    for s in members:
        base = by_seed.get(s.seed, base_members[0])
        r = cm.per_tag_cm(base.curve, s.bpb, s.flops)
        if r is not None:
            readings.append(r)
    if not readings:
        return {}
    return {"nanochat_cm": geomean(r.cm for r in readings),
            "nanochat_extrapolated": any(r.extrapolated for r in readings)}


def _ladder_interval(study, cells, per_depth, resamples):
    """The ladder-level CM's interval: a bootstrap over seeds (baseline and variant resampled
    within each depth, the baseline refitted each time) when some depth has 2 or more seeds;
    else, with one seed per depth, the t-interval of ln CM across depths (their spread)."""
    groups = list(study.baseline.values()) + list(cells.values())
    if any(len(g) > 1 for g in groups):
        nb = len(study.baseline)

        def statistic(drawn):
            base = [s for g in drawn[:nb] for s in g]
            var = [s for g in drawn[nb:] for s in g]
            try:
                law = cm.fit_saturating_power_law([s.flops for s in base], [s.bpb for s in base])
            except cm.LadderError:
                return None
            return cm.ladder_level_cm(law, [s.flops for s in var], [s.bpb for s in var])

        return cm.bootstrap_interval(statistic, groups, resamples=resamples)
    iv = cm.t_interval([row["cm"] for row in per_depth])
    if iv is None:
        return None
    return cm.Interval(iv.low, iv.high, f"t over {len(per_depth)} depths of ln CM (one seed each: their spread)", iv.p)


def _finish(study, variants, device=None):
    """Holm-Bonferroni over the variants' ladder-level CMs, and over every (variant, depth)
    CM, for saying which gains exceed the seed noise; then the JSON."""
    ladder = [(name, v) for name, v in variants.items() if v.get("ladder_p") is not None]
    flags = holm([v["ladder_p"] for _, v in ladder])
    for (name, v), flag in zip(ladder, flags):
        v["beyond_noise"] = flag
    rows = [row for v in variants.values() for row in v["per_depth"] if row.get("cm_p") is not None]
    for row, flag in zip(rows, holm([row["cm_p"] for row in rows])):
        row["beyond_noise"] = flag
    law = study.law
    study.result = {
        "baseline": {"runs": sorted(s.name for m in study.baseline.values() for s in m),
                     "depths": sorted(study.baseline),
                     "fit": None if law is None else {"a": law.a, "b": law.b, "c": law.c, "points": law.points,
                                                      "fixed": law.fixed, "note": law.note, "rms": law.rms},
                     "wall_fit": None if study.wall_law is None else {
                         "a": study.wall_law.a, "b": study.wall_law.b, "c": study.wall_law.c}},
        "device": device,
        "holm": {"ladder_family": len(ladder), "per_depth_family": len(rows)},
        "variants": variants,
        "messages": list(study.messages),
    }
    return study
