"""Pretrain a nanochat GPT with a chosen stream connection.

    python -m scripts.base_train --config configs/paper/d12_kromhc.toml
    torchrun --standalone --nproc_per_node=8 -m scripts.base_train --config ... [--flag value]
    torchrun --nnodes=2 --node_rank=R --rdzv-endpoint=HOST:PORT --nproc_per_node=8 -m scripts.base_train ...

The loop follows nanochat's base_train (commit 4d8dbaf): N+1 passes so that evaluation and
saving happen after the last step; schedules of LR (warmup, constant, linear warmdown),
Muon momentum (0.85 -> 0.95 over 300 steps) and Muon weight decay (linear to 0). On the
2026-07 trunk (--trunk, nanochat 92d63d4): warmup by steps, momentum 0.85 -> 0.97 over 400
steps then down to 0.90 over the warmdown, Muon weight decay cosine to 0, the total batch
automatic, no autocast (the model's layers cast their weights: nanochat/gpt.py Linear).
Differences that keep runs safe and exact: the checkpoint of a step is written before
that step's evaluations (an evaluation crash never loses training), resumption is exact
(dataloader, optimizer, RNG and loop state), and a non-finite loss stops the run.

On a cluster: a preemption signal (--save-on-signal) makes every rank finish its step, save
and exit with status 75; a checkpoint resumes on another number of ranks (optimizer state
and data position resharded; not bitwise); every rank checks its share before step 0; and
a rank that fails stops the others within seconds (nanochat/cluster/watchdog.py).

Read top to bottom: the schedules, the helpers the steps call, the run's state (Run), then the
steps of a run in the order main() calls them (setup, resume, the loop's save, evaluate and
training step, finish).
"""

import os

os.environ.setdefault("PYTORCH_ALLOC_CONF", "expandable_segments:True")

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from nanochat import checkpoint_manager as ckpt  # noqa: E402
from nanochat import saddle, trunks  # noqa: E402
from nanochat.cluster import preempt
from nanochat.planning import preflight
from nanochat.cluster import watchdog
from nanochat import connections  # noqa: E402
from nanochat.cli import run as run_command  # noqa: E402
from nanochat.connections import HC_OPTIONS, liveness  # noqa: E402
from nanochat.connections.backends import auto, fused, liger  # noqa: E402
from nanochat.common import (compute_cleanup, compute_dtype, compute_init, device_name,  # noqa: E402
                             get_peak_flops, peak_memory_mib, print0)
from nanochat.fp8 import check_device as check_fp8_device, convert as convert_fp8, disabled  # noqa: E402
from nanochat.gpt import attention_backend, autocast_for, build_model, compiled  # noqa: E402
from nanochat.report.format import format_duration  # noqa: E402
from nanochat.train_config import (AUTO, FLAG_DEFAULTS, RESUMABLE_CHANGES, dumps_toml, horizon_tokens,  # noqa: E402
                                   resolve_total_batch,
                                   model_config_for, num_iterations_for, parse_args, settings)

SAMPLE_PROMPTS = ["The capital of France is", "The chemical symbol of gold is",
                  "If yesterday was Friday, then tomorrow will be", "The opposite of hot is",
                  "The planets of the solar system are:", "My favorite color is", "If 5*x + 3 = 13, then x is"]


# ----------------------------------------------------------------------------- schedules

def lr_multiplier(step, num_iterations, warmup_ratio, warmdown_ratio, final_lr_frac, warmup_steps=0):
    warmup = warmup_steps if warmup_steps > 0 else round(warmup_ratio * num_iterations)
    warmdown = round(warmdown_ratio * num_iterations)
    if step < warmup:
        return (step + 1) / warmup
    if step <= num_iterations - warmdown:
        return 1.0
    progress = (num_iterations - step) / warmdown
    return progress + (1 - progress) * final_lr_frac


def muon_momentum(step, trunk=trunks.DEFAULT, num_iterations=None, warmdown_ratio=0.0):
    # the recipe's ramp, held at its peak (2026-01: 0.85 -> 0.95 over 300 steps), or then down
    # over the LR warmdown (2026-07: 0.85 -> 0.97 over 400 steps, then to 0.90)
    low, peak, ramp, end = trunks.recipe(trunk).muon_momentum
    if step < ramp:
        frac = step / ramp
        return (1 - frac) * low + frac * peak
    if end is not None:
        warmdown = round(warmdown_ratio * num_iterations)
        start = num_iterations - warmdown
        if step >= start:
            progress = (step - start) / warmdown
            return peak * (1 - progress) + end * progress
    return peak


def muon_weight_decay(step, num_iterations, weight_decay, trunk=trunks.DEFAULT):
    if trunks.recipe(trunk).muon_decay == "linear":
        return weight_decay * (1 - step / num_iterations)
    return weight_decay * 0.5 * (1 + math.cos(math.pi * step / num_iterations))  # cosine to 0


# ----------------------------------------------------------------------------- set-up helpers

