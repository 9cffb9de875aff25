"""Tests of nanochat/optim.py on CPU in fp32: Polar Express, AdamW against torch's, Muon
against a from-the-formulas reference, gradient norms, checkpoints, group validation, and
DistMuonAdamW on 2 gloo processes against MuonAdamW."""

import collections
import io
import os
import socket
import subprocess
import sys
from unittest import mock

import launch
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dist_optim_worker as toy
from nanochat.optim import (POLAR_EXPRESS_COEFFS, DistMuonAdamW, MuonAdamW, adamw_update, build_optimizer,
                            polar_express)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- Polar Express

def _with_spectrum(rows, cols, gen):
    """rows x cols matrix with random singular vectors and singular values log-spaced over two
    decades, times an arbitrary scale (a gradient-like spread)."""
    k = min(rows, cols)
    U, _ = torch.linalg.qr(torch.randn(rows, k, generator=gen))
    V, _ = torch.linalg.qr(torch.randn(cols, k, generator=gen))
    s = torch.logspace(-2, 0, k) * 3.7
    return U @ torch.diag(s) @ V.T


@pytest.mark.parametrize("rows,cols,spectrum", [
    (64, 16, "log-spaced"), (16, 64, "log-spaced"), (32, 32, "log-spaced"),
    # Gaussian tall/wide matrices are well conditioned; a square one has no lower bound on
    # its smallest singular value, so it is left out.
    (64, 16, "gaussian"), (16, 64, "gaussian"),
])
def test_polar_express_singular_values(rows, cols, spectrum):
    gen = torch.Generator().manual_seed(rows * 1000 + cols)
    G = _with_spectrum(rows, cols, gen) if spectrum == "log-spaced" else torch.randn(rows, cols, generator=gen)
    U, S, Vh = torch.linalg.svd(G, full_matrices=False)
    # The coefficients are minimax-designed for singular values in [1e-3, 1] after the input
    # is scaled by 1/(1.02 ||G||_F); there, 5 iterations map every singular value into
    # 1 +- 0.1412 (the equioscillation error of the composed polynomial). Check the premise,
    # then the guarantee with a margin for fp32 rounding: [0.85, 1.15].
    assert S.min() / (1.02 * torch.linalg.matrix_norm(G)) >= 1e-3
    X = polar_express(G)
    out = torch.linalg.svdvals(X)
    assert out.min() > 0.85 and out.max() < 1.15, (out.min().item(), out.max().item())
    # The iteration is an odd matrix polynomial: it keeps G's singular vectors, so U^T X V
    # is diagonal (X approximates the polar factor U V^T, not some other orthogonal matrix).
    D = U.T @ X @ Vh.T
    off = D - torch.diag(torch.diagonal(D))
    assert off.abs().max() < 1e-4


# ---- AdamW

def test_adamw_matches_torch_adamw():
    gen = torch.Generator().manual_seed(0)
    shapes = [(5, 7), (13,), (1,), (3, 2, 4)]
    init = [torch.randn(s, generator=gen) for s in shapes]
    ours = [t.clone().requires_grad_() for t in init]
    ref = [t.clone().requires_grad_() for t in init]
    hyper = [dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1),
             dict(lr=0.003, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.0)]
    opt = MuonAdamW([dict(kind="adamw", params=ours[:2], **hyper[0]), dict(kind="adamw", params=ours[2:], **hyper[1])])
    torch_opt = torch.optim.AdamW([dict(params=ref[:2], **hyper[0]), dict(params=ref[2:], **hyper[1])], foreach=False)
    assert [g["initial_lr"] for g in opt.param_groups] == [0.01, 0.003]
    for step in range(10):
        grads = [torch.randn(s, generator=gen) for s in shapes]
        for p, q, g in zip(ours, ref, grads):
            p.grad, q.grad = g.clone(), g.clone()
        for o in (opt, torch_opt):
            for group, h in zip(o.param_groups, hyper):
                group["lr"] = h["lr"] * (1 - 0.05 * step)
        opt.step()
        torch_opt.step()
    for p, q in zip(ours, ref):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
        assert opt.state[p]["exp_avg"].shape == p.shape and opt.state[p]["step"] == 10


def _reference_adamw(params, grads, states, group):
    """The per-tensor form of the update: adamw_update on each tensor at its own step count."""
    beta1, beta2 = group["betas"]
    for p, g, state in zip(params, grads, states):
        if not state:
            state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        state["step"] += 1
        scalars = [torch.tensor(float(v)) for v in (state["step"], group["lr"], beta1, beta2, group["eps"],
                                                    group["weight_decay"])]
        adamw_update(p.view(-1), g.reshape(-1), state["exp_avg"].view(-1), state["exp_avg_sq"].view(-1), *scalars)


