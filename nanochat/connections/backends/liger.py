"""The stream ops of ops.py on Liger-Kernel's fused Triton kernels (`hc_kernels = liger`):
the pre mix H_pre @ X, the post/res mix H_res @ X + H_post^T y, and the projection of
vec(X) divided by its RMS, for every HC variant (the kernels take any per-token h_pre,
h_post and h_res; only mHC's own coefficient kernel, with its Sinkhorn, is not used).

The kernels come from `liger_kernel.ops.mhc` (Liger-Kernel >= 0.8.5, BSD-2-Clause):
`mhc_pre_fwd/bwd`, `mhc_post_res_fwd/bwd`, `mhc_mm_norm_fwd/bwd`. What this module adds
is the glue, written here rather than taken from Liger's autograd Functions because:
- each forward and each backward is a torch.library custom op with a fake (shape-only)
  implementation, so torch.compile sees one node per op instead of breaking the graph at
  Python that launches Triton kernels;
- outputs and stream gradients are written by the kernels directly in the streams' dtype
  (Triton's store rounds once, as MixPre/MixPost do), and incoming gradients are passed in
  their own dtype (the kernels load and widen them): Liger's Functions allocate fp32
  buffers and cast afterwards, an extra pass over X each way;
- Liger applies its mm-norm kernels only inside its mHC coefficient Function; here they
  serve the projection of every variant.

Conventions matched exactly: mm-norm computes (x @ phi) * rsqrt(mean(x^2) + eps) over all
K = n*C values of a token, phi = our (n*C, k) weight with the norm weight folded in, eps
given (ops.RMS_EPS), fp32 results; h_res[t, s] multiplies stream s into stream t (our
H-convention). Arithmetic is fp32 inside the kernels whatever the streams' dtype.
Limits: the post/res kernel tiles the streams with tl.arange, so n must be a power of two;
its backward also reduces the gradient of h_res, computed and dropped for hc_identity (an
identity h_res is passed). Gradients of the weights are summed with atomic adds: not
bit-reproducible on a GPU.

Only training steps come here (ops.uses_liger says why): evaluation runs the torch ops.

Liger and Triton are an optional extra (`pip install -e '.[kernels]'`), imported on first
use (importing them takes seconds). No device check stands in the way on CPU: with
TRITON_INTERPRET=1 set before the first use, the kernels run on CPU tensors (the tests).
"""

import functools
import importlib.util

import torch
from torch import Tensor

from nanochat.connections.backends import triton_device
from nanochat.connections.backends.custom_ops import custom_op

INSTALL_HINT = "pip install -e '.[kernels]'"
AVAILABLE = all(importlib.util.find_spec(m) is not None for m in ("liger_kernel", "triton"))


def check(n):
    """ValueError unless Liger's kernels can serve n streams here (config time)."""
    if not AVAILABLE:
        raise ValueError(f"hc_kernels='liger' needs Liger-Kernel and Triton, which are not installed: "
                         f"{INSTALL_HINT} (or use hc_kernels='torch')")
    if n & (n - 1):
        raise ValueError(f"hc_kernels='liger' needs a power-of-two number of streams (Liger's post/res kernel "
                         f"tiles them with tl.arange); got hc_streams={n}. Use hc_kernels='torch' or 'auto'")


runs_on = triton_device.runs_on


def check_device(X):
    triton_device.check(X, "liger", runs_on)


@functools.cache
def kernels():
    return importlib.import_module("liger_kernel.ops.mhc")


def tokens(t, k):
    """t (..., *last k dims) as one contiguous (N, ...) tensor: the kernels' layout."""
    return t.contiguous().view(-1, *t.shape[t.dim() - k:])


# ----- pre mix: u = sum_s h_pre[s] X[s] -----

@custom_op("nanochat::liger_mix_pre", mutates_args=())
def _mix_pre(h_pre: Tensor, X: Tensor) -> Tensor:
    return kernels().mhc_pre_fwd(X, h_pre, out=X.new_empty(X.shape[0], X.shape[2]))


@_mix_pre.register_fake
def _(h_pre, X):
    return X.new_empty(X.shape[0], X.shape[2])


@custom_op("nanochat::liger_mix_pre_backward", mutates_args=())
def _mix_pre_backward(h_pre: Tensor, X: Tensor, g_u: Tensor) -> tuple[Tensor, Tensor]:
    g_X, g_h = kernels().mhc_pre_bwd(X, h_pre, g_u, out_grad_x=torch.empty_like(X))
    return g_h, g_X


@_mix_pre_backward.register_fake
def _(h_pre, X, g_u):
    return torch.empty_like(h_pre, dtype=torch.float32), torch.empty_like(X)


