"""The plain pre-norm residual: x = x + F(x) per sub-layer, where F is the sub-layer with
its own input RMSNorm (the branch). No per-block scalars and no re-injection of the
embedding, unlike `residual` (nanochat's baseline, the KromHC paper's "Residual" row): this
is the transformer of GPT-2 and Llama, the reference the hyper-connection-factory harness
(github.com/wdlctc/hyper-connection-factory) states every other wiring's numbers against.

State: one stream, (B, T, 1, C), starting as the normed embedding x0 and folded by the
trunk's sum (a squeeze). No parameters. The single-state check here is shared by the other
wirings that keep one (B, T, C) state.
"""

import torch

from nanochat.connections.diagnostics import record_layer
from nanochat.connections.trunk import ConnectionLayer

OWN_STATE = "a single stream"  # not the HC family's n streams: the HC options do not apply
SPEC = dict(
    label="Pre-norm",
    description="the plain pre-norm residual x = x + F(norm(x)), without nanochat's scalars or x0 path",
    source="arXiv 2002.04745 (pre-LN); github.com/wdlctc/hyper-connection-factory (its reference row)",
    state="single",
    has_h_res=False,
    in_paper=False,
    equals_prenorm_at_init=True,
    params=lambda cfg: 0,
)


class PreNormLayer(ConnectionLayer):
    def __init__(self):
        super().__init__()
        self.capture = None  # a dict while StreamConnections.capture() is active

    def step(self, X, branch, x0, carry):
        if self.capture is not None:
            record_layer(self.capture, X, *self.coefficients(X))
        x = X.squeeze(-2)
        return (x + branch(x)).unsqueeze(-2), carry

    def init_weights(self):
        pass

    def coefficients(self, X):
        """n = 1: h_pre = h_post = h_res = 1, fp32."""
        ones = torch.ones(*X.shape[:-2], 1, device=X.device, dtype=torch.float32)
        return ones, ones, ones.unsqueeze(-1)


def resolve_single_state(cfg, own_flags=""):
    """Checks shared by the wirings with one (B, T, C) state: no streams (hc_streams 0 or 1,
    set to 1), nothing to recompute, no Liger kernels (made for HC streams)."""
    if cfg.hc_streams not in (0, 1):
        raise ValueError(f"hc={cfg.hc!r} has a single state, no streams; got hc_streams={cfg.hc_streams}. "
                         f"Drop --hc-streams{own_flags} or pick a hyper-connection variant (e.g. --hc kromhc)")
    cfg.hc_streams = 1
    if cfg.hc_recompute:
        raise ValueError(f"hc_recompute does not apply to hc={cfg.hc!r} (it has no stream coefficients to "
                         "recompute); drop it")
    if cfg.hc_kernels == "liger":
        raise ValueError(f"hc_kernels='liger' has no kernels for hc={cfg.hc!r} (Liger's are made for HC streams); "
                         "use hc_kernels='torch' or 'auto'")


def resolve(cfg):
    resolve_single_state(cfg)


def make_layers(cfg):
    return [PreNormLayer() for _ in range(2 * cfg.n_layer)]
