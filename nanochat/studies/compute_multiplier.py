"""The compute multiplier (CM): how much baseline compute buys a variant's quality.

Pure math over numbers a run records (final bpb, training FLOPs, training seconds, the val
curve); no files. scripts/compare.py and the report's "Compute multiplier" section call it.

Three readings (see docs/compute_multiplier.md):
- ladder-final CM (the default): the baseline's final (C, bpb) points over its depth ladder
  fitted as L(C) = a + b*C^-c; a variant final (C_v, y_v) reads CM = L^-1(y_v) / C_v. Only
  finished, fully scheduled runs enter, so the warmdown is in every point.
- wall-clock CM: the same with training seconds in place of FLOPs.
- nanochat-compatible per-tag CM: nanochat PR #800's reading (scripts/compare.py there):
  the baseline's eval curve of the same depth as straight segments in (ln FLOPs, ln bpb),
  the first segment that crosses the anchor, the boundary segment extended (and flagged)
  outside the curve. Kept beside ours for comparison: on warmup-stable-decay schedules it
  reads a better variant through the last warmdown segment extended, so it is biased (on
  the LR-annealing curves of tests/cm_curves.py, true CM 1.22: 1.16-1.38 across depths).

The fit is least squares in bpb. For a fixed exponent c the model is linear in (a, b), so
the fit profiles over c (a log grid, then a golden-section refinement) with (a, b) in
closed form, a >= 0 and b > 0. numpy only: scipy is not a dependency of the project.
"""

import math
from dataclasses import dataclass

import numpy as np

from nanochat.studies.stats import t_975, t_pvalue

C_GRID = np.geomspace(1e-3, 3.0, 400)  # exponents c searched; loss-compute exponents sit near 0.05-0.5
GOLDEN = (math.sqrt(5) - 1) / 2


class LadderError(ValueError):
    """The points cannot give the fit asked for; the message says what can still be done."""


@dataclass(frozen=True)
class PowerLaw:
    """L(C) = a + b*C^-c, fitted to `points` distinct compute values. `fixed` names what was
    not fitted ('' for the full fit, 'a = 0' for a pure power law, 'a = <value>' for a given
    floor) and `note` why; `rms` is the root-mean-square residual in bpb."""
    a: float
    b: float
    c: float
    points: int = 0
    fixed: str = ""
    rms: float = 0.0
    note: str = ""

    def loss(self, C):
        """The loss at compute C (a number or an array)."""
        return self.a + self.b * np.power(np.asarray(C, dtype=float), -self.c)

    def compute_for(self, L):
        """The compute at which the curve reaches loss L: (b / (L - a))^(1/c); inf at or below
        the floor a (the baseline never gets there)."""
        if L <= self.a:
            return math.inf
        return math.exp((math.log(self.b) - math.log(L - self.a)) / self.c)

    def slope(self, L):
        """-dL/d ln C at loss L: c * (L - a), the bpb bought by e-fold compute there."""
        return self.c * (L - self.a)

    def describe(self):
        how = "full fit" if not self.fixed else f"{self.fixed} fixed" + (f": {self.note}" if self.note else "")
        return (f"L(C) = {self.a:.4f} + {self.b:.4g}·C^-{self.c:.4f} ({how}, {self.points} compute values, "
                f"rms {self.rms:.2g})")


def _fit_linear(x, y, floor):
    """Least squares of y = a + b*x for each row of x (G, n): (a, b, sse) arrays, with a >= 0
    (or a = floor) and b > 0; sse is inf where b <= 0 (the points do not fall with x)."""
    if floor is None:
        xm, ym = x.mean(axis=1, keepdims=True), y.mean()
        sxx = ((x - xm) ** 2).sum(axis=1)
        b = np.where(sxx > 0, ((x - xm) * (y - ym)).sum(axis=1) / np.where(sxx > 0, sxx, 1), 0.0)
        a = ym - b * xm[:, 0]
        # a negative floor is no floor: refit those rows with a = 0
        b = np.where(a < 0, (y * x).sum(axis=1) / (x * x).sum(axis=1), b)
        a = np.maximum(a, 0.0)
    else:
        a = np.full(x.shape[0], float(floor))
        b = ((y - floor) * x).sum(axis=1) / (x * x).sum(axis=1)
    sse = ((a[:, None] + b[:, None] * x - y) ** 2).sum(axis=1)
    return a, b, np.where(b > 0, sse, np.inf)


