"""Attention Residuals (arXiv 2603.15031, Kimi), Block form: a baseline beside the HC
family, not a hyper-connection (no streams, no H_res: the doubly-stochastic diagnostics do
not apply to it).

Each module l (attention and MLP each count, L = 2 * n_layer) reads a softmax mix of earlier
states through a learned pseudo-query w_l (C), with no additive residual:
    h_l = sum_i alpha_i v_i,   alpha = softmax_i(w_l . RMSNorm_g(v_i))
over its sources v_i; keys are RMS-normed with a learnable gain g_l (C), values are raw, and
the softmax has no temperature (the paper's pseudocode). The modules are cut into blocks of
S = `attnres_block_size` consecutive modules; the sources of module l are
    b_0 = x0 (the normed embedding), b_1 .. b_{k-1} (the sums of the outputs of each closed
    block), and the partial sum of its own block's earlier outputs (when it has any).
A block closes when the next one starts, so the first module of a block reads closed blocks
only. After the last module one more read, with its own query and gain, over every closed
block and the partial, gives the final state (the model norms it next) [flagged in the
source notes: seen in the paper's K3 figure and a line-by-line transcription, not in the
paper's pseudocode].
S = 1 is Full Attention Residuals (every module output is a source); S >= L leaves one block
(the residual stream, with b_0 kept apart).

Init (the paper: "all pseudo-query vectors must be initialized to zero"): w = 0, g = 1, so
every read is the plain mean of its sources (not the residual's sum). The first module reads
x0 alone, a softmax over one logit: its query and gain never get a gradient, and are kept
because the paper has and counts them (2C per module, plus the final read).
Default block size [ours, from the paper's N ~ 8 blocks]: 0 means ceil(L / 8) modules, 3 at
D = 12 (8 blocks); the paper's pseudocode closes blocks at transformer-layer boundaries (an
even S), its equations partition modules, which this follows for any S.
`hc_norm_weight` false drops the key gains (each is absorbable into its query).

State: the frame's X is the partial sum, (B, T, 1, C), starting as x0 (the default expand of
one stream; the first module closes it as b_0); the closed blocks travel as the carry, a list
of (b_k, 1/rms(b_k)) pairs, the rms computed once when a block closes. A read never stacks
its sources: w . RMSNorm(v) is (v . (g o w)) / rms(v), and the mix is a sum of per-source
multiply-adds, so what backward keeps is the sources themselves (alive anyway) and a few
numbers per token and source.
Coefficients in fp32 with autocast off; a read accumulates in fp32 and rounds once.
Training: queries and gains in the "hc" AdamW group at hc_lr, no weight decay, like every
connection parameter. hc_recompute is refused (a read keeps nothing to recompute), and so are
Liger's kernels (made for HC streams).
"""

import math

import torch
from torch import nn

from nanochat.connections import (RMS_EPS, ConnectionLayer, coefficient_dtype, config_params, no_autocast, record_reads,
                                  resolve_one_state)
from nanochat.flags import nonneg_int

BLOCKS = 8  # the paper's N ~ 8 blocks, which sets the default block size
# The variant's own config field and its default (0: about BLOCKS blocks); other variants
# refuse another value.
FIELDS = {"attnres_block_size": 0}
FIELD_HELP = {"attnres_block_size": "attnres: sub-layer modules per block (attention and MLP each count; 1 = Full "
                                    "Attention Residuals; 0 = ceil(2 * depth / 8), the paper's ~8 blocks: 3 at "
                                    "depth 12)"}
FIELD_TYPES = {"attnres_block_size": nonneg_int({0: "about 8 blocks"})}
def read_parameters(cfg, layer):
    """The names of a layer's depth-read parameters: its query, and its key gain unless
    hc_norm_weight is off (for SPEC dead, here and in the wirings built on this read)."""
    return [f"layers.{layer}.read.query"] + ([f"layers.{layer}.read.gain"] if cfg.hc_norm_weight else [])


def first_read_dead(cfg):
    """SPEC dead of a wiring whose first sub-layer reads x0 alone: a softmax over one source."""
    return dict.fromkeys(read_parameters(cfg, 0), "the first sub-layer reads x0 alone: a softmax over one source")


