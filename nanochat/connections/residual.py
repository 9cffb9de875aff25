"""nanochat's baseline residual stream (the paper's "Residual" row): n = 1.

Before block i the stream is re-mixed with the embedding, x = l_resid[i] * x + l_x0[i] * x0,
then each sub-layer adds its output, x = x + F(x). The two scalars live on the block's
first (attention) layer; the MLP layer is a plain residual add. Init l_resid = 1,
l_x0 = 0 (the paper's appendix; nanochat's own pin used 0.1).
"""

import torch
from torch import nn

from nanochat.connections.diagnostics import record_layer


class ResidualLayer(nn.Module):
    def __init__(self, block_start):
        super().__init__()
        # [l_resid, l_x0], only where a block starts; packed so there is one tensor per block.
        self.lambdas = nn.Parameter(torch.empty(2)) if block_start else None
        self.capture = None  # a dict while StreamConnections.capture() is active

    @torch.no_grad()
    def init_weights(self):
        if self.lambdas is not None:
            self.lambdas.copy_(torch.tensor([1.0, 0.0]))

    def forward(self, X, branch, x0):
        if self.capture is not None:
            record_layer(self.capture, X, *self.coefficients(X))
        x = X.squeeze(-2)
        if self.lambdas is not None:
            x = self.lambdas[0] * x + self.lambdas[1] * x0
        return (x + branch(x)).unsqueeze(-2)

    def coefficients(self, X):
        """n = 1: h_pre = h_post = 1 and h_res is the effective stream scale l_resid
        (the x0 re-injection is not a stream mix and is not represented)."""
        shape = X.shape[:-2]
        ones = torch.ones(*shape, 1, device=X.device, dtype=torch.float32)
        scale = self.lambdas[0].float() if self.lambdas is not None else ones.new_ones(())
        return ones, ones, (ones * scale).unsqueeze(-1)


def resolve(cfg):
    if cfg.hc_streams not in (0, 1):
        raise ValueError(f"hc='residual' has a single stream; got hc_streams={cfg.hc_streams}. "
                         "Drop --hc-streams or pick a hyper-connection variant (e.g. --hc kromhc)")
    if cfg.hc_factors:
        raise ValueError("hc_factors only applies to hc='kromhc'")
    cfg.hc_streams = 1


def make_layers(cfg):
    return [ResidualLayer(block_start=(j % 2 == 0)) for j in range(2 * cfg.n_layer)]