def test_fused_adamw_equals_the_update_of_each_tensor():
    """A replicated group of small params in two dtypes, a large param (updated alone) and a
    param that misses a gradient now and then (so it falls behind by a step): the batched
    update gives the per-tensor update's params and moments bit for bit."""
    gen = torch.Generator().manual_seed(3)
    shapes = [(3,), (4, 5), (1,), (7, 3), (48, 32), (40, 40)]
    dtypes = [torch.float32, torch.bfloat16, torch.float32, torch.float32, torch.bfloat16, torch.float32]
    init = [torch.randn(s, generator=gen).to(d) for s, d in zip(shapes, dtypes)]
    ours = [t.clone().requires_grad_() for t in init]
    ref = [t.clone() for t in init]
    hyper = dict(lr=0.01, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.1)
    opt = MuonAdamW([dict(kind="adamw", params=ours[:5], replicated=True, **hyper),
                     dict(kind="adamw", params=ours[5:], **hyper)])
    ref_states = [{} for _ in ref]
    for step in range(5):
        for i, p in enumerate(ours):  # the (1,) param has no gradient at odd steps
            p.grad = None if i == 2 and step % 2 else torch.randn(p.shape, generator=gen).to(p.dtype)
        for group in opt.param_groups:
            group["lr"] = hyper["lr"] * (1 - 0.1 * step)
        with torch.no_grad():
            live = [i for i, p in enumerate(ours) if p.grad is not None]
            _reference_adamw([ref[i] for i in live], [ours[i].grad for i in live], [ref_states[i] for i in live],
                             dict(hyper, lr=opt.param_groups[0]["lr"]))
        opt.step()
    assert opt.state[ours[2]]["step"] == 3 and opt.state[ours[0]]["step"] == 5
    for p, q, state in zip(ours, ref, ref_states):
        assert torch.equal(p.detach(), q)
        assert all(torch.equal(opt.state[p][k], state[k]) for k in ("exp_avg", "exp_avg_sq"))


def _ops_of_one_step(n_small):
    """The aten ops (views left out) and the adamw_update calls of one optimizer step, with
    gradient norms, on a replicated group of n_small small params beside a large param and a
    muon group; the second step, once the lazy state exists."""
    gen = torch.Generator().manual_seed(n_small)
    small = [torch.randn(5, 3, generator=gen).requires_grad_() for _ in range(n_small)]
    large, matrix = torch.randn(64, 40, generator=gen).requires_grad_(), torch.randn(8, 8).requires_grad_()
    opt = MuonAdamW([dict(kind="adamw", params=[large], lr=0.01, betas=(0.8, 0.95)),
                     dict(kind="adamw", params=small, lr=0.01, betas=(0.8, 0.95), replicated=True),
                     dict(kind="muon", params=[matrix], lr=0.02)])
    ops, calls = collections.Counter(), []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:
                ops[str(func)] += 1
            return func(*args, **(kwargs or {}))

    def counted(*args):
        calls.append(args[0].numel())
        return adamw_update(*args)

    for step in range(2):
        for p in (large, *small, matrix):
            p.grad = torch.randn(p.shape, generator=gen)
        if step == 0:
            opt.step(measure_grad_norm=True)
            continue
        with Count(), mock.patch("nanochat.optim.adamw_update", counted):
            opt.step(measure_grad_norm=True)
    return ops, calls


def test_adamw_step_costs_kernels_per_group_not_per_param():
    """One update for the replicated group, whatever its size: the step's ops do not grow
    with the number of params (with an update per param they grew by 36 per param, 12 to
    16 params costing 432 more ops)."""
    ops_4, calls_4 = _ops_of_one_step(4)
    ops_16, calls_16 = _ops_of_one_step(16)
    assert calls_4 == [64 * 40, 4 * 15] and calls_16 == [64 * 40, 16 * 15]
    assert ops_16 == ops_4


# ---- Muon

def _reference_orthogonalize(G, steps):
    """Polar Express written once, in its wide form; a tall matrix is handled through its
    transpose (the same polynomial, so the same result)."""
    tall = G.shape[0] > G.shape[1]
    X = G.T if tall else G
    X = X / (torch.linalg.matrix_norm(X) * 1.02 + 1e-6)
    for a, b, c in POLAR_EXPRESS_COEFFS[:steps]:
        A = X @ X.T
        X = a * X + b * (A @ X) + c * (A @ A @ X)
    return X.T if tall else X


