"""Stream-collapse measures: does the stream state use its n streams, and does H_res mix them?

2026 studies report that H_res stays near the identity after an early "seeding" stage and
that signal concentrates in one dominant stream (arXiv 2606.03483), and that the Birkhoff
constraint drives "identity degeneration" (arXiv 2603.20896). Neither text gives formulas
that could be retrieved, so the measures are ours (the sources describe them in words only); each
is averaged over the tokens of a fixed batch:

state X (per token n x C; G = X X^T its Gram matrix, e_s = G_ss = |X[s]|^2, p_s = e_s / tr G)
  energy_share       E[p_s] per stream
  dominant_share     E[max_s p_s], in [1/n, 1]; dominant_stream: the most frequent argmax
  effective_streams  E[(tr G)^2 / |G|_F^2], in [1, n]: the participation ratio of G's eigenvalues
                     (the squared singular values of X), the effective dimension of Gao et al.,
                     "A theory of multineuronal dimensionality, dynamics and measurement" (2017).
                     It counts the directions the streams span, weighted by their energy: n copies
                     (or scaled copies) of one stream give 1, n orthogonal streams of equal energy
                     n, k orthogonal groups of copies with equal energy k. For orthogonal streams
                     it equals the participation ratio of the energies, 1 / sum p_s^2; energies
                     alone would count n copies as n streams.
  stream_cosine      mean cosine between two different streams (1 for plain copies)
coefficients
  read_effective     E[1 / sum q_s^2], q = H_pre / sum H_pre: how many streams a layer reads
  write_effective    the same for H_post: how many it writes
  offdiag_mass       E[1 - tr(H_res) / n]: 0 for I, 1 for any zero-diagonal permutation
  identity_fro       E[|H_res - I|_F]
  perm_distance      E[1 - max_sigma (1/n) sum_t H_res[t, sigma(t)]] (n <= 8): 0 when H_res is a
                     permutation; beside offdiag_mass it tells "another permutation" from mixing
  res_logit_range    E[max - min] of a token's res logits (the released code's "log(1/nu)": the
                     spread Sinkhorn or the softmax has to resolve)
"""

import functools

import torch

MAX_PERMUTATION_STREAMS = 8  # dynamic programming over 2^n subsets of columns
# The version of these measures a stats dict holds (its "collapse_version"; hc_stats.json and the
# training log's "hc" records). 2: effective_streams the participation ratio of the Gram
# matrix's eigenvalues (distinct directions). 1, stats without the key (written before
# 2026-11-28): the same key held the participation ratio of the energies, 1 / sum p_s^2, which
# counts n copies as n streams. The report reads one version and names the runs of the other.
MEASURE_VERSION = 2


def state_measures(gram):
    """The state measures from the per-token Gram matrices (..., n, n) of the streams."""
    gram = gram.reshape(-1, *gram.shape[-2:]).double()
    n = gram.shape[-1]
    energy = gram.diagonal(dim1=-2, dim2=-1)
    share = energy / energy.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    dominant = share.max(-1)
    out = {"energy_share": share.mean(0).tolist(),
           "dominant_share": dominant.values.mean().item(),
           "dominant_stream": int(torch.bincount(dominant.indices, minlength=n).argmax()),
           "effective_streams": spectral_participation(gram).mean().item(),
           "stream_cosine": None}
    if n > 1:
        norms = energy.clamp_min(torch.finfo(torch.float64).tiny).sqrt()
        cosine = gram / (norms[:, :, None] * norms[:, None, :])
        pairs = torch.triu_indices(n, n, offset=1)
        out["stream_cosine"] = cosine[:, pairs[0], pairs[1]].mean().item()
    return out


def spectral_participation(gram):
    """Per token (sum lambda)^2 / sum lambda^2 over the eigenvalues lambda of its Gram matrix
    (N, n, n), from the trace and the Frobenius norm (sum lambda^2 = |G|_F^2 for a symmetric G):
    no eigendecomposition, and no rank threshold to choose. A threshold is not needed because the
    measure is second order in how far streams are from copies: copies that differ by a relative
    delta per element (rounding) give about 1 + 2 (1 - 1/n) delta^2, which for bf16 (delta below
    2^-8) is under 1e-4, invisible at the two decimals the reports print. An all-zero token (no
    direction at all) gives 0."""
    trace = gram.diagonal(dim1=-2, dim2=-1).sum(-1)
    frobenius_sq = gram.square().sum(dim=(-2, -1))
    return trace.square() / frobenius_sq.clamp_min(torch.finfo(gram.dtype).tiny)


def effective_count(h):
    """E[1 / sum q^2] for q = h / sum h over the last dim: how many entries carry the weight."""
    h = h.reshape(-1, h.shape[-1]).double()
    q = h / h.sum(-1, keepdim=True)
    return (1 / q.square().sum(-1)).mean().item()


def mixing_measures(h_res):
    """offdiag_mass, identity_fro and perm_distance of a batch of H_res (..., n, n)."""
    h = h_res.reshape(-1, *h_res.shape[-2:]).double()
    n = h.shape[-1]
    eye = torch.eye(n, dtype=h.dtype, device=h.device)
    trace = h.diagonal(dim1=-2, dim2=-1).sum(-1)
    perm = None
    if n <= MAX_PERMUTATION_STREAMS:
        perm = (1 - best_assignment(h) / n).mean().item()
    return {"offdiag_mass": (1 - trace / n).mean().item(),
            "identity_fro": torch.linalg.matrix_norm(h - eye).mean().item(),
            "perm_distance": perm}


@functools.cache
def _subset_tables(n):
    """For each subset size k: the subsets (bitmasks) of that size, and for each column t the
    subset without t (or -1 where t is not in the subset)."""
    tables = []
    for k in range(1, n + 1):
        masks = [m for m in range(1 << n) if bin(m).count("1") == k]
        prev = [[m ^ (1 << t) if m >> t & 1 else -1 for m in masks] for t in range(n)]
        tables.append((torch.tensor(masks), torch.tensor(prev)))
    return tables


def best_assignment(h):
    """max over permutations sigma of sum_t h[t, sigma(t)] for each matrix of h (N, n, n):
    best[S] = the best sum over rows 0..|S|-1 assigned to the column set S, built up one row
    at a time (O(n^2 2^n) per matrix, vectorized over the matrices)."""
    N, n, _ = h.shape
    best = h.new_full((N, 1 << n), float("-inf"))
    best[:, 0] = 0
    for k, (masks, prev) in enumerate(_subset_tables(n), start=1):
        masks, prev = masks.to(h.device), prev.to(h.device)
        candidates = best[:, prev.clamp_min(0)] + h[:, k - 1, :, None]  # (N, n columns, subsets)
        candidates = candidates.masked_fill(prev < 0, float("-inf"))
        best[:, masks] = candidates.max(dim=1).values
    return best[:, -1]


def logit_range(res_logits):
    """E[max - min] of each token's res logits, or None when the layer has none."""
    if res_logits is None:
        return None
    z = res_logits.reshape(-1, res_logits.shape[-1]).double()
    return (z.amax(-1) - z.amin(-1)).mean().item()


def layer_measures(record):
    """Every measure of one captured layer (diagnostics.record_layer's dict)."""
    return {**state_measures(record["gram"]),
            "read_effective": effective_count(record["h_pre"]),
            "write_effective": effective_count(record["h_post"]),
            **mixing_measures(record["h_res"]),
            "res_logit_range": logit_range(record.get("res_logits"))}
