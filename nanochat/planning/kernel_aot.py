"""Every Triton kernel the stream backends launch at D=12, compiled ahead of time for GPUs that
are not here: registers, spills, shared memory and programs per launch.

Triton's interpreter (the tests) proves the kernels compute the right thing, not that they
compile for a GPU, nor how they would use one. Triton compiles for a target without a device,
and its wheel carries cuobjdump, which reads the resources from the binary. So:

1. Record. Each workload (one trunk of every HC variant and option on `fused`, one layer of
   every variant on `liger`) runs forward and backward at D=12 shapes (n = 4, C = 768, a batch
   of 32 x 2048 tokens) on CPU tensors, with Triton's launch replaced by a recorder: the
   Python around the kernels (block sizes, grids, strides) runs for real, no kernel does, and
   their outputs stay uninitialized (nothing downstream depends on their values' sanity).
2. Compile each distinct launch as Triton's JIT would on the target (its own binder: the same
   argument specialization, constexprs and options) for sm_80 (A100) and sm_90 (H100, H200).
3. Read registers, stack (spilled registers) and static shared memory from the cubin
   (`cuobjdump -res-usage`), the dynamic shared memory from Triton's metadata.

4. Read the loads of each kernel's streaming loop from its PTX, and with its resources estimate
   the bytes it keeps in flight per SM (nanochat/planning/in_flight.py).

Checks (`failures`): no spills; shared memory within the target's per-block limit; every
kernel that reads or writes the streams launches at least two waves of an H100's 132 SMs and
keeps the bytes in flight per SM that an H100 (sm_90) or an A100 (sm_80) needs at its
bandwidth.
Run it without TRITON_INTERPRET (the interpreter replaces the kernels this compiles):
`python -m scripts.kernel_check`.
"""

import concurrent.futures
import contextlib
import dataclasses
import math
import os
import re
import subprocess
import tempfile
from typing import NamedTuple

import torch

from nanochat.planning import in_flight

TARGETS = (80, 90)  # compute capabilities: A100; H100 and H200
# Maximum shared memory per block, opt-in (CUDA C++ Programming Guide, "Technical
# Specifications per Compute Capability"): 163 KB on 8.0, 227 KB on 9.0.
SHARED_LIMIT = {80: 163 * 1024, 90: 227 * 1024}
H100_SMS = 132
MIN_PROGRAMS = 2 * H100_SMS  # two waves
D12 = dict(n=4, C=768, B=32, T=2048)


@dataclasses.dataclass
class Launch:
    fn: object  # the JITFunction
    args: tuple  # tensors replaced by stand_in()s
    kwargs: dict
    grid: object
    workload: str
    backend: str
    streams: bool  # a tensor argument is stream-sized (touches_streams)


@dataclasses.dataclass
class Compiled:
    name: str
    what: str  # for a seam kernel, which seam (fused.describe)
    backend: str
    workloads: list
    programs: int
    streams: bool  # reads or writes a stream-sized tensor
    resources: dict  # target -> dict(regs, spill, shared, warps, loads: in_flight.StreamingLoads)


@contextlib.contextmanager
def recording(workload, backend, launches, tma=False):
    """Within: Triton launches are recorded into `launches` instead of run, and both kernel
    backends accept CPU tensors; the seams load through TMA if `tma` (fused.set_tma)."""
    from triton.runtime.jit import JITFunction

    from nanochat.connections.backends import fused, liger
    real = JITFunction.run, fused.runs_on, liger.runs_on

    def record(self, *args, grid, warmup, **kwargs):
        launches.append(Launch(self, tuple(map(stand_in, args)), {k: stand_in(v) for k, v in kwargs.items()}, grid,
                               workload, backend, touches_streams(args)))

    JITFunction.run = record
    fused.runs_on = liger.runs_on = lambda device_type: True
    before = fused.TMA
    fused.set_tma(tma)
    try:
        yield
    finally:
        JITFunction.run, fused.runs_on, liger.runs_on = real
        fused.set_tma(before)


def stand_in(t):
    """What the JIT's specialization reads of a tensor argument (its dtype, and its address
    modulo 16) in a few bytes, so that recorded launches keep no D=12 tensor alive."""
    if not isinstance(t, torch.Tensor):
        return t
    skew = t.data_ptr() % 16 // t.element_size()
    return torch.empty(16, dtype=t.dtype)[skew:]


def touches_streams(args):
    """Whether a tensor argument has at least N x C elements (a stream, a stream gradient, a
    C-wide per-token tensor): the launches whose speed is bandwidth."""
    tokens = D12["B"] * D12["T"]
    return any(isinstance(a, torch.Tensor) and a.numel() >= tokens * D12["C"] for a in args)