def fit_saturating_power_law(flops, bpb, floor=None):
    """Fit L(C) = a + b*C^-c to final (FLOPs, bpb) points (several seeds of one size may share
    a FLOPs value). Needs 2 distinct FLOPs values: with 2 it fits what 2 points determine, a
    pure power law (a = 0; or the given floor), and says so in `fixed`; with 3 or more the
    full fit (with exactly 3 it passes through them: no residual is left to judge it by)."""
    C = np.asarray(flops, dtype=float)
    y = np.asarray(bpb, dtype=float)
    if C.shape != y.shape or C.ndim != 1:
        raise LadderError("flops and bpb must be two lists of the same length")
    if not (np.all(np.isfinite(C)) and np.all(C > 0) and np.all(np.isfinite(y)) and np.all(y > 0)):
        raise LadderError("every point needs a positive, finite FLOPs count and bpb")
    distinct = len(np.unique(C))
    if distinct < 2:
        raise LadderError(f"a ladder fit needs final points at 2 or more compute values (got {distinct}); "
                          "only a per-tag reading against the eval curve of the same depth is possible")
    if np.polyfit(np.log(C), y, 1)[0] >= 0:  # a floor or a pure power law would fit a rise as flat
        raise LadderError("the baseline's final bpb does not fall as compute grows: no a + b·C^-c fits it")
    fixed, note = "", ""
    if floor is not None:
        fixed, note = f"a = {floor:g}", "given"
    elif distinct == 2:
        floor, fixed, note = 0.0, "a = 0", "2 compute values determine a pure power law only"
    if floor is not None and np.any(y <= floor):
        raise LadderError(f"the floor a = {floor:g} is not below every bpb")
    scale = math.exp(np.log(C).mean())  # fit in C / scale: b stays of order one
    lx = np.log(C / scale)

    def fit(cs):
        return _fit_linear(np.exp(-np.outer(cs, lx)), y, floor)

    errors = fit(C_GRID)[2]
    i = int(np.argmin(errors))
    if not math.isfinite(errors[i]):
        raise LadderError("the baseline's final bpb does not fall as compute grows: no a + b·C^-c fits it")
    lo, hi = math.log(C_GRID[max(i - 1, 0)]), math.log(C_GRID[min(i + 1, len(C_GRID) - 1)])
    lo, hi = _golden(lambda u: fit(np.array([math.exp(u)]))[2][0], lo, hi)
    c = math.exp((lo + hi) / 2)
    a, b, err = (float(v[0]) for v in fit(np.array([c])))
    if floor is None and a == 0.0:
        fixed, note = "a = 0", "the free fit wanted a < 0"
    return PowerLaw(a=a, b=b * scale ** c, c=c, points=distinct, fixed=fixed, rms=math.sqrt(err / len(y)),
                    note=note)


def _golden(f, lo, hi, tol=1e-10):
    """The bracket [lo, hi] shrunk by golden sections onto a minimum of f."""
    x1, x2 = hi - GOLDEN * (hi - lo), lo + GOLDEN * (hi - lo)
    f1, f2 = f(x1), f(x2)
    while hi - lo > tol:
        if f1 <= f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - GOLDEN * (hi - lo)
            f1 = f(x1)
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + GOLDEN * (hi - lo)
            f2 = f(x2)
    return lo, hi


# ------------------------------------------------------------------------------------------
# Readings

@dataclass(frozen=True)
class Reading:
    """One CM reading: the baseline's compute to reach the anchor, over the variant's own."""
    cm: float
    anchor: float  # the variant's bpb
    baseline_compute: float
    variant_compute: float
    extrapolated: bool


def ladder_cm(law, baseline_bpb, compute, bpb):
    """The ladder-final reading of one variant point (compute, bpb) against the baseline's
    fitted finals; extrapolated when the anchor is outside the baseline finals' bpb range."""
    need = law.compute_for(bpb)
    extrapolated = not (min(baseline_bpb) <= bpb <= max(baseline_bpb))
    return Reading(need / compute, bpb, need, compute, extrapolated)


def ladder_level_cm(law, compute, bpb):
    """One multiplier k for a variant's whole ladder: the k that minimises
    sum (y_d - L(k*C_d))^2 over its points, a least-squares reading that stays finite where
    one point sits below the baseline's floor."""
    C = np.asarray(compute, dtype=float)
    y = np.asarray(bpb, dtype=float)

    def sse(u):
        return float(((y - law.loss(C * math.exp(u))) ** 2).sum())

    grid = np.linspace(-12, 12, 481)
    i = int(np.argmin(((y - law.loss(np.outer(np.exp(grid), C))) ** 2).sum(axis=1)))
    lo, hi = _golden(sse, grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)])
    return math.exp((lo + hi) / 2)


