"""The memory-bound work of a hyper-connection layer, as autograd Functions with written-out
backward passes: the projection of vec(X) together with its mean square, the pre mix
H_pre @ X, and the post/res mix H_res @ X + H_post^T y.

Why Functions rather than plain ops (measured with scripts/bench):
- every Function saves the streams X in their own dtype and casts to fp32 on the fly, so
  bf16 streams never leave an fp32 copy of X alive until backward (plain autograd keeps
  the fp32 cast that the fp32 matmul consumed);
- the mixes are batched matmuls over tokens, (n x n) @ (n x C), with fp32 accumulation:
  one pass over X instead of n broadcast multiply-adds, whose per-stream slicing costs a
  zero-filled full-size gradient per slice in backward;
- the backward passes combine what autograd would do in several kernels.
Under torch.compile none of the Functions is used: the projection is written as a
broadcast multiply and a sum over vec(X) (`project`), the two mixes as stream-by-stream
multiply-adds (`stream_sum`), which the compiler fuses into passes that read bf16 X once
and accumulate in fp32 (faster than calling out to a matmul, which would first need an
fp32 copy of X written out); it derives the backward itself and its partitioner keeps bf16
X rather than an fp32 copy.

Every forward and backward runs with autocast off: the matmuls here must stay in fp32,
which autocast would round to the compute dtype. The compiled backward is traced apart
from the forward, so the compiler is told below not to re-apply the forward's autocast.

Backends (`hc_kernels`, docs/kernels.md): the choice between these ops and Liger's
fused Triton kernels (liger.py) is made here, in `uses_liger`, and nowhere else; the
layers only pass their config's choice along.

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

from nanochat.connections import liger

KERNELS = ("torch", "liger", "auto")
# F.rms_norm's default for fp32 inputs; written out because the norm is applied after the
# matmul here (x' W = (x W) / rms(x), exact since rms is one scalar per token).
RMS_EPS = torch.finfo(torch.float32).eps


def no_autocast(t):
    return torch.autocast(t.device.type, enabled=False)


def coefficient_dtype(X):
    """The dtype connection coefficients are computed in for a state X: fp32 for bf16, fp16
    and fp32 states, fp64 for an fp64 one (the gradient checks), never narrower than X."""
    return torch.promote_types(X.dtype, torch.float32)


class Project(torch.autograd.Function):
    """(x (..., D), w (D, k) fp32) -> (x @ w, mean(x^2) (..., 1)), both fp32."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        with no_autocast(x):
            xf = x.to(w.dtype)
            ss = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square() / x.shape[-1]
            return xf @ w, ss

    @staticmethod
    def backward(ctx, g_xw, g_ss):
        x, w = ctx.saved_tensors
        g_x = g_w = None
        with no_autocast(x):
            xf = x.to(w.dtype)
            if ctx.needs_input_grad[0]:
                g_x = g_xw @ w.t()
                g_x.addcmul_(xf, g_ss, value=2.0 / x.shape[-1])
                g_x = g_x.to(x.dtype)
            if ctx.needs_input_grad[1]:
                # (g^T x)^T rather than x^T g: the same product, ~2x faster on CPU BLAS for k << D.
                g_w = (g_xw.flatten(0, -2).t() @ xf.flatten(0, -2)).t()
        return g_x, g_w


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


def uses_liger(kernels, X):
    """torch: the ops below; liger: Liger's kernels; auto: Liger's where they can serve
    (CUDA streams, Liger installed, n a power of two), else torch."""
    return kernels == "liger" or (kernels == "auto" and liger.serves(X))


def rms_project(X, w, eps, kernels="torch"):
    """x' W, x' = x / sqrt(mean(x^2) + eps) for x = vec(X) over a token's n*C values:
    (..., k) fp32. The division comes after the matmul (exact: one scalar per token), so
    that X is read once."""
    if uses_liger(kernels, X):
        return liger.rms_project(X.flatten(-2), w, eps)
    xw, ss = project(X.flatten(-2), w)
    return xw * torch.rsqrt(ss + eps)


def project(x, w):
    if torch.compiler.is_compiling():
        # Plain ops: the compiler's partitioner then keeps x in its own dtype (traced, the
        # Function's backward made it keep the fp32 cast of bf16 streams instead). x @ w as a
        # multiply-and-sum rather than a matmul: with k = 2n + R columns the product is
        # memory-bound, and the compiler fuses the cast of x into one reduction that reads bf16
        # x once with fp32 products and sums, where a matmul call would need an fp32 copy of x
        # written out first (bf16 operands instead would round w and the output).
        with no_autocast(x):
            xf = x.to(w.dtype)
            return (xf[..., :, None] * w).sum(-2), xf.square().mean(dim=-1, keepdim=True)
    return Project.apply(x, w)


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
