"""ReZero (Bachlechner, Majumder, Mao, Cottrell & McAuley, 2020, arXiv 2003.04887): the
residual with a learned scale in front of each sub-layer and no norm at all,

    h <- h + alpha_l F_l(h)    per sub-layer l, alpha_l a scalar from 0,

so that every layer starts as the identity. F_l is called raw (SPEC sublayer_prenorm=False:
the paper removes the LayerNorms; attention keeps its q/k norms, which act inside it). The
state starts as the normed embedding x0 and is folded by the frame's sum; the model's final
norm stays.
The output projections' start [ours]: nanochat starts both output projections at zero, and
with alpha = 0 as well neither would ever get a gradient (alpha's is <dL/dh, F(h)> with F = 0,
the projections' is proportional to alpha): the run's loss would fall through the embedding
and the head alone. The paper's sub-layers start from their usual random init; here
`init_sublayers` gives the attention's and the MLP's output projections nanochat's rule for
its other matrices, uniform with standard deviation 1/sqrt(fan_in) (bound sqrt(3 / fan_in),
fan_in = C for attention, 4C for the MLP), after the model's own init. At init the model is
still x0 -> head (alpha = 0), and alpha learns from the first step.
Parameters: one alpha per sub-layer, 2 * n_layer in all; they train in the "hc" AdamW group
at hc_lr without weight decay. Precision: alpha is fp32; h + alpha F(h) is summed in fp32
and rounds once to the state's dtype.
"""

import math

import torch
from torch import nn

from nanochat.connections import ConnectionLayer, coefficient_dtype, no_autocast
from nanochat.connections.prenorm import resolve  # noqa: F401 (one stream, checked as pre-norm's)

SPEC = dict(
    label="ReZero",
    description="h = h + alpha F(h) per sub-layer with a learned scalar alpha from 0 and no norm before the sub-layer",
    source="arXiv 2003.04887",
    backout="the stream after block floor(L/2)",
    state="single",
    has_h_res=False,
    in_paper=False,
    equals_prenorm_at_init=False,
    params=lambda cfg: 2 * cfg.n_layer,
    baseline="prenorm",
    sublayer_prenorm=False,
    order=92,
)


class ReZeroLayer(ConnectionLayer):
    def __init__(self):
        super().__init__()
        self.alpha = nn.Parameter(torch.empty(1))

    @torch.no_grad()
    def init_weights(self):
        self.alpha.zero_()

    def step(self, X, branch, x0, carry):
        h = X.squeeze(-2)
        y = branch(h)
        with no_autocast(h):
            dtype = coefficient_dtype(h)
            out = torch.addcmul(h.to(dtype), y.to(dtype), self.alpha.to(dtype))
        return out.to(h.dtype).unsqueeze(-2), carry


def make_layers(cfg):
    return [ReZeroLayer() for _ in range(2 * cfg.n_layer)]


def init_sublayers(cfg, sublayers):
    """Output projections uniform with std 1/sqrt(fan_in) (the module docstring), so that alpha learns."""
    for sublayer in sublayers:
        weight = sublayer.c_proj.weight
        bound = math.sqrt(3.0 / weight.shape[1])
        nn.init.uniform_(weight, -bound, bound)
