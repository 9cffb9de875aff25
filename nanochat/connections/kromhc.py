"""KromHC: H_res = U^K kron ... kron U^1 with n = i_1 * ... * i_K (paper eq. kromhc_definition).

Per factor k: a^k = softmax(a_res * x'W^{res,k} + b^{res,k}) over the i_k! permutations of
size i_k, U^k = sum_m a^k_m P_m; the Kronecker product of doubly stochastic factors is
exactly doubly stochastic. The res columns of W are [factor 1 | ... | factor K]. a_res is
one scalar shared by the factors (paper default) or one per factor (hc_alpha_shared=False,
the paper's ablation). Init b^{res,k} = [0, -8, ..., -8] (identity first), so U^k ~ I.

H_res is built per token (n^2 numbers) and applied in one mix; applying the factors one
mode at a time would read and write the streams K times.
"""

import math

import torch

from nanochat.connections import (FAMILY_SPEC, OFF_IDENTITY_BIAS, HyperConnection, doubly_stochastic_dead,
                                  layer_options, resolve_streams)
from nanochat.connections.birkhoff import check_factors, default_factors
from nanochat.connections.res_maps import PermutationMixture
from nanochat.flags import factor_list

SPEC = dict(
    FAMILY_SPEC,
    label="KromHC",
    description="n streams, H_res a Kronecker product of small Birkhoff factors (exactly doubly stochastic)",
    source="arXiv 2601.21579",
    in_paper=True,
    settings=lambda cfg: (f"factors {' x '.join(map(str, cfg.hc_factors))}"
                          + ("" if cfg.hc_alpha_shared else ", one alpha_res per factor")),
    order=50,
    dead=doubly_stochastic_dead,  # H_res rows and columns sum to one exactly (hc_layer.dead_parameters)
)
# The variant's own config fields and their defaults: other variants refuse other values.
FIELDS = {"hc_factors": [], "hc_alpha_shared": True}
FIELD_HELP = {"hc_factors": "KromHC factorization of n, e.g. 2,2,2 or 4x2 (default: prime factors)",
              "hc_alpha_shared": "KromHC: one alpha_res shared by all factors"}
FIELD_TYPES = {"hc_factors": factor_list}


class KromHCLayer(HyperConnection):
    def __init__(self, layer_index, n, C, factors, alpha_shared=True, **kw):
        # A group per factor, each over all i_k! permutations of its size, no leak.
        res_map = PermutationMixture(n, [(i, "all", 1.0) for i in factors])
        super().__init__(layer_index, n, C, res_map, res_groups=None if alpha_shared else res_map.sizes, **kw)
        self.factor_sizes = tuple(factors)

    def res_bias_init(self):
        parts = []
        for i in self.factor_sizes:
            b = torch.full((math.factorial(i),), OFF_IDENTITY_BIAS)
            b[0] = 0.0
            parts.append(b)
        return torch.cat(parts)

    def factors(self, X):
        """[U^1, ..., U^K], each (B, T, i_k, i_k) fp32."""
        with torch.autocast(X.device.type, enabled=False):
            return self.res_map.factors(self.logits(X)[..., 2 * self.n:])


def resolve(cfg):
    if cfg.hc_streams == 0 and cfg.hc_factors:
        cfg.hc_streams = math.prod(cfg.hc_factors)
    resolve_streams(cfg)
    n = cfg.hc_streams
    cfg.hc_factors = check_factors(n, cfg.hc_factors) if cfg.hc_factors else default_factors(n)


def make_layers(cfg):
    return [KromHCLayer(j, cfg.hc_streams, cfg.n_embd, cfg.hc_factors, alpha_shared=cfg.hc_alpha_shared,
                        **layer_options(cfg)) for j in range(2 * cfg.n_layer)]
