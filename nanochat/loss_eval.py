"""Bits per byte: the validation loss that does not depend on the tokenizer's vocabulary.

Each target token is charged its cross-entropy (nats) and credited its length in UTF-8 bytes
(token_bytes, 0 for special tokens); bpb = total nats / (ln 2 * total bytes). Special tokens
such as BOS and ignored targets (-1) count in neither sum.
"""

import math

import torch
import torch.distributed as dist


@torch.no_grad()
def evaluate_bpb(model, batches, steps, token_bytes):
    """Bits per byte of `model` over the next `steps` (x, y) batches of the iterable
    `batches`; model(x, y, loss_reduction="none") gives per-token nats. Under
    torch.distributed each rank passes its own batches and the sums are added across ranks."""
    device = token_bytes.device
    # float64 sums (MPS has none): millions of per-token losses in fp32 lose digits
    acc_dtype = torch.float32 if device.type == "mps" else torch.float64
    total_nats = torch.zeros((), dtype=acc_dtype, device=device)
    total_bytes = torch.zeros((), dtype=acc_dtype, device=device)
    batches = iter(batches)
    for step in range(steps):
        try:
            x, y = next(batches)
        except StopIteration:
            raise ValueError(f"evaluate_bpb: the batches ran out after {step} of {steps} steps; "
                             "ask for fewer steps (fewer split tokens)") from None
        nats = model(x, y, loss_reduction="none").reshape(-1)
        y = y.reshape(-1)
        # y.int(): MPS has no int64 comparison
        valid = y.int() >= 0
        nbytes = torch.where(valid, token_bytes[torch.where(valid, y, 0)], 0)
        total_nats += torch.where(nbytes > 0, nats.to(acc_dtype), 0).sum()
        total_bytes += nbytes.sum()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total_nats, op=dist.ReduceOp.SUM)
        dist.all_reduce(total_bytes, op=dist.ReduceOp.SUM)
    total_nats, total_bytes = total_nats.item(), total_bytes.item()
    if total_bytes == 0:
        return float("inf")
    return total_nats / (math.log(2) * total_bytes)