def _save_inputs(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _mix_pre_grad(ctx, g_u):
    return _mix_pre_backward(*ctx.saved_tensors, g_u.contiguous())


_mix_pre.register_autograd(_mix_pre_grad, setup_context=_save_inputs)


# ----- post/res mix: X_next[t] = sum_s h_res[t, s] X[s] + h_post[t] y -----

@custom_op("nanochat::liger_mix_post", mutates_args=())
def _mix_post(h_res: Tensor, X: Tensor, h_post: Tensor, y: Tensor) -> Tensor:
    return kernels().mhc_post_res_fwd(X, y, h_post, h_res, out=torch.empty_like(X))


@_mix_post.register_fake
def _(h_res, X, h_post, y):
    return torch.empty_like(X)


@custom_op("nanochat::liger_mix_post_backward", mutates_args=())
def _mix_post_backward(h_res: Tensor, X: Tensor, h_post: Tensor, y: Tensor,
                       g_out: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    g_X, g_y, g_post, g_res = kernels().mhc_post_res_bwd(X, y, h_post, h_res, g_out, out_grad_x=torch.empty_like(X),
                                                         out_grad_f=torch.empty_like(y))
    return g_res, g_X, g_post, g_y


@_mix_post_backward.register_fake
def _(h_res, X, h_post, y, g_out):
    fp32 = dict(dtype=torch.float32)
    return torch.empty_like(h_res, **fp32), torch.empty_like(X), torch.empty_like(h_post, **fp32), torch.empty_like(y)


def _mix_post_grad(ctx, g_out):
    return _mix_post_backward(*ctx.saved_tensors, g_out.contiguous())


_mix_post.register_autograd(_mix_post_grad, setup_context=_save_inputs)


# ----- projection: x' W = (x @ W) * rsqrt(mean(x^2) + eps), with 1 / rms kept for backward -----

# Liger's default reduction block (256 of the n*C values per step) spills registers on sm_90 at
# D=12 (368 bytes forward, 112 backward: scripts.kernel_check, docs/kernels.md); 128 does not,
# with 8 warps for the backward (4 spilled on sm_80 for go-mHC's 36 columns).
MM_NORM_BLOCK_K = 128
MM_NORM_BACKWARD_WARPS = 8


@custom_op("nanochat::liger_rms_project", mutates_args=())
def _rms_project(x: Tensor, w: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return kernels().mhc_mm_norm_fwd(x, w, eps, block_k=MM_NORM_BLOCK_K)


@_rms_project.register_fake
def _(x, w, eps):
    return x.new_empty(x.shape[0], w.shape[1], dtype=torch.float32), x.new_empty(x.shape[0], dtype=torch.float32)


@custom_op("nanochat::liger_rms_project_backward", mutates_args=())
def _rms_project_backward(x: Tensor, w: Tensor, xw_normed: Tensor, inv_rms: Tensor,
                          g: Tensor) -> tuple[Tensor, Tensor]:
    g_x, g_w = kernels().mhc_mm_norm_bwd(x, w, xw_normed, inv_rms, g, block_k=MM_NORM_BLOCK_K,
                                          num_warps=MM_NORM_BACKWARD_WARPS)
    return g_x, g_w.to(w.dtype)


@_rms_project_backward.register_fake
def _(x, w, xw_normed, inv_rms, g):
    return torch.empty_like(x), torch.empty_like(w)


def _rms_project_setup(ctx, inputs, output):
    x, w, _ = inputs
    ctx.save_for_backward(x, w, *output)


def _rms_project_grad(ctx, g, _g_inv_rms):
    # 1 / rms is an output only for the backward's sake; nothing downstream uses it.
    g_x, g_w = _rms_project_backward(*ctx.saved_tensors, g.contiguous())
    return g_x, g_w, None


_rms_project.register_autograd(_rms_project_grad, setup_context=_rms_project_setup)


# ----- the entry points of ops.py, on (..., n, C) streams and fp32 coefficients -----

def mix_pre(h_pre, X):
    check_device(X)
    u = _mix_pre(tokens(h_pre.float(), 1), tokens(X, 2))
    return u.view(*X.shape[:-2], X.shape[-1])


def mix_post(h_res, X, h_post, y):
    check_device(X)
    n = X.shape[-2]
    if h_res is None:  # hc_identity: the kernel has no identity form
        h_res = torch.eye(n, device=X.device).expand(*X.shape[:-2], n, n)
    out = _mix_post(tokens(h_res.float(), 2), tokens(X, 2), tokens(h_post.float(), 1), tokens(y, 1))
    return out.view(X.shape)


def rms_project(x, w, eps):
    check_device(x)
    xw_normed, _ = _rms_project(tokens(x, 1), w.contiguous(), eps)
    return xw_normed.view(*x.shape[:-1], w.shape[1])
