"""What a speedrun mode will train and what it will cost, before and while it spends.

A mode is a list of run specs, each trained with k seeds. A spec is a config as written, or a
run derived from one (the compute-multiplier ladder and the iso-FLOP grid): the config's
settings with the depth and the horizon overridden, under its own model tag
(`ladder_d8_kromhc`, `isoflop_6e17_d8_kromhc`). Seed 0 is the spec as it is (its model_tag, its
--seed, nanochat's fixed data order), so runs finished before seeds existed count; seed s > 0 is
the run `<model_tag>_s<s>` with init seed `seed + s`, and with `vary_data_order` also the run
`<model_tag>_s<s>_data` whose data order is shuffled by s.

A config takes its trunk's defaults for the flags it leaves out (nanochat/trunks.py
FLAG_DEFAULTS); `on_trunk` moves a mode's runs to another trunk (speedrun's TRUNK).
The cost of a run is its training tokens (sized as base_train sizes them: planning/sizing.py)
over a throughput (measured, a relative's or assumed: planning/throughput.py); its memory on
the GPU is planning/sizing.py's `fit`. The plan's table and progress line are here.
"""

import dataclasses
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from nanochat import connections, measurements, trunks
from nanochat.planning.sizing import fit, memory_cells, resolve, stream_count
from nanochat.planning.throughput import ASSUMED_KINDS, LEGEND, covered_line, family_hint, find_throughput, rate_cell
from nanochat.report.format import format_count, format_duration, format_flops
from nanochat.report.runs import Run

# base_train's defaults for the keys a config may omit (nanochat/train_config.py).
DEFAULT_SEED = 42
DEFAULT_DEPTH = 20
# Training tokens one shard yields at T = 2048, for the shard count. FineWeb-Edu: nanochat's
# estimate (4d8dbaf). ClimbMix: nanochat 92d63d4's runs/speedrun.sh downloads "about 150 shards"
# for its d24 run at data:param 8, which trains 5,568 steps of 2^20 tokens (that run's auto
# batch, as train_config.resolve_total_batch computes it): 5,568 x 2^20 / 150 = 38.9M a shard.
TOKENS_PER_SHARD = {"fineweb-edu": 34e6, "climbmix": 5568 * 2 ** 20 / 150}


@dataclass(frozen=True)
class RunSpec:
    """One run of a mode before its seeds: a config file, and for a derived run the base_train
    settings that override the file's (depth, horizon, model_tag). `train_only`: the run is
    judged by the final val bpb training logs (the ladder's and the grid's extra points), so
    speedrun gives it no base_eval, lm-eval or diagnostics."""
    config: str
    overrides: tuple = ()  # ((setting, value), ...), in flag order
    train_only: bool = False


@dataclass
class PlannedRun:
    config: str
    tag: str
    variant: str
    depth: int
    n: int
    steps: int | None  # None: set by a FLOPs budget or a data ratio, until `resolve` sizes it
    batch: int | None  # None: --total-batch-size auto, until `resolve` sizes it
    flags: list = field(default_factory=list)  # extra base_train flags: the spec's overrides, then the seed's
    done_steps: int = 0
    finished: bool = False
    train_only: bool = False
    flops_per_token: float | None = None  # the model's estimate_flops, once `resolve` built it
    kernels: str = "torch"  # hc_kernels
    trunk: str = trunks.DEFAULT
    corpus: str = "fineweb-edu"
    fp8: bool = False

    @property
    def sized(self):
        """Whether its steps and total batch are known (an auto batch or a derived horizon: after `resolve`)."""
        return self.steps is not None and self.batch is not None

    @property
    def tokens(self):
        return self.steps * self.batch if self.sized else None

    @property
    def tokens_left(self):
        return None if not self.sized or self.finished else (self.steps - self.done_steps) * self.batch

    @property
    def flops(self):
        """Training FLOPs of the whole run (the FLOPs-per-token convention of gpt.estimate_flops)."""
        return None if self.tokens is None or self.flops_per_token is None else self.tokens * self.flops_per_token


def seed_tag(tag, seed, vary_data_order):
    if seed == 0:
        return tag
    return f"{tag}_s{seed}" + ("_data" if vary_data_order else "")


def config_label(path):
    """A config's name in derived tags: its file name without a leading depth
    (configs/paper/d12_kromhc.toml -> kromhc, configs/cpu/mhc_lite.toml -> mhc_lite)."""
    return re.sub(r"^d\d+_", "", Path(path).stem)


