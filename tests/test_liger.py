"""hc_kernels = liger (nanochat/connections/backends/liger.py): Liger-Kernel's fused Triton kernels
against the torch path, on CPU tensors in Triton's interpreter, fp32 and tiny shapes (the
interpreter runs every kernel instance in Python). For every variant: the layer's output
and the gradients of the streams and of every parameter; a tiny GPT's first training
steps; bf16 streams; the custom-op registrations (fake and autograd, what torch.compile
relies on); whole-graph capture; and the configuration errors. conftest.py turns the
interpreter on (TRITON_INTERPRET=1) before triton is first imported."""

import dataclasses

import pytest
import torch
import torch._dynamo

from nanochat.checkpoint_manager import model_from_state
from nanochat.connections.backends import liger
from nanochat.gpt import GPTConfig, build_model
from test_connections import build_layer, make_branch, randomize, random_streams

pytest.importorskip("liger_kernel", reason="needs the kernels extra: pip install -e '.[kernels]'")
# The interpreter evaluates masked-out lanes too: the mm-norm backward divides by their zero
# 1/rms there (on a GPU those lanes are computed and discarded silently).
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")

# (variant, n, factors, recompute): every variant at the paper's n = 4, a deeper Kronecker
# chain, the smallest n, and hc_recompute.
CASES = [("hc", 4, None, False), ("hc_identity", 4, None, False), ("mhc", 4, None, False),
         ("mhc_lite", 4, None, False), ("kromhc", 4, None, False), ("kromhc", 8, [2, 2, 2], False),
         ("mhc", 2, None, False), ("kromhc", 4, None, True), ("go_mhc", 4, None, False)]
TOL = 1e-5  # relative, in norm


def case_id(case):
    v, n, f, recompute = case
    return f"{v}-n{n}" + (f"-{'x'.join(map(str, f))}" if f else "") + ("-recompute" if recompute else "")


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def layer_pair(variant, n, factors=None, recompute=False, C=16):
    """The same randomized layer twice, on the torch and the liger backend."""
    return [randomize(build_layer(variant, n, C=C, factors=factors, recompute=recompute, kernels=k), 21, 0.8)
            for k in ("torch", "liger")]


def forward_backward(layer, X, branch, R, run=None):
    """Output, X's gradient and every parameter's gradient of `run(X)` (default: the layer)."""
    X = X.clone().requires_grad_()
    out = run(X) if run is not None else layer(X, branch)
    (out.float() * R).sum().backward()
    return out, X.grad, {name: p.grad for name, p in layer.named_parameters()}


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_liger_layer_matches_torch_layer(case):
    variant, n, factors, recompute = case
    torch_layer, liger_layer = layer_pair(variant, n, factors, recompute)
    branch = make_branch(16)
    X = random_streams(n, C=16, seed=3)
    R = torch.randn(X.shape, generator=torch.Generator().manual_seed(4))
    out_t, gX_t, grads_t = forward_backward(torch_layer, X, branch, R)
    out_l, gX_l, grads_l = forward_backward(liger_layer, X, branch, R)
    assert rel_err(out_l, out_t) < TOL
    assert rel_err(gX_l, gX_t) < TOL
    assert grads_t.keys() == grads_l.keys() and len(grads_t) >= 3
    for name, g in grads_t.items():
        assert grads_l[name] is not None, name
        assert rel_err(grads_l[name], g) < TOL, name


def test_bf16_streams_stay_bf16_with_fp32_coefficients():
    """Streams and their gradient in the compute dtype, the parameters' gradients in fp32;
    both backends accumulate in fp32 and round once, so they agree to bf16 rounding."""
    torch_layer, liger_layer = layer_pair("kromhc", 4)
    branch = make_branch(16)
    X = random_streams(4, C=16, seed=5, dtype=torch.bfloat16)
    R = torch.randn(X.shape, generator=torch.Generator().manual_seed(6))
    out_t, gX_t, grads_t = forward_backward(torch_layer, X, branch, R)
    out_l, gX_l, grads_l = forward_backward(liger_layer, X, branch, R)
    assert out_l.dtype == gX_l.dtype == torch.bfloat16
    assert all(g.dtype == torch.float32 for g in grads_l.values())
    assert rel_err(out_l, out_t) < 1e-2 and rel_err(gX_l, gX_t) < 2e-2
    for name, g in grads_t.items():
        assert rel_err(grads_l[name], g) < 2e-2, name


