"""nanochat/planning/in_flight.py: the occupancy limits, the PTX reading of a streaming loop's loads, the
Little's-law need, and (compiled for sm_90 without a GPU) the two seam tilings an H200 measured,
which the estimate must order as the GPU did."""

import os
import sys
import textwrap

import launch
import pytest

from nanochat.planning import in_flight

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("case, expect", [
    # 255 registers: 8192 a warp, 2 warps per sub-partition, 8 per SM: two 4-warp programs
    (dict(regs=255, shared=0, warps=4), (2, "registers")),
    # 129 registers round up to 4352 a warp: 3 per sub-partition (128 would fit 4)
    (dict(regs=129, shared=0, warps=1), (12, "registers")),
    (dict(regs=128, shared=0, warps=1), (16, "registers")),
    # 200 registers: 6400 a warp, 2 per sub-partition: 8 warps, not 65536 // 6400 = 10
    (dict(regs=200, shared=0, warps=2), (4, "registers")),
    # 68 KiB + the reserved 1 KiB: three in 228 KiB
    (dict(regs=32, shared=68 * 1024, warps=4), (3, "shared")),
    (dict(regs=16, shared=0, warps=8), (8, "warps")),
    (dict(regs=16, shared=0, warps=1), (32, "blocks")),
    (dict(regs=16, shared=0, warps=1, programs=264), (2, "launch")),
])
def test_programs_per_sm_takes_the_tightest_limit(case, expect):
    case = dict(dict(programs=10**6, cc=90, sms=132), **case)
    assert in_flight.programs_per_sm(**case) == expect


def test_an_a100_holds_less_shared_memory_than_an_h100():
    args = dict(regs=32, shared=68 * 1024, warps=4, programs=10**6, sms=132)
    assert in_flight.programs_per_sm(cc=80, **args) == (2, "shared")


LOOP = textwrap.dedent("""
    @%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
    $L__BB0_1:                              // =>This Inner Loop Header: Depth=1
    {body}
    @%p8 bra 	$L__BB0_1;
    ld.global.b32 { %r9 }, [ %rd9 + 0 ];
""")


def test_plain_loads_in_a_loop_are_one_iteration_each_thread_counted():
    body = "@%p2 ld.global.L1::evict_last.v4.b32 { %r5, %r6, %r7, %r8 }, [ %rd2 + 0 ];\n" \
           "ld.global.b16 { %rs1 }, [ %rd3 + 0 ];\nld.global.nc.v2.b32 { %r1, %r2 }, [ %rd4 + 0 ];"
    loads = in_flight.streaming_loads(LOOP.replace("{body}", body), num_warps=4)
    assert loads == in_flight.StreamingLoads((16 + 2 + 8) * 128, 0, 1, "", looped=True)
    assert loads.in_flight == 26 * 128


def test_async_copies_count_the_iterations_the_wait_leaves_pending():
    # each iteration commits 2 groups and waits until at most 4 are pending: 3 iterations ahead
    body = "cp.async.wait_group 	4;\n" + "cp.async.cg.shared.global [ %r1 + 0 ], [ %rd1 + 0 ], 0x10, %r2;\n" \
           "cp.async.commit_group;\n" * 2 + "ld.global.b32 { %r3 }, [ %rd5 + 0 ];"
    loads = in_flight.streaming_loads(LOOP.replace("{body}", body), num_warps=2)
    assert (loads.plain, loads.pipelined, loads.depth, loads.depth_from) == (4 * 64, 32 * 64, 3, "ptx")
    assert loads.in_flight == 4 * 64 + 3 * 32 * 64


def test_tma_copies_take_their_bytes_from_the_barrier_and_their_depth_from_the_launch():
    body = "mbarrier.arrive.expect_tx.shared::cta.b64 _, [ %r1 + 0 ], 16384;\n" \
           "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes " \
           "[ %r2 ], [ %rd1, { %r3, %r4 } ], [ %r1 ];"
    loads = in_flight.streaming_loads(LOOP.replace("{body}", body), num_warps=4, num_stages=4)
    assert (loads.pipelined, loads.depth, loads.depth_from) == (16384, 3, "launch")


