"""Markdown cells and tables of the report: a dash for a value no run file holds, n/a for one
the method does not have; and the numbers the plan and the training log print (durations,
counts, FLOPs)."""

import math

from nanochat.studies.stats import summarize

MISSING = "—"
# A measure that does not exist for a run's method (the doubly-stochastic and stream measures
# of Attention Residuals, a baseline without streams or H_res), not one that is missing.
NOT_APPLICABLE = "n/a"


def fmt(value, spec=".3f"):
    return MISSING if value is None else format(value, spec)


def signed(value, spec=".2f"):
    return MISSING if value is None else format(value, "+" + spec)


def md_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def relative_pct(value, reference):
    if value is None or not reference:
        return None
    return 100.0 * (value / reference - 1.0)


def fmt_seeds(values, spec=".3f"):
    """One cell for a row's values over seeds: the value itself for one seed, else
    'mean ± std (n=k)' (sample std); a dash when no seed holds a value."""
    s = summarize(values)
    if s is None:
        return MISSING
    if s.n == 1:
        return format(s.mean, spec)
    return f"{s.mean:{spec}} ± {s.std:{finer(spec)}} (n={s.n})"


def finer(spec):
    """A fixed-point spec with one more decimal (".3f" -> ".4f"): seed noise and the
    differences it is weighed against sit a digit below the values themselves."""
    digits = int(spec[1:-1])
    return f".{digits + 1}f"


def fmt_diff(d, spec=".3f"):
    """A paired difference with its 95 % interval, or 'unknown' in place of the interval."""
    if d is None:
        return MISSING
    spec = finer(spec)
    if not d.known:
        return f"{d.mean:+{spec}} [interval unknown: 1 seed]"
    return f"{d.mean:+{spec}} [{d.low:+{spec}}, {d.high:+{spec}}] (n={d.n})"


def format_duration(seconds):
    """4h05m, 12m30s or 45s; a dash when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    seconds = round(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def format_count(value):
    """1.25B, 3.40M, 2.00K, and below a thousand three significant digits (51.0, 0.5)."""
    if value is None:
        return "—"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= size:
            return f"{value / size:.2f}{unit}"
    return f"{value:.3g}"


def format_flops(value):
    return "—" if value is None else f"{value:.2e}"
