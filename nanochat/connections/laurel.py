"""LAuReL, the Learned Augmented Residual Layer (Menghani, Kumar & Kumar, ICML 2025, arXiv
2411.07501), per sub-layer on one stream x (B, T, C), in three forms (`laurel_form`):

    rw     x' = alpha F(x) + beta x              learned weights on branch and residual
    lr     x' = F(x) + x + x A B                 a low-rank term on the residual (W = I + AB)
    rw_lr  x' = alpha F(x) + beta (x + x A B)    both

with F the sub-layer and its own pre-norm (the branch), A in R^{C x r}, B in R^{r x C},
r = `laurel_rank`. The paper's general form x' = alpha F(x) + g(x, ...) leaves the map that
bounds alpha and beta open; ours is (alpha, beta) = 2 softmax(w), w in R^2 init 0, so both
start at 1 (as hyper-connection-factory, github.com/wdlctc/hyper-connection-factory). The
paper's "previous activations" form (PA) is not built: its equation is not public.
Init: A "column orthogonal", A[i, j] = 1/sqrt(rC) where i mod r = j and 0 elsewhere, B = 0,
so every form starts as the plain pre-norm residual, exactly.
Our choices where the sources differ: the low-rank term reads the residual stream x itself,
as the paper's g(x) = x + ABx (Gemma 3n's shipped LR reads the normed input, adds its own
RMSNorm and sits on the attention sub-layer only); r defaults to 16, the factory's (Gemma 3n
uses 64). B is stored transposed, (C, r), so that both matrices have their large dimension
first (the dimension a sharded optimizer splits).

Parameters per sub-layer: 2 (rw), 2rC (lr), 2rC + 2 (rw_lr); with r = 16 at 12 x 256 the
factory's 196.7K for rw_lr. Training: in the "hc" AdamW group at hc_lr, no weight decay.
Precision: the low-rank product runs in the compute dtype, like a sub-layer's matmuls; alpha
and beta are fp32 and the weighted sum accumulates in fp32 and rounds once.
"""

import math

import torch
from torch import nn

from nanochat.connections import ConnectionLayer, coefficient_dtype, no_autocast, prenorm, resolve_one_state
from nanochat.flags import choice, positive_int

FORMS = ("rw", "lr", "rw_lr")
FIELDS = {"laurel_form": "rw_lr", "laurel_rank": 16}
FIELD_HELP = {
    "laurel_form": "laurel: rw (alpha F(x) + beta x) | lr (F(x) + x + xAB) | rw_lr (alpha F(x) + beta (x + xAB))",
    "laurel_rank": "laurel: rank r of the low-rank term xAB (lr and rw_lr), 1 .. n_embd",
}
FIELD_TYPES = {"laurel_form": choice(*FORMS), "laurel_rank": positive_int()}


def layer_params(form, rank, C):
    return (2 if "rw" in form else 0) + (2 * rank * C if "lr" in form else 0)


SPEC = dict(
    label="LAuReL",
    description="learned weights on branch and residual (RW), a low-rank residual term (LR), or both, per sub-layer",
    source="arXiv 2411.07501",
    backout="the stream after block floor(L/2)",
    state="single",
    has_h_res=False,
    in_paper=False,
    equals_prenorm_at_init=True,
    params=lambda cfg: 2 * cfg.n_layer * layer_params(cfg.laurel_form, cfg.laurel_rank, cfg.n_embd),
    baseline="prenorm",
    settings=lambda cfg: cfg.laurel_form + ("" if cfg.laurel_form == "rw" else f", rank {cfg.laurel_rank}"),
    order=120,
)


class LaurelLayer(ConnectionLayer):
    def __init__(self, form, rank, C):
        super().__init__()
        self.w = nn.Parameter(torch.empty(2)) if "rw" in form else None
        self.A = nn.Parameter(torch.empty(C, rank)) if "lr" in form else None
        self.B = nn.Parameter(torch.empty(C, rank)) if "lr" in form else None  # B^T

    @torch.no_grad()
    def init_weights(self):
        if self.w is not None:
            self.w.zero_()
        if self.A is not None:
            C, r = self.A.shape
            self.A.zero_()
            rows = torch.arange(C, device=self.A.device)
            self.A[rows, rows % r] = 1.0 / math.sqrt(r * C)
            self.B.zero_()

    def weights(self, dtype):
        """(alpha, beta) = 2 softmax(w), 0-dim each."""
        return (2 * torch.softmax(self.w.to(dtype), dim=0)).unbind()

    def step(self, X, branch, x0, carry):
        x = X.squeeze(-2)
        y = branch(x)
        g = x if self.A is None else x + (x @ self.A.to(x.dtype)) @ self.B.to(x.dtype).t()
        if self.w is None:
            return (g + y).unsqueeze(-2), carry
        with no_autocast(x):
            dtype = coefficient_dtype(x)
            alpha, beta = self.weights(dtype)
            out = torch.addcmul(beta * g.to(dtype), y.to(dtype), alpha)
        return out.to(x.dtype).unsqueeze(-2), carry


def resolve(cfg):
    resolve_one_state(cfg, "has one stream", hint="; --laurel-form and --laurel-rank set its form")
    if cfg.laurel_form not in FORMS:
        raise ValueError(f"unknown laurel_form={cfg.laurel_form!r}; choose one of {', '.join(FORMS)}")
    r = cfg.laurel_rank
    if cfg.laurel_form == "rw":
        if r != FIELDS["laurel_rank"]:
            raise ValueError(f"laurel_rank={r!r} applies to the low-rank forms (laurel_form lr or rw_lr), not rw; "
                             "drop it")
    elif isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= cfg.n_embd:
        raise ValueError(f"laurel_rank={r!r} must be a whole number from 1 to the width {cfg.n_embd}")


def make_layers(cfg):
    return [LaurelLayer(cfg.laurel_form, cfg.laurel_rank, cfg.n_embd) for _ in range(2 * cfg.n_layer)]
