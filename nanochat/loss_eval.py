"""Bits per byte: the validation loss that does not depend on the tokenizer's vocabulary.

Each target token is charged its cross-entropy (nats) and credited its length in UTF-8 bytes
(token_bytes, 0 for special tokens); bpb = total nats / (ln 2 * total bytes). Special tokens
such as BOS and ignored targets (-1) count in neither sum.
"""

import math
from typing import NamedTuple

import torch
import torch.distributed as dist


class BpbResult(NamedTuple):
    bpb: float
    tokens: int  # targets evaluated (ignored ones excluded), summed over ranks
    steps: int  # batches this rank evaluated
    exhausted: bool  # the batches ran out before `steps` (on any rank)


@torch.no_grad()
def evaluate_bpb(model, batches, steps, token_bytes):
    """Bits per byte of `model` over the next `steps` (x, y) batches of the iterable
    `batches`, or all of them when it ends sooner (a split read once that holds fewer
    tokens than asked for); model(x, y, loss_reduction="none") gives per-token nats.
    Under torch.distributed each rank passes its own batches and the sums are added
    across ranks."""
    device = token_bytes.device
    # float64 sums (MPS has none): millions of per-token losses in fp32 lose digits
    acc_dtype = torch.float32 if device.type == "mps" else torch.float64
    # nats, bytes, targets, ranks that ran out
    sums = torch.zeros(4, dtype=acc_dtype, device=device)
    batches = iter(batches)
    done = 0
    for _ in range(steps):
        try:
            x, y = next(batches)
        except StopIteration:
            sums[3] += 1
            break
        nats = model(x, y, loss_reduction="none").reshape(-1)
        y = y.reshape(-1)
        # y.int(): MPS has no int64 comparison
        valid = y.int() >= 0
        nbytes = torch.where(valid, token_bytes[torch.where(valid, y, 0)], 0)
        sums[0] += torch.where(nbytes > 0, nats.to(acc_dtype), 0).sum()
        sums[1] += nbytes.sum()
        sums[2] += valid.sum()
        done += 1
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    total_nats, total_bytes, tokens, ran_out = sums.tolist()
    bpb = float("inf") if total_bytes == 0 else total_nats / (math.log(2) * total_bytes)
    return BpbResult(bpb, int(tokens), done, ran_out > 0)
