"""Weights and batches that depend only on a name and a shape, so that two models written
apart (ours, and nanochat's own code at a pinned commit, run by the golden generators here)
can be given the same values without sharing any code: only torch, no import of either."""

import zlib

import torch

# A scale per kind of tensor that keeps a tiny model's activations and gradients in a sane
# range (a zero output projection, as both inits give, would leave most gradients zero).
SCALES = {"lambda": 0.2, "gate": 0.5, "default": 0.3}


def tensor_for(name, shape, offset=0.0):
    """A normal tensor of `shape`, seeded by the crc32 of `name`, times the name's scale."""
    generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    kind = "lambda" if "lambda" in name else "gate" if "gate" in name else "default"
    return offset + SCALES[kind] * torch.randn(shape, generator=generator, dtype=torch.float32)


def batch(vocab_size, B, T, seed=1234):
    """Token ids (B, T) and next-token targets (B, T), one row masked with -1 at its end."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (B, T + 1), generator=generator)
    targets = ids[:, 1:].clone()
    targets[0, -3:] = -1
    return ids[:, :-1].contiguous(), targets


def digest(t):
    """The sha256 of a tensor's float32 bytes (bitwise identity), with readable numbers."""
    import hashlib
    flat = t.detach().to(torch.float32).contiguous().cpu()
    return {"sha256": hashlib.sha256(flat.numpy().tobytes()).hexdigest(), "shape": list(flat.shape),
            "sum": float(flat.double().sum()), "absmax": float(flat.abs().max()) if flat.numel() else 0.0}
