"""LayerScale (Touvron et al., CaiT, arXiv 2103.17239): the pre-norm residual with a learned
per-channel scale on each sub-layer's output,

    h_{l+1} = h_l + gamma_l * F_l(h_l),   gamma_l in R^C, every entry `layerscale_init` at init

(CaiT's 0.1 for models up to 18 blocks). One state, no stream option. With nanochat's zero
output projections gamma's gradient is zero in step 0 and the projections' is gamma times
theirs: a slow start, which the first update ends.

This wiring lives in the test suite only (tests/wirings/): a second wiring kept outside the
package, with a config field of its own (`layerscale_init`), so that the tests can register it
beside static_hc.py (NANOCHAT_WIRINGS=a.py:b.py) and check that a run of one does not depend on
the other (tests/test_checkpoint_wirings.py). Parameters: C per sub-layer; gamma in fp32,
applied in the state's dtype.
"""

import math

import torch
from torch import nn

from nanochat.connections import ConnectionLayer, resolve_one_state

FIELDS = {"layerscale_init": 0.1}
FIELD_HELP = {"layerscale_init": "layerscale: the start of every entry of each sub-layer's output scale (CaiT: 0.1)"}

SPEC = dict(
    label="LayerScale",
    description="the pre-norm residual with a learned per-channel scale on each sub-layer's output",
    source="arXiv 2103.17239",
    state="single",
    has_h_res=False,
    in_paper=False,
    equals_prenorm_at_init=False,
    params=lambda cfg: 2 * cfg.n_layer * cfg.n_embd,
    baseline="prenorm",
    settings=lambda cfg: f"init {cfg.layerscale_init:g}",
)


class LayerScaleLayer(ConnectionLayer):
    def __init__(self, C, init):
        super().__init__()
        self.init = init
        self.gamma = nn.Parameter(torch.empty(C))
        self.capture = None  # records nothing itself: the trunk records its input state

    @torch.no_grad()
    def init_weights(self):
        self.gamma.fill_(self.init)

    def step(self, X, branch, x0, carry):
        x = X.squeeze(-2)
        return (x + self.gamma.to(x.dtype) * branch(x)).unsqueeze(-2), carry


def resolve(cfg):
    resolve_one_state(cfg, "has one stream", hint="; --layerscale-init sets its start")
    if not isinstance(cfg.layerscale_init, (int, float)) or not math.isfinite(cfg.layerscale_init):
        raise ValueError(f"layerscale_init={cfg.layerscale_init!r} must be a finite number (CaiT: 0.1)")


def make_layers(cfg):
    return [LayerScaleLayer(cfg.n_embd, cfg.layerscale_init) for _ in range(2 * cfg.n_layer)]