def fused_workloads():
    """(label, config fields) of every distinct seam set: each wiring that runs on the fused
    seams (SPEC backends), with current and, where it takes them, delayed pre-weights, and the
    learned head (the other options launch the same kernels); each once more as the split seam
    design (current pre-weights: delayed ones launch the same split kernels but for the read
    weights' source); and KromHC's with stream checkpoints (its backward writes X_next again)."""
    from nanochat import connections
    out = []
    for name in connections.VARIANTS:
        if connections.runs_on(name, "fused"):
            out.append((f"{name}", dict(hc=name)))
            if connections.takes_option(name, "hc_pre"):
                out.append((f"{name} delayed", dict(hc=name, hc_pre="delayed")))
            out.append((f"{name} split", dict(hc=name, hc_seam="split")))
    out.append(("kromhc learned head", dict(hc="kromhc", hc_reduce="learned")))
    out.append(("kromhc learned head split", dict(hc="kromhc", hc_reduce="learned", hc_seam="split")))
    out.append(("kromhc K=2", dict(hc="kromhc", hc_stream_checkpoint=2)))
    return [Workload(label, fields) for label, fields in out] + [
        Workload(f"{label} TMA", fields, tma=True) for label, fields in out if label in TMA_WORKLOADS]


# The workloads compiled once more loading through TMA (fused.TMA, sm_90 only): both designs
# of KromHC, and the widest gates (mhc-lite's permutations, go-mHC's Cayley map)
TMA_WORKLOADS = ("kromhc", "kromhc split", "mhc_lite", "go_mhc")


class Workload(NamedTuple):
    label: str
    fields: dict  # the model's config fields
    tma: bool = False  # the seams load through TMA (compiled for targets that have it)


def liger_workloads():
    from nanochat import connections
    return [Workload(name, dict(hc=name)) for name in connections.VARIANTS if connections.runs_on(name, "liger")]


def _config(kernels, fields, n_layer):
    from nanochat.gpt import GPTConfig
    C = D12["C"]
    return GPTConfig(sequence_len=D12["T"], vocab_size=64, n_layer=n_layer, n_head=C // 128, n_kv_head=C // 128,
                     n_embd=C, hc_streams=D12["n"], hc_kernels=kernels, **fields)


def run_fused(fields):
    """A two-block trunk (entry, middle and exit seams) forward and backward at D=12."""
    from nanochat import connections
    conn = connections.build(_config("fused", fields, n_layer=2))
    conn.init_weights()
    x0 = torch.empty(D12["B"], D12["T"], D12["C"], dtype=torch.bfloat16, requires_grad=True)  # values unused
    out = conn(x0, [lambda u: u] * len(conn.layers))
    out.backward(torch.ones_like(out))


def run_liger(fields):
    """One layer forward and backward at D=12 (Liger's kernels are per layer)."""
    from nanochat import connections
    conn = connections.build(_config("liger", fields, n_layer=1))
    conn.init_weights()
    X = torch.empty(D12["B"], D12["T"], D12["n"], D12["C"], dtype=torch.bfloat16, requires_grad=True)  # values unused
    out = conn.layers[0](X, lambda u: u)
    out.backward(torch.ones_like(out))


BACKENDS = ("fused", "liger")


def record_all(backends=BACKENDS):
    launches = []
    plans = {"fused": (fused_workloads, run_fused), "liger": (liger_workloads, run_liger)}
    for backend in backends:
        workloads, run = plans[backend]
        for w in workloads():
            with recording(w.label, backend, launches, w.tma):
                run(w.fields)
    return launches


def _backend(cc):
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    target = GPUTarget("cuda", cc, 32)
    return target, CUDABackend(target)


def specialize(launch, cc):
    """What Triton's JIT would compile for this launch on compute capability cc: (source,
    options, bound arguments)."""
    from triton import knobs
    from triton.compiler import ASTSource
    from triton.runtime.jit import create_function_from_signature
    target, backend = _backend(cc)
    fn = launch.fn
    kwargs = dict(launch.kwargs, debug=launch.kwargs.get("debug", fn.debug) or knobs.runtime.debug)
    if hasattr(knobs.compilation, "instrumentation_mode"):  # Triton >= 3.6's JIT passes it; 3.5's has none
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return target, ASTSource(fn, signature, constexprs, attrs), options, bound


def launch_key(launch):
    """What tells two launches' binaries apart: the source as specialized, and the options."""
    _, src, options, _ = specialize(launch, TARGETS[-1])
    return src.hash() + str(options)


def cuobjdump():
    import triton
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def resources(launch, cc):
    """dict(regs, spill, shared, warps, loads) of the launch's kernel compiled for cc: spill =
    the stack frame ptxas gave it (where spilled registers go), shared = static + dynamic
    bytes, loads = its streaming loop's (in_flight.streaming_loads of the PTX)."""
    import triton
    target, src, options, _ = specialize(launch, cc)
    kernel = triton.compile(src, target=target, options=options.__dict__)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        usage = subprocess.run([cuobjdump(), "-res-usage", path], capture_output=True, text=True, check=True).stdout
    found = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage.split("Function", 1)[1]))
    warps = kernel.metadata.num_warps
    return dict(regs=int(found["REG"]), spill=int(found["STACK"]) + int(found["LOCAL"]),
                shared=int(found["SHARED"]) + kernel.metadata.shared, warps=warps,
                loads=in_flight.streaming_loads(kernel.asm["ptx"], warps, kernel.metadata.num_stages))


