"""The memory estimate (nanochat/planning/memory.py): held to real CPU steps for every variant, its
compiled trace held to torch.compile's partition, CUDA's dtype rules from the dispatcher, the
optimizer state against a real optimizer's, and --device-batch-size auto on a patched GPU."""

import contextlib
import dataclasses
import types

import pytest
import torch
import torch.nn.functional as F

from nanochat import gpus
from nanochat.planning import memory
from nanochat.planning import memory_check as check
from nanochat.connections import VARIANTS
from nanochat.gpt import build_model
from nanochat.train_config import parse_args


@pytest.fixture(autouse=True)
def base_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(tmp_path))  # the estimate's disk cache


def test_eager_estimate_is_the_real_steps_peak_for_every_variant_and_option():
    rows = check.check_rows(check.CASES, check.SIZES[:1], modes=(False,))
    assert len(rows) == len(check.CASES)
    assert check.outside_tolerance(rows) == [], rows
    assert len({r[4] for r in rows}) > 5  # the variants differ: the check measures each one


def test_compiled_estimate_against_the_real_partitioned_step():
    rows = check.check_rows([("residual", {}), ("kromhc", {})], check.SIZES[:1], modes=(True,))
    assert check.outside_tolerance(rows) == [], rows
    # KromHC's streams cost memory beyond the residual baseline's, in both the estimate and the step
    assert rows[1][3] > rows[0][3] and rows[1][4] > rows[0][4]


def test_the_traced_partition_is_torch_compiles():
    """aot_step must save what torch.compile saves (its plain stream ops, traced with the compile
    flag on; a transposed weight is the weight): the bytes of the forward's saved tensors."""
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table
    config = check.small_config("kromhc", {}, 1, 64)
    model = build_model(config, "cpu")
    idx = torch.randint(0, config.vocab_size, (2, config.sequence_len))
    graphs = {}

    def keep(gm, _inputs):
        graphs["fw"] = gm
        return make_boxed_func(gm)
    backend = aot_autograd(fw_compiler=keep, bw_compiler=lambda gm, _: make_boxed_func(gm),
                           partition_fn=min_cut_rematerialization_partition, decompositions=select_decomp_table)
    torch.compile(model, backend=backend, dynamic=False)(idx, idx).backward()
    inputs = [n for n in graphs["fw"].graph.nodes if n.op == "placeholder"]
    # dynamo lifts the parameters as inputs: saved inputs and views of them are not new memory
    saved = sum(v.numel() * v.element_size() for n in graphs["fw"].graph.output_node().args[0][1:]
                if isinstance(v := n.meta.get("val"), torch.Tensor) and memory._bases(graphs["fw"])[n] not in inputs)
    traced = memory._compiled_step_peak(model, idx, idx, contextlib.nullcontext(), inductor=False)[1]
    assert traced == pytest.approx(saved, rel=0.05)


def test_cuda_rules_come_from_the_dispatcher_and_are_undone():
    ops = memory.cuda_fp32_ops()
    assert {"aten::pow.Tensor_Scalar", "aten::sum", "aten::softmax.int"} <= set(ops)
    assert ("aten::rms_norm" in ops) == torch._C._dispatch_has_kernel_for_dispatch_key("aten::rms_norm",
                                                                                         "AutocastCUDA")
    assert not {"aten::mm", "aten::linear", "aten::addcmul"} & set(ops)  # lower precision, promote
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with memory.cuda_autocast_rules():
            assert F.relu(x @ w).square().dtype == torch.float32  # square -> pow: fp32 on CUDA
            assert F.softmax(x @ w, -1).dtype == torch.float32
            assert (x @ w).sum(-1).dtype == torch.float32
            assert F.linear(x, w).dtype == torch.bfloat16
        assert F.relu(x @ w).square().dtype == torch.bfloat16  # CPU's own rules again


def test_optimizer_state_is_the_real_optimizers():
    from nanochat.optim import build_optimizer
    config = check.small_config("kromhc", {}, 2, 64)
    model = build_model(config, "cpu")
    optimizer = build_optimizer(model.param_groups(), 1)
    idx = torch.randint(0, config.vocab_size, (2, 64))
    model(idx, idx).backward()
    optimizer.step()
    real = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
               if isinstance(t, torch.Tensor) and t.dim() > 0)
    params, grads, state = memory.static_bytes(config, 1, cuda=False)
    assert params == grads == sum(p.numel() * p.element_size() for p in model.parameters())
    assert state == real
    # at 8 ranks each rank keeps its shard of the sharded AdamW moments and of the Muon matrices
    assert memory.static_bytes(config, 8, cuda=False)[2] < state / 2


