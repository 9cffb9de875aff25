"""hc_kernels = fused (nanochat/connections/backends/fused.py, fused_kernels.py): our Triton seam kernels
against the PyTorch path, on CPU tensors in Triton's interpreter (conftest.py turns it on),
tiny shapes whose token and channel counts are not multiples of the kernels' blocks.

Per seam (one boundary between sub-layers): the post/res mix, the next layer's coefficients
and its read, forward and every gradient, for every HC variant at n = 2, 3, 4, 8 (where the
variant allows it), current and delayed pre-weights, the entry (given streams), the exit into
each reduce, and a layer called alone; fp32 to 1e-5 relative, bf16 to its rounding. Per
model: a GPT on `fused` against the same weights on `torch`, its loss and every parameter's
gradient, for each variant and option (LSS, the learned head, no norm weight, one alpha per
factor, delayed pre-weights); two backward passes bitwise equal; the custom ops' fake and
autograd registrations, one graph under dynamo; where the kernels run and where not, and the
configuration errors."""

import copy
import dataclasses
import functools
import re

import pytest
import torch
import torch._dynamo

from nanochat.checkpoint_manager import model_from_state
from nanochat.connections.backends import fused, ops
from nanochat.connections.frame import LearnedHead
from nanochat.gpt import GPTConfig, build_model, norm
from test_connections import build_layer, make_branch, randomize
from test_gpt import randomize as randomize_model

pytest.importorskip("triton", reason="needs the kernels extra: pip install -e '.[kernels]'")

TOL = 1e-5  # relative, in norm (fp32)
BF16_TOL = 2e-2  # bf16 streams: a few roundings of 2^-8
N_TOKENS = 21  # not a multiple of a program's tokens (fused.BLOCK_T, fused.backward_tiling)
C = 40  # not a multiple of the channel chunk (32 for n <= 4, 16 for n = 8)
EPS = ops.RMS_EPS
# every HC-family variant, at the n it allows among 2, 3, 4, 8 (mhc_lite: n! permutations, <= 6)
VARIANTS = ("hc", "hc_identity", "mhc", "mhc_lite", "kromhc", "cmhc", "go_mhc")
SEAM_CASES = [(v, n) for v in VARIANTS for n in (2, 3, 4, 8) if not (v == "mhc_lite" and n == 8)]


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def layer_of(variant, n, seed=21, **kw):
    return randomize(build_layer(variant, n, C=C, **kw), seed, 0.8)


def inputs(n, seed=1, dtype=torch.float32, N=N_TOKENS, scale=1.0):
    """X, y, h_post, h_res of the sub-layer before a seam, leaves that require grad."""
    g = torch.Generator().manual_seed(seed)
    X = (scale * torch.randn(N, n, C, generator=g)).to(dtype)
    y = (scale * torch.randn(N, C, generator=g)).to(dtype)
    h_post = 2 * torch.rand(N, n, generator=g)
    h_res = torch.rand(N, n, n, generator=g)
    return [t.requires_grad_() for t in (X, y, h_post, h_res)]


def torch_seam(X, y, post, read, target, normed=False):
    """The same boundary on the PyTorch path: the post mix, then the target's coefficients
    (ops.py and the layer's own gates) and its read, through the model's input norm when
    `normed`."""
    X_next = X if y is None else ops.mix_post(post[1], X, post[0], y)
    h_post = h_res = carry = None
    if target is None:
        h_read = read
    elif isinstance(target, LearnedHead):
        h_read = target.weights(X_next)
    else:
        h_pre, h_post, h_res = target.coefficients(X_next)
        h_res = target.mix_matrix(h_res)
        h_read, carry = (h_pre, None) if read is None else (read, h_pre)
    u = ops.mix_pre(h_read, X_next) if h_read is not None else None
    return fused.SeamOut(X_next, norm(u) if normed else u, h_post, h_res, carry)


def fused_seam(X, y, post, read, target, normed=False, design="onepass"):
    return fused.seam(X, y, post, read=read, target=target, eps=EPS, write_x=True, norm=normed, design=design)


def run(fn, leaves, params, *args, seed=5):
    """Every output of a seam, and the gradients of the leaves and parameters after a random
    projection of all of them."""
    for t in (*leaves, *params):
        t.grad = None
    out = fn(*args)
    g = torch.Generator().manual_seed(seed)
    loss = sum((v.float() * torch.randn(v.shape, generator=g)).sum() for v in out if v is not None)
    loss.backward()
    return out, [None if t.grad is None else t.grad.clone() for t in (*leaves, *params)]


