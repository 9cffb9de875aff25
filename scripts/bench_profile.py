"""Where a benchmark case spends its step (scripts.bench --profile K): one more step of each
case under torch.profiler, after its timing, and the K kernels (CUDA) or ops (CPU) with the
most self time, with their calls and share of the step. On a GPU that names the kernel a
ratio comes from: a connection step that costs several times the residual one shows which
generated kernel (and so which op of the connection code) holds the time.

Self device time is what the kernels ran on the GPU; on a CPU, self CPU time of the ops (the
profiler has no kernels there), which is a check that the profile runs rather than a
measurement of anything a GPU does."""

import torch

from nanochat.common import text_table


def top_ops(step, device, count, synchronize):
    """[{name, calls, ms, share}] of the `count` kernels or ops with the most self time in one
    call of `step` (already compiled and warmed up by the timing), largest first."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize(device)
    with profile(activities=activities) as prof:
        step()
        synchronize(device)
    # CUDA kernels carry self device time, CPU ops self CPU time (microseconds)
    field = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    timed = sorted(((getattr(e, field), e) for e in prof.key_averages() if getattr(e, field) > 0),
                   key=lambda te: -te[0])
    total = sum(t for t, _ in timed)
    return [{"name": e.key, "calls": e.count, "ms": t / 1e3, "share": t / total} for t, e in timed[:count]]


def print_profile(rows, width=80):
    """One table: each row's top kernels, the row's label on its first line."""
    lines = []
    for row in rows:
        for i, op in enumerate(row.get("top_kernels") or []):
            name = op["name"] if len(op["name"]) <= width else op["name"][:width - 3] + "..."
            lines.append([row["label"] if i == 0 else "", name, str(op["calls"]), f"{op['ms']:.3f}",
                          f"{100 * op['share']:.0f}%"])
    if lines:
        print("\nwhere one step's time goes (self time per kernel; op on the CPU)")
        print(text_table(["variant", "kernel", "calls", "ms", "share"], lines))