def test_fusion_counts_only_what_a_kernel_must_write():
    """Pointwise chains and a reduction of them are one kernel; a matmul reads a written buffer."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w):
        a = x * 2
        return (a * a.exp()).sum(-1), ((x + 1) * 3) @ w
    gm = make_fx(f)(torch.randn(64, 64), torch.randn(64, 64))
    held, size = [0, 0], 64 * 64 * 4
    unfused, fused = memory.graph_peak(gm, held, inductor=False), memory.graph_peak(gm, held, inductor=True)
    assert fused == 2 * size + 64 * 4  # (x+1)*3 for the matmul, its output, the sum's output
    assert unfused == 3 * size  # op by op: a, exp(a) and their product at once


def test_each_output_of_a_multi_output_op_is_freed_after_its_own_last_use():
    """sort's values feed a matmul and are freed after it, while its indices live to the output:
    two buffers (a fused seam's streams and its per-token numbers are, and backward keeps some
    of them only)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w, w2):
        values, indices = torch.ops.aten.sort.default(x)
        return (values @ w) @ w2, indices
    gm = make_fx(f)(torch.randn(64, 64), torch.randn(64, 64), torch.randn(64, 256))
    values, indices, y, z = 64 * 64 * 4, 64 * 64 * 8, 64 * 64 * 4, 64 * 256 * 4
    assert memory.graph_peak(gm, [0, 0, 0], inductor=True) == indices + y + z  # the values freed before z


def test_stream_checkpoints_drop_the_streams_they_recompute():
    """hc_kernels=fused is traced as the seams (their fake forms): with hc_stream_checkpoint=2,
    backward keeps 2 of the 4 streams a 2-block trunk writes, exactly 2 streams' bytes fewer."""
    pytest.importorskip("triton", reason="needs the kernels extra: pip install -e '.[kernels]'")
    from torch._subclasses.fake_tensor import FakeTensorMode
    from nanochat.gpt import model_config_from_depth
    base = model_config_from_depth(2, 512, 64, aspect_ratio=32, head_dim=32, hc="kromhc", hc_kernels="fused")
    saved = {}
    for K in (1, 2):
        config = dataclasses.replace(base, hc_stream_checkpoint=K)
        assert memory.traced_config(config).hc_kernels == "fused"
        with FakeTensorMode(), memory.cuda_rules(compile=True), memory.kernels_on_cpu():
            model = memory._fake_model(config, bf16=True)
            idx = torch.randint(0, 512, (2, 64))
            autocast = torch.autocast("cpu", dtype=torch.bfloat16)
            saved[K] = memory._compiled_step_peak(model, idx, idx, autocast, inductor=True)[1]
    stream = 2 * 64 * base.hc_streams * base.n_embd * 2  # tokens x n x C, bf16
    assert saved[1] - saved[2] == 2 * stream


def test_a_gather_reads_its_pointwise_input_inside_its_kernel():
    """The loss's gather of target log-probs: Inductor computes the log-softmax at the gathered
    indices (an indirect load), so the (N, V) log-softmax is never a buffer (a GPU's peak showed
    it: counting it put the D=12 estimate 8 GiB above the measurement)."""
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(logits, targets):
        logp = logits.float().log_softmax(-1)
        return logp.gather(1, targets[:, None]).mean()
    logits, targets = torch.randn(64, 256, dtype=torch.bfloat16), torch.randint(0, 256, (64,))
    gm = make_fx(f, decomposition_table=select_decomp_table())(logits, targets)
    assert any(memory._indirect_load(n) for n in gm.graph.nodes)
    held, logp_bytes = [logits.nbytes, targets.nbytes], 64 * 256 * 4
    assert memory.graph_peak(gm, held, inductor=True) < logp_bytes  # the inputs and (N, 1) reductions
    assert memory.graph_peak(gm, held, inductor=False) > logp_bytes  # op by op, the log-softmax is written


def tiny_args(tmp_path, batch="auto", cap=8):
    config = tmp_path / "c.toml"
    config.write_text(f"device_batch_size = {cap}\n")
    return parse_args(["--config", str(config), "--depth", "2", "--aspect-ratio", "32", "--head-dim", "32",
                       "--max-seq-len", "64", "--total-batch-size", "1024", "--vocab-size", "512",
                       "--device-batch-size", batch, "--window-pattern", "L"])


def patched_gpu(monkeypatch, total_memory):
    props = types.SimpleNamespace(total_memory=total_memory, name="NVIDIA Test GPU")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    return torch.device("cuda", 0)


