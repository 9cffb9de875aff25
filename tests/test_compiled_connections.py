"""The compiled connection path through Inductor (the code CUDA runs, generated here for
the CPU): the projection reads bf16 streams without writing an fp32 copy of them, and the
compiled backward keeps the coefficient path in fp32 (its gradients agree with eager)."""

import re

import pytest
import torch
import torch._dynamo
from torch._inductor.utils import run_and_get_code

from nanochat.connections.ops import project
from test_connections import build_layer, randomize, random_streams


def test_compiled_projection_writes_no_fp32_copy_of_the_streams():
    N, D, k = 64, 256, 12
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=gen).bfloat16()
    w = torch.randn(D, k, generator=gen)
    torch._dynamo.reset()
    (xw, ss), codes = run_and_get_code(torch.compile(project, dynamic=False), x, w)
    buffers = re.findall(r"empty_strided_\w+\(\(([\d, ]+)\), \([\d, ]*\), torch\.(\w+)\)", "\n".join(codes))
    assert buffers, "no buffers found: the pattern no longer matches Inductor's output code"
    assert ("64, 256", "float32") not in buffers, buffers
    # fp32 products and sums of the bf16 values: the fp32 matmul's result up to summation order
    xf = x.float()
    torch.testing.assert_close(xw, xf @ w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ss, xf.square().mean(-1, keepdim=True), rtol=1e-6, atol=0)


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
