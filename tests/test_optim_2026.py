"""The 2026-07 trunk's optimizer (nanochat/optim.py, trunk_options): with its group options
our MuonAdamW and DistMuonAdamW take nanochat 92d63d4's steps (in fp64 on the CPU; the golden
values come from its code, tests/goldens/upstream_optim.py, as fingerprints,
tests/goldens/weights.py), every option that changes a formula is needed for that,
nanochat_order changes only rounding, each option does what its paper says, and a checkpoint
from before the options resumes on the defaults.

RTOL, measured as in tests/test_trunk_2026_07.py (the largest deviation of a fingerprint's
statistics over the golden's L1 norm): ours equals the goldens exactly on one CPU capability,
and within 2.1e-16 across them (ATEN_CPU_CAPABILITY=default against avx2, the goldens' own),
as nanochat's code does against itself. Muon's norm factor 1.01 moved to the next fp32 number
moves the Muon params by 7.8e-9 (test_a_formula_changed_by_one_fp32_ulp_is_caught), an option
left at its default by 2.7e-6 (beta2) to 1.2e-3. 1e-11, the model's tolerance, lies far between.
FP32_ROUNDING bounds what nanochat_order's two orders of operations differ by in fp32:
3.1e-8 measured (about one fp32 ulp); 1e-6 is 30x that."""

import json
import multiprocessing
import os
import socket
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from nanochat.optim import (_MUON_DEFAULTS, MuonAdamW, DistMuonAdamW, muon_plus, muon_update, muoneq, polar_express,
                            trunk_options)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "goldens"))
from upstream_optim import LAYOUT, STEPS, groups, schedule, set_grads  # noqa: E402
from weights import fingerprint, mismatch, mismatches, tensor_for  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = json.load(open(os.path.join(REPO, "tests", "goldens", "optim_92d63d4.json")))
KIND = {f"{group}.{i}": kind for group, kind, _, shapes in LAYOUT for i in range(len(shapes))}
RTOL = 1e-11
FP32_ROUNDING = 1e-6


def modern_groups(drop=None, dtype=torch.float64):
    """(params by name, groups) of the golden problem with the 2026-07 options, in `dtype`;
    drop=(kind, key) leaves that option at its default in every group of that kind."""
    params, param_groups = groups(lambda *args: tensor_for(*args, dtype=dtype))
    for group in param_groups:
        options = trunk_options("2026-07", group["kind"])
        if drop and drop[0] == group["kind"]:
            options.pop(drop[1])
        group.update(options)
        if drop == ("muon", "beta2") and group["kind"] == "muon":
            group["beta2"] = _MUON_DEFAULTS["beta2"]  # the layout gives 92d63d4's 0.9 itself
    return params, param_groups


def train(optimizer, params, steps=STEPS):
    dtype = next(iter(params.values())).dtype
    for step in range(steps):
        set_grads(params, step, lambda *args: tensor_for(*args, dtype=dtype))
        for group in optimizer.param_groups:
            schedule(group, step)
        optimizer.step()


def mismatched(params):
    return mismatches(params, GOLDEN["params"], RTOL)


def test_2026_07_steps_are_upstreams():
    params, param_groups = modern_groups()
    train(MuonAdamW(param_groups), params)
    assert GOLDEN["steps"] == STEPS
    assert not mismatched(params), f"differ from nanochat {GOLDEN['commit']}: {mismatched(params)}"


def test_a_formula_changed_by_one_fp32_ulp_is_caught():
    """The tolerance hides rounding, not formulas: Muon's norm factor 1.01 moved to the next
    fp32 number (1.0100001) moves every Muon param past RTOL, and nothing else."""
    params, param_groups = modern_groups()
    for group in param_groups:
        if group["kind"] == "muon":
            factor = torch.tensor(group["polar_norm_factor"], dtype=torch.float32)
            group["polar_norm_factor"] = torch.nextafter(factor, torch.tensor(2.0)).item()
    train(MuonAdamW(param_groups), params)
    wrong = mismatched(params)
    assert set(wrong) == {name for name in params if KIND[name] == "muon"}, wrong
    assert min(deviation for deviation, _ in wrong.values()) > 10 * RTOL, wrong