def tiny_gpt_losses(variant, kernels, steps=5):
    torch.manual_seed(0)
    cfg = GPTConfig(sequence_len=8, vocab_size=64, n_layer=1, n_head=2, n_kv_head=2, n_embd=32, hc=variant,
                    hc_kernels=kernels)
    model = build_model(cfg, "cpu")
    batch = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.8, 0.95), weight_decay=0.0)
    losses = []
    for _ in range(steps):
        loss = model(batch[:, :-1], batch[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("variant", ("mhc", "kromhc"))
def test_tiny_gpt_trains_the_same_with_either_backend(variant):
    torch_losses, liger_losses = tiny_gpt_losses(variant, "torch"), tiny_gpt_losses(variant, "liger")
    assert torch_losses[-1] < torch_losses[0]
    assert liger_losses == pytest.approx(torch_losses, abs=1e-4, rel=0)


def test_custom_ops_pass_opcheck():
    """Schema, fake (meta) implementations, autograd registration and AOT dispatch of each op."""
    g = torch.Generator().manual_seed(7)
    N, n, C = 5, 4, 16
    X = torch.randn(N, n, C, generator=g, requires_grad=True)
    h_pre, h_post = (torch.rand(N, n, generator=g, requires_grad=True) for _ in range(2))
    h_res = torch.rand(N, n, n, generator=g, requires_grad=True)
    y = torch.randn(N, C, generator=g, requires_grad=True)
    w = torch.randn(n * C, 12, generator=g, requires_grad=True)
    torch.library.opcheck(liger._mix_pre, (h_pre, X))
    torch.library.opcheck(liger._mix_post, (h_res, X, h_post, y))
    torch.library.opcheck(liger._rms_project, (X.detach().flatten(1).requires_grad_(), w, 1e-6))


def test_compiles_as_one_graph_and_matches_eager():
    """No graph break in a layer (dynamo.explain), and the AOT-traced forward and backward
    (fake implementations, registered backward ops) equal eager."""
    _, layer = layer_pair("kromhc", 4)
    branch = make_branch(16)
    X = random_streams(4, C=16, seed=8)
    R = torch.randn(X.shape, generator=torch.Generator().manual_seed(9))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda X: layer(X, branch))(X)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    out_e, gX_e, grads_e = forward_backward(layer, X, branch, R)
    layer.zero_grad(set_to_none=True)
    compiled = torch.compile(lambda X: layer(X, branch), backend="aot_eager", fullgraph=True)
    out_c, gX_c, grads_c = forward_backward(layer, X, branch, R, run=compiled)
    assert rel_err(out_c, out_e) < TOL and rel_err(gX_c, gX_e) < TOL
    for name, g in grads_e.items():
        assert rel_err(grads_c[name], g) < TOL, name


def test_auto_and_torch_never_reach_liger_on_cpu(monkeypatch):
    """auto in a model runs the torch ops (a training run decides it before it builds the model:
    backends/auto.py, which picks Liger's only where a GPU measured them faster); a liger layer
    on CPU without the interpreter
    stops with one clear error rather than a Triton driver traceback."""
    calls = []
    monkeypatch.setattr(liger, "mix_pre", lambda *a: calls.append(a))
    for kernels in ("torch", "auto"):
        layer = build_layer("kromhc", 4, kernels=kernels)
        layer(random_streams(4), make_branch())
    assert calls == []
    monkeypatch.delenv("TRITON_INTERPRET")
    layer = build_layer("kromhc", 4, kernels="liger")
    with pytest.raises(RuntimeError, match="hc_kernels='torch' or 'auto'"):
        layer(random_streams(4), make_branch())


def test_only_training_reaches_the_kernels(monkeypatch, tmp_path):
    """Triton compiles Liger's kernels once per token count N: a training step (one N) runs
    them; CORE (an N per example) and generation (an N per prompt, then 1 per token) on the
    same liger model reach them at no N at all."""
    from nanochat.core_eval import evaluate_core
    from nanochat.engine import Inference
    from test_core_eval import ByteTokenizer, make_bundle

    counts = []  # the token count of every call into the kernels
    for name, stream_arg in (("mix_pre", 1), ("mix_post", 1), ("rms_project", 0)):
        def counted(*args, real=getattr(liger, name), stream_arg=stream_arg):
            X = args[stream_arg]
            counts.append(X.shape[:-2 if stream_arg else -1].numel())
            return real(*args)
        monkeypatch.setattr(liger, name, counted)
    cfg = GPTConfig(sequence_len=64, vocab_size=257, n_layer=1, n_head=2, n_kv_head=2, n_embd=32, hc="kromhc",
                    hc_kernels="liger")
    model = build_model(cfg, "cpu")
    idx = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(10))
    model(idx, idx).backward()
    assert counts and set(counts) == {2 * 8}
    counts.clear()
    out = evaluate_core(model, ByteTokenizer(), "cpu", make_bundle(tmp_path), max_per_task=3, max_seq_len=64)
    assert out["tasks"]["mc"]["examples"] == 3
    assert len(list(Inference(model).generate([1, 2, 3], max_tokens=3))) == 3
    assert counts == []