class _ReferenceMuon:
    """Muon on one matrix, straight from the formulas."""

    def __init__(self, p):
        self.p = p.clone()
        rows, cols = p.shape
        self.buf = torch.zeros_like(p)
        self.v = torch.zeros(rows, 1) if rows >= cols else torch.zeros(1, cols)

    def step(self, g, lr, momentum, wd, beta2=0.95, ns_steps=5):
        rows, cols = self.p.shape
        self.buf = momentum * self.buf + (1 - momentum) * g
        nesterov = (1 - momentum) * g + momentum * self.buf
        O = _reference_orthogonalize(nesterov, ns_steps)
        # second moment of each row (rows >= cols) or column, averaged over the shorter dim
        self.v = beta2 * self.v + (1 - beta2) * (O ** 2).mean(dim=1 if rows >= cols else 0, keepdim=True)
        U = O / torch.sqrt(torch.clamp(self.v, min=1e-10))
        U = U * torch.linalg.matrix_norm(O) / torch.linalg.matrix_norm(U)
        lr_eff = lr * max(1.0, rows / cols) ** 0.5
        decay = torch.where(U * self.p >= 0, self.p, torch.zeros_like(self.p))
        self.p = self.p - lr_eff * U - lr_eff * wd * decay


def test_muon_matches_reference():
    gen = torch.Generator().manual_seed(1)
    layout = [((12, 5), 3), ((5, 12), 2), ((6, 6), 1)]
    groups, refs = [], []
    for shape, K in layout:
        ps = [torch.randn(shape, generator=gen).requires_grad_() for _ in range(K)]
        refs.append([_ReferenceMuon(p.detach()) for p in ps])
        groups.append(dict(kind="muon", params=ps, lr=0.02, momentum=0.85, weight_decay=0.2, beta2=0.9, ns_steps=5))
    opt = MuonAdamW(groups)
    for step in range(6):
        lr, momentum, wd = 0.02 * (1 - 0.1 * step), 0.85 + 0.02 * step, 0.2 * (1 - step / 6)
        for group, rs in zip(opt.param_groups, refs):
            group.update(lr=lr, momentum=momentum, weight_decay=wd)
            for p, r in zip(group["params"], rs):
                p.grad = torch.randn(p.shape, generator=gen)
                r.step(p.grad, lr, momentum, wd, beta2=0.9)
        opt.step()
    for group, rs in zip(opt.param_groups, refs):
        for p, r in zip(group["params"], rs):
            torch.testing.assert_close(p.detach(), r.p, rtol=1e-5, atol=1e-5)
    # the state is one stack per group
    state = opt.state[opt.param_groups[0]["params"][0]]
    assert state["momentum_buffer"].shape == (3, 12, 5) and state["second_momentum_buffer"].shape == (3, 12, 1)
    state = opt.state[opt.param_groups[1]["params"][0]]
    assert state["second_momentum_buffer"].shape == (2, 1, 12)


# ---- gradient norms and checkpoints

def test_grad_norms_match_torch():
    params, groups = toy.make_problem()
    opt = MuonAdamW(groups)
    toy.backward(params, toy.batch(0, params), slice(0, toy.BATCH))
    grads = [p.grad.clone() for p in params]
    opt.step(measure_grad_norm=True)
    norms = opt.grad_norms
    assert norms["total"] == pytest.approx(torch.nn.utils.get_total_norm(grads).item(), rel=1e-6)
    name_of = {id(p): group["name"] for group in opt.param_groups for p in group["params"]}
    for name in ("embed", "hc", "matrix"):  # the three muon groups share the name "matrix"
        mine = [g for g, p in zip(grads, params) if name_of[id(p)] == name]
        assert norms[name] == pytest.approx(torch.nn.utils.get_total_norm(mine).item(), rel=1e-6)
    toy.backward(params, toy.batch(1, params), slice(0, toy.BATCH))
    opt.step()
    assert opt.grad_norms is None


def _roundtrip(opt_state):
    buf = io.BytesIO()
    torch.save(opt_state, buf)
    buf.seek(0)
    return torch.load(buf)


def test_state_dict_roundtrip_is_exact():
    rows = slice(0, toy.BATCH)
    params, groups = toy.make_problem()
    toy.train(MuonAdamW(groups), params, 4, rows)

    params_b, groups_b = toy.make_problem()
    opt_b = MuonAdamW(groups_b)
    toy.train(opt_b, params_b, 2, rows)
    saved = _roundtrip(opt_b.state_dict())
    params_c, groups_c = toy.make_problem()
    with torch.no_grad():
        for pc, pb in zip(params_c, params_b):
            pc.copy_(pb)
    opt_c = MuonAdamW(groups_c)
    opt_c.load_state_dict(saved)
    toy.train(opt_c, params_c, 2, rows, first_step=2)
    for p, q in zip(params, params_c):
        assert torch.equal(p, q)


