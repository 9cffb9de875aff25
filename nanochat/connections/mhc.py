"""mHC (DeepSeek): H_res = Sinkhorn-Knopp(exp(a_res * mat(x'W_res) + b_res)), approximately
doubly stochastic. Log-space, `hc_sk_iters` rounds (default 20) of row then column
normalization; ending on columns makes the column sums of H_res exact (to rounding) and
leaves the Sinkhorn error in the row sums. In the A-layout of the public code (A = H_res^T)
that is the same choice: its last step normalizes over targets.

Init: b_res = 0 on the diagonal and -8 off it (H_res diagonal 0.99899 at n = 4).
"""

import torch

from nanochat.connections import (FAMILY_SPEC, OFF_IDENTITY_BIAS, HyperConnection, column_stochastic_dead,
                                  layer_options, resolve_streams)
from nanochat.connections.res_maps import SinkhornMap

SPEC = dict(
    FAMILY_SPEC,
    label="mHC",
    description="n streams, H_res made approximately doubly stochastic by Sinkhorn-Knopp",
    source="arXiv 2512.24880",
    in_paper=True,
    shared_fields=FAMILY_SPEC["shared_fields"] + ("hc_sk_iters",),
    order=30,
    dead=column_stochastic_dead,  # H_res columns sum to one exactly, its rows to SK's tolerance (hc_layer.dead_parameters)
)


class MHCLayer(HyperConnection):
    def __init__(self, layer_index, n, C, sk_iters=20, **kw):
        super().__init__(layer_index, n, C, SinkhornMap(n, sk_iters), **kw)
        self.sk_iters = sk_iters

    def res_bias_init(self):
        return (OFF_IDENTITY_BIAS * (1 - torch.eye(self.n))).flatten()


def resolve(cfg):
    resolve_streams(cfg)
    if not isinstance(cfg.hc_sk_iters, int) or cfg.hc_sk_iters < 1:
        raise ValueError(f"hc_sk_iters={cfg.hc_sk_iters!r}: mhc needs at least 1 Sinkhorn-Knopp iteration (paper: 20)")


def make_layers(cfg):
    return [MHCLayer(j, cfg.hc_streams, cfg.n_embd, sk_iters=cfg.hc_sk_iters, **layer_options(cfg))
            for j in range(2 * cfg.n_layer)]
