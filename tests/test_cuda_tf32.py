"""The fp32 coefficient path stays exact where cuBLAS would run fp32 matmuls in TF32.

Training sets torch.set_float32_matmul_precision("high"), so on a GPU an fp32 matmul may
round its operands to TF32 (10 mantissa bits). The CPU has no TF32: `TF32Matmuls` emulates
it, rounding the fp32 operands of every matmul-family op to 10 mantissa bits, as the tensor
cores would. Under it, H_res of mHC-lite, KromHC and C-mHC must stay doubly stochastic to fp32
rounding (the property the paper measures in its Figure 2), and the diagnostics' stream
Gram must be the fp64 one."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nanochat.connections.cmhc import CirculantLayer
from nanochat.connections.diagnostics import ds_errors, record_state
from nanochat.connections.kromhc import KromHCLayer
from nanochat.connections.mhc_lite import MHCLiteLayer

aten = torch.ops.aten
MATMULS = {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default}


def tf32_round(x):
    """fp32 -> the nearest TF32 value (10-bit mantissa, ties to even), kept in fp32."""
    bits = x.view(torch.int32)
    bits = (bits + 0x0FFF + ((bits >> 13) & 1)) & ~0x1FFF
    return bits.view(torch.float32)


class TF32Matmuls(TorchDispatchMode):
    """fp32 matmuls with TF32 operands; counts them."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in MATMULS:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if any(t.dtype == torch.float32 for t in tensors):
                self.count += 1
                args = tuple(tf32_round(a.contiguous()) if isinstance(a, torch.Tensor) and a.dtype == torch.float32
                             else a for a in args)
        return func(*args, **(kwargs or {}))


def test_the_emulation_rounds_as_tf32():
    x = torch.tensor([1.0, 1.0 + 2**-11, 1.0 + 3 * 2**-11, 1.0 + 2**-10, 3.0e-4])
    assert tf32_round(x).tolist() == [1.0, 1.0, 1.0 + 2**-9, 1.0 + 2**-10, tf32_round(torch.tensor(3.0e-4)).item()]
    with TF32Matmuls() as mode:
        y = torch.tensor([[1.0 + 2**-12]]) @ torch.tensor([[1.0]])
    assert mode.count == 1 and y.item() == 1.0  # the low bits are gone


def layers():
    torch.manual_seed(0)
    return {"mhc_lite n=4": MHCLiteLayer(0, 4, 8), "kromhc 2x2": KromHCLayer(0, 4, 8, [2, 2]),
            "kromhc 2x2x2": KromHCLayer(0, 8, 8, [2, 2, 2]), "kromhc 3x2": KromHCLayer(0, 6, 8, [3, 2]),
            "cmhc n=4": CirculantLayer(0, 4, 8, gamma=1 / 6)}


@pytest.mark.parametrize("name", list(layers()))
def test_h_res_is_doubly_stochastic_under_tf32(name):
    """At init (softmax weights ~[1, 3e-4, ...]) and away from it: row and column sums of
    H_res are 1 to fp32 rounding, with the matmuls' operands in TF32. With H_res built as
    `softmax @ perms` the sums were off by ~1e-4."""
    layer = layers()[name]
    layer.init_weights()
    logits = layer.res_bias_init() + torch.cat([torch.zeros(1, layer.res_bias_init().numel()),
                                                torch.randn(63, layer.res_bias_init().numel())])
    with TF32Matmuls():
        h = layer.h_res(logits)
    errors = ds_errors(h)
    assert errors["row_err"] < 1e-6 and errors["col_err"] < 1e-6 and errors["min_entry"] >= 0, errors


def test_the_stream_gram_does_not_round_to_tf32():
    torch.manual_seed(0)
    X = torch.randn(4, 3, 4, 64)
    store = {}
    with TF32Matmuls():
        record_state(store, X)
    exact = X.double() @ X.double().transpose(-1, -2)
    assert torch.allclose(store["gram"].double(), exact, rtol=1e-12, atol=1e-12)
