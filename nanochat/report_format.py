"""Markdown cells and tables of the report: a dash for a value no run file holds."""

MISSING = "—"


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
