"""nanochat/planning/kernel_aot.py, behind `scripts.kernel_check` (which CI runs on every kernel at D=12):
its checks, and a real ahead-of-time compile for sm_90 without a GPU of a kernel that fits its
registers and one that cannot, read back from the binary."""

import os
import sys
import textwrap

import launch
import pytest

from nanochat.planning import kernel_aot

pytest.importorskip("triton", reason="needs the kernels extra: pip install -e '.[kernels]'")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compiled(programs=1000, streams=True, regs=64, spill=0, shared=0, warps=4, loaded=16384):
    from nanochat.planning import in_flight
    loads = in_flight.StreamingLoads(loaded, 0, 1, "", looped=True)
    return kernel_aot.Compiled("seam_forward", "entry", "fused", ["kromhc"], programs, streams,
                               {cc: dict(regs=regs, spill=spill, shared=shared, warps=warps, loads=loads)
                                for cc in kernel_aot.TARGETS})


def test_checks_pass_a_kernel_within_every_limit():
    assert kernel_aot.failures([compiled(), compiled(programs=10, streams=False, loaded=0)]) == []


@pytest.mark.parametrize("case, expect", [
    (dict(spill=16), "spills 16 bytes on sm_80"),
    (dict(shared=200 * 1024), "over sm_80's 166912"),
    (dict(programs=263), "launches 263 programs at D=12, under two waves of an H100 (264)"),
    # two programs of 255 registers x 6 KiB: 12 KiB per SM, under an A100's 12.7 and an H100's 17.3
    (dict(regs=255, loaded=6144), "(entry) on sm_80: 12.0 KiB in flight per SM"),
    (dict(regs=255, loaded=6144), "under an H100's need of 17.3 KiB"),
])
def test_checks_name_each_violation(case, expect):
    lines = kernel_aot.failures([compiled(**case)])
    assert any(expect in line for line in lines), lines


def test_a_record_gives_each_gpu_the_bandwidth_its_bytes_in_flight_allow():
    """kernel_check --json: per target the resources and the estimate; per GPU of its targets
    what the estimate allows. Two programs of 255 registers x 6 KiB: 12 KiB per SM, 2.26 TB/s
    over an H100's or H200's 132 SMs at 700 ns, 1.85 over an A100's 108; 8 KiB programs at 64
    registers: 8 per SM, over every GPU's need, which each then allows its peak."""
    import json
    from nanochat.planning import in_flight
    short = json.loads(json.dumps(kernel_aot.record(compiled(regs=255, loaded=6144))))
    assert short["targets"]["90"] == dict(regs=255, spill=0, shared=0, warps=4, programs_per_sm=2,
                                          in_flight_per_program=6144)
    sms = {g.name: g.sms for g in in_flight.GPUS}
    assert short["allows_bytes_per_s"] == pytest.approx({g: 12288 * sms[g] / 700e-9 for g in ("A100", "H100", "H200")})
    fast = kernel_aot.record(compiled(loaded=8192))
    assert fast["allows_bytes_per_s"] == {g.name: g.bandwidth for g in in_flight.GPUS}
    # a kernel that moves no stream (a hand-over) is not held to the estimate: its peak
    hand_over = kernel_aot.record(compiled(streams=False, regs=255, loaded=0))
    assert hand_over["allows_bytes_per_s"] == {g.name: g.bandwidth for g in in_flight.GPUS}
    assert (fast["name"], fast["what"], fast["workloads"]) == ("seam_forward", "entry", ["kromhc"])


def test_touches_streams_means_at_least_a_d12_stream():
    import torch
    tokens = kernel_aot.D12["B"] * kernel_aot.D12["T"]
    small = torch.empty(1).expand(tokens * kernel_aot.D12["C"] - 1)
    big = torch.empty(1).expand(tokens * kernel_aot.D12["C"])
    assert not kernel_aot.touches_streams((small, 3)) and kernel_aot.touches_streams((big,))


