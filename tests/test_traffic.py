"""nanochat/planning/traffic.py, the bytes counter behind `scripts.bench --traffic`: the instrumented
interpreter's distinct and issued bytes of a Triton launch, the pricing of a traced graph by
Inductor's fusion, and the step it predicts."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from nanochat import measurements
from nanochat.planning import traffic

triton = pytest.importorskip("triton", reason="needs the kernels extra: pip install -e '.[kernels]'")
tl = triton.language


@triton.jit
def _read_twice_write_once(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < N
    a = tl.load(x_ptr + i, mask=mask)
    b = tl.load(x_ptr + i, mask=mask)  # the same addresses again: from cache on a GPU
    tl.store(y_ptr + i, a + b, mask=mask)


def test_a_launch_counts_distinct_addresses_and_issued_loads():
    """20 fp32 values over two programs of 16: the masked-off lanes move nothing; the second
    read of the same addresses adds to the loads issued, not to the distinct bytes."""
    N = 20
    x, y = torch.randn(N), torch.empty(N)
    with traffic.counting() as count:
        _read_twice_write_once[(2,)](x, y, N, BLOCK=16)
    assert count.triton == N * 4 + N * 4  # x read, y written
    assert count.issued == 2 * N * 4
    torch.testing.assert_close(y, 2 * x)


@triton.jit
def _each_reads_all(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + tl.program_id(0), tl.sum(tl.load(x_ptr + i, mask=i < N, other=0.0)))


def test_rereads_are_a_programs_own_second_loads_of_per_token_data():
    """A program loading its own tile twice re-reads it (the second pass a GPU finds in L2 only
    if the tile stayed there); programs loading the same shared data once each do not; data whose
    first dimension is not the tokens (weights, tables) is never counted."""
    N = 20
    x, y = torch.randn(N), torch.empty(N)
    with traffic.counting(tokens=N) as count:
        _read_twice_write_once[(2,)](x, y, N, BLOCK=16)
    assert count.reread == N * 4 and count.issued == 2 * N * 4
    with traffic.counting(tokens=N) as count:
        _each_reads_all[(3,)](x, y, N, BLOCK=32)
    assert count.reread == 0 and count.issued == 3 * N * 4
    with traffic.counting(tokens=N + 1) as count:  # x is not per-token data here
        _read_twice_write_once[(2,)](x, y, N, BLOCK=16)
    assert count.reread == 0
    with traffic.counting() as count:  # without the token count, nothing is taken for a re-read
        _read_twice_write_once[(2,)](x, y, N, BLOCK=16)
    assert count.reread == 0


def test_each_kernel_keeps_its_own_bytes():
    """The distinct bytes per kernel (traffic.kernel_key) add up to the launches' total, two
    launches of one kernel in one entry."""
    x, y = torch.randn(20), torch.empty(20)
    with traffic.counting() as count:
        _read_twice_write_once[(2,)](x, y, 20, BLOCK=16)
        _read_twice_write_once[(1,)](x[:8], y[:8], 8, BLOCK=16)
    assert count.kernels == {("_read_twice_write_once", ""): 2 * 20 * 4 + 2 * 8 * 4}
    assert sum(count.kernels.values()) == count.triton


def test_a_seam_kernel_is_named_by_its_seam(monkeypatch):
    """The fused seams' kernels are keyed as kernel_check names them: the seam's switches."""
    from nanochat.connections.backends import fused, fused_kernels
    kwargs = dict(SOURCE=1, RES_IN=1, COEF=2, RES_KIND=3, READ=2, NORM=1, PHASE=1, num_warps=4)
    assert traffic.kernel_key(fused_kernels.seam_forward.fn, kwargs) == ("seam_forward", fused.describe(kwargs))
    assert fused.describe(kwargs) == "post > gates permutations > projected read, normed, split: mix"
    assert traffic.kernel_key(_read_twice_write_once.fn, kwargs) == ("_read_twice_write_once", "")


def _compiled(name, what, workloads, allows):
    return dict(name=name, what=what, workloads=workloads, allows_bytes_per_s=allows)


def test_a_kernels_bandwidth_is_its_workloads_own_then_any_of_its_name():
    record = [_compiled("seam_forward", "a", ["kromhc"], {"H200": 4.0e12, "H100": 3.0e12}),
              _compiled("seam_forward", "a", ["mhc"], {"H200": 2.0e12, "H100": 2.0e12}),
              _compiled("seam_forward", "b", ["mhc"], {"H200": 3.0e12}),
              _compiled("seam_forward", "b", ["hc"], {"H200": 1.0e12}),
              _compiled("seam_backward", "a", ["kromhc", "mhc"], {"H200": 4.8e12})]
    found = traffic.allowed_bandwidths(record, "kromhc", "NVIDIA H200")
    # its own "a" (not mhc's slower one); "b" from the others, the least of them
    assert found == {"seam_forward|a": 4.0e12, "seam_forward|b": 1.0e12, "seam_backward|a": 4.8e12}
    assert traffic.allowed_bandwidths(record, "mhc", "NVIDIA H100 80GB HBM3") == {"seam_forward|a": 2.0e12}
    assert traffic.allowed_bandwidths(record, "kromhc", "Tesla T4") == {}


def test_bytes_below_their_need_of_bytes_in_flight_cost_as_more_bytes():
    """A kernel whose bytes in flight allow half the GPU's bandwidth takes twice its time: its
    bytes count once more; one the record lacks is priced at the GPU's bandwidth and named."""
    extra, unpriced = traffic.in_flight_extra({"k|a": 100.0, "k|b": 50.0, "k|c": 7.0},
                                              {"k|a": 2.4e12, "k|b": 9e12}, 4.8e12)
    assert extra == pytest.approx(100.0) and unpriced == ["k|c"]


