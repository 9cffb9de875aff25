"""The optimizer: AdamW for embeddings, head and every hyper-connection parameter, Muon for
the transformer's matrices, in one torch.optim.Optimizer with nanochat's math (commit
4d8dbaf). `MuonAdamW` runs in one process; `DistMuonAdamW` shards gradients and optimizer
state across ranks (ZeRO-2 style, no DDP wrapper); `build_optimizer` picks one.

Groups are dicts with "kind":
  "adamw": params, lr, betas, eps (1e-10), weight_decay (0), replicated (False: see
           DistMuonAdamW), nanochat_order (False)
  "muon":  params of one 2-D shape, lr, momentum (0.95), ns_steps (5), beta2 (0.95),
           weight_decay (0), muoneq (False), muon_plus (False), polar_norm_factor (1.02),
           nanochat_order (False)
and an optional "name" (default "<kind><index>"), which keys the gradient norms. Every group
gets "initial_lr" = lr. The training loop may change lr, momentum and weight_decay between
steps; the kernels take them as 0-D CPU tensors so that a compiled kernel never recompiles
for a new value.

The defaults are nanochat 4d8dbaf's step (the 2026-01 trunk). nanochat 92d63d4's (the 2026-07
trunk, `trunk_options`) adds MuonEq before the orthogonalization and Muon+ after it,
normalizes Polar Express's input by 1.01 ||X||_F instead of 1.02 ||X||_F, and takes Muon's
beta2 at 0.9. `nanochat_order` changes no formula, only rounding: the moments are updated
with lerp and NorMuon's rescaling is computed from the second-moment sums, in the order of
operations of nanochat's kernels (both commits'), so that in fp32 eager the step equals
nanochat's bit for bit. The 2026-01 trunk keeps this module's own order, which its runs
trained with.

Checkpoints: state_dict() is this rank's shard; load_resharded() loads the shards saved by
any number of ranks (each param's state gathered whole, exactly, then re-sharded), so a run
can resume on another number of GPUs.

step(measure_grad_norm=True) also leaves `optimizer.grad_norms`, a read-only mapping
{"total": float, <group name>: float, ...}: L2 norms of the rank-averaged gradients, groups
sharing a name pooled. They stay on the device until first read, so the step itself never
waits for the host; read them when logging. Without the flag it is None.
"""

import collections.abc
import functools
import itertools
import os

import torch
import torch.distributed as dist

from nanochat import trunks
from nanochat.common import compute_dtype

# Polar Express (Amsel, Persson, Musco, Gower, arXiv 2505.16932) coefficients (a, b, c), one
# per iteration, computed for 5 iterations with safety factor 2e-2 and cushion 2; values as
# in karpathy/nanochat nanochat/optim.py (`polar_express_coeffs`).
POLAR_EXPRESS_COEFFS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)

# Kernels are compiled on CUDA only (on CPU/MPS compiling costs more than it saves);
# NANOCHAT_COMPILE_OPTIM=0 runs them eagerly everywhere.
COMPILE_ON_CUDA = os.environ.get("NANOCHAT_COMPILE_OPTIM", "1") != "0"

# DistMuonAdamW all-reduces AdamW params below this size instead of sharding them.
SMALL_PARAM_NUMEL = 1024

_ADAMW_DEFAULTS = {"eps": 1e-10, "weight_decay": 0.0, "replicated": False, "nanochat_order": False}
_MUON_DEFAULTS = {"momentum": 0.95, "ns_steps": 5, "beta2": 0.95, "weight_decay": 0.0, "muoneq": False,
                  "muon_plus": False, "polar_norm_factor": 1.02, "nanochat_order": False}
_REQUIRED = {"adamw": ("lr", "betas"), "muon": ("lr",)}
_COMMON_KEYS = {"params", "kind", "name", "lr", "initial_lr"}
_ALLOWED = {"adamw": _COMMON_KEYS | {"betas"} | set(_ADAMW_DEFAULTS), "muon": _COMMON_KEYS | set(_MUON_DEFAULTS)}


def trunk_options(trunk, kind):
    """The options a group of `kind` ("adamw" or "muon") takes on `trunk`, to merge into it: its
    record's (nanochat/trunks.py `optimizer_options`; 2026-01 takes the defaults above, 2026-07
    is nanochat 92d63d4's step)."""
    return dict(trunks.recipe(trunk).optimizer_options[kind])


