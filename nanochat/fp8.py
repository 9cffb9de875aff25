"""Float8 training of the model's large matmuls (`--fp8`), with the recipe of nanochat 92d63d4
(its nanochat/fp8.py and scripts/base_train.py), written for this project.

A converted layer runs its three matmuls, y = x W^T forward and dx = dy W, dW = dy^T x
backward, through torch._scaled_mm on float8 operands. Each operand is quantized with one
scale for the whole tensor (tensorwise), from its largest magnitude: x and W in e4m3 (more
mantissa), dy in e5m2 (more range, for gradients). The forward accumulates in cuBLAS's fast
mode, the backward at full precision. Backward keeps the float8 x and W and their scales
(1 byte an element), not the bf16 input. Weights stay fp32 masters: the layer quantizes the
master itself, and the gradient reaches it in the activations' dtype, as 92d63d4's does.

Which layers (`convert`): the linear layers outside the connections whose widths are both
multiples of 16 (the float8 kernels' alignment) and at least 128 (92d63d4's filter): attention's
q, k, v and output projections, the MLP's two and the head. The value-embedding and smear gates
are far narrower and stay as they are; a wiring's parameters never convert. Evaluation (val bpb,
CORE, samples) runs the plain layers again (`disabled`): 92d63d4 evaluates in bf16.

Our own layer rather than torchao's Float8Linear: nanochat dropped torchao for this same
recipe, whose few lines need no dependency pinned to torch's version, and ours keeps the
replaced layer's own weight parameter (state-dict keys and optimizer state stay as they are).

Float8 matmuls need CUDA compute capability 8.9 or newer (`check_device`). torch also runs
_scaled_mm on the CPU, which is how the tests run this code against a dequantized reference.
"""

import contextlib

import torch
from torch import nn

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# An all-zero tensor (a zero-initialized output projection at step 0) has amax 0: the scale
# divides by at least this instead (nanochat 92d63d4, nanochat/fp8.py).
AMAX_FLOOR = 1e-12
ALIGNMENT = 16  # both widths a multiple of this (nanochat 92d63d4, scripts/base_train.py)
MIN_WIDTH = 128  # and neither below this
MIN_CAPABILITY = (8, 9)


def quantize(x, dtype):
    """(x in the float8 `dtype`, the inverse of its scale). The scale maps x's largest magnitude
    onto the format's largest value, the division in fp64 and then rounded to fp32, which keeps
    eager and compiled runs equal (92d63d4 does the same). The scaled values are clamped
    before the cast: one rounding past the largest value would otherwise cast to inf (e5m2).
    One fp32 copy, scaled and clamped in place: eagerly, the head's gradient is (B*T, vocab)."""
    top = torch.finfo(dtype).max
    scale = (top / x.abs().amax().double().clamp(min=AMAX_FLOOR)).float()
    scaled = x.to(torch.float32, copy=True).mul_(scale).clamp_(-top, top)
    return scaled.to(dtype), scale.reciprocal()


def column_major(t):
    """t with column-major strides, the same values: the layout _scaled_mm takes its second operand in."""
    return t.t().contiguous().t()


def scaled_mm(a, b, a_inv, b_inv, out_dtype, fast_accum):
    """a @ b in `out_dtype` from float8 operands (a row-major, b column-major) and their inverse scales."""
    return torch._scaled_mm(a, b, scale_a=a_inv, scale_b=b_inv, out_dtype=out_dtype, use_fast_accum=fast_accum)


def forward_matmul(x, weight):
    """(y = x W^T in x's dtype, what backward keeps) from x (M, K) and the master W (N, K), both in
    e4m3, accumulated fast. W^T of a row-major W is already column-major: no copy."""
    x8, x_inv = quantize(x, E4M3)
    w8, w_inv = quantize(weight, E4M3)
    y = scaled_mm(x8.contiguous(), w8.t(), x_inv, w_inv, x.dtype, fast_accum=True)
    return y, (x8, x_inv, w8, w_inv)


