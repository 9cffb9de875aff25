"""Evaluate a base-model checkpoint: CORE, bits per byte on the train and val splits, and
samples from fixed prompts. Results go into the run directory: core.json and core.csv
(CORE), eval.json (bpb and samples). With --step the names get a _<step> suffix, so
evaluating an older checkpoint never overwrites the evaluation of the latest one.

    python -m scripts.base_eval --model-tag d12
    python -m scripts.base_eval --model-tag d12 --eval core --tasks available --max-per-task 100
    torchrun --nproc_per_node=8 -m scripts.base_eval -- --model-tag d12

CORE needs every task of the bundle's core.yaml unless --tasks restricts them; --tasks
available takes every task whose file is present and reports a partial CORE.

--compile (default on CUDA) runs every evaluation through torch.compile (nanochat/engine.py):
CORE and bpb through one forward compiled with dynamic shapes (a few graphs, not one per
prompt length), samples through a compiled prefill and a decode step replayed as a CUDA
graph. Scores equal the eager ones up to float rounding. On the CPU compiling costs ~30 s
per graph on a small machine, so it pays only for long evaluations (--no-compile there by
default). If compilation fails, one warning line and the evaluation finishes eagerly.
"""

import argparse
import csv
import io
import json
import os
import time

import torch

from nanochat import checkpoint_manager as checkpoint
from nanochat.cluster import watchdog
from nanochat.cli import choice, existing_dir, positive_int, resolve_run_dir, run, run_dir_flags
from nanochat.common import compute_cleanup, compute_dtype, compute_init, print0
from nanochat.core_eval import EVAL_BUNDLE_URL, evaluate_core, read_reference_csv, resolve_eval_bundle, select_tasks
from nanochat.engine import COMPILE_HELP, Inference, compile_default
from nanochat.gpt import autocast_for
from nanochat.loss_eval import evaluate_bpb

# nanochat's fixed prompts for greedy samples (source: nanochat scripts/base_loss.py)
PROMPTS = [
    "The capital of France is",
    "The chemical symbol of gold is",
    "If yesterday was Friday, then tomorrow will be",
    "The opposite of hot is",
    "The planets of the solar system are:",
    "My favorite color is",
    "If 5*x + 3 = 13, then x is",
]
EVALS = ("core", "bpb", "sample")


