"""Golden values of nanochat's own optimizer at commit 92d63d4 (the 2026-07 trunk's), from its code.

    git clone https://github.com/karpathy/nanochat && git -C nanochat checkout 92d63d4
    python tests/goldens/upstream_optim.py --nanochat nanochat --out tests/goldens/optim_92d63d4.json

Runs in its own process with that checkout first on sys.path (its package is also called
`nanochat`; ours is never imported here), on the CPU in fp64 (upstream.run_in_float64: its
COMPUTE_DTYPE, so that its Muon step neither casts to bf16 nor rounds to fp32), with
torch.compile disabled (its step functions are compiled; eager is the same math). Its
single-process MuonAdamW takes the groups of `groups` (LAYOUT: Muon stacks of tall, wide and
square matrices, AdamW tensors with the betas and weight decays of its setup_optimizer) and
runs STEPS steps, the hyperparameters changed by `schedule` before each, the parameters and
gradients set by name (weights.tensor_for, fp64). Records the fingerprint
(weights.fingerprint) of every parameter after the last step.
tests/test_optim_2026.py runs our optimizer on the same values and compares them.
"""

import json

from upstream import COMMIT, open_checkout, run_in_float64
STEPS = 3
# (group name, kind, hyperparameters, shapes). Muon as 92d63d4's setup_optimizer builds it
# (momentum, ns_steps 5, beta2 0.9); the AdamW groups with its lm_head's, wte's and x0 scalars'
# betas and weight decays. The (64, 20) tensor has over 1024 elements and an even dim 0 (two
# ranks shard its rows); the (24, 8) stack has three matrices (ranks own 2 + 1).
LAYOUT = [
    ("muon_24x8", "muon", dict(lr=0.02, momentum=0.95, ns_steps=5, beta2=0.9, weight_decay=0.28), [(24, 8)] * 3),
    ("muon_8x24", "muon", dict(lr=0.02, momentum=0.95, ns_steps=5, beta2=0.9, weight_decay=0.28), [(8, 24)] * 2),
    ("muon_12x12", "muon", dict(lr=0.02, momentum=0.95, ns_steps=5, beta2=0.9, weight_decay=0.28), [(12, 12)]),
    ("head", "adamw", dict(lr=0.004, betas=(0.8, 0.96), eps=1e-10, weight_decay=0.01), [(64, 20)]),
    ("table", "adamw", dict(lr=0.2, betas=(0.8, 0.995), eps=1e-10, weight_decay=0.001), [(33, 20), (20,)]),
    ("scalars", "adamw", dict(lr=0.5, betas=(0.96, 0.95), eps=1e-10, weight_decay=0.0), [(4,)]),
]


def names():
    """[(parameter name, shape)] in LAYOUT order."""
    return [(f"{group}.{i}", shape) for group, _, _, shapes in LAYOUT for i, shape in enumerate(shapes)]


def schedule(group, step):
    """The hyperparameters of `group` (a dict with LAYOUT's keys and "initial_lr") at `step`:
    a decaying LR, a rising Muon momentum and a falling Muon weight decay, as training moves them."""
    group["lr"] = group["initial_lr"] * (1 - 0.1 * step)
    if group["kind"] == "muon":
        group["momentum"] = 0.85 + 0.05 * step
        group["weight_decay"] = 0.28 * (1 - step / STEPS)


def groups(tensor_for):
    """(params, param groups) with every parameter set by name (in tensor_for's dtype),
    requiring grad."""
    params, out = {}, []
    for group, kind, hyper, shapes in LAYOUT:
        ps = []
        for i, shape in enumerate(shapes):
            ps.append(tensor_for(f"{group}.{i}", shape).requires_grad_())
            params[f"{group}.{i}"] = ps[-1]
        out.append(dict(kind=kind, params=ps, **hyper))
    return params, out


def set_grads(params, step, tensor_for):
    for name, p in params.items():
        p.grad = tensor_for(f"grad.{step}.{name}", tuple(p.shape))


def main():
    args = open_checkout(__doc__.splitlines()[0])
    run_in_float64()
    import torch
    from nanochat.common import COMPUTE_DTYPE  # nanochat at COMMIT
    from nanochat.optim import MuonAdamW
    from weights import fingerprint, tensor_for
    assert COMPUTE_DTYPE == torch.float64, COMPUTE_DTYPE

    params, param_groups = groups(tensor_for)
    optimizer = MuonAdamW(param_groups)
    for group in optimizer.param_groups:
        group["initial_lr"] = group["lr"]
    for step in range(STEPS):
        set_grads(params, step, tensor_for)
        for group in optimizer.param_groups:
            schedule(group, step)
        optimizer.step()
    assert {p.dtype for p in params.values()} == {torch.float64}
    golden = {"commit": COMMIT, "steps": STEPS, "params": {name: fingerprint(p) for name, p in params.items()}}
    with open(args.out, "w") as f:
        json.dump(golden, f, indent=1)
    print(f"wrote {args.out}: {len(params)} parameters after {STEPS} steps")


if __name__ == "__main__":
    main()
