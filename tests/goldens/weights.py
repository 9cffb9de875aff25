"""Weights and batches that depend only on a name and a shape, so that two models written
apart (ours, and nanochat's own code at a pinned commit, run by the golden generators here)
can be given the same values without sharing any code: only torch, no import of either; and
the fingerprints by which their results are compared on any CPU.

Why fingerprints and not hashes: torch's CPU kernels are chosen by the CPU's capability
(ATEN_CPU_CAPABILITY: default, avx2, avx512), and their vector widths change the order of
sums and the libm they call, so an fp32 result differs in its last bits from one x86-64 CPU
to the next. The goldens are computed in fp64, where those differences stay near fp64's own
rounding (1e-16 relative, grown by the computation to a few 1e-15), and compared by a few
fp64 statistics with a tolerance far below what any fp32-visible change moves them."""

import zlib

import torch

# A scale per kind of tensor that keeps a tiny model's activations and gradients in a sane
# range (a zero output projection, as both inits give, would leave most gradients zero): the
# half-width of a uniform draw, sqrt(3) times the standard deviation it gives.
SCALES = {"lambda": 0.35, "gate": 0.85, "default": 0.5}
# Values are integers over GRID, so that a draw is exact in fp32 and fp64 alike.
GRID = 2 ** 20
# The fixed +-1 vectors a fingerprint projects a tensor onto (Rademacher, by seed).
PROJECTIONS = 4


def tensor_for(name, shape, offset=0.0, dtype=torch.float64):
    """offset + scale * k / GRID, k uniform integers in [-GRID, GRID) seeded by the crc32 of
    `name`, scale by the name's kind. Integers from torch's generator (no vectorized float
    kernel in the draw), then a power-of-two division, one product and one sum, each rounded
    once: the same bits in `dtype` on every CPU."""
    generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    kind = "lambda" if "lambda" in name else "gate" if "gate" in name else "default"
    k = torch.randint(-GRID, GRID, tuple(shape), generator=generator)
    return offset + SCALES[kind] * (k.to(dtype) / GRID)


def batch(vocab_size, B, T, seed=1234):
    """Token ids (B, T) and next-token targets (B, T), one row masked with -1 at its end."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (B, T + 1), generator=generator)
    targets = ids[:, 1:].clone()
    targets[0, -3:] = -1
    return ids[:, :-1].contiguous(), targets


def _signs(n, seed):
    generator = torch.Generator().manual_seed(seed)
    return (2 * torch.randint(0, 2, (n,), generator=generator) - 1).to(torch.float64)


def fingerprint(t):
    """A tensor's shape and, in fp64: its sum, L1 and L2 norms, largest magnitude and its dot
    products with PROJECTIONS fixed sign vectors (which a permutation or a sign flip of
    entries moves, where the norms do not)."""
    x = t.detach().to(torch.float64).cpu().reshape(-1)
    return {"shape": list(t.shape), "sum": x.sum().item(), "l1": x.abs().sum().item(),
            "l2": x.square().sum().sqrt().item(), "absmax": x.abs().max().item() if x.numel() else 0.0,
            "projections": [(x * _signs(x.numel(), seed)).sum().item() for seed in range(PROJECTIONS)]}


def mismatch(ours, golden):
    """(largest deviation, statistic): how far the fingerprint of tensor `ours` is from the
    fingerprint `golden`, every statistic's difference divided by the golden's L1 norm. No
    statistic moves by more than the L1 norm of the difference of the tensors, so entries each
    within r of their own size give a deviation of at most r; a different shape is an infinite
    one. A golden of zeros is divided by the smallest normal number instead: ours must be zeros."""
    mine = fingerprint(ours)
    if mine["shape"] != golden["shape"]:
        return float("inf"), "shape"
    scale = max(golden["l1"], torch.finfo(torch.float64).tiny)
    pairs = [(key, mine[key], golden[key]) for key in ("sum", "l1", "l2", "absmax")]
    pairs += [(f"projection {i}", a, b) for i, (a, b) in enumerate(zip(mine["projections"], golden["projections"]))]
    return max((abs(a - b) / scale, key) for key, a, b in pairs)


def mismatches(ours, golden, rtol):
    """{name: (deviation, statistic)} of the tensors in `ours` ({name: tensor}) whose
    mismatch against `golden` ({name: fingerprint}) exceeds rtol."""
    out = {name: mismatch(t, golden[name]) for name, t in ours.items()}
    return {name: m for name, m in out.items() if not m[0] <= rtol}
