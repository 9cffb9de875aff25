"""The parts of the frame that StreamConnections runs: the protocol of a connection layer,
and how the stream state begins and ends. `expand` turns the normed embedding x0 (B, T, C)
into the state the layers carry, `reduce` folds the final state back to (B, T, C) (the model
norms it next). StreamConnections holds one of each; a variant may bring its own (a state
that is not n copies), and the HC options choose among these:

expand (`hc_expand`)
  copy   X[s] = x0 for every stream s (the paper).
  lss    X[s] = lss[s] * x0 with a learned (n, C) scale: Learned Stream Scaling (arXiv
         2606.03483; the code of brain-lab-research/hc-stream-collapse, `StreamExpandLSS`).
         Init as there: xavier_uniform_ on (n, C), i.e. U(-r, r) with r = sqrt(6 / (n + C)),
         plus `hc_lss_init` (0.6). The per-channel noise is what makes the streams differ.
         The source trains it with weight decay 0.1 (nanoGPT's rule for 2-D tensors); here it
         trains with the other connection parameters, at hc_lr without weight decay.

reduce (`hc_reduce`, and `hc_pre`)
  sum      the sum of the streams (the paper).
  learned  DeepSeek-V4's `hc_head`: w = sigmoid(a * x'W + b) + 1e-6 with x' = RMSNorm(vec X)
           without a weight, W (n*C, n), one scalar a, b (n); then h = sum_s w_s X[s], in fp32
           (the formula as vLLM's, torchtitan's and transformers' DeepSeek-V4 ports agree on).
           Init [ours; DeepSeek's training init is unpublished]: W = 0, a = 0.01, b = 0, so w
           is 0.5 + 1e-6 for every stream: half the sum, which the model's RMSNorm turns into
           exactly what the sum gives (to the norm's epsilon).
  carried  with hc_pre = delayed: the pre-weights the last layer computed fold the final
           state, h = sum_s p_s X[s] (DeepSeek-V4.1 has no separate head).
"""

import torch
from torch import nn

from nanochat.connections.backends.ops import RMS_EPS, mix_pre, no_autocast, rms_project

EXPANDS = ("copy", "lss")
REDUCES = ("sum", "learned")
LSS_INIT = 0.6  # the source's default (--expand_lss_init)
HEAD_ALPHA_INIT = 0.01
HEAD_EPS = 1e-6  # added to the sigmoid weights, as DeepSeek-V4's hc_eps


class ConnectionLayer(nn.Module):
    """One connection layer around one sub-layer. The frame calls
    `step(X, branch, x0, carry) -> (X_next, carry)`; a layer that carries nothing passes the
    carry through. Calling the layer runs one step with nothing carried in and returns X_next
    (tests, benchmarks and diagnostics use that form; a variant's SPEC `bench_layer` names the
    layer the layer benchmark times that way)."""

    def step(self, X, branch, x0, carry):
        raise NotImplementedError

    def forward(self, X, branch, x0=None):
        return self.step(X, branch, x0, None)[0]


class BlockLevelLayer(ConnectionLayer):
    """A layer of a wiring that acts at block ends (DenseFormer, MUDDFormer): one state
    (B, T, 1, C), and each sub-layer the pre-norm residual step x + F(branch_input(x, carry)).
    After a block's last sub-layer (odd index) `block_end(x, x0, carry) -> (x, carry)` gives
    the state the next block starts from and what is carried to it (e.g. the block outputs so
    far); elsewhere the step passes the carry through. `branch_input` is the state itself
    unless the wiring feeds the sub-layer from its carry (a state, or attention's (u_q, u_k,
    u_v) triple). Called alone (carry None) a block end sees no earlier block output: the
    embedding x0 and its own. Subclasses set `capture = None` to record nothing themselves
    (the frame then records the input state)."""

    def __init__(self, index):
        super().__init__()
        self.index = index
        self.capture = None  # a dict while StreamConnections.capture() is active

    def branch_input(self, x, carry):
        return x

    def block_end(self, x, x0, carry):
        raise NotImplementedError

    def step(self, X, branch, x0, carry):
        x = X.squeeze(-2)
        x = x + branch(self.branch_input(x, carry))
        if self.index % 2 == 1:
            x, carry = self.block_end(x, x0, carry)
        return x.unsqueeze(-2), carry


