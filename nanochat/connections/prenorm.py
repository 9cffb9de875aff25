"""The plain pre-norm residual: x = x + F(x) per sub-layer, where F is the sub-layer with
its own input RMSNorm (the branch). No per-block scalars and no re-injection of the
embedding, unlike `residual` (nanochat's baseline, the KromHC paper's "Residual" row): this
is the transformer of GPT-2 and Llama, the reference the hyper-connection-factory harness
(github.com/wdlctc/hyper-connection-factory) states every other wiring's numbers against.

State: one stream, (B, T, 1, C), starting as the normed embedding x0 and folded by the
frame's sum (a squeeze). No parameters.
"""

from nanochat.connections import ConnectionLayer, resolve_one_state

SPEC = dict(
    label="Pre-norm",
    description="the plain pre-norm residual x = x + F(norm(x)), without nanochat's scalars or x0 path",
    source="arXiv 2002.04745 (pre-LN); github.com/wdlctc/hyper-connection-factory (its reference row)",
    backout="the stream after block floor(L/2)",
    state="single",
    has_h_res=False,
    in_paper=False,
    equals_prenorm_at_init=True,
    params=lambda cfg: 0,
    order=90,
)


class PreNormLayer(ConnectionLayer):
    def step(self, X, branch, x0, carry):
        x = X.squeeze(-2)
        return (x + branch(x)).unsqueeze(-2), carry

    def init_weights(self):
        pass


def resolve(cfg):
    resolve_one_state(cfg, "has one stream", hint=" or pick a hyper-connection variant (e.g. --hc kromhc)")


def make_layers(cfg):
    return [PreNormLayer() for _ in range(2 * cfg.n_layer)]