def test_state_dict_of_another_shard_is_refused():
    params, groups = toy.make_problem()
    opt = MuonAdamW(groups)
    toy.train(opt, params, 1, slice(0, toy.BATCH))
    sd = opt.state_dict()
    sd["sharding"] = {"rank": 1, "world_size": 2}
    with pytest.raises(ValueError, match="load_resharded"):
        MuonAdamW(toy.make_problem()[1]).load_state_dict(sd)


# ---- validation and the factory

def _p(*shape):
    return torch.zeros(shape, requires_grad=True)


@pytest.mark.parametrize("group,match", [
    (dict(kind="sgd", params=[_p(3)], lr=0.1), "'adamw' or 'muon'"),
    (dict(params=[_p(3)], lr=0.1), "'adamw' or 'muon'"),
    (dict(kind="muon", params=[_p(4, 4), _p(4, 5)], lr=0.1), "one muon group per shape"),
    (dict(kind="muon", params=[_p(4, 4), _p(4)], lr=0.1), "adamw group"),
    (dict(kind="muon", params=[_p(4)], lr=0.1), "adamw group"),
    (dict(kind="muon", params=[], lr=0.1), "no params"),
    (dict(kind="muon", params=[_p(4, 4)], lr=0.1, ns_steps=6), "1..5"),
    (dict(kind="adamw", params=[_p(3)], lr=0.1), r"\['betas'\]"),
    (dict(kind="adamw", params=[_p(3)], lr=0.1, betas=(0.9, 0.9), wd=0.1), "unknown keys"),
    (dict(kind="adamw", name="total", params=[_p(3)], lr=0.1, betas=(0.9, 0.9)), "rename"),
])
def test_bad_groups_are_refused(group, match):
    with pytest.raises(ValueError, match=match):
        MuonAdamW([group])


def test_factory_and_missing_process_group():
    groups = [dict(kind="adamw", params=[_p(3)], lr=0.1, betas=(0.9, 0.95))]
    opt = build_optimizer(groups, world_size=1)
    assert type(opt) is MuonAdamW
    assert opt.param_groups[0]["name"] == "adamw0" and opt.param_groups[0]["eps"] == 1e-10
    with pytest.raises(RuntimeError, match="torchrun"):
        DistMuonAdamW([dict(kind="adamw", params=[_p(3)], lr=0.1, betas=(0.9, 0.95))])


