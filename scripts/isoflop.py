"""The iso-FLOP frontier of the grid's runs (`bash speedrun.sh isoflop`): per FLOPs budget and
connection, the compute-optimal size from a parabola of final val bpb in ln(params), the frontier
over budgets, and the CM along it against the baseline's frontier.

    python -m scripts.isoflop --runs-root DIR [--select GLOB] [--trunk 2026-01|2026-07] [--baseline-label residual]
        [--json PATH]

Reads config.toml and summary.json of the runs under DIR whose names match --select (default
`*`); a run enters when it was trained to a FLOPs budget (--target-flops). Runs of one trunk only
(config.toml's `trunk`; docs/trunks.md): --trunk picks them, and runs of two without it are
refused, as scripts.compare does. Prints one row per
connection and budget (warnings on stderr); --json writes {"baseline", "baseline_fit", "messages", "variants":
{label: {"frontier": [...], "frontier_cm": [...]}}} (see nanochat/report/isoflop_section.py).
"""

import argparse
import json
import sys
from pathlib import Path

from nanochat import trunks
from nanochat.cli import run
from nanochat.common import text_table
from nanochat.report.isoflop_section import BASELINE_LABEL, HEADER, NOTE, rows, study
from nanochat.report.runs import load_run, one_trunk, select_runs


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m scripts.isoflop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs-root", metavar="DIR", help="directory of run directories (default: <base dir>/runs)")
    parser.add_argument("--select", default="*", metavar="GLOB", help="only runs whose name matches (default: *)")
    parser.add_argument("--trunk", choices=trunks.TRUNKS,
                        help="only the runs of this trunk (default: the runs' one trunk; runs of two are refused)")
    parser.add_argument("--baseline-label", default=BASELINE_LABEL,
                        help=f"connection label of the baseline (default: {BASELINE_LABEL})")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    dirs = select_runs(args.runs_root, args.select)
    root = dirs[0].parent
    try:
        runs = one_trunk([load_run(d) for d in dirs], args.trunk)
    except ValueError as e:
        raise SystemExit(f"error: {e}; read one trunk's grid with --trunk {' or --trunk '.join(trunks.TRUNKS)}") from None
    result, front, _ = study(runs, args.baseline_label)
    for line in result["messages"]:
        print(line, file=sys.stderr)
    if not front:
        raise SystemExit(f"error: no finished run trained to a FLOPs budget under {root} matching "
                         f"{args.select!r} with 3 or more sizes per budget: run `bash speedrun.sh isoflop` first")
    if result["baseline_fit"]:
        print(f"baseline frontier: {result['baseline_fit']}")
    print(text_table(HEADER, rows(result)))
    print(NOTE)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    run(main)