@pytest.mark.parametrize("kind,option", [("muon", "muoneq"), ("muon", "muon_plus"), ("muon", "polar_norm_factor"),
                                         ("muon", "beta2")])
def test_every_option_is_needed(kind, option):
    """Left at its default, an option breaks the agreement, and only in its own kind's params.
    (nanochat_order changes only rounding, which fp64 hides: test_nanochat_order_changes_only_rounding.)"""
    params, param_groups = modern_groups(drop=(kind, option))
    train(MuonAdamW(param_groups), params)
    wrong = mismatched(params)
    assert wrong and {KIND[name] for name in wrong} == {kind}, wrong


def test_the_default_trunk_takes_the_defaults():
    """2026-01 adds nothing to a group (its step is the one tests/test_optim.py checks), and
    an unknown trunk is refused."""
    assert trunk_options("2026-01", "muon") == trunk_options("2026-01", "adamw") == {}
    with pytest.raises(ValueError, match="2026-01, 2026-07"):
        trunk_options("2027-01", "muon")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("kind", ["muon", "adamw"])
def test_nanochat_order_changes_only_rounding(kind, dtype):
    """Off, nanochat_order gives a kind's params other roundings and nothing else: other bits
    in its own kind only, within about an fp32 ulp in fp32, where it is what makes our steps
    nanochat's bit for bit (the fp32 comparison it was written against), and within RTOL in
    fp64, where the goldens cannot tell the two orders apart."""
    params, param_groups = modern_groups(dtype=dtype)
    train(MuonAdamW(param_groups), params)
    off, off_groups = modern_groups(drop=(kind, "nanochat_order"), dtype=dtype)
    train(MuonAdamW(off_groups), off)
    assert {KIND[name] for name in params if not torch.equal(params[name], off[name])} == {kind}
    deviation = max(mismatch(off[name], fingerprint(p))[0] for name, p in params.items())
    if dtype == torch.float64:
        assert deviation <= RTOL
    else:
        assert RTOL < deviation <= FP32_ROUNDING


def test_muoneq_makes_the_update_blind_to_row_scales():
    """MuonEq gives every row the RMS row norm (so ||X||_F is kept): the orthogonalized update
    of diag(s) G is that of G, whatever the row scales s; without it they differ at O(1)."""
    gen = torch.Generator().manual_seed(0)
    G = torch.randn(16, 6, generator=gen)
    scaled = torch.logspace(-2, 2, 16)[:, None] * G
    rows = torch.linalg.vector_norm(muoneq(scaled), dim=-1)
    torch.testing.assert_close(rows, torch.full((16,), torch.linalg.matrix_norm(scaled).item() / 4), rtol=1e-5, atol=0)
    torch.testing.assert_close(polar_express(muoneq(scaled)), polar_express(muoneq(G)), rtol=0, atol=1e-4)
    assert (polar_express(scaled) - polar_express(G)).abs().max() > 0.1