def polar_express(G, ns_steps=5, norm_factor=1.02):
    """Approximate polar factor U V^T of each matrix in G (..., rows, cols), computed in G's
    dtype. Not exact: singular values come out near 1, not at 1. The input is scaled by
    1 / (norm_factor ||G||_F) first, so that every singular value lies below 1, where the
    coefficients were designed (for a safety factor 2e-2: hence 1.02; 92d63d4 uses 1.01)."""
    X = G / (G.norm(dim=(-2, -1), keepdim=True) * norm_factor + 1e-6)
    tall = G.size(-2) > G.size(-1)
    for a, b, c in POLAR_EXPRESS_COEFFS[:ns_steps]:
        # Square the smaller Gram matrix: X^T X for tall matrices, X X^T otherwise.
        if tall:
            A = X.mT @ X
            X = a * X + X @ (b * A + c * (A @ A))
        else:
            A = X @ X.mT
            X = a * X + (b * A + c * (A @ A)) @ X
    return X


def _wide(x):
    """x in fp32 at least: bf16 widened for the arithmetic, as nanochat's `.float()`, but fp64
    kept (an fp64 model, as tests/goldens/ compares, steps in fp64 throughout)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def adamw_update(p, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, wd, nanochat_order=False):
    """One AdamW step on one tensor, in place: decoupled weight decay, bias-corrected moments.
    The math runs in fp32 (fp64 for fp64 tensors) and is written back in each tensor's own
    dtype (bf16 embeddings on CUDA keep bf16 state). Hyper-parameters are 0-D CPU tensors.
    nanochat_order: the same formulas in nanochat's order of operations (moments by lerp, the
    step through add_'s alpha)."""
    if nanochat_order:
        _adamw_in_nanochat_order(p, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, wd)
        return
    g = _wide(grad)
    m = _wide(exp_avg) * beta1 + g * (1 - beta1)
    v = _wide(exp_avg_sq) * beta2 + g.square() * (1 - beta2)
    bias1 = 1 - beta1 ** step
    bias2 = 1 - beta2 ** step
    new_p = _wide(p) * (1 - lr * wd) - (lr / bias1) * m / ((v / bias2).sqrt() + eps)
    p.copy_(new_p)
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)


def _adamw_in_nanochat_order(p, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, wd):
    """adamw_update's formulas evaluated as nanochat 92d63d4's adamw_step_fused evaluates
    them, so that fp32 results agree bit for bit (lerp rounds unlike m beta1 + g (1 - beta1),
    and add_ with alpha may fuse the multiply)."""
    g = _wide(grad)
    p32, m, v = _wide(p), _wide(exp_avg), _wide(exp_avg_sq)  # fp32 tensors are updated in place
    p32.mul_(1 - lr * wd)
    m.lerp_(g, 1 - beta1)
    v.lerp_(g.square(), 1 - beta2)
    bias1 = 1 - beta1 ** step
    bias2 = 1 - beta2 ** step
    p32.add_(m / ((v / bias2).sqrt() + eps), alpha=-(lr / bias1))
    p.copy_(p32)
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)


def muoneq(X):
    """MuonEq row equilibration (arXiv 2603.28254): every row of each matrix rescaled to the
    matrix's RMS row norm ||X||_F / sqrt(rows), which leaves ||X||_F unchanged and conditions
    the spectrum that enters the orthogonalization. Norms in fp32 at least (X may be bf16)."""
    target = _wide(X).norm(dim=(-2, -1), keepdim=True) / X.size(-2) ** 0.5
    row_norm = _wide(X).norm(dim=-1, keepdim=True).clamp_min(1e-6)
    return X * (target / row_norm).to(X.dtype)


def muon_plus(X):
    """Muon+ (arXiv 2602.21545): each matrix rescaled to Frobenius norm sqrt(min(rows, cols)),
    that of an exactly semi-orthogonal matrix, which Polar Express's singular values near 1
    only approach."""
    target = min(X.size(-2), X.size(-1)) ** 0.5
    norm = _wide(X).norm(dim=(-2, -1), keepdim=True).clamp_min(1e-6)
    return X * (target / norm).to(X.dtype)


