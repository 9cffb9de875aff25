"""The hyper-connection layer of the HC family: `HyperConnection`, the base of the layers of
hc, hc_identity, mhc, mhc_lite, kromhc, go_mhc and cmhc (each a wiring of its own module), and
what those wirings share: the stream check (`resolve_streams`), the layer options
(`layer_options`), what they declare in common (`LAYER_SPEC`, `FAMILY_SPEC`) and their dead
parameters (`dead_parameters`). Not a wiring itself (it declares no SPEC); a wiring imports
it from `nanochat.connections`.

Convention (the H-convention, used everywhere in this package): a token's state X is
n x C with one stream per row, and one layer computes

    X_next = H_res @ X + H_post^T * F(H_pre @ X)

with H_pre, H_post in R^n and H_res in R^{n x n}; stream t receives sum_s H_res[t, s] X[s].

Coefficients (paper eq. kromhc_definition and its mHC / mHC-lite forms): with
x' = RMSNorm(vec(X)) over the n*C values of a token, one projection x' @ W with W of shape
(n*C, 2n + R) and columns [pre n | post n | res R] gives

    H_pre  = sigmoid(a_pre * x'W_pre + b_pre)
    H_post = 2 * sigmoid(a_post * x'W_post + b_post)
    H_res  = variant(a_res * x'W_res + b_res)

Variants differ only in R and in how the res logits become H_res (`res_map`, res_maps.py):
  hc           H_res = mat(logits), unconstrained (the paper's appendix: mHC without SK; hc.py)
  hc_identity  H_res = I, no res columns at all (dynamic pre/post only; hc_identity.py)
  mhc          Sinkhorn-Knopp (mhc.py), mhc_lite Birkhoff-von Neumann (mhc_lite.py),
  kromhc       Kronecker product of small Birkhoff factors (kromhc.py).

Init (paper section "Initialization"): W = 0, a_* = 0.01, b_pre = b_post = -1 except +1
at the layer's home stream (layer_index % n); b_res per variant, close to the identity.

Delayed pre-weights (`hc_pre = delayed`, DeepSeek-V4.1's single-pass mHC, as its public
ports write it): layer j's projection of X_j still yields (H_pre, H_post, H_res), but its
H_pre is carried to layer j + 1, which reads its input with it; layer 0 reads stream 0 (all
streams are copies of x0 there), and the last layer's H_pre folds the final state
(frame.CarriedPreReduce). No parameter is added or removed. The pre bias of layer j puts its
+1 at the home stream of the layer that applies it, (j + 1) % n [ours: the ports start from
DeepSeek's released weights and state no init]. What this buys is fusion: the post mix of
layer j, the projection of X_{j+1} and its pre mix all read X_{j+1} with coefficients known
before X_{j+1} exists, so one pass over the streams can do all three.

Precision: coefficients are computed in fp32 with autocast off, whatever the compute dtype;
the streams keep X's dtype; pre and post mixes accumulate in fp32 and round once.

Cost: the projection and the two mixes, each a pass over X, are the layer's whole
memory-bound work; they live in ops.py (fused autograd Functions in eager mode, plain
fusible ops under torch.compile, or Liger's Triton kernels with hc_kernels = liger).
Everything between them is k numbers per token.
"""


import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from nanochat.connections.backends import fused
from nanochat.connections.backends.ops import (RMS_EPS, coefficient_dtype, mix_post, mix_pre, no_autocast, rms_project,
                                               uses_fused)
from nanochat.connections.diagnostics import config_params, config_stream_flops, record_layer
from nanochat.connections.frame import ConnectionLayer

DEFAULT_STREAMS = 4
PRES = ("current", "delayed")  # hc_pre: which layer's H_pre reads a layer's input
ALPHA_INIT = 0.01
# Res bias on the non-identity entries / permutations of the constrained variants (paper:
# b_res = [0, -8]): H_res starts within a few e^-8 of the identity.
OFF_IDENTITY_BIAS = -8.0
# The frame's config fields that shape every variant built on HyperConnection (its streams,
# its norm weight, recompute and kernels, the HC options).
FAMILY_FIELDS = ("hc_streams", "hc_norm_weight", "hc_recompute", "hc_kernels", "hc_expand", "hc_lss_init", "hc_reduce",
                 "hc_pre")


