"""Circulant hyper-connections, C-mHC (S. Zwick, 2026: the manuscript paper/paper.tex and its
code, `HCMap(mode="cmhc")` in code/exp_train.py, in the author's repository, GitHub user
contactsebi): H_res a leaky convex combination of the n cyclic shifts, exactly doubly
stochastic from one softmax.

In the HC frame, X_next = H_res @ X + H_post^T F(H_pre @ X), with
    H_res = sum_k c_k Pi^k,   c = (1 - gamma) e_0 + gamma softmax(z),   gamma = beta / (2 L)
Pi the cyclic shift (stream t receives stream t - 1 mod n), L the number of residual
sub-layers (attention and MLP each count: L = 2 n_layer), beta = `cmhc_beta`. The source's
code counts L so: its residual-layer count is twice the blocks (code/exp_train.py l.22) and
gamma is 4 / (2 times that count) (l.88); its runs: beta = 4 at 6 blocks, gamma = 1/6 (1/12
at 12 blocks). [ours] gamma is capped at 1 (no identity term left) for models shallower than
beta / 4 blocks, where beta / (2L) would not be a weight. A convex combination of
permutations is doubly stochastic; the leak keeps H_res at least 1 - gamma on the diagonal,
so products over depth do not collapse to the mean as Sinkhorn products can.
Coefficients (the source's map, in hc_layer.HyperConnection): v = vec(X), h = a * (v / rms(v)) phi
+ b with phi (nC, 3n); H_pre = sigmoid, H_post = 2 sigmoid, z the res slice. The projection,
the mixes and the HC options come from hc_layer.HyperConnection.

Init (the source's): a = 0.01, phi ~ N(0, (0.02 / sqrt(nC))^2), b_pre = log(1/(n - 1))
(H_pre = 1/n: the mean of the streams), b_post = 0 (H_post = 1), b_res = 0 (H_res =
(1 - gamma) I + (gamma / n) 11^T). With identical streams any doubly stochastic H_res keeps
them identical, so the model is close to pre-norm at init but not equal: phi is random.
Exactness: H_res[t, s] = c[(t - s) mod n], built as the weighted sum of the n shift matrices
(birkhoff.convex_permutations: in float64, each entry is c_k plus exact zeros, where an fp32
matmul with TF32 would round c), so every row and column holds the n numbers of c. A gather
c[..., index] would give the same forward, but its backward scatters with atomic adds on a
GPU, whose order, and so whose rounding, changes from run to run.
Our choices, where the family's frame differs from the source (so that C-mHC differs from
mHC and KromHC in H_res and its init only): the source scales all 3n columns by one alpha,
here a_pre, a_post and a_res are the family's three (2 parameters more per sub-layer); the
source's RMSNorm has no weight, `hc_norm_weight` adds one like every HC variant's. With
`hc_norm_weight` false the count is the source's nC * 3n + 3n + 1 per sub-layer plus 2:
36,879 at n = 4, C = 768 (the source's 36,877); the stream options add theirs
(diagnostics.option_params). The source reduces by the mean of the
streams, the frame by the sum (the model's final RMSNorm makes them equal but for its
epsilon). Coefficients in fp32.
"""

import math

import torch
from torch import nn

from nanochat.connections import (LAYER_SPEC, HyperConnection, doubly_stochastic_dead, layer_options, option_params,
                                  resolve_streams)
from nanochat.connections.res_maps import PermutationMixture
from nanochat.flags import nonneg_float

PHI_STD = 0.02  # times 1 / sqrt(nC): the source's init of phi
FIELDS = {"cmhc_beta": 4.0}
FIELD_HELP = {"cmhc_beta": "cmhc: leak beta >= 0 of H_res, gamma = min(1, beta / (2 * sub-layers)), two sub-layers "
                           "per block (0: H_res = I); the source's runs: 4"}
FIELD_TYPES = {"cmhc_beta": nonneg_float()}


def layer_params(n, C, norm_weight=True):
    """phi, b, the three alphas and the norm weight: the source's nC * 3n + 3n + 1, plus 2 and nC."""
    return n * C * 3 * n + 3 * n + 3 + (n * C if norm_weight else 0)


SPEC = dict(
    LAYER_SPEC,
    label="C-mHC",
    description="H_res a leaky convex combination of the n cyclic shifts, exactly doubly stochastic from one softmax",
    source="S. Zwick, Circulant Hyper-Connections (2026 manuscript and code, GitHub user contactsebi)",
    in_paper=False,
    equals_prenorm_at_init=False,
    params=lambda cfg: (2 * cfg.n_layer * layer_params(cfg.hc_streams, cfg.n_embd, cfg.hc_norm_weight)
                        + option_params(cfg)),
    baseline="mhc",
    settings=lambda cfg: f"beta {cfg.cmhc_beta:g}",
    order=150,
    dead=doubly_stochastic_dead,  # H_res rows and columns sum to one exactly (hc_layer.dead_parameters)
)


class CirculantLayer(HyperConnection):
    def __init__(self, layer_index, n, C, gamma, **kw):
        # One group: the n cyclic shifts Pi^k (Pi^k[t, s] = [s = t - k]), leak gamma.
        super().__init__(layer_index, n, C, PermutationMixture(n, [(n, "cyclic", gamma)]), **kw)
        self.gamma = gamma

    @torch.no_grad()
    def init_weights(self):
        super().init_weights()
        n = self.n
        nn.init.normal_(self.weight, std=PHI_STD / math.sqrt(n * self.C))
        self.bias[:n] = math.log(1 / (n - 1))  # H_pre = 1/n and H_post = 1 on every stream
        self.bias[n:2 * n] = 0.0

    def res_bias_init(self):
        return torch.zeros(self.n)

    def shift_weights(self, res_logits):
        """c = (1 - gamma) e_0 + gamma softmax(z): the weight of Pi^k, (..., n)."""
        return self.res_map.weights(res_logits)[0]


def resolve(cfg):
    resolve_streams(cfg)
    beta = cfg.cmhc_beta
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta < math.inf:
        raise ValueError(f"cmhc_beta={beta!r} must be a finite number >= 0 (the leak gamma = min(1, beta / "
                         f"(2 * sub-layers))); the source's runs used 4")


def make_layers(cfg):
    gamma = min(1.0, cfg.cmhc_beta / (2 * (2 * cfg.n_layer)))  # L = 2 * n_layer sub-layers, as the source
    return [CirculantLayer(j, cfg.hc_streams, cfg.n_embd, gamma, **layer_options(cfg)) for j in range(2 * cfg.n_layer)]
