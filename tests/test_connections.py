"""The connection variants, layer by layer: double stochasticity, Kronecker order, init,
gradients, precision, the H-convention, and agreement with a plain transcription of the
paper's equations."""

import itertools
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from nanochat import connections
from nanochat.connections.birkhoff import kron_factors, sinkhorn_log

# The variants whose layers are hc.HyperConnection (SPEC kernel), whose projection and H_res
# this file transcribes (reference_h_res): a new one fails here until its reference is written.
# A family member with layers of its own (tests/wirings/static_hc.py) is checked by the
# H-convention tests below and the shared ones (test_variant_contract.py).
HC_VARIANTS = tuple(name for name in connections.VARIANTS if connections.hyper_connection_layers(name))
STREAMS = (2, 3, 4, 6, 8)
MHC_LITE_MAX_TESTED = 5  # 6 works too (720 logits) but is slow to test
# (variant, n, factors) for every layer kind under test; factors only for kromhc.
CASES = [(v, n, None) for v in HC_VARIANTS for n in STREAMS if not (v == "mhc_lite" and n > MHC_LITE_MAX_TESTED)]
CASES += [("kromhc", 8, [4, 2]), ("kromhc", 6, [2, 3]), ("kromhc", 4, [4]), ("kromhc", 12, [3, 2, 2]),
          ("kromhc", 5, None)]
FAST = settings(max_examples=12, deadline=None)
# The family's init (W = 0, the home-stream biases); cmhc starts from its source's instead
# (tests/test_cmhc.py).
FAMILY_INIT = [c for c in CASES if c[0] != "cmhc"]


def case_id(case):
    v, n, f = case
    return f"{v}-n{n}" + (f"-{'x'.join(map(str, f))}" if f else "")


def hc_config(variant, n, C=8, n_layer=2, factors=None, **kw):
    own = {name: default for name, (default, *_) in connections.variant_fields().items()}
    cfg = SimpleNamespace(**{**own, "hc_factors": list(factors or [])}, hc=variant, hc_streams=n,
                          hc_sk_iters=20, hc_norm_weight=True, hc_recompute=False, hc_kernels="torch", hc_stream_checkpoint=1, hc_seam="onepass",
                          hc_expand="copy", hc_lss_init=0.6, hc_reduce="sum", hc_pre="current",
                          n_layer=n_layer, n_embd=C, trunk="2026-01")
    for key, value in kw.items():
        setattr(cfg, "hc_" + key, value)
    return cfg


