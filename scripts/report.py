"""Write report/README.md and its figures from run directories, in the KromHC paper's layout.

    python -m scripts.report --runs-root ~/.cache/nanochat/runs --out report/
    python -m scripts.report --runs RUN_DIR [RUN_DIR ...] --out report/
    python -m scripts.report --runs-root RUNS --configs configs/cpu --out report/

With --configs, the report covers the runs those configs train (their model_tag names the
run directory; with --runs-root, only those); runs not there yet still appear, marked
"not found", in the rows their configuration belongs to.
"""

import argparse
import json
from pathlib import Path

from nanochat.cli import existing_path, run
from nanochat.report.build import write_report
from nanochat.report.cost import load_infer_bench
from nanochat.report.runs import config_files, discover_runs, load_run, read_config


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m scripts.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group()
    # Not checked for existence: a run asked for but absent is reported as not found.
    source.add_argument("--runs", nargs="+", metavar="DIR", help="run directories")
    source.add_argument("--runs-root", metavar="DIR",
                        help="a directory of run directories (default: <base dir>/runs)")
    parser.add_argument("--configs", nargs="+", metavar="PATH", type=existing_path,
                        help="config files or directories: their runs (by model_tag) are reported, and "
                             "marked not found when absent; with --runs-root, only these")
    parser.add_argument("--reference", default="residual",
                        help="run name or variant the loss-gap figures subtract (default: residual)")
    parser.add_argument("--infer-bench", metavar="FILE", type=existing_path,
                        help="JSON of `python -m scripts.bench --bench infer --out FILE`: the inference rows of the "
                             "report's Cost section (without it they are marked not measured)")
    parser.add_argument("--out", default="report", help="output directory (default: report)")
    return parser


def parse_args(argv=None):
    return build_parser().parse_args(argv)


def collect_runs(args):
    """The runs to report, with notes on what was asked for but not found."""
    if args.runs:
        # One run can feed several tables under several configs: list each directory once.
        dirs = list(dict.fromkeys(Path(d) for d in args.runs))
    else:
        if args.runs_root:
            root = Path(args.runs_root)
        else:
            from nanochat.common import base_dir
            root = Path(base_dir()) / "runs"
        dirs = None if args.configs else discover_runs(root)
    if args.configs:
        configs = [read_config(p) for p in config_files(args.configs)]
        if dirs is None:
            return [load_run(root / c["model_tag"], expected_config=c) for c in configs]
        by_name = {d.name: d for d in dirs}
        runs = [load_run(by_name.get(c["model_tag"], Path(c["model_tag"])), expected_config=c)
                for c in configs]
        tags = {c["model_tag"] for c in configs}
        runs += [load_run(d) for d in dirs if d.name not in tags]
        return runs
    if not dirs:
        raise SystemExit(f"error: no run directories under {root}: train first (speedrun.sh), or pass --runs DIR ...")
    return [load_run(d) for d in dirs]


def main(argv=None):
    args = parse_args(argv)
    runs = collect_runs(args)
    try:
        bench = load_infer_bench(args.infer_bench)
    except (ValueError, KeyError, json.JSONDecodeError) as e:
        raise SystemExit(f"error: --infer-bench {args.infer_bench}: {e}; write it with python -m scripts.bench "
                         "--bench infer --out FILE") from None
    readme = write_report(runs, args.out, reference=args.reference, infer_bench=bench)
    found = sum(r.found for r in runs)
    print(f"wrote {readme} from {found} run(s)" + (f"; {len(runs) - found} not found" if found < len(runs) else ""))


if __name__ == "__main__":
    run(main)
