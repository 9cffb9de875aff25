"""Delta Attention Residuals, DAR (Luo, Cai & Hu, arXiv 2605.18855): Attention Residuals'
depth read added to the residual stream instead of replacing it. Two sources, cited by file
and line: the released code, github.com/wdlctc/delta-attention-residuals-code,
`Attention-Residuals/modeling_qwen3_attnres.py` ("the release"), and hyper-connection-factory,
github.com/wdlctc/hyper-connection-factory, `hcfactory/connections/depth_attention.py` ("the
factory").

Per sub-layer l, with h the residual stream and F_l the sub-layer with its own pre-norm:
    r_l = sum_i alpha_i v_i,  alpha = softmax_i(w_l . RMSNorm_g(v_i))   (attnres.DepthRead)
    h_{l+1} = h_l + F_l(h_l + g_l r_l)
which is the release's mix (1 - g) h + g (h + r) (its `_apply_gate`, l.450-465, over
`delta_attn_res`, which returns h + r). The first sub-layer has no source yet and reads x0
itself, whatever the gate (the release returns the stream unchanged when it has no delta,
l.264-268; the factory would feed x0 + g x0 there).
Sources (`dar_source`):
    full           v_0 = x0 and the output of every earlier sub-layer (Delta AttnRes; the
                   release's `delta` mode, the factory's default).
    block          v_0 = x0 and one delta per completed transformer block, Delta_b = h_end -
                   h_start (Delta Block), as the factory reads it (l.134-146): both sub-layers
                   of a block read the same sources, so its MLP does not see its own block's
                   attention output. The release takes a recursive difference instead of the
                   true delta (each new source is h minus the previous source, l.588-592)
                   and adds it between a block's attention and its MLP; the factory's README
                   notes the difference.
    block_partial  [ours] block, and at a block's MLP also the partial delta of its own block
                   (the attention output just computed): what this module did before the
                   sources were checked against the factory.
Gates g_l (`dar_gate`):
    none            g = 1, the default: the factory's pre-training default (`gate="none"`,
                    l.116-120: "none" to pre-train, "zero" only to convert a pretrained
                    checkpoint) and the release's default `bias`, which in its delta modes
                    adds r ungated (its recency bias belongs to the block AttnRes mode).
    zero            a learned scalar from 0 (the factory's `zero`, the release's
                    `learnable_alpha`): the model starts exactly as the pre-norm model it is
                    made from, which is what converting a pretrained checkpoint needs. Not a
                    start to pre-train from: with the full (or block_partial) sources it is a
                    saddle (below), and base_train warns when a fresh run uses it.
    sigmoid_scalar  g = sigmoid(s), s a learned scalar from -2 (the release, l.399-402: g = 0.12
                    at init).
    sigmoid_vector  g = sigmoid(W h_l + b) per token and channel, W (C x C) = 0 and b = -2 at
                    init (the release, l.403-410, applied at l.456-459): input-dependent, the
                    gate reads the stream h_l itself.
Not built: the release's learnable null source, its `delta_v` mode (a separate read for the
values) and its other modes (pre-gated, first-layer, centred resets).
Init: w = 0, g = 1 (key gain), so each read is the mean of its sources. The release draws its
queries from N(0, 0.02) (Hugging Face's init); the factory zeroes them, as here. The model's
output is h itself (no final read). With the full sources (and block_partial) the sources sum
to h, so that mean is h / N and the sub-layer's weightless RMSNorm sees (1 + g / N) h: every
gate starts as pre-norm in this frame, to the norm's epsilon. With the block sources a block's
MLP reads the block's start, not h: only the zero gate starts as pre-norm there. With the full
or block_partial sources the zero gate's start is a saddle: (1 + g / N) h only rescales h, so
g gets rounding alone and the queries, whose gradients scale with g, none, whatever the body
holds (nanochat/saddle.py; docs/variants.md, "Dead by construction"). The default gate, none,
starts at g = 1, where the queries' gradient is that of a softmax over distinct sources. The
first sub-layer's query, gain and gate get no gradient (it reads no source), nor, with the
block sources, the query and gain of the first block's MLP (a softmax over x0 alone); they
are kept because the release has them and the paper counts them.

Parameters: 2C per sub-layer (query and key gain, `hc_norm_weight` false drops the gain),
plus 1 (zero, sigmoid_scalar) or C^2 + C (sigmoid_vector) for the gate: 114,688 at 28 layers x
1024 with the default gate, the paper's 114K. State: the frame's X is h; the sources (with their 1/rms)
and the current block's partial delta travel as the carry. Coefficients in fp32; r
accumulates in fp32 (attnres.DepthRead) and rounds to the compute dtype, h + g r is summed in
fp32 and rounds once more.
"""