def normuon(X, second_momentum_buffer, beta2, red_dim, nanochat_order=False):
    """NorMuon (arXiv 2510.05491): orthogonalized rows (or columns) come out with uneven
    scales; divide each by the root of an EMA of its mean square (taken over red_dim, the
    shorter dim; the buffer is updated in place), then restore the matrix's Frobenius norm.
    nanochat_order: the norms from the mean squares, as nanochat evaluates them."""
    v_mean = _wide(X).square().mean(dim=red_dim, keepdim=True)
    if not nanochat_order:
        second_momentum_buffer.mul_(beta2).add_((1 - beta2) * v_mean.to(second_momentum_buffer.dtype))
        U = X * second_momentum_buffer.clamp_min(1e-10).rsqrt()
        return U * (X.norm(dim=(-2, -1), keepdim=True) / U.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-10))
    beta2 = beta2.to(X.dtype)
    n = X.size(red_dim)
    norm = (v_mean.sum(dim=(-2, -1), keepdim=True) * n).sqrt()
    second_momentum_buffer.lerp_(v_mean.to(second_momentum_buffer.dtype), 1 - beta2)
    scale = second_momentum_buffer.clamp_min(1e-10).rsqrt()
    new_norm = ((v_mean * n) * _wide(scale).square()).sum(dim=(-2, -1), keepdim=True).sqrt()
    return X * (scale * (norm / new_norm.clamp_min(1e-10))).to(X.dtype)


def muon_update(grads, params, momentum_buffer, second_momentum_buffer, momentum, lr, wd, beta2,
                ns_steps, red_dim, ortho_dtype, use_muoneq=False, use_muon_plus=False, norm_factor=1.02,
                nanochat_order=False):
    """One Muon step on a stack of K same-shape matrices (K, rows, cols), in place on params
    and both buffers. lr is already scaled by the shape; hyper-parameters are 0-D CPU tensors.
    The options are a group's muoneq, muon_plus, polar_norm_factor and nanochat_order."""
    # Nesterov momentum: the buffer is an EMA of gradients, the update looks one step ahead.
    if nanochat_order:
        momentum = momentum.to(grads.dtype)  # lerp's weight in the tensors' dtype
        momentum_buffer.lerp_(grads, 1 - momentum)
        g = grads.lerp(momentum_buffer, momentum)
    else:
        momentum_buffer.mul_(momentum).add_((1 - momentum) * grads)
        g = (1 - momentum) * grads + momentum * momentum_buffer
    X = g.to(ortho_dtype)
    if use_muoneq:
        X = muoneq(X)
    X = polar_express(X, ns_steps, norm_factor).to(params.dtype)
    if use_muon_plus:
        X = muon_plus(X)
    U = normuon(X, second_momentum_buffer, beta2, red_dim, nanochat_order)
    # Cautious weight decay: decay only the coordinates the update moves the same way.
    # lr wd in the params' dtype, as nanochat: an fp32 product would round an fp64 step
    lr, wd = lr.to(params.dtype), wd.to(params.dtype)
    mask = (U * params) >= 0
    params.sub_(lr * U + (lr * wd) * params * mask)


@functools.cache
def _compiled(fn, dynamic):
    return torch.compile(fn, dynamic=dynamic, fullgraph=True)


def _kernel(fn, device, dynamic):
    """fn itself, or its compiled form on CUDA. AdamW runs on flattened tensors compiled with
    dynamic shapes, so that dozens of distinct small shapes cost one graph instead of hitting
    dynamo's recompile limit (a hard error under fullgraph). Muon compiles one graph per
    stack shape (K, rows, cols): fine for nanochat's 4 groups, an error past 8."""
    if device.type == "cuda" and COMPILE_ON_CUDA:
        return _compiled(fn, dynamic)
    return fn


@functools.cache
def _ortho_dtype(device_type):
    """Polar Express runs in bf16 where the model computes in bf16 (CUDA sm80+), as nanochat
    does; elsewhere (CPU, MPS, older GPUs) in fp32, which is exact enough and, on CPU, faster."""
    return torch.bfloat16 if compute_dtype(device_type) == torch.bfloat16 else torch.float32