def solve_segment(p0, p1, bpb):
    """The compute at which the straight line through p0, p1 in (ln compute, ln bpb) reaches
    bpb (interpolation or extrapolation alike)."""
    (f0, b0), (f1, b1) = p0, p1
    w = (math.log(b0) - math.log(bpb)) / (math.log(b0) - math.log(b1))
    return math.exp((1 - w) * math.log(f0) + w * math.log(f1))


def curve_compute_at(points, bpb):
    """(compute, extrapolated) where the curve [(compute, bpb)] in log order first reaches bpb,
    or None for a degenerate curve (fewer than 2 points, a flat boundary segment). The first
    segment with b1 <= bpb <= b0 wins; outside it the first segment (bpb above the first point)
    or the last one (anything else) is extended: nanochat PR #800's eflops_at_bpb."""
    if len(points) < 2:
        return None
    for (f0, b0), (f1, b1) in zip(points, points[1:]):
        if b1 <= bpb <= b0 and b0 != b1:
            return solve_segment((f0, b0), (f1, b1), bpb), False
    segment = (points[0], points[1]) if bpb > points[0][1] else (points[-2], points[-1])
    if segment[0][1] == segment[1][1]:
        return None
    return solve_segment(*segment, bpb), True


def per_tag_cm(curve, bpb, compute):
    """nanochat's per-tag CM of a variant final (compute, bpb) against the baseline's eval curve
    of the same depth, [(compute, bpb)] in log order with step > 0 and compute > 0; None when
    that curve is degenerate. No rounding (nanochat rounds the printed FLOPs)."""
    points = [(f, b) for f, b in curve if f > 0]
    found = curve_compute_at(points, bpb)
    if found is None:
        return None
    need, extrapolated = found
    return Reading(need / compute, bpb, need, compute, extrapolated)


# ------------------------------------------------------------------------------------------
# Intervals

@dataclass(frozen=True)
class Interval:
    """A 95 % interval of a CM, how it was obtained (`kind`), and the two-sided p-value of
    'CM = 1' where the method gives one."""
    low: float
    high: float
    kind: str
    p: float | None = None

    @property
    def beyond_noise(self):
        return self.low > 1 or self.high < 1


def t_interval(cms):
    """The t-interval over seeds of ln CM (2 or more finite values), or None."""
    logs = [math.log(v) for v in cms if v is not None and 0 < v < math.inf]
    if len(logs) < 2:
        return None
    n = len(logs)
    mean = sum(logs) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / (n - 1))
    half = t_975(n - 1) * sd / math.sqrt(n)
    p = t_pvalue(mean / (sd / math.sqrt(n)), n - 1) if sd > 0 else (0.0 if mean else 1.0)
    return Interval(math.exp(mean - half), math.exp(mean + half), f"t over {n} seeds of ln CM", p)


def delta_interval(law, cm, bpb, sigma_bpb, source):
    """One seed: sigma(ln CM) ~ sigma_bpb / |dL/d ln C| at the anchor (the delta method), a
    stated estimate with the bpb noise taken from `source`."""
    slope = law.slope(bpb)
    if cm is None or not (0 < cm < math.inf) or not sigma_bpb or slope <= 0:
        return None
    half = 1.959964 * sigma_bpb / slope
    if half > 20:  # the curve is flat at the anchor: any multiplier fits the noise
        return None
    z = math.log(cm) / (sigma_bpb / slope)
    p = math.erfc(abs(z) / math.sqrt(2))
    return Interval(cm * math.exp(-half), cm * math.exp(half),
                    f"estimate: one seed, σ_bpb {sigma_bpb:.2g} from {source}", p)


def bootstrap_interval(statistic, groups, resamples=400, seed=0):
    """Percentile interval of statistic(resampled groups) where each group (a list of seed
    records) is resampled with replacement; statistic returns a CM or None. The p-value is
    twice the smaller share of resamples on either side of 1."""
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(resamples):
        drawn = [[g[j] for j in rng.integers(0, len(g), len(g))] for g in groups]
        v = statistic(drawn)
        if v is not None and 0 < v < math.inf:
            values.append(v)
    if len(values) < resamples // 2:
        return None
    logs = np.log(values)
    low, high = np.exp(np.percentile(logs, [2.5, 97.5]))
    side = min((logs <= 0).mean(), (logs >= 0).mean())
    return Interval(float(low), float(high), f"bootstrap over seeds ({len(values)} resamples)", min(1.0, 2 * side))
