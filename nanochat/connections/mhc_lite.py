"""mHC-lite: H_res = sum_k softmax(a_res * x'W_res + b_res)_k P_k over all n! permutation
matrices (Birkhoff-von Neumann), exactly doubly stochastic by construction.

Init: b_res = 0 for the identity (first) and -8 for the other n! - 1 permutations. The
factorial limits n: 6 streams already cost 720 logits per layer, hence MAX_STREAMS.
"""

import math

import torch

from nanochat.connections import (FAMILY_SPEC, OFF_IDENTITY_BIAS, HyperConnection, doubly_stochastic_dead,
                                  layer_options, resolve_streams)
from nanochat.connections.res_maps import PermutationMixture

MAX_STREAMS = 6
SPEC = dict(
    FAMILY_SPEC,
    label="mHC-lite",
    description="n streams, H_res a softmax-weighted sum of all n! permutation matrices (exactly doubly stochastic)",
    source="arXiv 2601.05732",
    in_paper=True,
    order=40,
    dead=doubly_stochastic_dead,  # H_res rows and columns sum to one exactly (hc_layer.dead_parameters)
)


class MHCLiteLayer(HyperConnection):
    def __init__(self, layer_index, n, C, **kw):
        # One group: the n! permutations of the n streams, no leak.
        super().__init__(layer_index, n, C, PermutationMixture(n, [(n, "all", 1.0)]), **kw)

    def res_bias_init(self):
        bias = torch.full((math.factorial(self.n),), OFF_IDENTITY_BIAS)
        bias[0] = 0.0
        return bias


def resolve(cfg):
    resolve_streams(cfg, max_streams=MAX_STREAMS)


def make_layers(cfg):
    return [MHCLiteLayer(j, cfg.hc_streams, cfg.n_embd, **layer_options(cfg)) for j in range(2 * cfg.n_layer)]
