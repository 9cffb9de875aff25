"""Print what a speedrun mode will train and its estimated cost, or one progress line.

    python -m scripts.plan --configs configs/paper/d12_*.toml --seeds 3 --nproc 8
    python -m scripts.plan --configs ... --seeds 3 --tsv runs.tsv     # also write the run list
    python -m scripts.plan --configs ... --seeds 3 --progress 4        # "run 4 of 15 ..., ETA"

The run list (--tsv) has one line per run: config, model tag, then the extra base_train
flags of its seed, tab-separated; speedrun.sh trains them in that order. Throughput comes
from finished runs under <base dir>/runs, else from <base dir>/gpu_check.json (or
--gpu-check FILE); see nanochat/plan.py.
"""

import argparse
import sys
from pathlib import Path

from nanochat import plan


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m scripts.plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", required=True, metavar="TOML", help="the mode's configs, in order")
    parser.add_argument("--seeds", type=positive_int, default=1, help="seeds per config (default 1)")
    parser.add_argument("--vary-data-order", action="store_true",
                        help="seeds > 0 also shuffle the data order (tag suffix _s<seed>_data)")
    parser.add_argument("--nproc", type=positive_int, default=1, help="GPUs (processes) per run")
    parser.add_argument("--unit", default="GPU", help="what --nproc counts, for the printout (default GPU)")
    parser.add_argument("--runs-root", help="run directories (default <base dir>/runs)")
    parser.add_argument("--gpu-check", help="gpu_check.json (default <base dir>/gpu_check.json, if present)")
    parser.add_argument("--tsv", help="write the run list here")
    parser.add_argument("--progress", type=positive_int, metavar="K", help="print only 'run K of N' with the ETA")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.runs_root and args.gpu_check:
        base = None  # both given (speedrun does): no need to import torch for base_dir
    else:
        from nanochat.common import base_dir
        base = Path(base_dir())
    runs_root = Path(args.runs_root) if args.runs_root else base / "runs"
    for path in args.configs:
        if not Path(path).is_file():
            sys.exit(f"error: config {path} not found; pass existing TOML files to --configs")
    try:
        runs = plan.plan_runs(args.configs, args.seeds, args.vary_data_order, runs_root)
    except (ValueError, OSError) as e:
        sys.exit(f"error: {e}")
    gpu_check = Path(args.gpu_check) if args.gpu_check else base / "gpu_check.json"
    measured = plan.measured_from_runs(runs_root) + (plan.read_gpu_check(gpu_check) if gpu_check.is_file() else [])
    if args.tsv:
        Path(args.tsv).write_text("".join("\t".join([r.config, r.tag, *r.flags]) + "\n" for r in runs))
    if args.progress:
        if args.progress > len(runs):
            sys.exit(f"error: --progress {args.progress} but the mode has {len(runs)} runs")
        print(plan.progress_line(runs, args.progress, measured, args.nproc))
    else:
        print(plan.plan_table(runs, measured, args.nproc, args.unit))


if __name__ == "__main__":
    main()
