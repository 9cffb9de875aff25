"""The gated residual of Qwen's 2026 hyper-connection models (Qwen3.8-Flash-Next; Hugging Face
transformers, models/qwen4_exp/modeling_qwen4_exp.py: `Qwen4ExpTextGatedResidual`, its
decoder layer and model): n streams carried by the identity, read through a per-channel,
per-stream sigmoid gate and written through a per-stream gate.

Per sub-layer, on the streams X (n x C) of a token:
    xhat  = RMSNorm_j(X_j) * (1 + g_j)                    grouped: one RMSNorm per stream
    m     = sigmoid(W_up SiLU(W_down vec(xhat) / n))     (n x C): the read gate, rank r
    u     = mean_j (m_j o xhat_j)                        the branch input (C)
    w     = 2 sigmoid(W_inj vec(xhat) / n)               (n): the write gate
    X_j  <- X_j + w_j F(u)                               no H_res: the identity carry
with W_down (nC -> r), W_up (r -> nC), W_inj (nC -> n) and g (n x C). The streams start as n
copies of the embedding; after the last sub-layer a mixer (the same read, with its own g,
W_down and W_up, and no write) folds them to one state.

Init [ours; the release states none, its ports load trained weights]: g = 0, W_up = 0,
W_inj = 0, W_down uniform with the model's matrix scale +-sqrt(3 / nC). Then m = 1/2 and
w = 1, and with copies of one state u = xhat / 2.
Our choices where the frame differs from the release: Qwen removes the sub-layers' input
norms (the grouped norm replaces them) and lets the mixer replace the final norm; here every
branch keeps its weightless RMSNorm and the model norms the mixer's output, which makes the
scale of u immaterial (the gates still weigh channels and streams against each other) and
the model exactly pre-norm at init, to the norms' epsilon. Rank r = `gated_rank`, 0 meaning
C / 8 (the release's 320 at C = 2560). `hc_norm_weight` false drops g.

Parameters per sub-layer: 2nCr + n * nC + nC (g); the mixer 2nCr + nC. State: the n
streams in the compute dtype; the norm and the gates in fp32 (autocast off); u and the
write accumulate in fp32 and round once (ops.mix_post with the identity).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from nanochat.connections import (RMS_EPS, ConnectionLayer, coefficient_dtype, mix_post, no_autocast, record_layer,
                                  resolve_streams)
from nanochat.flags import nonneg_int

RANK_DIVISOR = 8  # the release: rank 320 at C = 2560
FIELDS = {"gated_rank": 0}
FIELD_HELP = {"gated_rank": "gated: rank r of the read gate's bottleneck, >= 1 (0: n_embd / 8, the release's ratio)"}
FIELD_TYPES = {"gated_rank": nonneg_int({0: "n_embd / 8"})}


def default_rank(C):
    return max(1, C // RANK_DIVISOR)


def model_params(n, C, L, r, norm_weight=True):
    """2L gated layers and the mixer."""
    read = 2 * n * C * r + (n * C if norm_weight else 0)
    return L * (read + n * n * C) + read


SPEC = dict(
    label="Gated residual",
    description="n streams with an identity carry, a per-channel sigmoid read gate (low rank), a per-stream "
                "write gate, grouped RMSNorm and a final mixer (Qwen3.8-Flash-Next)",
    source="Hugging Face transformers, models/qwen4_exp (Qwen4ExpTextGatedResidual); arXiv 2608.30320",
    backout="its gated final read of the streams after block floor(L/2): the mixer's weights from those streams",
    state="streams",
    has_h_res=True,  # the identity, as hc_identity's
    in_paper=False,
    equals_prenorm_at_init=True,
    params=lambda cfg: model_params(cfg.hc_streams, cfg.n_embd, 2 * cfg.n_layer, cfg.gated_rank, cfg.hc_norm_weight),
    baseline="prenorm",
    settings=lambda cfg: f"rank {cfg.gated_rank}",
    order=160,
    shared_fields=("hc_streams", "hc_norm_weight"),
    # The gates read and write the streams themselves (nC per-channel gates, not the HC
    # projection's k numbers): no stream option and no HC kernel applies
)


class GatedRead(nn.Module):
    """The grouped norm and the read gate: X (..., n, C) -> (u (..., C), vec(xhat) / n), fp32."""

    def __init__(self, n, C, rank, norm_weight=True):
        super().__init__()
        self.n = n
        self.norm_weight = nn.Parameter(torch.empty(n, C)) if norm_weight else None  # g: scales 1 + g
        self.down = nn.Parameter(torch.empty(n * C, rank))
        self.up = nn.Parameter(torch.empty(n * C, rank))  # W_up^T: the large dimension first

    @torch.no_grad()
    def init_weights(self):
        bound = math.sqrt(3.0 / self.down.shape[0])
        nn.init.uniform_(self.down, -bound, bound)
        self.up.zero_()
        if self.norm_weight is not None:
            self.norm_weight.zero_()

    def read_gate(self, X):
        """(m (..., n, C), xhat (..., n, C), vec(xhat) / n), fp32; call with autocast off."""
        dtype = coefficient_dtype(X)
        xhat = F.rms_norm(X.to(dtype), (X.shape[-1],), eps=RMS_EPS)
        if self.norm_weight is not None:
            xhat = xhat * (1 + self.norm_weight.to(dtype))
        scaled = xhat.flatten(-2) / self.n
        m = torch.sigmoid(F.silu(scaled @ self.down.to(dtype)) @ self.up.to(dtype).t())
        return m.view_as(xhat), xhat, scaled

    def forward(self, X):
        m, xhat, scaled = self.read_gate(X)
        return (m * xhat).mean(dim=-2), scaled


class GatedLayer(ConnectionLayer):
    """One gated residual around one sub-layer."""

    def __init__(self, n, C, rank, norm_weight=True):
        super().__init__()
        self.n = n
        self.read = GatedRead(n, C, rank, norm_weight)
        self.inject = nn.Parameter(torch.empty(n * C, n))  # W_inj^T
        self.capture = None  # a dict while StreamConnections.capture() is active

    @torch.no_grad()
    def init_weights(self):
        self.read.init_weights()
        self.inject.zero_()

    def gates(self, X):
        """(u (..., C), w (..., n)), fp32."""
        u, scaled = self.read(X)
        return u, 2 * torch.sigmoid(scaled @ self.inject.to(scaled.dtype))

    def coefficients(self, X):
        """For the stream diagnostics, in the H-convention as far as it reaches: h_pre the read
        gate's mean over channels / n (the read is per channel, of the normed streams), h_post
        the write gate, h_res the identity."""
        with no_autocast(X):
            m = self.read.read_gate(X)[0]
            w = self.gates(X)[1]
        eye = torch.eye(self.n, device=X.device, dtype=w.dtype).expand(*w.shape, self.n)
        return m.mean(dim=-1) / self.n, w, eye

    def step(self, X, branch, x0, carry):
        if self.capture is not None:
            record_layer(self.capture, X, *self.coefficients(X))
        with no_autocast(X):
            u, w = self.gates(X)
        return mix_post(None, X, w, branch(u.to(X.dtype))), carry


class GatedMixer(GatedRead):
    """The final read: the streams folded to one state (the model norms it next)."""

    def forward(self, X, carry=None):
        with no_autocast(X):
            return super().forward(X)[0].to(X.dtype)


def resolve(cfg):
    resolve_streams(cfg)
    r = cfg.gated_rank
    if isinstance(r, bool) or not isinstance(r, int) or r < 0:
        raise ValueError(f"gated_rank={r!r} must be a whole number >= 1, or 0 for n_embd / {RANK_DIVISOR}")
    if r == 0:
        cfg.gated_rank = default_rank(cfg.n_embd)


def make_layers(cfg):
    return [GatedLayer(cfg.hc_streams, cfg.n_embd, cfg.gated_rank, cfg.hc_norm_weight) for _ in range(2 * cfg.n_layer)]


def make_reduce(cfg):
    return GatedMixer(cfg.hc_streams, cfg.n_embd, cfg.gated_rank, cfg.hc_norm_weight)
