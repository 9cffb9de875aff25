"""What a run spent and reached, for compute multipliers: its final bpb, training FLOPs,
tokens and seconds, and its val curve in FLOPs and in seconds, from config.toml,
summary.json and metrics.jsonl alone (no checkpoint).

Runs written before base_train recorded these still load: tokens from the steps and
--total-batch-size, FLOPs from GPT.estimate_flops of the model their config describes (the
vocabulary from the recorded lm_head size), step seconds from the per-step `dt` of the train
records. Such values are listed in `reconstructed`; a recorded field always wins.
"""

import dataclasses
import re
from dataclasses import dataclass, field

from nanochat import connections, trunks
from nanochat.report.format import fmt
from nanochat.report.runs import method_label, params, seeds_of
from nanochat.train_config import FLAG_DEFAULTS

SEED_SUFFIX = re.compile(r"_s\d+(_data)?$")  # speedrun's seed runs: <tag>_s<k>, <tag>_s<k>_data


@dataclass
class Spend:
    """One finished run as a compute multiplier reads it."""
    name: str
    label: str  # connection label: the variant, plus what sets it apart (n, factors, options)
    depth: int
    seed: tuple
    bpb: float  # the final val bpb (the last eval, as nanochat's anchor)
    flops: float  # training FLOPs (GPT.estimate_flops per token x tokens)
    tokens: int
    seconds: float | None  # seconds in training steps
    wall_seconds: float | None
    device: str | None  # "<device name> x <world size>", None when unrecorded
    dataset: str | None
    tokenizer: str | None
    trunk: str = trunks.DEFAULT
    curve: list = field(default_factory=list)  # [(flops, bpb)] of the val records with step > 0
    seconds_curve: list = field(default_factory=list)  # [(train seconds, bpb)], same records
    reconstructed: tuple = ()


def tag_of(name):
    """A run's tag without its seed suffix: the runs of one tag are seeds of one point."""
    return SEED_SUFFIX.sub("", name)


def connection_label(run):
    """The variant's config name, with what sets this connection apart from the variant's
    default (its stream count, KromHC factors, alpha per factor, the options beyond the
    paper) in the report's wording: runs of one label over depths form one ladder."""
    label = method_label(run)
    paren = label.find(" (")
    return run.variant + (label[paren:] if paren >= 0 else "")


def reconstructed_flops_per_token(run):
    """GPT.estimate_flops of the model a run's config describes (on the meta device: no
    memory, no init), for runs whose summary predates flops_per_token; None when the config
    does not say enough (no recorded vocabulary)."""
    import torch
    from nanochat.gpt import GPT, GPTConfig, model_config_from_depth
    settings = {**FLAG_DEFAULTS, **run.config}
    for key in ("hc", "hc_streams", *connections.variant_fields()):
        if run.summary and run.summary.get(key) is not None:
            settings[key] = run.summary[key]
    head, width = params(run, "lm_head"), run.summary.get("model_dim") if run.summary else None
    vocab = head // width if head and width else settings.get("vocab_size")
    if not vocab:
        return None
    model_fields = {f.name for f in dataclasses.fields(GPTConfig)} - {"vocab_size", "window_pattern", "sequence_len",
                                                                     "n_layer", "n_head", "n_kv_head", "n_embd"}
    layout = {k: settings[k] for k in model_fields if k in settings}
    try:
        config = model_config_from_depth(settings["depth"], vocab, settings["max_seq_len"], settings["aspect_ratio"],
                                         settings["head_dim"], settings["window_pattern"], **layout)
        with torch.device("meta"):
            return GPT(config).estimate_flops()
    except ValueError:  # a config this version cannot build: no reconstruction
        return None


def spend_of(run):
    """The run's Spend, or (None, why) for a run that cannot be read as a finished point."""
    if not run.found:
        return None, "not found"
    if not run.complete:
        return None, run.status if run.failure else \
            f"unfinished (step {fmt(run.last_step, 'd')} of {fmt(run.num_iterations, 'd')})"
    s = run.summary
    vals = [r for r in run.metrics.get("val", []) if r.get("bpb") is not None]
    bpb = s.get("val_bpb") if s.get("val_bpb") is not None else (vals[-1]["bpb"] if vals else None)
    if bpb is None:
        return None, "no val bpb (trained with --eval-every 0?)"
    reconstructed = []
    batch = run.config.get("total_batch_size", FLAG_DEFAULTS["total_batch_size"])
    fpt = s.get("flops_per_token")
    if fpt is None:
        fpt = reconstructed_flops_per_token(run)
        reconstructed.append("flops_per_token")
        if fpt is None:
            return None, "no flops_per_token recorded, and its config.toml and summary.json do not rebuild the model"
    tokens = s.get("tokens")
    if tokens is None:
        tokens = s["step"] * batch
        reconstructed.append("tokens")
    flops = s.get("total_flops")
    if flops is None:
        flops = fpt * tokens
        reconstructed.append("total_flops")
    # Step seconds: the recorded cumulative value, else the train records' per-step dt summed.
    dts = {r["step"]: r["dt"] for r in run.metrics.get("train", []) if r.get("dt") is not None}
    seconds = s.get("train_seconds")
    if seconds is None and dts:
        seconds = sum(dts.values())
        reconstructed.append("train_seconds")
    device = f"{s['device_name']} x {s.get('world_size', 1)}" if s.get("device_name") else None
    curve, seconds_curve = [], []
    for r in vals:
        if r["step"] <= 0:
            continue
        f = r.get("flops", r["step"] * batch * fpt)
        t = r.get("train_seconds", sum(v for k, v in dts.items() if k < r["step"]) if dts else None)
        curve.append((f, r["bpb"]))
        if t:
            seconds_curve.append((t, r["bpb"]))
    if vals and any("flops" not in r for r in vals):
        reconstructed.append("val flops")
    dataset = s.get("dataset") or (run.corpus or {}).get("description")
    return Spend(name=run.name, label=connection_label(run), depth=run.depth, seed=seeds_of(run), bpb=bpb,
                 flops=flops, tokens=tokens, seconds=seconds, wall_seconds=s.get("wall_seconds"), device=device,
                 dataset=dataset, tokenizer=s.get("tokenizer"), curve=curve, seconds_curve=seconds_curve,
                 reconstructed=tuple(reconstructed), trunk=run.trunk), None