def assert_same(out_t, grads_t, out_f, grads_f, tol=TOL, names=(), truth=None):
    """Every output and gradient of the fused seam within `tol` of the torch path's; or, given
    `truth` (a function returning the torch path's outputs and gradients in fp64), at least
    as close to the fp64 values as the torch path's own: where a gradient amplifies rounding
    (go-mHC's Cayley inverse), two fp32 sums in different orders differ by more than either
    differs from the exact value."""
    exact = functools.cache(truth) if truth is not None else None

    def close(label, a, b, i):
        err = rel_err(b, a)
        if err < tol:
            return
        assert exact is not None, (label, err)
        d = exact()[i[0]][i[1]]
        assert rel_err(b, d) <= rel_err(a, d), (label, err, rel_err(b, d), rel_err(a, d))

    for i, (name, a, b) in enumerate(zip(fused.SeamOut._fields, out_t, out_f)):
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape, name
            close(name, a, b, (0, i))
    for i, (a, b) in enumerate(zip(grads_t, grads_f)):
        label = names[i] if i < len(names) else i
        assert (a is None) == (b is None), label
        if a is not None:
            assert a.dtype == b.dtype, label
            close(label, a, b, (1, i))


def compare(read_fn, target, n, dtype=torch.float32, tol=TOL, source="post", seed=1, normed=False, scale=1.0,
            design="onepass"):
    """One seam both ways: X_next from the post mix (source "post") or given, `read_fn(X)`
    the read weights passed in (None: the target's own), the read normed or not; the fused
    seam of `design` (fused.DESIGNS)."""
    X, y, h_post, h_res = inputs(n, seed, dtype, scale=scale)
    if getattr(getattr(target, "res_map", None), "identity", False):
        h_res = None  # hc_identity: the layer before mixes nothing either
    leaves = {"X": X} if source == "given" else {"X": X, "y": y, "h_post": h_post, "h_res": h_res}
    read = read_fn(X).requires_grad_() if read_fn is not None else None
    leaves["read"] = read
    leaves = {name: t for name, t in leaves.items() if t is not None}
    params = dict(target.named_parameters()) if target is not None else {}
    args = (X, None, (None, None)) if source == "given" else (X, y, (h_post, h_res))
    out_t, grads_t = run(torch_seam, leaves.values(), params.values(), *args, read, target, normed)
    out_f, grads_f = run(functools.partial(fused_seam, design=design), leaves.values(), params.values(), *args, read,
                         target, normed)

    def exact():
        """The torch path's outputs and gradients in fp64, on the same values."""
        leaves64 = {name: t.detach().double().requires_grad_() for name, t in leaves.items()}
        target64 = copy.deepcopy(target).double() if target is not None else None
        params64 = list(target64.parameters()) if target64 is not None else []
        X64, y64, h_post64, h_res64, read64 = map(leaves64.get, ("X", "y", "h_post", "h_res", "read"))
        args64 = (X64, None, (None, None)) if source == "given" else (X64, y64, (h_post64, h_res64))
        return run(torch_seam, leaves64.values(), params64, *args64, read64, target64, normed)

    assert_same(out_t, grads_t, out_f, grads_f, tol, [*leaves, *params],
                truth=exact if dtype == torch.float32 else None)


def random_read(n):
    return lambda X: torch.rand(X.shape[0], n, generator=torch.Generator().manual_seed(9))


# ----- per seam -----

@pytest.mark.parametrize("design", fused.DESIGNS)
@pytest.mark.parametrize("variant, n", SEAM_CASES, ids=[f"{v}-n{n}" for v, n in SEAM_CASES])
def test_seam_matches_torch(variant, n, design):
    """Between two layers, current pre-weights: X_next = h_res X + h_post^T y, the next
    layer's projection, coefficients (H_res on chip, or in PyTorch for go_mhc) and read."""
    compare(None, layer_of(variant, n), n, design=design)