def programs(launch):
    _, _, _, bound = specialize(launch, TARGETS[-1])
    grid = launch.grid(bound) if callable(launch.grid) else launch.grid
    return math.prod(grid)


def compile_all(launches, targets=TARGETS, workers=None):
    """[Compiled] for the distinct launches, in the order first recorded, each compiled for
    every compute capability of `targets`. Compiles run in threads (`workers`, default: the
    CPUs): most of a compile is ptxas, a process of its own."""
    groups = {}
    for launch in launches:
        groups.setdefault(launch_key(launch), []).append(launch)
    firsts = [same[0] for same in groups.values()]
    jobs = [(i, cc) for i in range(len(firsts)) for cc in compiled_for(firsts[i], targets)]
    with concurrent.futures.ThreadPoolExecutor(workers or os.cpu_count()) as pool:
        found = dict(zip(jobs, pool.map(lambda job: resources(firsts[job[0]], job[1]), jobs)))
    return [Compiled(first.fn.__name__, describe(first), first.backend, sorted({l.workload for l in same}),
                     programs(first), first.streams, {cc: found[i, cc] for cc in compiled_for(first, targets)})
            for i, (first, same) in enumerate(zip(firsts, groups.values()))]


def compiled_for(launch, targets):
    """The targets a launch is compiled for: a seam kernel that loads through TMA only those
    that have it (elsewhere the kernels never launch it: fused.uses_tma)."""
    from nanochat.connections.backends import fused
    return [cc for cc in targets if not launch.kwargs.get("TMA") or fused.has_tma(cc // 10)]


def describe(launch):
    """A seam kernel's switches in words (fused.Seam.describe); '' for any other kernel."""
    from nanochat.connections.backends import fused
    if launch.backend != "fused" or not launch.fn.__name__.startswith("seam_"):
        return ""
    return fused.describe(launch.kwargs)


def estimate(k, cc, gpu=None):
    """in_flight.Estimate of compiled kernel k's binary for cc on `gpu` (default: the one the
    check holds cc to, in_flight.CHECKED)."""
    r = k.resources[cc]
    return in_flight.estimate(r["regs"], r["shared"], r["warps"], k.programs, r["loads"], cc,
                              gpu or in_flight.CHECKED[cc])


def record(k):
    """A compiled kernel as JSON (`scripts.kernel_check --json`): who launches it, its resources
    per target, and the bandwidth its bytes in flight allow on each GPU of in_flight.GPUS that
    runs a target it was compiled for (`scripts.bench --traffic` prices its bytes at that)."""
    targets = {}
    for cc, r in k.resources.items():
        e = estimate(k, cc)
        targets[str(cc)] = dict(regs=r["regs"], spill=r["spill"], shared=r["shared"], warps=r["warps"],
                                programs_per_sm=e.programs_per_sm, in_flight_per_program=e.per_program)
    # one that moves no stream-sized tensor (a hand-over, a table) is not held to the estimate,
    # whose streaming loop it lacks: kernel_check checks stream kernels only; its peak
    allows = {g.name: estimate(k, g.cc, g).bandwidth if k.streams else g.bandwidth
              for g in in_flight.GPUS if g.cc in k.resources}
    return dict(backend=k.backend, name=k.name, what=k.what, workloads=k.workloads, programs=k.programs,
                streams=k.streams, targets=targets, allows_bytes_per_s=allows)


def failures(compiled):
    """One line per violated check."""
    out = []
    for k in compiled:
        for cc, r in k.resources.items():
            if r["spill"]:
                out.append(f"{k.backend} {k.name} ({k.what or 'as launched'}) spills {r['spill']} bytes on sm_{cc}")
            if r["shared"] > SHARED_LIMIT[cc]:
                out.append(f"{k.backend} {k.name} needs {r['shared']} bytes of shared memory, over sm_{cc}'s "
                           f"{SHARED_LIMIT[cc]}")
        if k.streams and k.programs < MIN_PROGRAMS:
            out.append(f"{k.backend} {k.name} launches {k.programs} programs at D=12, under two waves of an H100 "
                       f"({MIN_PROGRAMS})")
        for cc in k.resources if k.streams else ():
            e = estimate(k, cc)
            if e.short:
                out.append(f"{k.backend} {k.name} ({k.what or 'as launched'}) on sm_{cc}: {e.describe()}")
    return out


def middle_seams(tiling, workload=("kromhc", dict(hc="kromhc")), targets=(90,)):
    """[Compiled] of a middle seam's forward and backward (post mix > gates) of a D=12 trunk at
    `tiling` (fused.set_tiling's arguments: tokens, warps, forward and backward chunk), for
    comparing tilings; the tiling in force before is restored."""
    from nanochat.connections.backends import fused
    before = fused.tiling()
    launches = []
    fused.set_tiling(*tiling)
    try:
        with recording(workload[0], "fused", launches):
            run_fused(workload[1])
    finally:
        fused.set_tiling(*before)
    middle = [launch for launch in launches if describe(launch).startswith("post > gates")]
    return compile_all(middle, targets)
