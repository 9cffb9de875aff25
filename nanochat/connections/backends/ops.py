"""The memory-bound work of a hyper-connection layer, as a custom op and autograd Functions
with written-out backward passes: the projection of vec(X) together with its mean square, the pre mix
H_pre @ X, and the post/res mix H_res @ X + H_post^T y.

Why Functions rather than plain ops (measured with scripts/bench):
- every Function (and the custom op) saves the streams X in their own dtype and casts to fp32 on the fly, so
  bf16 streams never leave an fp32 copy of X alive until backward (plain autograd keeps
  the fp32 cast that the fp32 matmul consumed);
- the mixes are batched matmuls over tokens, (n x n) @ (n x C), with fp32 accumulation:
  one pass over X instead of n broadcast multiply-adds, whose per-stream slicing costs a
  zero-filled full-size gradient per slice in backward;
- the backward passes combine what autograd would do in several kernels.
The projection is a custom op in both modes (`project`, why beside it). Under torch.compile
the mixes' Functions are not used: they are stream-by-stream multiply-adds (`stream_sum`),
which the compiler fuses into passes that read bf16 X once and accumulate in fp32; it
derives their backward itself and its partitioner keeps bf16 X rather than an fp32 copy.

Every forward and backward runs with autocast off: the matmuls here must stay in fp32,
which autocast would round to the compute dtype. The compiled backward is traced apart
from the forward, so the compiler is told below not to re-apply the forward's autocast.

Backends (`hc_kernels`, docs/kernels.md): the choice between these ops, Liger's fused Triton
kernels (liger.py) and our own fused kernels (fused.py, which the frame runs whole rather than
op by op) is made here, in `uses_liger` and `uses_fused`, and nowhere else; the layers and the
frame only pass their config's choice along.

Shapes: X (..., n, C); h_pre, h_post (..., n) fp32; h_res (..., n, n) fp32 or None for
the identity; y (..., C). Arithmetic runs in the dtype of the coefficients (W, h_pre,
h_post: fp32 in the model; float64 in gradient checks); gradients come back in each
input's dtype.
"""

import torch
import torch._functorch.config

# AOTAutograd traces the compiled backward under the forward's ambient autocast by default
# ("same_as_forward"), which turns the fp32 matmuls of the coefficient path (here and in the
# variants' H_res) into bf16 ones in backward only: compiled and eager gradients of W then
# differ by ~2e-3. "off" keeps the backward in the dtypes the forward chose. Set here, in one
# place, because every model with connections imports this module before it is compiled.
if hasattr(torch._functorch.config, "backward_pass_autocast"):
    torch._functorch.config.backward_pass_autocast = "off"

from nanochat.connections.backends import fused, liger
from nanochat.connections.backends.custom_ops import custom_op

KERNELS = ("torch", "liger", "fused", "auto")
# F.rms_norm's default for fp32 inputs; written out because the norm is applied after the
# matmul here (x' W = (x W) / rms(x), exact since rms is one scalar per token).
RMS_EPS = torch.finfo(torch.float32).eps


def no_autocast(t):
    return torch.autocast(t.device.type, enabled=False)


def coefficient_dtype(X):
    """The dtype connection coefficients are computed in for a state X: fp32 for bf16, fp16
    and fp32 states, fp64 for an fp64 one (the gradient checks), never narrower than X."""
    return torch.promote_types(X.dtype, torch.float32)


# The projection is a custom op, eager and compiled alike, so that the compiler treats it as
# one opaque call: reading bf16 x, it casts to fp32 inside, multiplies with cuBLAS (TF32 on a
# GPU; bf16 x is exact in TF32) and frees the cast, and the backward recasts x. Measured on an
# H200 (docs/gpu_measured.md), Inductor's own forms of it both failed: as a multiply-and-sum its
# reductions (over n*C per token, and over every token for the gradient of w) ran at a few
# hundred threads and made KromHC's D=12 step 3.4x residual's; as a plain fp32 matmul its
# partitioner keeps the fp32 cast of x for the backward's matmul (it never recomputes what a
# matmul reads in backward), +768 MiB per layer at D=12, batch 32.
@custom_op("nanochat::project", mutates_args=())
def _project(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x (N, D), w (D, k) fp32) -> (x @ w, mean(x^2) (N, 1)), both in w's dtype."""
    with no_autocast(x):
        xf = x.to(w.dtype)
        ss = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square() / x.shape[-1]
        return xf @ w, ss


