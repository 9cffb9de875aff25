"""The training run's settings: one table of flags that is both the CLI of
scripts/base_train.py and the key set of the TOML configs (keys = flags with underscores;
a flag given on the command line wins over the file). Also writes the resolved settings
back as TOML, so a run directory records exactly what ran."""

import argparse
import dataclasses
import os
import tomllib

from nanochat import connections, trunks
from nanochat.cluster import preempt
from nanochat.cli import (boolean, choice, existing_dir, finite_float, fraction, nonneg_float, nonneg_int,
                          positive_even_int, positive_float, positive_int)
from nanochat.cluster.preempt import parse_signals


AUTO = "auto"
_positive_int = positive_int()


def device_batch(text):
    """--device-batch-size: a positive integer, or auto (base_train sizes it to the GPU)."""
    if str(text).strip().lower() == AUTO:
        return AUTO
    try:
        return _positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or auto, got {text!r}") from None


device_batch.numeric = True


def total_batch(text):
    """--total-batch-size: a positive integer (tokens), or auto (2026-07's rule, nanochat/trunks.py)."""
    return device_batch(text)


total_batch.numeric = True
NEVER = {-1: "never"}  # the special value of the "every N steps" flags
# The parser of a variant's own config field whose module names none (FIELD_TYPES), by the
# type of its default; a list or another type needs one named.
FIELD_PARSERS = {bool: boolean, int: positive_int(), float: finite_float(), str: str}


def variant_flags():
    """(flag, type, default, help) of every variant's own config fields: each module's FIELDS,
    FIELD_HELP and FIELD_TYPES (nanochat/connections), so that a wiring adds flags and TOML
    keys without editing this table."""
    flags = []
    for name, (default, help_text, parser, variant) in connections.variant_fields().items():
        parser = parser or FIELD_PARSERS.get(type(default))
        if parser is None:
            raise connections.SpecError(f"variant {variant!r}: FIELD_TYPES names no parser for {name} "
                                        f"(a {type(default).__name__} default has none by default)")
        flags.append((name, parser, list(default) if isinstance(default, list) else default, help_text))  # own copy
    return flags


