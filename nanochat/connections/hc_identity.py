"""hc_identity: the HC layer (hc_layer.py) with H_res fixed to the identity and dynamic
pre/post weights, the project's ablation of what the streams buy without any mixing."""

from nanochat.connections import FAMILY_SPEC, HyperConnection, layer_options, resolve_streams
from nanochat.connections.res_maps import IdentityMap

SPEC = dict(
    FAMILY_SPEC,
    label="HC (H_res = I)",
    description="n streams, dynamic H_pre / H_post, H_res fixed to the identity (no stream mixing)",
    source="nanochat-hc (an ablation of arXiv 2409.19606)",
    in_paper=False,
    beside_paper=True,
    order=20,
)


class HCIdentityLayer(HyperConnection):
    """H_res fixed to I with dynamic pre/post: what the streams buy without any mixing."""

    def __init__(self, layer_index, n, C, **kw):
        super().__init__(layer_index, n, C, IdentityMap(n), **kw)


def resolve(cfg):
    resolve_streams(cfg)


def make_layers(cfg):
    return [HCIdentityLayer(j, cfg.hc_streams, cfg.n_embd, **layer_options(cfg)) for j in range(2 * cfg.n_layer)]