def test_a_kernel_without_a_loop_has_all_its_loads_in_flight():
    ptx = "ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];\n@%p1 ld.global.b32 { %r5 }, [ %rd2 + 0 ];"
    assert in_flight.streaming_loads(ptx, num_warps=1) == in_flight.StreamingLoads(20 * 32, 0, 1, "", looped=False)


def test_the_streaming_loop_is_the_one_issuing_most_and_an_inner_loop_is_not_its_outer_one():
    ptx = textwrap.dedent("""
        $L__BB0_1:
        ld.global.b32 { %r1 }, [ %rd1 + 0 ];
        $L__BB0_2:
        ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
        ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd2 + 0 ];
        @%p1 bra $L__BB0_2;
        @%p2 bra $L__BB0_1;
        $L__BB0_3:
        ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd3 + 0 ];
        bra.uni $L__BB0_3;
    """)
    # the inner loop's 32 bytes a thread, not the outer one's 4 + 32
    assert in_flight.streaming_loads(ptx, num_warps=1).plain == 32 * 32


def test_a_program_holds_no_more_in_flight_than_its_registers_and_shared_memory():
    loads = in_flight.StreamingLoads(10**6, 4096, 2, "ptx", looped=False)
    assert in_flight.per_program(loads, regs=64, shared=1 << 20, warps=4) == 64 * 4 * 128 + 8192
    assert in_flight.per_program(loads, regs=64, shared=6000, warps=4) == 64 * 4 * 128 + 6000


def test_the_need_is_littles_law_and_short_of_it_the_bandwidth_scales_down():
    need = in_flight.need_per_sm(in_flight.H200)
    assert 24_000 < need < 26_000  # 4.8 TB/s x 700 ns / 132 SMs, about 25 KB per SM
    assert in_flight.need_per_sm(in_flight.A100) < in_flight.need_per_sm(in_flight.H100) < need
    assert in_flight.allowed_bandwidth(need / 2, in_flight.H200) == pytest.approx(2.4e12)
    assert in_flight.allowed_bandwidth(need * 2, in_flight.H200) == 4.8e12


def test_an_estimate_below_the_need_is_short_and_says_by_how_much():
    loads = in_flight.StreamingLoads(4096, 0, 1, "", looped=True)
    e = in_flight.estimate(255, 0, 4, 10**6, loads, 90, in_flight.H100)
    assert (e.programs_per_sm, e.per_sm, e.short) == (2, 8192, True)
    assert "8.0 KiB in flight per SM (2 programs, set by registers" in e.describe()
    assert "under an H100's need of 17.3 KiB" in e.describe()
    assert not in_flight.estimate(64, 0, 4, 10**6, loads, 90, in_flight.H100).short


# Compiled in a process of its own: the suite runs Triton's interpreter (conftest.py). The two
# tilings an H200 measured (docs/gpu_measured.md): 16 tokens x 8 warps (chunks 128/64) and 64 x
# 4 (64/32); a KromHC middle seam moves about 1.0 GB forward and 1.4 GB backward.
TILINGS = textwrap.dedent("""
    from nanochat.planning import in_flight
    from nanochat.planning import kernel_aot
    nbytes = dict(seam_forward=1.0e9, seam_backward=1.4e9)
    for tiling in ((16, 8, 128, 64), (64, 4, 64, 32)):
        for k in kernel_aot.middle_seams(tiling):
            e = kernel_aot.estimate(k, 90, in_flight.H200)
            print(tiling[0], k.name, e.per_sm, e.seconds(nbytes[k.name]))
""")


def test_the_estimate_orders_the_two_measured_tilings_as_the_h200_did():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT
    out = launch.run([sys.executable, "-c", TILINGS], capture_output=True, text=True, env=env, cwd=ROOT,
                     timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    found = {(int(t), name): (float(per_sm), float(s))
             for t, name, per_sm, s in map(str.split, out.stdout.splitlines())}
    for name in ("seam_forward", "seam_backward"):
        (slow_in_flight, slow_s), (fast_in_flight, fast_s) = found[16, name], found[64, name]
        # 64 x 4 was faster both ways: more bytes in flight per SM, and no longer a predicted time
        assert fast_in_flight > slow_in_flight, (name, found)
        assert fast_s <= slow_s, (name, found)
