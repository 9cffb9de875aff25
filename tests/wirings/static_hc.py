"""Static hyper-connections (Zhu et al., arXiv 2409.19606, the `dynamic=False` form): per
sub-layer l learned H_pre, H_post in R^n and H_res in R^{n x n}, the same for every token, no
projection:

    X_{l+1} = H_res X_l + H_post^T F(H_pre X_l)        (the H-convention, docs/connections.md)

Init (the paper's static part, "Initialization"): H_pre = e_{l mod n} (layer l reads its home
stream), H_res = I, H_post = 1 (every stream receives F). Expansion copies x0 to the n
streams and the trunk sums them, as for the dynamic family. With that init every stream
receives the same F and the streams stay copies of each other: the model equals pre-norm at
init, and the stream-collapse measures see one stream (hc_report).

This wiring lives in the test suite only (tests/wirings/, registered for the tests through
NANOCHAT_WIRINGS in tests/conftest.py): it is the second worked example of docs/connections.md,
a member of the HC family whose layers are not hc.HyperConnection, so the projection checks,
Liger's ops and the fused seams do not apply to it, and it says so in its SPEC. Parameters:
2n + n^2 per sub-layer, and what the stream options add; coefficients fp32, mixes in ops.py (fp32 accumulation, one rounding).
"""

import torch
from torch import nn

from nanochat.connections import (ConnectionLayer, coefficient_dtype, mix_post, mix_pre, option_params, record_layer,
                                  resolve_streams)


def dead_parameters(cfg):
    """Layer 0 reads n copies of x0: its H_pre only scales x0, which the sub-layer's norm
    undoes. H_res's rows are free (not stochastic), so its H_res stays live."""
    if cfg.hc_expand != "copy":
        return {}
    return {"layers.0.h_pre": "layer 0 reads n copies of x0: H_pre only scales x0, which the sub-layer's RMSNorm "
                              "undoes"}


SPEC = dict(
    label="Static HC",
    description="n streams, learned per-layer H_pre, H_post and H_res with no projection (HC's static form)",
    source="arXiv 2409.19606 (dynamic=False)",
    state="streams",
    has_h_res=True,
    in_paper=False,
    equals_prenorm_at_init=True,
    # its layers' 2n + n^2 each, and what the stream options it takes add (LSS, the learned head)
    params=lambda cfg: 2 * cfg.n_layer * (2 * cfg.hc_streams + cfg.hc_streams ** 2) + option_params(cfg),
    baseline="hc",
    order=15,  # beside HC's dynamic form
    shared_fields=("hc_streams", "hc_expand", "hc_reduce"),
    family="hc",  # the H-convention, priced from the family's measured members
    options=("hc_expand", "hc_reduce"),  # no projected pre-weights to delay, no projection to recompute
    dead=dead_parameters,
)


class StaticHCLayer(ConnectionLayer):
    def __init__(self, layer_index, n):
        super().__init__()
        self.layer_index, self.n = layer_index, n
        self.h_pre = nn.Parameter(torch.empty(n))
        self.h_post = nn.Parameter(torch.empty(n))
        self.h_res = nn.Parameter(torch.empty(n, n))
        self.capture = None  # a dict while StreamConnections.capture() is active

    @torch.no_grad()
    def init_weights(self):
        self.h_pre.zero_()[self.layer_index % self.n] = 1.0
        self.h_post.fill_(1.0)
        self.h_res.copy_(torch.eye(self.n))

    def coefficients(self, X):
        """(h_pre (..., n), h_post (..., n), h_res (..., n, n)) in fp32, the same for every token."""
        dtype, lead = coefficient_dtype(X), X.shape[:-2]
        return (self.h_pre.to(dtype).expand(*lead, self.n), self.h_post.to(dtype).expand(*lead, self.n),
                self.h_res.to(dtype).expand(*lead, self.n, self.n))

    def step(self, X, branch, x0, carry):
        h_pre, h_post, h_res = self.coefficients(X)
        if self.capture is not None:
            record_layer(self.capture, X, h_pre, h_post, h_res)
        return mix_post(h_res, X, h_post, branch(mix_pre(h_pre, X))), carry


def resolve(cfg):
    resolve_streams(cfg)


def make_layers(cfg):
    return [StaticHCLayer(j, cfg.hc_streams) for j in range(2 * cfg.n_layer)]
