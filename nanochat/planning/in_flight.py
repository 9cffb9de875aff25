"""Bytes in flight: whether a compiled kernel keeps enough global-memory loads outstanding to run
at a GPU's bandwidth (Little's law), estimated from its PTX and its resources without a GPU.

A load waits about one DRAM latency. For a GPU to stream at its bandwidth, each SM must keep
bandwidth x latency / SMs bytes requested and not yet returned. What one SM has outstanding is
its resident programs times the bytes each program has issued and not yet used:

    programs per SM   the occupancy limits (registers, shared memory, warps, blocks) and the
                      launch's programs spread over the SMs
    bytes per program the global-memory loads of one iteration of the kernel's streaming loop
                      (read from the PTX, every thread's width times 32 x num_warps threads)
                      times its pipeline depth: 1 for plain `ld.global` (a program waits for a
                      chunk's loads before it issues the next chunk's), the iterations a
                      `cp.async` / TMA pipeline keeps ahead otherwise; at most what the
                      program's registers (plain loads) and shared memory (copies) can hold

`scripts.kernel_check` shows it for every stream kernel and fails one below an H100's need on
sm_90 (an A100's on sm_80). What it ignores, and so how far to trust it: docs/kernels.md,
"Bytes in flight".
"""

import dataclasses
import math
import re

from nanochat.gpus import A100, GPU, H100, H200

# DRAM latency under load, one number for every GPU here: ~0.7 us, our assumption (unloaded
# pointer-chasing measures less on Hopper, queueing at high bandwidth adds to it); at 4.8 TB/s
# over 132 SMs it asks ~25 KB in flight per SM (docs/kernels.md, "Bytes in flight").
LATENCY_S = 700e-9

# The GPUs the check knows (nanochat/gpus.py: bandwidth, SMs, compute capability): those a
# stream kernel's binary runs on, whose estimates docs/kernels.json records by name.
GPUS = (A100, H100, H200)
# The check's GPU per target: the slowest memory that target's binary runs on (the smallest need)
CHECKED = {80: A100, 90: H100}

# Occupancy limits per SM, CUDA C++ Programming Guide, "Technical Specifications per Compute
# Capability" (8.0 and 9.0 alike unless noted): 65,536 32-bit registers, 64 resident warps,
# 32 resident blocks, shared memory up to 164 KB (8.0) / 228 KB (9.0) per SM, of which the
# driver reserves 1 KB per block ("Shared Memory" of the guide's compute capability 8.x/9.0
# sections). Registers are allocated per warp in units of 256 and each of the SM's 4
# sub-partitions holds a quarter of them (CUDA's occupancy calculator, cuda_occupancy.h:
# cudaOccMaxBlocksPerSMRegsLimit); shared memory in units of 128 bytes (its smem allocation
# granularity for 8.x and 9.0).
REGISTERS_PER_SM = 65536
REGISTER_UNIT = 256
SUB_PARTITIONS = 4
WARPS_PER_SM = 64
BLOCKS_PER_SM = 32
SHARED_PER_SM = {80: 164 * 1024, 90: 228 * 1024}
SHARED_RESERVED = 1024
SHARED_UNIT = 128


