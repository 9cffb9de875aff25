"""What a speedrun mode will train and what it will cost, before and while it spends.

A mode is a list of run specs, each trained with k seeds. A spec is a config as written, or a
run derived from one (the compute-multiplier ladder and the iso-FLOP grid): the config's
settings with the depth and the horizon overridden, under its own model tag
(`ladder_d8_kromhc`, `isoflop_6e17_d8_kromhc`). Seed 0 is the spec as it is (its model_tag, its
--seed, nanochat's fixed data order), so runs finished before seeds existed count; seed s > 0 is
the run `<model_tag>_s<s>` with init seed `seed + s`, and with `vary_data_order` also the run
`<model_tag>_s<s>_data` whose data order is shuffled by s.

The cost of a run is its training tokens over a throughput, the first of:
Only measurements on the device the plan is for price it: the GPU --gpu-name names (or any
GPU where it names none), or the CPU for the offline demo (`measured_from_runs`,
`read_gpu_check`).
1. its own measurement (the same variant, depth, n and --hc-kernels backend): from finished run
   directories (summary.json's median tokens/s, per GPU), a `gpu_check.json` (schema in
   `read_gpu_check`), or the measurement committed as docs/gpu_check.json where the plan is for
   the GPU that made it (`committed_measurement`; `same_gpu` takes the README's short names,
   "H200", "A100 40GB"), in that order;
2. a measured relative's (marked "≈ ... from <relative>"): the same wiring at another depth or n,
   or another member of its SPEC family (`family_of`: the HC members share the stream passes
   that residual's single state does without), on the same backend; the same depth first, from
   another depth scaled by the run's FLOPs per token there over here, from another n as measured
   (and said so: the stream passes' bytes grow with n; `relative_throughput`);
3. with no relative measured, another variant's measurement at the same depth (marked
   "assumed ... as <variant>"; never the committed one's, which prices only its own family);
4. on a GPU whose peak is known, an assumed MFU of that peak over the run's FLOPs per token
   (marked "assumed");
else none and the plan says so. A run whose steps a FLOPs budget or a data ratio sets is sized
the way base_train sizes it (`train_config.num_iterations_for` on the model built on the meta
device, which costs a torch import: done only when a throughput can use it), and so is the
total batch of a run on the 2026-07 trunk (`--total-batch-size auto`, its default there).
A config takes its trunk's defaults for the flags it leaves out (nanochat/trunks.py
FLAG_DEFAULTS); `on_trunk` moves a mode's runs to another trunk (speedrun's TRUNK).
Evaluation is not counted: on the paper's configs it is a few percent of a run.
Memory (`fit`): a run's estimated peak per rank (nanochat/planning/memory.py) at the device batch it will
use on a GPU of known memory: the config's, or under --device-batch-size auto the batch
base_train will choose; a run that fits at no batch is refused (`refused`).
"""

import contextlib
import dataclasses
import io
import json
import math
import tomllib
import re
from dataclasses import dataclass, field
from pathlib import Path

from nanochat import connections, trunks
from nanochat.report.runs import Run, single_state

# base_train's defaults for the keys a config may omit (nanochat/train_config.py).
DEFAULT_SEED = 42
DEFAULT_DEPTH = 20
DEFAULT_STREAMS = 4
DEFAULT_VOCAB = 32768  # tok_train's default, for a config that leaves vocab_size to the tokenizer
# The MFU the plan assumes where nothing was measured: an assumption, not a measurement. Well-tuned
# dense bf16 pretraining at these sizes on one H100 node runs at roughly 30-50 % of peak (nanochat's
# logs print it); the HC variants' memory-bound stream passes sit below the residual baseline's.
# A finished run or scripts.gpu_check replaces it with a measurement; --mfu (PLAN_MFU) changes it.
ASSUMED_MFU = 0.40
# Training tokens one shard yields at T = 2048, for the shard count. FineWeb-Edu: nanochat's
# estimate (4d8dbaf). ClimbMix: nanochat 92d63d4's runs/speedrun.sh downloads "about 150 shards"
# for its d24 run at data:param 8, which trains 5,568 steps of 2^20 tokens (that run's auto
# batch, as train_config.resolve_total_batch computes it): 5,568 x 2^20 / 150 = 38.9M a shard.
TOKENS_PER_SHARD = {"fineweb-edu": 34e6, "climbmix": 5568 * 2 ** 20 / 150}


