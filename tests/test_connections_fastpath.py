"""The fast connection path (nanochat/connections/backends/ops.py and the recomputing Sinkhorn-Knopp)
against the paper's equations, in every execution mode: eager, with hc_recompute, and
traced by torch.compile (which takes the plain-op form of the projection and the mixes);
its memory promises (no fp32 copy of bf16 streams, eager or through Inductor; no Sinkhorn
iterates kept for backward); and whole-graph capture without breaks.

The reference implementation is the one in test_connections.py (`reference_forward`: the
paper's equations written plainly, Sinkhorn as an exp-domain loop, permutations summed
explicitly, Kronecker products by torch.kron); it is imported here, not repeated."""

import pytest
import torch
import torch._dynamo

from nanochat.connections.birkhoff import sinkhorn_log
from nanochat.connections.backends.ops import mix_post, mix_pre, project
from nanochat.gpt import GPTConfig, build_model
from test_connections import (assert_matches_reference, build_layer, make_branch, randomize, random_streams,
                              reference_forward)

VARIANTS = ("hc", "hc_identity", "mhc", "mhc_lite", "kromhc", "go_mhc")
# (variant, n, factors): every variant at the paper's n = 4, plus odd n and deeper Kronecker chains.
CASES = [(v, 4, None) for v in VARIANTS] + [("mhc", 3, None), ("mhc_lite", 3, None), ("kromhc", 6, [3, 2]),
                                           ("kromhc", 8, None)]


def case_id(case):
    v, n, f = case
    return f"{v}-n{n}" + (f"-{'x'.join(map(str, f))}" if f else "")


def run_layer(layer, X, branch, mode):
    if mode == "compiled":
        # The eager backend runs what dynamo traced (the compiler's form of the mixes)
        # without generating code; fullgraph=True fails on any graph break.
        torch._dynamo.reset()
        return torch.compile(lambda X: layer(X, branch, None), backend="eager", fullgraph=True)(X)
    return layer(X, branch, None)


@pytest.mark.parametrize("mode", ("eager", "recompute", "compiled"))
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_fast_path_matches_reference(case, mode):
    """Forward and the gradients of X and of every parameter, at random parameters, to 1e-5 (fp32)."""
    variant, n, factors = case
    kw = dict(factors=factors, recompute=mode == "recompute")
    layer = randomize(build_layer(variant, n, **kw), 21, 0.8)
    ref = randomize(build_layer(variant, n, **kw), 21, 0.8)
    branch = make_branch()
    R = torch.randn(2, 3, n, 8, generator=torch.Generator().manual_seed(4))
    X1, X2 = (random_streams(n, seed=3).requires_grad_() for _ in range(2))
    out = run_layer(layer, X1, branch, mode)
    expected = reference_forward(variant, ref, X2, branch)
    assert_matches_reference(out, expected, X1, X2, layer, ref, R)


def plain_sinkhorn_log(logits, iters):
    """Log-space Sinkhorn-Knopp as a plain loop under autograd (what SinkhornLog replaces)."""
    for _ in range(iters):
        logits = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
        logits = logits - torch.logsumexp(logits, dim=-2, keepdim=True)
    return logits.exp()


@pytest.mark.parametrize("n", (2, 4, 5))
def test_sinkhorn_backward_is_the_unrolled_gradient(n):
    """The recomputing backward equals autograd through the unrolled loop, first and second
    order (float64), for logits of widely different spreads."""
    g = torch.Generator().manual_seed(n)
    logits = (torch.randn(2, 3, n, n, generator=g, dtype=torch.float64) * 3).requires_grad_()
    torch.testing.assert_close(sinkhorn_log(logits, 7), plain_sinkhorn_log(logits, 7), atol=1e-12, rtol=1e-10)
    R = torch.randn(2, 3, n, n, generator=g, dtype=torch.float64)
    ours = torch.autograd.grad((sinkhorn_log(logits, 7) * R).sum(), logits)[0]
    plain = torch.autograd.grad((plain_sinkhorn_log(logits, 7) * R).sum(), logits)[0]
    torch.testing.assert_close(ours, plain, atol=1e-12, rtol=1e-10)
    assert torch.autograd.gradgradcheck(lambda l: sinkhorn_log(l, 3), (logits.detach()[:1, :1].requires_grad_(),))


def test_ops_gradients_in_float64():
    """gradcheck of each Function on its own, including the identity form of the post mix."""
    g = torch.Generator().manual_seed(0)
    d = dict(dtype=torch.float64)
    X = torch.randn(2, 3, 4, 5, generator=g, **d).requires_grad_()
    w = torch.randn(20, 6, generator=g, **d).requires_grad_()
    h = torch.rand(2, 3, 4, generator=g, **d).requires_grad_()
    H = torch.rand(2, 3, 4, 4, generator=g, **d).requires_grad_()
    y = torch.randn(2, 3, 5, generator=g, **d).requires_grad_()
    assert torch.autograd.gradcheck(lambda X, w: project(X.flatten(-2), w), (X, w))
    assert torch.autograd.gradcheck(mix_pre, (h, X))
    assert torch.autograd.gradcheck(mix_post, (H, X, h, y))
    assert torch.autograd.gradcheck(lambda X, h, y: mix_post(None, X, h, y), (X, h, y))