@pytest.mark.parametrize("shape", [(12, 5), (5, 12)])
def test_muon_plus_sets_the_update_norm(shape):
    """From zero params and no momentum, one step moves the params by lr_eff U; with Muon+,
    ||U||_F = sqrt(min(m, n)) (NorMuon keeps the norm it is given); without, Polar Express's
    own norm, off by more than rounding. muon_plus itself maps any norm to that one."""
    gen = torch.Generator().manual_seed(1)
    rows, cols = shape
    grads = torch.randn(1, rows, cols, generator=gen)
    assert torch.linalg.matrix_norm(muon_plus(grads * 7.0)).item() == pytest.approx(min(shape) ** 0.5, rel=1e-6)
    norms = {}
    for plus in (True, False):
        params = torch.zeros(1, rows, cols)
        v = torch.zeros((1, rows, 1) if rows >= cols else (1, 1, cols))
        scalars = [torch.tensor(x) for x in (0.0, 0.1, 0.0, 0.9)]  # momentum, lr_eff, wd, beta2
        muon_update(grads.clone(), params, torch.zeros_like(params), v, *scalars, 5, -1 if rows >= cols else -2,
                    torch.float32, use_muon_plus=plus)
        norms[plus] = torch.linalg.matrix_norm(params[0]).item() / 0.1
    assert norms[True] == pytest.approx(min(shape) ** 0.5, rel=1e-5)
    assert abs(norms[False] / min(shape) ** 0.5 - 1) > 1e-3


def test_a_checkpoint_saved_before_the_options_resumes_on_the_defaults():
    """Loading replaces the groups with the saved ones: keys they lack take their defaults,
    and the run goes on as if uninterrupted; the saved 2026-07 options come back as saved."""
    params, param_groups = groups(tensor_for)
    whole = MuonAdamW(param_groups)
    train(whole, params, 2)
    params_b, groups_b = groups(tensor_for)
    part = MuonAdamW(groups_b)
    train(part, params_b, 1)
    saved = part.state_dict()
    new_keys = set(trunk_options("2026-07", "muon")) - {"beta2"}
    saved["param_groups"] = [{k: v for k, v in g.items() if k not in new_keys} for g in saved["param_groups"]]
    params_c, groups_c = groups(tensor_for)
    with torch.no_grad():
        for name, p in params_c.items():
            p.copy_(params_b[name])
    resumed = MuonAdamW(groups_c)
    resumed.load_state_dict(saved)
    assert all(g["polar_norm_factor"] == 1.02 and not g["muoneq"] for g in resumed.param_groups if g["kind"] == "muon")
    set_grads(params_c, 1, tensor_for)
    for group in resumed.param_groups:
        schedule(group, 1)
    resumed.step()
    for name in params:
        assert torch.equal(params[name], params_c[name])

    params_d, groups_d = modern_groups()
    opt = MuonAdamW(groups_d)
    train(opt, params_d, 1)
    plain = MuonAdamW(groups(tensor_for)[1])
    plain.load_state_dict(opt.state_dict())
    assert all(g["muoneq"] and g["polar_norm_factor"] == 1.01 for g in plain.param_groups if g["kind"] == "muon")


# ---- DistMuonAdamW on 2 gloo processes, forked from this one (no second start of torch)

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank))
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    params, param_groups = modern_groups()
    optimizer = DistMuonAdamW(param_groups)
    train(optimizer, params)
    shapes = {"head": tuple(optimizer.state[params["head.0"]]["exp_avg"].shape),
              "muon_24x8": tuple(optimizer.state[params["muon_24x8.0"]]["momentum_buffer"].shape)}
    torch.save({"params": {k: p.detach() for k, p in params.items()}, "shapes": shapes},
               os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_distributed_steps_are_upstreams(tmp_path):
    """Every rank gets the same gradient, so their average is that gradient exactly (g + g
    halves without rounding): each rank's sharded steps (the (64, 20) tensor's rows and the
    Muon stacks split between the ranks) must then give nanochat's parameters within RTOL."""
    fork = multiprocessing.get_context("fork")
    port = _free_port()
    procs = [fork.Process(target=_rank, args=(r, port, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    for r in range(2):
        result = torch.load(tmp_path / f"rank{r}.pt")
        assert not mismatched(result["params"]), (r, mismatched(result["params"]))
        # the state really is sharded: half the (64, 20) rows, the 3-matrix stack as 2 + 1
        assert result["shapes"]["head"] == (32, 20)
        assert result["shapes"]["muon_24x8"] == (2 - r, 24, 8)
