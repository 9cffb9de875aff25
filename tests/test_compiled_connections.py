"""The compiled connection path through Inductor (the code CUDA runs, generated here for
the CPU): the projection and its gradients are one custom op each way, and the compiled
backward keeps the coefficient path in fp32 (its gradients agree with eager)."""

import re

import pytest
import torch
import torch._dynamo
from torch._inductor.utils import run_and_get_code

from nanochat.connections.backends.ops import project
from test_connections import build_layer, randomize, random_streams


def test_compiled_projection_is_one_opaque_call_each_way():
    """Compiled, x @ w is the nanochat::project op and its gradients nanochat::project_backward,
    in Inductor's code as calls rather than kernels Inductor writes for them: on an H200 its
    reductions for the multiply-and-sum form (over n*C per token; over every token for the
    gradient of w) ran at a few hundred threads and made KromHC's D=12 step 3.4x residual's
    (docs/gpu_measured.md)."""
    N, D, k = 64, 256, 12
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=gen).bfloat16().requires_grad_()
    w = torch.randn(D, k, generator=gen).requires_grad_()
    compiled = torch.compile(project, dynamic=False)

    def step():
        xw, ss = compiled(x, w)
        (xw.square().sum() + ss.sum()).backward()
        return xw, ss
    torch._dynamo.reset()
    (xw, ss), codes = run_and_get_code(step)
    assert len(codes) == 2, "expected a forward and a backward graph"
    forward, backward = codes
    assert "nanochat.project.default" in forward and "nanochat.project_backward.default" in backward
    xf = x.detach().float()
    torch.testing.assert_close(xw, xf @ w.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ss, xf.square().mean(-1, keepdim=True), rtol=1e-6, atol=0)
    g_xw = 2 * (xf @ w.detach())
    torch.testing.assert_close(w.grad, xf.t() @ g_xw, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(x.grad.float(), (g_xw @ w.detach().t() + 2 * xf / D).bfloat16().float())


@pytest.mark.parametrize("variant", ["kromhc"])
def test_compiled_backward_keeps_fp32_coefficients(variant):
    """One layer under bf16 autocast, gradient of W compiled vs eager: within 1e-4 in
    relative norm. Were the backward traced under the forward's autocast, the coefficient
    matmuls would run in bf16 there and the two would differ by ~2e-3."""
    n, C = 4, 256
    layer = randomize(build_layer(variant, n, C=C), 7)
    X = random_streams(n, C=C, B=2, T=64, dtype=torch.bfloat16).requires_grad_()
    gen = torch.Generator().manual_seed(8)
    M = torch.randn(C, C, generator=gen) / C ** 0.5
    R = torch.randn(2, 64, n, C, generator=gen)

    def grad_w(fn):
        layer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fn(X, lambda u: u @ M, None)
        (out.float() * R).sum().backward()
        return layer.weight.grad.double().clone()

    eager = grad_w(layer)
    torch._dynamo.reset()
    compiled = grad_w(torch.compile(layer, dynamic=False))
    assert ((compiled - eager).norm() / eager.norm()).item() < 1e-4
