"""The post-norm residual of the original Transformer (Vaswani et al. 2017, arXiv 1706.03762)
and of hyper-connection-factory's `postnorm` (github.com/wdlctc/hyper-connection-factory,
`hcfactory/connections/residual.py`): the norm after the sum, not before the sub-layer,

    h <- RMSNorm_g(h + F(h))    per sub-layer,

with F the sub-layer called raw (SPEC sublayer_prenorm=False: no input RMSNorm of its own;
attention keeps its q/k norms, which act inside it). The state starts as the normed embedding
x0 and is folded by the frame's sum (a squeeze); the model's final norm stays.
Norm: RMSNorm over C with a learned gain g per sub-layer, init 1 (the factory's post-norm
norms are affine RMSNorms; the original Transformer's a LayerNorm with gain and bias);
`hc_norm_weight` false gives nanochat's weightless RMSNorm, which every other norm of the
model is. Epsilon: nanochat's (F.rms_norm's default). At init with nanochat's zero output
projections each step is norm(h): x0 passes through unchanged, and the projections still get
a gradient through the norm, so nothing needs another start.
Not pre-norm at init, by its math. Parameters: C per sub-layer with the gain, none without.
Training: the gains in the "hc" AdamW group at hc_lr, no weight decay. Precision: the sum and
the norm in the state's dtype with autocast off, as the model's own norm.
"""

import torch
import torch.nn.functional as F
from torch import nn

from nanochat.connections import ConnectionLayer, no_autocast
from nanochat.connections.prenorm import resolve  # noqa: F401 (one stream, checked as pre-norm's)

SPEC = dict(
    label="Post-norm",
    description="the original Transformer's residual h = RMSNorm(h + F(h)), each sub-layer called without its "
                "input norm",
    source="arXiv 1706.03762; github.com/wdlctc/hyper-connection-factory (postnorm)",
    backout="the stream after block floor(L/2), already normed by that block's post-norm",
    state="single",
    has_h_res=False,
    in_paper=False,
    equals_prenorm_at_init=False,
    params=lambda cfg: 2 * cfg.n_layer * cfg.n_embd if cfg.hc_norm_weight else 0,
    baseline="prenorm",
    shared_fields=("hc_norm_weight",),
    sublayer_prenorm=False,
    order=91,
)


class PostNormLayer(ConnectionLayer):
    def __init__(self, C, norm_weight=True):
        super().__init__()
        self.gain = nn.Parameter(torch.empty(C)) if norm_weight else None

    @torch.no_grad()
    def init_weights(self):
        if self.gain is not None:
            self.gain.fill_(1.0)

    def step(self, X, branch, x0, carry):
        h = X.squeeze(-2)
        s = h + branch(h)
        with no_autocast(s):
            out = F.rms_norm(s, (s.size(-1),), None if self.gain is None else self.gain.to(s.dtype))
        return out.unsqueeze(-2), carry


def make_layers(cfg):
    return [PostNormLayer(cfg.n_embd, cfg.hc_norm_weight) for _ in range(2 * cfg.n_layer)]
