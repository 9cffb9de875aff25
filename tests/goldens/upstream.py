"""What every golden generator here does first: read `--nanochat PATH --out FILE`, and put
nanochat's own checkout (PATH, at COMMIT) first on sys.path, in this process alone (its package
is also called `nanochat`: ours is never imported beside it). Then, for those that import
torch, the CPU (NANOCHAT_DTYPE=float32, which nanochat's common.py reads to choose its compute
dtype) and torch.compile a pass-through (nanochat compiles its optimizer steps; eager is the
same math). The model and optimizer generators then run nanochat's code in fp64
(run_in_float64): fp32 results differ in their last bits from one CPU capability to the next,
fp64 ones by a few 1e-15 (tests/goldens/weights.py)."""

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


def run_in_float64():
    """nanochat's code, as checked out, computing in fp64 wherever it would in fp32; call it
    before importing its gpt.py or optim.py. Three changes, none to its formulas:
    - COMPUTE_DTYPE fp64 (its common.py maps NANOCHAT_DTYPE to bf16, fp16 or fp32 only; its
      gpt.py and optim.py read the constant when imported);
    - Tensor.float() keeps an fp64 tensor fp64 (its `.float()` casts widen bf16 to fp32; on
      fp64 they would narrow);
    - its rotary tables computed in fp64 (_precompute_rotary_embeddings asks arange for
      fp32 by name, then casts the tables to COMPUTE_DTYPE)."""
    import torch
    import nanochat.common
    nanochat.common.COMPUTE_DTYPE = torch.float64
    to_float = torch.Tensor.float
    torch.Tensor.float = lambda self, *a, **kw: self if self.dtype == torch.float64 else to_float(self, *a, **kw)
    from nanochat.gpt import GPT
    rotary = GPT._precompute_rotary_embeddings

    def rotary_in_float64(*args, **kwargs):
        arange = torch.arange
        torch.arange = lambda *a, dtype=None, **kw: arange(*a, dtype=torch.float64 if dtype == torch.float32 else dtype,
                                                           **kw)
        try:
            return rotary(*args, **kwargs)
        finally:
            torch.arange = arange

    GPT._precompute_rotary_embeddings = rotary_in_float64
