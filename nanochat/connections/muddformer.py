"""MUDDFormer: multiway dynamic dense connections (Xiao et al., ICML 2025, arXiv 2502.12170).
After every block, four states for the next one (query, key, value and residual: Q, K, V,
R) are built from every block output so far, with per-token weights from a small MLP.

With X_0 the embedding and X_{i+1} the output of block i (from 0), after block i:

    dw   = GELU(RMSNorm(X_{i+1}) W1_i) W2_i + a_i         reshaped (ways, i + 2)
    X^c  = sum_{j <= i+1} dw[c, j] X_j                     c in (Q, K, V, R)

RMSNorm without a scale; 4 ways, 1 (R only) after the last block. Block i + 1 then computes
h = X^R + Attn(norm X^Q, norm X^K, norm X^V) (its attention takes query, key and value from
three states, each through a norm of its own: the branch's (u_q, u_k, u_v) input, see
gpt.CausalSelfAttention) and its output h + MLP(norm h); X^R of the last block goes to the
final norm. Sources: the authors' inference code (github.com/Caiyun-AI/MUDDFormer,
`modeling_muddformer.py`) and the hyper-connection-factory harness
(github.com/wdlctc/hyper-connection-factory, `dense.py`), which transcribes it for training. The MLP's hidden size is K_i = ways * (i + 2), four times that after the last
block, rounded as the reference does, (K // 64 + 1) * 64 (which adds 64 even to a multiple of
64). Parameters per block: C K + K ways (i + 2) + ways (i + 2): 610,689 at 12 blocks of width
768 (the 610.7K the harness reports; its K and V norms in the body have
weights, ours have none, as nanochat's).
Init (the harness's; the authors' training init is not public): W1 ~ N(0, 1/C), W2 = 0, a_i one
hot on the newest output for every way: each state is X_{i+1}, the pre-norm residual.

PrePostDANorm (`mudd_prepost_norm`, the form in which the published 24-layer run trained
where the plain one diverged): the stored sources are RMSNorm_j(X_j), each with a learned
scale (init 1, one per source), a_i = 0, and each state is X_{i+1} plus its mix, the R
mix through one more RMSNorm whose scale starts at 1e-3:
    X^c = X_{i+1} + DA_c (Q, K, V),   X^R = X_{i+1} + RMSNorm_post(DA_R),   DA_c = sum_j dw[c, j] N_j(X_j).
With W2 = 0 and a = 0 every mix is zero at init: the pre-norm residual too. Its parameters:
one scale per stored source and one post scale per block on top (2,405,445 at 24 x 1024, the
harness's 2.405M). This form is known only through that harness (which cites the authors'
JAX `layers/mudd.py`, not public); we follow it.

Ours, where nanochat differs: X_0 is the model's normed embedding (the reference mixes the
raw one); every weight trains in the "hc" AdamW group at hc_lr without weight decay. The
reference's depth-dependent MLP widths are not taken: the body stays nanochat's.

State: X^R (B, T, 1, C), each sub-layer x + F(input) (frame.BlockLevelLayer); the carry is
(the stored outputs, (X^Q, X^K, X^V)), per token, so KV-cache decoding needs nothing more.
Called alone (no carry), a block end takes the earlier outputs as a model whose earlier
blocks add nothing would have them, x0 each (plain scales where a later scale would apply).
The weights and mixes are computed with autocast off in fp32 (fp64 for fp64 states); each
mix accumulates in fp32 and rounds once.
"""

import torch
import torch.nn.functional as F
from torch import nn

from nanochat.connections import RMS_EPS, BlockLevelLayer, coefficient_dtype, no_autocast, resolve_one_state

WAYS = 4  # Q, K, V, R
LAST_EXPAND = 4  # the reference's expand_last: a 4x wider MLP after the last block
POST_SCALE_INIT = 1e-3  # PrePostDANorm: the R mix's post-norm scale
FIELDS = {"mudd_prepost_norm": False}
FIELD_HELP = {"mudd_prepost_norm": "muddformer: PrePostDANorm, stored outputs RMS-normed with learned scales and each "
                                   "state the newest output plus its mix (the R mix post-normed, scale 1e-3); the "
                                   "form the reference's 24-layer run needed"}


