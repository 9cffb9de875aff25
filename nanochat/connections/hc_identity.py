"""hc_identity: the HC layer with H_res fixed to the identity and dynamic pre/post weights
(hc.HCIdentityLayer), the project's ablation of what the streams buy without any mixing."""

from nanochat.connections.hc import FAMILY_SPEC, HCIdentityLayer, layer_options, resolve

SPEC = dict(
    FAMILY_SPEC,
    label="HC (H_res = I)",
    description="n streams, dynamic H_pre / H_post, H_res fixed to the identity (no stream mixing)",
    source="nanochat-hc (an ablation of arXiv 2409.19606)",
    in_paper=False,
    beside_paper=True,
    order=20,
)
__all__ = ["SPEC", "resolve", "make_layers"]


def make_layers(cfg):
    return [HCIdentityLayer(j, cfg.hc_streams, cfg.n_embd, **layer_options(cfg)) for j in range(2 * cfg.n_layer)]