def backward_matmuls(grad_y, saved):
    """(dx, dW), both in dy's dtype, from dy (M, N) in e5m2 and the e4m3 x and W that forward kept,
    accumulated at full precision."""
    x8, x_inv, w8, w_inv = saved
    g8, g_inv = quantize(grad_y, E5M2)
    g8 = g8.contiguous()  # the upstream gradient may come strided (the backward of a sum is an expand)
    grad_x = scaled_mm(g8, column_major(w8), g_inv, w_inv, grad_y.dtype, fast_accum=False)
    grad_w = scaled_mm(g8.t().contiguous(), column_major(x8), g_inv, x_inv, grad_y.dtype, fast_accum=False)
    return grad_x, grad_w


class Float8Matmul(torch.autograd.Function):
    """x (M, K) @ W^T by the float8 recipe; backward keeps only the float8 operands and their scales."""

    @staticmethod
    def forward(ctx, x, weight):
        y, saved = forward_matmul(x, weight)
        ctx.save_for_backward(*saved)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        return backward_matmuls(grad_y, ctx.saved_tensors)


class Float8Linear(nn.Module):
    """A bias-free linear layer whose matmuls run in float8, on the weight of the layer it replaces
    (the same parameter: the same state-dict key and optimizer state). Its output has the dtype
    the replaced layer's has: autocast's under autocast (2026-01), else the input's (2026-07's
    casting gpt.Linear)."""

    def __init__(self, linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.plain_class = type(linear)

    def forward(self, x):
        device_type = x.device.type
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype
        y = Float8Matmul.apply(x.to(dtype).reshape(-1, self.in_features), self.weight)
        return y.view(*x.shape[:-1], self.out_features)

    def plain(self):
        """A layer of the replaced one's class on the same weight (built on the meta device: no memory)."""
        with torch.device("meta"):
            layer = self.plain_class(self.in_features, self.out_features, bias=False)
        layer.weight = self.weight
        return layer

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, float8 (e4m3 forward, e5m2 grads)"


def why_not(linear):
    """Why a linear layer stays as it is under --fp8, or None when it converts."""
    if linear.bias is not None:
        return "it has a bias"
    if linear.in_features % ALIGNMENT or linear.out_features % ALIGNMENT:
        return f"a width is not a multiple of {ALIGNMENT}"
    if min(linear.in_features, linear.out_features) < MIN_WIDTH:
        return f"a width is below {MIN_WIDTH}"
    return None


def trunk_linears(model):
    """[(qualified name, parent, attribute, layer)] for every nn.Linear of a GPT outside its connections."""
    wiring = {id(m) for m in model.connections.modules()}
    return [(f"{prefix}.{name}" if prefix else name, parent, name, child)
            for prefix, parent in model.named_modules() if id(parent) not in wiring
            for name, child in parent.named_children() if isinstance(child, nn.Linear) and id(child) not in wiring]


def convert(model):
    """Replace the GPT's eligible linear layers by Float8Linear, in place (before compiling; the
    optimizer may be built before or after: the parameters stay). Returns (the names converted,
    {name: why} of those kept)."""
    converted, kept = [], {}
    for qualified, parent, name, layer in trunk_linears(model):
        reason = why_not(layer)
        if reason is None:
            setattr(parent, name, Float8Linear(layer))
            converted.append(qualified)
        else:
            kept[qualified] = reason
    return converted, kept


@contextlib.contextmanager
def disabled(model):
    """Within: every Float8Linear of `model` (compiled or not) is its plain layer again, on the same
    weight; restored on the way out, an error included. A compiled model compiles a graph for the
    plain layers on first use and keeps the float8 one."""
    found = [(parent, name, child) for parent in model.modules()
             for name, child in parent.named_children() if isinstance(child, Float8Linear)]
    for parent, name, layer in found:
        setattr(parent, name, layer.plain())
    try:
        yield
    finally:
        for parent, name, layer in found:
            setattr(parent, name, layer)


def check_device(device):
    """SystemExit with one error line unless `device` is a CUDA GPU that has float8 matmuls."""
    device = torch.device(device)
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        if capability >= MIN_CAPABILITY:
            return
        where = f"{torch.cuda.get_device_name(device)} (compute capability {capability[0]}.{capability[1]})"
    else:
        where = device.type
    raise SystemExit("error: --fp8 needs a CUDA GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell); "
                     f"this run is on {where}; drop --fp8")