class Parameterless(nn.Module):
    """An expand or reduce without parameters: nothing to initialize."""

    def init_weights(self):
        pass


class CopyExpand(Parameterless):
    """n copies of the embedding, contiguous so that vec(X) over (n, C) is a free view."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def forward(self, x0):
        if self.n == 1:
            return x0.unsqueeze(-2)
        return x0.unsqueeze(-2).expand(*x0.shape[:-1], self.n, x0.shape[-1]).contiguous()


class LearnedStreamScaling(nn.Module):
    """X[s] = lss[s] * x0: one broadcast multiply, still one contiguous (B, T, n, C) write."""

    def __init__(self, n, C, init=LSS_INIT):
        super().__init__()
        self.n, self.init = n, init
        self.lss = nn.Parameter(torch.empty(n, C))

    @torch.no_grad()
    def init_weights(self):
        nn.init.xavier_uniform_(self.lss)
        self.lss.add_(self.init)

    def forward(self, x0):
        return x0.unsqueeze(-2) * self.lss.to(x0.dtype)


class SumReduce(Parameterless):
    def forward(self, X, carry=None):
        # dtype given: CUDA autocast would otherwise return the sum in fp32 (its rule for sum)
        return X.squeeze(-2) if X.shape[-2] == 1 else X.sum(dim=-2, dtype=X.dtype)


class LearnedHead(nn.Module):
    """DeepSeek-V4's learned head collapse (see the module docstring), fp32 coefficients.
    Its weight, alpha, bias, n and eps are also what the fused exit seam projects with
    (fused.head_target)."""

    eps = HEAD_EPS

    def __init__(self, n, C, kernels="torch"):
        super().__init__()
        self.n, self.kernels = n, kernels
        self.weight = nn.Parameter(torch.empty(n * C, n))  # the large dim first, as the layers' W
        self.bias = nn.Parameter(torch.empty(n))
        self.alpha = nn.Parameter(torch.empty(1))

    @torch.no_grad()
    def init_weights(self):
        self.weight.zero_()
        self.bias.zero_()
        self.alpha.fill_(HEAD_ALPHA_INIT)

    def weights(self, X):
        """w (B, T, n) fp32 from the final streams."""
        with no_autocast(X):
            xw = rms_project(X, self.weight, RMS_EPS, self.kernels)
            return torch.sigmoid(torch.addcmul(self.bias, xw, self.alpha)) + self.eps

    def forward(self, X, carry=None):
        return mix_pre(self.weights(X), X, self.kernels)


class CarriedPreReduce(Parameterless):
    """hc_pre = delayed: the last layer's pre-weights (the carry) read the final state."""

    def __init__(self, kernels="torch"):
        super().__init__()
        self.kernels = kernels

    def forward(self, X, carry):
        return mix_pre(carry, X, self.kernels)


def resolve_one_state(cfg, state, hint=""):
    """The check of a wiring with one state rather than n streams, in place: hc_streams 0 or 1
    (it becomes 1). `state` says what it keeps instead, `hint` what shapes it. (The stream
    options and the kernel backends it does not declare the frame refuses: SPEC options and
    backends.)"""
    if cfg.hc_streams not in (0, 1):
        raise ValueError(f"hc={cfg.hc!r} {state}; got hc_streams={cfg.hc_streams}. Drop --hc-streams{hint}")
    cfg.hc_streams = 1


def make_expand(cfg):
    if cfg.hc_expand == "lss":
        return LearnedStreamScaling(cfg.hc_streams, cfg.n_embd, cfg.hc_lss_init)
    return CopyExpand(cfg.hc_streams)


def make_reduce(cfg):
    if cfg.hc_pre == "delayed":
        return CarriedPreReduce(cfg.hc_kernels)
    if cfg.hc_reduce == "learned":
        return LearnedHead(cfg.hc_streams, cfg.n_embd, cfg.hc_kernels)
    return SumReduce()