def dead_parameters(cfg, rows_sum_to_one=False, columns_sum_to_one=False):
    """The parameters the math leaves without a gradient (SPEC dead), by slice (layer_parts).

    Layer 0 under copy expansion: every stream of its input is x0, so its read H_pre X =
    (sum_s h_pre_s) x0 is a multiple of x0 that the sub-layer's RMSNorm undoes: the pre columns
    of W, b_pre and a_pre reach the loss through the norm's epsilon alone (fp32 gradients
    ~1e-10 where the layer's others are ~1e-3). With delayed pre-weights layer 0 reads stream
    0 and its pre columns serve layer 1: live. Where every H_res row sums to one exactly
    (`rows_sum_to_one`: the permutation mixtures, the orthostochastic map), H_res maps n copies
    to the same n copies whatever its entries, and layer 0's res columns, b_res and a_res are
    dead too, under either pre-weights (mHC's Sinkhorn rows are 1 only to its tolerance: a
    small, real gradient). Under LSS the streams differ from the start: layer 0 is live.

    The last layer under the summed readout: where every H_res column sums to one exactly
    (`columns_sum_to_one`: the exactly doubly stochastic maps, and mHC, whose Sinkhorn ends on
    the columns), the sum of the streams H_res X is the sum of X whatever H_res, so its res
    columns, b_res and a_res cannot change the output (fp64 gradients 1e-16 to 1e-19 of the
    wiring's). The learned head and delayed pre-weights fold the streams with weights of their
    own: live there; so is HC's free H_res."""
    n, last = cfg.hc_streams, 2 * cfg.n_layer - 1
    layer = connection_layer(cfg)
    k, groups = layer.weight.shape[1], len(layer.res_groups)
    dead = {}
    if cfg.hc_expand == "copy" and cfg.hc_pre == "current":
        pre = "layer 0 reads n copies of x0: H_pre only scales x0, which the sub-layer's RMSNorm undoes"
        dead.update({f"layers.0.weight[:, 0:{n}]": pre, f"layers.0.bias[0:{n}]": pre, "layers.0.alpha[0:1]": pre})
    if k > 2 * n and cfg.hc_expand == "copy" and rows_sum_to_one:
        dead.update(dict.fromkeys(res_slices(0, n, k, groups), "layer 0 mixes n copies of x0 by rows that sum to "
                                                              "one: H_res leaves the copies as they are"))
    if k > 2 * n and columns_sum_to_one and cfg.hc_reduce == "sum" and cfg.hc_pre == "current":
        dead.update(dict.fromkeys(res_slices(last, n, k, groups), "the last layer's H_res has columns that sum to "
                                                                 "one: the summed readout of H_res X is the sum of "
                                                                 "X, whatever H_res"))
    return dead


def res_slices(j, n, k, groups):
    """The res columns of layer j's W, its b_res and a_res, as slices (layer_parts)."""
    return [f"layers.{j}.weight[:, {2 * n}:{k}]", f"layers.{j}.bias[{2 * n}:{k}]", f"layers.{j}.alpha[2:{2 + groups}]"]


def layer_parts(cfg):
    """SPEC parts: every layer's pre, post and res columns of W, the same slices of its bias,
    and a_pre, a_post and the a_res, each judged on its own by the gradient checks (a dead
    slice of a live W shows): 9 parts a layer (6 without res columns)."""
    n = cfg.hc_streams
    layer = connection_layer(cfg)
    k, groups = layer.weight.shape[1], len(layer.res_groups)
    parts = []
    for j in range(2 * cfg.n_layer):
        for start, stop, a in ((0, n, "0:1"), (n, 2 * n, "1:2")):
            parts += [f"layers.{j}.weight[:, {start}:{stop}]", f"layers.{j}.bias[{start}:{stop}]",
                      f"layers.{j}.alpha[{a}]"]
        if k > 2 * n:
            parts += res_slices(j, n, k, groups)
    return parts


def connection_layer(cfg):
    """Layer 0 of a resolved config's wiring, built on the meta device (its shapes only)."""
    from nanochat.connections import VARIANTS
    with torch.device("meta"):
        return VARIANTS[cfg.hc].make_layers(cfg)[0]


