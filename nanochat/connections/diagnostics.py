"""Measurements of the connection variants: parameter accounting (the paper's Table 2
column and its params-vs-n figure, and the formulas of frac and attnres), doubly-stochastic
errors per layer, the Figure-2 composite (per token, the product of every layer's H_res in
float64), and the stream-collapse measures of collapse.py at every layer's input and at the
final state. Attention Residuals has no H_res: its diagnostics are the weights its reads put
on their sources, and the doubly-stochastic ones are marked not applicable.

Matrices are in the H-convention (X_next = H_res @ X + ...), so for the composite
P = H_L ... H_1 the row sums give the forward gain (how much of the streams' total lands in
one output stream) and the column sums the backward gain. The paper's "column sums" are
those of its code's A = H^T, i.e. our row sums; both are reported.
"""

import math

import torch

from nanochat.connections.birkhoff import DEFAULT_GO_S, check_factors, default_factors, skew_generator_count
from nanochat.connections.collapse import MEASURE_VERSION, layer_measures, state_measures

# The variants the HC layer formula counts (one projection W of 2n + R columns per layer);
# frac, attnres and residual have their own formulas below. Each module's SPEC params reads
# its count through config_params.
HC_FORMULAS = ("hc", "hc_identity", "mhc", "mhc_lite", "kromhc", "go_mhc")
NOT_APPLICABLE = "not applicable"


# ----- parameter accounting -----

def res_logit_count(variant, n, factors=None, s=DEFAULT_GO_S):
    """R, the res columns of W: n^2 (hc, mhc), n! (mhc_lite), sum_k i_k! (kromhc), 0 (hc_identity),
    ns(ns-1)/2 (go_mhc with block size s)."""
    if variant not in HC_FORMULAS:
        raise ValueError(f"unknown hyper-connection variant {variant!r}; choose one of {', '.join(HC_FORMULAS)}")
    if n < 2:
        raise ValueError(f"{variant} needs n >= 2 streams (got {n})")
    if factors and variant != "kromhc":
        raise ValueError(f"factors only apply to kromhc (got variant {variant!r})")
    if variant == "kromhc":
        factors = check_factors(n, factors) if factors else default_factors(n)
        return sum(math.factorial(i) for i in factors)
    if variant == "go_mhc":
        return skew_generator_count(n * s)
    return {"hc": n * n, "mhc": n * n, "mhc_lite": math.factorial(n), "hc_identity": 0}[variant]


def frac_layer_params(m, C, norm_weight=True):
    """One Frac-Connection (the paper's Eqs. 16-20 with an RMSNorm): (C/m)(2m + 1) dynamic
    weights, m(2m + 1) static B, Y, A, the two scales s_alpha and s_beta, and C/m for the
    norm weight. 1,958 at C = 768, m = 4."""
    if m < 2 or C % m:
        raise ValueError(f"frac needs m >= 2 fractions that divide C={C} (got m={m})")
    d = C // m
    return d * (2 * m + 1) + m * (2 * m + 1) + 2 + (d if norm_weight else 0)


def attnres_read_params(C, norm_weight=True):
    """One Attention Residuals read: its pseudo-query (C) and its key-norm gain (C)."""
    return C + (C if norm_weight else 0)


def hc_layer_params(variant, n, C, factors=None, norm_weight=True, alpha_shared=True, s=DEFAULT_GO_S):
    """Parameters of one HC layer: nC*(2n + R) for W, 2n + R biases, the alphas (a_pre,
    a_post, and one a_res, or one per Kronecker factor when alpha_shared is False, or none
    for hc_identity), and nC for the RMSNorm weight. With the norm weight and shared alpha:
    nC*(2n + R) + (2n + R) + 3 + nC (hc_identity: nC*2n + 2n + 2 + nC).
    `residual` has 2 scalars per block, reported as 1 per layer (its mean); `frac` (n = m
    fractions) and `attnres` (one read per module) have their own formulas above."""
    if variant == "residual":
        return 1
    if variant == "frac":
        return frac_layer_params(n, C, norm_weight)
    if variant == "attnres":
        return attnres_read_params(C, norm_weight)
    R = res_logit_count(variant, n, factors, s)
    k = 2 * n + R
    if variant == "hc_identity":
        alphas = 2
    elif variant == "kromhc" and not alpha_shared:
        alphas = 2 + len(check_factors(n, factors) if factors else default_factors(n))
    else:
        alphas = 3
    return n * C * k + k + alphas + (n * C if norm_weight else 0)


