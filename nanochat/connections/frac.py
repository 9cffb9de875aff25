"""Frac-Connections (arXiv 2503.14125), the paper's dynamic form (DFC): the hidden state is
split into m fractions (m = `hc_streams`) instead of being copied into n streams, which
gives hyper-connections' learned depth and width mixing at the memory of one residual stream.

State: X = h (B, T, C) viewed as (B, T, m, C/m), fraction i = h[i*C/m : (i+1)*C/m] (Eq. 6);
`expand` and `reduce` are free views, no copy.

One layer (Eqs. 8, 11-14 and Alg. 2), every coefficient of fraction row i computed from that
fraction alone:
    Xbar    = RMSNorm(X) over each fraction's C/m values (one weight of C/m, shared)
    beta    = s_beta  * tanh(Xbar W_beta)  + B          (B, T, m)       W_beta (C/m)
    [Y | A] = s_alpha * tanh(Xbar W_[Y|A]) + [Y | A]    (B, T, m, 2m)   W_[Y|A] (C/m, 2m)
    u       = vec(Y^T X)                                the branch input (C)
    X_next  = beta o fractions(F(u)) + A^T X
B (1 x m), Y and A (m x m) are the static part, s_alpha and s_beta two learned scalars.
In this package's H-convention h_pre = Y^T (an m x m matrix: the branch reads a mix of the
fractions per fraction), h_post = beta (one scale per fraction) and h_res = A^T, which the
paper leaves unconstrained (the doubly-stochastic diagnostics then measure it as they measure
HC's).

Init (Eq. 15): W = 0, B = 1, Y = A = I, s_alpha = s_beta = 0.01: the layer computes
X + F(X) exactly, the pre-norm residual (the residual baseline at its init l_resid = 1,
l_x0 = 0, tests/test_frac.py).
Norm: RMSNorm with a learnable weight (the paper's Eq. 19 allows it in place of Alg. 2's
LayerNorm; its parameter count, 1,958 per layer at C = 768, m = 4, uses it); `hc_norm_weight`
false drops the weight.
Weight decay differs from the paper: it decays the dynamic W and not the static B, Y, A;
here every connection parameter trains in the "hc" AdamW group at hc_lr without weight
decay, like every other variant's, so that the variants differ in their connection only.
Precision: coefficients in fp32 with autocast off; the mixes accumulate in fp32 and round
once to X's dtype (the paper computes its mix in fp32 and casts to bf16).
Backends: the mixes are broadcast multiply-adds over the fractions (ops.stream_sum), which
the compiler fuses and which keep X, not an fp32 copy, for backward; Liger's kernels (made
for n copies of C) do not apply. `hc_recompute` keeps X alone for the coefficient path and
recomputes the per-fraction norm and the tanh in backward (they hold fp32 copies of the
state).
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from nanochat.connections import (ConnectionLayer, Parameterless, config_params, no_autocast, record_layer,
                                  resolve_streams, stream_sum)

SCALE_INIT = 0.01  # s_alpha and s_beta (Alg. 2)
SPEC = dict(
    label="Frac-Connections",
    description="the hidden state split into m fractions (--hc-streams m), mixed by dynamic per-fraction weights",
    source="arXiv 2503.14125",
    backout="the hidden state after block floor(L/2), its m fractions side by side (the readout is that view)",
    state="streams",
    has_h_res=True,  # A^T, an m x m matrix
    in_paper=False,
    equals_prenorm_at_init=True,  # W = 0, B = 1, Y = A = I: X + F(X)
    params=config_params,
    stream_symbol="m",
    order=70,
    shared_fields=("hc_streams", "hc_norm_weight", "hc_recompute", "hc_kernels"),
    # m fractions of one state, not n copies: the expand/reduce/pre options and the HC
    # kernels (made for n copies with per-stream weights) do not apply; recompute does
    options=("hc_recompute",),
)


class FracLayer(ConnectionLayer):
    """One dynamic Frac-Connection around one sub-layer. Parameters: `weight` (C/m, 2m + 1)
    with columns [W_beta | W_Y | W_A], `static` (m, 2m + 1) with columns [B^T | Y | A],
    `scale` = [s_beta, s_alpha], `norm_weight` (C/m)."""

    def __init__(self, m, C, norm_weight=True, recompute=False):
        super().__init__()
        self.m, self.d = m, C // m
        self.recompute = recompute
        self.weight = nn.Parameter(torch.empty(self.d, 2 * m + 1))
        self.static = nn.Parameter(torch.empty(m, 2 * m + 1))
        self.scale = nn.Parameter(torch.empty(2))
        self.norm_weight = nn.Parameter(torch.empty(self.d)) if norm_weight else None
        self.capture = None  # a dict while StreamConnections.capture() is active

    @torch.no_grad()
    def init_weights(self):
        m = self.m
        self.weight.zero_()
        self.static.copy_(torch.cat([torch.ones(m, 1), torch.eye(m), torch.eye(m)], dim=1))
        self.scale.fill_(SCALE_INIT)
        if self.norm_weight is not None:
            self.norm_weight.fill_(1.0)

    def gates(self, X):
        """(beta (B,T,m), Y (B,T,m,m), A (B,T,m,m)) in fp32, in the paper's orientation: row i
        of Y and A, and beta_i, come from fraction i."""
        with no_autocast(X):
            # In the weights' dtype: fp32 under autocast, fp64 in an fp64 model (the gradient checks).
            z = torch.tanh(F.rms_norm(X.to(self.weight.dtype), (self.d,), self.norm_weight) @ self.weight)
            s_beta, s_alpha = self.scale.unbind()
            beta = torch.addcmul(self.static[:, 0], z[..., 0], s_beta)
            mix = torch.addcmul(self.static[:, 1:], z[..., 1:], s_alpha)
            return beta, mix[..., :self.m], mix[..., self.m:]

    def coefficients(self, X):
        """(h_pre = Y^T, h_post = beta, h_res = A^T), fp32, H-convention."""
        beta, Y, A = self.gates(X)
        return Y.mT, beta, A.mT

    def step(self, X, branch, x0, carry):
        beta, Y, A = checkpoint(self.gates, X, use_reentrant=False) if self.recompute else self.gates(X)
        h_pre, h_res = Y.mT, A.mT
        if self.capture is not None:
            record_layer(self.capture, X, h_pre, beta, h_res)
        # stream_sum(h[..., None], X[..., None, :, :])[t] = sum_s h[t, s] X[s], fp32 (h is fp32)
        u = stream_sum(h_pre[..., None], X[..., None, :, :]).flatten(-2).to(X.dtype)
        y = branch(u).unflatten(-1, (self.m, self.d))
        X_next = torch.addcmul(stream_sum(h_res[..., None], X[..., None, :, :]), beta[..., None], y)
        return X_next.to(X.dtype), carry


class FractionExpand(Parameterless):
    """x0 (B, T, C) as m fractions (B, T, m, C/m): a view."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x0):
        return x0.unflatten(-1, (self.m, x0.shape[-1] // self.m))


class FractionReduce(Parameterless):
    """The fractions back into one hidden state (B, T, C): a view."""

    def forward(self, X, carry=None):
        return X.flatten(-2)


def resolve(cfg):
    resolve_streams(cfg)
    m, C = cfg.hc_streams, cfg.n_embd
    if C % m:
        valid = ", ".join(str(k) for k in range(2, min(C, 16) + 1) if C % k == 0)
        raise ValueError(f"hc='frac' splits the hidden state (C={C}) into hc_streams={m} equal fractions, and {m} "
                         f"does not divide {C}; choose hc_streams among {valid}")


def make_layers(cfg):
    return [FracLayer(cfg.hc_streams, cfg.n_embd, norm_weight=cfg.hc_norm_weight, recompute=cfg.hc_recompute)
            for _ in range(2 * cfg.n_layer)]


def make_expand(cfg):
    return FractionExpand(cfg.hc_streams)


def make_reduce(cfg):
    return FractionReduce()