# ---- distributed, 2 gloo processes

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_workers(out_dir, world=2, timeout=120):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(world),
               OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    worker = os.path.join(REPO, "tests", "dist_optim_worker.py")
    procs = [launch.Popen([sys.executable, worker, str(out_dir)], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {r} failed:\n{out}"


@pytest.fixture(scope="module")
def dist_dir(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("dist")
    _run_workers(out_dir)
    return out_dir


@pytest.fixture(scope="module")
def ranks(dist_dir):
    return [torch.load(dist_dir / f"rank{r}.pt") for r in range(2)]


def test_distributed_matches_single_process(ranks):
    full = slice(0, toy.BATCH)
    params, groups = toy.make_problem()
    opt = MuonAdamW(groups)
    norms = toy.train(opt, params, toy.STEPS, full)
    after_steps = [p.detach().clone() for p in params]
    toy.train(opt, params, 1, full, first_step=toy.STEPS, measure=False)

    for r, res in enumerate(ranks):
        # fp32; the averaged gradient differs from the full-batch one only in summation
        # order (~1 ulp), which 5 steps of AdamW/Muon leave far below 1e-5.
        for got, want in zip(res["params"], after_steps):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for got, want in zip(res["extra_step"], params):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-5)
        for got, want in zip(res["norms"], norms):
            assert got.keys() == want.keys()
            for k in want:
                assert got[k] == pytest.approx(want[k], rel=1e-5)
        # the resumed run (per-rank state saved, rebuilt, loaded) equals the uninterrupted one
        for got, want in zip(res["resumed"], res["params"]):
            assert torch.equal(got, want)
        assert res["wrong_shard_refused"]
        # one all_reduce per step for all replicated AdamW params, and one AdamW update per
        # group in the flat buffer: the (33, 40) embedding's and the five hc params'; the
        # sharded (64, 40) embedding updates its 32 rows
        assert res["all_reduce_calls"] == 1
        assert res["adamw_sizes"] == [33 * 40, 3 + 20 + 1 + 21 + 48 * 32, 32 * 40]
    for a, b in zip(ranks[0]["extra_step"], ranks[1]["extra_step"]):
        assert torch.equal(a, b)

    # state is sharded: the (64, 40) embedding keeps 32 rows per rank, the (33, 40) one (odd
    # dim 0) is replicated, muon stacks of 3/2/1 matrices split as 2+1 / 1+1 / 1+0
    s0, s1 = ranks[0]["state_shapes"], ranks[1]["state_shapes"]
    assert s0["0.0"]["exp_avg"] == s1["0.0"]["exp_avg"] == (32, 40)
    assert s0["0.1"]["exp_avg"] == (33, 40)
    assert s0["1.4"]["exp_avg"] == s1["1.4"]["exp_avg"] == (48, 32)  # replicated group: whole on every rank
    assert s0["2.0"]["momentum_buffer"] == (2, 24, 8) and s1["2.0"]["momentum_buffer"] == (1, 24, 8)
    assert s0["3.0"]["second_momentum_buffer"] == s1["3.0"]["second_momentum_buffer"] == (1, 1, 24)
    assert s0["4.0"]["momentum_buffer"] == (1, 12, 12) and s1["4.0"] == {}


def test_reductions_launched_in_backward_match_reductions_launched_in_step(ranks):
    """The worker trains twice with two micro-steps per step: once launching every reduction
    in step(), once from gradient hooks during the last micro-step's backward. Every
    reduction unit (flat buffer, sharded params, muon groups) is launched by the hooks, and
    the parameters come out bit-identical."""
    for res in ranks:
        plain, overlapped = res["plain"], res["overlapped"]
        # units at world size 2: the flat buffer, the (64, 40) embedding, three muon groups
        assert overlapped["units"] == plain["units"] == 5
        assert overlapped["launched"] == [5] * toy.STEPS
        assert plain["launched"] == [0] * toy.STEPS
        for a, b in zip(overlapped["params"], plain["params"]):
            assert torch.equal(a, b)


def _assert_same_state(a, b):
    """Two state dicts hold the same state, bit for bit."""
    assert a["state"].keys() == b["state"].keys()
    for index, state in a["state"].items():
        assert state.keys() == b["state"][index].keys(), index
        for k, v in state.items():
            other = b["state"][index][k]
            assert torch.equal(v, other) if torch.is_tensor(v) else v == other, (index, k)


def _optimizer_as(rank, world_size):
    """MuonAdamW over the toy's params, standing for rank `rank` of `world_size` (no process
    group: its state is what that rank of DistMuonAdamW holds)."""
    opt = MuonAdamW(toy.make_problem()[1])
    opt.rank, opt.world_size = rank, world_size
    return opt


def test_resume_on_another_world_size(dist_dir, ranks):
    """The optimizer shards the 2-rank run saved after step 2, loaded on 1, 2, 3 and 4 ranks:
    each rank's new shard, gathered, is the gathered old state bit for bit; resharded for 2
    ranks they are the very shards DistMuonAdamW saved (so the layout is its own); and one
    process continues the run on the uninterrupted 2-rank trajectory."""
    two = [torch.load(dist_dir / f"optim_rank{r}.pt") for r in range(2)]
    gathered = _optimizer_as(0, 1).gather_state_dicts(two)
    for r in range(2):
        _assert_same_state(_optimizer_as(r, 2).shard_state_dict(gathered), two[r])
    for world in (1, 3, 4):
        shards = []
        for r in range(world):
            opt = _optimizer_as(r, world)
            opt.load_resharded(two)
            shards.append(_roundtrip(opt.state_dict()))
        _assert_same_state(_optimizer_as(0, 1).gather_state_dicts(shards), gathered)
    # at 4 ranks the (64, 40) embedding keeps 16 rows per rank; the 3-matrix muon stack goes
    # 1+1+1+0, so rank 3 holds no state for it
    assert shards[1]["state"][0]["exp_avg"].shape == (16, 40)
    assert [len(s["state"].get(7, {})) for s in shards] == [2, 2, 2, 0]

    params, groups = toy.make_problem()
    with torch.no_grad():
        for p, q in zip(params, ranks[0]["params_at_2"]):
            p.copy_(q)
    opt = MuonAdamW(groups)
    opt.load_resharded(two)
    toy.train(opt, params, toy.STEPS - 2, slice(0, toy.BATCH), first_step=2)
    for got, want in zip(params, ranks[0]["params"]):
        torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-5)
