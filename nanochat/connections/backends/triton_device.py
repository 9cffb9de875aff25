"""Where the Triton stream backends (`hc_kernels` liger and fused) run: on CUDA tensors, or on
any tensors under Triton's interpreter (TRITON_INTERPRET=1: the tests run the kernels on CPU)."""

import os


def runs_on(device_type):
    return device_type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def check(X, backend, runs_on=runs_on):
    """One error naming the fix when `backend`'s kernels cannot run on X's device (`runs_on`:
    the backend module's own, which tools replace to record launches on CPU tensors)."""
    if not runs_on(X.device.type):
        raise RuntimeError(f"hc_kernels='{backend}' runs Triton kernels on CUDA tensors, got {X.device.type} ones: use "
                           f"hc_kernels='torch' or 'auto' on this device (TRITON_INTERPRET=1 runs them on CPU, slowly)")
