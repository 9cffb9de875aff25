"""What every golden generator here does first: read `--nanochat PATH --out FILE`, and put
nanochat's own checkout (PATH, at COMMIT) first on sys.path, in this process alone (its package
is also called `nanochat`: ours is never imported beside it). Then, for those that import
torch, the CPU in fp32 (NANOCHAT_DTYPE=float32, which nanochat's common.py reads to choose its
compute dtype) and torch.compile a pass-through (nanochat compiles its optimizer steps; eager
is the same math)."""

import argparse
import os
import sys

COMMIT = "92d63d4"


def open_checkout(description, torch_eager=True):
    """The parsed arguments (nanochat, out), with the checkout importable as `nanochat`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--nanochat", required=True, help=f"a checkout of karpathy/nanochat at {COMMIT}")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    sys.path.insert(0, os.path.abspath(args.nanochat))
    if torch_eager:
        os.environ["NANOCHAT_DTYPE"] = "float32"
        import torch
        torch.compile = lambda fn=None, **kw: fn if fn is not None else (lambda f: f)
    return args