def saved_bytes(fn, exclude=()):
    """Bytes of the distinct storages autograd saves during fn(), except those of `exclude`
    (parameters): what scripts/bench counts."""
    seen, skip = {}, {p.untyped_storage().data_ptr() for p in exclude}

    def pack(t):
        if t.untyped_storage().data_ptr() not in skip:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


@pytest.mark.parametrize("variant", VARIANTS)
def test_bf16_streams_save_no_fp32_copy_and_mhc_no_iterates(variant):
    """Per layer, backward keeps X and y in bf16, W (the norm weight folded in), and
    O(k + n^2) fp32 numbers per token for the coefficient path (k = 2n + R logits): we
    allow 4k + 2n^2. An fp32 copy of X would add 4nC bytes per token (4096 here), and
    mHC's Sinkhorn iterates 2 * 20 * n^2 fp32 numbers (2560 bytes)."""
    n, C, B, T = 4, 256, 2, 16
    layer = randomize(build_layer(variant, n, C=C), 1)
    X = random_streams(n, C=C, B=B, T=T, dtype=torch.bfloat16).requires_grad_()
    k = layer.weight.shape[1]
    budget = B * T * ((n * C + C) * 2 + 4 * (4 * k + 2 * n * n)) + 4 * layer.weight.numel()
    measured = saved_bytes(lambda: layer(X, lambda u: u * 0.5, None), exclude=layer.parameters())
    assert B * T * n * C * 2 <= measured <= budget, (measured, budget)


def test_compiled_layer_keeps_bf16_streams_not_an_fp32_copy():
    """The same memory promise through Inductor, as training runs it (bf16 autocast): the
    partitioner keeps X in bf16 (a Function around the projection made it keep the fp32
    cast, 3x the bytes). One real compile (~10 s), for the projection all variants share."""
    n, C, B, T = 4, 64, 2, 64
    layer = randomize(build_layer("hc", n, C=C), 1)
    X = random_streams(n, C=C, B=B, T=T, dtype=torch.bfloat16).requires_grad_()
    torch._dynamo.reset()
    compiled = torch.compile(lambda X: layer(X, lambda u: u * 0.5, None), dynamic=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        compiled(X).float().sum().backward()  # compile forward and backward outside the count
        measured = saved_bytes(lambda: compiled(X), exclude=layer.parameters())
    k = layer.weight.shape[1]
    budget = B * T * (n * C * 2 + 4 * (4 * k + 2 * n * n)) + 4 * layer.weight.numel()
    assert B * T * n * C * 2 <= measured <= budget, (measured, budget)


@pytest.mark.parametrize("variant", VARIANTS)
def test_bf16_gradients_follow_fp32(variant):
    """bf16 streams: X's gradient comes back in bf16 and the parameters' in fp32, and both
    agree with the fp32 computation on the same (bf16-representable) inputs to within a
    few bf16 rounding steps (2^-8) in relative norm; the branch input and output are
    rounded to bf16 on the way, so exact agreement is not expected."""
    n = 4
    layer = randomize(build_layer(variant, n), 2)
    ref = randomize(build_layer(variant, n), 2)
    Xb = random_streams(n, dtype=torch.bfloat16).requires_grad_()
    Xf = Xb.detach().float().requires_grad_()
    R = torch.randn(2, 3, n, 8, generator=torch.Generator().manual_seed(5))
    (layer(Xb, torch.tanh, None).float() * R).sum().backward()
    (ref(Xf, torch.tanh, None) * R).sum().backward()
    assert Xb.grad.dtype == torch.bfloat16
    rel = lambda a, b: ((a.float() - b).norm() / b.norm()).item()
    assert rel(Xb.grad, Xf.grad) < 4 * 2**-8
    for (name, p), q in zip(layer.named_parameters(), ref.parameters()):
        assert p.grad.dtype == torch.float32, name
        assert rel(p.grad, q.grad) < 4 * 2**-8, name


def graph_breaks(fn, *args):
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(fn)(*args)
    return explanation.graph_count, explanation.graph_break_count, [str(b.reason) for b in explanation.break_reasons]


@pytest.mark.parametrize("recompute", (False, True), ids=("plain", "recompute"))
@pytest.mark.parametrize("variant", ("residual", *VARIANTS))
def test_layer_traces_without_graph_breaks(variant, recompute):
    n = 1 if variant == "residual" else 4
    layer = build_layer(variant, n, index=0) if variant == "residual" else \
        randomize(build_layer(variant, n, recompute=recompute), 3)
    X, x0, branch = random_streams(n), torch.randn(2, 3, 8), make_branch()
    assert graph_breaks(lambda X: layer(X, branch, x0), X) == (1, 0, [])


@pytest.mark.parametrize("variant", ("residual", *VARIANTS))
def test_tiny_gpt_traces_without_graph_breaks(variant):
    cfg = GPTConfig(sequence_len=16, vocab_size=64, n_layer=2, n_head=2, n_kv_head=2, n_embd=32, hc=variant)
    model = build_model(cfg, "cpu")
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    assert graph_breaks(model, idx, idx) == (1, 0, [])


def test_saved_bytes_counts_what_it_should():
    """The counting hook itself: one distinct fp32 storage of 12 numbers, once."""
    x = torch.randn(3, 4, requires_grad=True)
    assert saved_bytes(lambda: (x * x).sum()) == 12 * 4
    assert saved_bytes(lambda: (x.exp() * x).sum()) == 2 * 12 * 4
