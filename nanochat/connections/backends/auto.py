"""`hc_kernels = auto`: the stream backend a training run takes, from what a GPU has measured.

A backend is chosen only where the project's committed measurements (docs/gpu_check*.json,
written by `python -m scripts.gpu_check`: the D=12 step of each variant and backend as a
multiple of the residual baseline's, timed in one process on one GPU) have timed it against
the `torch` path for the same variant on the same GPU (nanochat/measurements.py reads them,
nanochat/gpus.py's `same_gpu` tells the GPU): then the faster one. Anywhere
else (another GPU, a variant or backend nothing measured, the files absent in an installed
copy) it is `torch`, the path every test holds the others to, and the run says so in one line.
A backend that cannot run here (not installed, or not declared by the wiring) is never chosen.

Why measurements and not the byte counts: the counts predicted the fused seams at 1.07x
residual's step where an H200 measured 1.58x (docs/kernels.md); only a GPU knows.
"""

import dataclasses
from typing import NamedTuple

from nanochat import measurements

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


def measured_steps(paths=None, root=measurements.REPO):
    """{(device name, variant, backend): the fastest step measured, x residual's}, over every
    measurement file (absent or unreadable files give nothing): measurements.step_ratios."""
    return measurements.step_ratios(paths or measurements.GPU_CHECKS, root)


def choose(variant, device_name, runnable, steps=None):
    """The backend for `variant` on the GPU `device_name` (None: no GPU) among `runnable` (the
    backends that can run it here, "torch" among them), and the line saying why."""
    steps = measured_steps() if steps is None else steps
    here = measurements.on_gpu(steps, device_name, variant, runnable)
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


def choose_design(variant, device_name, steps=None):
    """The fused seams' design (a PATHS name, "fused" or "fused-split") for `variant` on the
    GPU `device_name` when the backend is given and the design is not: the faster of the two
    where both were measured there, else the one-pass design, and the line saying why."""
    steps = measured_steps() if steps is None else steps
    here = measurements.on_gpu(steps, device_name, variant, ("fused", "fused-split"))
    if len(here) < 2:
        return Choice("fused", f"hc_seam auto: onepass, as no GPU measurement compares the two designs for {variant} "
                               f"on {device_name or 'this device'}")
    best = min(here, key=here.get)
    return Choice(best, f"hc_seam auto: {fields(best)['hc_seam']} for {variant} on {device_name}, measured "
                        f"{here[best]:.2f}x residual's step (the other design {max(here.values()):.2f}x)")


def resolve(config, device, device_name):
    """(config with hc_kernels and hc_seam decided, the line to log or None) for a run on
    `device` (a GPU named `device_name`): the stream path where hc_kernels is auto, among those
    of the user's hc_seam where it is given; the design where only hc_seam is auto. Stream
    checkpoints (hc_stream_checkpoint) are the fused seams' own: on another backend the run
    keeps every stream, and says so."""
    gpu = device_name if device.type == "cuda" else None
    if config.hc_kernels != "auto":
        if config.hc_seam != "auto":
            return config, None
        if config.hc_kernels != "fused":  # the design is the fused seams' only
            return dataclasses.replace(config, hc_seam="onepass"), None
        choice = choose_design(config.hc, gpu)
        return dataclasses.replace(config, **fields(choice.backend)), choice.note
    candidates = runnable(config, device.type)
    if config.hc_seam != "auto":  # the user's design: the paths of other designs are not candidates
        candidates = [c for c in candidates if fields(c).get("hc_seam", config.hc_seam) == config.hc_seam]
    if candidates == ["torch"] and not config.hc_streams > 1:  # a single-state wiring: nothing to choose
        return dataclasses.replace(config, hc_kernels="torch", hc_seam=_design(config)), None
    choice = choose(config.hc, gpu, candidates)
    note = choice.note
    K = config.hc_stream_checkpoint
    if K > 1 and fields(choice.backend)["hc_kernels"] != "fused":
        note += f"; --hc-stream-checkpoint {K} applies to the fused seams only: every stream kept"
        K = 1
    chosen = dict(hc_seam=_design(config)) | fields(choice.backend)
    return dataclasses.replace(config, **chosen, hc_stream_checkpoint=K), note


def _design(config):
    """The design a run keeps where no path decides it: the user's, else the one-pass design."""
    return "onepass" if config.hc_seam == "auto" else config.hc_seam