def round_up(x, unit):
    return -(-x // unit) * unit


def programs_per_sm(regs, shared, warps, programs, cc, sms):
    """(programs resident per SM, the limit that sets it) for a kernel of `regs` registers per
    thread, `shared` bytes per program (static + dynamic) and `warps` warps per program,
    launched as `programs` programs on a GPU of compute capability cc with `sms` SMs."""
    regs_per_warp = round_up(regs * 32, REGISTER_UNIT)
    warps_by_regs = (REGISTERS_PER_SM // SUB_PARTITIONS // regs_per_warp) * SUB_PARTITIONS
    limits = {
        "registers": warps_by_regs // warps,
        "shared": SHARED_PER_SM[cc] // round_up(shared + SHARED_RESERVED, SHARED_UNIT),
        "warps": WARPS_PER_SM // warps,
        "blocks": BLOCKS_PER_SM,
        "launch": math.ceil(programs / sms),  # the busiest SM's share of the first wave
    }
    which = min(limits, key=limits.get)
    return limits[which], which


# ----- the PTX -----

LABEL = re.compile(r"^\s*(\$L__BB\d+_\d+):")
BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+)\s*;")
# ld.global with any qualifiers (.nc, .L1::evict_last, ...), an optional vector count and a
# typed width: ld.global.v4.b32 is 4 x 4 bytes a thread
LOAD = re.compile(r"\bld\.global(?:\.[\w:]+)*?(?:\.v(\d))?\.[bsuf](8|16|32|64|128)\b")
# cp.async.{ca,cg}.shared{::cta}.global [dst], [src], cp-size(, src-size): cp-size bytes a thread
ASYNC_COPY = re.compile(r"\bcp\.async\.c[ag]\.shared(?:::\w+)?\.global(?:\.[\w:]+)*\s+\[[^\]]*\]\s*,\s*\[[^\]]*\]\s*,"
                        r"\s*(0x[0-9a-fA-F]+|\d+)")
COMMIT = re.compile(r"\bcp\.async\.commit_group\b")
WAIT = re.compile(r"\bcp\.async\.wait_group\s+(\d+)")
# TMA: one thread issues cp.async.bulk.tensor; the bytes the block awaits are its mbarrier's
# expect_tx count (a block's, not a thread's)
TMA_BYTES = re.compile(r"\bmbarrier\.(?:arrive\.)?expect_tx(?:\.[\w:]+)*\s+[^,]*,\s*\[[^\]]*\]\s*,\s*(\d+)")


@dataclasses.dataclass(frozen=True)
class StreamingLoads:
    """The global-memory loads of a kernel's streaming loop, per program (bytes)."""
    plain: int  # ld.global bytes one iteration issues (all of the kernel's where it has no loop)
    pipelined: int  # cp.async / TMA bytes one iteration issues
    depth: int  # iterations of `pipelined` outstanding at once
    depth_from: str  # "ptx" (cp.async.wait_group), "launch" (num_stages, TMA), "" (none pipelined)
    looped: bool  # False: the kernel has no loop, and all its loads are in flight at once

    @property
    def in_flight(self):
        """Bytes one program has outstanding: the plain loads of one iteration (it stalls on
        their first use before the next iteration issues more), and `depth` iterations of the
        pipelined ones."""
        return self.plain + self.pipelined * self.depth


def loops(lines):
    """(first, last) line of every loop: a branch back to a label above it. PTX from LLVM lays
    a loop's blocks out contiguously, header first and the back edge last."""
    labels = {}
    spans = []
    for i, line in enumerate(lines):
        label = LABEL.match(line)
        if label:
            labels[label.group(1)] = i
        branch = BRANCH.search(line)
        if branch and branch.group(1) in labels:
            spans.append((labels[branch.group(1)], i))
    return spans


def issued(lines, threads):
    """(plain, pipelined) bytes the program issues in `lines`, each instruction counted once
    whether or not its predicate (a mask) holds."""
    plain = pipelined = 0
    for line in lines:
        load = LOAD.search(line)
        if load:
            plain += int(load.group(1) or 1) * int(load.group(2)) // 8 * threads
            continue
        copy = ASYNC_COPY.search(line)
        if copy:
            pipelined += int(copy.group(1), 0) * threads
            continue
        tma = TMA_BYTES.search(line)
        if tma:
            pipelined += int(tma.group(1))
    return plain, pipelined


def async_depth(lines):
    """Iterations of cp.async copies a loop keeps outstanding: it waits until at most W commit
    groups are pending (cp.async.wait_group W), then commits its own G, so (W + G) / G
    iterations are in flight while it computes (Triton's num_stages S gives S - 1). None
    without a wait in the loop."""
    groups = sum(bool(COMMIT.search(line)) for line in lines)
    waits = [int(m.group(1)) for line in lines for m in [WAIT.search(line)] if m]
    if not waits or not groups:
        return None
    return max(1, (max(waits) + groups) // groups)


def streaming_loads(ptx, num_warps, num_stages=1):
    """StreamingLoads of a kernel from its PTX (one kernel per module, as Triton writes it).
    The streaming loop is the one whose own body (nested loops excluded) issues the most
    global-load bytes. `num_stages` (the launch's) is the depth of TMA copies, whose pipeline
    the PTX does not state as a count.

    Limits: a loop's blocks must be contiguous (LLVM's layout); predicated-off loads count as
    issued; a load in a branch taken once in a while counts every iteration; broadcast loads
    (many threads, one address) count per thread; no loop trip count is read, so a loop
    shorter than its pipeline still counts its full depth."""
    lines = ptx.splitlines()
    threads = 32 * num_warps
    spans = loops(lines)
    if not spans:
        plain, pipelined = issued(lines, threads)
        return StreamingLoads(plain, pipelined, 1, "", looped=False)

    def own(span):
        inner = [s for s in spans if s != span and span[0] <= s[0] and s[1] <= span[1]]
        return [line for i, line in enumerate(lines[span[0]:span[1] + 1], span[0])
                if not any(a <= i <= b for a, b in inner)]

    body = max((own(span) for span in spans), key=lambda b: sum(issued(b, threads)))
    plain, pipelined = issued(body, threads)
    if not pipelined:
        return StreamingLoads(plain, 0, 1, "", looped=True)
    depth = async_depth(body)
    if depth is not None:
        return StreamingLoads(plain, pipelined, depth, "ptx", looped=True)
    return StreamingLoads(plain, pipelined, max(1, num_stages - 1), "launch", looped=True)


# ----- against the need -----

def need_per_sm(gpu, latency=LATENCY_S):
    """Bytes in flight per SM that streaming at `gpu`'s bandwidth needs (Little's law)."""
    return gpu.bandwidth * latency / gpu.sms


def allowed_bandwidth(in_flight_per_sm, gpu, latency=LATENCY_S):
    """The bandwidth `in_flight_per_sm` bytes outstanding per SM sustain: min(peak, in flight x
    SMs / latency)."""
    return min(gpu.bandwidth, in_flight_per_sm * gpu.sms / latency)


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A kernel's bytes in flight per SM on one GPU, and what they allow."""
    gpu: GPU
    programs_per_sm: int
    limit: str  # what sets programs_per_sm (programs_per_sm's keys)
    per_program: int  # bytes a program has outstanding (StreamingLoads.in_flight)
    need: float  # bytes per SM the GPU's bandwidth needs (need_per_sm)

    @property
    def per_sm(self):
        return self.programs_per_sm * self.per_program

    @property
    def ratio(self):
        return self.per_sm / self.need

    @property
    def short(self):
        return self.per_sm < self.need

    @property
    def bandwidth(self):
        return allowed_bandwidth(self.per_sm, self.gpu)

    def seconds(self, nbytes):
        """Time to move `nbytes` at the bandwidth the estimate allows."""
        return nbytes / self.bandwidth

    def describe(self):
        return (f"{self.per_sm / 1024:.1f} KiB in flight per SM ({self.programs_per_sm} programs, set by "
                f"{self.limit}, x {self.per_program / 1024:.1f} KiB), under an {self.gpu.name}'s need of "
                f"{self.need / 1024:.1f} KiB ({self.gpu.bandwidth / 1e12:.2f} TB/s x {LATENCY_S * 1e9:.0f} ns / "
                f"{self.gpu.sms} SMs)")


def per_program(loads, regs, shared, warps):
    """Bytes one program can have outstanding: StreamingLoads.in_flight, where a plain load's
    bytes land in registers (at most regs x 4 bytes a thread) and a copy's in shared memory (at
    most the program's). The caps bind on a kernel without a loop (or one fully unrolled),
    whose every load the PTX lists at once."""
    return min(loads.plain, regs * 4 * 32 * warps) + min(loads.pipelined * loads.depth, shared)


def estimate(regs, shared, warps, programs, loads, cc, gpu):
    """Estimate of a kernel compiled for cc (its registers per thread, shared bytes and warps per
    program, StreamingLoads) launched as `programs` programs on `gpu`."""
    per_sm, limit = programs_per_sm(regs, shared, warps, programs, cc, gpu.sms)
    return Estimate(gpu, per_sm, limit, per_program(loads, regs, shared, warps), need_per_sm(gpu))