def frame_params(n, C, expand="copy", reduce="sum", pre="current"):
    """Parameters the HC options add once per model: LSS's (n, C) scales (n*C); the learned
    head's W (n*C, n), b (n) and a (n*n*C + n + 1; none under delayed pre-weights, whose last
    layer folds the state). Delayed pre-weights add none: the pre columns move one layer on."""
    count = n * C if expand == "lss" else 0
    if reduce == "learned" and pre != "delayed":
        count += n * n * C + n + 1
    return count


def model_hc_params(variant, n, C, depth, factors=None, norm_weight=True, alpha_shared=True, expand="copy",
                    reduce="sum", pre="current", s=DEFAULT_GO_S):
    """All connection parameters of a depth-`depth` model: L = 2 * depth HC layers (attnres:
    L reads and the final one) and what the options add (frame_params)."""
    layers = 2 * depth + (variant == "attnres")
    return (layers * hc_layer_params(variant, n, C, factors, norm_weight, alpha_shared, s)
            + frame_params(n, C, expand, reduce, pre))


def option_params(cfg):
    """What the frame's stream options of a resolved model config add to its wiring's own
    parameters (frame_params: LSS's scales, the learned head; 0 at the paper's options). Every
    wiring that takes hc_expand or hc_reduce adds it in its SPEC params, the family's through
    model_hc_params, the others' by calling it (docs/connections.md, "Parameter accounting")."""
    return frame_params(cfg.hc_streams, cfg.n_embd, cfg.hc_expand, cfg.hc_reduce, cfg.hc_pre)


def config_params(cfg):
    """model_hc_params of a resolved model config: the SPEC params of the variants above."""
    return model_hc_params(cfg.hc, cfg.hc_streams, cfg.n_embd, cfg.n_layer, cfg.hc_factors or None,
                           cfg.hc_norm_weight, cfg.hc_alpha_shared, cfg.hc_expand, cfg.hc_reduce, cfg.hc_pre,
                           cfg.hc_go_s)


def config_stream_flops(cfg):
    """stream_mix_flops of every layer of a resolved model config (SPEC stream_flops)."""
    return 2 * cfg.n_layer * stream_mix_flops(cfg.hc, cfg.hc_streams, cfg.n_embd, cfg.hc_factors or None,
                                              cfg.hc_sk_iters, cfg.hc_go_s)


def stream_mix_flops(variant, n, C, factors=None, sk_iters=20, s=DEFAULT_GO_S):
    """Training FLOPs per token of one HC layer's work that GPT.estimate_flops does not count
    (forward x 3 for the backward): the RMSNorm over the n*C stream (~3nC), the pre and post
    mixes (2nC each), the res mix h_res @ X (2n^2C; none for hc_identity, whose H_res is I) and
    building H_res (Sinkhorn's sk_iters row and column passes for mhc, a convex combination of
    permutations for mhc_lite and per Kronecker factor for kromhc, plus the Kronecker product).
    These are memory-bound element-wise passes, not matmuls: the FLOP convention leaves them
    out, and this function says how much that is."""
    if variant not in HC_FORMULAS:
        raise ValueError(f"stream_mix_flops covers the HC variants {', '.join(HC_FORMULAS)} (got {variant!r})")
    forward = 3 * n * C + 2 * n * C + 2 * n * C + (0 if variant == "hc_identity" else 2 * n * n * C)
    if variant == "mhc":
        forward += sk_iters * 2 * 3 * n * n  # exp-normalise rows, then columns, in log space
    elif variant == "mhc_lite":
        forward += math.factorial(n) * (n * n + 3)  # softmax and the weighted sum of n! matrices
    elif variant == "kromhc":
        fs = check_factors(n, factors) if factors else default_factors(n)
        forward += sum(math.factorial(i) * (i * i + 3) for i in fs) + n * n * (len(fs) - 1)
    elif variant == "go_mhc":
        forward += 2 * (n * s) ** 3  # the Cayley transform's solve, roughly
    return 3 * forward


