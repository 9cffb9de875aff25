"""A planned run sized as base_train sizes it, and its memory on a GPU, before it trains.

A run whose steps a FLOPs budget or a data ratio sets is sized the way base_train sizes it
(`train_config.num_iterations_for` on the model built on the meta device, which costs a torch
import: done only when a throughput can use it), and so is the total batch of a run on the
2026-07 trunk (`--total-batch-size auto`, its default there); `resolve` also gives its FLOPs per
token. Memory (`fit`): a run's estimated peak per rank (nanochat/planning/memory.py) at the
device batch it will use on a GPU of known memory (nanochat/gpus.py): the config's, or under
--device-batch-size auto the batch base_train will choose; a run that fits at no batch is
refused (`refused`).
"""

import contextlib
import io
from dataclasses import dataclass

from nanochat import gpus
from nanochat.report.runs import single_state

# base_train's defaults for the keys a config may omit (nanochat/train_config.py).
DEFAULT_STREAMS = 4
DEFAULT_VOCAB = 32768  # tok_train's default, for a config that leaves vocab_size to the tokenizer


def stream_count(variant, n):
    """n of a run: 1 for the single-state variants, else its hc_streams (unset or 0: the default)."""
    return 1 if single_state(variant) else (n if n and n > 0 else DEFAULT_STREAMS)


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


def flops_at_depth(run, depth):
    """FLOPs per token of a run's settings at another depth (None for a bad setting)."""
    key = _shape_key(run)
    return _shape((key[0], key[1] + ("--depth", str(depth))))[1]


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
    """The Memory of a GPU by name (its memory from nanochat/gpus.py's table, None when unknown)."""
    from nanochat.planning.memory import GIB
    gib = gpus.memory_gib(gpu_name) if gpu_name else None
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