@pytest.mark.parametrize("overrides, message", [
    (dict(hc_kernels="triton"), "unknown hc_kernels='triton'; choose one of torch, liger, fused, auto"),
    (dict(hc_kernels="liger", hc="mhc_lite", hc_streams=3), "power-of-two number of streams"),
])
def test_invalid_kernel_choice_is_one_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**{"hc": "kromhc", **overrides})


def test_missing_install_names_the_extra(monkeypatch):
    monkeypatch.setattr(liger, "AVAILABLE", False)
    with pytest.raises(ValueError, match=r"pip install -e '\.\[kernels\]'"):
        GPTConfig(hc="kromhc", hc_kernels="liger")
    # a wiring Liger cannot run is refused for that, not sent to install it
    for hc in ("residual", "static_hc"):
        with pytest.raises(ValueError, match=f"does not run hc='{hc}'"):
            GPTConfig(hc=hc, hc_kernels="liger")
    assert GPTConfig(hc="kromhc", hc_kernels="auto").hc_kernels == "auto"


def test_checkpoint_config_round_trips_and_old_ones_load_as_torch():
    cfg = GPTConfig(sequence_len=8, vocab_size=64, n_layer=1, n_head=2, n_kv_head=2, n_embd=32, hc="kromhc",
                    hc_kernels="liger")
    model = build_model(cfg, "cpu")
    saved = dataclasses.asdict(cfg)
    assert model_from_state(saved, model.state_dict(), "cpu").connections.layers[0].kernels == "liger"
    del saved["hc_kernels"]  # written before the field existed
    assert model_from_state(saved, model.state_dict(), "cpu").connections.layers[0].kernels == "torch"


@pytest.mark.parametrize("missing", ["interpreter", "install"])
def test_liger_checkpoint_evaluates_where_liger_cannot_run(monkeypatch, missing):
    """A model trained with the kernels loads on a CPU (no interpreter) or without the extra
    with `auto`, which picks the torch ops there, and computes the same logits."""
    cfg = GPTConfig(sequence_len=8, vocab_size=64, n_layer=1, n_head=2, n_kv_head=2, n_embd=32, hc="kromhc",
                    hc_kernels="liger")
    model = build_model(cfg, "cpu")
    for j, layer in enumerate(model.connections.layers):
        randomize(layer, seed=j)
    idx = torch.randint(0, 64, (2, 8))
    expected = model(idx)
    if missing == "interpreter":
        monkeypatch.delenv("TRITON_INTERPRET")
    else:
        monkeypatch.setattr(liger, "AVAILABLE", False)
    loaded = model_from_state(dataclasses.asdict(cfg), model.state_dict(), "cpu")
    assert loaded.config.hc_kernels == "auto"
    assert torch.allclose(loaded(idx), expected, rtol=1e-5, atol=1e-6)


def test_bench_compares_backends(tmp_path):
    """scripts/bench --hc-kernels torch,liger: one row per backend and variant (residual once),
    with each liger row's time over its torch row, and saved bytes for both."""
    from scripts import bench

    rows = bench.main(["--depth", "1", "--width", "32", "--head-dim", "16", "--seq-len", "8", "--batch", "2",
                       "--vocab-size", "64", "--warmup", "0", "--reps", "1", "--variants", "residual", "kromhc",
                       "--hc-kernels", "torch,liger"])
    labels = [(r["bench"], r["label"], r["kernels"]) for r in rows]
    for b in ("layer", "model"):
        assert [(lab, k) for bb, lab, k in labels if bb == b] == [("residual", "torch"), ("kromhc", "torch"),
                                                                 ("kromhc [liger]", "liger")]
    for r in rows:
        assert r["saved_bytes"] > 0
        torch_row = next(t for t in rows if t["bench"] == r["bench"] and t["label"] == r["variant"])
        assert r["time_vs_torch"] == pytest.approx(r["median_ms"] / torch_row["median_ms"])
