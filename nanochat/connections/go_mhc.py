"""go-mHC (arXiv 2604.02309): H_res orthostochastic, built from a Cayley transform, exactly
doubly stochastic without Sinkhorn iterations and without the n! permutations of mHC-lite.

Per token, with m = n * s (s = `hc_go_s`, default 2, go-mHC's recommendation):
    A = skew(a_res * x'W_res + b_res)     the R = m(m-1)/2 res logits fill the strict upper
                                          triangle of an m x m skew-symmetric matrix
    Q = (I - A)(I + A)^-1                 the Cayley transform: orthogonal
    H_res[i, j] = (1/s) sum_{k,l < s} Q[i*s + k, j*s + l]^2
Every row and column of Q o Q sums to 1, so H_res is doubly stochastic to the rounding of
the inverse (fp32, one batched m x m inverse per token and layer, computed again in backward
rather than kept: birkhoff.Orthostochastic; autocast off, as every coefficient; with
--hc-kernels fused, by Gauss-Jordan on chip while m <= 8: res_maps.OrthostochasticMap). s = 1 gives
orthostochastic matrices; larger s reaches further into the Birkhoff polytope, at m^2 / 2
res logits.

Sources and choices:
- The Cayley sign is the go-mHC README's, Q = (I - A)(I + A)^-1 (its notebook solves
  (I - A) X = I + A, the same family with A -> -A; with a learned linear generator the two are
  one reparametrization apart).
- The generator is the HC family's projection [ours]: the go-mHC repository does not hold
  its language-model wiring, so A comes from the same per-token x'W as every HC variant's
  res logits, with its own a_res; only the strict upper triangle is generated, since only
  A - A^T matters (the README's full (ns)^2 generator has the same span).
- Init [ours; the repository's toy models start from random generators]: W = 0 and every
  generator bias b_res = sqrt(e^-8 / (4s)), so that H_res starts as close to the identity as
  mHC's, mHC-lite's and KromHC's do (off-diagonal entries ~e^-8: to second order
  H_ij = (1/s) sum (2 A_(i,k),(j,l))^2 = 4 s b^2). Not at I itself: every off-diagonal entry
  of H_res is a sum of squares of entries of Q that vanish at H_res = I, so the identity is a
  stationary point where W_res and b_res get exactly zero gradient and would never move
  (tests/test_go_mhc.py shows both).

Everything else (pre/post gates, the HC options, recompute, the stream-op backends) is the
HC layer of hc_layer.py.
"""

import math

import torch

from nanochat.connections import (FAMILY_SPEC, OFF_IDENTITY_BIAS, HyperConnection, doubly_stochastic_dead,
                                  layer_options, resolve_streams)
from nanochat.connections.birkhoff import DEFAULT_GO_S
from nanochat.connections.res_maps import OrthostochasticMap
from nanochat.flags import positive_int

SPEC = dict(
    FAMILY_SPEC,
    label="go-mHC",
    description="n streams, H_res orthostochastic from a Cayley transform (exactly doubly stochastic)",
    source="arXiv 2604.02309",
    in_paper=False,
    settings=lambda cfg: f"s={cfg.hc_go_s}",
    baseline="mhc",  # it replaces mHC's Sinkhorn
    order=60,
    dead=doubly_stochastic_dead,  # H_res rows and columns sum to one exactly (hc_layer.dead_parameters)
)
# The variant's own config field and its default: other variants refuse another value.
FIELDS = {"hc_go_s": DEFAULT_GO_S}
FIELD_HELP = {"hc_go_s": "go_mhc: block size s of the orthostochastic H_res (1: orthostochastic; go-mHC recommends "
                         "2); its skew-symmetric generator comes from the HC projection x'W, our choice (the source "
                         "publishes no LM wiring)"}
FIELD_TYPES = {"hc_go_s": positive_int()}


class GoMHCLayer(HyperConnection):
    def __init__(self, layer_index, n, C, s=DEFAULT_GO_S, **kw):
        super().__init__(layer_index, n, C, OrthostochasticMap(n, s), **kw)
        self.s = s

    def res_bias_init(self):
        return torch.full((self.res_groups[0],), math.sqrt(math.exp(OFF_IDENTITY_BIAS) / (4 * self.s)))


def resolve(cfg):
    resolve_streams(cfg)
    s = cfg.hc_go_s
    if isinstance(s, bool) or not isinstance(s, int) or s < 1:
        raise ValueError(f"hc_go_s={s!r}: go_mhc needs a block size s >= 1 (an integer; go-mHC recommends "
                         f"{DEFAULT_GO_S})")


def make_layers(cfg):
    return [GoMHCLayer(j, cfg.hc_streams, cfg.n_embd, s=cfg.hc_go_s, **layer_options(cfg))
            for j in range(2 * cfg.n_layer)]
