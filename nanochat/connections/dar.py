"""Delta Attention Residuals, DAR (Luo, Cai & Hu, arXiv 2605.18855; code:
github.com/wdlctc/delta-attention-residuals-code): Attention Residuals' depth read added to
the residual stream instead of replacing it.

Per sub-layer l, with h the residual stream and F_l the sub-layer with its own pre-norm:
    r_l = sum_i alpha_i v_i,  alpha = softmax_i(w_l . RMSNorm_g(v_i))   (attnres.DepthRead)
    h_{l+1} = h_l + F_l(h_l + g_l r_l)
Sources (`dar_source`):
    full   v_0 = x0 and the output of every earlier sub-layer (Delta AttnRes);
    block  v_0 = x0, then one delta per transformer block, Delta_b = h_end - h_start (the sum
           of its attention and MLP outputs), and, at a block's MLP, the partial delta of its
           block (Delta Block). [ours: a block is one transformer block, and the true delta
           h_end - h_start, as hyper-connection-factory; the released code takes a recursive
           difference.]
Gates g_l (`dar_gate`): zero (a learned scalar from 0: exactly pre-norm at init, the factory's
identity init), none (g = 1), sigmoid_scalar and sigmoid_vector (sigmoid of a learned scalar,
or of one per channel, from 0: g = 1/2 at init [ours; the released code states no init]).
Not built: the released code's `bias` gate (a recency bias on the last logit), its learnable
null source and its `delta_v` mode (a separate read for the values).
Init: w = 0, g = 1 (key gain), so each read is the mean of its sources. The model's output is
h itself (no final read). The sources sum to h, so that mean is h / N, and with the
sub-layers' own weightless RMSNorm every gate form starts as pre-norm in this frame, to the
norm's epsilon (hyper-connection-factory asserts it for the zero gate only). The first
sub-layer reads x0 alone: its query and gain get no gradient (a softmax over one logit).

Parameters: 2C per sub-layer (query and key gain, `hc_norm_weight` false drops the gain),
plus 1 (zero, sigmoid_scalar) or C (sigmoid_vector) for the gate: 114,688 + gates at 28
layers x 1024, the paper's 114K. State: the trunk's X is h; the sources (with their 1/rms)
and the block's partial delta travel as the carry. Coefficients in fp32; r accumulates in
fp32 (attnres.DepthRead) and rounds to the compute dtype, h + g r is summed in fp32 and
rounds once more.
"""

import torch
from torch import nn

from nanochat.connections import attnres
from nanochat.connections.diagnostics import attnres_read_params, record_reads
from nanochat.connections.ops import coefficient_dtype, no_autocast
from nanochat.connections.trunk import ConnectionLayer, resolve_one_state
from nanochat.flags import choice

OWN_STATE = "one stream and the earlier outputs it reads"  # not the HC family's n streams
SOURCES = {"full": 1, "block": 2}  # sub-layers per source
GATES = ("zero", "none", "sigmoid_scalar", "sigmoid_vector")
FIELDS = {"dar_source": "full", "dar_gate": "zero"}
FIELD_HELP = {
    "dar_source": "dar: full (x0 and every sub-layer output) | block (x0 and one delta per transformer block)",
    "dar_gate": "dar: zero (learned scalar from 0: pre-norm at init) | none (1) | sigmoid_scalar | sigmoid_vector "
                "(sigmoid of a learned scalar / per-channel vector from 0)",
}
FIELD_TYPES = {"dar_source": choice(*SOURCES), "dar_gate": choice(*GATES)}


def gate_params(gate, C):
    return {"zero": 1, "none": 0, "sigmoid_scalar": 1, "sigmoid_vector": C}[gate]


SPEC = dict(
    label="Delta AttnRes",
    description="attention residuals added to the residual stream: each sub-layer reads h plus a gated softmax mix "
                "of the embedding and earlier outputs (or block deltas)",
    source="arXiv 2605.18855",
    state="single",
    has_h_res=False,
    in_paper=False,
    equals_prenorm_at_init=True,  # with the default zero gate
    params=lambda cfg: 2 * cfg.n_layer * (attnres_read_params(cfg.n_embd, cfg.hc_norm_weight)
                                          + gate_params(cfg.dar_gate, cfg.n_embd)),
    baseline="prenorm",
    settings=lambda cfg: f"{cfg.dar_source} sources, {cfg.dar_gate} gate",
)


class DeltaLayer(ConnectionLayer):
    """The read before sub-layer `index`; `block_start` where a source's span begins there."""

    def __init__(self, index, C, span, gate, norm_weight=True):
        super().__init__()
        self.block_start = index % span == 0
        self.read = attnres.DepthRead(C, norm_weight)
        self.gate_form = gate
        self.gate = None if gate == "none" else nn.Parameter(torch.empty(C if gate == "sigmoid_vector" else 1))
        self.capture = None  # a dict while StreamConnections.capture() is active

    @torch.no_grad()
    def init_weights(self):
        self.read.init_weights()
        if self.gate is not None:
            self.gate.zero_()

    def gate_value(self, dtype):
        g = self.gate.to(dtype)
        return torch.sigmoid(g) if self.gate_form.startswith("sigmoid") else g

    def step(self, X, branch, x0, carry):
        h = X.squeeze(-2)
        closed, partial = carry if carry is not None else ([attnres.source(x0)], None)
        if self.block_start and partial is not None:
            closed, partial = [*closed, attnres.source(partial)], None
        r, alpha = self.read(closed if partial is None else [*closed, attnres.source(partial)])
        if self.capture is not None:
            record_reads(self.capture, X, alpha)
        with no_autocast(h):
            dtype = coefficient_dtype(h)
            u = h.to(dtype) + (r.to(dtype) if self.gate is None else self.gate_value(dtype) * r.to(dtype))
        y = branch(u.to(h.dtype))
        partial = y if partial is None else partial + y
        return (h + y).unsqueeze(-2), (closed, partial)


def resolve(cfg):
    resolve_one_state(cfg, "has one stream", hint="; --dar-source and --dar-gate set its form",
                      recompute_note=" (its reads keep nothing to recompute)")
    if cfg.dar_source not in SOURCES:
        raise ValueError(f"unknown dar_source={cfg.dar_source!r}; choose one of {', '.join(SOURCES)}")
    if cfg.dar_gate not in GATES:
        raise ValueError(f"unknown dar_gate={cfg.dar_gate!r}; choose one of {', '.join(GATES)}")


def make_layers(cfg):
    span = SOURCES[cfg.dar_source]
    return [DeltaLayer(j, cfg.n_embd, span, cfg.dar_gate, cfg.hc_norm_weight) for j in range(2 * cfg.n_layer)]
