"""Evaluate a checkpoint on lm-evaluation-harness tasks with the native model (no export,
no transformers): HellaSwag, ARC, PIQA, WinoGrande, LAMBADA, ... with lm-eval's own prompts
and metrics (acc, acc_norm, perplexity, ...).

    python -m scripts.lm_eval --model-tag d12_kromhc
    python -m scripts.lm_eval --model-tag d12_kromhc --tasks hellaswag,arc_easy --num-fewshot 10 --limit 500
    python -m scripts.lm_eval --model-tag d12_kromhc --tasks my_task --include-path my_tasks/
    torchrun --nproc_per_node=8 -m scripts.lm_eval -- --model-tag d12_kromhc
    python -m scripts.lm_eval --check-data                 # fetch the tasks' data only (needs network)

Results go to the run directory: lm_eval.json (lm_eval_<step>.json with --step): every
task's metrics with their standard errors, lm-eval's version and the task versions, the
settings. lm-eval reads task data from the Hugging Face Hub; tasks whose YAML reads local
files (`dataset_path: json` with `data_files`) need no network. Needs the `eval` extra.
"""

import argparse
import json
import os

from nanochat.cli import (choice, existing_dir, nonneg_int, positive_int, require_extra, resolve_run_dir, run,
                          run_dir_flags)
from nanochat.interop import lm_eval_run


def build_parser():
    p = argparse.ArgumentParser(prog="python -m scripts.lm_eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    run_dir_flags(p, "evaluate")
    p.add_argument("--tasks", type=str, default=",".join(lm_eval_run.DEFAULT_TASKS),
                   help="comma-separated lm-eval task or group names (default: %(default)s)")
    p.add_argument("--num-fewshot", type=nonneg_int(), default=None,
                   help="few-shot examples per prompt (default: each task's own setting, mostly 0)")
    p.add_argument("--limit", type=positive_int(), default=None,
                   help="evaluate at most N documents per task (a quick check; the numbers are not comparable)")
    p.add_argument("--batch-size", type=positive_int(), default=16, help="rows per forward pass")
    p.add_argument("--include-path", type=existing_dir, default=None,
                   help="directory of your own task YAMLs (they win over lm-eval's tasks of the same name)")
    p.add_argument("--bootstrap-iters", type=nonneg_int(), default=100000,
                   help="bootstrap resamples for the standard error of metrics without a closed form (e.g. "
                        "perplexity; lm-eval's default). 0: lm-eval computes no standard error at all")
    p.add_argument("--check-data", action="store_true",
                   help="only load the tasks' data (download it into the Hugging Face cache) and exit")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the scoring forward and generation (nanochat/engine.py); default: on for "
                        "CUDA, off elsewhere. A failed compilation falls back to eager with one warning")
    p.add_argument("--device-type", type=choice("", "cuda", "cpu", "mps"), default="",
                   help="cuda|cpu|mps (empty: autodetect)")
    return p


def print_results(record):
    from nanochat.common import print0, text_table

    rows = []
    for task, metrics in record["results"].items():
        n = record["n_samples"].get(task, {}).get("effective", "")
        for metric, r in metrics.items():
            stderr = "" if r["stderr"] is None else f"± {r['stderr']:.4f}"
            rows.append((task, metric, f"{r['value']:.4f}", stderr, n))
    print0(text_table(("task", "metric", "value", "stderr", "n"), rows))


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        tasks = lm_eval_run.parse_tasks(args.tasks)
    except ValueError as e:
        parser.error(f"argument --tasks: {e}")
    run_dir = None if args.check_data else resolve_run_dir(parser, args)
    require_extra("eval", "lm_eval")
    try:
        manager = lm_eval_run.task_manager(tasks, args.include_path)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if args.check_data:
        lm_eval_run.load_task_data(manager, tasks)
        print(f"lm-eval task data ready: {', '.join(tasks)}")
        return

    from nanochat import checkpoint_manager as checkpoint
    from nanochat.common import compute_cleanup, compute_dtype, compute_init, print0
    from nanochat.gpt import autocast_for
    from nanochat.engine import Inference, compile_default
    from nanochat.interop.lm_eval_adapter import NanochatLM
    from nanochat.tokenizer import check_vocab, get_tokenizer, run_tokenizer_dir

    info, device = compute_init(args.device_type)
    dtype = compute_dtype(device.type)
    model, meta = checkpoint.load_model(run_dir, step=args.step, device=device)
    autocast = lambda: autocast_for(model.config, device.type, dtype)  # noqa: E731  (a fresh context per use)
    tokenizer = get_tokenizer(run_tokenizer_dir(run_dir))
    try:
        check_vocab(tokenizer, model.config.vocab_size)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    step = meta["step"]
    print0(f"lm-eval on {run_dir} at step {step}: {', '.join(tasks)} ({device}, {dtype}, world size "
           f"{info.world_size})")
    use_compile = args.compile if args.compile is not None else compile_default(device.type)
    lm = NanochatLM(Inference(model, compile=use_compile), tokenizer, device, batch_size=args.batch_size,
                    autocast=autocast, rank=info.rank, world_size=info.world_size)
    results = lm_eval_run.evaluate(lm, tasks, manager, num_fewshot=args.num_fewshot, limit=args.limit,
                                   bootstrap_iters=args.bootstrap_iters)
    if info.master:
        settings = {"step": step, "tasks": tasks, "num_fewshot": args.num_fewshot, "limit": args.limit,
                    "batch_size": args.batch_size, "max_length": lm.max_length,
                    "include_path": args.include_path and os.path.abspath(args.include_path),
                    "dtype": str(dtype).removeprefix("torch."), "world_size": info.world_size,
                    "compile": use_compile, "compile_fallback": lm.model.fallback,
                    "run_dir": os.path.abspath(run_dir)}
        record = lm_eval_run.record(results, settings)
        print_results(record)
        path = lm_eval_run.record_path(run_dir, None if args.step is None else step)
        checkpoint.atomic_write(path, json.dumps(record, indent=2) + "\n")
        print0(f"wrote {path}")
    compute_cleanup()


if __name__ == "__main__":
    run(main)