def grad_accum_steps(total_batch_size, device_batch_size, seq_len, world_size):
    """Micro-steps per optimizer step, or one error naming batch sizes that would work."""
    per_step = device_batch_size * seq_len * world_size
    if total_batch_size % per_step == 0:
        return total_batch_size // per_step
    row = seq_len * world_size
    valid_dbs = [b for b in range(1, 2 * device_batch_size + 1) if total_batch_size % (b * row) == 0]
    lower = (total_batch_size // per_step) * per_step
    upper = lower + per_step
    raise SystemExit(
        f"error: --total-batch-size {total_batch_size} is not a multiple of device_batch_size x seq_len x "
        f"world_size = {device_batch_size} x {seq_len} x {world_size} = {per_step}. Use "
        + (f"--device-batch-size in {valid_dbs[-8:]}, or " if valid_dbs else "")
        + f"--total-batch-size {upper}" + (f" or {lower}" if lower > 0 else "") + ".")


def choose_device_batch(args, config, device, world_size, use_compile):
    """--device-batch-size auto: (batch, the log line). On a GPU the largest power of two up to
    the config's value whose estimated peak (nanochat/planning/memory.py) fits the device's total
    memory with the margin, among the batches the total batch divides into; on another
    device the config's value. A model that fits at no batch is refused here, before the run
    spends anything."""
    cap, T = args.device_batch_cap, args.max_seq_len
    if device.type != "cuda":
        return cap, (f"device batch {cap}: --device-batch-size auto sizes batches to a GPU's memory; on "
                     f"{device.type} it is the config's value")
    from nanochat.planning.memory import GIB, fitting_batch
    props = torch.cuda.get_device_properties(device)
    divides = lambda b: args.total_batch_size % (b * T * world_size) == 0  # noqa: E731
    batch, est, first = fitting_batch(config, cap, props.total_memory, world_size=world_size, compile=use_compile,
                                      fp8=args.fp8,
                                      accum_for=lambda b: args.total_batch_size // (b * T * world_size),
                                      allowed=divides)
    memory = f"{props.total_memory / GIB:.1f} GiB of the {props.name}"
    mode = ("compiled" if use_compile else "eager") + (", fp8" if args.fp8 else "")
    if batch is None:
        raise SystemExit(f"error: the model does not fit in {memory} even at device batch 1 ({mode}, estimated "
                         f"{est.needed / GIB:.1f} GiB with the margin): use a GPU with more memory"
                         + (", --compile true" if not use_compile else "") + " or a shorter --max-seq-len")
    why = ("the config's value fits" if batch == first.device_batch else
           f"{first.device_batch} would need {first.needed / GIB:.1f} GiB")
    return batch, (f"device batch {batch} (--device-batch-size auto, {mode}, {world_size} rank(s)): estimated "
                   f"{est.describe()}, within {memory}; {why}")


def out_of_memory(e, args, world_size, step, saved_step):
    """The error line of a step that ran out of GPU memory: the next smaller device batch the
    total batch divides into, and how the run continues (a resume may change the device batch)."""
    B, T = args.device_batch_size, args.max_seq_len
    smaller = [b for b in range(B - 1, 0, -1) if args.total_batch_size % (b * T * world_size) == 0]
    fix = (f"run the same command with --device-batch-size {smaller[0]} --resume true (gradient accumulation keeps "
           f"the total batch)" if smaller else "the model does not fit at device batch 1: use a GPU with more memory "
           "or a shorter --max-seq-len")
    where = (f"it continues from the checkpoint of step {saved_step}" if saved_step is not None
             else "no checkpoint was saved yet, so it starts over")
    return (f"error: out of GPU memory at device batch {B}, step {step} ({str(e).splitlines()[0]}): {fix}"
            + (f"; {where}" if smaller else ""))


def check_resume_settings(saved, current):
    """Settings that shape the trajectory must be the run's own. --device-batch-size may change
    (RESUMABLE_CHANGES): it only splits each step's rows, which the data loader packs alike
    whatever the split, so that a run that ran out of memory continues at a smaller batch; the
    gradients then sum in another order (not bitwise)."""
    # A setting added after the run was saved is absent from its record; at its default it
    # means what the run did.
    changed = sorted(k for k in current if k not in RESUMABLE_CHANGES
                     and saved.get(k, FLAG_DEFAULTS.get(k)) != current[k])
    if changed:
        details = ", ".join(f"{k}: {saved.get(k, FLAG_DEFAULTS.get(k))!r} -> {current[k]!r}" for k in changed)
        raise SystemExit(f"error: --resume with changed settings ({details}). Resume with the run's own "
                         f"config.toml, or start a new run under another --model-tag")


def check_resume_trunk(meta, trunk, run_dir):
    """A run keeps the trunk it started on (its checkpoint's model config records it; one
    written before the field existed ran 2026-01): the other trunk's model has other parameters
    and its optimizer other groups."""
    saved = meta["model_config"].get("trunk", trunks.DEFAULT)
    if saved != trunk:
        raise SystemExit(f"error: {run_dir} trained on the {saved} trunk, not {trunk}: resume it with --trunk {saved}, "
                         f"or train the {trunk} trunk under another --model-tag")


def check_resume_groups(saved, variant):
    """Residual runs saved before x0 and resid got nanochat's separate LRs hold one optimizer
    group for both; that state cannot continue under two groups."""
    if variant == "residual" and "scalar_lr" not in saved:
        raise SystemExit("error: this residual run was trained with both per-block scalars at --hc-lr, before "
                         "they got nanochat's separate LRs (--scalar-lr); its optimizer state cannot continue. "
                         "Start it again under another --model-tag (its checkpoints still load for evaluation)")


def connection_grad_norm(norms):
    """Gradient norm of the connection parameters: the optimizer groups named hc* together
    (one for the HC variants, two for the residual baseline's scalars)."""
    parts = [value for name, value in norms.items() if name.startswith("hc")]
    return math.sqrt(sum(float(v) ** 2 for v in parts)) if parts else None


# A wiring whose gradient is rounding in step 1 but not a saddle is looked at again this many
# steps later: by then the body has left nanochat's zero output projections.
SLOW_START_STEPS = 5


def start_check(hc_grad_norm, total_norm, config, step, is_saddle=saddle.is_saddle):
    """What the first gradient after an update says of the wiring's start: (one line or None,
    the step to look again at or None). Live: nothing. Rounding alone (connections/liveness.py:
    within one fp32 roundoff of the model's gradient norm), then the probe (nanochat/saddle.py)
    tells a saddle, which the body's moving does not end (a warning), from a slow start,
    which it does (a note, and another look SLOW_START_STEPS later: dead_connections)."""
    if not liveness.wiring_is_dead(hc_grad_norm, total_norm):
        return None, None
    seen = f"in step {step} (norm {hc_grad_norm:.1e} against the model's {total_norm:.1e})"
    if is_saddle(config):
        return (f"warning: hc={config.hc!r} starts at a saddle: its gradient is rounding alone {seen}, and stays so "
                "with the body moved off its init (nanochat/saddle.py); it leaves only where AdamW's eps turns "
                "rounding into steps, in a direction the hardware's rounding picks. Start it elsewhere "
                "(docs/variants.md, 'Dead by construction')"), None
    again = step + SLOW_START_STEPS
    return (f"slow start: hc={config.hc!r} got a gradient of rounding alone {seen}, but not at a saddle: with the "
            "body moved off its init it is live (nanochat/saddle.py), so it should learn as the body leaves its "
            f"init; looking again in step {again}"), again


def dead_connections(hc_grad_norm, total_norm, variant, step):
    """The look again at a slow start: the one warning line when no connection parameter got a
    gradient above rounding (connections/liveness.py; None: the wiring has no parameter), else
    None. Such a run's loss still falls, as the embedding and the head learn, but the wiring
    never moves: its start and the body's hold each other (zero scales in front of nanochat's
    zero output projections)."""
    if not liveness.wiring_is_dead(hc_grad_norm, total_norm):
        return None
    return (f"warning: every connection parameter of hc={variant!r} got no gradient above rounding in step {step} "
            f"(norm {hc_grad_norm:.1e} against the model's {total_norm:.1e}): this wiring cannot learn from its "
            "start (e.g. zero scales in front of nanochat's zero output projections); a wiring gives its "
            "sub-layers a start of their own through init_sublayers (docs/connections.md, 'Adding a wiring')")


def slow_start_over(hc_grad_norm, total_norm, variant, step):
    """The look again's line when the slow start ended."""
    return (f"slow start over: hc={variant!r} gets a live gradient in step {step} (norm {hc_grad_norm:.1e}, "
            f"{hc_grad_norm / total_norm:.1e} of the model's)")


def clean_metrics_log(path, resume_step):
    """Drop records at or after the resumed step: they are replayed identically, and the log
    must read as one uninterrupted run."""
    if not os.path.isfile(path):
        return
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    kept = []
    for line in lines:
        try:
            if json.loads(line)["step"] < resume_step:
                kept.append(line)
        except (ValueError, KeyError):
            break  # a torn last line from the kill: everything before it is whole
    ckpt.atomic_write(path, "".join(kept))


class MetricsLog:
    """metrics.jsonl in the run directory (rank 0), and wandb when a run name is given."""

    def __init__(self, path, wandb_run=None):
        self.file = open(path, "a") if path else None
        self.wandb = wandb_run

    def log(self, kind, step, **values):
        if self.file is None:
            return
        record = {"step": step, "kind": kind, **values}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.wandb is not None:
            flat = {f"{kind}/{k}": v for k, v in values.items() if isinstance(v, (int, float))}
            self.wandb.log(flat, step=step)

    def close(self):
        if self.file is not None:
            self.file.close()
        if self.wandb is not None:
            self.wandb.finish()


def init_wandb(args, config_values, master):
    if args.run == "dummy" or not master:
        return None
    import wandb
    try:
        return wandb.init(project="nanochat-hc", name=args.run, config=config_values)
    except Exception as e:  # an unconfigured online wandb fails here: say how to proceed
        raise SystemExit(f"error: wandb could not start ({e}). Log in (`wandb login`), or set "
                         f"WANDB_MODE=offline, or drop --run to disable wandb") from None


def gather_objects(obj, info):
    if not info.ddp:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def describe_reshard(saved_world, world_size, summary):
    """The log line of a resume on another number of ranks: what it guarantees."""
    e = summary["epoch"]
    behind = f"; {summary['behind']} old rank(s) still in epoch {e - 1} drop the rest of it" if summary["behind"] else ""
    return (f"resuming on {world_size} ranks a checkpoint written by {saved_world}: every parameter's optimizer "
            f"state gathered and resharded exactly; data, epoch {e}: the {summary['read']} of {summary['row_groups']} "
            f"row groups the old ranks had started are not read again, the unread rest of the {summary['partial']} "
            f"they were in the middle of is skipped{behind} ({summary['skipped_docs']:,} documents skipped in all), "
            f"and the {summary['carried_docs']:,} documents they had buffered are packed by the new ranks. The step "
            f"count and LR schedule continue; the run is not bitwise against an uninterrupted one (other batches)")


# ----------------------------------------------------------------------------- the run's state

def new_loop_record():
    """The counters a checkpoint records ("loop" in its meta), cumulative over the whole run (a
    resume continues them): tokens over all ranks, training FLOPs (estimate_flops per token x
    tokens) and seconds spent in steps only."""
    return {"smooth_train_loss": 0.0, "total_training_time": 0.0, "min_val_bpb": float("inf"), "val_bpb": None,
            "core_metric": None, "step_times": [], "tokens_per_sec": [], "tokens": 0, "flops": 0.0,
            "train_seconds": 0.0}


@dataclass
class Run:
    """One training run's state, which the steps below fill in and move on: what setup fixes
    (flags, device, tokenizer, model, optimizer, data) and what the loop advances (the step,
    the checkpoint's loop record, the prefetched batch, the agreed stop)."""
    args: argparse.Namespace
    info: object  # compute_init's ranks: rank, world_size, ddp, master
    device: torch.device
    stop: preempt.StopRequest
    dtype: torch.dtype
    # setup: the tokenizer, the model's config, the run directory
    tokenizer_dir: str = None
    tokenizer: object = None
    vocab_size: int = None
    token_bytes: torch.Tensor = None
    config: object = None  # GPTConfig
    autocast: object = None  # the context every forward runs in (gpt.autocast_for)
    use_compile: bool = None
    model_tag: str = None
    run_dir: str = None
    values: dict = None  # the resolved settings: config.toml and the checkpoint's record
    # find_checkpoint: the checkpoint continued from (None: a fresh start)
    resume_meta: dict = None
    start_step: int = 0
    loop: dict = field(default_factory=new_loop_record)
    # make_model: the model the steps call (compiled or not), the module it wraps, what it sizes
    model: torch.nn.Module = None
    orig_model: torch.nn.Module = None
    counts: dict = None
    flops_per_token: float = None
    accum: int = None  # micro-batches per step
    num_iterations: int = None
    horizon_source: str = None  # where num_iterations came from (a log line's part)
    batch_lr_scale: float = None
    weight_decay: float = None  # Muon's, in force
    decay_rule: str = None  # how it was scaled (a log line's part)
    # check_data, make_optimizer, open_data, open_log
    corpus: dict = None
    data_dir: str = None
    core_bundle: str = None  # CORE's eval bundle directory (--core-metric-every > 0)
    optimizer: object = None
    train_loader: object = None
    val_rows: object = None  # the val rows every evaluation reads, packed once
    log: "MetricsLog" = None
    peak_flops: float = None
    # the loop
    step: int = 0
    saved_step: int = 0  # the step whose checkpoint is on disk (none for a fresh start)
    batch: tuple = None  # the next step's first micro-batch, fetched while the GPU still works
    batch_state: dict = None  # the loader's state before that fetch: what a checkpoint of this step records
    look_again: int = None  # the step a slow start of the wiring is looked at again (start_check)
    stopping: bool = False  # every rank has agreed to stop: a signal reached at least one of them
    votes: torch.Tensor = None  # the step's loss and stop vote, all-reduced together
    elapsed_before: float = 0.0  # wall time of earlier processes of this run
    t_start: float = 0.0
    whole_split_noted: bool = False  # the line saying val bpb reads the whole val split was printed

    @property
    def master(self):
        return self.info.master

    @property
    def preempted_marker(self):
        return os.path.join(self.run_dir, "preempted.json")  # written when a signal stops the run


def due(every, step, last):
    return last or (every > 0 and step > 0 and step % every == 0)


def agree(run, vote):
    """Does any rank vote to stop? (One collective; the training step folds it into its own.)"""
    if not run.info.ddp:
        return vote
    votes = torch.tensor([float(vote)], device=run.device)
    dist.all_reduce(votes)
    return votes.item() > 0


@contextmanager
def evaluating(model, autocast):
    """The one switch to evaluation: within, `model` (compiled or not) in eval mode with its
    float8 layers plain (nanochat/fp8.py), under the run's autocast; in train mode after."""
    with autocast, disabled(model):
        model.eval()
        try:
            yield
        finally:
            model.train()


# ----------------------------------------------------------------------------- setup

def setup(argv):
    """Flags, ranks and device, tokenizer, the model's config and the run directory's name."""
    args = parse_args(argv)
    info, device = compute_init(args.device_type, seed=args.seed, timeout_s=args.dist_timeout)
    run = Run(args=args, info=info, device=device, stop=preempt.StopRequest(args.save_on_signal, announce=info.master),
              dtype=compute_dtype(device.type))
    open_tokenizer(run)
    configure(run)
    run.model_tag = args.model_tag or f"d{args.depth}_{run.config.hc}"
    run.run_dir = ckpt.run_dir_for(run.model_tag)
    run.values = settings(args, run.config.hc)
    run.values["model_tag"] = run.model_tag
    return run


def open_tokenizer(run):
    """The corpus's trained tokenizer (one per corpus, side by side), checked against the config."""
    from nanochat.tokenizer import default_tokenizer_dir, get_token_bytes, get_tokenizer
    args = run.args
    run.tokenizer_dir = default_tokenizer_dir(args.corpus)
    run.tokenizer = get_tokenizer(run.tokenizer_dir)
    run.vocab_size = vocab_size = run.tokenizer.get_vocab_size()
    if args.vocab_size and args.vocab_size != vocab_size:
        corpus_flag = "" if args.corpus == "fineweb-edu" else f" --corpus {args.corpus}"
        raise SystemExit(f"error: the config expects vocab_size={args.vocab_size} but the trained tokenizer has "
                         f"{vocab_size}; retrain it with `python -m scripts.tok_train --vocab-size {args.vocab_size}"
                         f"{corpus_flag}`")
    run.token_bytes = get_token_bytes(device=run.device, tokenizer_dir=run.tokenizer_dir)


def configure(run):
    """The model's config on this device (kernels, attention, float8, compile checked) and the
    batch sizes that --total-batch-size / --device-batch-size auto leave to the run."""
    args, device = run.args, run.device
    try:
        config = model_config_for(args, run.vocab_size)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    # 2026-07 has no autocast: the activations carry the compute dtype from the embedding tables
    # on and every layer casts its weight to them (nanochat/gpt.py Linear)
    run.autocast = autocast_for(config, device.type, run.dtype)
    if attention_backend(config.attention, device) == "flex" and device.type != "cuda":
        raise SystemExit(f"error: --attention flex trains on CUDA only (FlexAttention has no backward on "
                         f"{device.type}); use --attention auto or sdpa")
    config, note = auto.resolve(config, device, device_name(device))
    if note:
        print0(note)
    backend = {"liger": liger, "fused": fused}.get(config.hc_kernels)
    if backend is not None and not backend.runs_on(device.type):
        raise SystemExit(f"error: --hc-kernels {config.hc_kernels} runs Triton kernels on CUDA only, not on "
                         f"{device.type}; use --hc-kernels torch or auto")
    if args.fp8:
        check_fp8_device(device)
    run.use_compile = args.compile if args.compile is not None else device.type == "cuda"
    if args.total_batch_size == AUTO:
        args.total_batch_size, batch_note = resolve_total_batch(args, config, run.vocab_size)
        print0(batch_note)
    if args.device_batch_size == AUTO:
        args.device_batch_size, batch_note = choose_device_batch(args, config, device, run.info.world_size,
                                                                 run.use_compile)
        print0(batch_note)
    run.config = config


def find_checkpoint(run):
    """--resume: the latest complete checkpoint, checked against this run (trunk, settings,
    optimizer groups, tokenizer); without it, a run directory that holds none."""
    args, run_dir, vocab_size = run.args, run.run_dir, run.vocab_size
    if args.resume:
        step = ckpt.latest_step(run_dir)
        if step is None:
            print0(f"--resume: no complete checkpoint in {run_dir}; starting from scratch")
        else:
            resume_meta = ckpt.load_meta(run_dir, step)
            check_resume_trunk(resume_meta, args.trunk, run_dir)
            check_resume_settings(resume_meta["settings"], run.values)
            check_resume_groups(resume_meta["settings"], run.config.hc)
            if resume_meta["model_config"]["vocab_size"] != vocab_size:
                raise SystemExit(f"error: the run was trained with a {resume_meta['model_config']['vocab_size']}-token "
                                 f"tokenizer but the trained tokenizer has {vocab_size}; resume with the run's own "
                                 f"tokenizer (the NANOCHAT_BASE_DIR it was trained under)")
            run.resume_meta, run.start_step = resume_meta, step
    elif run.master and ckpt.saved_steps(run_dir):
        raise SystemExit(f"error: {run_dir} already holds checkpoints; pass --resume to continue it, "
                         f"or choose another --model-tag")
    if run.master and os.path.exists(run.preempted_marker):
        os.remove(run.preempted_marker)


def make_model(run):
    """The model (the checkpoint's weights on a resume; float8 and compiled as asked) and what it
    sizes: steps, gradient accumulation, the batch's LR scale, Muon's weight decay."""
    args, config, vocab_size = run.args, run.config, run.vocab_size
    torch.manual_seed(args.seed)
    model = build_model(config, run.device)
    if run.resume_meta is not None:
        model.load_state_dict(ckpt.load_model_state(run.run_dir, run.start_step, run.device), strict=True)
    if args.fp8:  # before compiling: the graphs are traced with the float8 layers
        converted, kept = convert_fp8(model)
        print0(f"fp8: {len(converted)} linear layers train in float8 (e4m3 forward, e5m2 gradients); "
               f"{len(kept)} stay as they are ({', '.join(sorted(set(kept.values())))}); MFU stays against the "
               "bf16 peak, as for every run (comparable across runs; the float8 matmuls' own peak is twice it)")
    run.orig_model = run.model = model
    if run.use_compile:
        run.model = compiled(model, args.compile_mode)

    run.counts = model.param_counts()
    run.flops_per_token = model.estimate_flops()
    run.accum = grad_accum_steps(args.total_batch_size, args.device_batch_size, args.max_seq_len,
                                 run.info.world_size)
    run.num_iterations, run.horizon_source = num_iterations_for(args, model, args.total_batch_size)
    run.batch_lr_scale = trunks.batch_lr_scale(args.total_batch_size)
    horizons = (horizon_tokens(args, config, vocab_size)
                if trunks.recipe(args.trunk).weight_decay_scaling == "horizon" else None)
    weight_decay = trunks.scaled_weight_decay(args.trunk, args.weight_decay, args.depth, args.total_batch_size,
                                              horizons)
    decay_rule = (f"{args.weight_decay} x (12/{args.depth})^2, as nanochat 4d8dbaf scales it" if horizons is None else
                  f"{args.weight_decay} x sqrt({args.total_batch_size}/2^19) x ({horizons[1]:,.0f}/{horizons[0]:,}), "
                  "depth 12's horizon over this run's, as nanochat 92d63d4 scales it")
    run.weight_decay, run.decay_rule = weight_decay, decay_rule


def describe(run):
    """The log lines that say what this run is, before it reads any data."""
    args, config, counts = run.args, run.config, run.counts
    print0(f"run directory: {run.run_dir}")
    print0(f"model: depth {config.n_layer}, width {config.n_embd}, heads {config.n_head}, context {args.max_seq_len}, "
           f"vocab {run.vocab_size}, windows {run.orig_model.window_sizes}")
    options = [f"{name} {getattr(config, name)}" for name, choices in HC_OPTIONS.items()
               if getattr(config, name) != choices[0]]
    spec = connections.spec(config.hc)
    print0(f"connections: {config.hc} ({spec.label}), n={config.hc_streams}"
           + (f", {spec.settings(config)}" if spec.settings else "")
           + "".join(f", {option}" for option in options))
    if run.resume_meta is None and connections.pretraining_warning(config):
        print0(connections.pretraining_warning(config))
    print0(f"parameters: {counts['total']:,} total, {counts['non_embedding']:,} non-embedding "
           f"(value embeddings {'on' if config.value_embeds else 'off'}); by role: "
           + ", ".join(f"{k} {counts[k]:,}" for k in ("wte", "value_embeds", "lm_head", "transformer_matrices",
                                                       "connections")))
    print0(f"FLOPs per token: {run.flops_per_token:.3e}; steps: {run.num_iterations} (from {run.horizon_source}); "
           f"tokens: {run.num_iterations * args.total_batch_size:,}; gradient accumulation: {run.accum}")
    print0(f"trunk {args.trunk}; LR scale for batch {args.total_batch_size}: x{run.batch_lr_scale:.4f}; Muon weight "
           f"decay in force: {run.weight_decay:.4g} (= {run.decay_rule})")
    print0(f"device {run.device}, compute dtype {run.dtype}, world size {run.info.world_size}, compile "
           f"{run.use_compile}, attention {attention_backend(config.attention, run.device)} (--attention "
           f"{config.attention})")


def check_data(run):
    """The corpus holds the run's tokens and matches its tokenizer, and CORE's bundle and tasks
    are there: checked now (on every rank: it reads metadata only), not at step 2000."""
    from nanochat.data.shards import DatasetError, check_enough_data, check_tokenizer_corpus, corpus_record
    args = run.args
    run.corpus = corpus = corpus_record(args.data_dir or None, args.corpus)
    run.data_dir = corpus["data_dir"]  # the --corpus's own directory when no --data-dir names one
    try:  # on every rank, so that all of them stop together
        check_enough_data(run.num_iterations * args.total_batch_size, data_dir=run.data_dir)
        check_tokenizer_corpus(corpus, run.tokenizer_dir)
    except DatasetError as e:
        raise SystemExit(f"error: {e}") from None
    print0(f"data: {corpus['description']} in {corpus['data_dir']}")
    if args.core_metric_every > 0:
        from nanochat.core_eval import resolve_eval_bundle, select_tasks
        try:
            run.core_bundle = resolve_eval_bundle(args.eval_bundle or None)
            select_tasks(run.core_bundle, args.core_tasks, args.core_metric_max_per_task)
        except (ValueError, OSError) as e:
            raise SystemExit(f"error: CORE during training (--core-metric-every {args.core_metric_every}): {e}"
                             "\n(or pass --core-metric-every -1 to train without CORE)") from None


def make_optimizer(run):
    """nanochat's parameter groups at the batch's LR scale, in the (distributed) optimizer."""
    from nanochat.optim import build_optimizer
    args, scale = run.args, run.batch_lr_scale
    groups = run.orig_model.param_groups(
        unembedding_lr=args.unembedding_lr * scale, embedding_lr=args.embedding_lr * scale,
        matrix_lr=args.matrix_lr * scale, weight_decay=run.weight_decay, hc_lr=args.hc_lr * scale,
        scalar_lr=args.scalar_lr * scale, x0_betas=(args.x0_beta1, 0.95))
    run.optimizer = build_optimizer(groups, run.info.world_size)


def resume(run):
    """From the checkpoint found (if any): the optimizer's state, this rank's RNG and the loop's
    record; returns this rank's dataloader state (None: from the start). On another number of
    ranks, both the optimizer's and the data's states are resharded."""
    meta, info, start_step = run.resume_meta, run.info, run.start_step
    if meta is None:
        return None
    from nanochat.dataloader import reshard_states
    saved_world = meta["world_size"]
    loader_states = [rank_state["dataloader"] for rank_state in meta["ranks"]]
    if saved_world == info.world_size:
        run.optimizer.load_state_dict(ckpt.load_optimizer_state(run.run_dir, start_step, info.rank, run.device))
        loader_state = loader_states[info.rank]
    else:  # every rank reads every old shard (on the CPU) and keeps what it now owns
        run.optimizer.load_resharded([ckpt.load_optimizer_state(run.run_dir, start_step, r, "cpu")
                                      for r in range(saved_world)])
        new_states, summary = reshard_states(loader_states, info.world_size, run.data_dir, order_seed(run.args))
        loader_state = new_states[info.rank]
        print0(describe_reshard(saved_world, info.world_size, summary))
    # training draws no random numbers; a new rank takes an old one's state all the same
    ckpt.restore_rng_state(meta["ranks"][info.rank % saved_world]["rng"])
    loop = run.loop
    loop.update(meta["loop"])
    if "tokens" not in loop:  # a checkpoint from before the compute records: rebuilt from its step
        loop.update(tokens=start_step * run.args.total_batch_size,
                    flops=start_step * run.args.total_batch_size * run.flops_per_token,
                    train_seconds=loop["total_training_time"])
    print0(f"resumed from step {start_step} of {run.run_dir}")
    return loader_state


def order_seed(args):
    """The seed of the training data's order; None: nanochat's fixed order."""
    return args.data_seed if args.data_seed >= 0 else None


def open_data(run, loader_state):
    """The training loader (at the resumed position), the val rows, and every rank's preflight
    check of its share (nanochat/planning/preflight.py) before step 0."""
    from nanochat.dataloader import BestFitLoader, SplitRows
    args, info, T = run.args, run.info, run.args.max_seq_len
    # 2026-07 packs rows as nanochat 92d63d4's loader does (a tokenizer batch per refill)
    batch_refill = trunks.recipe(args.trunk).batch_refill
    try:
        run.train_loader = BestFitLoader(run.tokenizer, args.device_batch_size, T, "train", device=run.device,
                                         rank=info.rank, world_size=info.world_size, data_dir=run.data_dir,
                                         state=loader_state, order_seed=order_seed(args), batch_refill=batch_refill)
    except ValueError as e:  # a saved dataloader state that does not match this run
        raise SystemExit(f"error: {e}") from None
    # The val rows every evaluation reads, packed once (the same rows whatever the number of ranks).
    run.val_rows = (SplitRows(run.tokenizer, T, "val", max(1, args.eval_tokens // T), info.rank, info.world_size,
                              run.data_dir, batch_refill=batch_refill) if args.eval_every != 0 else None)
    facts = gather_objects(preflight.rank_facts(info.rank, run.run_dir, run.token_bytes, run.train_loader,
                                                run.val_rows), info)
    preflight.check(facts, run.run_dir, info.rank)
    if info.ddp:
        dist.barrier()  # every rank has looked for the others' probe files
    preflight.remove_probe(run.run_dir, info.rank)
    print0(preflight.summary(facts))


def open_log(run):
    """The run directory's settings and corpus records, metrics.jsonl (cut back to the resumed
    step, or new), wandb; and the device's peak FLOPs for MFU."""
    run_dir, master = run.run_dir, run.master
    metrics_path = os.path.join(run_dir, "metrics.jsonl") if master else None
    if master:
        os.makedirs(run_dir, exist_ok=True)
        ckpt.atomic_write(os.path.join(run_dir, "config.toml"),
                          dumps_toml(run.values, header=f"Resolved settings of run {run.model_tag}"))
        ckpt.atomic_write(os.path.join(run_dir, "corpus.json"), json.dumps(run.corpus, indent=1))
        if run.start_step:
            clean_metrics_log(metrics_path, run.start_step)
        elif os.path.exists(metrics_path):
            os.remove(metrics_path)
    run.log = MetricsLog(metrics_path, init_wandb(run.args, run.values, master))
    run.peak_flops = get_peak_flops(run.device)


def start_loop(run):
    """The loop's state at the resumed step (or 0), its clock, and no batch fetched yet."""
    run.step = run.saved_step = run.start_step
    gc.collect()
    run.loop.setdefault("elapsed", 0.0)  # wall time of earlier processes (checkpoints before it lack it)
    run.elapsed_before, run.t_start = run.loop["elapsed"], time.time()
    run.votes = torch.zeros(2, device=run.device)


# ----------------------------------------------------------------------------- save and evaluate

def save(run):
    """Write this step's checkpoint. A signal that asked any rank to stop sets run.stopping: the
    vote rides on the save's own all-reduce, so one that came during the save stops the run now."""
    step, run_dir, info = run.step, run.run_dir, run.info
    loader_state = run.batch_state if run.batch is not None else run.train_loader.state_dict()
    if not all(torch.isfinite(p).all() for p in run.orig_model.parameters()):
        raise SystemExit(f"error: non-finite parameters at step {step}; not saving them. The last good "
                         f"checkpoint is step {ckpt.latest_step(run_dir)} in {run_dir}.")
    ranks = gather_objects({"dataloader": loader_state, "rng": ckpt.encode_rng_state()}, info)
    meta = None
    if run.master:
        meta = {"step": step, "model_config": ckpt.config_record(run.config),
                "wiring_file": connections.wiring_file(run.config.hc), "settings": run.values,
                "world_size": info.world_size, "num_iterations": run.num_iterations,
                "loop": run.loop, "ranks": ranks}
    try:
        ckpt.save_rank_files(run_dir, step, info.rank, run.optimizer.state_dict(),
                             model_state=run.orig_model.state_dict() if run.master else None, meta=meta)
        failure = None
    except OSError as e:  # e.g. no space left: this step's files are gone, the previous ones intact
        failure = e
    status = torch.tensor([float(failure is not None), float(run.stop.requested)], device=run.device)
    if info.ddp:
        dist.all_reduce(status)  # also the barrier: every rank has written its files
    failed, stop_votes = status.tolist()
    if failed:
        good = ckpt.latest_step(run_dir)
        raise SystemExit(f"error: the checkpoint of step {step} could not be written "
                         f"({failure or 'on another rank'}). "
                         + (f"The last complete checkpoint is step {good} in {run_dir}: free disk space (or "
                            f"lower --keep-checkpoints) and continue with --resume true." if good is not None
                            else "No checkpoint was saved yet: free disk space and run again."))
    if run.master:
        ckpt.mark_latest(run_dir, step)
        pruned = ckpt.prune(run_dir, run.args.keep_checkpoints, final_step=run.num_iterations)
        print0(f"saved checkpoint of step {step}; run directory {ckpt.human_bytes(ckpt.dir_size(run_dir))}"
               + (f" after deleting step(s) {', '.join(map(str, pruned))} (--keep-checkpoints "
                  f"{run.args.keep_checkpoints})" if pruned else ""))
    run.stopping = stop_votes > 0 or run.stopping
    run.saved_step = step


@dataclass(frozen=True)
class Due:
    """The evaluations a pass of the loop runs."""
    val: bool
    core: bool
    sample: bool
    hc: bool

    def __bool__(self):
        return self.val or self.core or self.sample or self.hc


def evaluations_due(run, last):
    """Which evaluations this step runs: val bpb also at step 0, all of them after the last step."""
    args, step = run.args, run.step
    return Due(val=args.eval_every != 0 and (last or (args.eval_every > 0 and step % args.eval_every == 0)),
               core=args.core_metric_every > 0 and due(args.core_metric_every, step, last),
               sample=args.sample_every > 0 and due(args.sample_every, step, last),
               hc=args.hc_stats_every > 0 and run.config.hc != "residual" and due(args.hc_stats_every, step, last))


def evaluate(run, evals):
    """The evaluations due, each printed and logged; the loop's record keeps the last val bpb
    and CORE for the summary (samples and connection statistics on rank 0 alone)."""
    step, loop = run.step, run.loop
    if evals.val:
        bpb = val_bpb(run)
        loop["val_bpb"] = bpb
        loop["min_val_bpb"] = min(loop["min_val_bpb"], bpb)
        print0(f"step {step:05d} | val bpb {bpb:.4f}")
        run.log.log("val", step, bpb=bpb, flops=loop["flops"], tokens=loop["tokens"],
                    train_seconds=loop["train_seconds"])
    if evals.core:
        out = core_metric(run)
        loop["core_metric"] = out["core_metric"]
        print0(f"step {step:05d} | CORE {out['core_metric']:.4f}")
        run.log.log("core", step, core_metric=out["core_metric"], centered=out["centered_results"],
                    results=out["results"])
    if evals.sample and run.master:
        print_samples(run)
    if evals.hc and run.master:
        run.log.log("hc", step, **hc_stats(run))


def val_bpb(run):
    from nanochat.loss_eval import evaluate_bpb
    B, rows = run.args.device_batch_size, run.val_rows
    with evaluating(run.model, run.autocast):
        result = evaluate_bpb(run.model, rows.batches(B, run.device), rows.num_batches(B), run.token_bytes)
    if rows.exhausted and not run.whole_split_noted:
        run.whole_split_noted = True
        print0(f"val bpb is over the whole val split, {result.tokens:,} tokens: it holds fewer than "
               f"--eval-tokens {run.args.eval_tokens:,}")
    return result.bpb


def core_metric(run):
    from nanochat.core_eval import evaluate_core
    model, args = run.orig_model, run.args
    with evaluating(model, run.autocast):
        return evaluate_core(model, run.tokenizer, run.device, run.core_bundle,
                             max_per_task=args.core_metric_max_per_task, tasks=args.core_tasks,
                             max_seq_len=model.rotary_len)


def print_samples(run):
    model, tokenizer = run.orig_model, run.tokenizer
    bos = tokenizer.get_bos_token_id()
    with evaluating(model, run.autocast):
        for prompt in SAMPLE_PROMPTS:
            ids = tokenizer.encode(prompt, prepend=bos)
            out = list(model.generate(ids, max_tokens=16, temperature=0))
            print0(f"  {prompt!r} -> {tokenizer.decode(out)!r}")


def hc_stats(run):
    from nanochat.connections.diagnostics import collect_hc_stats
    from nanochat.dataloader import BestFitLoader
    with BestFitLoader(run.tokenizer, 1, run.args.max_seq_len, "val", device=run.device,
                       data_dir=run.data_dir) as val_loader:
        x, _ = next(val_loader)
    with evaluating(run.orig_model, run.autocast):
        return collect_hc_stats(run.orig_model, x)


# ----------------------------------------------------------------------------- the training step

def train_step(run):
    """One optimizer step: (the loss averaged over the ranks, the LR multiplier, seconds). The GPU
    is kept busy: each micro-batch is fetched (packed on the CPU, copied from pinned memory
    without blocking) while the previous backward runs; the distributed optimizer's reductions
    start from gradient hooks during the last backward; loss and grad norms are read only after
    the whole step is queued."""
    args, step, num_iterations, weight_decay = run.args, run.step, run.num_iterations, run.weight_decay
    optimizer, train_loader, accum = run.optimizer, run.train_loader, run.accum
    t0 = time.time()
    try:
        loss_sum = torch.zeros((), device=run.device)
        for micro in range(accum):
            x, y = run.batch if run.batch is not None else next(train_loader)
            run.batch = None
            with run.autocast:
                loss = run.model(x, y)
            loss_sum += loss.detach()
            if micro == accum - 1:
                optimizer.launch_reductions_in_backward()
            (loss / accum).backward()
            # Prefetch the next micro-batch. Across the step boundary, first note the loader's
            # state: a checkpoint of the next step must not count the prefetched batch.
            if micro == accum - 1 and step + 1 < num_iterations:
                run.batch_state = train_loader.state_dict()
            if micro < accum - 1 or step + 1 < num_iterations:
                run.batch = next(train_loader)
        lrm = lr_multiplier(step, num_iterations, args.warmup_ratio, args.warmdown_ratio, args.final_lr_frac,
                            args.warmup_steps)
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * lrm
            if group["kind"] == "muon":
                group["momentum"] = muon_momentum(step, args.trunk, num_iterations, args.warmdown_ratio)
                group["weight_decay"] = muon_weight_decay(step, num_iterations, weight_decay, args.trunk)
        optimizer.step(measure_grad_norm=True)
    except torch.cuda.OutOfMemoryError as e:
        raise SystemExit(out_of_memory(e, args, run.info.world_size, step, ckpt.latest_step(run.run_dir))) from None
    run.model.zero_grad(set_to_none=True)
    train_loss = agree_on_loss(run, loss_sum / accum)
    return train_loss, lrm, time.time() - t0


def agree_on_loss(run, loss):
    """The step's loss averaged over the ranks, and its stop vote: the vote rides on the loss's
    all-reduce, so a signal that reached any rank stops all of them after this same step, at no
    extra collective. A non-finite loss stops the run."""
    votes = run.votes
    votes[0] = loss
    votes[1] = float(run.stop.requested)
    if run.info.ddp:
        dist.all_reduce(votes)  # gloo has no AVG: sum, then divide
    train_loss, stop_votes = votes.tolist()  # the step's one host synchronization
    train_loss /= run.info.world_size
    run.stopping = stop_votes > 0
    if not math.isfinite(train_loss):
        good = ckpt.latest_step(run.run_dir)
        raise SystemExit(f"error: non-finite training loss ({train_loss}) at step {run.step}. The run stops here; "
                         + (f"the last good checkpoint is step {good} in {run.run_dir}." if good is not None
                            else "no checkpoint was saved yet (use --save-every to keep some)."))
    return train_loss


def report_step(run, train_loss, lrm, dt):
    """The step's line and metrics record, the loop's record moved on, and the look at the
    wiring's start (start_check) after the first update of this process."""
    step, loop, tokens_per_step, flops_per_token = run.step, run.loop, run.args.total_batch_size, run.flops_per_token
    beta = 0.9  # debiased EMA of the loss, as nanochat prints it
    loop["smooth_train_loss"] = beta * loop["smooth_train_loss"] + (1 - beta) * train_loss
    smooth = loop["smooth_train_loss"] / (1 - beta ** (step + 1))
    loop["tokens"] += tokens_per_step
    loop["flops"] += flops_per_token * tokens_per_step
    loop["train_seconds"] += dt
    if step > 10:  # skip compile/warm-up steps in the timing statistics
        loop["total_training_time"] += dt
        loop["step_times"].append(dt)
        loop["tokens_per_sec"].append(tokens_per_step / dt)
    tok_per_sec = tokens_per_step / dt
    mfu = 100 * flops_per_token * tokens_per_step / dt / (run.peak_flops * run.info.world_size)
    norms = run.optimizer.grad_norms
    peak_mem = peak_memory_mib(run.device)
    # Wall time, evaluations included, so the ETA is what the user will wait.
    loop["elapsed"] = run.elapsed_before + time.time() - run.t_start
    eta = (time.time() - run.t_start) / (step + 1 - run.start_step) * (run.num_iterations - step - 1)
    epoch = run.train_loader.epoch
    print0(f"step {step:05d}/{run.num_iterations} | loss {train_loss:.4f} (smooth {smooth:.4f}) | lrm {lrm:.3f} | "
           f"grad norm {norms['total']:.3f} | dt {dt * 1000:.0f} ms | tok/s {tok_per_sec:,.0f} | "
           f"mfu {mfu:.2f} | epoch {epoch} | elapsed {format_duration(loop['elapsed'])} | "
           f"eta {format_duration(eta)}")
    hc_grad_norm = connection_grad_norm(norms)
    run.log.log("train", step, loss=train_loss, loss_smooth=smooth, lrm=lrm, grad_norm=norms["total"],
                hc_grad_norm=hc_grad_norm, tok_per_sec=tok_per_sec, mfu=mfu, dt=dt, peak_mem_mib=peak_mem,
                total_time=loop["total_training_time"], epoch=epoch, tokens=(step + 1) * tokens_per_step)
    look_at_start(run, hc_grad_norm, norms)


def look_at_start(run, hc_grad_norm, norms):
    """The wiring's start after the first update (start_check; the probe on rank 0 alone: the
    line is rank 0's), and again SLOW_START_STEPS later for a slow start."""
    step, config = run.step, run.config
    if step == max(run.start_step, 1):
        line, run.look_again = (start_check(hc_grad_norm, float(norms["total"]), config, step) if run.master
                                else (None, None))
    elif step == run.look_again:
        line = (dead_connections(hc_grad_norm, float(norms["total"]), config.hc, step)
                or slow_start_over(hc_grad_norm, float(norms["total"]), config.hc, step))
    else:
        line = None
    if line:
        print0(line)


def advance(run):
    """On to the next step. As nanochat: after the first step (compilation done) freeze what
    exists and stop the cyclic garbage collector, whose scans paused steps for ~500 ms; collect
    by hand rarely."""
    run.step += 1
    if run.step == run.start_step + 1:
        gc.collect()
        gc.freeze()
        gc.disable()
    elif run.step % 5000 == 0:
        gc.collect()


# ----------------------------------------------------------------------------- finish

def finish(run):
    """A stopped run: the preempted marker, its line and exit status 75. A complete one:
    summary.json and the last line."""
    gc.unfreeze()
    gc.enable()
    if run.stopping:
        if run.master:
            saved_step, num_iterations, stop = run.saved_step, run.num_iterations, run.stop
            ckpt.atomic_write(run.preempted_marker, json.dumps({"step": saved_step, "num_iterations": num_iterations,
                                                                "signal": stop.signal}) + "\n")
            why = f"{stop.signal} received" if stop.signal else "a stop signal reached another rank"
            print0(f"preempted ({why}): " + (f"saved the checkpoint of step {saved_step} of {num_iterations} in "
                                             f"{run.run_dir}; continue with the same command and --resume true"
                                             if saved_step else "no step was done; run the same command again")
                   + f" (exit status {preempt.EXIT_PREEMPTED})")
        close(run)
        raise SystemExit(preempt.EXIT_PREEMPTED)
    if run.master:
        summary = summary_of(run)
        ckpt.atomic_write(os.path.join(run.run_dir, "summary.json"), json.dumps(summary, indent=1))
        print0(f"done: {run.run_dir} (val bpb {summary['val_bpb']}, CORE {summary['core_metric']}, "
               f"peak memory {summary['peak_mem_mib']:.0f} MiB)")
    close(run)


def close(run):
    run.train_loader.close()
    run.log.close()
    compute_cleanup()


def summary_of(run):
    """summary.json of a complete run: what the report and the studies read."""
    from nanochat.tokenizer import fingerprint
    loop, counts, config, device, step = run.loop, run.counts, run.config, run.device, run.step
    return {
        "complete": True, "step": step, "num_iterations": run.num_iterations,
        "train_loss_smooth": loop["smooth_train_loss"] / (1 - 0.9 ** max(step, 1)),
        "val_bpb": loop["val_bpb"], "min_val_bpb": loop["min_val_bpb"] if loop["val_bpb"] is not None else None,
        "core_metric": loop["core_metric"],
        "params": {"total": counts["total"], "non_embedding": counts["non_embedding"],
                   "hc": counts["connections"], "wte": counts["wte"],
                   "value_embeds": counts["value_embeds"], "lm_head": counts["lm_head"],
                   "transformer_matrices": counts["transformer_matrices"]},
        "hc": config.hc, "hc_streams": config.hc_streams,
        **{name: getattr(config, name) for name in getattr(connections.VARIANTS[config.hc], "FIELDS", {})},
        "depth": config.n_layer, "model_dim": config.n_embd,
        "tok_per_sec": statistics.median(loop["tokens_per_sec"]) if loop["tokens_per_sec"] else None,
        "step_time": statistics.median(loop["step_times"]) if loop["step_times"] else None,
        "peak_mem_mib": peak_memory_mib(device), "world_size": run.info.world_size, "device": str(device.type),
        "device_name": device_name(device), "total_training_time": loop["total_training_time"],
        # What a compute multiplier reads (nanochat/studies/compute_multiplier.py); FLOPs by
        # GPT.estimate_flops' convention, seconds of training steps only and of the whole run.
        "flops_per_token": run.flops_per_token, "tokens": loop["tokens"], "total_flops": loop["flops"],
        "train_seconds": loop["train_seconds"], "wall_seconds": run.elapsed_before + time.time() - run.t_start,
        # bits per byte compare only on one corpus and one tokenizer
        "dataset": run.corpus["description"], "tokenizer": fingerprint(run.tokenizer_dir),
    }


# ----------------------------------------------------------------------------- main

def main(argv=None):
    """The steps of a run, in order, over its one record (Run)."""
    run = setup(argv)
    find_checkpoint(run)
    make_model(run)
    describe(run)
    check_data(run)
    make_optimizer(run)
    loader_state = resume(run)
    open_data(run, loader_state)
    open_log(run)

    # The loop: N+1 passes, the last one only saves and evaluates.
    start_loop(run)
    while True:
        last = run.step == run.num_iterations
        if run.step != run.saved_step and (run.stopping or due(run.args.save_every, run.step, last)):
            save(run)
        if run.stopping:
            break
        evals = evaluations_due(run, last)
        if evals and not last and agree(run, run.stop.requested):
            # A signal since the step's own vote: save now rather than after minutes of
            # evaluations, which torchrun's shutdown timeout may not leave; they run on resume.
            run.stopping = True
            continue
        evaluate(run, evals)
        if last:
            break
        if evals and agree(run, run.stop.requested):
            run.stopping = True  # a signal came during the evaluations: save this step and stop
            continue
        train_loss, lrm, dt = train_step(run)
        report_step(run, train_loss, lrm, dt)
        advance(run)
    finish(run)


def cli(argv=None):
    """The command: main() under the error guard, a failure told to the other ranks."""
    run_command(lambda: main(argv), on_error=watchdog.report)


if __name__ == "__main__":
    cli()