# ----- per-layer and composite measures -----

def record_state(store, X):
    """What the diagnostics keep of a stream state X (..., n, C), detached: per token the
    n x n inner products of its streams (energies on the diagonal; all the collapse
    measures derive from them), and the RMS of each stream over the batch. The products in
    fp64: an fp32 matmul may run in TF32 on CUDA (10-bit mantissas)."""
    Xf = X.detach().float()
    Xd = Xf.double()
    store.update(gram=Xd @ Xd.transpose(-1, -2),
                 stream_rms=Xf.square().flatten(0, -3).mean(dim=(0, 2)).sqrt(),
                 stream_dtype=str(X.dtype).replace("torch.", ""))


def record_layer(store, X, h_pre, h_post, h_res, res_logits=None):
    """What a layer in capture mode keeps (detached): the state it received, the
    coefficients it applied, and its res logits (before Sinkhorn / softmax) when it has any."""
    record_state(store, X)
    store.update(h_pre=h_pre.detach().float(), h_post=h_post.detach().float(), h_res=h_res.detach().float(),
                 res_logits=res_logits.detach().float() if res_logits is not None and res_logits.shape[-1] else None)


def record_reads(store, X, alpha):
    """What an Attention Residuals read in capture mode keeps: the partial state it received
    and the weights alpha (B, T, sources) it put on its sources."""
    record_state(store, X)
    store.update(source_weights=alpha.detach().float())


def ds_errors(h):
    """Doubly-stochastic errors of a batch of matrices (..., n, n): max |row sum - 1|,
    max |column sum - 1|, min entry."""
    return {"row_err": (h.sum(-1) - 1).abs().max().item(),
            "col_err": (h.sum(-2) - 1).abs().max().item(),
            "min_entry": h.min().item()}


def composite_product(h_res_list):
    """Per token P = H_L @ ... @ H_1 in float64 (the map X_0 -> X_L of the residual path),
    from a list of (..., n, n) in forward order; returns (N, n, n)."""
    P = None
    for h in h_res_list:
        P = compose(P, h)
    return P


def compose(P, h):
    """One more layer on the composite: h @ P in float64 (P = None starts from h)."""
    h = h.reshape(-1, *h.shape[-2:]).double()
    return h if P is None else h @ P


def composite_stats(P):
    """Figure-2 numbers of a batch of composites P (N, n, n): column-sum and row-sum MAE
    against 1 (mean over tokens of the per-token mean, and the worst token), forward and
    backward gain (largest absolute row / column sum over tokens), and the mean distance of
    P from the uniform mixer J/n (depth drives products of positive doubly stochastic
    matrices there)."""
    n = P.shape[-1]
    col = (P.sum(-2) - 1).abs().mean(-1)
    row = (P.sum(-1) - 1).abs().mean(-1)
    return {
        "composite_col_mae": col.mean().item(),
        "composite_row_mae": row.mean().item(),
        "composite_col_mae_max": col.max().item(),
        "composite_row_mae_max": row.max().item(),
        "fwd_gain": P.abs().sum(-1).amax().item(),
        "bwd_gain": P.abs().sum(-2).amax().item(),
        "uniform_dist": (P - 1.0 / n).abs().amax(dim=(-2, -1)).mean().item(),
    }


def read_stats(records, variant, n):
    """The diagnostics of Attention Residuals: per read, the mean weight on each source
    (b_0 = the embedding first, the partial block last when read) and the entropy of the
    weights in nats (log of the source count at init, where every read is a plain mean)."""
    layers = []
    for j, rec in enumerate(records):
        alpha = rec["source_weights"].flatten(0, -2)
        entropy = 0.0 - (alpha * alpha.clamp_min(1e-30).log()).sum(-1).mean().item()  # 0.0 -: no "-0.00"
        layers.append({"index": j, "sublayer": "attn" if j % 2 == 0 else "mlp", "sources": alpha.shape[-1],
                       "source_weights": alpha.mean(0).tolist(), "entropy": entropy,
                       "stream_rms": rec["stream_rms"].tolist()})
    return {"variant": variant, "n": n, "tokens": records[0]["source_weights"].flatten(0, -2).shape[0],
            "stream_dtype": records[0]["stream_dtype"], "doubly_stochastic": NOT_APPLICABLE, "layers": layers}