# (flag, type, default, help). Defaults are nanochat's at commit 4d8dbaf, with the
# paper's values where the paper differs (noted).
FLAGS = [
    # run bookkeeping
    ("run", str, "dummy", "wandb run name; 'dummy' disables wandb"),
    ("model_tag", str, "", "run directory name under $NANOCHAT_BASE_DIR/runs (default d<depth>_<hc>)"),
    ("device_type", choice("", "cuda", "cpu", "mps"), "", "cuda | cpu | mps (empty: autodetect)"),
    ("seed", nonneg_int(), 42, "seed for initialization"),
    ("data_seed", nonneg_int({-1: "nanochat's fixed order"}), -1,
     "seed that shuffles the order of the training data's row groups "
     "(-1: nanochat's fixed order, files and row groups in sequence)"),
    ("compile", boolean, None, "torch.compile the model (default: on for CUDA, off elsewhere)"),
    ("compile_mode", choice("whole", "regional"), "whole",
     "with compile: the model whole (one graph) or regionally (each repeated sub-layer, connection layer and the "
     "head compiled once: faster to compile; docs/kernels.md)"),
    ("data_dir", existing_dir, "", "parquet shard directory (default the --corpus's: $NANOCHAT_BASE_DIR/base_data or "
                                 "base_data_climbmix)"),
    ("vocab_size", nonneg_int(), 0, "expected tokenizer vocab size (0: whatever the trained tokenizer has)"),
    # the trunk: nanochat as the paper trained it, or as it trains in July 2026 (docs/trunks.md)
    ("trunk", choice(*trunks.TRUNKS), trunks.DEFAULT,
     "2026-01 (nanochat 4d8dbaf, the KromHC paper's trunk) | 2026-07 (nanochat 92d63d4's recipe: smear, backout, "
     "MuonEq, Muon+, auto batch, ClimbMix, ...); the flags marked 'by trunk' take that trunk's default"),
    ("corpus", choice("fineweb-edu", "climbmix"), None,
     "by trunk (2026-01: fineweb-edu, 2026-07: climbmix): the pretraining corpus, and the directory under "
     "$NANOCHAT_BASE_DIR it is read from unless --data-dir names one"),
    ("fp8", boolean, False, "float8 training of the large matmuls (tensorwise scales, e4m3 forward, e5m2 "
                            "gradients; CUDA sm >= 89 only; evaluation runs in bf16): nanochat/fp8.py"),
    # model
    ("depth", positive_int(), 20, "number of transformer blocks"),
    ("aspect_ratio", positive_int(), 64, "model_dim = depth * aspect_ratio, rounded up to a multiple of head_dim"),
    ("head_dim", positive_even_int(), 128, "attention head dimension (even: rotary embeddings pair its halves)"),
    ("max_seq_len", positive_int(), 2048, "context length"),
    ("window_pattern", str, "SSSL", "L = full context, S = half; tiled over layers, last layer always L"),
    ("value_embeds", boolean, True, "nanochat's value embeddings on alternating layers (off + a 65,536 vocab: "
                                  "the paper's ~60M/~186M sizes)"),
    ("attention", choice("auto", "flex", "sdpa"), "auto",
     "attention kernel: flex (FlexAttention, block-sparse windows) | sdpa | auto (flex on CUDA, sdpa elsewhere)"),
    # connections
    ("hc", str, "residual", f"the connection: {' | '.join(connections.VARIANTS)} (docs/connections.md)"),
    ("hc_streams", nonneg_int(), 0, "number of streams n (frac: fractions m of the hidden state, which must divide "
                                    "its width; 0: the variant's default, 4 for HC variants and frac)"),
    *variant_flags(),
    ("hc_sk_iters", positive_int(), 20, "mHC: Sinkhorn-Knopp iterations"),
    ("hc_norm_weight", boolean, True, "learnable weight in the RMSNorm over n*C (the paper counts it; frac: of its "
                                    "per-fraction norm; attnres: the key-norm gains)"),
    ("hc_recompute", boolean, False, "keep only the connection projection (k numbers per token) and "
                                   "recompute the gates and H_res in backward (a few percent less activation memory)"),
    ("hc_lr", nonneg_float(), 0.005, "AdamW LR of every HC connection parameter (paper: 0.005; 0 freezes them), "
                                     "without weight decay (also frac's dynamic weights, which the "
                                     "Frac-Connections paper decays); not used by residual"),
    ("scalar_lr", nonneg_float(), 0.5, "residual baseline, as nanochat: AdamW LR of the x0 scalars; the resid "
                                       "scalars train at scalar_lr * 0.01 (= 0.005, the paper's LR for residual "
                                       "connections; 0 freezes them)"),
    ("x0_beta1", fraction(), None,
     "by trunk (2026-01: 0.8, the paper's; 2026-07: 0.96, nanochat's): residual baseline, AdamW beta1 of the x0 "
     "scalars"),
    ("hc_stats_every", positive_int(NEVER), 250, "log connection diagnostics every N steps (-1 = never)"),
    ("hc_kernels", choice("torch", "liger", "fused", "auto"), "auto",
     "stream-op backend: torch | liger (Liger-Kernel's fused Triton kernels; pip install -e '.[kernels]') | "
     "fused (our Triton kernels, fused across sub-layers: docs/kernels.md) | auto (the fastest a GPU of this "
     "name measured for the variant, docs/gpu_measured.md; torch where nothing is measured)"),
    ("hc_stream_checkpoint", positive_int(), 1,
     "fused seams: keep the streams for backward at every K-th seam only and recompute the others from the "
     "sub-layers' outputs (less activation memory for a few more stream passes backward: docs/kernels.md, "
     "\"Memory\"); 1 keeps every one"),
    ("hc_seam", choice("auto", "onepass", "split"), "auto",
     "fused seams: onepass (one kernel a seam: the mix, the projection, the coefficients and the read) | split (a "
     "kernel for the mix and the projection's partial sums, one for the coefficients, one for the read, each with a "
     "tiling of its own: docs/kernels.md) | auto (the one a GPU of this name measured faster for the variant, "
     "docs/gpu_measured.md; onepass where nothing is measured); the same function either way"),
    # options of every HC variant beyond the paper (nanochat/connections/frame.py, hc_layer.py)
    ("hc_expand", choice("copy", "lss"), "copy",
     "how x0 becomes the streams: copy (the paper) | lss (Learned Stream Scaling, arXiv 2606.03483: a learned "
     "(n, C) scale per stream, trained at --hc-lr without weight decay, where its source decays it by 0.1)"),
    ("hc_lss_init", finite_float(), 0.6, "lss: the scales start at this value plus xavier-uniform noise (source: 0.6)"),
    ("hc_reduce", choice("sum", "learned"), "sum",
     "how the streams fold before the final norm: sum (the paper) | learned (DeepSeek-V4's head: sigmoid "
     "weights from the final streams, fp32; ours: W = 0, b = 0 at init, which after the norm equals the sum)"),
    ("hc_pre", choice("current", "delayed"), "current",
     "current (the paper) | delayed (DeepSeek-V4.1 single-pass: layer j's projection yields layer j+1's "
     "pre-weights, layer 0 reads stream 0, the last layer's fold the final state; no parameter added)"),
    # horizon
    ("num_iterations", positive_int({-1: "from the flops or the data ratio"}), -1,
     "explicit number of steps (highest precedence; -1 = from --target-flops or --target-param-data-ratio)"),
    ("target_flops", positive_float({-1: "unused"}), -1.0,
     "compute budget: steps = flops / (flops_per_token * batch) (-1 = unused)"),
    ("target_param_data_ratio", positive_float({-1: "unused"}), None,
     "by trunk (2026-01: 10.5, 2026-07: 12): tokens : scaling params ratio when no steps/flops are given "
     "(-1 = unused)"),
    # batch
    ("device_batch_size", device_batch, 32,
     "rows per rank per micro-step, or auto: on a GPU the largest power of two up to the config's value (the "
     "TOML's number, else 32) whose estimated peak memory fits the GPU with a margin (nanochat/planning/memory.py), "
     "gradient accumulation keeping the total batch; on a CPU auto falls back to that value"),
    ("total_batch_size", total_batch, None,
     "by trunk (2026-01: 524288, 2026-07: auto): tokens per optimizer step (gradient accumulation fills it); "
     "auto = 2^19 x (tokens / depth-12 tokens)^0.383 rounded to a power of two, as nanochat 92d63d4"),
    # optimization
    ("embedding_lr", nonneg_float(), 0.3, "AdamW LR of wte and value embeddings (x (C/768)^-0.5; 0 freezes them)"),
    ("unembedding_lr", nonneg_float(), None,
     "by trunk (2026-01: 0.004, 2026-07: 0.008): AdamW LR of lm_head (x (C/768)^-0.5; 0 freezes it)"),
    ("matrix_lr", nonneg_float(), 0.02, "Muon LR (0 freezes the matrices)"),
    ("weight_decay", nonneg_float(), None,
     "by trunk (2026-01: 0.2, scaled by (12/depth)^2; 2026-07: 0.28, scaled by sqrt(B/2^19) x depth-12 tokens / "
     "tokens): Muon cautious weight decay"),
    ("warmup_ratio", fraction(), 0.0, "fraction of steps of linear LR warmup (0..1, with warmdown at most 1)"),
    ("warmup_steps", nonneg_int(), None,
     "by trunk (2026-01: 0, 2026-07: 40): steps of linear LR warmup; when > 0 it replaces --warmup-ratio"),
    ("warmdown_ratio", fraction(), None,
     "by trunk (2026-01: 0.4, 2026-07: 0.65): fraction of steps of linear LR warmdown"),
    ("final_lr_frac", fraction(), None, "by trunk (2026-01: 0, 2026-07: 0.05): LR multiplier at the end of warmdown"),
    # evaluation and checkpoints
    ("eval_every", positive_int({-1: "only at the end", 0: "never"}), 250,
     "val bpb every N steps (-1 = only at the end, 0 = never)"),
    ("eval_tokens", positive_int(), None,
     "by trunk (2026-01: 20 x 524288, 2026-07: 80 x 524288): tokens of the val split per bpb evaluation (at most "
     "one pass: a smaller split is evaluated whole)"),
    ("core_metric_every", positive_int(NEVER), 2000, "CORE every N steps and at the end (-1 = never)"),
    ("core_metric_max_per_task", positive_int({-1: "all"}), 500, "examples per CORE task during training (-1 = all)"),
    ("eval_bundle", str, "", "CORE bundle directory (default: $NANOCHAT_BASE_DIR/eval_bundle, downloaded)"),
    ("core_tasks", str, "all", "CORE tasks: all | available (partial CORE over present files) | a,b,c"),
    ("sample_every", positive_int(NEVER), 2000, "print samples every N steps and at the end (-1 = never)"),
    ("save_every", positive_int({-1: "only at the end"}), -1, "checkpoint every N steps (-1 = only at the end)"),
    ("keep_checkpoints", nonneg_int({-1: "all"}), 2,
     "keep the K most recent intermediate checkpoints; the final one and the one `latest` names are "
     "always kept (0 = only those, -1 = keep all)"),
    ("resume", boolean, False, "continue from the run directory's latest complete checkpoint, on any number of "
                             "ranks (another number reshards the optimizer state and the data position)"),
    # on a cluster
    ("save_on_signal", parse_signals, preempt.DEFAULT,
     f"signals that make every rank finish the step in flight, save a checkpoint and exit with status "
     f"{preempt.EXIT_PREEMPTED} (resumable: --resume true continues): none, or a comma-separated list of "
     f"{', '.join(preempt.CHOICES)} (default {preempt.DEFAULT})"),
    ("dist_timeout", positive_int(), 600,
     "seconds a collective waits for the other ranks before the run fails (the process group timeout; default "
     "600, NCCL's own; a rank that fails with an error stops the others within seconds anyway)"),
]