def test_a_rows_in_flight_prediction_slows_only_its_short_kernels():
    """A split KromHC row (kernel_aot's workload "kromhc split") with one kernel allowed half of
    an H200: its bytes count twice; a kernel of another design's is not taken for it."""
    from scripts import bench_traffic
    record = [_compiled("seam_forward", "mix", ["kromhc split"], {"H200": 2.4e12}),
              _compiled("seam_forward", "mix", ["kromhc"], {"H200": 4.8e12}),
              _compiled("seam_backward", "stream", ["kromhc split"], {"H200": 4.8e12})]
    unit = 1536
    row = dict(variant="kromhc", kernels="fused-split", extra_c=20.0,
               kernel_bytes={"seam_forward|mix": 3.0 * unit, "seam_backward|stream": 9.0 * unit, "other|": unit})
    found = bench_traffic.in_flight_prediction(row, record, "current", 115.0, "NVIDIA H200", 4.8e12, unit)
    assert found["predicted_in_flight"] == pytest.approx(traffic.predicted_ratio(23.0 * unit, 115.0, 4.8e12))
    assert found["slower_bytes"] == pytest.approx(3.0 * unit)
    assert found["in_flight_limited_kernels"] == ["seam_forward|mix"] and found["unpriced_kernels"] == ["other|"]
    assert bench_traffic.workload("kromhc", "fused", "delayed") == "kromhc delayed"


def test_pytorch_ops_count_inputs_and_outputs_but_not_allocations_or_views():
    x = torch.randn(8, 4)
    with traffic.counting() as count:
        out = torch.empty(8, 4)
        v = x.t()
        torch.mul(v.t(), 2.0, out=out)
    assert count.torch == 2 * 8 * 4 * 4 and count.triton == 0


def _graph(fn, *inputs):
    return make_fx(fn, tracing_mode="fake")(*inputs)


def test_a_pointwise_chain_is_one_kernel():
    """exp(2 x): Inductor fuses the product into the exponential, one read and one write."""
    gm = _graph(lambda x: torch.exp(x * 2), torch.randn(1024))
    assert traffic.graph_bytes(gm, set(), None) == 2 * 1024 * 4


def test_reductions_of_the_same_inputs_read_them_once():
    """Two column sums of products of x: one kernel, x read once, two rows written."""
    gm = _graph(lambda x: ((x * 2).sum(0), (x * 3).sum(0)), torch.randn(64, 32))
    assert traffic.graph_bytes(gm, set(), None) == 64 * 32 * 4 + 2 * 32 * 4


def test_kernels_reading_a_skipped_node_are_left_out():
    """The branch weight's matmul is the sub-layer's, not the connection's."""
    def fn(x, w):
        return torch.exp(x) @ w
    gm = _graph(fn, torch.randn(16, 8), torch.randn(8, 8))
    w = [n for n in gm.graph.nodes if n.op == "placeholder"][1]
    assert traffic.graph_bytes(gm, {w}, None) == 2 * 16 * 8 * 4  # exp(x) only


@torch.library.custom_op("nanochat::traffic_test_pair", mutates_args=())
def _pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.clone(), x.clone()


@_pair.register_fake
def _(x):
    return torch.empty_like(x), torch.empty_like(x)


def test_the_outputs_of_a_custom_op_are_its_bytes_only():
    """A custom op with two outputs (as the fused seams): its own bytes (given), then one
    kernel for a * 2; taking its outputs moves nothing, and b is returned as it is."""
    gm = _graph(lambda x: (lambda a, b: (a * 2, b))(*_pair(x)), torch.randn(256))
    assert traffic.graph_bytes(gm, set(), lambda node: 1000) == 1000 + 2 * 256 * 4


