"""nanochat's baseline residual stream (the paper's "Residual" row): n = 1.

Before block i the stream is re-mixed with the embedding, x = l_resid[i] * x + l_x0[i] * x0,
then each sub-layer adds its output, x = x + F(x). The two scalars live on the block's
first (attention) layer; the MLP layer is a plain residual add. Init l_resid = 1,
l_x0 = 0 (the paper's appendix; nanochat's own pin used 0.1).

On the 2026-07 trunk (nanochat 92d63d4, gpt.py init_weights) the two start per block instead:
l_resid[i] = 1.15 - 0.10 i/(L-1), l_x0[i] = 0.20 - 0.15 i/(L-1) (more of the stream and of the
embedding early, less deep), and l_resid trains with weight decay 0.05 (toward 0, where the
stream's scale is free to shrink): the trunk's record (nanochat/trunks.py `residual_starts`,
`resid_weight_decay`) holds both.

The two scalars train as nanochat trains them (4d8dbaf, nanochat/gpt.py setup_optimizer):
in separate AdamW groups, x0 at `scalar_lr` (0.5) and resid at `scalar_lr * 0.01` (0.005,
the paper's "LR for residual connections"). x0 is additive and tolerates a normal LR; resid
scales the whole stream, so it needs a far smaller one (nanochat's LOG, 2026-01-11).
"""

import torch
from torch import nn

from nanochat import trunks
from nanochat.connections import ConnectionLayer, config_params, record_layer

RESID_LR_FRACTION = 0.01  # l_resid's LR as a fraction of scalar_lr (nanochat)
SPEC = dict(
    label="Residual",
    description="one stream; before each block x = l_resid * x + l_x0 * x0, then x + F(x) per sub-layer",
    source="nanochat",
    backout="the stream after block floor(L/2), nanochat 92d63d4's own choice",
    state="single",
    has_h_res=True,  # a 1 x 1 H_res, the effective stream scale l_resid
    in_paper=True,
    equals_prenorm_at_init=True,  # l_resid = 1, l_x0 = 0
    params=config_params,  # 2 scalars per block
    order=0,
)


def start_values(block, n_layer, starts):
    """(l_resid, l_x0) at init for block `block`, from a recipe's `residual_starts`
    ((a, b), (c, e)): a - b d and c - e d at depth d = block/(L-1) (the paper's 1 and 0, or
    2026-07's per-layer ramps)."""
    (resid, resid_drop), (x0, x0_drop) = starts
    depth = block / max(n_layer - 1, 1)
    return resid - resid_drop * depth, x0 - x0_drop * depth


class ResidualLayer(ConnectionLayer):
    def __init__(self, block_start, start=(1.0, 0.0), resid_decay=0.0):
        super().__init__()
        self.start, self.resid_decay = start, resid_decay
        # Only where a block starts; one-element tensors so that every optimizer path
        # (sharded or replicated) sees an ordinary first dimension.
        self.l_resid = nn.Parameter(torch.empty(1)) if block_start else None
        self.l_x0 = nn.Parameter(torch.empty(1)) if block_start else None
        self.capture = None  # a dict while StreamConnections.capture() is active

    @torch.no_grad()
    def init_weights(self):
        if self.l_resid is not None:
            self.l_resid.fill_(self.start[0])
            self.l_x0.fill_(self.start[1])

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Checkpoints written before the two scalars got separate optimizer groups packed
        # them as one tensor `lambdas` = [l_resid, l_x0]; they still load for evaluation.
        packed = state_dict.pop(prefix + "lambdas", None)
        if packed is not None:
            state_dict[prefix + "l_resid"] = packed[:1].clone()
            state_dict[prefix + "l_x0"] = packed[1:].clone()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def step(self, X, branch, x0, carry):
        if self.capture is not None:
            record_layer(self.capture, X, *self.coefficients(X))
        x = X.squeeze(-2)
        if self.l_resid is not None:
            # 0-dim scalars, as nanochat's resid_lambdas[i]: a 0-dim fp32 tensor times a bf16
            # stream stays bf16 under autocast, where a shape-(1,) one would promote the whole
            # stream to fp32 from the first block on.
            x = self.l_resid[0] * x + self.l_x0[0] * x0
        return (x + branch(x)).unsqueeze(-2), carry

    def coefficients(self, X):
        """n = 1: h_pre = h_post = 1 and h_res is the effective stream scale l_resid
        (the x0 re-injection is not a stream mix and is not represented)."""
        shape = X.shape[:-2]
        ones = torch.ones(*shape, 1, device=X.device, dtype=torch.float32)
        scale = self.l_resid[0].float() if self.l_resid is not None else ones.new_ones(())
        return ones, ones, (ones * scale).unsqueeze(-1)


def resolve(cfg):
    if cfg.hc_streams not in (0, 1):
        raise ValueError(f"hc='residual' has a single stream; got hc_streams={cfg.hc_streams}. "
                         "Drop --hc-streams or pick a hyper-connection variant (e.g. --hc kromhc)")
    cfg.hc_streams = 1


def make_layers(cfg):
    recipe = trunks.recipe(cfg.trunk)
    return [ResidualLayer(block_start=(j % 2 == 0), start=start_values(j // 2, cfg.n_layer, recipe.residual_starts),
                          resid_decay=recipe.resid_weight_decay) for j in range(2 * cfg.n_layer)]


def param_groups(layers, lrs):
    """nanochat's two scalar groups (see the module docstring); `lrs` as in
    connections.StreamConnections.param_groups."""
    starts = [layer for layer in layers if layer.l_resid is not None]
    return [dict(name="hc_resid", params=[layer.l_resid for layer in starts],
                 lr=lrs["scalar_lr"] * RESID_LR_FRACTION, betas=lrs["hc_betas"], weight_decay=starts[0].resid_decay),
            dict(name="hc_x0", params=[layer.l_x0 for layer in starts],
                 lr=lrs["scalar_lr"], betas=lrs["x0_betas"])]