SPEC = dict(
    label="Block AttnRes (baseline)",
    description="each sub-layer reads a softmax mix of the embedding and earlier block states (no streams, no H_res)",
    source="arXiv 2603.15031",
    backout="its final read over the block states up to block floor(L/2), the query it learned for the end",
    state="single",
    has_h_res=False,
    in_paper=False,
    # Every read starts as the plain mean of its sources, 1/k of the residual's sum, which the
    # next RMSNorm (the sub-layer's, the head's) does not see: pre-norm to the norm's epsilon.
    equals_prenorm_at_init=True,
    params=config_params,  # 2C per read, 2 * n_layer reads and the final one
    settings=lambda cfg: block_settings(cfg.attnres_block_size, 2 * cfg.n_layer),
    order=80,
    shared_fields=("hc_norm_weight",),
    dead=first_read_dead,  # the first module reads the embedding alone
)


def default_block_size(n_modules):
    return math.ceil(n_modules / BLOCKS)


def block_settings(S, n_modules):
    return (f"block size {S} sub-layers ({math.ceil(n_modules / S)} blocks; default size "
            f"{default_block_size(n_modules)})")


def source(v):
    """(v, 1/rms(v)) for a state v (B, T, C): the rms over C in fp32 (fp64 for an fp64 v),
    without an fp32 copy of v."""
    ms = torch.linalg.vector_norm(v, dim=-1, keepdim=True, dtype=coefficient_dtype(v)).square() / v.shape[-1]
    return v, torch.rsqrt(ms + RMS_EPS)


class DepthRead(nn.Module):
    """One pseudo-query read: softmax over the sources of w . RMSNorm_g(v_i), then the
    weighted sum of the raw v_i."""

    def __init__(self, C, norm_weight=True):
        super().__init__()
        self.query = nn.Parameter(torch.empty(C))
        self.gain = nn.Parameter(torch.empty(C)) if norm_weight else None

    @torch.no_grad()
    def init_weights(self):
        self.query.zero_()
        if self.gain is not None:
            self.gain.fill_(1.0)

    def weights(self, sources):
        """alpha (B, T, len(sources)) fp32 over the (v, 1/rms(v)) pairs."""
        q = self.query if self.gain is None else self.query * self.gain
        logits = torch.cat([(v * q).sum(-1, keepdim=True) * inv_rms for v, inv_rms in sources], dim=-1)
        return torch.softmax(logits, dim=-1)

    def forward(self, sources):
        """(h (B, T, C) in the sources' dtype, alpha)."""
        v0 = sources[0][0]
        with no_autocast(v0):
            alpha = self.weights(sources)
            h = alpha[..., :1] * v0
            for i, (v, _) in enumerate(sources[1:], start=1):
                h = torch.addcmul(h, alpha[..., i:i + 1], v)
        return h.to(v0.dtype), alpha


class AttnResLayer(ConnectionLayer):
    """The read before module `index`; `block_start` when a block begins there."""

    def __init__(self, index, C, block_size, norm_weight=True):
        super().__init__()
        self.index = index
        self.block_start = index % block_size == 0
        self.read = DepthRead(C, norm_weight)
        self.capture = None  # a dict while StreamConnections.capture() is active

    def init_weights(self):
        self.read.init_weights()

    def sources(self, X, carry):
        """(sources of this module's read, closed blocks after it)."""
        blocks = list(carry or [])
        partial = source(X.squeeze(-2))
        if self.block_start:  # the partial closes as a block; the new block has no partial yet
            blocks.append(partial)
            return blocks, blocks
        return blocks + [partial], blocks

    def step(self, X, branch, x0, carry):
        sources, blocks = self.sources(X, carry)
        h, alpha = self.read(sources)
        if self.capture is not None:
            record_reads(self.capture, X, alpha)
        y = branch(h)
        partial = y if self.block_start else X.squeeze(-2) + y
        return partial.unsqueeze(-2), blocks


class FinalRead(DepthRead):
    """The last read, over every closed block and the partial: the frame's output."""

    def forward(self, X, carry):
        return super().forward([*carry, source(X.squeeze(-2))])[0]


def resolve(cfg):
    resolve_one_state(cfg, "has no streams (it reads block states)", "; --attnres-block-size sets its blocks")
    S = cfg.attnres_block_size
    if isinstance(S, bool) or not isinstance(S, int) or S < 0:
        raise ValueError(f"attnres_block_size={S!r} must be a whole number of modules >= 1 (1: Full Attention "
                         f"Residuals), or 0 for about {BLOCKS} blocks")
    if S == 0:
        cfg.attnres_block_size = default_block_size(2 * cfg.n_layer)


def make_layers(cfg):
    return [AttnResLayer(j, cfg.n_embd, cfg.attnres_block_size, norm_weight=cfg.hc_norm_weight)
            for j in range(2 * cfg.n_layer)]


def make_reduce(cfg):
    return FinalRead(cfg.n_embd, norm_weight=cfg.hc_norm_weight)
