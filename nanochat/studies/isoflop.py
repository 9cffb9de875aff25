"""The iso-FLOP grid: per FLOPs budget, the compute-optimal model size of each variant, the
frontier those optima trace, and the compute multiplier along it.

Chinchilla's approach 2 (Hoffmann et al. 2022, section 3.2), as nanochat's runs/scaling_laws.sh
uses it: every run of a budget spends the same training FLOPs at another depth; final val bpb
against x = ln(params) is fitted with a parabola bpb = p2*x^2 + p1*x + p0, whose vertex
x* = -p1 / (2*p2) is the compute-optimal size N*(C) and its value the best bpb L*(C) at that
budget. Params are the scaling parameters (transformer matrices and lm_head, the count the
ladder's data ratio uses), so every variant of a depth sits at the same x and only the bpb
differs. A vertex outside the sizes trained is flagged (the U is not bracketed); a parabola
that opens downwards has no minimum, and the budget's best trained point stands in, flagged.

The CM along the frontier: the baseline's frontier points (C, L*(C)) fitted with
`compute_multiplier.fit_saturating_power_law`; a variant's optimum at budget C reads
CM = L_b^-1(L*_v(C)) / C, as the ladder-final CM reads a final run.

Pure functions over numbers; `grid_points` turns report Runs (config.toml, summary.json) into them.
"""

import math
from dataclasses import dataclass

import numpy as np

from nanochat.studies.compute_multiplier import fit_saturating_power_law, ladder_cm


@dataclass(frozen=True)
class Parabola:
    """bpb = p2*x^2 + p1*x + p0 with x = ln(params)."""
    p2: float
    p1: float
    p0: float

    def __call__(self, x):
        return self.p2 * x * x + self.p1 * x + self.p0

    @property
    def vertex(self):
        """x of the minimum; None when the parabola opens downwards (or is a line)."""
        return -self.p1 / (2 * self.p2) if self.p2 > 0 else None


def fit_parabola(params, bpb):
    """Least-squares parabola of bpb in ln(params); ValueError with fewer than 3 sizes."""
    x = np.log(np.asarray(params, dtype=float))
    if len(np.unique(x)) < 3:
        raise ValueError(f"a parabola needs 3 or more model sizes per budget (got {len(np.unique(x))})")
    p2, p1, p0 = np.polyfit(x, np.asarray(bpb, dtype=float), 2)
    return Parabola(float(p2), float(p1), float(p0))


@dataclass(frozen=True)
class Optimum:
    """The compute-optimal point of one variant at one budget."""
    label: str
    budget: float
    params: float  # N*: exp of the vertex (or the best trained size, see `fitted`)
    bpb: float  # L*: the parabola at its vertex (or the best trained bpb)
    sizes: int  # distinct model sizes the budget trained
    fitted: bool  # False: no minimum in the fit, the best trained point stands in
    extrapolated: bool  # the vertex lies outside the sizes trained
    parabola: Parabola | None = None


def optimum(label, budget, points):
    """The optimum of one budget from its (params, bpb, ...) points (seeds of a size may repeat)."""
    params = [p[0] for p in points]
    bpb = [p[1] for p in points]
    fit = fit_parabola(params, bpb)
    best = int(np.argmin(bpb))
    if fit.vertex is None:
        return Optimum(label, budget, params[best], bpb[best], len(set(params)), False, True, fit)
    x = fit.vertex
    inside = math.log(min(params)) <= x <= math.log(max(params))
    return Optimum(label, budget, math.exp(x), fit(x), len(set(params)), True, not inside, fit)


def frontier(points, notes=None):
    """{label: [Optimum, ...] by budget} from {(label, budget): [(params, bpb, ...), ...]}. A budget
    with fewer than 3 sizes is left out, with a line in `notes` (a list) when given."""
    out = {}
    for (label, budget), pts in sorted(points.items()):
        try:
            out.setdefault(label, []).append(optimum(label, budget, pts))
        except ValueError as e:
            if notes is not None:
                notes.append(f"{label} at {budget:.3g} FLOPs left out: {e}")
    return {label: opts for label, opts in out.items() if opts}


@dataclass(frozen=True)
class FrontierCM:
    label: str
    budget: float
    bpb: float  # the variant's L* at this budget
    cm: float  # baseline FLOPs to reach that bpb on its frontier, over the budget
    extrapolated: bool  # L* outside the baseline frontier's bpb range (or an optimum flagged above)


def frontier_cm(baseline, variant):
    """The CM along the frontier: each optimum of `variant` read against the baseline's frontier
    (lists of Optimum). Raises LadderError when the baseline has fewer than 2 budgets."""
    law = fit_saturating_power_law([o.budget for o in baseline], [o.bpb for o in baseline])
    lows = [o.bpb for o in baseline]
    out = []
    for o in variant:
        r = ladder_cm(law, lows, o.budget, o.bpb)
        out.append(FrontierCM(o.label, o.budget, o.bpb, r.cm, r.extrapolated or o.extrapolated or not o.fitted))
    return law, out


def scaling_params(summary):
    """nanochat's scaling count of a run (summary.json's params): transformer matrices + lm_head."""
    p = (summary or {}).get("params") or {}
    if p.get("transformer_matrices") is None or p.get("lm_head") is None:
        return None
    return p["transformer_matrices"] + p["lm_head"]


def is_grid_run(run):
    """A run of the iso-FLOP grid: trained to a FLOPs budget (config target_flops > 0 and no
    explicit steps). The ladder's readings leave these out: a grid has several runs per depth."""
    return (run.config.get("target_flops") or -1) > 0 and (run.config.get("num_iterations") or -1) <= 0


def grid_points(runs, label_of):
    """{(label, budget): [(params, final val bpb, depth), ...]} of the finished grid runs
    (`is_grid_run`), and the names of those left out because they are unfinished or lack a value."""
    points, skipped = {}, []
    for r in runs:
        if not is_grid_run(r):
            continue
        budget = r.config["target_flops"]
        params, bpb = scaling_params(r.summary), (r.summary or {}).get("val_bpb")
        if not r.complete or params is None or bpb is None:
            skipped.append(r.name)
            continue
        points.setdefault((label_of(r), float(budget)), []).append((float(params), float(bpb), r.depth))
    return points, skipped
