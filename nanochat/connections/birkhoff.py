"""The doubly stochastic toolbox behind the constrained variants: permutation matrices,
log-space Sinkhorn-Knopp, batched Kronecker products, the factorizations of n that KromHC
accepts, and go-mHC's orthostochastic construction (skew-symmetric generator, Cayley
transform, block sums of squares).

Every matrix here follows the H-convention of the connections package: rows are target
streams, columns are source streams, `X_next = H @ X`.
"""

import itertools
import math

import torch

# Largest factor KromHC accepts: a factor i costs i! logits per layer (5! = 120; 7! = 5040).
MAX_FACTOR = 5
# go-mHC's block size s: the README of the go-mHC repository recommends s = 2 (s = 1 is the
# orthostochastic boundary; larger s reaches further into the Birkhoff polytope).
DEFAULT_GO_S = 2


def permutation_matrices(m, device=None, dtype=torch.float32):
    """All m! permutation matrices of size m, shape (m!, m, m), in itertools order (so the
    identity is first): matrix p has P[i, perm_p[i]] = 1, i.e. (P @ X)[i] = X[perm_p[i]]."""
    perms = torch.tensor(list(itertools.permutations(range(m))), device=device)
    return torch.nn.functional.one_hot(perms, m).to(dtype)


def convex_permutations(a, perms):
    """sum_p a_p P_p: (..., m!) weights over the flattened permutation matrices `perms`
    (m!, m*m) -> (..., m*m), by a matmul in float64 rounded back to a's dtype. Not an fp32
    matmul: on CUDA with set_float32_matmul_precision("high") that may run in TF32 (10-bit
    mantissas), and the rows and columns of the result would then sum to 1 only to ~1e-4, not
    to fp32 rounding (the exactness mHC-lite and KromHC are about); TF32 never applies to
    float64, where each entry is its weights' sum rounded once. Nor an elementwise weighted
    sum, exact too: torch.compile's min-cut partitioner then kept more stream states for the
    backward (KromHC at D=12: 1.22x the residual baseline's memory instead of 1.10x, by
    nanochat/planning/memory.py). MPS has no float64: there the elementwise sum."""
    if a.device.type == "mps":
        return (a.unsqueeze(-1) * perms).sum(-2)
    wide = torch.promote_types(a.dtype, torch.float64)
    return (a.to(wide) @ perms.to(wide)).to(a.dtype)


def sinkhorn_log(logits, iters):
    """Sinkhorn-Knopp from exp(logits) over the last two dims, in log space: `iters` rounds
    of row normalization then column normalization. The last step normalizes columns, so
    column sums are 1 to rounding; row sums carry the remaining Sinkhorn error (tiny for
    moderate logits, larger when a row's logits spread widely)."""
    return SinkhornLog.apply(logits, iters)


def tokens_last(t):
    """(..., n, n) -> (n, n, N) contiguous: the reductions over n then run across long
    contiguous rows of tokens (on CPU ~3x faster than reducing 4 adjacent numbers)."""
    return t.reshape(-1, *t.shape[-2:]).permute(1, 2, 0).contiguous()


def tokens_first(t, shape):
    return t.permute(2, 0, 1).contiguous().view(shape)


def sinkhorn_steps(log_h, iters):
    """The 2 * iters log-space iterates of a tokens-last (n, n, N) tensor: even steps
    normalize rows (dim 1), odd steps columns (dim 0)."""
    out = []
    for step in range(2 * iters):
        log_h = log_h - torch.logsumexp(log_h, dim=1 - step % 2, keepdim=True)
        out.append(log_h)
    return out


class SinkhornLog(torch.autograd.Function):
    """Sinkhorn-Knopp that keeps only its logits for backward and recomputes the iterates
    there (autograd would keep ~2 tensors per half-step: 80 n x n matrices per token at 20
    iterations, more than X itself at small C). The gradient is the exact one of the unrolled iteration: a
    step l -> l - logsumexp(l) maps g to g - softmax(l) * sum(g), and softmax(l) is the
    exp of the step's own output."""

    @staticmethod
    def forward(ctx, logits, iters):
        ctx.iters = iters
        ctx.save_for_backward(logits)
        return tokens_first(sinkhorn_steps(tokens_last(logits), iters)[-1].exp(), logits.shape)

    @staticmethod
    def backward(ctx, g_h):
        logits, = ctx.saved_tensors
        steps = sinkhorn_steps(tokens_last(logits), ctx.iters)
        g = tokens_last(g_h) * steps[-1].exp()
        for step in reversed(range(2 * ctx.iters)):
            g = g - steps[step].exp() * g.sum(dim=1 - step % 2, keepdim=True)
        return tokens_first(g, logits.shape), None


def kron(a, b):
    """Batched Kronecker product over the last two dims: (..., m, p) x (..., q, r) -> (..., mq, pr),
    entry [i*q + k, j*r + l] = a[i, j] * b[k, l] (torch.kron's layout, per batch element)."""
    m, p = a.shape[-2:]
    q, r = b.shape[-2:]
    out = a[..., :, None, :, None] * b[..., None, :, None, :]
    return out.reshape(*out.shape[:-4], m * q, p * r)


def kron_factors(factors):
    """The paper's H_res = U^K kron ... kron U^1 from the list [U^1, ..., U^K]: U^1 acts on
    the fastest-varying digit of the stream index, U^K on the slowest."""
    h = factors[0]
    for u in factors[1:]:
        h = kron(u, h)
    return h