def budget_label(flops):
    """A FLOPs budget as a tag: 6e17, 2.15e18."""
    mantissa, exponent = f"{flops:.6e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def horizon_overrides(ratio=None, budget=None):
    """The settings of a ratio-sized (ladder) or budget-sized (iso-FLOP) horizon: the other two
    horizon flags off, since --num-iterations wins over both in base_train."""
    if (ratio is None) == (budget is None):
        raise ValueError("a derived run needs exactly one horizon: a data ratio or a FLOPs budget")
    return (("num_iterations", -1), ("target_flops", -1.0 if budget is None else float(budget)),
            ("target_param_data_ratio", -1.0 if ratio is None else float(ratio)))


def ladder_specs(configs, depths, ratio, prefix="ladder", train_only=False):
    """Every config at every depth, trained for `ratio` tokens per scaling parameter:
    `<prefix>_d<depth>_<label>`, the configs' other settings (the paper's hyper-parameters) kept."""
    return [RunSpec(str(c), (("depth", d), *horizon_overrides(ratio=ratio),
                             ("model_tag", f"{prefix}_d{d}_{config_label(c)}")), train_only)
            for c in configs for d in depths]


def isoflop_specs(configs, depths, budgets, prefix="isoflop", train_only=True):
    """The budget x depth grid of every config: `<prefix>_<budget>_d<depth>_<label>`, each run
    trained until it has spent the budget."""
    return [RunSpec(str(c), (("depth", d), *horizon_overrides(budget=b),
                             ("model_tag", f"{prefix}_{budget_label(b)}_d{d}_{config_label(c)}")), train_only)
            for c in configs for b in budgets for d in depths]


# The settings that give a run its horizon; a derived run (ladder, grid) sets its own.
HORIZON = ("num_iterations", "target_flops", "target_param_data_ratio")


def on_trunk(spec, trunk):
    """The spec trained on `trunk` (speedrun's TRUNK) under the tag `<model_tag><trunks.tag_suffix>`, so
    that both trunks' runs share a base directory: --trunk, and the trunk's defaults for every flag
    whose default differs by trunk (nanochat/trunks.py FLAG_DEFAULTS), since a config written for
    the paper pins the 2026-01 values (its batch, learning rates, schedule). Its horizon: the
    derived run's own (the ladder's data ratio, the grid's budget), else the trunk's data:param
    ratio. On the default trunk the spec is unchanged."""
    if trunks.check(trunk) == trunks.DEFAULT:
        return spec
    own = dict(spec.overrides)
    derived = any(own.get(name, -1) > 0 for name in HORIZON)
    settings = {"trunk": trunk, **{name: value for name, value in trunks.FLAG_DEFAULTS[trunk].items()
                                   if not (derived and name in HORIZON)}}
    if not derived:
        settings |= {"num_iterations": -1, "target_flops": -1.0}
    tag = own.get("model_tag") or tomllib.loads(Path(spec.config).read_text()).get("model_tag")
    if not tag:
        raise ValueError(f"{spec.config} has no model_tag: add model_tag = \"...\" so its run directory is known")
    kept = [(name, value) for name, value in spec.overrides if name not in settings and name != "model_tag"]
    return dataclasses.replace(spec, overrides=(*kept, *settings.items(), ("model_tag", tag + trunks.tag_suffix(trunk))))


def _flag(name, value):
    return ["--" + name.replace("_", "-"), repr(value) if isinstance(value, float) else str(value)]


# Where a variant's config of a depth is found, d<D>_<variant>.toml under the repository, in
# the order of scripts/speedrun_lib.sh's variant_config: the paper's hyper-parameters first.
REPO = measurements.REPO
CONFIG_DIRS = ("configs/paper", "configs/ablations", "configs/frontier")


def read_against(config):
    """The variant a config's runs are read against in the report's "Beyond the paper" section
    (report/beyond.py's counterpart): with an option beyond the paper, the same variant in the
    paper's configuration; else the wiring's declared baseline (its SPEC's), residual for a name
    this version does not register."""
    run = Run(Path(config).stem, Path(config), found=False, config=tomllib.loads(Path(config).read_text()))
    if run.options:
        return run.variant
    return connections.spec(run.variant).baseline if run.variant in connections.VARIANTS else "residual"


def variant_config(variant, depth, root=REPO):
    """The config of a variant at a depth, relative to root (the first CONFIG_DIRS holding
    d<depth>_<variant>.toml), or None."""
    paths = (f"{d}/d{depth}_{variant}.toml" for d in CONFIG_DIRS)
    return next((p for p in paths if (Path(root) / p).is_file()), None)