@pytest.mark.parametrize("design", fused.DESIGNS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_delayed_seam_matches_torch(variant, design):
    """Delayed pre-weights: X_next is read with the weights carried in, in the same pass, and
    the layer's own pre-weights are carried on."""
    compare(random_read(3), layer_of(variant, 3, pre="delayed"), 3, design=design)


@pytest.mark.parametrize("design", fused.DESIGNS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_entry_seam_matches_torch(variant, design):
    """The first seam: the streams given (expand's output), no post mix."""
    compare(None, layer_of(variant, 4), 4, source="given", design=design)


@pytest.mark.parametrize("design", fused.DESIGNS)
@pytest.mark.parametrize("kind", ["sum", "carried", "learned"])
def test_exit_seams_match_torch(kind, design):
    """The last post mix folded into the reduce: the sum (read weights all one), the carried
    pre-weights, or the learned head's projection."""
    n = 4
    if kind == "learned":
        head = LearnedHead(n, C)
        head.init_weights()
        with torch.no_grad():
            head.weight.normal_(0, 0.2, generator=torch.Generator().manual_seed(3))
            head.bias.normal_(0, 1.0, generator=torch.Generator().manual_seed(4))
            head.alpha.fill_(0.7)
        compare(None, head, n, design=design)
    elif kind == "carried":
        compare(random_read(n), None, n)
    else:
        compare(lambda X: torch.ones(X.shape[0], n), None, n)


NORMED_CASES = [("kromhc", None, torch.float32), ("mhc", 3, torch.float32), ("go_mhc", None, torch.float32),
                ("kromhc", None, torch.bfloat16), ("hc_identity", 3, torch.bfloat16)]


@pytest.mark.parametrize("variant, delayed, dtype", NORMED_CASES,
                         ids=[f"{v}-{'delayed' if d else 'current'}-{str(t)[6:]}" for v, d, t in NORMED_CASES])
@pytest.mark.parametrize("design", fused.DESIGNS)
def test_seam_writes_the_sub_layers_input_normed(variant, delayed, dtype, design):
    """In the model's trunk the seam writes the sub-layer's input through the sub-layer's own
    RMSNorm (nanochat.gpt.norm: epsilon that of fp32 for bf16 streams too, F.rms_norm's), the
    backward of the norm folded in; streams of a small scale, where the epsilon tells."""
    n = 4
    read_fn = random_read(n) if delayed else None
    compare(read_fn, layer_of(variant, n, pre="delayed" if delayed else "current"), n, dtype=dtype,
            tol=TOL if dtype == torch.float32 else BF16_TOL, normed=True, scale=0.02, design=design)


@pytest.mark.parametrize("design", fused.DESIGNS)
@pytest.mark.parametrize("variant", ["kromhc", "mhc", "go_mhc"])
def test_bf16_streams_agree_to_their_rounding(variant, design):
    """bf16 streams in and out, each value rounded once; gradients of the streams in bf16,
    of the coefficients and parameters in fp32."""
    compare(None, layer_of(variant, 4), 4, dtype=torch.bfloat16, tol=BF16_TOL, design=design)


@pytest.mark.parametrize("design", fused.DESIGNS)
def test_block_multiple_token_counts(design):
    """A token count that fills every block of every kernel exactly, and one with a single token."""
    layer = layer_of("kromhc", 4)
    read_tokens = fused.READ_ROW_ELEMENTS // fused.next_power_of_two(C)  # the split read's whole rows
    for N in (2 * max(fused.BLOCK_T, read_tokens, *(t[0] for t in fused.SPLIT_TILING.values())), 1):
        X, y, h_post, h_res = inputs(4, N=N)
        out_t, grads_t = run(torch_seam, [X, y, h_post, h_res], list(layer.parameters()), X, y, (h_post, h_res),
                             None, layer)
        out_f, grads_f = run(functools.partial(fused_seam, design=design), [X, y, h_post, h_res],
                             list(layer.parameters()), X, y, (h_post, h_res), None, layer)
        assert_same(out_t, grads_t, out_f, grads_f)


def test_split_mix_splits_the_channels_until_the_gpu_is_full():
    """Split-K in the split design's mix kernel: D=12's batch fills the GPU unsplit; a quarter
    of it splits in 4; a split is never less than a chunk; the splits cover the channels."""
    mix = fused.split_phases(fused.Seam(4, design="split", coef="gates"), False, 768)[0]
    assert mix.block_t >= 64  # the tensor-core products' tokens
    assert fused.mix_splits(32 * 2048, 768, mix) == fused.Split(1, 768)
    assert fused.mix_splits(8 * 2048, 768, mix) == fused.Split(4, 768 // 4)
    assert fused.mix_splits(16, 40, mix) == fused.Split(2, 32)  # 3 chunks of 16: 2 + 1
    assert fused.mix_splits(64, 4096, mix).count == fused.MAX_MIX_SPLITS
    for N, C_ in ((1, 16), (7, 100), (64, 4096)):
        split = fused.mix_splits(N, C_, mix)
        assert split.channels % mix.block_c == 0
        assert (split.count - 1) * split.channels < C_ <= split.count * split.channels


@pytest.mark.parametrize("min_programs", [1, fused.MIN_MIX_PROGRAMS])
def test_split_k_partials_add_up_to_the_projection(min_programs, monkeypatch):
    """The mix kernel unsplit (one program per token tile) and split over the channels (the
    tiny test shapes launch under MIN_MIX_PROGRAMS: 2 splits) give the torch path's seam, and
    a split seam run twice is bitwise the same (the partial sums are added in order, no
    atomics)."""
    monkeypatch.setattr(fused, "MIN_MIX_PROGRAMS", min_programs)
    mix = fused.split_phases(fused.Seam(4, design="split", coef="gates"), False, C)[0]
    assert fused.mix_splits(N_TOKENS, C, mix).count == (1 if min_programs == 1 else 2)
    compare(None, layer_of("kromhc", 4), 4, normed=True, design="split")
    layer = layer_of("mhc", 4)
    X, y, h_post, h_res = inputs(4)
    first, second = (run(functools.partial(fused_seam, normed=True, design="split"), [X, y, h_post, h_res],
                         list(layer.parameters()), X, y, (h_post, h_res), None, layer) for _ in range(2))
    for a, b in zip([*first[0], *first[1]], [*second[0], *second[1]]):
        assert (a is None and b is None) or torch.equal(a, b)


@pytest.mark.parametrize("variant, pre", [(v, p) for v in ("kromhc", "mhc", "hc_identity", "go_mhc")
                                          for p in ("current", "delayed")])
def test_layer_called_alone_matches_torch(variant, pre):
    """layer(X, branch) with hc_kernels='fused': its read and its post mix as two seams."""
    layers = [randomize(build_layer(variant, 4, C=C, pre=pre, kernels=k), 21, 0.8) for k in ("torch", "fused")]
    branch = make_branch(C)
    X = torch.randn(2, 7, 4, C, generator=torch.Generator().manual_seed(3))
    R = torch.randn(X.shape, generator=torch.Generator().manual_seed(4))
    results = []
    for layer in layers:
        Xg = X.clone().requires_grad_()
        out = layer(Xg, branch)
        (out * R).sum().backward()
        results.append((out, Xg.grad, {k: p.grad for k, p in layer.named_parameters()}))
    (out_t, gX_t, grads_t), (out_f, gX_f, grads_f) = results
    assert rel_err(out_f, out_t) < TOL and rel_err(gX_f, gX_t) < TOL
    for name, g in grads_t.items():
        assert rel_err(grads_f[name], g) < TOL, name


# ----- per model -----

# Every option once (the seam tests hold every variant and n): delayed pre-weights with and
# without an H_res on chip, LSS, the learned head, one alpha per factor, no norm weight, an n
# that is not a power of two, H_res = I.
MODEL_CASES = [
    dict(hc="kromhc"), dict(hc="mhc", hc_pre="delayed"), dict(hc="go_mhc"), dict(hc="go_mhc", hc_pre="delayed"),
    dict(hc="kromhc", hc_expand="lss", hc_reduce="learned"), dict(hc="kromhc", hc_streams=8, hc_alpha_shared=False),
    dict(hc="mhc_lite", hc_norm_weight=False), dict(hc="kromhc", hc_streams=6, hc_pre="delayed", hc_expand="lss"),
    dict(hc="hc_identity", hc_streams=3),
    # the 2026-07 trunk: the backout reads the stream a seam wrote after block 1 of 3, and its
    # carried pre-weights
    dict(hc="kromhc", trunk="2026-07", n_layer=3), dict(hc="mhc", hc_pre="delayed", trunk="2026-07", n_layer=3),
]


def model_case_id(case):
    return "-".join(f"{v}" for v in case.values())


def tiny_gpt(kernels, dtype=torch.float32, **fields):
    """One block: its two sub-layers make every kind of seam (entry, between layers, exit)."""
    torch.manual_seed(0)
    cfg = GPTConfig(**{"sequence_len": 12, "vocab_size": 64, "n_layer": 1, "n_head": 2, "n_kv_head": 2, "n_embd": 32,
                       "hc_kernels": kernels, **fields})
    return randomize_model(build_model(cfg, "cpu"), 0).to(dtype)


def loss_and_grads(model, idx, run=None):
    """The loss of `run` (default: the model) and the gradient of each of the model's parameters."""
    model.zero_grad(set_to_none=True)
    loss = (model if run is None else run)(idx, idx)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def batch():
    return torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("design", fused.DESIGNS)
@pytest.mark.parametrize("case", MODEL_CASES, ids=model_case_id)
def test_model_matches_torch(case, design):
    """The loss and every parameter's gradient of a GPT on fused seams equal the torch path's
    with the same weights: all gradients together within 1e-5 of the fp32 torch path's. Per
    entry, fp32 sums over tokens in another order differ by their rounding, which a few small
    gradients magnify (an alpha whose terms nearly cancel, one that vanishes exactly on the
    first layer's identical streams: fp32 gives ~1e-9 where fp64 gives 1e-18), while a wrong
    gradient is wrong by its own size: each entry is held to the fp64 torch path's within
    1e-4 of itself plus fp32's resolution of the model's largest gradient (1e-7 of it)."""
    idx = batch()
    loss_f, grads_f = loss_and_grads(tiny_gpt("fused", hc_seam=design, **case), idx)
    loss_t, grads_t = loss_and_grads(tiny_gpt("torch", **case), idx)
    _, grads_64 = loss_and_grads(tiny_gpt("torch", torch.float64, **case), idx)
    assert abs(loss_f - loss_t) <= 1e-6 * abs(loss_t)
    assert grads_f.keys() == grads_t.keys()
    flat = lambda grads: torch.cat([g.flatten().double() for g in grads.values()])  # noqa: E731
    assert rel_err(flat(grads_f), flat(grads_t)) < TOL
    floor = 1e-7 * max(g.abs().max().item() for g in grads_64.values())
    for name, g64 in grads_64.items():
        torch.testing.assert_close(grads_f[name].double(), g64, rtol=1e-4, atol=floor, msg=name)


def test_model_trains_in_bf16_like_torch():
    """Under bf16 autocast: the same loss and gradients to bf16's rounding."""
    idx = batch()
    results = []
    for kernels in ("torch", "fused"):
        model = tiny_gpt(kernels, hc="kromhc")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            results.append(loss_and_grads(model, idx))
    (loss_t, grads_t), (loss_f, grads_f) = results
    assert abs(loss_f - loss_t) < 1e-2 * abs(loss_t)
    for name, g in grads_t.items():
        assert grads_f[name].dtype == g.dtype
        assert rel_err(grads_f[name], g) < 5e-2, name


@pytest.mark.parametrize("case", [dict(hc="mhc"), dict(hc="kromhc", hc_pre="delayed", hc_reduce="sum"),
                                  dict(hc="kromhc", hc_seam="split"), dict(hc="go_mhc", hc_seam="split")],
                         ids=model_case_id)
def test_two_backward_passes_are_bitwise_equal(case):
    model, idx = tiny_gpt("fused", **case), batch()
    first = loss_and_grads(model, idx)
    second = loss_and_grads(model, idx)
    assert torch.equal(first[0], second[0])
    for name, g in first[1].items():
        assert torch.equal(g, second[1][name]), name


# TMA (fused.uses_tma): projected and given pre-weights, and the learned head's exit seam, which
# projects; 48 channels, a partial last chunk, and 24 tokens, a partial tile, so that boxes
# reach past both the channels and the tokens (the loads are one helper whatever the H_res map)
TMA_CASES = [dict(hc="kromhc"), dict(hc="mhc", hc_pre="delayed"), dict(hc="kromhc", hc_expand="lss", hc_reduce="learned")]


@pytest.mark.parametrize("design", fused.DESIGNS)
@pytest.mark.parametrize("case", TMA_CASES, ids=model_case_id)
def test_tma_loads_what_the_masked_loads_load(case, design, monkeypatch):
    """The streams loaded through tensor descriptors (sm_90's TMA) give the loss and every
    gradient bitwise as the masked loads do."""
    decided, kernels = [], []
    uses_tma, tma_kernel = fused.uses_tma, fused.tma_kernel
    monkeypatch.setattr(fused, "uses_tma", lambda *streams: decided.append(uses_tma(*streams)) or decided[-1])
    monkeypatch.setattr(fused, "tma_kernel", lambda *a: kernels.append(tma_kernel(*a)) or kernels[-1])
    results = []
    for tma in (False, True):
        monkeypatch.setattr(fused, "TMA", tma)
        results.append(loss_and_grads(tiny_gpt("fused", hc_seam=design, n_embd=48, **case), batch()))
    # the launches with TMA on loaded through it where their kernel has products
    assert any(decided) and not all(decided) and any(kernels)
    (loss, grads), (loss_tma, grads_tma) = results
    assert torch.equal(loss, loss_tma)
    for name, g in grads.items():
        assert torch.equal(g, grads_tma[name]), name


def test_tma_needs_to_be_on_and_aligned_rows(monkeypatch):
    """Off until turned on (fused.TMA); then rows of a multiple of 16 bytes at 16-byte
    addresses, on Hopper (9.0) or later, or in the interpreter."""
    rows = torch.empty(5, 4, 48)
    assert not fused.uses_tma(rows)
    monkeypatch.setattr(fused, "TMA", True)
    assert fused.uses_tma(rows, torch.empty(5, 48))
    assert not fused.uses_tma(torch.empty(5, 4, 42))  # 168-byte rows
    assert not fused.uses_tma(rows, torch.empty(5 * 48 + 1)[1:].view(5, 48))  # 4 bytes past an alignment
    assert not fused.has_tma(8) and fused.has_tma(9) and fused.has_tma(10)


def test_tma_on_cuda_needs_hopper_or_later_and_not_rocm(monkeypatch):
    """On a CUDA tensor, TMA by its GPU's compute capability (9.0 and later), never on ROCm, and
    with Triton's allocator readied for the descriptors' scratch memory first."""
    from types import SimpleNamespace
    readied = []
    monkeypatch.setattr(fused, "_tma_scratch_ready", lambda: readied.append(True) or True)
    monkeypatch.setattr(fused, "TMA", True)
    stream = SimpleNamespace(is_cuda=True, device="cuda:0", shape=(5, 4, 48), data_ptr=lambda: 1024,
                             element_size=lambda: 2)
    for major, hip, expect in [(8, None, False), (9, None, True), (10, None, True), (9, "6.2", False)]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device, major=major: (major, 0))
        monkeypatch.setattr(torch.version, "hip", hip)
        readied.clear()
        assert fused.uses_tma(stream) is expect and readied == [True] * expect, (major, hip)


def test_weight_gradient_reduces_over_token_chunks():
    """The weight gradient splits the tokens into chunks whose partial sums add up exactly as
    one product does (a token count spanning several chunks, with a ragged last one)."""
    N, D, K = 1000, 40, 48
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 2, D // 2, generator=g)
    grad = torch.randn(N, K, generator=g)
    grid, steps, _ = fused.weight_grad_grid(N, D)
    assert grid[1] > 1 and N % (steps * fused.WEIGHT_GRAD_BLOCK_TT)
    torch.testing.assert_close(fused.weight_grad(x, grad), x.flatten(1).double().T.matmul(grad.double()).float(),
                               rtol=1e-5, atol=1e-5)


# ----- the frame: registrations, compile, dispatch, errors -----

def test_custom_ops_pass_opcheck():
    """Schema, fake implementations, autograd registration and AOT dispatch of the seam ops."""
    layer = layer_of("kromhc", 4)
    X, y, h_post, h_res = inputs(4)
    t = fused.layer_target(layer)
    seam = fused.Seam(4, source="post", read="projected", write_x=True, eps=EPS, **t.fields)
    args = (X, y, h_post, h_res, None, t.w.detach().requires_grad_(), t.scale.detach().requires_grad_(),
            t.bias.detach().requires_grad_(), t.table)
    torch.library.opcheck(fused._seam, (*args, None, [], seam.encode()))
    given = fused.Seam(4, source="given", read="given", eps=EPS)
    torch.library.opcheck(fused._seam, (X, None, None, None, torch.rand(N_TOKENS, 4, requires_grad=True), None, None,
                                        None, None, None, [], given.encode()))
    # a stream checkpoint: X recomputed in backward from the stream before it and one post mix,
    # X_next not kept (the backward kernel writes it again for the weight gradient)
    X0, y0, h_post0, h_res0 = (t.detach() for t in inputs(4, seed=2))
    X = fused.restream(X0, [y0, h_post0, h_res0], 1, True, EPS, 4).requires_grad_()
    recomputed = dataclasses.replace(seam, recompute=1, keep_next=False)
    torch.library.opcheck(fused._seam, (X, *args[1:], X0, [y0, h_post0, h_res0], recomputed.encode()))


@pytest.mark.parametrize("K, design", [(1, "onepass"), (2, "onepass"), (1, "split")])
def test_model_traces_as_one_graph_and_compiles_like_eager(K, design):
    """The forward compiles as one graph (fullgraph: a graph break would raise), and the
    AOT-traced forward and backward (fake implementations, the registered backward) equal
    eager; with stream checkpoints (K = 2) and the split design too."""
    model, idx = tiny_gpt("fused", hc="mhc", hc_stream_checkpoint=K, hc_seam=design), batch()
    torch._dynamo.reset()
    loss_e, grads_e = loss_and_grads(model, idx)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    loss_c, grads_c = loss_and_grads(model, idx, compiled)
    assert torch.allclose(loss_c, loss_e)
    for name, g in grads_e.items():
        assert rel_err(grads_c[name], g) < TOL, name


def test_only_training_reaches_the_kernels(monkeypatch):
    """A forward with autograd runs the seams (one per boundary: 2 layers, 3 seams); one
    without (evaluation, generation) runs the torch ops, whose function is the same."""
    calls = []
    real = fused._seam

    def counted(*args):
        calls.append(args[-1])
        return real(*args)
    monkeypatch.setattr(fused, "_seam", counted)
    model, idx = tiny_gpt("fused", hc="kromhc"), batch()
    logits = model(idx)
    assert len(calls) == 3
    calls.clear()
    with torch.no_grad():
        assert torch.allclose(model(idx), logits.detach(), rtol=1e-5, atol=1e-6)
    assert calls == []


def test_cpu_without_the_interpreter_is_one_clear_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    model, idx = tiny_gpt("fused", hc="kromhc"), batch()
    with pytest.raises(RuntimeError, match="hc_kernels='torch' or 'auto'"):
        model(idx, idx)
    with torch.no_grad():
        model(idx)  # evaluation runs the torch ops anywhere


@pytest.mark.parametrize("overrides, message", [
    (dict(hc="frac"), "hc_kernels='fused' does not run hc='frac'"),
    (dict(hc="gated"), "hc_kernels='fused' does not run hc='gated'"),
    (dict(hc="attnres"), "hc_kernels='fused' does not run hc='attnres'"),
    (dict(hc="residual"), "hc_kernels='fused' does not run hc='residual'"),
    (dict(hc="static_hc"), "hc_kernels='fused' does not run hc='static_hc'"),
])
def test_wirings_without_seams_refuse_fused(overrides, message):
    """What a wiring does not declare (SPEC backends) is refused at configuration, the HC
    family members with layers of their own included; auto runs them on torch."""
    with pytest.raises(ValueError, match=message):
        GPTConfig(hc_kernels="fused", **overrides)
    assert build_model(GPTConfig(hc_kernels="auto", sequence_len=8, vocab_size=64, n_layer=1, n_head=2, n_kv_head=2,
                                 n_embd=32, **overrides), "cpu").connections.kernels == "torch"


def test_missing_triton_names_the_extra(monkeypatch):
    monkeypatch.setattr(fused, "AVAILABLE", False)
    with pytest.raises(ValueError, match=r"pip install -e '\.\[kernels\]'"):
        GPTConfig(hc="kromhc", hc_kernels="fused")


@pytest.mark.parametrize("missing", ["interpreter", "install"])
def test_fused_checkpoint_evaluates_where_the_kernels_cannot_run(monkeypatch, missing):
    """A model trained with the kernels loads with `auto` where they cannot run and computes
    the same logits."""
    model = tiny_gpt("fused", hc="kromhc")
    idx = batch()
    with torch.no_grad():
        expected = model(idx)
    if missing == "interpreter":
        monkeypatch.delenv("TRITON_INTERPRET")
    else:
        monkeypatch.setattr(fused, "AVAILABLE", False)
    loaded = model_from_state(dataclasses.asdict(model.config), model.state_dict(), "cpu")
    assert loaded.config.hc_kernels == "auto"
    with torch.no_grad():
        assert torch.allclose(loaded(idx), expected, rtol=1e-5, atol=1e-6)


def test_kernel_table_of_the_permutation_mixture():
    """KromHC 2 x 2: the table's expanded permutations multiply to the Kronecker product
    (U^2 on the slow digit), each group's columns marked, the padding in none."""
    layer = layer_of("kromhc", 4)
    tab = layer.res_map.table()
    NP = 4
    E, group = tab[:, :NP * NP], tab[:, NP * NP]
    assert group.tolist()[:4] == [0, 0, 1, 1] and (group[4:] == -1).all()
    a = torch.tensor([0.3, 0.7, 0.6, 0.4])
    H = (a[:2] @ E[:2]) * (a[2:4] @ E[2:4])
    U1 = torch.tensor([[0.3, 0.7], [0.7, 0.3]])
    U2 = torch.tensor([[0.6, 0.4], [0.4, 0.6]])
    torch.testing.assert_close(H.view(NP, NP)[:4, :4], torch.kron(U2, U1))


def test_the_widest_maps_take_fewer_tokens_per_backward_program():
    """A backward program holds a tokens x KBX tile of res logits: the maps past 16 columns
    (mhc-lite, go-mHC) halve their tokens and double their warps (scripts.kernel_check finds
    them spilling otherwise), and their grid follows."""
    for variant, wide in (("kromhc", False), ("mhc", False), ("mhc_lite", True), ("go_mhc", True)):
        fields = fused.layer_target(layer_of(variant, 4)).fields
        seam = fused.Seam(4, source="post", read="projected", **fields)
        constexprs = seam.backward_constexprs()
        block, warps = fused.backward_tiling(constexprs["KBX"])
        assert constexprs["BLOCK_T"] == block == (fused.BLOCK_T // 2 if wide else fused.BLOCK_T)
        assert warps == (2 * fused.NUM_WARPS if wide else fused.NUM_WARPS)
        assert seam.forward_constexprs()["BLOCK_T"] == fused.BLOCK_T
        assert fused.seam_grid(100, block) == (-(-100 // block),)


# ----- stream checkpoints (hc_stream_checkpoint) -----

# 2 blocks: 5 seams, which neither K = 2 nor K = 3 divides; an H_res off chip (go-mHC at m = 12),
# H_res = I, the learned head, delayed pre-weights and the 2026-07 trunk's backout
CHECKPOINT_CASES = [dict(hc="kromhc"), dict(hc="mhc", hc_pre="delayed"), dict(hc="go_mhc", hc_go_s=3),
                    dict(hc="hc_identity", hc_streams=3), dict(hc="kromhc", hc_expand="lss", hc_reduce="learned"),
                    dict(hc="kromhc", trunk="2026-07"), dict(hc="kromhc", hc_seam="split"),
                    dict(hc="mhc", hc_pre="delayed", hc_seam="split")]


@pytest.mark.parametrize("case", CHECKPOINT_CASES, ids=model_case_id)
def test_stream_checkpoints_recompute_the_streams_bitwise(case):
    """Keeping the streams at every K-th seam only (K = 2 and 3) and recomputing the others in
    backward (the seam forward that wrote them, again) gives the loss and every gradient
    bitwise. Both K in one case: the run without checkpoints, the reference, is the same."""
    idx = batch()
    loss, grads = loss_and_grads(tiny_gpt("fused", n_layer=2, **case), idx)
    for K in (2, 3):
        loss_k, grads_k = loss_and_grads(tiny_gpt("fused", n_layer=2, hc_stream_checkpoint=K, **case), idx)
        assert torch.equal(loss_k, loss), K
        for name, g in grads.items():
            assert torch.equal(grads_k[name], g), (K, name)


def saved_streams(model, idx):
    """The distinct stream-sized tensors (tokens x n x C) autograd keeps for backward."""
    from torch.autograd.graph import saved_tensors_hooks
    C, n = model.config.n_embd, model.config.hc_streams
    seen = {}

    def pack(t):
        if t.dim() == 3 and t.shape[1:] == (n, C):
            seen[t.untyped_storage().data_ptr()] = t.shape
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        model(idx, idx)
    return len(seen)


@pytest.mark.parametrize("case", [dict(hc="kromhc"), dict(hc="go_mhc", hc_go_s=3), dict(hc="kromhc",
                                                                                        hc_reduce="learned")],
                         ids=model_case_id)
def test_stream_checkpoints_keep_every_kth_stream(case):
    """With K, backward keeps the streams at seams 0, K, 2K, ... of the 8 streams a 4-block
    trunk writes (X_0 .. X_7; the learned head's X_8 is written again by its seam's backward):
    8, 4, 3 and 2 of them for K = 1, 2, 3, 4."""
    idx = batch()
    kept = {K: saved_streams(tiny_gpt("fused", n_layer=4, hc_stream_checkpoint=K, **case), idx) for K in (1, 2, 3, 4)}
    streams = 8 + (1 if case.get("hc_reduce") == "learned" else 0)
    assert kept == {1: streams, 2: 4, 3: 3, 4: 2}


@pytest.mark.parametrize("overrides, message", [
    (dict(hc="kromhc", hc_stream_checkpoint=2), "needs hc_kernels='fused' (or 'auto'), not 'torch'"),
    (dict(hc="kromhc", hc_kernels="fused", hc_stream_checkpoint=0), "must be a positive integer"),
    (dict(hc="residual", hc_kernels="auto", hc_stream_checkpoint=2), "which hc='residual' does not run"),
    (dict(hc="kromhc", hc_kernels="fused", hc_seam="twopass"),
     "unknown hc_seam='twopass'; choose one of onepass, split"),
])
def test_stream_checkpoint_errors(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        GPTConfig(**overrides)
