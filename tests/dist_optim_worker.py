"""A toy training problem for the optimizer tests, and the per-rank program of the
distributed test: `RANK=r WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... python
tests/dist_optim_worker.py OUT_DIR` trains with DistMuonAdamW on this rank's half of each
batch and saves what it saw to OUT_DIR/rank<r>.pt for tests/test_optim.py to compare with
MuonAdamW on the full batch."""

import os
import sys
from datetime import timedelta
from unittest import mock

import torch
import torch.distributed as dist

from nanochat import optim
from nanochat.optim import DistMuonAdamW, adamw_update

BATCH = 8
STEPS = 4

# (group name, kind, shapes). World size 2: "embed" has one sharded param and one >= 1024
# elements whose dim 0 is odd (all-reduced); "hc" is a replicated group: tiny params and one
# that would otherwise be sharded, all in the flat buffer; the muon groups have K = 3 (odd),
# 2 and 1 (rank 1 owns nothing).
LAYOUT = [
    ("embed", "adamw", [(64, 40), (33, 40)]),
    ("hc", "adamw", [(3,), (4, 5), (1,), (7, 3), (48, 32)]),
    ("matrix", "muon", [(24, 8)] * 3),
    ("matrix", "muon", [(8, 24)] * 2),
    ("matrix", "muon", [(12, 12)]),
]


def make_problem(seed=0):
    """Fresh leaf params and their optimizer groups (plain dicts, lr etc. filled in)."""
    gen = torch.Generator().manual_seed(seed)
    params, groups = [], []
    for name, kind, shapes in LAYOUT:
        ps = [(torch.randn(s, generator=gen) * 0.5).requires_grad_() for s in shapes]
        params += ps
        if name == "embed":
            groups.append(dict(kind="adamw", name=name, params=ps, lr=0.02, betas=(0.8, 0.95), weight_decay=0.1))
        elif name == "hc":
            groups.append(dict(kind="adamw", name=name, params=ps, lr=0.005, betas=(0.8, 0.95), eps=1e-10,
                               replicated=True))
        else:
            groups.append(dict(kind="muon", name=name, params=ps, lr=0.02, momentum=0.85, weight_decay=0.2))
    return params, groups


def batch(step, params):
    """Per-example data, one (BATCH, *shape) tensor per param, the same on every rank."""
    gen = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(BATCH, *p.shape, generator=gen) for p in params]


def backward(params, data, rows):
    """Mean over the examples in `rows` of a per-example loss that is nonlinear in every param,
    as a rank's micro-batch loss would be; leaves the local gradient in .grad."""
    n = data[0][rows].shape[0]
    loss = sum((torch.tanh(p) * d[rows]).sum() for p, d in zip(params, data)) / n
    loss = loss + sum((p ** 2).sum() for p in params) * 0.01
    loss.backward()


def set_schedule(opt, step):
    """Change lr, momentum and weight decay every step, as the training loop does."""
    for group in opt.param_groups:
        group["lr"] = group["initial_lr"] * (1 - 0.1 * step)
        if group["kind"] == "muon":
            group["momentum"] = 0.85 + 0.03 * step
            group["weight_decay"] = 0.2 * (1 - step / 10)


def train(opt, params, steps, rows, first_step=0, measure=True):
    """Run steps; returns opt.grad_norms after each step."""
    norms = []
    for step in range(first_step, first_step + steps):
        backward(params, batch(step, params), rows)
        set_schedule(opt, step)
        opt.step(measure_grad_norm=measure)
        norms.append(None if opt.grad_norms is None else dict(opt.grad_norms))
        for p in params:
            p.grad = None
    return norms


def train_accumulating(opt, params, steps, rows, overlap):
    """Two micro-steps per step (each half of `rows`); with `overlap`, the reductions are
    launched from gradient hooks during the second backward. Returns how many reductions
    the hooks had launched when each step began."""
    launched = []
    half = (rows.stop - rows.start) // 2
    for step in range(steps):
        data = batch(step, params)
        for k in range(2):
            if overlap and k == 1:
                opt.launch_reductions_in_backward()
            backward(params, data, slice(rows.start + k * half, rows.start + (k + 1) * half))
        launched.append(len(opt._launched))
        set_schedule(opt, step)
        opt.step(measure_grad_norm=True)
        for p in params:
            p.grad = None
    return launched


def main(out_dir):
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    half = BATCH // world
    rows = slice(rank * half, (rank + 1) * half)

    params, groups = make_problem()
    opt = DistMuonAdamW(groups)
    norms = train(opt, params, STEPS, rows)
    final = [p.detach().clone() for p in params]
    state_shapes = {f"{gi}.{pi}": {k: tuple(v.shape) for k, v in opt.state[p].items() if torch.is_tensor(v)}
                    for gi, g in enumerate(opt.param_groups) for pi, p in enumerate(g["params"])}

    # One more step without grad norm, counting its all_reduce calls (the replicated AdamW
    # params must share one collective) and the sizes its AdamW updates run on.
    calls, updates = [], []
    real_all_reduce = dist.all_reduce
    dist.all_reduce = lambda *a, **k: calls.append(1) or real_all_reduce(*a, **k)
    with mock.patch.object(optim, "adamw_update", lambda *a: updates.append(a[0].numel()) or adamw_update(*a)):
        train(opt, params, 1, rows, first_step=STEPS, measure=False)
    dist.all_reduce = real_all_reduce

    # Interrupted run: 2 steps, save this rank's state, rebuild everything, load, 2 more.
    params_b, groups_b = make_problem()
    opt_b = DistMuonAdamW(groups_b)
    train(opt_b, params_b, 2, rows)
    path = os.path.join(out_dir, f"optim_rank{rank}.pt")
    torch.save(opt_b.state_dict(), path)
    params_at_2 = [p.detach().clone() for p in params_b]
    params_c, groups_c = make_problem()
    with torch.no_grad():
        for pc, pb in zip(params_c, params_b):
            pc.copy_(pb)
    opt_c = DistMuonAdamW(groups_c)
    opt_c.load_state_dict(torch.load(path))
    train(opt_c, params_c, STEPS - 2, rows, first_step=2)
    # another rank's shard must be refused
    dist.barrier()
    other = os.path.join(out_dir, f"optim_rank{(rank + 1) % world}.pt")
    try:
        DistMuonAdamW(make_problem()[1]).load_state_dict(torch.load(other))
        wrong_shard_refused = False
    except ValueError:
        wrong_shard_refused = True

    # Reductions launched from gradient hooks during the last micro-step's backward, against
    # the same micro-steps reduced in step().
    runs = {}
    for overlap in (False, True):
        params_o, groups_o = make_problem()
        opt_o = DistMuonAdamW(groups_o)
        launched = train_accumulating(opt_o, params_o, STEPS, rows, overlap)
        runs[overlap] = dict(params=[p.detach() for p in params_o], launched=launched, units=len(opt_o._units))

    torch.save(dict(params=final, norms=norms, state_shapes=state_shapes, all_reduce_calls=len(calls),
                    adamw_sizes=updates, overlapped=runs[True], plain=runs[False],
                    extra_step=[p.detach() for p in params], wrong_shard_refused=wrong_shard_refused,
                    resumed=[p.detach() for p in params_c], params_at_2=params_at_2),
               os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
