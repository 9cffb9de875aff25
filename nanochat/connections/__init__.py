"""The registry of stream connections: which variant wraps the model's sub-layers.

The model only ever talks to a `StreamConnections` built here: `expand` turns the normed
embedding into the stream state X of shape (B, T, n, C), `layers[j](X, branch, x0)` wraps
sub-layer j (attention for even j, MLP for odd j), and `reduce` folds the streams back to
(B, T, C). Adding a variant means adding a module and one line in `VARIANTS`.

Optimizer groups: every connection parameter trains in AdamW at `hc_lr` (the paper's 0.005)
in one group named "hc", unless the variant's module defines `param_groups(layers, lrs)`
(the residual baseline does: nanochat's two scalar LRs).
"""

from contextlib import contextmanager

import torch
from torch import nn

from nanochat.connections import hc, kromhc, mhc, mhc_lite, ops, residual

# name -> module exposing `resolve(cfg)` (validate and fill the hc fields in place),
# `make_layers(cfg) -> list[nn.Module]` (the 2 * n_layer layers) and optionally
# `param_groups(layers, lrs)`.
VARIANTS = {
    "residual": residual,
    "hc": hc,
    "hc_identity": hc,
    "mhc": mhc,
    "mhc_lite": mhc_lite,
    "kromhc": kromhc,
}


class StreamConnections(nn.Module):
    """The n-stream residual state around the transformer's 2 * n_layer sub-layers."""

    def __init__(self, n, layers, groups=None):
        super().__init__()
        self.n = n
        self.layers = nn.ModuleList(layers)
        self._groups = groups

    def param_groups(self, hc_lr, scalar_lr, hc_betas, x0_betas):
        """AdamW groups (name, params, lr, betas) covering every connection parameter once.
        hc_lr: every HC parameter; scalar_lr and x0_betas: the residual baseline's scalars."""
        if self._groups is not None:
            lrs = dict(hc_lr=hc_lr, scalar_lr=scalar_lr, hc_betas=hc_betas, x0_betas=x0_betas)
            return self._groups(self.layers, lrs)
        params = list(self.parameters())
        return [dict(name="hc", params=params, lr=hc_lr, betas=hc_betas)] if params else []

    def expand(self, x0):
        """(B, T, C) -> (B, T, n, C): every stream starts as a copy of the embedding.
        Contiguous, so that vec(X) over (n, C) is a free view in every layer."""
        if self.n == 1:
            return x0.unsqueeze(-2)
        return x0.unsqueeze(-2).expand(*x0.shape[:-1], self.n, x0.shape[-1]).contiguous()

    def reduce(self, X):
        """(B, T, n, C) -> (B, T, C): the sum of the streams (the model norms it next)."""
        return X.squeeze(-2) if self.n == 1 else X.sum(dim=-2)

    @torch.no_grad()
    def init_weights(self):
        for layer in self.layers:
            layer.init_weights()

    @contextmanager
    def capture(self):
        """Within the block every layer records the coefficients its forward used (see
        diagnostics.record_layer); yields one dict per layer, in forward order. For the
        uncompiled model only: a compiled graph does not see the flag."""
        records = [{} for _ in self.layers]
        for layer, record in zip(self.layers, records):
            layer.capture = record
        try:
            yield records
        finally:
            for layer in self.layers:
                layer.capture = None


def resolve_config(cfg):
    """Validate the config's hc fields and fill variant defaults, in place; one clear
    ValueError per mistake, raised at configuration time rather than mid-forward."""
    if cfg.hc not in VARIANTS:
        raise ValueError(f"unknown connection variant hc={cfg.hc!r}; choose one of {', '.join(VARIANTS)}")
    VARIANTS[cfg.hc].resolve(cfg)
    ops.resolve_kernels(cfg)


def build(cfg):
    resolve_config(cfg)
    variant = VARIANTS[cfg.hc]
    return StreamConnections(cfg.hc_streams, variant.make_layers(cfg), getattr(variant, "param_groups", None))