# Compiled in a process of its own: the suite runs Triton's interpreter, which replaces kernels
# with Python (conftest.py), and a compile needs Triton's real JIT.
COMPILE = textwrap.dedent("""
    import torch, triton, triton.language as tl
    from nanochat.planning import kernel_aot
    from nanochat.connections.backends import fused_kernels as fk

    @triton.jit
    def copy(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < N), mask=i < N)

    @triton.jit
    def crowded(x_ptr, y_ptr, BLOCK: tl.constexpr):
        # a 64 x 64 tile per warp-sized program, capped at 32 registers a thread: it must spill
        r = tl.arange(0, BLOCK)
        a = tl.load(x_ptr + r[:, None] * BLOCK + r[None, :])
        tl.store(y_ptr + r[:, None] * BLOCK + r[None, :], tl.dot(a, a) + tl.cumsum(a, 1))

    @triton.jit
    def boxes(x_ptr, y_ptr, N, C: tl.constexpr, TMA: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
        # the seams' stream loads into a product: the second of two streams, chunk by chunk
        t0 = tl.program_id(0) * BLOCK_T
        row = t0 + tl.arange(0, BLOCK_T)
        k = tl.arange(0, BLOCK_C)
        w = tl.load(y_ptr + k[:, None] * BLOCK_C + k[None, :])
        src = fk._stream_source(x_ptr, N, C, 2, TMA, BLOCK_T, BLOCK_C)
        acc = tl.zeros((BLOCK_T, BLOCK_C), tl.float32)
        for c0 in range(0, C, BLOCK_C):
            if TMA:
                tile = fk._box(src, 1, t0, c0)
            else:
                tile = tl.load(x_ptr + row[:, None] * 2 * C + C + c0 + k[None, :], mask=(row < N)[:, None], other=0.0)
            acc += tl.dot(tile, w)
        tl.store(y_ptr + row[:, None] * BLOCK_C + k[None, :], acc, mask=(row < N)[:, None])

    launches = []
    with kernel_aot.recording("test", "fused", launches):
        x, y = torch.empty(64 * 64), torch.empty(64 * 64)
        copy[(5,)](x, y, 1000, BLOCK=256)
        crowded[(1,)](x, y, BLOCK=64, num_warps=1, maxnreg=32)
    for k in kernel_aot.compile_all(launches, targets=(90,), workers=2):
        r = k.resources[90]
        print(k.name, k.programs, r["regs"], r["spill"], r["shared"], r["loads"].in_flight, int(r["loads"].looped))
    launches = []
    with kernel_aot.recording("test", "fused", launches):
        boxes[(2,)](torch.empty(20, 2, 256, dtype=torch.bfloat16), torch.empty(64 * 64), 20, C=256, TMA=True,
                    BLOCK_T=16, BLOCK_C=64)
    for k in kernel_aot.compile_all(launches, targets=(80, 90), workers=2):
        print(k.name, ",".join(map(str, k.resources)), k.resources[90]["loads"].depth_from)
""")


def test_a_kernel_compiles_for_sm90_and_its_resources_are_read(tmp_path):
    script = tmp_path / "compile.py"  # Triton reads a kernel's source from its file
    script.write_text(COMPILE)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT
    out = launch.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=ROOT,
                     timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()}
    # TMA's loads: compiled only for a target that has them, where they are bulk copies at the
    # launch's pipeline depth (the PTX does not state it)
    assert found.pop("boxes") == ["90", "launch"]
    found = {name: list(map(int, values)) for name, values in found.items()}
    programs, regs, spill, _, loaded, looped = found["copy"]
    assert programs == 5 and 0 < regs <= 64 and spill == 0
    assert (loaded, looped) == (256 * 4, 0)  # no loop: its one fp32 block, every thread's share once
    programs, regs, spill, _, _, _ = found["crowded"]
    assert programs == 1 and regs <= 32 and spill > 0
    lines = kernel_aot.failures([kernel_aot.Compiled("crowded", "", "fused", ["test"], 1, False,
                                                     {90: dict(regs=regs, spill=spill, shared=0, warps=1,
                                                               loads=None)})])
    assert lines == [f"fused crowded (as launched) spills {spill} bytes on sm_90"]
