"""Is a difference real? Each variant's paired difference to the residual baseline and to
mHC over the seeds both rows hold, with a 95 % interval, and the sentence that says which
differences exceed the seed noise and which do not.

Pairs are runs with the same (init seed, data-order seed): the same seed gives two variants
the same data order and, for the shared layers, the same random stream, so pairing removes
the part of the noise they share. One pair leaves the interval unknown, and the report says
so rather than guessing a noise level.
"""

from nanochat import connections
from nanochat.report.format import MISSING, finer, fmt_diff, md_table
from nanochat.report.runs import core_score, is_main, method_label, method_order, seeds_of, train_loss, val_bpb
from nanochat.studies.stats import holm, paired_diff
from nanochat.report.tables import row_members, row_name, row_runs

REFERENCES = ("residual", "mhc")  # the baseline, and the method KromHC sets out to replace
MAIN_METRICS = (("train loss", train_loss, ".3f"), ("val BPB", val_bpb, ".3f"),
                ("CORE", lambda r: core_score(r)[0], ".2f"))
# nanochat's repeat runs of one config (its d12/d20 reports) put CORE's seed-to-seed std near
# 0.006, 0.6 on the paper's x100 scale: the scale a one-seed difference must be read against.
NANOCHAT_CORE_STD = 0.6


def by_seed(members, metric):
    return {seeds_of(m): metric(m) for m in members}


def reference_rows(runs, depth, groups):
    """{variant: members} of the reference rows (REFERENCES) at this depth."""
    out = {}
    for r in row_runs(runs, groups):
        if r.depth == depth and r.found and is_main(r) and r.variant in REFERENCES and r.variant not in out:
            out[r.variant] = row_members(r, groups)
    return out


def comparisons(runs, depth, groups, metrics):
    """[(members, {(reference variant, metric label): PairedDiff or None})] for every main row."""
    refs = reference_rows(runs, depth, groups)
    out = []
    for r in sorted((r for r in row_runs(runs, groups) if r.depth == depth and r.found and is_main(r)),
                    key=method_order):
        members = row_members(r, groups)
        diffs = {}
        for variant, ref in refs.items():
            # A reference row is compared with the references before it only: residual - mHC
            # would repeat mHC - residual.
            if ref[0] is members[0] or (r.variant in REFERENCES and REFERENCES.index(r.variant) < REFERENCES.index(variant)):
                continue
            for label, metric, _ in metrics:
                diffs[(variant, label)] = paired_diff(by_seed(members, metric), by_seed(ref, metric))
        out.append((members, diffs))
    return out


ONE_SEED = ("- One seed per row: none of these differences can be told from seed noise (intervals unknown). "
            "Train with SEEDS=k, k >= 2, for intervals; nanochat's repeat runs put CORE's seed-to-seed "
            f"standard deviation near {NANOCHAT_CORE_STD} on this scale.")


def noise_sentence(items, specs):
    """One sentence from [(text, metric label, PairedDiff or None)]: the differences beyond
    the seed noise, those within it, and those whose interval is unknown. With several
    differences, 'beyond' is Holm-Bonferroni's verdict over all of them at 5 %: each
    interval alone would find some difference beyond the noise by chance."""
    beyond, within, unknown = [], [], []
    tested = [d for _, _, d in items if d is not None and d.known]
    verdict = dict(zip(map(id, tested), holm([d.p for d in tested])))
    for text, label, d in items:
        if d is None:
            continue
        value = f"{text} ({d.mean:+{finer(specs[label])}})"
        (beyond if d.known and verdict[id(d)] else within if d.known else unknown).append(value)
    if not (beyond or within):
        return ONE_SEED if unknown else "- No two rows to compare here."
    family = f"Holm-Bonferroni over the {len(tested)} differences with an interval here, 5 % family-wise"
    parts = []
    if beyond:
        parts.append(f"exceed the seed noise ({family}): " + "; ".join(beyond))
    if within:
        parts.append("do not exceed it (after the same correction; an interval that holds zero never does): "
                     + "; ".join(within))
    if unknown:
        parts.append("have one seed pair only (interval unknown): " + "; ".join(unknown))
    return "- Differences that " + ". Differences that ".join(parts) + "."


def seed_table(runs, depth, groups, metrics=MAIN_METRICS):
    """Each row's paired differences to the residual and mHC rows of its depth, with the
    sentence under it; None when there is nothing to compare."""
    rows_and_diffs = comparisons(runs, depth, groups, metrics)
    refs = [v for v in REFERENCES if any(k[0] == v for _, diffs in rows_and_diffs for k in diffs)]
    if not refs:
        return None
    specs = {label: spec for label, _, spec in metrics}
    if all(len(members) == 1 for members, _ in rows_and_diffs):
        return ONE_SEED  # the table above already holds every difference
    header = ["Method", "Run", "Seeds"] + [f"Δ {label} vs {connections.label(v)}" for v in refs
                                          for label, _, _ in metrics]
    rows, items = [], []
    for members, diffs in rows_and_diffs:
        r = members[0]
        cells = [method_label(r), row_name(members), str(len(members))]
        for v in refs:
            for label, _, spec in metrics:
                if (v, label) not in diffs:
                    cells.append("--" if r.variant == v else MISSING)
                    continue
                d = diffs[(v, label)]
                cells.append(fmt_diff(d, spec))
                items.append((f"{method_label(r)} − {connections.label(v)} {label}", label, d))
        rows.append(cells)
    notes = ["- Δ = this row minus the reference row, averaged over the seeds both hold (paired by init and "
             "data-order seed); in brackets its 95 % interval, mean ± t(0.975, n−1)·sd/√n, for that difference "
             "alone. Which differences exceed the seed noise is decided over the whole table with "
             "Holm-Bonferroni (paired t-tests), so that many comparisons do not find one by chance.",
             noise_sentence(items, specs)]
    return md_table(header, rows) + "\n\n" + "\n".join(notes)


def task_sentence(runs, depth, groups, average):
    """The sentence under a task table: each row's Avg against the residual and mHC rows."""
    metrics = (("Avg", average, ".1f"),)
    items = []
    for members, diffs in comparisons(runs, depth, groups, metrics):
        for (v, label), d in diffs.items():
            items.append((f"{method_label(members[0])} − {connections.label(v)} {label}", label, d))
    return noise_sentence(items, {"Avg": ".1f"})