def hidden_size(ways, sources, last):
    """K_i, rounded as the reference: (K // 64 + 1) * 64."""
    k = ways * sources * (LAST_EXPAND if last else 1)
    return (k // 64 + 1) * 64


def rms(v, dtype):
    return F.rms_norm(v.to(dtype), (v.shape[-1],), eps=RMS_EPS)


class MUDDLayer(BlockLevelLayer):
    """The layer around sub-layer `index`; at a block end (odd index) the block's dense
    connection, with `blocks` blocks in the model."""

    def __init__(self, index, C, blocks, prepost_norm=False):
        super().__init__(index)
        self.block = index // 2  # from 0
        self.prepost_norm = prepost_norm
        if index % 2 == 0:
            return
        last = self.block == blocks - 1
        self.ways = 1 if last else WAYS
        self.sources = self.block + 2  # X_0 .. X_{i+1}
        K = hidden_size(self.ways, self.sources, last)
        self.w1 = nn.Parameter(torch.empty(C, K))
        self.w2 = nn.Parameter(torch.empty(K, self.ways * self.sources))
        self.a = nn.Parameter(torch.empty(self.ways * self.sources))
        if prepost_norm:  # scales of the sources stored here (X_0 too at the first block), and the post norm
            self.source_scale = nn.Parameter(torch.empty(2 if self.block == 0 else 1, C))
            self.post_scale = nn.Parameter(torch.empty(C))

    @torch.no_grad()
    def init_weights(self):
        if self.index % 2 == 0:
            return
        nn.init.normal_(self.w1, std=self.w1.shape[0] ** -0.5)
        self.w2.zero_()
        self.a.zero_()
        if self.prepost_norm:
            self.source_scale.fill_(1.0)
            self.post_scale.fill_(POST_SCALE_INIT)
        else:
            self.a.view(self.ways, self.sources)[:, -1] = 1.0  # every way reads the newest output

    def branch_input(self, x, carry):
        if self.index % 2 == 1 or carry is None or carry[1] is None:
            return x
        return carry[1]  # attention from (X^Q, X^K, X^V)

    def stored(self, v, scale, dtype):
        """What a source is kept as: the output itself, or (PrePostDANorm) its scaled RMSNorm."""
        return rms(v, dtype) * scale.to(dtype) if self.prepost_norm else v

    def block_end(self, x, x0, carry):
        with no_autocast(x):
            dtype = coefficient_dtype(x)
            if carry is not None:
                outputs = carry[0]
            elif self.block == 0:
                outputs = [self.stored(x0, self.source_scale[0], dtype) if self.prepost_norm else x0]
            else:
                earlier = rms(x0, dtype) if self.prepost_norm else x0
                outputs = [earlier] * (self.block + 1)
            outputs = outputs + [self.stored(x, self.source_scale[-1], dtype) if self.prepost_norm else x]
            hidden = F.gelu(rms(x, dtype) @ self.w1.to(dtype))
            dw = (hidden @ self.w2.to(dtype) + self.a.to(dtype)).unflatten(-1, (self.ways, self.sources))
            mixes = []
            for c in range(self.ways):
                mix = dw[..., c, :1] * outputs[0].to(dtype)
                for j in range(1, self.sources):
                    mix = torch.addcmul(mix, dw[..., c, j:j + 1], outputs[j])
                mixes.append(mix)
            if self.prepost_norm:
                xf = x.to(dtype)
                mixes[-1] = rms(mixes[-1], dtype) * self.post_scale.to(dtype)
                mixes = [xf + m for m in mixes]
            states = [m.to(x.dtype) for m in mixes]
        qkv = tuple(states[:3]) if self.ways == WAYS else None
        return states[-1], (outputs, qkv)


def mudd_params(cfg):
    """C K_i + K_i ways (i + 2) + ways (i + 2) per block; PrePostDANorm adds a scale per
    stored output (n_layer + 1) and a post scale per block."""
    C, L = cfg.n_embd, cfg.n_layer
    total = 0
    for i in range(L):
        ways = 1 if i == L - 1 else WAYS
        K = hidden_size(ways, i + 2, i == L - 1)
        total += C * K + K * ways * (i + 2) + ways * (i + 2)
    return total + ((L + 1) * C + L * C if cfg.mudd_prepost_norm else 0)


def resolve(cfg):
    resolve_one_state(cfg, "has one state (its Q, K, V states are rebuilt after every block)")
    if not isinstance(cfg.mudd_prepost_norm, bool):
        raise ValueError(f"mudd_prepost_norm={cfg.mudd_prepost_norm!r} must be true or false")


def make_layers(cfg):
    return [MUDDLayer(j, cfg.n_embd, cfg.n_layer, cfg.mudd_prepost_norm) for j in range(2 * cfg.n_layer)]


SPEC = dict(
    label="MUDDFormer",
    description="after every block, per-token mixes of all block outputs give the next block's query, key, value "
                "and residual states",
    source="arXiv 2502.12170",
    backout="the state after block floor(L/2): that block end's dynamic mix of the earlier block outputs",
    state="single",
    has_h_res=False,
    in_paper=False,
    equals_prenorm_at_init=True,  # one-hot a_i on the newest output, W2 = 0 (PrePostDANorm: a = 0, W2 = 0)
    params=mudd_params,
    bench_layer=1,  # the first block end: its dense connection
    settings=lambda cfg: "PrePostDANorm" if cfg.mudd_prepost_norm else "plain (no PrePostDANorm)",
    order=110,
)