import functools

import torch
import torch.nn.functional as F
from torch import nn

from nanochat.connections import (ConnectionLayer, attnres, coefficient_dtype, no_autocast, record_reads,
                                  resolve_one_state)
from nanochat.connections.diagnostics import attnres_read_params
from nanochat.flags import choice

SOURCES = ("full", "block", "block_partial")
GATES = ("zero", "none", "sigmoid_scalar", "sigmoid_vector")
GATE_LOGIT_INIT = -2.0  # the release's sigmoid gates: sigmoid(-2) = 0.12 at init
FIELDS = {"dar_source": "full", "dar_gate": "none"}
FIELD_HELP = {
    "dar_source": "dar: full (x0 and every sub-layer output) | block (x0 and one delta per completed transformer "
                  "block) | block_partial (ours: block, and at a block's MLP its own attention output)",
    "dar_gate": "dar: none (1, the sources' pre-training default) | zero (learned scalar from 0: pre-norm at init, "
                "for converting a pretrained checkpoint; a saddle to pre-train from with the full sources) | "
                "sigmoid_scalar (sigmoid of a learned scalar from -2) | sigmoid_vector (sigmoid(W h + b), W = 0 and "
                "b = -2 at init)",
}
FIELD_TYPES = {"dar_source": choice(*SOURCES), "dar_gate": choice(*GATES)}


def gate_params(gate, C):
    return {"zero": 1, "none": 0, "sigmoid_scalar": 1, "sigmoid_vector": C * C + C}[gate]


def pretraining_warning(cfg):
    """base_train's line for a fresh run from the zero gate: a start made for converting a
    pretrained checkpoint, and with the full or block_partial sources a saddle."""
    if cfg.dar_gate != "zero":
        return None
    why = ("with these sources it is a saddle, left only through rounding noise in a direction the hardware picks"
           if cfg.dar_source != "block" else "its queries start learning only as the gates leave 0")
    return (f"warning: --dar-gate zero is the start for converting a pretrained checkpoint (hyper-connection-factory's "
            f"use), not for pre-training: {why}; pre-train with --dar-gate none, the sources' default "
            "(docs/variants.md, 'Dead by construction')")


def dead_parameters(cfg):
    """SPEC dead: the first sub-layer reads no source (x0 itself), so its read and gate get no
    gradient; with the block sources neither does the first block MLP's read (a softmax over
    x0 alone). Kept because the release has them and the paper counts them."""
    read = functools.partial(attnres.read_parameters, cfg)
    gate = {"none": [], "sigmoid_vector": ["layers.0.gate.weight", "layers.0.gate.bias"]}.get(cfg.dar_gate,
                                                                                            ["layers.0.gate.logit"])
    dead = dict.fromkeys(read(0) + gate, "the first sub-layer reads no source but x0: its read and gate are unused")
    if cfg.dar_source == "block":
        dead.update(dict.fromkeys(read(1), "the first block's MLP reads x0 alone: a softmax over one source"))
    return dead


SPEC = dict(
    label="Delta AttnRes",
    description="attention residuals added to the residual stream: each sub-layer reads h plus a gated softmax mix "
                "of the embedding and earlier outputs (or block deltas)",
    source="arXiv 2605.18855; github.com/wdlctc/delta-attention-residuals-code",
    backout="the state after block floor(L/2) (its readout is the state itself)",
    state="single",
    has_h_res=False,
    in_paper=False,
    equals_prenorm_at_init=True,  # the full sources, every gate (to the norm's epsilon)
    params=lambda cfg: 2 * cfg.n_layer * (attnres_read_params(cfg.n_embd, cfg.hc_norm_weight)
                                          + gate_params(cfg.dar_gate, cfg.n_embd)),
    baseline="prenorm",
    settings=lambda cfg: f"{cfg.dar_source} sources, {cfg.dar_gate} gate",
    order=140,
    shared_fields=("hc_norm_weight",),
    dead=dead_parameters,
)


