"""Val curves with a known compute multiplier, for the CM tests: a depth ladder whose every
run follows the loss model with LR annealing of Tissue et al. 2024 ("Scaling law with
learning rate annealing", arXiv 2408.11029),

    L(s) = L0 + A * S1(s)^-alpha - C * S2(s),

S1 the forward area (the sum of the LRs), S2 the annealing area with momentum
(m_i = lam * m_{i-1} + (eta_{i-1} - eta_i), S2 = sum of the m_i). Across the ladder, S1 is
counted in compute (each step adds its LR times its FLOPs, over a unit of 1e15 FLOPs) and S2
per step of the run (divided by the step count), so a run's final loss depends on its compute
and on the shape of its schedule. A variant worth k does each step's work as if with k times
the FLOPs: its S1 is k times the baseline's, its S2 the same. Its final bpb is then the one
a baseline run of the same schedule with k times its compute would reach: the true CM is k,
up to the small dependence of S2 on a run's step count through the momentum.

Horizons are ratio-sized (tokens = ratio x params, nanochat's --target-param-data-ratio),
evaluations every 250 steps and at the end, the paper's schedule (no warmup, warmdown 0.4
of the steps to 0).
"""

import numpy as np

BATCH = 2 ** 15  # tokens per step
EVAL_EVERY = 250


def lr_schedule(n, warmdown=0.4, final=0.0):
    s = np.arange(n)
    w = round(warmdown * n)
    progress = (n - s) / w
    return np.where(s <= n - w, 1.0, progress + (1 - progress) * final)


def momentum_sum(drops, lam, block=1000):
    """m_i = lam * m_{i-1} + drops_i for every i, vectorised in blocks (within a block,
    m_i = lam^(i-i0+1) m_{i0-1} + sum_j lam^(i-j) drops_j, whose powers stay finite)."""
    m = np.empty_like(drops)
    prev = 0.0
    for i0 in range(0, len(drops), block):
        d = drops[i0:i0 + block]
        powers = lam ** -np.arange(len(d), dtype=float)
        m[i0:i0 + len(d)] = prev * lam / powers + np.cumsum(d * powers) / powers
        prev = m[i0 + len(d) - 1]
    return m


def ladder_run(depth, k=1.0, ratio=12, L0=0.8, A=1.0, alpha=0.3, C=0.4, lam=0.999, unit=1e15):
    """(flops per step, val curve [(cumulative FLOPs, bpb)] at every EVAL_EVERY steps and the
    last) of one run at this depth; k is the variant's compute multiplier."""
    params = 12 * depth * (64 * depth) ** 2  # transformer matrices at width 64 * depth
    step_flops = 6 * params * BATCH
    n = int(ratio * params / BATCH)
    eta = lr_schedule(n)
    S1 = np.cumsum(eta) * k * step_flops / unit
    drops = np.concatenate([[0.0], eta[:-1] - eta[1:]])
    m = momentum_sum(drops, lam)
    S2 = np.cumsum(m) / n
    loss = L0 + A * S1 ** -alpha - C * S2
    steps = sorted(set(range(EVAL_EVERY, n + 1, EVAL_EVERY)) | {n})
    return step_flops, [(s * step_flops, float(loss[s - 1])) for s in steps]


def true_cm(depth, k, **model):
    """The true CM of the variant's run at this depth: the compute a baseline ladder run (the
    same schedule and ratio, at a real-valued depth found by bisection) needs to reach the
    variant's final bpb, over the variant's compute. It is k up to how S2 depends on the step
    count through the momentum."""
    flops, curve = ladder_run(depth, k, **model)
    target = curve[-1][1]
    lo, hi = 1.0, 64.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if ladder_run(mid, 1.0, **model)[1][-1][1] > target:
            lo = mid
        else:
            hi = mid
    return ladder_run(hi, 1.0, **model)[1][-1][0] / curve[-1][0]