def test_the_floor_predicts_the_issues_figure():
    """21C more per token and sub-layer (C = 768 bf16 values) is about 51 GB per D=12 step,
    10.6 ms at 4.8 TB/s: at 80 % of it, 13.2 ms over residual's 114.4 ms."""
    extra = 21 * 768 * traffic.ELEMENT
    per_step = extra * traffic.D12["tokens"] * 2 * traffic.D12["n_layer"]
    assert abs(per_step / 1e9 - 50.7) < 0.1
    assert abs(traffic.predicted_ratio(extra, 114.4, 4.8e12) - (1 + per_step / (0.8 * 4.8e12) * 1e3 / 114.4)) < 1e-12
    assert traffic.predicted_ratio(0, 114.4, 4.8e12) == 1


def test_the_residual_step_comes_from_either_section_of_a_gpu_check(tmp_path):
    import json
    path = tmp_path / "gpu_check.json"
    env = {"device_name": "NVIDIA H200"}
    path.write_text(json.dumps({"env": env, "model": [
        {"label": "residual (full causal)", "depth": 12, "median_ms": 1.0},
        {"label": "residual", "depth": 6, "median_ms": 2.0}, {"label": "residual", "depth": 12, "median_ms": 114.4}]}))
    assert measurements.residual_step(str(path)) == (114.4, "NVIDIA H200")
    path.write_text(json.dumps({"env": env, "kernels": {"rows": [
        {"run": "layer", "variant": "residual", "median_ms": 1.0},
        {"run": "model D12", "variant": "kromhc", "median_ms": 181.9},
        {"run": "model D12", "variant": "residual", "median_ms": 115.2}]}}))
    assert measurements.residual_step(str(path)) == (115.2, "NVIDIA H200")
    # the committed measurement has one
    ms, device = measurements.residual_step()
    assert ms > 0 and device.startswith("NVIDIA")


def test_depth_ratio_scales_the_extra_traffic_over_residuals_flops():
    """The D=12 ratio at D=12; none stays none; with depth the extra shrinks about as 1 / C,
    since the streams' bytes grow as depth x C and residual's FLOPs as depth x C^2."""
    from nanochat.gpt import model_config_from_depth
    assert traffic.depth_ratio(1.58, 12) == pytest.approx(1.58)
    assert traffic.depth_ratio(1.0, 26) == 1.0
    ratios = [traffic.depth_ratio(1.58, d) for d in (12, 20, 26, 48)]
    assert ratios == sorted(ratios, reverse=True) and ratios[-1] > 1
    width = {d: model_config_from_depth(d, 32768, 2048).n_embd for d in (24, 48)}
    shrink = (traffic.depth_ratio(1.58, 48) - 1) / (traffic.depth_ratio(1.58, 24) - 1)
    assert shrink == pytest.approx(width[24] / width[48], rel=0.15)


def test_the_traffic_table_predicts_the_wider_trunks(capsys):
    from scripts import bench_traffic
    row = dict(variant="kromhc", kernels="fused", fw_bytes=10.4 * 1536, bw_bytes=20.0 * 1536, issued_bytes=0,
               total_c=30.4, extra_c=12.7, predicted_vs_residual=1.07, target=1.15,
               predicted_at_depth={d: traffic.depth_ratio(1.07, d) for d in bench_traffic.DEPTHS})
    bench_traffic.print_traffic(dict(rows=[row], unit_bytes=1536, pre="current", residual_step_ms=115.0,
                                     device="NVIDIA H200", bandwidth=4.8e12))
    out = capsys.readouterr().out
    assert "predicted at D=20" in out and f"{traffic.depth_ratio(1.07, 26):.3f}" in out
    assert "predicted, in flight" in out and "below the GPU's need" not in out
    row.update(predicted_in_flight=1.093, in_flight_limited_kernels=["seam_backward|post > none > given read"],
               reread_bytes=16.0 * 1536, predicted_rereads_missing=1.161)
    bench_traffic.print_traffic(dict(rows=[row], unit_bytes=1536, pre="current", residual_step_ms=115.0,
                                     device="NVIDIA H200", bandwidth=4.8e12))
    out = capsys.readouterr().out
    assert "1.093" in out and "16.0" in out and "1.161" in out and "below the GPU's need of bytes in flight: seam_backward: post > none > given read" in out


def test_a_gpus_bandwidth_is_the_one_its_kernels_are_estimated_at():
    from nanochat.planning import in_flight
    assert traffic.bandwidth("NVIDIA H200") == in_flight.H200.bandwidth == 4.8e12
    assert traffic.bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12 and traffic.bandwidth("Tesla T4") is None
