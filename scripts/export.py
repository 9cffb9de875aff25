"""Export a run's checkpoint as a Hugging Face model directory, loadable with transformers
alone (`AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`):

    python -m scripts.export --model-tag d12_kromhc --out exports/d12_kromhc
    python -m scripts.export --model-tag d12_kromhc --step 5000 --out exports/d12_kromhc_5000 --dtype bfloat16

It writes model.safetensors, config.json, generation_config.json, the modeling code (the
project's own modules, flat), tokenizer.json and tokenizer_config.json, and README.md (the
model card). Needs the `eval` extra (pip install -e '.[eval]'). See nanochat/interop/hf/.
"""

import argparse

from nanochat.cli import choice, require_extra, resolve_run_dir, run, run_dir_flags


def build_parser():
    p = argparse.ArgumentParser(prog="python -m scripts.export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    run_dir_flags(p, "export")
    p.add_argument("--out", type=str, required=True, help="directory to write (absent or empty)")
    p.add_argument("--dtype", type=choice("float32", "bfloat16"), default="float32",
                   help="weights' dtype in model.safetensors (the connection parameters stay float32)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in --out")
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    run_dir = resolve_run_dir(parser, args)
    require_extra("eval", "transformers", "safetensors")
    from nanochat.interop.hf.export import export

    try:
        result = export(run_dir, args.out, step=args.step, dtype=args.dtype, overwrite=args.overwrite)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    counts = result["params"]
    print(f"exported step {result['step']} of {run_dir} to {result['dir']} ({args.dtype}; {counts['total']:,} "
          f"parameters): {', '.join(result['files'])}")


if __name__ == "__main__":
    run(main)
