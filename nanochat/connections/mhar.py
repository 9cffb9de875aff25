"""Multi-Head Attention Residuals, MHAR (Luo, Cai & Hu, arXiv 2607.27230): the per-sub-layer
(Full) form of Attention Residuals (attnres.py, block size 1) with the depth read split into
H heads, H = `mhar_heads`.

Sources s_0 = x0 (the normed embedding) and s_i = the raw output of sub-layer i; module l
reads s_0 .. s_{l-1}, with no additive residual (replacement routing). Its query q (C) is
cut into H heads of C/H channels; head h reads its channels of every source:
    alpha^h_i = softmax_i(q_[h] . RMSNorm_g(s_i)_[h]),   input_[h] = sum_i alpha^h_i s_i,[h]
and after the last sub-layer a final read, with its own query and gain, gives the output
(the model norms it next), as attnres's. H = 1 is attnres with `attnres_block_size` 1, to
the bit (tests/test_mhar.py loads one's weights into the other).
Our choice where the paper is ambiguous: its equation RMS-normalises the whole width and
then slices the heads (done here, as hyper-connection-factory does), where its code listing
normalises each head's slice. The key-norm gain g (`hc_norm_weight`, as attnres's) is the
factory's; the paper counts the query alone (C per site).

Init (the paper's): q = 0, g = 1, so every read is the plain mean of its sources, which
the paper calls a uniform average rather than an identity. The sources sum to the pre-norm
residual h, so that mean is h / N, and the sub-layers' weightless RMSNorm and the model's
final norm make it exactly pre-norm at init here, to the norms' epsilon (tested). The first
module reads x0 alone (a softmax over one logit): its query and gain get
no gradient. Default H [ours, the paper's recommendation]: 0 means n_kv_head.
State and precision as attnres's: the frame's X is the last output, the closed sources
travel as the carry with their 1/rms; coefficients in fp32, reads accumulate in fp32.
"""

import torch

from nanochat.connections import attnres, no_autocast, resolve_one_state
from nanochat.connections.diagnostics import attnres_read_params
from nanochat.flags import nonneg_int

FIELDS = {"mhar_heads": 0}
FIELD_HELP = {"mhar_heads": "mhar: heads H of each depth read, dividing n_embd (0: n_kv_head, the paper's "
                            "recommendation; 1: attnres with block size 1)"}
FIELD_TYPES = {"mhar_heads": nonneg_int({0: "n_kv_head"})}

SPEC = dict(
    label="MHAR",
    description="multi-head attention residuals: each sub-layer reads a per-head softmax mix of the embedding and "
                "every earlier sub-layer output",
    source="arXiv 2607.27230",
    backout="its final multi-head read over the sources up to block floor(L/2)",
    state="single",
    has_h_res=False,
    in_paper=False,
    equals_prenorm_at_init=True,  # through the sub-layers' RMSNorm (the docstring)
    params=lambda cfg: (2 * cfg.n_layer + 1) * attnres_read_params(cfg.n_embd, cfg.hc_norm_weight),
    baseline="prenorm",
    settings=lambda cfg: f"{cfg.mhar_heads} heads",
    order=130,
    shared_fields=("hc_norm_weight",),
    dead=attnres.first_read_dead,  # the first module reads x0 alone: a softmax over one logit
)


class MultiHeadRead(attnres.DepthRead):
    """A depth read with H heads: one softmax over the sources per head, each over its C/H
    channels of the full-width RMS-normed keys."""

    def __init__(self, C, heads, norm_weight=True):
        super().__init__(C, norm_weight)
        self.heads = heads

    def weights(self, sources):
        """alpha (B, T, H, len(sources)) fp32."""
        q = self.query if self.gain is None else self.query * self.gain
        logits = torch.stack([(v * q).unflatten(-1, (self.heads, -1)).sum(-1) * inv_rms for v, inv_rms in sources],
                             dim=-1)
        return torch.softmax(logits, dim=-1)

    def forward(self, sources):
        v0 = sources[0][0]
        with no_autocast(v0):
            alpha = self.weights(sources)
            h = alpha[..., :1] * v0.unflatten(-1, (self.heads, -1))
            for i, (v, _) in enumerate(sources[1:], start=1):
                h = torch.addcmul(h, alpha[..., i:i + 1], v.unflatten(-1, (self.heads, -1)))
        return h.flatten(-2).to(v0.dtype), alpha


class MHARLayer(attnres.AttnResLayer):
    def __init__(self, index, C, heads, norm_weight=True):
        super().__init__(index, C, block_size=1, norm_weight=norm_weight)
        self.read = MultiHeadRead(C, heads, norm_weight)


class FinalRead(attnres.FinalRead, MultiHeadRead):
    """attnres's final read over every source, with heads."""


def resolve(cfg):
    resolve_one_state(cfg, "reads earlier sub-layer outputs, it has no streams", hint="; --mhar-heads sets its heads")
    H = cfg.mhar_heads
    if isinstance(H, bool) or not isinstance(H, int) or H < 0:
        raise ValueError(f"mhar_heads={H!r} must be a whole number of heads dividing n_embd, or 0 for n_kv_head")
    if H == 0:
        cfg.mhar_heads = H = cfg.n_kv_head
    if cfg.n_embd % H:
        valid = ", ".join(str(k) for k in range(1, min(cfg.n_embd, 16) + 1) if cfg.n_embd % k == 0)
        raise ValueError(f"mhar_heads={H} does not divide n_embd={cfg.n_embd}; choose among {valid}")


def make_layers(cfg):
    return [MHARLayer(j, cfg.n_embd, cfg.mhar_heads, cfg.hc_norm_weight) for j in range(2 * cfg.n_layer)]


def make_reduce(cfg):
    return FinalRead(cfg.n_embd, cfg.mhar_heads, cfg.hc_norm_weight)
