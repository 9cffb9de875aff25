"""`hc_kernels = auto`: the stream backend a training run takes, from what a GPU has measured.

A backend is chosen only where the project's committed measurements (docs/gpu_check*.json,
written by `python -m scripts.gpu_check`: the D=12 step of each variant and backend as a
multiple of the residual baseline's, timed in one process on one GPU) have timed it against
the `torch` path for the same variant on a GPU of the same name: then the faster one. Anywhere
else (another GPU, a variant or backend nothing measured, the files absent in an installed
copy) it is `torch`, the path every test holds the others to, and the run says so in one line.
A backend that cannot run here (not installed, or not declared by the wiring) is never chosen.

Why measurements and not the byte counts: the counts predicted the fused seams at 1.07x
residual's step where an H200 measured 1.58x (docs/kernels.md); only a GPU knows.
"""

import dataclasses
import json
import os
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# The committed measurements: scripts.gpu_check's output, one file per GPU session.
MEASUREMENTS = ("docs/gpu_check.json", "docs/gpu_check_fused.json")


# A stream path: a backend, and for the fused seams their design (fused.DESIGNS): what a
# measurement names in its "kernels" column and what `auto` chooses among.
PATHS = {"torch": dict(hc_kernels="torch"), "liger": dict(hc_kernels="liger"),
         "fused": dict(hc_kernels="fused", hc_seam="onepass"), "fused-split": dict(hc_kernels="fused", hc_seam="split")}


def fields(path):
    """The config fields of a stream path (PATHS)."""
    return PATHS[path]


class Choice(NamedTuple):
    backend: str
    note: str  # the one line a run logs


def measured_steps(paths=None, root=ROOT):
    """{(device name, variant, backend): the fastest step measured, x residual's}, over every
    measurement file (absent or unreadable files give nothing)."""
    found = {}
    for path in paths or MEASUREMENTS:
        try:
            with open(os.path.join(root, path)) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        device = record.get("env", {}).get("device_name")
        for row in record.get("kernels", {}).get("rows", []):
            ratio = row.get("time_vs_residual")
            if not device or not ratio or row.get("variant") in (None, "residual"):
                continue
            key = (device, row["variant"], row.get("kernels", "torch"))
            found[key] = min(ratio, found.get(key, ratio))
    return found


def choose(variant, device_name, runnable, steps=None):
    """The backend for `variant` on the GPU `device_name` (None: no GPU) among `runnable` (the
    backends that can run it here, "torch" among them), and the line saying why."""
    steps = measured_steps() if steps is None else steps
    here = {backend: steps[(device_name, variant, backend)] for backend in runnable
            if (device_name, variant, backend) in steps}
    if device_name is None:
        return Choice("torch", "hc_kernels auto: torch (the kernel backends run on CUDA only)")
    if "torch" not in here or len(here) < 2:
        what = ", ".join(f"{b} {r:.2f}x" for b, r in sorted(here.items())) or "nothing"
        return Choice("torch", f"hc_kernels auto: torch, as no GPU measurement compares a kernel backend with it "
                               f"for {variant} on {device_name} (measured: {what}; docs/kernels.md says how to "
                               "measure one)")
    best = min(here, key=here.get)
    others = ", ".join(f"{b} {r:.2f}x" for b, r in sorted(here.items()) if b != best)
    return Choice(best, f"hc_kernels auto: {best} for {variant} on {device_name}, measured {here[best]:.2f}x "
                        f"residual's step (against {others}; docs/gpu_measured.md)")


def runnable(config, device_type):
    """The stream paths (PATHS) that can train `config`'s wiring on `device_type`: torch always;
    a kernel backend where the wiring declares it (SPEC backends), it is installed and runs on
    the device (CUDA, or the CPU under Triton's interpreter), and for Liger's kernels n a power
    of two; the fused seams in both designs."""
    from nanochat import connections
    from nanochat.connections.backends import fused, liger
    found = ["torch"]
    n = config.hc_streams
    for name, module in (("liger", liger), ("fused", fused)):
        if (connections.runs_on(config.hc, name) and module.AVAILABLE and module.runs_on(device_type)
                and n > 1 and (name != "liger" or not n & (n - 1))):
            found.append(name)
    return found + (["fused-split"] if "fused" in found else [])


def resolve(config, device, device_name):
    """(config with hc_kernels decided, the line to log or None) for a run whose hc_kernels is
    auto on `device` (a GPU named `device_name`). Stream checkpoints (hc_stream_checkpoint) are
    the fused seams' own: on another backend the run keeps every stream, and says so."""
    if config.hc_kernels != "auto":
        return config, None
    candidates = runnable(config, device.type)
    if candidates == ["torch"] and not config.hc_streams > 1:
        return dataclasses.replace(config, hc_kernels="torch"), None  # a single-state wiring: nothing to choose
    choice = choose(config.hc, device_name if device.type == "cuda" else None, candidates)
    note = choice.note
    K = config.hc_stream_checkpoint
    if K > 1 and fields(choice.backend)["hc_kernels"] != "fused":
        note += f"; --hc-stream-checkpoint {K} applies to the fused seams only: every stream kept"
        K = 1
    return dataclasses.replace(config, **fields(choice.backend), hc_stream_checkpoint=K), note
