"""The stream backends: the code that runs the wirings' stream work (`--hc-kernels`), apart
from the wirings themselves (the modules of the package above, one per wiring).

    ops             the `torch` backend and the choice between backends (KERNELS, backend)
    liger           Liger-Kernel's Triton kernels, layer by layer
    fused           our own Triton seams, fused across the boundary between two sub-layers
    fused_kernels   their Triton code (imported on first use: Triton is an optional extra)
    triton_device   where a Triton backend can run (CUDA, or CPU under TRITON_INTERPRET=1)
    custom_ops      torch.library custom ops under the versions of torch we support

docs/kernels.md says what each computes and what each costs.
"""