def prime_factors(n):
    """Prime factorization in descending order, e.g. 12 -> [3, 2, 2]."""
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return sorted(out, reverse=True)


def _nearby_supported(n):
    """The closest stream counts below and above n whose prime factors are all <= MAX_FACTOR."""
    ok = lambda m: m >= 2 and max(prime_factors(m)) <= MAX_FACTOR
    below = next((m for m in range(n - 1, 1, -1) if ok(m)), None)
    above = next(m for m in itertools.count(n + 1) if ok(m))
    return [m for m in (below, above) if m is not None]


def default_factors(n):
    """KromHC's default factorization: the prime factors of n, descending, each <= MAX_FACTOR."""
    factors = prime_factors(n)
    if factors[0] > MAX_FACTOR:
        near = " or ".join(str(m) for m in _nearby_supported(n))
        raise ValueError(f"kromhc with n={n} needs a factor {factors[0]} > {MAX_FACTOR} "
                         f"({factors[0]}! permutations per layer); use a nearby n such as {near}")
    return factors


def check_factors(n, factors):
    """Validate an explicit KromHC factorization of n; raises ValueError naming the fix."""
    factors = list(factors)
    if any(not isinstance(i, int) or i < 2 for i in factors):
        raise ValueError(f"hc_factors={factors}: every factor must be an integer >= 2")
    if math.prod(factors) != n:
        raise ValueError(f"hc_factors={factors} multiply to {math.prod(factors)}, not hc_streams={n}; "
                         f"give factors whose product is n (default for n={n}: prime factors)")
    too_big = [i for i in factors if i > MAX_FACTOR]
    if too_big:
        raise ValueError(f"hc_factors={factors}: factor {too_big[0]} > {MAX_FACTOR} would need "
                         f"{math.factorial(too_big[0])} permutation logits per layer; split it into smaller factors")
    return factors


def skew_generator_count(m):
    """Free entries of an m x m skew-symmetric matrix: its strict upper triangle."""
    return m * (m - 1) // 2


def skew_symmetric(upper, m):
    """The skew-symmetric A (..., m, m) whose strict upper triangle, row by row, is `upper`
    (..., m(m-1)/2): A[i, j] = upper[k] for the k-th pair i < j and A[j, i] = -A[i, j]."""
    rows, cols = torch.triu_indices(m, m, offset=1, device=upper.device)
    A = upper.new_zeros(*upper.shape[:-1], m, m)
    A[..., rows, cols] = upper
    return A - A.transpose(-1, -2)


def cayley(A):
    """(Q, M) for skew-symmetric A (..., m, m): M = (I + A)^-1 and the Cayley transform
    Q = (I - A)(I + A)^-1 = 2M - I, orthogonal (Q = I at A = 0). I + A is never singular (A's
    eigenvalues are imaginary), hence inv_ex: it skips the singularity check, which would
    synchronize a GPU with the host at every layer."""
    eye = torch.eye(A.shape[-1], device=A.device, dtype=A.dtype)
    M = torch.linalg.inv_ex(eye + A)[0]
    return 2 * M - eye, M


def block_sum_of_squares(Q, s):
    """H[i, j] = (1/s) sum_{k,l < s} Q[i*s + k, j*s + l]^2 for Q (..., n*s, n*s) -> (..., n, n).
    For an orthogonal Q every row and column of Q o Q sums to 1, and each entry of H sums s^2
    of them over s rows: H is doubly stochastic to rounding (orthostochastic at s = 1)."""
    n = Q.shape[-1] // s
    return Q.square().unflatten(-1, (n, s)).unflatten(-3, (n, s)).sum(dim=(-3, -1)) / s


def orthostochastic(generator, n, s):
    """go-mHC's H (..., n, n) from a generator (..., m(m-1)/2), m = n*s: the strict upper
    triangle of A, then H = block_sum_of_squares(cayley(A), s)."""
    return Orthostochastic.apply(generator, n, s)


class Orthostochastic(torch.autograd.Function):
    """The go-mHC map, keeping only its generator for backward and recomputing the inverse
    there (autograd would keep A, its LU factors, the inverse and Q: ~5 m^2 numbers per token
    against m(m-1)/2). With M = (I + A)^-1 and Q = 2M - I, dQ = -2 M dA M, so a gradient G_Q
    of Q is -2 M^T G_Q M^T on A; G_Q = (2/s) Q o g_H with g_H repeated over each s x s block;
    the generator entry of the pair i < j collects G_A[i, j] - G_A[j, i]."""

    @staticmethod
    def forward(ctx, generator, n, s):
        ctx.n, ctx.s = n, s
        ctx.save_for_backward(generator)
        return block_sum_of_squares(cayley(skew_symmetric(generator, n * s))[0], s)

    @staticmethod
    def backward(ctx, g_h):
        generator, = ctx.saved_tensors
        n, s = ctx.n, ctx.s
        Q, M = cayley(skew_symmetric(generator, n * s))
        g_q = (2 / s) * Q * g_h.repeat_interleave(s, dim=-1).repeat_interleave(s, dim=-2)
        g_a = -2 * M.mT @ g_q @ M.mT
        rows, cols = torch.triu_indices(n * s, n * s, offset=1, device=generator.device)
        return g_a[..., rows, cols] - g_a[..., cols, rows], None, None
