"""`StreamConnections`: the frame between the normed embedding and the final norm, which the
model hands over whole. `connections(x0, branches)` takes the normed embedding x0 (B, T, C)
and the 2 * n_layer branches (attention and MLP sub-layers in order, each u -> F(u) with its
own pre-norm, or raw for a wiring whose SPEC says sublayer_prenorm=False) and returns the
folded (B, T, C) state. In between: `expand` makes the stream state (frame.py), each layer
runs `layer.step(X, branch, x0, carry) -> (X_next, carry)`, and `reduce` folds the result.
The carry is whatever a variant passes from one layer to the next (None unless it needs one:
the delayed pre-weights of hc_pre = delayed, attnres's block states, a block-level wiring's
block outputs); it reaches `reduce` too. Called on its own, a layer runs one step with
nothing carried in: `layer(X, branch, x0) -> X_next`. With hc_kernels = fused the seams
between the layers run as fused kernels instead (backends/fused.py).

The registry builds one for a config (registry.build); its optimizer groups: every
connection parameter trains in AdamW at `hc_lr` (the paper's 0.005) in one group named "hc",
unless the variant's module defines `param_groups(layers, lrs)` (the residual baseline does:
nanochat's two scalar LRs).
"""

from contextlib import contextmanager

import torch
from torch import nn

from nanochat.connections.backends import fused, ops
from nanochat.connections.diagnostics import record_state


class StreamConnections(nn.Module):
    """The stream state around the transformer's 2 * n_layer sub-layers, from expand to reduce.
    `sublayer_prenorm`: whether the model's branches norm their input (SPEC; the model reads
    it when it builds them); `sublayer_init(sublayers)`: the wiring's start values for the
    sub-layers, if it declares any (its module's `init_sublayers`)."""

    def __init__(self, n, layers, expand, reduce, groups=None, sublayer_prenorm=True, sublayer_init=None,
                 kernels="torch", stream_checkpoint=1, seam_design="onepass"):
        super().__init__()
        self.n = n
        self.kernels = kernels  # hc_kernels: "fused" runs the frame as fused seams (fused.py)
        self.stream_checkpoint = stream_checkpoint  # hc_stream_checkpoint: the fused seams keep every K-th stream
        self.seam_design = seam_design  # hc_seam: how the fused seams run (fused.DESIGNS)
        self.layers = nn.ModuleList(layers)
        self.expand = expand
        self.reduce = reduce
        self._groups = groups
        self.sublayer_prenorm = sublayer_prenorm
        self._sublayer_init = sublayer_init
        self.final_capture = None  # a dict while capture() is active: the state before reduce

    def forward(self, x0, branches, backout=None):
        """The folded state (B, T, C). `backout` (the 2026-07 trunk's lambda_b): less lambda_b
        times the wiring's own readout of its state after block floor(L/2), that is what
        `reduce` would return had the frame ended there (docs/variants.md, "Backout")."""
        if len(branches) != len(self.layers):
            raise ValueError(f"{len(branches)} branches for {len(self.layers)} connection layers")
        mid = self.backout_layer() if backout is not None else None
        if self.runs_fused(x0) and mid != len(self.layers) - 1:
            # the seams between layers belong to the frame: one kernel each (fused.py), which
            # also norms the sub-layers' inputs (the branches it is handed are raw)
            out, kept = fused.run(self, x0, branches, ops.RMS_EPS, norm=self.sublayer_prenorm, keep_after=mid,
                                  checkpoint=self.stream_checkpoint, design=self.seam_design)
            return out if mid is None else out - backout.to(out.dtype) * self.reduce(*kept)
        X = self.expand(x0)
        carry = kept = None
        for j, (layer, branch) in enumerate(zip(self.layers, branches)):
            X_in = X
            X, carry = layer.step(X, branch, x0, carry)
            if self.final_capture is not None and not layer.capture:
                # capturing, and a layer that records nothing itself: its input state. (The test on
                # final_capture first: a compiled forward, never capturing, compares no dict.)
                record_state(layer.capture, X_in)
            if j == mid:
                kept = (X, carry)
        if self.final_capture is not None:
            record_state(self.final_capture, X)
        out = self.reduce(X, carry)
        return out if mid is None else out - backout.to(out.dtype) * self.reduce(*kept)

    def backout_layer(self):
        """The index of the layer after which the backout state is read: the end of block
        floor(L/2), as nanochat 92d63d4 caches its stream (2 layers a block)."""
        return 2 * (len(self.layers) // 2 // 2) + 1

    def runs_fused(self, x0):
        """Whether this forward runs the fused seams (hc_kernels = fused, training, not
        capturing diagnostics)."""
        return self.final_capture is None and self.n > 1 and ops.uses_fused(self.kernels, x0)

    def norms_sublayer_inputs(self, x0):
        """Whether this forward's frame norms the sub-layers' inputs itself (the fused seams
        write them normed): the model then hands it the raw sub-layers."""
        return self.sublayer_prenorm and self.runs_fused(x0)

    def compile_regions(self, backend="inductor"):
        """torch.compile the regions a layer declares (`REGIONS`: methods that exclude its
        sub-layer, which is a region of its own; the HC family's read and write), each once
        for every layer of the variant (GPT.compile_regions). A layer that declares none runs
        eagerly between its compiled sub-layers; the fused frame's seams are custom ops already."""
        for layer in self.layers:
            for name in getattr(layer, "REGIONS", ()):
                setattr(layer, name, torch.compile(getattr(layer, name), dynamic=False, backend=backend))

    def param_groups(self, hc_lr, scalar_lr, hc_betas, x0_betas):
        """AdamW groups (name, params, lr, betas) covering every connection parameter once.
        hc_lr: every HC parameter; scalar_lr and x0_betas: the residual baseline's scalars."""
        if self._groups is not None:
            lrs = dict(hc_lr=hc_lr, scalar_lr=scalar_lr, hc_betas=hc_betas, x0_betas=x0_betas)
            return self._groups(self.layers, lrs)
        params = list(self.parameters())
        return [dict(name="hc", params=params, lr=hc_lr, betas=hc_betas)] if params else []

    @torch.no_grad()
    def init_weights(self):
        self.expand.init_weights()
        for layer in self.layers:
            layer.init_weights()
        self.reduce.init_weights()

    @torch.no_grad()
    def init_sublayers(self, sublayers):
        """The model calls this after initializing its sub-layers (attention and MLP modules, in
        branch order): a wiring whose start needs other values than the model's (e.g. ReZero,
        whose zero scales would otherwise meet zero output projections, and neither would get
        a gradient) sets them here."""
        if self._sublayer_init is not None:
            self._sublayer_init(sublayers)

    @contextmanager
    def capture(self):
        """Within the block every layer records the coefficients its forward used and the
        state it received (see diagnostics.record_layer; a layer that records nothing gets
        its input state recorded by the frame), and the frame the final state before reduce;
        yields {"layers": one dict per layer in forward order, "final": dict}.
        For the uncompiled model only: a compiled graph does not see the flag."""
        records = {"layers": [{} for _ in self.layers], "final": {}}
        for layer, record in zip(self.layers, records["layers"]):
            layer.capture = record
        self.final_capture = records["final"]
        try:
            yield records
        finally:
            for layer in self.layers:
                layer.capture = None
            self.final_capture = None