def stream_count(variant, n):
    """n of a run: 1 for the single-state variants, else its hc_streams (unset or 0: the default)."""
    return 1 if single_state(variant) else (n if n and n > 0 else DEFAULT_STREAMS)


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


@dataclass
class Throughput:
    variant: str
    depth: int
    n: int
    per_gpu: float  # tokens/s of one GPU
    source: str
    kernels: str = "torch"  # the --hc-kernels backend it ran on
    exact_only: bool = False  # prices its own runs and its relatives' (`relative_throughput`), no other variant's


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
REPO = Path(__file__).resolve().parents[2]
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


_SHAPES = {}  # (config, flags without the seed's) -> (steps, flops per token, total batch): one build per shape
_FITS = {}  # (config, flags without the seed's, GPU memory, ranks, auto) -> Fit


def _shape_key(run):
    return (run.config, tuple(run.flags[:run.flags.index("--model-tag")] if "--model-tag" in run.flags else run.flags))


def _train_args(key):
    """base_train's settings of a run (SystemExit or ValueError for a bad one)."""
    from nanochat.train_config import parse_args
    with contextlib.redirect_stderr(io.StringIO()):  # argparse's usage text: training will say why
        return parse_args(["--config", key[0], *key[1]])


def _shape(key):
    """(steps, FLOPs per token, total batch) of the settings `key` (_shape_key's form), from the
    model built on the meta device once per key; (None, None, None) for a bad setting."""
    if key not in _SHAPES:
        import torch

        from nanochat.gpt import GPT
        from nanochat.train_config import AUTO, model_config_for, num_iterations_for, resolve_total_batch
        try:
            args = _train_args(key)
            vocab = args.vocab_size or DEFAULT_VOCAB
            config = model_config_for(args, vocab)
            with torch.device("meta"):
                model = GPT(config)
            batch = args.total_batch_size
            if batch == AUTO:
                batch, _ = resolve_total_batch(args, config, vocab)
            steps, _ = num_iterations_for(args, model, batch)
            _SHAPES[key] = (steps, float(model.estimate_flops()), batch)
        except (ValueError, SystemExit):
            _SHAPES[key] = (None, None, None)  # a bad setting: left unpriced, its training fails with the reason
    return _SHAPES[key]


def resolve(run):
    """Size a run as base_train will: its steps (from a FLOPs budget or a data ratio when the
    config gives none), its total batch (under auto) and its FLOPs per token, from the model
    built on the meta device."""
    if run.flops_per_token is not None:
        return run
    steps, run.flops_per_token, batch = _shape(_shape_key(run))
    if run.batch is None:
        run.batch = batch
    if run.steps is None:
        run.steps = steps
    return run


@dataclass(frozen=True)
class Fit:
    """A run's memory on one GPU: the device batch it will use (None: it fits at no batch),
    the estimate at that batch (at the smallest tried when none fits), and whether the batch
    was chosen to fit (--device-batch-size auto) or is the config's."""
    batch: int | None
    estimate: object  # nanochat.planning.memory.Estimate
    auto: bool
    fits: bool