def build_parser():
    p = argparse.ArgumentParser(prog="python -m scripts.base_eval",
                                description="Evaluate a base model: CORE, bits per byte, samples")
    run_dir_flags(p, "evaluate")
    p.add_argument("--eval", type=str, default="core,bpb,sample", help=f"comma-separated subset of {','.join(EVALS)}")
    p.add_argument("--max-per-task", type=positive_int({-1: "all"}), default=-1,
                   help="CORE examples per task (-1 = all)")
    p.add_argument("--tasks", type=str, default="all",
                   help="CORE tasks: 'all' (every task of core.yaml), 'available' (those whose file is present: "
                        "a partial CORE) or comma-separated labels")
    p.add_argument("--eval-bundle", type=str, default=None,
                   help="CORE bundle directory (default: $NANOCHAT_EVAL_BUNDLE, else base_dir()/eval_bundle, "
                        "downloaded when absent)")
    p.add_argument("--eval-bundle-url", type=str, default=EVAL_BUNDLE_URL, help="where to download the bundle from")
    p.add_argument("--max-seq-len", type=positive_int(), default=None,
                   help="crop CORE prompts from the left to this many tokens (default: the longest input the "
                        "model accepts, which nanochat-sized prompts never reach)")
    p.add_argument("--data-dir", type=existing_dir, default=None,
                   help="bpb: directory of the parquet shards (default: the run's own data_dir setting)")
    p.add_argument("--device-batch-size", type=positive_int(), default=32, help="bpb: rows per forward pass")
    p.add_argument("--split-tokens", type=positive_int(), default=40 * 524288,
                   help="bpb: tokens per split (rounded down to whole rows of the model's context; at most one "
                        "pass: a smaller split is evaluated whole; the same rows on any number of ranks)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help=COMPILE_HELP)
    p.add_argument("--device-type", type=choice("", "cuda", "cpu", "mps"), default="",
                   help="cuda|cpu|mps (empty: autodetect)")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    args.evals = [e.strip() for e in args.eval.split(",") if e.strip()]
    unknown = [e for e in args.evals if e not in EVALS]
    if unknown or not args.evals:
        p.error(f"--eval takes a comma-separated subset of {','.join(EVALS)}, got {args.eval!r}")
    args.run_dir = resolve_run_dir(p, args)
    return args


def core_table(core):
    """CSV of every task (accuracy, centered) and a final CORE row."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["task", "type", "shots", "examples", "accuracy", "centered"])
    for label, t in core["tasks"].items():
        w.writerow([label, t["type"], t["shots"], t["examples"], f"{t['accuracy']:.6f}", f"{t['centered']:.6f}"])
    w.writerow(["CORE", "", "", "", "", f"{core['core_metric']:.6f}"])
    return out.getvalue()


def print_core(core, reference):
    ref_rows = reference[0] if reference else {}
    print0(f"\n{'task':<34} {'type':<17} {'shots':>5} {'n':>6} {'accuracy':>9} {'centered':>9}"
           + ("  GPT-2 acc" if ref_rows else ""))
    for label, t in core["tasks"].items():
        ref = f"  {ref_rows[label][0]:9.4f}" if label in ref_rows else ""
        print0(f"{label:<34} {t['type']:<17} {t['shots']:>5} {t['examples']:>6} {t['accuracy']:>9.4f} "
               f"{t['centered']:>+9.4f}{ref}")
    n = len(core["tasks"])
    name = f"CORE (partial: {n} tasks)" if core["partial"] else "CORE"
    ref = f"  (GPT-2: {reference[1]:.4f} over all 22 tasks)" if reference and reference[1] is not None else ""
    print0(f"{name}: {core['core_metric']:.4f}{ref}")


def main(argv=None):
    args = parse_args(argv)
    info, device = compute_init(args.device_type)
    dtype = compute_dtype(device.type)
    suffix = "" if args.step is None else f"_{args.step:06d}"

    # Check the CORE request before loading anything: a bad --tasks fails in a second.
    if "core" in args.evals:
        try:
            bundle = resolve_eval_bundle(args.eval_bundle, url=args.eval_bundle_url)
            select_tasks(bundle, args.tasks, args.max_per_task)
        except (ValueError, OSError) as e:
            raise SystemExit(f"error: {e}") from None

    # Imported here so that `--help` and flag errors do not pay for them.
    from nanochat.dataloader import SplitRows
    from nanochat.tokenizer import check_vocab, get_token_bytes, get_tokenizer, run_tokenizer_dir

    model, meta = checkpoint.load_model(args.run_dir, step=args.step, device=device)
    autocast = autocast_for(model.config, device.type, dtype)
    step = meta.get("step", args.step)
    tokenizer_dir = run_tokenizer_dir(args.run_dir)
    tokenizer = get_tokenizer(tokenizer_dir)
    try:
        check_vocab(tokenizer, model.config.vocab_size)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if args.max_seq_len is not None and args.max_seq_len > model.rotary_len:
        raise SystemExit(f"error: --max-seq-len {args.max_seq_len} exceeds the {model.rotary_len} tokens the model "
                         "accepts; lower it or leave it out")
    use_compile = args.compile if args.compile is not None else compile_default(device.type)
    runner = Inference(model, compile=use_compile)
    print0(f"Evaluating {args.run_dir} at step {step} on {device} ({dtype}, world size {info.world_size}, "
           f"{'compiled' if use_compile else 'eager'})")
    results = {"step": step}

    if "sample" in args.evals and info.master:
        bos = tokenizer.get_bos_token_id()
        samples = {"greedy": [], "temperature": []}
        with autocast:
            for prompt in PROMPTS:
                tokens = tokenizer.encode(prompt, prepend=bos)
                completion = tokenizer.decode(list(runner.generate(tokens, max_tokens=16, temperature=0)))
                samples["greedy"].append({"prompt": prompt, "completion": completion})
                print0(f"{prompt}|{completion}")
            for seed in range(4):
                text = tokenizer.decode(list(runner.generate([bos], max_tokens=64, temperature=1.0, seed=seed)))
                samples["temperature"].append({"temperature": 1.0, "seed": seed, "text": text})
                print0("-" * 80 + f"\n{text}")
        results["samples"] = samples

    if "bpb" in args.evals:
        B, T = args.device_batch_size, model.config.sequence_len
        max_rows = args.split_tokens // T
        if max_rows == 0:
            raise SystemExit(f"error: --split-tokens {args.split_tokens} is less than one row of {T} tokens; raise it")
        token_bytes = get_token_bytes(device, tokenizer_dir)
        data_dir = args.data_dir or meta.get("settings", {}).get("data_dir") or None
        results["bpb"], results["bpb_tokens"] = {}, {}
        for split in ("train", "val"):
            # The split's first rows as one process packs them, dealt out to the ranks: the same
            # number whatever the number of ranks; one pass at most (a smaller split is read whole).
            rows = SplitRows(tokenizer, T, split, max_rows, info.rank, info.world_size, data_dir)
            with autocast:
                result = evaluate_bpb(runner, rows.batches(B, device), rows.num_batches(B), token_bytes)
            results["bpb"][split], results["bpb_tokens"][split] = result.bpb, result.tokens
            whole = f", the whole {split} split: it holds less than --split-tokens" if rows.exhausted else ""
            print0(f"{split} bpb: {result.bpb:.6f} ({result.tokens:,} tokens{whole})")
        results["bpb_settings"] = {"device_batch_size": B, "sequence_len": T, "split_tokens": max_rows * T}

    if "core" in args.evals:
        max_seq_len = args.max_seq_len if args.max_seq_len is not None else model.rotary_len
        t0 = time.time()
        with autocast:
            core = evaluate_core(runner, tokenizer, device, bundle, max_per_task=args.max_per_task,
                                 tasks=args.tasks, max_seq_len=max_seq_len)
        core_seconds = time.time() - t0
        ref_path = os.path.join(bundle, "openai-community-gpt2.csv")
        reference = read_reference_csv(ref_path) if os.path.isfile(ref_path) else None
        print_core(core, reference)
        print0(f"CORE took {core_seconds:.1f} s ({'compiled' if use_compile else 'eager'})")
        if info.master:
            record = {
                "core_metric": core["core_metric"],
                "partial": core["partial"],
                "tasks": core["tasks"],
                "settings": {"bundle": os.path.abspath(bundle), "tasks": args.tasks, "max_per_task": args.max_per_task,
                             "max_seq_len": max_seq_len, "dtype": str(dtype).removeprefix("torch."), "step": step,
                             "run_dir": os.path.abspath(args.run_dir), "world_size": info.world_size,
                             "tasks_missing": core["tasks_missing"], "compile": use_compile,
                             "compile_fallback": runner.fallback, "graphs": runner.graphs(),
                             "seconds": round(core_seconds, 1)},
            }
            checkpoint.atomic_write(os.path.join(args.run_dir, f"core{suffix}.json"), json.dumps(record, indent=2) + "\n")
            checkpoint.atomic_write(os.path.join(args.run_dir, f"core{suffix}.csv"), core_table(core))
            print0(f"wrote {os.path.join(args.run_dir, f'core{suffix}.json')} and .csv")

    if info.master and ("bpb" in results or "samples" in results):
        results["settings"] = {"dtype": str(dtype).removeprefix("torch."), "world_size": info.world_size,
                               "compile": use_compile, "compile_fallback": runner.fallback,
                               "run_dir": os.path.abspath(args.run_dir)}
        checkpoint.atomic_write(os.path.join(args.run_dir, f"eval{suffix}.json"), json.dumps(results, indent=2) + "\n")
    if use_compile:
        print0(f"compiled graphs: {runner.graphs()}" + (f" (fell back to eager: {runner.fallback})"
                                                        if runner.fallback else ""))
    compute_cleanup()


if __name__ == "__main__":
    run(main, on_error=watchdog.report)
