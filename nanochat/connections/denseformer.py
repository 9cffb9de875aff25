"""DenseFormer (Pagliardini et al., NeurIPS 2024, arXiv 2402.02622): after a block, a
Depth-Weighted Average (DWA) of the embedding and every block output so far replaces the
state the next block reads.

With X_0 the embedding and blocks numbered from 1, block i computes X_i = Block_i(Y_{i-1})
(Y_0 = X_0; a block is the plain pre-norm attention and MLP with their residual adds) and

    Y_i = sum_{j in S_i} alpha_{i,j} X_j,    S_i = {j <= i : j = i (mod k)}

with dilation k (`dwa_dilation`; the newest output and every k-th one before it). With
period p (`dwa_period`) the average is taken only after the blocks i with i % p == 0, and
Y_i = X_i after the others [our reading of the authors' code, github.com/epfml/DenseFormer,
where the period is a setting of its DWA modules; the paper's own description of it could
not be read]. The last state goes to the final norm.
Every block output X_j is kept (the sources of later averages), never an average Y.
Parameters: alpha_i (|S_i| scalars) per averaging block, L_b (L_b + 3) / 2 in all for k =
p = 1 (90 at 12 blocks). Init alpha_{i,i} = 1 and the rest 0: exactly the pre-norm residual.

Ours, where the sources differ from nanochat: X_0 is the model's normed embedding (the
source averages the raw one); the alphas train in the "hc" AdamW group at hc_lr without
weight decay, like every connection parameter (the official trainer decays them).

State: one stream (B, T, 1, C), each sub-layer x + F(x) (frame.BlockLevelLayer); the carry
is the list X_0 .. X_i, per token, so KV-cache decoding needs nothing more. Called alone
(no carry) a block end takes the earlier outputs as a model whose earlier blocks add
nothing would have them, x0 each. The average is computed with autocast off, accumulates
in fp32 (fp64 for fp64 states) and rounds once.
"""

import torch
from torch import nn

from nanochat.connections import BlockLevelLayer, coefficient_dtype, no_autocast, resolve_one_state
from nanochat.flags import positive_int

FIELDS = {"dwa_dilation": 1, "dwa_period": 1}
FIELD_HELP = {"dwa_dilation": "denseformer: dilation k, each average reads the newest block output and every k-th "
                              "one before it (1: all of them)",
              "dwa_period": "denseformer: period p, an average after every p-th block only (1: after every block)"}
FIELD_TYPES = {"dwa_dilation": positive_int(), "dwa_period": positive_int()}


def averaged_sources(block, dilation, period):
    """S_i of block `block` (1-based): the indices j of the outputs its average reads, oldest
    first, or None where the period skips the average."""
    if block % period:
        return None
    return list(range(block % dilation, block + 1, dilation))


def dwa_params(cfg):
    """Every alpha of the model: sum over the averaging blocks of |S_i|."""
    return sum(len(s) for i in range(1, cfg.n_layer + 1)
               if (s := averaged_sources(i, cfg.dwa_dilation, cfg.dwa_period)) is not None)


class DWALayer(BlockLevelLayer):
    """The layer around sub-layer `index`; at a block end (odd index) the block's DWA."""

    def __init__(self, index, dilation=1, period=1):
        super().__init__(index)
        self.block = index // 2 + 1  # the block this sub-layer belongs to, from 1
        self.sources = averaged_sources(self.block, dilation, period) if index % 2 else None
        self.alpha = nn.Parameter(torch.empty(len(self.sources))) if self.sources else None

    @torch.no_grad()
    def init_weights(self):
        if self.alpha is not None:
            self.alpha.zero_()
            self.alpha[-1] = 1.0  # S_i ends with i itself

    def block_end(self, x, x0, carry):
        outputs = (carry if carry is not None else [x0] * self.block) + [x]  # X_0 .. X_i
        if self.alpha is None:
            return x, outputs
        with no_autocast(x):
            alpha = self.alpha.to(coefficient_dtype(x))
            y = alpha[0] * outputs[self.sources[0]].to(alpha.dtype)
            for a, j in zip(alpha[1:], self.sources[1:]):
                y = torch.addcmul(y, outputs[j], a)
        return y.to(x.dtype), outputs


def resolve(cfg):
    resolve_one_state(cfg, "has one state (it averages block outputs)", "; --dwa-dilation and --dwa-period shape it")
    for name in FIELDS:
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a whole number >= 1 (1: every block output / every block)")


def make_layers(cfg):
    return [DWALayer(j, cfg.dwa_dilation, cfg.dwa_period) for j in range(2 * cfg.n_layer)]


SPEC = dict(
    label="DenseFormer",
    description="after every block, a learned depth-weighted average of the embedding and every block output so far",
    source="arXiv 2402.02622",
    backout="the state after block floor(L/2): the weighted average of earlier block outputs that block's end computes",
    state="single",
    has_h_res=False,
    in_paper=False,
    equals_prenorm_at_init=True,  # alpha_{i,i} = 1, the rest 0
    params=dwa_params,
    bench_layer=1,  # the first block end: its average
    settings=lambda cfg: f"dilation {cfg.dwa_dilation}, period {cfg.dwa_period}",
    order=100,
)