def test_auto_picks_the_largest_fitting_power_of_two(tmp_path, monkeypatch):
    from nanochat.train_config import model_config_for
    from scripts.base_train import choose_device_batch, grad_accum_steps
    args = tiny_args(tmp_path)
    assert args.device_batch_size == "auto" and args.device_batch_cap == 8
    config = model_config_for(args, 512)
    needed = {b: memory.estimate(config, b, 1, 1024 // (b * 64), compile=False).needed for b in (8, 4, 2, 1)}
    assert needed[8] > needed[4] > needed[2] > needed[1]
    device = patched_gpu(monkeypatch, needed[8])
    batch, line = choose_device_batch(args, config, device, 1, use_compile=False)
    assert batch == 8 and "the config's value fits" in line and "NVIDIA Test GPU" in line
    device = patched_gpu(monkeypatch, needed[4] + 1)
    batch, line = choose_device_batch(args, config, device, 1, use_compile=False)
    assert batch == 4 and f"8 would need {needed[8] / memory.GIB:.1f} GiB" in line
    assert grad_accum_steps(args.total_batch_size, batch, 64, 1) == 4  # the total batch is kept
    device = patched_gpu(monkeypatch, needed[1] - 1)
    with pytest.raises(SystemExit, match="^error: the model does not fit .* even at device batch 1"):
        choose_device_batch(args, config, device, 1, use_compile=False)


def test_auto_on_a_cpu_is_the_configs_value(tmp_path):
    from nanochat.train_config import model_config_for
    from scripts.base_train import choose_device_batch
    args = tiny_args(tmp_path, cap=4)
    batch, line = choose_device_batch(args, model_config_for(args, 512), torch.device("cpu"), 1, False)
    assert batch == 4 and "on cpu it is the config's value" in line
    with pytest.raises(SystemExit):
        tiny_args(tmp_path, batch="some")


def test_out_of_memory_names_the_next_smaller_batch(tmp_path):
    from scripts.base_train import out_of_memory
    args = tiny_args(tmp_path, batch="8")
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")
    line = out_of_memory(oom, args, 1, 12, 10)
    assert line.startswith("error: out of GPU memory at device batch 8, step 12") and "\n" not in line
    assert "--device-batch-size 4 --resume true" in line and "step 10" in line
    args.device_batch_size = 1
    assert "does not fit at device batch 1" in out_of_memory(oom, args, 1, 0, None)


def test_gpu_memory_by_name():
    assert gpus.memory_gib("NVIDIA A100-SXM4-40GB") == 40
    assert gpus.memory_gib("NVIDIA A100-SXM4-80GB") == 80
    assert gpus.memory_gib("NVIDIA H100 80GB HBM3") == 80
    assert gpus.memory_gib("NVIDIA H100 NVL") == 94
    assert gpus.memory_gib("NVIDIA H200") == 141
    assert gpus.memory_gib("NVIDIA L40S") == 48
    assert gpus.memory_gib("NVIDIA RTX PRO 6000 Blackwell Server Edition") == 96
    assert gpus.memory_gib("Quadro K600") is None


def test_gpu_check_reports_the_estimate_where_it_measures():
    from scripts.gpu_check import estimated_step_mib
    config = check.small_config("residual", {}, 1, 64)
    assert estimated_step_mib(config, 2, False, torch.device("cpu")) is None  # nothing measured off CUDA
    mib = estimated_step_mib(config, 2, False, torch.device("cuda"))
    assert mib == memory.cached_step_peak(config, 2, compile=False) / 2**20 and mib > 0


def test_variants_relative_to_the_first():
    """hc_report --memory's rows: each variant's estimate and its ratio to the first's peak."""
    rows = check.gpu_rows(["residual", "kromhc"], depth=1, batch=2, seq_len=64, world_size=2, vocab_size=512,
                          modes=(False,))
    (_, _, residual, one), (variant, mode, kromhc, ratio) = rows
    assert (variant, mode, one) == ("kromhc", "eager", 1.0)
    assert ratio == kromhc.peak / residual.peak > 1  # n = 4 streams cost memory over one


def test_the_cache_holds_an_estimate_for_this_code_only(tmp_path, monkeypatch):
    """A trace cached by another version of the model's code is traced again, not read back."""
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(tmp_path))
    traced = []
    monkeypatch.setattr(memory, "step_peak", lambda *args, **kwargs: traced.append(args) or 1234)
    config = check.small_config("residual", {}, 1, 64)
    assert memory.cached_step_peak(config, 2, compile=False) == 1234
    assert memory.cached_step_peak(config, 2, compile=False) == 1234 and len(traced) == 1  # read back
    monkeypatch.setattr(memory, "code_fingerprint", lambda: "another version")
    memory.cached_step_peak(config, 2, compile=False)
    assert len(traced) == 2


def test_eager_traces_save_what_cudas_fused_rms_norm_saves():
    """The stand-in of CUDA's fused rms_norm computes rms_norm (value and gradients, with and
    without a weight) and keeps a bf16 input in bf16 for the backward, as the fused kernel
    does, where the CPU's composite keeps an fp32 copy."""
    torch.manual_seed(0)
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    fused = memory._CudaRMSNorm.apply
    assert torch.allclose(fused(x, (8,), w, 1e-6), F.rms_norm(x, (8,), w, 1e-6))
    assert torch.autograd.gradcheck(lambda x, w: fused(x, (8,), w, 1e-6), (x, w))
    assert torch.autograd.gradcheck(lambda x: fused(x, (8,)), (x,))
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.dtype) or t, lambda t: t):
        with memory.cuda_rules(compile=False):
            F.rms_norm(torch.randn(2, 8, dtype=torch.bfloat16, requires_grad=True), (8,), eps=1e-6)
    assert kept[0] == torch.bfloat16 and torch.float32 in kept


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_variant_has_an_eager_gpu_estimate(variant):
    """Every registered wiring traces under CUDA's rules (its norms through the fused stand-in)."""
    assert memory.step_peak(check.small_config(variant, {}, 2, 64), 2, compile=False, cuda=True) > 0