def doubly_stochastic_dead(cfg):
    """dead_parameters for a variant whose H_res rows and columns sum to one exactly."""
    return dead_parameters(cfg, rows_sum_to_one=True, columns_sum_to_one=True)


def column_stochastic_dead(cfg):
    """dead_parameters for a variant whose H_res columns alone sum to one exactly (mHC)."""
    return dead_parameters(cfg, columns_sum_to_one=True)


# What every wiring whose layers are HyperConnections declares (spec.py): a member of the HC
# family on n streams with an H_res, on every backend and stream option, its W, bias and
# alphas judged by column group (layer_parts), dead where the math says (dead_parameters).
LAYER_SPEC = dict(state="streams", has_h_res=True, family="hc", kernel="hyper_connection",
                  backends=("torch", "liger", "fused"), options=("hc_expand", "hc_reduce", "hc_pre", "hc_recompute"),
                  dead=dead_parameters, parts=layer_parts, shared_fields=FAMILY_FIELDS,
                  backout="the readout of the streams after block floor(L/2): their sum, the learned head's "
                          "fold of them (hc_reduce learned), or their fold by the pre-weights that block computed "
                          "(hc_pre delayed)")
# ... and what the variants that keep the family's init and counts share besides: the
# parameter and stream-pass counts (diagnostics.py).
FAMILY_SPEC = dict(LAYER_SPEC, equals_prenorm_at_init=False, params=config_params, stream_flops=config_stream_flops)