def state_stats(records, variant, n, final=None):
    """The diagnostics of a wiring whose layers record neither an H_res nor reads: per layer
    the RMS of each stream of the state it received, and the collapse measures of the final
    state; the doubly-stochastic ones are not applicable."""
    layers = [{"index": j, "sublayer": "attn" if j % 2 == 0 else "mlp", "stream_rms": rec["stream_rms"].tolist()}
              for j, rec in enumerate(records)]
    return {"variant": variant, "n": n, "tokens": records[0]["gram"].flatten(0, -3).shape[0],
            "stream_dtype": records[0]["stream_dtype"], "doubly_stochastic": NOT_APPLICABLE,
            "final": state_measures(final["gram"]) if final else None, "layers": layers}


def stats_from_records(records, variant, n, final=None):
    """The hc_stats dict from one captured forward: one record per layer in forward order,
    and `final`, the record of the state before reduce. Which measures apply depends on what
    every layer recorded (record_layer: an H_res; record_reads: read weights; the frame's
    record_state alone: the state)."""
    if all("source_weights" in rec for rec in records):
        return read_stats(records, variant, n)
    if not all(rec.get("h_res") is not None for rec in records):
        return state_stats(records, variant, n, final)
    layers, P = [], None
    for j, rec in enumerate(records):
        h = rec["h_res"]
        eye = torch.eye(h.shape[-1], device=h.device)
        P = compose(P, h)
        prefix = composite_stats(P)
        layers.append({
            "index": j,
            "sublayer": "attn" if j % 2 == 0 else "mlp",
            **ds_errors(h),
            "identity_dist": (h - eye).abs().amax(dim=(-2, -1)).mean().item(),
            "h_pre_mean": rec["h_pre"].flatten(0, 1).mean(0).tolist(),  # (n) or, for frac, (m, m)
            "h_post_mean": rec["h_post"].flatten(0, -2).mean(0).tolist(),
            "stream_rms": rec["stream_rms"].tolist(),
            "composite_col_mae": prefix["composite_col_mae"],
            "composite_row_mae": prefix["composite_row_mae"],
            **layer_measures(rec),
        })
    return {"variant": variant, "n": n, "tokens": P.shape[0], "stream_dtype": records[0]["stream_dtype"],
            **composite_stats(P),
            "max_layer_row_err": max(l["row_err"] for l in layers),
            "max_layer_col_err": max(l["col_err"] for l in layers),
            **{f"{key}_mean": mean_over(layers, key) for key in COLLAPSE_SUMMARY},
            "final": state_measures(final["gram"]) if final else None,
            "layers": layers}


# Collapse measures summarized over layers (their mean) in the stats dict and the report.
COLLAPSE_SUMMARY = ("effective_streams", "dominant_share", "stream_cosine", "read_effective", "write_effective",
                    "offdiag_mass", "perm_distance")


def mean_over(layers, key):
    values = [layer[key] for layer in layers if layer.get(key) is not None]
    return sum(values) / len(values) if values else None


@torch.no_grad()
def collect_hc_stats(model, idx):
    """Run `model` (the uncompiled GPT) on token ids idx (B, T) and return the
    JSON-serializable diagnostics of its connections: composite_col_mae, composite_row_mae,
    fwd_gain, bwd_gain, per-layer dicts, variant, n, the version of the collapse measures
    (collapse.MEASURE_VERSION), and more. Coefficients are those the
    forward actually used (fp32 whatever the compute dtype); memory is L * B*T * n^2 floats."""
    conn = model.connections
    with conn.capture() as captured:
        model(idx)
    records = captured["layers"]
    missing = [j for j, rec in enumerate(records) if not rec]
    if missing:
        raise RuntimeError(f"connection layers {missing} did not run in the forward; is `model` compiled? "
                           f"pass the uncompiled module")
    return {**stats_from_records(records, model.config.hc, conn.n, captured["final"]),
            "collapse_version": MEASURE_VERSION}
