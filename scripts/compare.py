"""What is a connection worth? Compute multipliers of variants over a baseline, from finished
runs (config.toml, summary.json, metrics.jsonl; no checkpoint).

    python -m scripts.compare --runs-root DIR [--select GLOB] [--trunk 2026-01|2026-07] [--baseline TAG,TAG,...]
        [--variant NAME=TAG,TAG,... (repeatable)] [--baseline-label residual] [--json PATH] [--out DIR]

Runs of one trunk only (config.toml's `trunk`; docs/trunks.md): --trunk picks them, and runs of
two trunks without it are refused.

Without --baseline/--variant the runs under DIR whose names match --select (default `*`) group
by connection label: the baseline label's runs (default residual) are the baseline, every other
label a variant. A tag also takes its seed runs (`<tag>_s<k>`, `<tag>_s<k>_data`), and the
seeds of one (variant, depth) pool. Per variant and depth: the ladder-final CM (default; the
baseline's finals fitted as a + b·C^-c), the wall-clock CM (training seconds; same device set
only), nanochat's per-tag CM (PR #800's reading, unrounded), intervals from seeds, one
ladder-level CM per variant, Holm-Bonferroni across variants. Prints a table, writes
compare.md and two figures into --out (default: DIR) and, with --json, per variant:
{"label", "ladder_cm", "ladder_ci", "ladder_ci_kind", "ladder_p", "beyond_noise",
"wall_ladder_cm", "per_depth": [{"depth", "seeds", "bpb", "flops", "seconds", "cm", "cm_ci",
"wall_cm", "nanochat_cm", "extrapolated", "nanochat_extrapolated", ...}]} under "variants",
beside "baseline" (its runs and fit), "device" and "messages".
"""

import argparse
import json
import re
import sys
from pathlib import Path

from nanochat import trunks
from nanochat.cli import positive_int, run
from nanochat.common import text_table
from nanochat.report.cm import compare, pool, select_groups
from nanochat.report.cm_section import MEANINGS, markdown, write_figures
from nanochat.report.compute import tag_of
from nanochat.report.runs import load_run, one_trunk, select_runs

NAME = re.compile(r"^[A-Za-z0-9_.+()= -]+$")


def tags(text):
    values = [t.strip() for t in text.split(",") if t.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected TAG,TAG,... (got {text!r})")
    return values


def variant_spec(text):
    name, sep, rest = text.partition("=")
    if not sep or not name.strip() or not NAME.match(name.strip()):
        raise argparse.ArgumentTypeError(f"expected NAME=TAG,TAG,... (got {text!r}), e.g. kromhc=d6_kromhc,d8_kromhc")
    return name.strip(), tags(rest)


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m scripts.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs-root", metavar="DIR", help="directory of run directories (default: <base dir>/runs)")
    parser.add_argument("--select", default="*", metavar="GLOB", help="only runs whose name matches (default: *)")
    parser.add_argument("--trunk", choices=trunks.TRUNKS,
                        help="only the runs of this trunk (default: the runs' one trunk; runs of two are refused)")
    parser.add_argument("--baseline", type=tags, metavar="TAG,TAG,...", help="the baseline's runs (default: by label)")
    parser.add_argument("--variant", type=variant_spec, action="append", metavar="NAME=TAG,TAG,...",
                        help="a variant's runs (repeatable; default: every label but the baseline's)")
    parser.add_argument("--baseline-label", default="residual", metavar="LABEL",
                        help="connection label of the baseline when runs are picked by label (default: residual)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    parser.add_argument("--out", metavar="DIR", help="where compare.md and the figures go (default: the runs root)")
    parser.add_argument("--resamples", type=positive_int(), default=400, metavar="N",
                        help="bootstrap resamples for the ladder-level interval (default: 400)")
    return parser


def print_study(study):
    r = study.result
    law = study.law
    if law is not None:
        print(f"baseline ({len(r['baseline']['runs'])} runs, depths {', '.join(map(str, r['baseline']['depths']))}): "
              f"{law.describe()}")
    for name, v in r["variants"].items():
        rows = []
        for row in v["per_depth"]:
            cell = lambda x, flag=False: "-" if x is None else f"{x:.4f}" + ("?" if flag else "")
            ci = row["cm_ci"]
            rows.append([row["depth"], row["seeds"], f"{row['bpb']:.4f}", f"{row['flops']:.3g}",
                         "below floor" if row.get("below_floor") else cell(row["cm"], row["extrapolated"]),
                         "-" if not ci else f"[{ci[0]:.4f}, {ci[1]:.4f}]",
                         cell(row["wall_cm"], row["extrapolated"]),
                         cell(row["nanochat_cm"], row["nanochat_extrapolated"])])
        print(f"\n{name}")
        print(text_table(["depth", "seeds", "bpb", "FLOPs", "CM", "95% CI", "wall CM", "nanochat CM"], rows))
        if v["ladder_cm"] is not None:
            ci = v["ladder_ci"]
            print(f"ladder-level CM {v['ladder_cm']:.4f}" + (f" [{ci[0]:.4f}, {ci[1]:.4f}] ({v['ladder_ci_kind']})"
                                                              if ci else " (interval unknown)")
                  + ("" if "beyond_noise" not in v else
                     "; beyond the noise (Holm-Bonferroni)" if v["beyond_noise"] else
                     "; within the noise (Holm-Bonferroni)"))


def main(argv=None):
    args = build_parser().parse_args(argv)
    dirs = select_runs(args.runs_root, args.select)
    root = dirs[0].parent
    try:
        runs = one_trunk([load_run(d) for d in dirs], args.trunk)
    except ValueError as e:
        raise SystemExit(f"error: {e}; compare one trunk's runs with --trunk "
                         f"{' or --trunk '.join(trunks.TRUNKS)}") from None
    names = [r.name for r in runs]
    variant_tags = dict(args.variant) if args.variant else None
    for flag, wanted in (("--baseline", args.baseline or []),
                         *((f"--variant {n}", t) for n, t in (variant_tags or {}).items())):
        unknown = [t for t in wanted if not any(n == t or tag_of(n) == t for n in names)]
        if unknown:
            raise SystemExit(f"error: {flag}: no run named {', '.join(unknown)} under {root} (matching "
                             f"--select {args.select!r}); runs there: {', '.join(names[:12])}"
                             + (" ..." if len(names) > 12 else ""))
    messages = []
    spends = pool(runs, messages)
    baseline, variants = select_groups(spends, args.baseline_label, args.baseline, variant_tags)
    study = compare(spends, baseline, variants, messages, resamples=args.resamples)
    for line in study.messages:  # diagnostics on stderr, the table on stdout
        print(line, file=sys.stderr)
    out = Path(args.out) if args.out else root
    out.mkdir(parents=True, exist_ok=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(study.result, indent=1) + "\n")
    if study.errors:
        raise SystemExit(1)
    print_study(study)
    figures = write_figures(study, out)
    (out / "compare.md").write_text("# Compute multiplier\n\n" + markdown(study, figures) + "\n\n"
                                    + "\n".join(MEANINGS) + "\n")
    print(f"\nwrote {out / 'compare.md'}" + (f" and {args.json}" if args.json else ""))


if __name__ == "__main__":
    run(main)