class HyperConnection(ConnectionLayer):
    """One HC layer around one sub-layer. `res_map` (res_maps.py) turns the res logits into
    H_res; `res_groups` holds the res logit counts, one per a_res scalar (default: one
    scalar for all of them; none without res logits). Subclasses implement `res_bias_init()`."""

    def __init__(self, layer_index, n, C, res_map, res_groups=None, norm_weight=True, recompute=False,
                 kernels="torch", delayed_pre=False):
        super().__init__()
        self.layer_index, self.n, self.C = layer_index, n, C
        self.res_map = res_map
        R = res_map.logit_count()
        self.res_groups = tuple(res_groups) if res_groups is not None else ((R,) if R else ())
        if sum(self.res_groups) != R:
            raise ValueError(f"res_groups {self.res_groups} do not cover the map's {R} res logits")
        self.recompute = recompute
        self.delayed_pre = delayed_pre
        self.kernels = kernels  # hc_kernels, handed to the ops (which pick the backend)
        k = 2 * n + sum(self.res_groups)
        # (n*C, k): the large dim first, the one a sharded optimizer splits.
        self.weight = nn.Parameter(torch.empty(n * C, k))
        self.bias = nn.Parameter(torch.empty(k))
        # [a_pre, a_post, a_res (one per res group)]
        self.alpha = nn.Parameter(torch.empty(2 + len(self.res_groups)))
        self.norm_weight = nn.Parameter(torch.empty(n * C)) if norm_weight else None
        # Set to a dict by StreamConnections.capture(): the forward then records its coefficients.
        self.capture = None

    @torch.no_grad()
    def init_weights(self):
        n = self.n
        self.weight.zero_()
        home = torch.full((2, n), -1.0)
        home[0, (self.layer_index + self.delayed_pre) % n] = 1.0  # pre: the layer that applies it
        home[1, self.layer_index % n] = 1.0
        self.bias.copy_(torch.cat([home.flatten(), self.res_bias_init()]))
        self.alpha.fill_(ALPHA_INIT)
        if self.norm_weight is not None:
            self.norm_weight.fill_(1.0)
        self.res_map.init_buffers()

    def res_bias_init(self):
        return torch.zeros(0)

    def h_res(self, res_logits):
        return self.res_map(res_logits)

    def projection_weight(self):
        """W with the norm's weight folded in, (n*C, k): x' W = (x W_folded) / rms(x)."""
        return self.weight if self.norm_weight is None else self.weight * self.norm_weight[:, None]

    def column_scale(self):
        """The alpha of each of the k columns, [a_pre]*n + [a_post]*n + a_res per res group."""
        sizes = (self.n, self.n, *self.res_groups)
        return torch.cat([a.expand(s) for a, s in zip(self.alpha.unbind(), sizes)])

    def projection(self, X):
        """x' W for x' = RMSNorm(vec(X)), the norm's weight folded into W: (B, T, k) fp32,
        from one read of X (ops.rms_project). Call with autocast off."""
        return rms_project(X, self.projection_weight(), RMS_EPS, self.kernels)

    def logits_from(self, xw):
        """a * (x' W) + b for all 2n + R columns, from the projection: (B, T, k) fp32."""
        return torch.addcmul(self.bias, xw, self.column_scale())

    def logits(self, X):
        return self.logits_from(self.projection(X))

    def gates(self, xw):
        """(h_pre, h_post, h_res) from the projection (everything after the matmul)."""
        n = self.n
        z = self.logits_from(xw)
        return torch.sigmoid(z[..., :n]), 2 * torch.sigmoid(z[..., n:2 * n]), self.h_res(z[..., 2 * n:])

    def coefficients(self, X):
        """(h_pre (B,T,n), h_post (B,T,n), h_res (B,T,n,n)), fp32, H-convention: the gates
        computed from X (with delayed pre-weights, the h_pre here is the next layer's)."""
        with no_autocast(X):
            return self.gates(self.projection(X))

    def step(self, X, branch, x0, carry):
        if uses_fused(self.kernels, X) and self.capture is None:
            return fused.layer_step(self, X, branch, carry, RMS_EPS)
        u, h_post, h_res, carry = self.read(X, carry)
        return self.write(X, h_post, h_res, branch(u)), carry

    # The layer's work before and after its sub-layer, two regions that --compile-mode
    # regional compiles once for all layers (GPT.compile_regions; the sub-layer is its own).
    REGIONS = ("read", "write")

    def read(self, X, carry):
        """(the sub-layer's input u, h_post, the H_res to mix with, the carry on)."""
        with no_autocast(X):
            xw = self.projection(X)
            if self.recompute:
                # Keep only the k projection numbers per token for backward and recompute
                # the gates and H_res from them (logits, sigmoids, softmax weights, the
                # Kronecker products): a few small ops, no second pass over X.
                h_pre, h_post, h_res = checkpoint(self.gates, xw, use_reentrant=False)
            else:
                h_pre, h_post, h_res = self.gates(xw)
        if self.delayed_pre:
            h_pre, carry = (self.first_read(X) if carry is None else carry), h_pre
        if self.capture is not None:
            record_layer(self.capture, X, h_pre, h_post, h_res, self.logits_from(xw)[..., 2 * self.n:])
        return mix_pre(h_pre, X, self.kernels), h_post, self.mix_matrix(h_res), carry

    def write(self, X, h_post, h_res, y):
        """X_next = H_res X + H_post^T y."""
        return mix_post(h_res, X, h_post, y, self.kernels)

    def first_read(self, X):
        """The pre-weights of the first layer under delayed pre: stream 0 alone."""
        e0 = torch.zeros(self.n, device=X.device, dtype=coefficient_dtype(X))
        e0[0] = 1.0
        return e0.expand(*X.shape[:-2], self.n)

    def mix_matrix(self, h_res):
        """The H_res the post mix applies; None stands for the identity (no matmul)."""
        return None if self.res_map.identity else h_res



def resolve_streams(cfg, max_streams=None):
    """Checks shared by the HC variants: n >= 2 (0 means DEFAULT_STREAMS), at most
    max_streams. Fills cfg.hc_streams in place."""
    if cfg.hc_streams == 0:
        cfg.hc_streams = DEFAULT_STREAMS
    if not isinstance(cfg.hc_streams, int) or cfg.hc_streams < 2:
        raise ValueError(f"hc={cfg.hc!r} needs hc_streams >= 2 (got {cfg.hc_streams!r}); "
                         f"use hc='residual' for a single stream")
    if max_streams is not None and cfg.hc_streams > max_streams:
        raise ValueError(f"hc={cfg.hc!r} supports at most {max_streams} streams (got hc_streams={cfg.hc_streams}); "
                         f"use hc='kromhc' for wider streams")


def layer_options(cfg):
    return dict(norm_weight=cfg.hc_norm_weight, recompute=cfg.hc_recompute, kernels=cfg.hc_kernels,
                delayed_pre=cfg.hc_pre == "delayed")