@_project.register_fake
def _(x, w):
    return x.new_empty(x.shape[0], w.shape[1], dtype=w.dtype), x.new_empty(x.shape[0], 1, dtype=w.dtype)


@custom_op("nanochat::project_backward", mutates_args=())
def _project_backward(x: torch.Tensor, w: torch.Tensor, g_xw: torch.Tensor,
                      g_ss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with no_autocast(x):
        xf = x.to(w.dtype)
        g_x = g_xw @ w.t()
        g_x.addcmul_(xf, g_ss, value=2.0 / x.shape[-1])
        # (g^T x)^T rather than x^T g: the same product, ~2x faster on CPU BLAS for k << D.
        g_w = (g_xw.t() @ xf).t()
        return g_x.to(x.dtype), g_w.contiguous()


@_project_backward.register_fake
def _(x, w, g_xw, g_ss):
    return torch.empty_like(x), torch.empty_like(w)


def _project_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _project_grad(ctx, g_xw, g_ss):
    x, w = ctx.saved_tensors
    # an output nothing downstream used comes back as None
    g_xw = torch.zeros(x.shape[0], w.shape[1], dtype=w.dtype, device=x.device) if g_xw is None else g_xw
    g_ss = torch.zeros(x.shape[0], 1, dtype=w.dtype, device=x.device) if g_ss is None else g_ss
    return _project_backward(x, w, g_xw.contiguous(), g_ss.contiguous())


_project.register_autograd(_project_grad, setup_context=_project_setup)


class MixPre(torch.autograd.Function):
    """H_pre @ X per token: (..., n) x (..., n, C) -> (..., C), accumulated in fp32 and
    returned in X's dtype (the branch input)."""

    @staticmethod
    def forward(ctx, h_pre, X):
        ctx.save_for_backward(h_pre, X)
        with no_autocast(X):
            return (h_pre.unsqueeze(-2) @ X.to(h_pre.dtype)).squeeze(-2).to(X.dtype)

    @staticmethod
    def backward(ctx, g_u):
        h_pre, X = ctx.saved_tensors
        g_h = g_X = None
        with no_autocast(X):
            g = g_u.to(h_pre.dtype).unsqueeze(-2)  # (..., 1, C)
            if ctx.needs_input_grad[0]:
                g_h = (g @ X.to(h_pre.dtype).transpose(-1, -2)).squeeze(-2)
            if ctx.needs_input_grad[1]:
                g_X = (h_pre.unsqueeze(-1) * g).to(X.dtype)
        return g_h, g_X


class MixPost(torch.autograd.Function):
    """X_next = H_res @ X + H_post^T y per token, accumulated in fp32 and rounded once to
    X's dtype. h_res None means the identity (hc_identity)."""

    @staticmethod
    def forward(ctx, h_res, X, h_post, y):
        ctx.save_for_backward(h_res, X, h_post, y)
        with no_autocast(X):
            out = h_post.unsqueeze(-1) * y.to(h_post.dtype).unsqueeze(-2)  # (..., n, C)
            if h_res is None:
                out += X
            else:
                # baddbmm wants 3-d operands: fold the token dims (free views of contiguous tensors).
                out.view(-1, *out.shape[-2:]).baddbmm_(h_res.reshape(-1, *h_res.shape[-2:]),
                                                       X.to(h_post.dtype).reshape(-1, *X.shape[-2:]))
            return out.to(X.dtype)

    @staticmethod
    def backward(ctx, g_out):
        h_res, X, h_post, y = ctx.saved_tensors
        g_res = g_X = g_post = g_y = None
        with no_autocast(X):
            g = g_out.to(h_post.dtype)
            if h_res is None:
                g_X = g_out.to(X.dtype)
            else:
                if ctx.needs_input_grad[0]:
                    g_res = g @ X.to(h_post.dtype).transpose(-1, -2)
                if ctx.needs_input_grad[1]:
                    g_X = (h_res.transpose(-1, -2) @ g).to(X.dtype)
            if ctx.needs_input_grad[2]:
                g_post = (g @ y.to(h_post.dtype).unsqueeze(-1)).squeeze(-1)
            if ctx.needs_input_grad[3]:
                g_y = (h_post.unsqueeze(-2) @ g).squeeze(-2).to(y.dtype)
        return g_res, g_X, g_post, g_y


def resolve_kernels(cfg):
    """Check cfg.hc_kernels at configuration time: one clear ValueError per mistake."""
    if cfg.hc_kernels not in KERNELS:
        raise ValueError(f"unknown hc_kernels={cfg.hc_kernels!r}; choose one of {', '.join(KERNELS)}")
    if cfg.hc_kernels == "liger" and cfg.hc_streams > 1:
        liger.check(cfg.hc_streams)
    if cfg.hc_kernels == "fused" and cfg.hc_streams > 1:
        fused.check()
    fused.check_stream_checkpoint(cfg)
    fused.check_design(cfg)


def uses_liger(kernels, X):
    """torch and auto: the ops below (a training run decides auto before it builds the model:
    backends/auto.py); liger: Liger's kernels, only where autograd records, i.e. in
    training: Triton compiles the kernels again for every token count N (a constexpr of
    theirs), which training keeps fixed and evaluation changes at nearly every call (CORE's
    examples, each prompt and decode step, loss and lm_eval batches, the diagnostics), at
    three compiles per new N. A forward without autograd, where the kernels would save
    nothing for a backward, runs the torch ops instead."""
    if not torch.is_grad_enabled():
        return False
    return kernels == "liger"


def uses_fused(kernels, X):
    """fused: our kernels (fused.py), training only, as Liger's (see uses_liger). A device the kernels
    cannot run on stops with one clear error."""
    if kernels != "fused" or not torch.is_grad_enabled():
        return False
    fused.check_device(X)
    return True


def rms_project(X, w, eps, kernels="torch"):
    """x' W, x' = x / sqrt(mean(x^2) + eps) for x = vec(X) over a token's n*C values:
    (..., k) fp32. The division comes after the matmul (exact: one scalar per token), so
    that X is read once."""
    if uses_liger(kernels, X):
        return liger.rms_project(X.flatten(-2), w, eps)
    xw, ss = project(X.flatten(-2), w)
    return xw * torch.rsqrt(ss + eps)


def project(x, w):
    """(x (..., D), w (D, k)) -> (x @ w, mean(x^2) (..., 1)) in w's dtype (nanochat::project)."""
    xw, ss = _project(x.reshape(-1, x.shape[-1]), w)
    return xw.view(*x.shape[:-1], w.shape[1]), ss.view(*x.shape[:-1], 1)


def mix_pre(h_pre, X, kernels="torch"):
    if uses_liger(kernels, X):
        return liger.mix_pre(h_pre, X)
    if torch.compiler.is_compiling():
        return stream_sum(h_pre[..., None], X).to(X.dtype)
    return MixPre.apply(h_pre, X)


def mix_post(h_res, X, h_post, y, kernels="torch"):
    if uses_liger(kernels, X):
        return liger.mix_post(h_res, X, h_post, y)
    if torch.compiler.is_compiling():
        out = h_post[..., None] * y[..., None, :]
        out = out + (X if h_res is None else stream_sum(h_res[..., None], X[..., None, :, :]))
        return out.to(X.dtype)
    return MixPost.apply(h_res, X, h_post, y)


def stream_sum(h, X):
    """sum_s h[..., s, :] * X[..., s, :] over the stream axis (-2), written as multiply-adds
    for a compiler: it fuses them into one pass over X, and, there being no reduction op,
    its partitioner may recompute the result in backward rather than keep it (a written
    .sum() would keep the C-wide branch input of every layer)."""
    out = h[..., 0, :] * X[..., 0, :]
    for s in range(1, X.shape[-2]):
        out = out + h[..., s, :] * X[..., s, :]
    return out