class GradNorms(collections.abc.Mapping):
    """{"total": norm, <group name>: norm, ...} from a device vector of squared norms per
    name, copied to the host on the first read (the one synchronization they cost)."""

    def __init__(self, names, sq):
        self._names, self._sq, self._values = names, sq, None

    def _resolve(self):
        if self._values is None:
            squares = self._sq.tolist()
            self._values = {"total": sum(squares) ** 0.5, **{n: v ** 0.5 for n, v in zip(self._names, squares)}}
        return self._values

    def __getitem__(self, name):
        return self._resolve()[name]

    def __iter__(self):
        return iter(self._resolve())

    def __len__(self):
        return len(self._names) + 1


def _sharded(p, group, world_size):
    """Does DistMuonAdamW reduce-scatter p (True) or all-reduce it (False) on world_size ranks?"""
    return not group["replicated"] and p.numel() >= SMALL_PARAM_NUMEL and p.shape[0] % world_size == 0


class MuonAdamW(torch.optim.Optimizer):
    """Muon for the "muon" groups, AdamW for the "adamw" groups, in one process."""

    world_size = 1
    rank = 0

    def __init__(self, param_groups):
        self.grad_norms = None
        # Reused 0-D CPU tensors for the hyper-parameters (see module docstring).
        self._scalars = {k: torch.zeros((), dtype=torch.float32) for k in
                         ("step", "lr", "beta1", "beta2", "eps", "wd", "momentum", "muon_lr", "muon_wd", "muon_beta2")}
        super().__init__(param_groups, defaults={})

    def add_param_group(self, group):
        index = len(self.param_groups)
        if not isinstance(group, dict):
            raise ValueError(f"parameter group {index} must be a dict with a 'kind' ('adamw' or 'muon'), got {type(group).__name__}")
        kind = group.get("kind")
        if kind not in _REQUIRED:
            raise ValueError(f"parameter group {index} has kind={kind!r}; set 'kind' to 'adamw' or 'muon'")
        missing = [k for k in ("params",) + _REQUIRED[kind] if k not in group]
        if missing:
            raise ValueError(f"{kind} group {index} lacks {missing}; add them to the group dict")
        unknown = sorted(set(group) - _ALLOWED[kind])
        if unknown:
            raise ValueError(f"{kind} group {index} has unknown keys {unknown}; allowed: {sorted(_ALLOWED[kind])}")
        params = group["params"]
        group["params"] = [params] if isinstance(params, torch.Tensor) else list(params)
        for key, value in (_ADAMW_DEFAULTS if kind == "adamw" else _MUON_DEFAULTS).items():
            group.setdefault(key, value)
        group.setdefault("name", f"{kind}{index}")
        group.setdefault("initial_lr", group["lr"])
        if group["name"] == "total":
            raise ValueError(f"group {index} is named 'total', which grad_norms reserves for the global norm; rename it")
        if kind == "muon":
            self._check_muon_group(group, index)
        super().add_param_group(group)

    @staticmethod
    def _check_muon_group(group, index):
        params = group["params"]
        if not params:
            raise ValueError(f"muon group {index} ({group['name']}) has no params; drop the group")
        if not 1 <= group["ns_steps"] <= len(POLAR_EXPRESS_COEFFS):
            raise ValueError(f"muon group {index}: ns_steps={group['ns_steps']}, but Polar Express "
                             f"has coefficients for 1..{len(POLAR_EXPRESS_COEFFS)} iterations")
        if not group["polar_norm_factor"] >= 1.0:  # below 1 the top singular value may leave [0, 1]
            raise ValueError(f"muon group {index}: polar_norm_factor={group['polar_norm_factor']}; use a value "
                             ">= 1 (1.02, or 1.01 as nanochat 92d63d4)")
        for p in params:
            if p.ndim != 2:
                raise ValueError(f"muon group {index} ({group['name']}) holds a {p.ndim}-D param of shape "
                                 f"{tuple(p.shape)}; Muon orthogonalizes matrices, put it in an adamw group")
        shapes = sorted({(tuple(p.shape), p.dtype) for p in params}, key=str)
        if len(shapes) > 1:
            raise ValueError(f"muon group {index} ({group['name']}) mixes shapes/dtypes {shapes}; "
                             "make one muon group per shape")

    # ---- kernels with their hyper-parameters

    def _fill(self, **values):
        out = []
        for k, v in values.items():
            self._scalars[k].fill_(v)
            out.append(self._scalars[k])
        return out

    def _adamw(self, params, grads, states, group):
        """One AdamW step on `params` (each a param or its owned slice, with its lazy state in
        `states`; one group, one step count) from their averaged `grads`, in one kernel call
        however many they are: several are concatenated into flat buffers and copied back
        afterwards. The connections' dozens of small tensors then cost one launch (and one
        call's host overhead) instead of one each, for copies of a few MB; the kernel works
        element by element, so the result is the same, bit for bit, as one call per tensor.
        Returns the flat gradient (the input of the gradient norms)."""
        for p, state in zip(params, states):
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
        beta1, beta2 = group["betas"]
        scalars = self._fill(step=states[0]["step"], lr=group["lr"], beta1=beta1, beta2=beta2,
                             eps=group["eps"], wd=group["weight_decay"])
        updated = [params, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]]
        if len(params) == 1:
            flat = [tensors[0].view(-1) for tensors in updated]  # updated in place
            grad = grads[0].reshape(-1)
        else:
            flat = [torch.cat([t.reshape(-1) for t in tensors]) for tensors in updated]
            grad = torch.cat([g.reshape(-1) for g in grads])
        kernel = _kernel(adamw_update, params[0].device, dynamic=True)
        kernel(flat[0], grad, flat[1], flat[2], *scalars, group["nanochat_order"])
        if len(params) > 1:
            sizes = [p.numel() for p in params]
            for tensors, buffer in zip(updated, flat):
                torch._foreach_copy_(tensors, [piece.view_as(t) for piece, t in zip(buffer.split(sizes), tensors)])
        return grad

    def _adamw_group(self, params, grads, group, norm_sq=None):
        """AdamW on `params` of one group from their averaged `grads`, one kernel call per
        batch: a large param of a group that is not replicated alone (concatenating it would
        copy it), the others together per step count (one count as a rule: a param without a
        gradient skips a step and falls behind the others). With norm_sq, a 0-D view into the
        norm accumulator, adds the gradients' squared norm to it."""
        batches = {}
        for p, g in zip(params, grads):
            key = ("alone", id(p)) if _sharded(p, group, 1) else ("step", self.state[p].get("step", 0))
            batches.setdefault(key, []).append((p, g))
        for batch in batches.values():
            ps, gs = map(list, zip(*batch))
            grad = self._adamw(ps, gs, [self.state[p] for p in ps], group)
            if norm_sq is not None:
                norm_sq.add_(grad.float().square().sum())

    def _muon(self, grads, params, state, group):
        """Update a stack of K matrices (a whole group, or this rank's chunk of it) in place from
        their stacked averaged gradients; the group's state lives in state (buffers of K)."""
        K, rows, cols = params.shape
        if not state:
            state["momentum_buffer"] = torch.zeros_like(params)
            # one second-moment statistic per element of the longer dim
            shape = (K, rows, 1) if rows >= cols else (K, 1, cols)
            state["second_momentum_buffer"] = torch.zeros(shape, dtype=params.dtype, device=params.device)
        red_dim = -1 if rows >= cols else -2
        scalars = self._fill(momentum=group["momentum"], muon_lr=group["lr"] * max(1.0, rows / cols) ** 0.5,
                             muon_wd=group["weight_decay"], muon_beta2=group["beta2"])
        # fp64 params (the reference comparisons, tests/goldens/) are orthogonalized in fp64
        ortho_dtype = torch.float64 if params.dtype == torch.float64 else _ortho_dtype(params.device.type)
        kernel = _kernel(muon_update, params.device, dynamic=False)
        kernel(grads, params, state["momentum_buffer"], state["second_momentum_buffer"], *scalars,
               group["ns_steps"], red_dim, ortho_dtype, use_muoneq=group["muoneq"],
               use_muon_plus=group["muon_plus"], norm_factor=group["polar_norm_factor"],
               nanochat_order=group["nanochat_order"])

    # ---- gradient norms

    def _norm_accumulator(self):
        """(index of each group's name, zero vector of squared norms per name)."""
        names = list(dict.fromkeys(g["name"] for g in self.param_groups))
        device = next((p.device for g in self.param_groups for p in g["params"]), torch.device("cpu"))
        index = [names.index(g["name"]) for g in self.param_groups]
        return names, index, torch.zeros(len(names), dtype=torch.float32, device=device)

    # ---- step

    @torch.no_grad()
    def step(self, measure_grad_norm=False):
        """Update every param from its .grad. AdamW params without a grad are skipped; a muon
        group is skipped only when none of its params has a grad."""
        if measure_grad_norm:
            names, index, sq = self._norm_accumulator()
        for gi, group in enumerate(self.param_groups):
            if group["kind"] == "adamw":
                params = [p for p in group["params"] if p.grad is not None]
                self._adamw_group(params, [p.grad for p in params], group, sq[index[gi]] if measure_grad_norm else None)
                continue
            params = group["params"]
            with_grad = [p.grad is not None for p in params]
            if not any(with_grad):
                continue
            if not all(with_grad):
                raise RuntimeError(f"muon group {group['name']}: some params have no gradient; Muon updates "
                                   "the group as one stack, so every param needs one (or none)")
            grads = torch.stack([p.grad for p in params])
            if measure_grad_norm:
                sq[index[gi]] += grads.float().square().sum()
            stacked = torch.stack(params)
            self._muon(grads, stacked, self.state[params[0]], group)
            torch._foreach_copy_(params, list(stacked.unbind(0)))
        self.grad_norms = GradNorms(names, sq) if measure_grad_norm else None

    def launch_reductions_in_backward(self):
        """Called before the last micro-step's backward; one process has nothing to reduce."""

    # ---- checkpoints: state is per rank, so record which shard it is

    def state_dict(self):
        sd = super().state_dict()
        sd["sharding"] = {"rank": self.rank, "world_size": self.world_size}
        return sd

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        saved = state_dict.pop("sharding", None)
        here = {"rank": self.rank, "world_size": self.world_size}
        if saved is not None and saved != here:
            raise ValueError(f"optimizer state was saved by rank {saved['rank']} of {saved['world_size']}, "
                             f"this is rank {self.rank} of {self.world_size}; load optim_<step>_rank<r>.pt on "
                             "rank r, or every rank's file with load_resharded()")
        super().load_state_dict(state_dict)
        # The saved groups replace ours; one saved before a group option existed ran its default.
        for group in self.param_groups:
            for key, value in (_ADAMW_DEFAULTS if group["kind"] == "adamw" else _MUON_DEFAULTS).items():
                group.setdefault(key, value)

    # ---- another world size: gather every rank's shard, keep this rank's new one

    def _placements(self, world_size):
        """How `world_size` ranks hold the state of each param, in state_dict order:
        ("whole", None): every rank the whole of it (one process; the all-reduced params);
        ("rows", n): rank r rows [r*n, (r+1)*n) (the reduce-scattered AdamW params);
        ("matrices", c): the muon group's first param holds the group's stack, rank r its
        matrices [r*c, (r+1)*c); ("none", None): the group's other params hold nothing."""
        out = []
        for group in self.param_groups:
            if group["kind"] == "muon":
                chunk = -(-len(group["params"]) // world_size)
                out += [("matrices", chunk)] + [("none", None)] * (len(group["params"]) - 1)
                continue
            for p in group["params"]:
                out.append(("rows", p.shape[0] // world_size) if world_size > 1 and _sharded(p, group, world_size)
                           else ("whole", None))
        return out

    def gather_state_dicts(self, shards):
        """The state dict one process would hold, from the state dicts `shards[r]` saved by
        rank r of len(shards): row blocks and matrix stacks concatenated in rank order, whole
        states (and step counts, equal on every rank) taken from rank 0. Exact: no arithmetic."""
        world_size = len(shards)
        for r, shard in enumerate(shards):
            if shard.get("sharding", {"rank": 0, "world_size": 1}) != {"rank": r, "world_size": world_size}:
                raise ValueError(f"optimizer shard {r} of {world_size} was saved as {shard.get('sharding')}; "
                                 "pass every rank's file, in rank order")
        state = {}
        for index, (kind, _) in enumerate(self._placements(world_size)):
            parts = [s["state"][index] for s in shards if s["state"].get(index)]
            if kind == "none" or not parts:
                continue
            if kind == "whole":
                state[index] = parts[0]
                continue
            if kind == "rows" and len(parts) != world_size:
                raise ValueError(f"optimizer state of param {index} is missing on some of the {world_size} ranks")
            state[index] = {k: torch.cat([part[k] for part in parts]) if torch.is_tensor(v) else v
                            for k, v in parts[0].items()}
        return {"state": state, "param_groups": shards[0]["param_groups"],
                "sharding": {"rank": 0, "world_size": 1}}

    def shard_state_dict(self, full):
        """This rank's part of a one-process state dict (gather_state_dicts' result)."""
        state = {}
        for index, (kind, size) in enumerate(self._placements(self.world_size)):
            if index not in full["state"] or kind == "none":
                continue
            whole = full["state"][index]
            if kind == "whole":
                state[index] = whole
                continue
            piece = {k: v[self.rank * size:(self.rank + 1) * size].clone() if torch.is_tensor(v) else v
                     for k, v in whole.items()}
            if kind == "rows" or len(piece["momentum_buffer"]):  # past a muon stack's end a rank owns nothing
                state[index] = piece
        return {"state": state, "param_groups": full["param_groups"],
                "sharding": {"rank": self.rank, "world_size": self.world_size}}

    def load_resharded(self, shards):
        """Load the state saved by len(shards) ranks (any number) into this rank of this world
        size: every param's state is gathered whole, then this rank keeps what it now owns.
        Hyper-parameters come from the saved groups, as with load_state_dict."""
        self.load_state_dict(self.shard_state_dict(self.gather_state_dicts(shards)))


# Async collectives; the *_single names replace the deprecated *_tensor ones in new torch.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class DistMuonAdamW(MuonAdamW):
    """MuonAdamW across ranks, ZeRO-2 style: gradients are averaged across ranks (on entry
    each rank's .grad holds its own local gradient; .grad is left unchanged), each rank updates
    and keeps state only for the part it owns, and the updated params are all-gathered.

    - AdamW params are reduce-scattered along dim 0; a rank updates its rows. The params of a
      `replicated` group (the connections: many small tensors), params under
      SMALL_PARAM_NUMEL elements and those whose dim 0 does not divide the world size are
      instead all-reduced, all of them in one flat buffer per dtype, and updated on every rank
      (one AdamW kernel call per group, not per param: see _adamw).
    - A muon group's K grads are stacked, zero-padded to ceil(K/W)*W and reduce-scattered;
      rank r owns matrices [r*ceil(K/W), (r+1)*ceil(K/W)) of the group.
    - Reductions use SUM then a division by W: gloo has no AVG on every torch version.

    Each reduction is a "unit" (the flat buffer, one sharded param, one muon group). After
    `launch_reductions_in_backward()`, gradient hooks launch a unit's reduction as soon as
    backward has finished all of its gradients, so communication overlaps the rest of the
    backward (as modded-nanogpt does). Under a whole-model torch.compile the backward is one
    graph that hands over every gradient at its end: the hooks then fire together, and what
    is saved is only the wait for step(). step() launches whatever was not launched, then, in
    launch order, waits, updates what this rank owns and launches the all-gathers, and
    finally waits for the gathers. Either way every collective and every update is the same,
    so the results are identical.
    """

    def __init__(self, param_groups):
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("DistMuonAdamW needs a process group: launch under torchrun and call "
                               "common.compute_init() first, or use MuonAdamW in a single process")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        super().__init__(param_groups)
        self._units = self._plan_units()
        self._unit_of = {p: u for u, (_, params, _) in enumerate(self._units) for p in params}
        self._group_index = {p: gi for gi, g in enumerate(self.param_groups) for p in g["params"]}
        self._armed = False
        self._remaining = {}
        self._launched = {}  # unit index -> in-flight reduction, in launch order
        for p in self._unit_of:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def _plan_units(self):
        """[(kind, params, group index)]: the flat all-reduce buffers (one per dtype and device)
        first, then every sharded AdamW param and every muon group."""
        flat, units = {}, []
        for gi, group in enumerate(self.param_groups):
            if group["kind"] == "muon":
                units.append(("muon", group["params"], gi))
                continue
            for p in group["params"]:
                if _sharded(p, group, self.world_size):
                    units.append(("shard", [p], gi))
                else:
                    flat.setdefault((p.dtype, p.device), []).append(p)
        return [("flat", params, None) for params in flat.values()] + units

    # ---- launching reductions, from hooks or from step()

    def launch_reductions_in_backward(self):
        """Arm the gradient hooks for the next backward (the last micro-step's: earlier ones
        only accumulate local gradients)."""
        self._armed = True
        self._remaining = {u: len(params) for u, (_, params, _) in enumerate(self._units)}
        self._launched = {}

    def _grad_ready(self, p):
        if not self._armed:
            return
        u = self._unit_of[p]
        self._remaining[u] -= 1
        if self._remaining[u] == 0:
            self._launched[u] = self._launch(u)

    def _launch(self, u):
        kind, params, _ = self._units[u]
        W = self.world_size
        if kind == "flat":
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            return dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True), flat
        if kind == "shard":
            grad = params[0].grad
            grad_slice = torch.empty_like(grad[:grad.shape[0] // W])
            return _reduce_scatter(grad_slice, grad.contiguous(), op=dist.ReduceOp.SUM, async_op=True), grad_slice
        chunk = -(-len(params) // W)
        stacked = torch.zeros(chunk * W, *params[0].shape, dtype=params[0].dtype, device=params[0].device)
        torch.stack([p.grad for p in params], out=stacked[:len(params)])
        grad_chunk = torch.empty_like(stacked[:chunk])
        return _reduce_scatter(grad_chunk, stacked, op=dist.ReduceOp.SUM, async_op=True), grad_chunk, stacked

    # ---- the step

    @torch.no_grad()
    def step(self, measure_grad_norm=False):
        W, rank = self.world_size, self.rank
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    raise RuntimeError(f"param of shape {tuple(p.shape)} in group {group['name']} has no gradient; "
                                       "DistMuonAdamW needs every param's gradient on every rank (the collectives "
                                       "must match), so run backward first or drop the param from the optimizer")
        if measure_grad_norm:
            names, index, sq = self._norm_accumulator()
        # Phase 1: launch what the hooks did not (all of it without launch_reductions_in_backward).
        launched, self._launched, self._armed = self._launched, {}, False
        for u in range(len(self._units)):
            if u not in launched:
                launched[u] = self._launch(u)

        # Phase 2: in launch order (the earliest-ready gradients first), wait, update what this
        # rank owns, launch the gathers.
        gathers = []
        for u, reduction in launched.items():
            kind, params, gi = self._units[u]
            work, grad = reduction[:2]
            work.wait()
            grad.div_(W)
            if kind == "flat":
                grads = dict(zip(params, grad.split([p.numel() for p in params])))
                # the buffer holds each group's params in a row: one update per group
                for gi, members in itertools.groupby(params, key=self._group_index.get):
                    members = list(members)
                    norm_sq = sq[index[gi]] if measure_grad_norm and rank == 0 else None  # replicated: count once
                    self._adamw_group(members, [grads[p] for p in members], self.param_groups[gi], norm_sq)
                continue
            group = self.param_groups[gi]
            if measure_grad_norm:
                sq[index[gi]] += grad.float().square().sum()  # muon's zero padding adds nothing
            if kind == "shard":
                p = params[0]
                rows = p.shape[0] // W
                p_slice = p[rank * rows:(rank + 1) * rows]
                self._adamw([p_slice], [grad], [self.state[p]], group)
                # p_slice is this rank's block of p: an in-place gather
                gathers.append((_all_gather(p, p_slice, async_op=True), None, None))
                continue
            stacked = reduction[2]
            chunk = grad.shape[0]
            owned = params[rank * chunk:(rank + 1) * chunk]
            updated = torch.zeros_like(grad)
            if owned:
                updated[:len(owned)] = torch.stack(owned)
                self._muon(grad[:len(owned)], updated[:len(owned)], self.state[params[0]], group)
            # the padded grad stack is free again: gather the updated matrices into it
            gathers.append((_all_gather(stacked, updated, async_op=True), stacked, params))

        norm_work = dist.all_reduce(sq, op=dist.ReduceOp.SUM, async_op=True) if measure_grad_norm else None
        # Phase 3: wait for the gathers; muon groups copy the stack back into their params.
        for work, stacked, params in gathers:
            work.wait()
            if params is not None:
                torch._foreach_copy_(params, list(stacked[:len(params)].unbind(0)))
        if norm_work is not None:
            norm_work.wait()
        self.grad_norms = GradNorms(names, sq) if measure_grad_norm else None


def build_optimizer(param_groups, world_size):
    """DistMuonAdamW when training on several ranks, MuonAdamW otherwise."""
    return DistMuonAdamW(param_groups) if world_size > 1 else MuonAdamW(param_groups)
