"""Print what a speedrun mode will train and its estimated cost, or one progress line.

    python -m scripts.plan --configs configs/paper/d12_*.toml --seeds 3 --nproc 8
    python -m scripts.plan --configs ... --seeds 3 --tsv runs.tsv     # also write the run list
    python -m scripts.plan --configs ... --seeds 3 --progress 4        # "run 4 of 15 ..., ETA"
    python -m scripts.plan --ladder configs/paper/d12_{residual,kromhc}.toml --depths 6 8 10 12 \\
        --ratio 20 --nproc 8 --gpu-name "NVIDIA H100 80GB HBM3"       # the compute-multiplier ladder
    python -m scripts.plan --isoflop configs/paper/d12_kromhc.toml --depths 6 8 10 --budgets 2e17 6e17

--configs are trained as written. --ladder and --isoflop derive runs from their configs (the
configs' settings, the depth and the horizon overridden, tags `<prefix>_d<depth>_<label>` and
`<prefix>_<budget>_d<depth>_<label>`, the label being the file name without a leading `d<N>_`);
the three may be mixed, in that order. The run list (--tsv) has one line per run: config, model
tag, `all` or `train` (train: no evaluation after training), then the extra base_train flags,
tab-separated; speedrun.sh trains them in that order. Only measurements on the plan's device price
it: the GPU --gpu-name names (any GPU where none is named; --unit CPU: the CPU). A run's throughput is
its own measurement: from finished runs under <base dir>/runs, <base dir>/gpu_check.json (or
--gpu-check FILE), or,
where --gpu-name names the GPU that made docs/gpu_check.json (as nvidia-smi names it or
as the README does: "H200"), that measurement; else a measured relative's (the same wiring at
another depth, or a member of its family, on the same --hc-kernels backend), marked "≈ ... from";
else another variant's at the same depth, or for a GPU named by --gpu-name whose peak is known an
assumed MFU (--mfu), marked "assumed"; see nanochat/planning/throughput.py.
--memory adds each run's estimated peak memory per rank and device batch on that GPU.
A config takes its trunk's defaults for what it leaves out (nanochat/trunks.py); --trunk 2026-07
trains every run on that trunk, under its tag with the suffix _t2607 (nanochat.planning.plan.on_trunk).

    python -m scripts.plan --baselines-of configs/frontier/*.toml

prints, one a line, the configs of the runs those configs' runs are read against in the report
(each wiring's SPEC baseline, an option's variant in the paper's configuration, residual) that
are not among them; speedrun.sh's frontier mode trains them too.
"""

import argparse
import sys
from pathlib import Path

from nanochat import trunks
from nanochat.planning import plan, sizing, throughput
from nanochat.cli import fraction, positive_float, positive_int, run


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m scripts.plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=[], metavar="TOML", help="configs trained as written, in order")
    parser.add_argument("--ladder", nargs="+", default=[], metavar="TOML",
                        help="configs trained at every --depths with --ratio tokens per scaling parameter")
    parser.add_argument("--isoflop", nargs="+", default=[], metavar="TOML",
                        help="configs trained at every --depths for every FLOPs budget of --budgets")
    parser.add_argument("--depths", nargs="+", type=positive_int(), metavar="D", help="depths of --ladder/--isoflop")
    parser.add_argument("--ratio", type=positive_float(), help="tokens : scaling params of the ladder's runs")
    parser.add_argument("--budgets", nargs="+", type=positive_float(), metavar="FLOPS",
                        help="training FLOPs budgets of the iso-FLOP grid (e.g. 2e17 6e17 2e18)")
    parser.add_argument("--ladder-prefix", default="ladder", help="tag prefix of the ladder's runs (default ladder)")
    parser.add_argument("--isoflop-prefix", default="isoflop", help="tag prefix of the grid's runs (default isoflop)")
    parser.add_argument("--train-only", action="store_true",
                        help="the derived runs get training alone (their final val bpb), no evaluation after it")
    parser.add_argument("--trunk", choices=trunks.TRUNKS, default=trunks.DEFAULT,
                        help="train every run on this trunk; on 2026-07: its defaults for the flags that differ by "
                             "trunk, the horizon of a config as written its data:param ratio, tags + _t2607 "
                             f"(default {trunks.DEFAULT}: the configs as written)")
    parser.add_argument("--seeds", type=positive_int(), default=1, help="seeds per config (default 1)")
    parser.add_argument("--vary-data-order", action="store_true",
                        help="seeds > 0 also shuffle the data order (tag suffix _s<seed>_data)")
    parser.add_argument("--nproc", type=positive_int(), default=1, help="GPUs (processes) per run")
    parser.add_argument("--unit", default="GPU",
                        help="what --nproc counts (default GPU); CPU (the offline demo's) prices the runs from "
                             "finished CPU runs, anything else from GPU measurements only")
    parser.add_argument("--runs-root", help="run directories (default <base dir>/runs)")
    parser.add_argument("--gpu-check", help="gpu_check.json (default <base dir>/gpu_check.json, if present)")
    parser.add_argument("--gpu-name", default="",
                        help="the GPU's name (nvidia-smi's): where nothing was measured, its peak bf16 FLOP/s at "
                             "--mfu prices the runs, labelled as an assumption")
    parser.add_argument("--mfu", type=fraction(), default=throughput.ASSUMED_MFU,
                        help=f"the MFU assumed with --gpu-name (default {throughput.ASSUMED_MFU})")
    parser.add_argument("--memory", action="store_true",
                        help="also the estimated peak memory per rank and the device batch of each run on the GPU "
                             "of --gpu-name (nanochat/planning/memory.py; traces cached under <base dir>/memory); a run that "
                             "cannot fit even at device batch 1 is refused with an error")
    parser.add_argument("--auto-batch", action="store_true",
                        help="with --memory: the runs train with --device-batch-size auto (as speedrun's GPU modes "
                             "do): each one's batch is the largest power of two up to its config's that fits")
    parser.add_argument("--tsv", help="write the run list here")
    parser.add_argument("--progress", type=positive_int(), metavar="K", help="print only 'run K of N' with the ETA")
    parser.add_argument("--shards", action="store_true",
                        help="print only the train shards the longest run needs, of the runs' corpus")
    parser.add_argument("--corpus", action="store_true",
                        help="print only the corpus the runs train on (fineweb-edu or climbmix; one per mode)")
    parser.add_argument("--baselines-of", nargs="+", default=[], metavar="TOML",
                        help="print only the configs of the runs these configs' runs are read against in the "
                             "report, those not among them, one a line")
    args = parser.parse_args(argv)
    if args.baselines_of:
        return args
    if not (args.configs or args.ladder or args.isoflop):
        parser.error("give the runs: --configs, --ladder or --isoflop (each a list of TOML files)")
    if (args.ladder or args.isoflop) and not args.depths:
        parser.error("--ladder and --isoflop need --depths D [D ...]")
    if args.ladder and args.ratio is None:
        parser.error("--ladder needs --ratio (tokens per scaling parameter, e.g. 20)")
    if args.isoflop and not args.budgets:
        parser.error("--isoflop needs --budgets FLOPS [FLOPS ...] (e.g. 2e17 6e17)")
    return args