def fit(run, nproc, memory_bytes=None, auto=False):
    """The device batch and estimated peak per rank of a run on nproc GPUs of memory_bytes
    each (nanochat/planning/memory.py; compiled unless its config says otherwise, as base_train runs on
    a GPU). auto, or a config whose device batch is auto: the largest fitting power of two up
    to the config's value, as base_train picks it; else the config's value. None for a run
    whose settings are bad (training will say why)."""
    key = (*_shape_key(run), memory_bytes, nproc, auto)
    if key not in _FITS:
        from nanochat.planning import memory
        from nanochat.train_config import AUTO, model_config_for
        try:
            args = _train_args(key[:2])
            config = model_config_for(args, args.vocab_size or DEFAULT_VOCAB)
        except (ValueError, SystemExit):
            _FITS[key] = None
            return None
        if args.total_batch_size == AUTO:
            args.total_batch_size = resolve(run).batch
            if args.total_batch_size is None:  # a bad setting: training will say why
                _FITS[key] = None
                return None
        choose = auto or args.device_batch_size == AUTO
        cap = args.device_batch_cap if args.device_batch_size == AUTO else args.device_batch_size
        row = args.max_seq_len * nproc
        compile = args.compile if args.compile is not None else True
        accum_for = lambda b: max(1, args.total_batch_size // (b * row))  # noqa: E731
        if choose and memory_bytes is not None:
            batch, est, _ = memory.fitting_batch(config, cap, memory_bytes, accum_for, nproc, compile,
                                                 allowed=lambda b: args.total_batch_size % (b * row) == 0,
                                                 fp8=args.fp8)
            _FITS[key] = Fit(batch, est, True, batch is not None)
        else:
            est = memory.estimate(config, cap, nproc, accum_for(cap), compile, fp8=args.fp8)
            fits = memory_bytes is None or est.needed <= memory_bytes
            at_one = memory.estimate(config, 1, nproc, accum_for(1), compile, fp8=args.fp8) if not fits else None
            if at_one is not None and at_one.needed > memory_bytes:
                _FITS[key] = Fit(None, est, False, False)  # not even batch 1 would fit
            else:
                _FITS[key] = Fit(cap, est, False, fits)
    return _FITS[key]


def memory_cells(f):
    """The plan's memory columns of a Fit: peak per rank and the device batch."""
    from nanochat.planning.memory import GIB
    if f is None:
        return "—", "—"
    peak = f"{f.estimate.peak / GIB:.1f} GiB"
    if f.batch is None:
        return peak, "none fits"
    return peak, f"{f.batch}" + (" (auto)" if f.auto else "" if f.fits else " (too big)")


def shards_needed(runs):
    """Train shards of its corpus the longest run reads (one pass, TOKENS_PER_SHARD), plus 10 %."""
    # Rounded before the ceiling: 1.1 x 150 shards is 165, not the 166 its float gives.
    return max([math.ceil(round(1.1 * (resolve(r).tokens or 0) / TOKENS_PER_SHARD[r.corpus], 9)) for r in runs] + [1])


def progress(run_dir):
    """(finished, optimizer steps logged) of a run directory; (False, 0) when it is absent."""
    summary = _read_json(run_dir / "summary.json")
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


def _read_json(path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def measured_from_runs(runs_root, gpu_name="", device="cuda"):
    """Per-device tokens/s of every finished run under runs_root that trained on the device the
    plan prices: a GPU ("cuda"), the one `gpu_name` names where it names one (`same_gpu`
    against the run's recorded device_name; a run that records none is left out), or the CPU
    ("cpu": the offline demo's plan). A run on another device says nothing of this one's speed:
    a tiny CPU run priced an H200 run at 10,000 times its cost."""
    out = []
    root = Path(runs_root)
    if not root.is_dir():
        return out
    for run_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        s = _read_json(run_dir / "summary.json")
        if not s or not s.get("complete") or not s.get("tok_per_sec") or s.get("device") != device:
            continue
        name = s.get("device_name")
        if device == "cuda" and gpu_name and not (isinstance(name, str) and same_gpu(gpu_name, name)):
            continue
        variant = s.get("hc", "residual")
        n = stream_count(variant, s.get("hc_streams"))
        # tok_per_sec counts the whole step's tokens, i.e. every rank's.
        out.append(Throughput(variant, s.get("depth"), n, s["tok_per_sec"] / max(1, s.get("world_size", 1)),
                              f"run {run_dir.name} on {name or device}"))
    return out


def read_gpu_check(path, exact_only=False, gpu_name=""):
    """Throughputs from scripts.gpu_check's JSON (one GPU; none when `gpu_name` names another
    GPU than its env's device_name, or it names none): a forward + backward step without
    the optimizer (a slight overestimate of training throughput). From its "model" section, one
    entry per (depth, variant) with "label", "variant", "depth", "n" and "tokens_per_s" (the
    torch backend; the full-causal reference rows, label != variant, are skipped); and from its
    "kernels" section the whole-model rows ("run" "model D<depth>") with their "kernels"
    backend. A --tiny run's CPU toy numbers are not measurements of a paper run and are
    skipped, as are malformed entries. exact_only: see Throughput."""
    data = _read_json(Path(path))
    if not isinstance(data, dict) or data.get("profile") != "gpu":
        return []
    device = data.get("env", {}).get("device_name") if isinstance(data.get("env"), dict) else None
    if gpu_name and not (isinstance(device, str) and same_gpu(gpu_name, device)):
        return []
    entries = [dict(e, kernels="torch") for e in data.get("model") or [] if isinstance(e, dict)
               and e.get("label") == e.get("variant")]
    kernels = data.get("kernels")
    for e in kernels.get("rows") or [] if isinstance(kernels, dict) else []:
        run = e.get("run") if isinstance(e, dict) else None
        if isinstance(run, str) and run.startswith("model D") and run[7:].isdigit():
            entries.append(dict(e, depth=e.get("depth", int(run[7:]))))
    out = []
    for e in entries:
        variant, depth, rate, n, backend = (e.get(k) for k in ("variant", "depth", "tokens_per_s", "n", "kernels"))
        if not isinstance(variant, str) or not isinstance(depth, int) or not isinstance(rate, (int, float)) \
                or not rate > 0 or not isinstance(backend, str):
            continue
        n = stream_count(variant, n if isinstance(n, int) else None)
        out.append(Throughput(variant, depth, n, float(rate), Path(path).name, backend, exact_only))
    return out


# The measurement committed with the code (scripts.gpu_check on one GPU): it prices a plan for
# that GPU where nothing nearer was measured, for exactly the runs it measured.
COMMITTED_GPU_CHECK = Path(__file__).resolve().parents[2] / "docs" / "gpu_check.json"


# Words of a GPU's name that tell it from no other GPU: the vendor and brand, the form factor
# and memory type a GPU without "PCIe" or "NVL" in its name has anyway (SXM, HBM), and the
# architecture and edition words nvidia-smi adds ("NVIDIA RTX PRO 6000 Blackwell Server
# Edition"). The words left (the model, "PCIe", "NVL", "Ada", "Max-Q") tell GPUs apart.
GPU_NAME_NOISE = frozenset({"nvidia", "tesla", "geforce", "sxm", "sxm2", "sxm4", "sxm5", "hbm2", "hbm2e", "hbm3",
                            "hbm3e", "blackwell", "server", "workstation", "edition", "generation"})
_GB = re.compile(r"(\d+)gb")


def gpu_words(name):
    """The words of a GPU's name that tell it from other GPUs, lower case, and the memory the
    name states in GB (None where it states none): "NVIDIA A100-SXM4-80GB" -> ({"a100"}, 80)."""
    text = re.sub(r"(\d+)\s*gb\b", r"\1gb", name.lower())
    words = [w for w in re.split(r"[\s_-]+", text) if w and w not in GPU_NAME_NOISE]
    stated = [int(m.group(1)) for w in words if (m := _GB.fullmatch(w))]
    return frozenset(w for w in words if not _GB.fullmatch(w)), (stated[0] if stated else None)


def gpu_memory(name):
    """The memory a GPU's name means, in GB: the one it states, else the data sheet's for that
    name (nanochat.planning.memory's table: a bare "A100" is the 80 GB one); None where neither says."""
    stated = gpu_words(name)[1]
    if stated is not None:
        return stated
    from nanochat.planning.memory import gpu_memory_gib
    return gpu_memory_gib(name)


def same_gpu(name, device):
    """Whether the GPU named (PLAN_GPU: as nvidia-smi names it or as the README writes it,
    "H200", "A100 40GB", in any case, with or without "NVIDIA") is the device a measurement
    names: the same distinguishing words (H100 is not the H100 NVL, the H100 PCIe or the H200)
    and the same memory where both names imply one (A100 40GB is not the A100-SXM4-80GB)."""
    words, device_words = gpu_words(name)[0], gpu_words(device)[0]
    if not words or words != device_words:
        return False
    memory, device_memory = gpu_memory(name), gpu_memory(device)
    return memory is None or device_memory is None or memory == device_memory


def committed_measurement(gpu_name, path=COMMITTED_GPU_CHECK):
    """read_gpu_check of the committed measurement when it was made on the GPU named
    (`same_gpu`), each marked exact_only and "docs/..., <GPU>"; else []."""
    data = _read_json(Path(path))
    device = data.get("env", {}).get("device_name") if isinstance(data, dict) else None
    if not gpu_name or not isinstance(device, str) or not same_gpu(gpu_name, device):
        return []
    return [dataclasses.replace(m, source=f"docs/{Path(path).name}, {device}")
            for m in read_gpu_check(path, exact_only=True)]


def covered_line(measured):
    """Which runs the committed measurement prices (None when it prices none)."""
    committed = sorted({(m.source, m.variant, m.depth, m.kernels) for m in measured if m.exact_only})
    if not committed:
        return None
    return (f"measured in {committed[0][0]}: " + ", ".join(f"{v} D{d}" + ("" if k == "torch" else f" ({k})")
                                                          for _, v, d, k in committed)
            + "; any other run of the plan is priced otherwise (its column says how)")


@dataclass(frozen=True)
class Assumption:
    """Where nothing was measured: an MFU of the GPU's peak bf16 FLOP/s (common._PEAK_FLOPS)."""
    gpu: str
    peak: float  # FLOP/s of one GPU
    mfu: float = ASSUMED_MFU

    def throughput(self, run):
        """Tokens/s of one GPU for a run, from its FLOPs per token."""
        if resolve(run).flops_per_token is None:
            return None
        rate = self.mfu * self.peak / run.flops_per_token
        return Throughput(run.variant, run.depth, run.n, rate,
                          f"assumed: {self.mfu:.0%} MFU of {self.peak / 1e12:.0f} TFLOP/s, {self.gpu}")

    def describe(self):
        return (f"assumed: {self.mfu:.0%} MFU of the {self.gpu}'s peak bf16 {self.peak / 1e12:.0f} TFLOP/s (NVIDIA's "
                "data sheet, dense), over each run's FLOPs per token (gpt.estimate_flops); an assumption, not a "
                "measurement: a finished run or `python -m scripts.gpu_check` replaces it")


def assumption_for(gpu_name, mfu=ASSUMED_MFU):
    """The MFU assumption for a GPU by name, or None when the name is empty or its peak unknown."""
    if not gpu_name:
        return None
    from nanochat.common import peak_flops_for
    peak = peak_flops_for(gpu_name)
    return Assumption(gpu_name, peak, mfu) if math.isfinite(peak) else None


def family_of(variant):
    """The family a wiring declares (its SPEC's family: "hc" for the hyper-connections), None
    for a wiring that is a family of its own or a name this version does not register."""
    if variant not in connections.VARIANTS:
        return None
    return connections.spec(variant).family


_H_CONVENTION = {}  # wiring -> whether its layers follow the H-convention (one check per process)


def follows_h_convention(variant):
    """Whether a wiring's layers compute X_next = H_res X + H_post^T F(H_pre X) with the
    (h_pre, h_post, h_res) their `coefficients(X)` gives, of shapes (..., n), (..., n),
    (..., n, n): what SPEC family="hc" promises. Checked once on a tiny model (width 32, n as
    it defaults), its parameters moved off their init; False for any layer that cannot say."""
    if variant not in _H_CONVENTION:
        import torch

        from nanochat.gpt import GPTConfig
        holds = False
        try:
            with torch.random.fork_rng(devices=[]):
                g = torch.Generator().manual_seed(0)
                conn = connections.build(GPTConfig(sequence_len=8, vocab_size=64, n_layer=1, n_head=2, n_kv_head=2,
                                                   n_embd=32, hc=variant))
                conn.init_weights()
                with torch.no_grad():
                    for p in conn.parameters():
                        p.add_(0.1 * torch.randn(p.shape, generator=g))
                    M = torch.randn(32, 32, generator=g) / 32 ** 0.5
                    branch = lambda u: torch.tanh(u @ M)  # noqa: E731
                    layer, n = conn.layers[1], conn.n
                    X = torch.randn(2, 3, n, 32, generator=g)
                    h_pre, h_post, h_res = layer.coefficients(X)
                    if (h_pre.shape, h_post.shape, h_res.shape) == ((2, 3, n), (2, 3, n), (2, 3, n, n)):
                        read = branch((h_pre[..., None, :] @ X).squeeze(-2))
                        mixed = h_res @ X + h_post[..., None] * read[..., None, :]
                        holds = torch.allclose(layer(X, branch), mixed, atol=1e-5, rtol=1e-5)
        except Exception:  # a layer without coefficients(), or whose shapes do not broadcast so
            holds = False
        _H_CONVENTION[variant] = holds
    return _H_CONVENTION[variant]


def family_hint(variant):
    """One line for a registered wiring that has n streams and an H_res, declares no family,
    and whose layers follow the H-convention (follows_h_convention): it could declare
    family="hc", and without it the plan prices it as another variant and hc_report's family
    tables leave it out. None otherwise (frac's and the gated residual's layers do not follow it)."""
    if variant not in connections.VARIANTS:
        return None
    spec = connections.spec(variant)
    if spec.family is not None or not (spec.streams and spec.has_h_res) or not follows_h_convention(variant):
        return None
    return (f"hc={variant!r} has n streams and an H_res in the H-convention but declares no family: it could "
            "declare family=\"hc\" in its SPEC, and be priced from the HC family's measurements and listed in "
            "hc_report's family tables (docs/connections.md, 'The variant contract')")


def related(variant, other):
    """Whether a measurement of `other` may price a run of `variant`: the same wiring, or two
    members of one family (the HC members share the stream passes that residual's single
    state does without, and cost several times its step)."""
    return variant == other or (family_of(variant) is not None and family_of(variant) == family_of(other))


def same_backend(m, run):
    """Whether m ran the run's --hc-kernels backend (a single-state variant has none to differ)."""
    return m.kernels == run.kernels or single_state(run.variant)


def at_depth(m, run):
    """A relative's throughput for the run's depth: as measured at the same depth; at another,
    its tokens/s times the run's FLOPs per token at m's depth over at its own (the MFU kept).
    None where either FLOPs count is unknown (a bad setting)."""
    if m.depth == run.depth:
        return m
    key = _shape_key(run)
    there = _shape((key[0], key[1] + ("--depth", str(m.depth))))[1]
    here = resolve(run).flops_per_token
    return None if there is None or here is None else dataclasses.replace(m, per_gpu=m.per_gpu * there / here)


def relative_throughput(run, measured):
    """For a run nothing measured: its nearest measured relative (`related`) on its backend, the
    same depth first, then the same n, then the nearest depth, then its own variant, as at_depth
    gives it; None where none is measured."""
    relatives = sorted((m for m in measured if related(run.variant, m.variant) and same_backend(m, run)),
                       key=lambda m: (m.depth != run.depth, m.n != run.n, abs(m.depth - run.depth),
                                      m.variant != run.variant))
    return next((t for t in (at_depth(m, run) for m in relatives) if t is not None), None)


def find_throughput(run, measured, assumption=None):
    """The best throughput for a run and how it was had: "measured" (same variant, depth, n and
    backend; any backend for a single-state variant), "≈" (a measured relative's,
    `relative_throughput`), "another" (nothing of its family measured: another variant's at the
    same depth, taken as its own; never from an exact_only measurement), "assumed" (the MFU
    assumption), else (None, None)."""
    exact = [m for m in measured if (m.variant, m.depth, m.n) == (run.variant, run.depth, run.n)
             and same_backend(m, run)]
    if exact:
        return exact[0], "measured"
    relative = relative_throughput(run, measured)
    if relative is not None:
        return relative, "≈"
    same_depth = [m for m in measured if m.depth == run.depth and not m.exact_only]
    if same_depth:
        return same_depth[0], "another"
    rate = None if assumption is None else assumption.throughput(run)
    return (rate, "assumed") if rate is not None else (None, None)


def rate_cell(m, kind, run):
    """The plan's tokens/s column: the rate and where it comes from, marked "≈ ... from <the
    relative>" or "assumed" where it is not the run's own measurement."""
    if m is None:
        return "—"
    rate = format_count(m.per_gpu)
    if kind == "assumed":
        return f"assumed {rate}"
    if kind == "another":
        return f"assumed {rate} as {m.variant} ({m.source})"
    if kind == "≈":
        differs = (("" if m.depth == run.depth else f" D{m.depth}")
                   + ("" if m.n == run.n else f" n={m.n}, taken as measured"))
        return f"≈ {rate} from {m.variant}{differs} ({m.source})"
    return f"{rate} ({m.source})"


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


# The kinds of throughput (find_throughput) that are assumptions rather than measurements of
# the run or its family; and what the marks of the tokens/s column mean.
ASSUMED_KINDS = frozenset({"assumed", "another"})
LEGEND = ("≈ ... from V: not measured itself; priced from V, a measured relative (the same wiring, or a member of "
          "its SPEC family) on the same --hc-kernels backend, the same depth first, from another depth (D) scaled "
          "by FLOPs per token; from another stream count (n=...) taken as measured, not scaled: the stream passes "
          "move n*C values a token, so the rate of a wider n is high for it and of a narrower one low. assumed ... "
          "as V: no relative measured; another variant's measurement at the same depth taken as its own. Only "
          "measurements on the plan's GPU (--gpu-name, where given) or CPU price it. Evaluation time is not "
          "included.")


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


@dataclass(frozen=True)
class Memory:
    """The GPU the plan sizes device batches for: its name, its memory (None: unknown, the
    estimates are shown at the configs' batches) and whether base_train chooses the batch."""
    gpu: str
    bytes: int | None
    auto: bool

    def describe(self):
        from nanochat.planning.memory import GIB, MARGIN_FRACTION, MARGIN_GIB
        where = (f"the {self.gpu}'s {self.bytes / GIB:.0f} GiB (NVIDIA's data sheet)" if self.bytes else
                 "no GPU of known memory (set PLAN_GPU / --gpu-name): the configs' batches, unchecked")
        return (f"peak per rank: estimated max_memory_allocated of a training step at that device batch "
                f"(nanochat/planning/memory.py; compiled, bf16), which with {MARGIN_FRACTION:.0%} + {MARGIN_GIB:g} GiB of "
                f"margin must fit {where}; device batch: "
                + ("the largest power of two up to the config's that fits (--device-batch-size auto)" if self.auto
                   else "the config's") + ".")


def memory_for(gpu_name, auto):
    """The Memory of a GPU by name (its memory from nanochat.planning.memory's table, None when unknown)."""
    from nanochat.planning.memory import GIB, gpu_memory_gib
    gib = gpu_memory_gib(gpu_name) if gpu_name else None
    return Memory(gpu_name, None if gib is None else gib * GIB, auto)


def refused(runs, nproc, memory):
    """The error line for the runs still to train that fit the GPU at no device batch, or None."""
    from nanochat.planning.memory import GIB
    bad = [(r, f) for r in runs if not r.finished and (f := fit(r, nproc, memory.bytes, memory.auto)) is not None
           and f.batch is None]
    if not bad:
        return None
    return (f"error: {', '.join(r.tag for r, _ in bad)} cannot fit on the {memory.gpu} "
            f"({memory.bytes / GIB:.0f} GiB) even at device batch 1 (estimated "
            f"{max(f.estimate.needed for _, f in bad) / GIB:.1f} GiB with the margin): train them on a GPU with more "
            "memory, or shorten --max-seq-len")


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