class DeltaGate(nn.Module):
    """g_l of one sub-layer in the compute dtype of h (see the module docstring), for every
    form but `none`."""

    def __init__(self, form, C):
        super().__init__()
        self.form = form
        if form == "sigmoid_vector":
            self.weight = nn.Parameter(torch.empty(C, C))  # (out, in), as nn.Linear
            self.bias = nn.Parameter(torch.empty(C))
        else:
            self.logit = nn.Parameter(torch.empty(1))

    @torch.no_grad()
    def init_weights(self):
        if self.form == "sigmoid_vector":
            self.weight.zero_()
            self.bias.fill_(GATE_LOGIT_INIT)
        else:
            self.logit.fill_(0.0 if self.form == "zero" else GATE_LOGIT_INIT)

    def forward(self, h):
        """g, broadcastable against h (B, T, C) in h's dtype."""
        if self.form == "sigmoid_vector":
            return torch.sigmoid(F.linear(h, self.weight.to(h.dtype), self.bias.to(h.dtype)))
        g = self.logit.to(h.dtype)
        return torch.sigmoid(g) if self.form == "sigmoid_scalar" else g


class DeltaLayer(ConnectionLayer):
    """The read before sub-layer `index`. `block_start`: the sources gain the span that ended
    before it (every sub-layer for the full sources, block starts otherwise);
    `own_partial`: a block's MLP also reads its own block's partial delta (block_partial)."""

    def __init__(self, index, C, source, gate, norm_weight=True):
        super().__init__()
        self.index = index
        self.block_start = source == "full" or index % 2 == 0
        self.own_partial = source == "block_partial"
        self.read = attnres.DepthRead(C, norm_weight)
        self.gate = None if gate == "none" else DeltaGate(gate, C)
        self.capture = None  # a dict while StreamConnections.capture() is active

    @torch.no_grad()
    def init_weights(self):
        self.read.init_weights()
        if self.gate is not None:
            self.gate.init_weights()

    def branch_input(self, h, sources, x0=None):
        """h + g r in fp32, rounded once to h's dtype; h + g (r - x0) when given x0."""
        r, alpha = self.read(sources)
        if x0 is not None:
            r = r - x0
        if self.capture is not None:
            record_reads(self.capture, h.unsqueeze(-2), alpha)
        with no_autocast(h):
            h32, r32 = h.to(coefficient_dtype(h)), r.to(coefficient_dtype(h))
            u = h32 + (r32 if self.gate is None else self.gate(h32) * r32)
        return u.to(h.dtype)

    def step(self, X, branch, x0, carry):
        h = X.squeeze(-2)
        closed, partial = carry if carry is not None else ([attnres.source(x0)], None)
        if self.block_start and partial is not None:
            closed, partial = [*closed, attnres.source(partial)], None
        if self.index == 0:
            # No source yet: the first sub-layer reads h (= x0) itself. Its read over x0 alone is
            # x0 exactly (a softmax over one logit is 1), so r - x0 is an exact zero that keeps
            # its query, gain and gate in the graph with a zero gradient: the distributed
            # optimizer needs a gradient for every parameter.
            u = self.branch_input(h, closed, x0=closed[0][0])
        else:
            u = self.branch_input(h, closed if partial is None or not self.own_partial
                                  else [*closed, attnres.source(partial)])
        y = branch(u)
        partial = y if partial is None else partial + y
        return (h + y).unsqueeze(-2), (closed, partial)


def resolve(cfg):
    resolve_one_state(cfg, "has one stream", hint="; --dar-source and --dar-gate set its form")
    if cfg.dar_source not in SOURCES:
        raise ValueError(f"unknown dar_source={cfg.dar_source!r}; choose one of {', '.join(SOURCES)}")
    if cfg.dar_gate not in GATES:
        raise ValueError(f"unknown dar_gate={cfg.dar_gate!r}; choose one of {', '.join(GATES)}")


def make_layers(cfg):
    return [DeltaLayer(j, cfg.n_embd, cfg.dar_source, cfg.dar_gate, cfg.hc_norm_weight)
            for j in range(2 * cfg.n_layer)]