def build_layer(variant, n, C=8, index=1, factors=None, **kw):
    conn = connections.build(hc_config(variant, n, C, n_layer=index // 2 + 1, factors=factors, **kw))
    conn.init_weights()
    return conn.layers[index]


def randomize(layer, seed, scale=1.0):
    """Parameters away from init: x'W ~ N(0, scale^2) per column, random biases and alphas."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=g) * scale / math.sqrt(layer.weight.shape[0]))
        layer.bias.copy_(torch.randn(layer.bias.shape, generator=g) * scale)
        layer.alpha.copy_(0.5 + torch.rand(layer.alpha.shape, generator=g))
        if layer.norm_weight is not None:
            layer.norm_weight.copy_(0.5 + torch.rand(layer.norm_weight.shape, generator=g))
    return layer


def random_streams(n, C=8, B=2, T=3, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, n, C, generator=g).to(dtype)


def make_branch(C=8, seed=1):
    M = torch.randn(C, C, generator=torch.Generator().manual_seed(seed)) / math.sqrt(C)
    return lambda u: torch.tanh(u @ M.to(u.dtype))


# ----- the paper's equations, written plainly (independent of the package's helpers) -----

def reference_permutations(m):
    """Permutation matrices in itertools order; matrix p picks column perm[i] for row i."""
    mats = []
    for perm in itertools.permutations(range(m)):
        P = torch.zeros(m, m)
        for i, j in enumerate(perm):
            P[i, j] = 1.0
        mats.append(P)
    return mats


def reference_h_res(variant, layer, res, alpha_res):
    """H_res for each token from the raw projections res = x' W_res (B, T, R)."""
    n, b = layer.n, layer.bias[2 * layer.n:]
    B, T = res.shape[:2]
    if variant == "hc_identity":
        return torch.eye(n).expand(B, T, n, n)
    if variant == "hc":
        return (alpha_res[0] * res + b).view(B, T, n, n)
    if variant == "mhc":
        M = torch.exp(alpha_res[0] * res + b).view(B, T, n, n)
        for _ in range(layer.sk_iters):  # exp-domain Sinkhorn-Knopp: rows, then columns
            M = M / M.sum(-1, keepdim=True)
            M = M / M.sum(-2, keepdim=True)
        return M
    if variant == "mhc_lite":
        a = torch.softmax(alpha_res[0] * res + b, dim=-1)
        return sum(a[..., m, None, None] * P for m, P in enumerate(reference_permutations(n)))
    if variant == "cmhc":
        # c = (1 - gamma) e_0 + gamma softmax(z) on the powers of the cyclic shift Pi
        c = layer.gamma * torch.softmax(alpha_res[0] * res + b, dim=-1) + (1 - layer.gamma) * torch.eye(n)[0]
        Pi = torch.roll(torch.eye(n), 1, dims=0)
        return sum(c[..., k, None, None] * torch.linalg.matrix_power(Pi, k) for k in range(n))
    if variant == "go_mhc":
        # The generator's strict upper triangle row by row, Q = (I - A)(I + A)^-1 by an
        # explicit inverse, H[i, j] = (1/s) sum over the s x s block (i, j) of Q^2.
        s, g = layer.s, alpha_res[0] * res + b
        m = n * s
        A = torch.zeros(B, T, m, m)
        k = 0
        for i in range(m):
            for j in range(i + 1, m):
                A[..., i, j], A[..., j, i] = g[..., k], -g[..., k]
                k += 1
        eye = torch.eye(m)
        Q = (eye - A) @ torch.linalg.inv(eye + A)
        H = torch.zeros(B, T, n, n)
        for i, j in itertools.product(range(n), range(n)):
            H[..., i, j] = Q[..., i * s:(i + 1) * s, j * s:(j + 1) * s].square().sum((-2, -1)) / s
        return H
    # kromhc: U^k per factor, then H_res = U^K kron ... kron U^1, token by token.
    Us, start = [], 0
    for k, i in enumerate(layer.factor_sizes):
        m = math.factorial(i)
        a_k = alpha_res[k] if len(alpha_res) > 1 else alpha_res[0]
        a = torch.softmax(a_k * res[..., start:start + m] + b[start:start + m], dim=-1)
        Us.append(sum(a[..., j, None, None] * P for j, P in enumerate(reference_permutations(i))))
        start += m
    tokens = []
    for bt in range(B * T):
        H = Us[-1].reshape(B * T, *Us[-1].shape[-2:])[bt]
        for U in reversed(Us[:-1]):
            H = torch.kron(H, U.reshape(B * T, *U.shape[-2:])[bt])
        tokens.append(H)
    return torch.stack(tokens).view(B, T, n, n)


def reference_forward(variant, layer, X, branch):
    """X_next = H_res X + H_post^T F(H_pre X) with x' = RMSNorm(vec(X)) applied before W."""
    n, C = layer.n, layer.C
    B, T = X.shape[:2]
    xn = F.rms_norm(X.reshape(B, T, n * C), (n * C,), layer.norm_weight)
    W, b, a = layer.weight, layer.bias, layer.alpha
    h_pre = torch.sigmoid(a[0] * (xn @ W[:, :n]) + b[:n])
    h_post = 2 * torch.sigmoid(a[1] * (xn @ W[:, n:2 * n]) + b[n:2 * n])
    h_res = reference_h_res(variant, layer, xn @ W[:, 2 * n:], a[2:])
    y = branch((h_pre.unsqueeze(-2) @ X).squeeze(-2))
    return h_res @ X + h_post.unsqueeze(-1) * y.unsqueeze(-2)


# ----- properties -----

@pytest.mark.parametrize("case", [c for c in CASES if c[0] in ("mhc_lite", "kromhc")], ids=case_id)
@FAST
@given(seed=st.integers(0, 2**31 - 1), scale=st.floats(0.1, 4.0))
def test_birkhoff_variants_are_exactly_doubly_stochastic(case, seed, scale):
    variant, n, factors = case
    layer = randomize(build_layer(variant, n, factors=factors), seed, scale)
    _, _, h = layer.coefficients(random_streams(n, seed=seed))
    assert h.dtype == torch.float32
    assert (h.sum(-1) - 1).abs().max() < 1e-6
    assert (h.sum(-2) - 1).abs().max() < 1e-6
    assert h.min() >= 0


@pytest.mark.parametrize("n", STREAMS)
@FAST
@given(seed=st.integers(0, 2**31 - 1), scale=st.floats(0.1, 4.0))
def test_mhc_columns_exact_rows_within_sinkhorn_tolerance(n, seed, scale):
    """The last Sinkhorn step normalizes columns: they are exact for any logits. Row sums
    carry the Sinkhorn error, which more iterations reduce; for logits of spread <= 0.25
    20 iterations bring them to 1e-6 as well."""
    layer = randomize(build_layer("mhc", n), seed, scale)
    X = random_streams(n, seed=seed)
    _, _, h = layer.coefficients(X)
    assert (h.sum(-2) - 1).abs().max() < 1e-6
    assert h.min() >= 0
    row_err = (h.sum(-1) - 1).abs().max()
    layer.sk_iters = 200
    _, _, h_long = layer.coefficients(X)
    assert (h_long.sum(-1) - 1).abs().max() <= row_err + 1e-6
    small = randomize(build_layer("mhc", n), seed, 0.25)
    _, _, h_small = small.coefficients(X)
    assert (h_small.sum(-1) - 1).abs().max() < 1e-6


def test_sinkhorn_row_error_shows_up_for_spread_logits():
    """The inexact side is really the rows (what Figure 2 measures for mHC)."""
    logits = torch.randn(1000, 4, 4, generator=torch.Generator().manual_seed(0)) * 4
    h = sinkhorn_log(logits, 20)
    assert (h.sum(-2) - 1).abs().max() < 1e-6
    assert (h.sum(-1) - 1).abs().max() > 1e-3


@pytest.mark.parametrize("n", (2, 4, 8))
def test_hc_identity_has_identity_mixing_and_no_res_parameters(n):
    layer = randomize(build_layer("hc_identity", n), 0)
    _, _, h = layer.coefficients(random_streams(n))
    assert torch.equal(h, torch.eye(n).expand_as(h))
    assert layer.weight.shape == (n * layer.C, 2 * n) and layer.alpha.numel() == 2


@pytest.mark.parametrize("factors", ([2, 2], [2, 2, 2], [3, 2], [2, 3], [4, 2], [2, 2, 3], [5]), ids=str)
@FAST
@given(seed=st.integers(0, 2**31 - 1))
def test_kronecker_order_is_the_papers(factors, seed):
    """H_res = U^K kron ... kron U^1 (torch.kron), and applying it equals the paper's mode
    products on X tensorized with U^1 on the fastest-varying stream digit."""
    n = math.prod(factors)
    layer = randomize(build_layer("kromhc", n, factors=factors), seed)
    X = random_streams(n, seed=seed)
    _, _, h = layer.coefficients(X)
    Us = layer.factors(X)
    assert [tuple(U.shape[-2:]) for U in Us] == [(i, i) for i in factors]
    for b, t in itertools.product(range(X.shape[0]), range(X.shape[1])):
        expected = Us[-1][b, t]
        for U in reversed(Us[:-1]):
            expected = torch.kron(expected, U[b, t])
        torch.testing.assert_close(h[b, t], expected, atol=1e-7, rtol=0)
    # Mode products: streams reshaped to (i_K, ..., i_1, C); factor k contracts digit k.
    K = len(factors)
    Xt = X.reshape(*X.shape[:2], *reversed(factors), X.shape[-1])
    for k, U in enumerate(Us):
        axis = 2 + (K - 1 - k)
        Xt = torch.movedim(torch.einsum("btij,bt...j->bt...i", U, torch.movedim(Xt, axis, -1)), -1, axis)
    torch.testing.assert_close(Xt.reshape(X.shape), h @ X, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(kron_factors(Us), h)


def test_kron_factor_order_example():
    """A hand-checkable case: U^2 kron U^1 with U^1 = swap, U^2 = identity swaps within pairs."""
    swap, eye = torch.tensor([[0.0, 1.0], [1.0, 0.0]]), torch.eye(2)
    h = kron_factors([swap, eye])
    assert torch.equal(h, torch.tensor([[0.0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]]))


@pytest.mark.parametrize("case", FAMILY_INIT, ids=case_id)
def test_init_values(case):
    """At init (W = 0) every token gets the same coefficients: H_pre = sigmoid(+-1),
    H_post = 2 sigmoid(+-1) with +1 at the home stream, and H_res near the identity, within
    the e^-8 mass the res bias leaves on the other permutations."""
    variant, n, factors = case
    for index in (0, 1, 2 * n + 1):
        layer = build_layer(variant, n, index=index, factors=factors)
        h_pre, h_post, h_res = layer.coefficients(random_streams(n, seed=index))
        signs = -torch.ones(n)
        signs[index % n] = 1
        torch.testing.assert_close(h_pre, torch.sigmoid(signs).expand_as(h_pre))
        torch.testing.assert_close(h_post, 2 * torch.sigmoid(signs).expand_as(h_post))
        eye = torch.eye(n)
        if variant in ("hc", "hc_identity"):
            assert torch.equal(h_res, eye.expand_as(h_res))
        elif variant == "go_mhc":
            # off-diagonal entries ~e^-8 (4 s b^2 to second order), as close to I as mHC's
            dist = (h_res - eye).abs().max().item()
            assert 0.5 * (n - 1) * math.exp(-8) < dist < 1.5 * (n - 1) * math.exp(-8)
        elif variant == "mhc":
            # exp(b) has equal row sums 1 + (n-1)e^-8, so Sinkhorn-Knopp just divides by them.
            expected = torch.exp(-8 * (1 - eye)) / (1 + (n - 1) * math.exp(-8))
            torch.testing.assert_close(h_res, expected.expand_as(h_res), atol=1e-7, rtol=0)
        else:
            sizes = factors or ([n] if variant == "mhc_lite" else layer.factor_sizes)
            bound = sum((math.factorial(i) - 1) * math.exp(-8) for i in sizes)
            dist = (h_res - eye).abs().max().item()
            assert 0 < dist <= bound
        if variant == "kromhc" and factors is None and n in (2, 4):
            assert (h_res - eye).abs().max() < 1e-3  # the paper's claim for 2 x 2 factors


@pytest.mark.parametrize("case", FAMILY_INIT, ids=case_id)
def test_gradients_reach_every_parameter(case):
    """With W = 0 (init) the gradient of W and of the biases is non-zero, while a_* and the
    norm weight get exactly zero (they only scale x'W); away from init every parameter gets
    a non-zero gradient."""
    variant, n, factors = case
    branch, X = make_branch(), random_streams(n)
    R = torch.randn(X.shape, generator=torch.Generator().manual_seed(7))
    layer = build_layer(variant, n, factors=factors)
    (layer(X, branch, None) * R).sum().backward()
    assert layer.weight.grad.abs().sum() > 0 and layer.bias.grad.abs().sum() > 0
    if variant != "hc_identity":
        assert layer.bias.grad[2 * n:].abs().sum() > 0
    assert torch.all(layer.alpha.grad == 0) and torch.all(layer.norm_weight.grad == 0)
    layer.zero_grad()
    randomize(layer, 3)
    Xg = X.clone().requires_grad_()
    (layer(Xg, branch, None) * R).sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    assert Xg.grad.abs().sum() > 0


@pytest.mark.parametrize("case, alpha_shared", [(c, True) for c in CASES if c[1] <= 6]
                         + [(c, False) for c in CASES if c[0] == "kromhc" and c[1] <= 6],
                         ids=lambda v: case_id(v) if isinstance(v, tuple) else ("shared" if v else "per-factor"))
def test_matches_reference_forward_and_grads(case, alpha_shared):
    variant, n, factors = case
    layer = randomize(build_layer(variant, n, factors=factors, alpha_shared=alpha_shared), 5, 0.7)
    ref = randomize(build_layer(variant, n, factors=factors, alpha_shared=alpha_shared), 5, 0.7)
    branch, R = make_branch(), torch.randn(2, 3, n, 8, generator=torch.Generator().manual_seed(9))
    X1, X2 = (random_streams(n).requires_grad_() for _ in range(2))
    out = layer(X1, branch, None)
    expected = reference_forward(variant, ref, X2, branch)
    assert_matches_reference(out, expected, X1, X2, layer, ref, R)


@pytest.mark.parametrize("variant", HC_VARIANTS)
def test_forward_follows_the_h_convention(variant):
    """layer(X, F) == h_res @ X + h_post^T * F(h_pre @ X) with the layer's own coefficients."""
    n = 4
    layer = randomize(build_layer(variant, n), 11)
    X, branch = random_streams(n), make_branch()
    h_pre, h_post, h_res = layer.coefficients(X)
    expected = h_res @ X + h_post.unsqueeze(-1) * branch((h_pre.unsqueeze(-2) @ X).squeeze(-2)).unsqueeze(-2)
    torch.testing.assert_close(layer(X, branch, None), expected, atol=1e-6, rtol=1e-6)
    # and it is the paper's orientation: stream t receives sum_s h_res[t, s] X[s]
    t, s = 0, n - 1
    assert torch.allclose(expected[..., t, :] - h_post[..., t, None] * branch((h_pre.unsqueeze(-2) @ X).squeeze(-2)),
                          sum(h_res[..., t, j, None] * X[..., j, :] for j in range(n)), atol=1e-6)
    assert h_res.shape == (2, 3, n, n) and h_pre.shape == h_post.shape == (2, 3, n)


@pytest.mark.parametrize("n", (2, 3, 4))
def test_single_factor_kromhc_is_mhc_lite(n):
    lite = randomize(build_layer("mhc_lite", n), 2)
    krom = build_layer("kromhc", n, factors=[n])
    krom.load_state_dict(lite.state_dict())
    X, branch = random_streams(n), make_branch()
    for a, b in zip(lite.coefficients(X), krom.coefficients(X)):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=0)
    torch.testing.assert_close(lite(X, branch, None), krom(X, branch, None), atol=1e-7, rtol=0)


@pytest.mark.parametrize("variant", HC_VARIANTS)
def test_coefficients_are_fp32_for_bf16_streams_and_under_autocast(variant):
    n = 4
    layer = randomize(build_layer(variant, n), 4)
    X = random_streams(n, dtype=torch.bfloat16)
    plain = layer.coefficients(X)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = layer.coefficients(X)
        out = layer(X, torch.tanh, None)
    for a, b in zip(plain, auto):
        assert a.dtype == b.dtype == torch.float32
        assert torch.equal(a, b)  # autocast did not get to round the projection
    assert out.dtype == torch.bfloat16
    # Mixes accumulate in fp32 and round once: the fp32 computation on the same inputs,
    # rounded to bf16, matches to within one bf16 rounding step.
    h_pre, h_post, h_res = plain
    Xf = X.float()
    u = (h_pre.unsqueeze(-2) @ Xf).squeeze(-2).bfloat16()
    expected = h_res @ Xf + h_post.unsqueeze(-1) * torch.tanh(u).float().unsqueeze(-2)
    torch.testing.assert_close(out.float(), expected, atol=1e-6, rtol=2**-8)


@pytest.mark.parametrize("variant", ("mhc", "kromhc"))
def test_recompute_matches_and_is_differentiable(variant):
    n = 4
    plain = randomize(build_layer(variant, n), 6)
    again = randomize(build_layer(variant, n, recompute=True), 6)
    X1, X2 = (random_streams(n).requires_grad_() for _ in range(2))
    out1, out2 = plain(X1, make_branch(), None), again(X2, make_branch(), None)
    torch.testing.assert_close(out1, out2)
    out1.square().sum().backward()
    out2.square().sum().backward()
    torch.testing.assert_close(X1.grad, X2.grad)
    for p, q in zip(plain.parameters(), again.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


@pytest.mark.parametrize("variant", HC_VARIANTS)
def test_traces_as_one_graph(variant):
    """No graph breaks, no .item(), no data-dependent branches: dynamo captures the whole
    layer (eager backend: tracing only, no code generation)."""
    n = 4
    layer = randomize(build_layer(variant, n, recompute=variant == "mhc"), 8)
    branch = make_branch()
    compiled = torch.compile(lambda X: layer(X, branch, None), backend="eager", fullgraph=True)
    X = random_streams(n)
    torch.testing.assert_close(compiled(X), layer(X, branch, None))


def test_permutation_buffers_are_rebuilt_by_init_weights():
    """Built on the meta device, then materialized: init_weights fills the non-persistent
    buffers, which the state dict does not carry."""
    with torch.device("meta"):
        conn = connections.build(hc_config("kromhc", 6))
    conn.to_empty(device="cpu")
    conn.init_weights()
    layer = conn.layers[0]
    assert not any(name.startswith("perms") for name in layer.state_dict())
    assert torch.equal(layer.res_map.perms_2, torch.tensor([[1.0, 0, 0, 1], [0, 1, 1, 0]]))
    assert torch.equal(layer.res_map.perms_3.sum(0), 2 * torch.ones(9))  # each entry in (3-1)! permutations
    assert torch.equal(layer.res_map.perms_3[0], torch.eye(3).flatten())


def test_stream_state_stays_contiguous_and_in_compute_dtype():
    conn = connections.build(hc_config("kromhc", 4, n_layer=1))
    conn.init_weights()
    x0 = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    X = conn.expand(x0)
    assert X.shape == (2, 3, 4, 8) and X.is_contiguous() and torch.equal(X[:, :, 2], x0)
    for layer in conn.layers:
        X = layer(X, make_branch(), x0)
        assert X.dtype == torch.bfloat16 and X.is_contiguous()
    torch.testing.assert_close(conn.reduce(X), X.float().sum(-2).bfloat16())


# ----- configuration -----

@pytest.mark.parametrize("overrides, message", [
    (dict(hc="dense"), "unknown connection variant"),
    (dict(hc="kromhc", hc_streams=1), "hc_streams >= 2"),
    (dict(hc="mhc", hc_streams=1), "hc_streams >= 2"),
    (dict(hc="kromhc", hc_streams=8, hc_factors=[2, 2]), "multiply to 4, not hc_streams=8"),
    (dict(hc="kromhc", hc_streams=12, hc_factors=[6, 2]), "factor 6 > 5"),
    (dict(hc="kromhc", hc_streams=7), "nearby n such as 6 or 8"),
    (dict(hc="kromhc", hc_streams=14), "nearby n such as 12 or 15"),
    (dict(hc="kromhc", hc_streams=4, hc_factors=[1, 4]), "integer >= 2"),
    (dict(hc="mhc_lite", hc_streams=8), "at most 6 streams"),
    (dict(hc="mhc", hc_factors=[2, 2]), "only applies to hc='kromhc'"),
    (dict(hc="residual", hc_factors=[2, 2]), "only applies to hc='kromhc'"),
    (dict(hc="mhc", hc_sk_iters=0), "at least 1 Sinkhorn"),
    (dict(hc="mhc_lite", hc_alpha_shared=False), "only applies to hc='kromhc'"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_invalid_configurations_raise_one_clear_error(overrides, message):
    from nanochat.gpt import GPTConfig
    base = dict(sequence_len=16, vocab_size=64, n_layer=1, n_head=2, n_kv_head=2, n_embd=16)
    with pytest.raises(ValueError, match=message):
        GPTConfig(**base, **overrides)


@pytest.mark.parametrize("hc, streams, factors, expected", [
    ("kromhc", 0, [], (4, [2, 2])),
    ("kromhc", 12, [], (12, [3, 2, 2])),
    ("kromhc", 0, [3, 2], (6, [3, 2])),
    ("kromhc", 10, [], (10, [5, 2])),
    ("mhc", 0, [], (4, [])),
    ("residual", 0, [], (1, [])),
])
def test_defaults_are_filled_in_the_config(hc, streams, factors, expected):
    cfg = hc_config(hc, streams, factors=factors)
    connections.resolve_config(cfg)
    connections.resolve_config(cfg)  # idempotent: the model resolves again when it builds
    assert (cfg.hc_streams, cfg.hc_factors) == expected


def assert_matches_reference(out, expected, X1, X2, layer, ref, R):
    """Forward equal to the reference, and so are the gradients of the streams and of every
    parameter after backpropagating the same random projection R of the output."""
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    (out * R).sum().backward()
    (expected * R).sum().backward()
    torch.testing.assert_close(X1.grad, X2.grad, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(layer.named_parameters(), ref.parameters()):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5, msg=name)