def baseline_configs(configs, root=REPO):
    """What the runs of `configs` need beside them to be read in the report: at each of their
    depths the config of every variant they are read against (`read_against`) and residual's
    (every row's ΔParams reference), those not among `configs`, in registry order. Returns
    (config paths relative to root, "<variant> at D=<depth>" of those with no config)."""
    given = {Path(c).resolve() for c in configs}
    wanted = {}
    for config in configs:
        depth = tomllib.loads(Path(config).read_text()).get("depth", DEFAULT_DEPTH)
        wanted |= {(read_against(config), depth): None, ("residual", depth): None}
    order = list(connections.VARIANTS)
    found, missing = [], []
    for variant, depth in sorted(wanted, key=lambda w: (order.index(w[0]) if w[0] in order else len(order), w[1])):
        path = variant_config(variant, depth, root)
        if path is None:
            missing.append(f"{variant} at D={depth}")
        elif (Path(root) / path).resolve() not in given:
            found.append(path)
    return found, missing


def plan_runs(specs, seeds=1, vary_data_order=False, runs_root=None):
    """The runs of a mode in training order, with how far each already got. `specs`: RunSpecs,
    or config paths (each the config as written)."""
    if seeds < 1:
        raise ValueError(f"SEEDS must be at least 1 (got {seeds})")
    resolved = []
    for spec in specs:
        spec = spec if isinstance(spec, RunSpec) else RunSpec(str(spec))
        config = tomllib.loads(Path(spec.config).read_text()) | dict(spec.overrides)
        if not config.get("model_tag"):
            raise ValueError(f"{spec.config} has no model_tag: add model_tag = \"...\" so its run directory is known")
        resolved.append((spec, config))
    tags = [config["model_tag"] for _, config in resolved]
    twice = sorted({t for t in tags if tags.count(t) > 1})
    if twice:
        raise ValueError(f"two runs of the mode would share the run directory {', '.join(twice)}: "
                         "give their configs distinct file names or model tags")
    runs = []
    # Seed by seed, every spec within a seed: after the first pass the mode has a complete
    # table, and each further pass narrows its intervals.
    for s in range(seeds):
        for spec, config in resolved:
            variant = config.get("hc", "residual")
            n = stream_count(variant, config.get("hc_streams"))
            trunk = config.get("trunk", trunks.DEFAULT)
            defaults = trunks.FLAG_DEFAULTS[trunks.check(trunk)]
            batch = config.get("total_batch_size", defaults["total_batch_size"])
            steps = config.get("num_iterations", -1)
            tag = seed_tag(config["model_tag"], s, vary_data_order)
            flags = [v for name, value in spec.overrides if name != "model_tag" for v in _flag(name, value)]
            if s > 0 or "model_tag" in dict(spec.overrides):
                flags += ["--model-tag", tag]
            if s > 0:
                flags += ["--seed", str(config.get("seed", DEFAULT_SEED) + s)]
                if vary_data_order:
                    flags += ["--data-seed", str(s)]
            run = PlannedRun(config=spec.config, tag=tag, variant=variant, depth=config.get("depth", DEFAULT_DEPTH),
                             n=n, steps=steps if steps > 0 else None,
                             batch=None if batch == "auto" else batch, flags=flags,
                             train_only=spec.train_only, kernels=config.get("hc_kernels", "torch"), trunk=trunk,
                             corpus=config.get("corpus", defaults["corpus"]), fp8=bool(config.get("fp8", False)))
            if runs_root is not None:
                run.finished, run.done_steps = progress(Path(runs_root) / tag)
            runs.append(run)
    return runs


def shards_needed(runs):
    """Train shards of its corpus the longest run reads (one pass, TOKENS_PER_SHARD), plus 10 %."""
    # Rounded before the ceiling: 1.1 x 150 shards is 165, not the 166 its float gives.
    return max([math.ceil(round(1.1 * (resolve(r).tokens or 0) / TOKENS_PER_SHARD[r.corpus], 9)) for r in runs] + [1])


def progress(run_dir):
    """(finished, optimizer steps logged) of a run directory; (False, 0) when it is absent."""
    summary = measurements.read(run_dir / "summary.json")
    if summary and summary.get("complete"):
        return True, summary.get("step", 0)
    metrics = run_dir / "metrics.jsonl"
    done = 0
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line of a killed run
            if row.get("kind") == "train":
                done = max(done, row["step"] + 1)
    return False, done


def seconds_left(run, measured, nproc, assumption=None):
    """Training seconds still to go for a run on nproc GPUs, or None when unknown."""
    if run.finished:
        return 0.0
    m, _ = find_throughput(run, measured, assumption)
    if m is not None and not run.sized:
        resolve(run)  # a throughput to use: size the run now (a torch import)
    if m is None or run.tokens_left is None:
        return None
    return run.tokens_left / (m.per_gpu * nproc)