FLAG_NAMES = [name for name, *_ in FLAGS]
# A setting absent from a run's record (saved before the flag existed) ran at its default, and
# every such run ran on the 2026-01 trunk: the flags that differ by trunk default to its values.
FLAG_DEFAULTS = {name: default for name, _, default, _ in FLAGS} | trunks.recipe(trunks.DEFAULT).flag_defaults

# Settings that may change between a run and its resumption: they affect logging and
# evaluation cadence only, never the trajectory of the weights.
RESUMABLE_CHANGES = {"run", "resume", "eval_every", "eval_tokens", "core_metric_every",
                     "core_metric_max_per_task", "eval_bundle", "core_tasks", "sample_every", "save_every",
                     "keep_checkpoints", "hc_stats_every", "compile", "compile_mode", "device_type", "data_dir", "hc_kernels",
                     "hc_stream_checkpoint", "hc_seam",
                     "save_on_signal", "dist_timeout", "device_batch_size"}


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m scripts.base_train",
        description="Pretrain a nanochat GPT with a chosen stream connection. Every flag can "
                    "also be a key (underscores) of the --config TOML; flags win.")
    parser.add_argument("--config", default="", help="TOML file of settings (keys = flags)")
    for name, typ, default, help_text in FLAGS:
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, dest=name, type=typ, default=default, help=help_text)
    return parser


