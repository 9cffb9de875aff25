"""Statistics over seeds: mean, sample standard deviation, and the 95 % interval of a paired
difference (Student's t), for telling a difference between variants from seed noise.

scipy is not a dependency for one quantile, so t_{0.975, df} comes from a table for df <= 30
(the two-sided 5 % critical values of the NIST/SEMATECH e-Handbook of Statistical Methods,
section 1.3.6.7.2, "Critical values of the Student's t distribution") and from the
Cornish-Fisher expansion of the t quantile in terms of the normal one beyond (Abramowitz &
Stegun 26.7.5), which agrees with the table to 0.001 from df = 30 on.
"""

import math
import statistics
from dataclasses import dataclass

T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
Z_975 = 1.959964


def t_975(df):
    """The 0.975 quantile of Student's t with df degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1 (got {df})")
    if df <= len(T_975):
        return T_975[df - 1]
    z = Z_975
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


@dataclass
class Summary:
    """Mean, sample std (None for one value) and count of some values."""
    mean: float
    std: float | None
    n: int


def geomean(values):
    """The geometric mean of the positive, finite values given (None and the rest skipped: a
    missing or unreachable reading), or None when there is none."""
    values = [v for v in values if v is not None and 0 < v < math.inf]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summarize(values):
    """Summary of the values that are not None, or None when there are none."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return Summary(statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None, len(values))


@dataclass
class PairedDiff:
    """Mean of per-seed differences a - b, with its 95 % interval (None with one pair)."""
    mean: float
    low: float | None
    high: float | None
    n: int

    @property
    def known(self):
        return self.low is not None

    @property
    def beyond_noise(self):
        """The interval excludes zero (one comparison alone; see holm for several)."""
        return self.known and (self.low > 0 or self.high < 0)

    @property
    def p(self):
        """Two-sided p-value of the paired t-test of a zero mean (None with one pair)."""
        if not self.known:
            return None
        se = (self.high - self.low) / 2 / t_975(self.n - 1)
        if se == 0:
            return 0.0 if self.mean else 1.0
        return t_pvalue(self.mean / se, self.n - 1)


def paired_diff(a, b):
    """a and b map a seed to a value; the differences of the seeds both hold, or None."""
    diffs = [a[s] - b[s] for s in a if s in b and a[s] is not None and b[s] is not None]
    if not diffs:
        return None
    mean = statistics.fmean(diffs)
    if len(diffs) == 1:
        return PairedDiff(mean, None, None, 1)
    half = t_975(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return PairedDiff(mean, mean - half, mean + half, len(diffs))


def t_pvalue(t, df):
    """Two-sided p-value of Student's t statistic with integer df >= 1, exact: the finite
    series of Abramowitz & Stegun 26.7.3 (odd df) and 26.7.4 (even df) for P(|T| < t)."""
    if df < 1 or int(df) != df:
        raise ValueError(f"degrees of freedom must be a positive integer (got {df})")
    if math.isinf(t):
        return 0.0
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2:  # odd: 2/pi * (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...))
        term, total = 1.0, 0.0
        if df > 1:
            total = term
            for k in range(1, (df - 3) // 2 + 1):
                term *= c2 * (2 * k) / (2 * k + 1)
                total += term
        inside = 2 / math.pi * (theta + s * math.cos(theta) * total)
    else:  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
        term, total = 1.0, 1.0
        for k in range(1, (df - 2) // 2 + 1):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        inside = s * total
    return min(1.0, max(0.0, 1.0 - inside))


def holm(pvalues, alpha=0.05):
    """Holm-Bonferroni: which of m hypotheses are rejected at family-wise level alpha. The
    i-th smallest p-value (i from 0) must be <= alpha / (m - i), and every smaller one too."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    rejected = [False] * len(pvalues)
    for rank, i in enumerate(order):
        if pvalues[i] > alpha / (len(pvalues) - rank):
            break
        rejected[i] = True
    return rejected