def plan_table(runs, measured, nproc, unit="GPU", assumption=None, memory=None):
    """The plan as text: the total first, then one line per run, then what could not be
    estimated and what the estimate assumes. `unit` names what nproc counts (GPU, or CPU process
    for the offline demo); every run is sized (`resolve`) so that its tokens and FLOPs show.
    memory: a Memory, for the columns of each run's peak per rank and device batch."""
    from nanochat.common import text_table
    rows, total, unknown, kinds = [], 0.0, [], set()
    for r in runs:
        resolve(r)
        status = "finished" if r.finished else (f"resume at step {r.done_steps}" if r.done_steps else "to train")
        m, kind = find_throughput(r, measured, assumption)
        secs = seconds_left(r, measured, nproc, assumption)
        if secs is None:
            unknown.append(r.tag)
        else:
            total += secs
            kinds.add(kind if secs else None)
        rows.append((r.tag, r.variant, r.depth, "—" if r.steps is None else r.steps, format_count(r.tokens),
                     format_flops(r.flops), status, rate_cell(m, kind, r),
                     "—" if secs is None else f"{secs * nproc / 3600:.2f}")
                    + (memory_cells(fit(r, nproc, memory.bytes, memory.auto)) if memory else ()))
    todo = [r for r in runs if not r.finished]
    head = f"{len(todo)} of {len(runs)} runs to train, on {nproc} x {unit}"
    if len(unknown) == len(todo) and todo:
        lines = [f"{head}: their cost cannot be estimated"]
    else:
        lines = [f"{head}: about {total * nproc / 3600:.2f} {unit}-hours, {format_duration(total)} of training"
                 + (" for the runs that can be estimated" if unknown else "")
                 + (" (partly assumed, see below)" if kinds & ASSUMED_KINDS and kinds - ASSUMED_KINDS - {None}
                    else " (assumed, see below)" if kinds & ASSUMED_KINDS else "")]
    lines.append(text_table(("run", "variant", "D", "steps", "tokens", "FLOPs", "status",
                             f"tokens/s per {unit} (from)", f"{unit}-hours")
                            + (("peak per rank", "device batch") if memory else ()), rows))
    if unknown:
        reason = ("no tokens/s measured yet (no finished run and no gpu_check.json; run "
                  "`python -m scripts.gpu_check` to measure one)" if not measured else
                  "no measurement at their depth")
        if assumption is None and unit == "GPU":
            reason += "; no GPU with a known peak to assume an MFU of (set PLAN_GPU / --gpu-name)"
        lines.append(f"cannot estimate {', '.join(unknown)}: {reason}")
    if "assumed" in kinds:
        lines.append(assumption.describe() + ".")
    lines += settings_lines(runs)
    lines += [hint for hint in (family_hint(v) for v in dict.fromkeys(r.variant for r in runs)) if hint]
    covered = covered_line(measured)
    if covered:
        lines.append(covered + ".")
    lines.append(LEGEND)
    if memory:
        lines.append(memory.describe())
    return "\n".join(lines)


def settings_lines(runs):
    """The plan's lines naming the runs off the default trunk (by trunk) and the fp8 runs; the
    GPU-hours of an fp8 run are those of its bf16 FLOPs, no fp8 speedup assumed."""
    by_trunk = {}
    for r in runs:
        if r.trunk != trunks.DEFAULT:
            by_trunk.setdefault(r.trunk, []).append(r.tag)
    lines = [f"trunk {trunk} (nanochat/trunks.py: its defaults for what a config leaves out; total batch and "
             f"horizon sized as base_train sizes them): {', '.join(tags)}." for trunk, tags in by_trunk.items()]
    fp8 = [r.tag for r in runs if r.fp8]
    if fp8:
        lines.append(f"fp8 (--fp8: float8 matmuls, CUDA sm >= 89): {', '.join(fp8)}; priced at the bf16 rate, "
                     "no fp8 speedup assumed.")
    return lines


def progress_line(runs, k, measured, nproc, assumption=None):
    """'run k of N: tag', with the time left for run k and the runs after it."""
    left = [seconds_left(r, measured, nproc, assumption) for r in runs[k - 1:]]
    known = sum(s for s in left if s is not None)
    if None not in left:
        eta = format_duration(known)
    elif known:
        eta = f"at least {format_duration(known)} ({left.count(None)} run(s) not estimable yet)"
    else:
        eta = "unknown until a run of this depth has finished or gpu_check.json exists"
    return f"run {k} of {len(runs)}: {runs[k - 1].tag}; training left for the mode: {eta}" \
        + (" (assumed MFU)" if assumption is not None and any(
            find_throughput(r, measured, assumption)[1] == "assumed" for r in runs[k - 1:] if not r.finished) else "")