def load_toml(path):
    """Read a flat TOML config and check that every key is a known flag."""
    if not os.path.isfile(path):
        raise SystemExit(f"error: config file {path!r} not found")
    with open(path, "rb") as f:
        try:
            values = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise SystemExit(f"error: {path}: invalid TOML ({e})") from None
    unknown = sorted(set(values) - set(FLAG_NAMES))
    if unknown:
        raise SystemExit(f"error: {path}: unknown key(s) {', '.join(unknown)}; "
                         f"see `python -m scripts.base_train --help` for the valid ones")
    return values


def parse_args(argv=None):
    """CLI over TOML over defaults. Returns an argparse Namespace."""
    parser = build_parser()
    first, _ = parser.parse_known_args(argv)
    if first.config:
        values = load_toml(first.config)
        for name, typ, *_ in FLAGS:
            if name in values:
                try:
                    values[name] = typ(values[name])
                except (argparse.ArgumentTypeError, TypeError, ValueError) as e:
                    raise SystemExit(f"error: {first.config}: bad value for {name}: {e}") from None
        parser.set_defaults(**values)
    args = parser.parse_args(argv)
    for name, value in trunks.recipe(args.trunk).flag_defaults.items():  # what neither the CLI nor the TOML set
        if getattr(args, name) is None:
            setattr(args, name, value)
    # The most --device-batch-size auto may choose: the config's own number.
    toml_batch = values.get("device_batch_size") if first.config else None
    args.device_batch_cap = toml_batch if isinstance(toml_batch, int) else FLAG_DEFAULTS["device_batch_size"]
    if args.warmup_ratio + args.warmdown_ratio > 1:
        parser.error(f"argument --warmdown-ratio: warmup ({args.warmup_ratio}) and warmdown "
                     f"({args.warmdown_ratio}) together exceed the run; make their sum at most 1")
    return args


