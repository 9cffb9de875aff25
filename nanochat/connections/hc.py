"""HC (hyper-connections, arXiv 2409.19606, in the KromHC paper's appendix form): n streams,
dynamic H_pre / H_post and an unconstrained H_res from one projection, the HC layer
(hc_layer.py, which says how the family computes) with

    H_res = a_res * mat(x'W_res) + b_res,   b_res = I at init,

mat putting res column t*n + s at H_res[t, s]: the paper's appendix, mHC without Sinkhorn-Knopp.
"""

import importlib

import torch

from nanochat.connections import FAMILY_SPEC, HyperConnection, layer_options, resolve_streams
from nanochat.connections.res_maps import FreeMap

SPEC = dict(
    FAMILY_SPEC,
    label="HC",
    description="n streams, dynamic H_pre / H_post and an unconstrained H_res from one projection",
    source="arXiv 2409.19606 (in the KromHC paper's appendix form)",
    in_paper=False,
    beside_paper=True,
    order=10,
)


class HCLayer(HyperConnection):
    """Unconstrained H_res = a_res * mat(x'W_res) + b_res, b_res = I at init;
    mat puts column t*n + s at H_res[t, s]."""

    def __init__(self, layer_index, n, C, **kw):
        super().__init__(layer_index, n, C, FreeMap(n), **kw)

    def res_bias_init(self):
        return torch.eye(self.n).flatten()


def resolve(cfg):
    resolve_streams(cfg)


def make_layers(cfg):
    return [HCLayer(j, cfg.hc_streams, cfg.n_embd, **layer_options(cfg)) for j in range(2 * cfg.n_layer)]


# This module held the family's layer until it moved to hc_layer.py (hc_identity's layer to
# hc_identity.py): a wiring written against `from nanochat.connections.hc import ...` keeps
# importing those names (the ones above come from nanochat.connections, as a wiring's should).
MOVED = {**dict.fromkeys(("DEFAULT_STREAMS", "PRES", "ALPHA_INIT", "OFF_IDENTITY_BIAS", "FAMILY_FIELDS", "LAYER_SPEC",
                          "dead_parameters", "res_slices", "layer_parts", "connection_layer",
                          "doubly_stochastic_dead", "column_stochastic_dead"), ".hc_layer"),
         "HCIdentityLayer": ".hc_identity"}


def __getattr__(name):
    if name not in MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(MOVED[name], __package__), name)
