"""The measurements committed with the code, and the one place that reads them.

    docs/gpu_check.json, docs/gpu_check_fused.json   `python -m scripts.gpu_check`, one GPU
        session each: its "env" (device_name), its "model" rows (one per depth and variant, the
        torch backend) and its "kernels" rows (the layer and the whole model per variant and
        backend, with the step as a multiple of residual's)
    docs/kernels.json                                `python -m scripts.kernel_check --json`:
        every compiled stream kernel and the bandwidth its bytes in flight allow per GPU

Read by `hc_kernels = auto` (`step_ratios`, `on_gpu`), the plan (`read`, `device`, `model_rows`,
`kernel_rows`: a gpu_check file, the committed one or the user's; also a run's summary.json) and
the traffic model (`residual_step`, `kernels`). The records of
scripts.bench --traffic (docs/traffic.json) and scripts.bench_seams (docs/bench_seams.json) are
kept as the measurements docs/ cites; no code reads them.

A file that is absent (an installed copy carries no docs/) or unreadable gives nothing, except
where a caller asks for a value only a file holds (`residual_step`). Which GPU a record is of is
its env's device_name, compared by nanochat.gpus.same_gpu. Nothing of nanochat but gpus is
imported here (the connections' `auto` reads it).
"""

import json
from pathlib import Path

from nanochat.gpus import same_gpu

REPO = Path(__file__).resolve().parents[1]
GPU_CHECKS = ("docs/gpu_check.json", "docs/gpu_check_fused.json")
GPU_CHECK = REPO / GPU_CHECKS[0]  # the plan's committed measurement; the traffic model's residual step
KERNELS = REPO / "docs" / "kernels.json"


def read(path, root=None):
    """A JSON file's content (path relative to root where one is given), or None where it is
    absent or not JSON."""
    try:
        return json.loads((Path(path) if root is None else Path(root) / path).read_text())
    except (OSError, ValueError):
        return None


def device(record):
    """The device_name a gpu_check record's env gives, or None."""
    env = record.get("env") if isinstance(record, dict) else None
    name = env.get("device_name") if isinstance(env, dict) else None
    return name if isinstance(name, str) else None


def model_rows(record):
    """A gpu_check record's "model" rows (dicts)."""
    return [r for r in (record.get("model") or []) if isinstance(r, dict)]


def kernel_rows(record):
    """A gpu_check record's "kernels" rows (dicts)."""
    kernels = record.get("kernels")
    return [r for r in (kernels.get("rows") or [] if isinstance(kernels, dict) else []) if isinstance(r, dict)]


def step_ratios(paths=GPU_CHECKS, root=REPO):
    """{(device name, variant, backend): the fastest step measured, x residual's}, over the
    kernels rows of every gpu_check file (absent or unreadable files give nothing)."""
    found = {}
    for path in paths:
        record = read(path, root)
        name = device(record)
        for row in kernel_rows(record) if isinstance(record, dict) else ():
            ratio = row.get("time_vs_residual")
            if not name or not ratio or row.get("variant") in (None, "residual"):
                continue
            key = (name, row["variant"], row.get("kernels", "torch"))
            found[key] = min(ratio, found.get(key, ratio))
    return found


def on_gpu(steps, device_name, variant, backends):
    """{backend: ratio} of `steps` (step_ratios) for `variant` on the GPU `device_name` (same_gpu
    with the measured device's name), among `backends`."""
    found = {}
    for (name, v, backend), ratio in steps.items():
        if v == variant and backend in backends and device_name and same_gpu(device_name, name):
            found[backend] = min(ratio, found.get(backend, ratio))
    return found


def residual_step(path=GPU_CHECK, depth=12):
    """(ms, device name) of the residual baseline's step at `depth` in a gpu_check file: its model
    section's row, or its kernels section's whole-model baseline. Raises where the file or the
    row is missing."""
    with open(path) as f:
        record = json.load(f)
    rows = [r for r in model_rows(record) if r["label"] == "residual" and r["depth"] == depth]
    rows += [r for r in kernel_rows(record) if r.get("run") == f"model D{depth}" and r["variant"] == "residual"
             and "median_ms" in r]
    return rows[0]["median_ms"], record["env"]["device_name"]


def kernels(path=KERNELS):
    """The kernels of a `scripts.kernel_check --json` file (docs/kernels.json), or None where there
    is none."""
    record = read(path)
    return None if record is None else record["kernels"]