def specs_of(args):
    specs = [plan.RunSpec(c) for c in args.configs]
    if args.ladder:
        specs += plan.ladder_specs(args.ladder, args.depths, args.ratio, args.ladder_prefix, args.train_only)
    if args.isoflop:
        specs += plan.isoflop_specs(args.isoflop, args.depths, args.budgets, args.isoflop_prefix, args.train_only)
    return [plan.on_trunk(spec, args.trunk) for spec in specs]


def print_baselines(configs):
    """The configs of `configs`' comparison runs, one a line; a warning on stderr for a
    variant no d<D>_<variant>.toml exists for (the runs read against it then have no comparison)."""
    found, missing = plan.baseline_configs(configs)
    if found:
        print("\n".join(found))
    if missing:
        print(f"plan: no config for {', '.join(missing)} in {', '.join(plan.CONFIG_DIRS)} (d<D>_<variant>.toml): "
              "the runs read against it get no comparison in the report", file=sys.stderr)


def main(argv=None):
    args = parse_args(argv)
    if args.baselines_of:
        for path in args.baselines_of:
            if not Path(path).is_file():
                sys.exit(f"error: config {path} not found; pass existing TOML files to --baselines-of")
        return print_baselines(args.baselines_of)
    if args.runs_root and args.gpu_check:
        base = None  # both given (speedrun does): no need to import torch for base_dir
    else:
        from nanochat.common import base_dir
        base = Path(base_dir())
    runs_root = Path(args.runs_root) if args.runs_root else base / "runs"
    for path in args.configs + args.ladder + args.isoflop:
        if not Path(path).is_file():
            sys.exit(f"error: config {path} not found; pass existing TOML files to --configs, --ladder or --isoflop")
    try:
        runs = plan.plan_runs(specs_of(args), args.seeds, args.vary_data_order, runs_root)
    except (ValueError, OSError) as e:
        sys.exit(f"error: {e}")
    gpu_check = Path(args.gpu_check) if args.gpu_check else base / "gpu_check.json"
    # only the device the plan is for prices it: the CPU demo's runs (--unit CPU), or the GPU named
    device = "cpu" if args.unit.lower().startswith("cpu") else "cuda"
    measured = (throughput.measured_from_runs(runs_root, args.gpu_name, device)
                + (throughput.read_gpu_check(gpu_check, gpu_name=args.gpu_name) if gpu_check.is_file() and device == "cuda"
                   else [])
                + throughput.committed_measurement(args.gpu_name))
    assumption = throughput.assumption_for(args.gpu_name, args.mfu)
    if args.tsv:
        Path(args.tsv).write_text("".join("\t".join([r.config, r.tag, "train" if r.train_only else "all", *r.flags])
                                          + "\n" for r in runs))
    corpora = sorted({r.corpus for r in runs})
    if (args.shards or args.corpus) and len(corpora) > 1:
        sys.exit(f"error: the runs read {' and '.join(corpora)}; a mode trains on one corpus: plan each apart")
    if args.corpus:
        print(corpora[0])
    elif args.shards:
        print(plan.shards_needed(runs))
    elif args.progress:
        if args.progress > len(runs):
            sys.exit(f"error: --progress {args.progress} but the mode has {len(runs)} runs")
        print(plan.progress_line(runs, args.progress, measured, args.nproc, assumption))
    else:
        if args.gpu_name and assumption is None:
            print(f"plan: no peak FLOP/s known for GPU {args.gpu_name!r} (nanochat/gpus.py's table); "
                  "runs without a measurement cannot be priced")
        memory = sizing.memory_for(args.gpu_name, args.auto_batch) if args.memory else None
        print(plan.plan_table(runs, measured, args.nproc, args.unit, assumption, memory))
        refusal = memory and memory.bytes and sizing.refused(runs, args.nproc, memory)
        if refusal:
            sys.exit(refusal)


if __name__ == "__main__":
    run(main)