def settings(args, hc=None):
    """The flag values of a Namespace as a plain dict (without --config). With `hc`, what a run
    of that wiring records (config.toml, the checkpoint's settings): less the own fields of the
    other wirings, which it never reads and which sit at their defaults."""
    other = connections.other_fields(hc) if hc is not None else set()
    return {name: getattr(args, name) for name in FLAG_NAMES if name not in other}


def _toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if value is None:
        raise ValueError("TOML has no null")
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def dumps_toml(values, header=""):
    lines = [f"# {line}" for line in header.splitlines()]
    lines += [f"{k} = {_toml_value(v)}" for k, v in values.items() if v is not None]
    return "\n".join(lines) + "\n"


def model_config_for(args, vocab_size):
    """The model config of these settings: width, heads and context from depth, aspect ratio and
    head dim as nanochat derives them; every flag that is a model config field (the connection's,
    the attention kernel, the value embeddings) as it is. ValueError for a bad combination."""
    from nanochat.gpt import GPTConfig, model_config_from_depth  # torch: only for who builds a model
    model_fields = {f.name for f in dataclasses.fields(GPTConfig)}
    layout = {name: getattr(args, name) for name in FLAG_NAMES
              if name in model_fields and name not in ("vocab_size", "window_pattern")}
    return model_config_from_depth(args.depth, vocab_size, args.max_seq_len, args.aspect_ratio, args.head_dim,
                                   args.window_pattern, **layout)


def num_iterations_for(args, model, tokens_per_step):
    """Steps of the run and the flag that set them: --num-iterations, else the FLOPs budget over
    FLOPs per step, else the tokens : scaling-params ratio (scripts.plan prices runs the same way)."""
    if args.num_iterations > 0:
        return args.num_iterations, "--num-iterations"
    if args.target_flops > 0:
        return round(args.target_flops / (model.estimate_flops() * tokens_per_step)), "--target-flops"
    if args.target_param_data_ratio > 0:
        return int(args.target_param_data_ratio * model.num_scaling_params()) // tokens_per_step, \
            "--target-param-data-ratio"
    raise SystemExit("error: no horizon: give --num-iterations, --target-flops or --target-param-data-ratio")


def scaling_params(config):
    """nanochat's scaling count of a config, from a model on the meta device (no memory)."""
    import torch

    from nanochat.gpt import GPT
    with torch.device("meta"):
        return GPT(config).num_scaling_params()


def horizon_tokens(args, config, vocab_size):
    """(this run's token horizon, the depth-12 reference's), which 2026-07's automatic batch and
    weight-decay scaling compare, exactly as nanochat 92d63d4's base_train.py computes them:
    target_tokens = int(ratio * N), an integer, and D_REF = ratio * N_12, a float, with N the
    scaling parameters and ratio the run's --target-param-data-ratio (its trunk's default where
    the flag is off: the ratio cancels but for the int())."""
    ratio = args.target_param_data_ratio
    if ratio <= 0:
        ratio = trunks.recipe(args.trunk).flag_defaults["target_param_data_ratio"]
    params = scaling_params(config)
    if args.depth == trunks.REFERENCE_DEPTH:
        reference = params
    else:
        reference = scaling_params(model_config_for(
            argparse.Namespace(**{**vars(args), "depth": trunks.REFERENCE_DEPTH}), vocab_size))
    return int(ratio * params), ratio * reference


def resolve_total_batch(args, config, vocab_size):
    """--total-batch-size auto: (the batch, the log line); nanochat/trunks.py auto_total_batch."""
    target, reference = horizon_tokens(args, config, vocab_size)
    batch = trunks.auto_total_batch(target, reference)
    ratio = target / reference
    return batch, (f"total batch {batch:,} tokens (--total-batch-size auto: 2^19 x {ratio:.4g}^{trunks.BATCH_EXPONENT}, "
                   f"the horizon {ratio:.4g}x depth {trunks.REFERENCE_DEPTH}'s, to a power of two)")
