"""The bytes a connection moves per token and sub-layer, forward and backward, per stream-op
backend: what it costs on a GPU where it is bandwidth-bound (a connection adds under 1 % FLOPs),
and the step it predicts beside the residual baseline's measured one.

What is counted: a trunk of 2 * 12 sub-layers at D=12 (n = 4, C = 768, 32 x 2048 tokens, bf16
streams under CUDA's autocast rules) around branches u -> norm(u) @ M, M a frozen C x C matrix:
everything but the branches' matmuls, i.e. the connection's own passes and the sub-layers'
input norms (which the residual baseline fuses with its add). The trunk is traced as
torch.compile partitions it (AOTAutograd, the min-cut partitioner, Inductor's
decompositions: nanochat/planning/memory.py's tracing, on fake tensors, so at full size and in
seconds), and each graph is priced kernel by kernel:

- PyTorch ops by Inductor's fusion (memory.written_nodes): a kernel writes its buffer once
  and reads each buffer its fused chain reaches once;
- custom ops (nanochat::*: our seams, Liger's kernels, the projection of the torch path) by
  running their implementation on real tensors of the same shapes at 16 and 32 tokens and
  counting, for each Triton kernel launched, the distinct bytes its loads and stores touch
  (Triton's interpreter, instrumented) and, for each PyTorch op inside, its inputs and
  outputs; the count is affine in the tokens, so two token counts give it at 65,536.

A kernel's distinct bytes are what it moves from DRAM when what a program reads twice stays
in cache between the reads (the fused seams re-read a tile they have just read: the pre mix
after the projection, backward's second pass); the loads it issues are counted too ("issued").

The floor (docs/kernels.md): at D=12 plain residual moves about 8C per token and sub-layer,
an ideal fused HC layer about 29C (C = 768 values of 2 bytes). The prediction: the residual
baseline's measured step (docs/gpu_check.json, nanochat.measurements.residual_step) plus the extra bytes at 80 % of the GPU's
bandwidth.
"""

import contextlib
import functools
import math
import operator

import numpy as np
import torch
from torch import nn

from nanochat import gpus
from nanochat.planning import memory

D12 = dict(n_layer=12, C=768, n=4, tokens=32 * 2048)
COUNT_TOKENS = (16, 32)  # the token counts custom ops are run at (1 and 2 tiles of the seams)
ELEMENT = 2  # bytes of a bf16 stream value: the floor's unit C is 768 of them
FLOOR_C = {"residual": 8, "fused HC": 29}  # per token and sub-layer, in units of C (docs/kernels.md)
BANDWIDTH_USE = 0.8


class TrunkUnderTest(nn.Module):
    """The connections of a D=12 model around branches u -> norm(u) @ M (M frozen): the
    matmuls stand in for the sub-layers, which are not the connection's traffic."""

    def __init__(self, config):
        super().__init__()
        from nanochat import connections
        self.connections = connections.build(config)
        self.branch_weight = nn.Parameter(torch.empty(config.n_embd, config.n_embd), requires_grad=False)

    def forward(self, x0):
        from nanochat.gpt import norm
        raw = self.connections.norms_sublayer_inputs(x0)  # the fused seams norm the inputs themselves

        def branch(u):
            return (u if raw else norm(u)) @ self.branch_weight.to(u.dtype)
        return self.connections(x0, [branch] * len(self.connections.layers))


def trace(fields, kernels, tokens=D12["tokens"]):
    """(forward graph, backward graph) of the D=12 trunk of config `fields` (GPTConfig
    fields) on backend `kernels`, as torch.compile partitions it."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from nanochat.gpt import GPTConfig
    C = D12["C"]
    config = GPTConfig(sequence_len=2048, vocab_size=64, n_layer=D12["n_layer"], n_head=C // 128, n_kv_head=C // 128,
                       n_embd=C, hc_kernels=kernels, **fields)
    with FakeTensorMode(), memory.cuda_rules(compile=True), memory.kernels_on_cpu():
        trunk = TrunkUnderTest(config)
        step, graphs = memory.aot_step(trunk)
        x0 = torch.randn(1, tokens, C).to(torch.bfloat16).requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = step(x0)
        out.float().sum().backward()
    return graphs["fw"], graphs["bw"]


def is_custom(node):
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target.namespace == "nanochat"


# Inductor lowers these to pointwise selections (lowering.py's select_scatter, slice_scatter):
# the gradient of a slice is computed inside its consumer. The memory planner keeps them as
# buffers (its estimates were checked against a GPU that way); for bytes they are fused.
SCATTERS_INTO_ZEROS = ("select_scatter", "slice_scatter")


def fusible(node):
    target = node.target
    return memory._fusible(node) or (isinstance(target, torch._ops.OpOverload)
                                     and target.overloadpacket.__name__ in SCATTERS_INTO_ZEROS)


def graph_bytes(gm, skip, op_bytes):
    """Bytes the graph's kernels move. A kernel per buffer Inductor writes (memory.written_nodes),
    writing it once and reading what its fused chain reaches once: graph inputs and buffers,
    a slice (view) of one by its own size. Reductions over the same shape that read the same
    buffers are one kernel (Inductor fuses them: e.g. the n^2 sums of an H_res gradient), which
    reads them once. A custom op's bytes come from `op_bytes(node)`; kernels reading a node of
    `skip` (the branch weight) are left out."""
    written = memory.written_nodes(gm, fusible=fusible)
    base = memory._bases(gm)

    @functools.cache
    def reads(node):
        """The values a kernel computing `node` loads: views of buffers or graph inputs."""
        found = set()
        for arg in node.all_input_nodes:
            b = base[arg]
            found |= {arg} if b in written or b.op == "placeholder" else reads(b)
        return frozenset(found)

    def read_bytes(values):
        by_base = {}
        for v in values:
            by_base[base[v]] = by_base.get(base[v], 0) + memory._node_bytes(v)
        return sum(min(b, memory._node_bytes(k)) for k, b in by_base.items())

    total, reductions = 0, {}
    for node in gm.graph.nodes:
        # an element of a custom op's outputs is a buffer of its own (memory._bases), which the
        # op wrote: taking it moves nothing
        if node not in written or node.op != "call_function" or node.target is operator.getitem:
            continue
        values = reads(node)
        if {base[v] for v in values} & skip or node in skip:
            continue
        if is_custom(node):
            total += op_bytes(node)
        elif memory._reduction(node):
            key = (tuple(node.meta["val"].shape), frozenset(base[v] for v in values))
            total += memory._node_bytes(node)
            reductions.setdefault(key, set()).update(values)
        else:
            total += memory._node_bytes(node) + read_bytes(values)
    return total + sum(read_bytes(values) for values in reductions.values())


# ----- custom ops, counted on real tensors -----

class Count:
    """Bytes of Triton launches (distinct addresses loaded and stored per launch, and loads
    issued) and of PyTorch ops (inputs and outputs) while active."""

    def __init__(self):
        self.triton = self.issued = self.torch = 0
        self.kernels = {}  # kernel_key -> the distinct bytes of its launches
        # loads a program issues again at addresses of per-token tensors it has loaded before:
        # its second passes over its own tile, which a GPU finds in L2 only while the programs
        # resident together have not pushed the tile out (docs/kernels.md, "Two seam designs")
        self.reread = 0


def kernel_key(fn, kwargs):
    """(name, what) of a Triton kernel launched with keyword arguments `kwargs`: its function's
    name and, for a fused seam, which seam (fused.describe: the switches, the split design's
    phase), as kernel_aot names a compiled kernel (`scripts.kernel_check --json`)."""
    name = fn.__name__
    if name.startswith("seam_") and fn.__module__.endswith("fused_kernels"):
        from nanochat.connections.backends import fused
        return name, fused.describe(kwargs)
    return name, ""


def token_spans(args, tokens):
    """[(first address, end)] of the tensors among `args` whose first dimension is `tokens`: the
    per-token data (streams, their gradients, per-token coefficients), not the weights and
    tables every program shares."""
    return [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
            for t in torch.utils._pytree.tree_leaves(args)
            if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == tokens]


def reread_bytes(loads, spans):
    """Bytes among one program's `loads` ((addresses, element size) groups) issued at an address
    of `spans` that the program had loaded before."""
    out = 0
    for size in {s for _, s in loads}:
        found = np.concatenate([a for a, s in loads if s == size])
        inside = np.zeros(found.shape, bool)
        for lo, hi in spans:
            inside |= (found >= lo) & (found < hi)
        found = found[inside]
        out += (found.size - np.unique(found).size) * size
    return out


@contextlib.contextmanager
def counting(tokens=None):
    """Within: a Count of every Triton kernel launched in the interpreter (TRITON_INTERPRET=1)
    and every PyTorch op dispatched outside them; with `tokens` (the token count of the tensors
    passed), each program's re-reads of per-token tensors too (Count.reread)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from triton.runtime import interpreter

    count = Count()
    launch = []  # the address sets of the launch in flight
    builder, executor = interpreter.InterpreterBuilder, interpreter.GridExecutor
    real = (builder.create_masked_load, builder.create_masked_store, builder.create_atomic_rmw, executor.__call__,
            builder.set_grid_idx)

    def touched(kind, ptrs, mask):
        if launch:
            size = ptrs.get_element_ty().primitive_bitwidth // 8
            addresses = ptrs.data[mask.data] if mask is not None else ptrs.data.ravel()
            launch[-1][kind].append((np.asarray(addresses).ravel(), size))
            if kind == "load":
                launch[-1]["program"].append(launch[-1]["load"][-1])

    def program_done():
        if launch and launch[-1]["program"]:
            count.reread += reread_bytes(launch[-1]["program"], launch[-1]["spans"])
            launch[-1]["program"] = []

    def next_program(self, *idx):  # the interpreter runs a launch's programs one after another
        program_done()
        return real[4](self, *idx)

    def load(self, ptrs, mask, other, *args):
        touched("load", ptrs, mask)
        return real[0](self, ptrs, mask, other, *args)

    def store(self, ptrs, value, mask, *args):
        touched("store", ptrs, mask)
        return real[1](self, ptrs, value, mask, *args)

    def atomic(self, op, ptrs, value, mask, *args):
        touched("load", ptrs, mask)
        touched("store", ptrs, mask)
        return real[2](self, op, ptrs, value, mask, *args)

    def run(self, *args, **kwargs):
        spans = token_spans((args, kwargs), tokens) if tokens else []
        launch.append({"load": [], "store": [], "program": [], "spans": spans})
        with torch.utils._python_dispatch._disable_current_modes():  # the interpreter's own copies
            out = real[3](self, *args, **kwargs)
        program_done()
        sets = launch.pop()
        moved = sum(distinct_bytes(sets[kind]) for kind in ("load", "store"))
        count.triton += moved
        key = kernel_key(self.fn, kwargs)
        count.kernels[key] = count.kernels.get(key, 0) + moved
        count.issued += sum(a.size * size for a, size in sets["load"])
        return out

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not moves_nothing(func):
                tensors = {id(t): t for t in torch.utils._pytree.tree_leaves((args, kwargs, out))
                           if isinstance(t, torch.Tensor)}
                count.torch += sum(tensor_bytes(t) for t in tensors.values())
            return out

    builder.create_masked_load, builder.create_masked_store, builder.create_atomic_rmw = load, store, atomic
    executor.__call__, builder.set_grid_idx = run, next_program
    try:
        with Ops():
            yield count
    finally:
        (builder.create_masked_load, builder.create_masked_store, builder.create_atomic_rmw, executor.__call__,
         builder.set_grid_idx) = real


def distinct_bytes(accesses):
    """Bytes at distinct addresses among (addresses, element size) groups."""
    out = 0
    for size in {s for _, s in accesses}:
        found = [a for a, s in accesses if s == size]
        if found:
            out += np.unique(np.concatenate(found)).size * size
    return out


def moves_nothing(func):
    """Ops that allocate or view without reading or writing memory. An op whose result aliases
    an input it writes (in place, or out=) moves bytes: only an alias that is not written is a
    view."""
    name = func.overloadpacket.__name__
    if name.startswith(("empty", "new_empty")) or name in ("set_", "detach", "alias"):
        return True
    returns = func._schema.returns
    return bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write


def tensor_bytes(t):
    """Bytes of a tensor's elements, at most its storage's (an expanded tensor's are few)."""
    return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())


def _real_args(node, tokens):
    """The node's arguments as real tensors, the token dimension (D12's tokens) at `tokens`."""
    def real(a):
        if not isinstance(a, torch.fx.Node):
            return a
        val = a.meta["val"]
        if not isinstance(val, torch.Tensor):
            return val
        shape = [tokens if d == D12["tokens"] else d for d in val.shape]
        g = torch.Generator().manual_seed(0)
        return torch.rand(shape, generator=g).to(val.dtype) if val.is_floating_point() else torch.zeros(
            shape, dtype=val.dtype)
    return torch.utils._pytree.tree_map(real, (node.args, node.kwargs))


def _op_key(node):
    def describe(a):
        if isinstance(a, torch.fx.Node):
            val = a.meta["val"]
            return (tuple(val.shape), str(val.dtype)) if isinstance(val, torch.Tensor) else repr(val)
        return repr(a)
    return node.target.name(), tuple(map(describe, torch.utils._pytree.tree_leaves((node.args, node.kwargs))))


@contextlib.contextmanager
def weight_grad_split_at_d12():
    """Within: the fused weight gradient has as many token splits as at D12's token count,
    each of the tiles the tokens present need (the splits past them load nothing), so that its
    partial sums, a fixed cost per launch, are counted at their D=12 size when an op runs at
    COUNT_TOKENS, without looping over D=12's tiles in the interpreter."""
    from nanochat.connections.backends import fused
    real = fused.weight_grad_grid

    def grid(N, D):
        (d_blocks, splits), _, block_d = real(D12["tokens"], D)
        _, steps, _ = real(N, D)
        return (d_blocks, splits), steps, block_d

    fused.weight_grad_grid = grid
    try:
        with mix_splits_at_d12():
            yield
    finally:
        fused.weight_grad_grid = real


@contextlib.contextmanager
def mix_splits_at_d12():
    """Within: the split design's mix kernel splits the channels as it does at D12's token count
    (fused.mix_splits: unsplit there), not as at COUNT_TOKENS' few tiles, so that its partial
    sums are counted as D=12 writes them."""
    from nanochat.connections.backends import fused
    real = fused.mix_splits
    fused.mix_splits = lambda N, C, tiling: real(D12["tokens"], C, tiling)
    try:
        yield
    finally:
        fused.mix_splits = real


class OpCosts:
    """Bytes of each custom-op call at D12's token count, measured once per distinct call
    (op, argument shapes and values) at COUNT_TOKENS and extended along the tokens."""

    def __init__(self):
        self.cache = {}
        self.issued = 0  # loads issued by the Triton kernels of the calls priced so far
        self.kernels = {}  # kernel_key -> distinct bytes of that kernel's launches so far
        self.reread = 0  # Count.reread of the calls priced so far

    def __call__(self, node):
        key = _op_key(node)
        if key not in self.cache:
            from torch._library.custom_ops import OPDEFS
            fn = OPDEFS[node.target.name()]._init_fn
            points = []
            for tokens in COUNT_TOKENS:
                args, kwargs = _real_args(node, tokens)
                with counting(tokens) as count, weight_grad_split_at_d12():
                    fn(*args, **kwargs)
                points.append((count.triton + count.torch, count.issued, count.reread, count.kernels))
            (b1, i1, r1, k1), (b2, i2, r2, k2) = points
            t1, t2 = COUNT_TOKENS
            at = lambda v1, v2: v1 + (v2 - v1) * (D12["tokens"] - t1) / (t2 - t1)  # noqa: E731
            self.cache[key] = (at(b1, b2), at(i1, i2), at(r1, r2),
                               {k: at(k1.get(k, 0), k2.get(k, 0)) for k in {*k1, *k2}})
        total, issued, reread, kernels = self.cache[key]
        self.issued += issued
        self.reread += reread
        for k, moved in kernels.items():
            self.kernels[k] = self.kernels.get(k, 0) + moved
        return total


def branch_weight_nodes(gm):
    """The branch weight and what is computed from it alone (its bf16 cast, its transpose),
    in either graph: the nodes of shape C x C (no other tensor of the trunk has it)."""
    C = D12["C"]
    return {n for n in gm.graph.nodes
            if isinstance(v := n.meta.get("val"), torch.Tensor) and tuple(v.shape) == (C, C)}


def connection_bytes(fields, kernels):
    """{"fw", "bw", "issued", "reread", "kernels"}: bytes per token and sub-layer of the D=12
    trunk (see the module docstring), forward and backward, the loads the Triton kernels issue
    in both, the loads by which their programs read their own per-token data again (Count.reread),
    and the distinct bytes per Triton kernel ("name|what": kernel_key), part of fw + bw."""
    fw, bw = trace(fields, kernels)
    costs = OpCosts()
    per = D12["tokens"] * 2 * D12["n_layer"]
    out = {"fw": graph_bytes(fw, branch_weight_nodes(fw), costs) / per}
    out["bw"] = graph_bytes(bw, branch_weight_nodes(bw), costs) / per
    out["issued"] = costs.issued / per
    out["reread"] = costs.reread / per
    out["kernels"] = {"|".join(k): v / per for k, v in sorted(costs.kernels.items())}
    return out


def bandwidth(device_name):
    """DRAM bandwidth in bytes/s of the GPU a device's name names (nanochat/gpus.py's data sheet
    peaks, the same the bytes-in-flight estimate holds kernels to), or None."""
    gpu = gpus.lookup(device_name)
    return gpu.bandwidth if gpu else None


def allowed_bandwidths(record, workload, device_name):
    """{"name|what": bytes/s} that each compiled kernel's bytes in flight allow on the GPU named
    `device_name` (nanochat/planning/in_flight.py), from `record` (measurements.kernels): the kernels `workload`
    launches (kernel_aot's labels: "kromhc", "kromhc split", ...), and after them any other
    kernel of the same name and seam, at its least where several were compiled."""
    gpu = gpus.lookup(device_name)
    out = {}
    for own in (True, False):
        found = {}
        for k in record if gpu else ():
            key = f"{k['name']}|{k['what']}"
            if (workload in k["workloads"]) == own and key not in out and gpu.name in k["allows_bytes_per_s"]:
                found[key] = min(found.get(key, math.inf), k["allows_bytes_per_s"][gpu.name])
        out.update(found)
    return out


def in_flight_extra(kernel_bytes, allowed, device_bandwidth):
    """(bytes, unpriced): what moving each kernel's `kernel_bytes` at the bandwidth its bytes in
    flight allow (`allowed`, at most the GPU's) adds, as bytes at the GPU's bandwidth, and the
    kernels `allowed` lacks (priced at the GPU's bandwidth)."""
    extra = sum(b * (device_bandwidth / min(allowed[k], device_bandwidth) - 1)
                for k, b in kernel_bytes.items() if k in allowed)
    return extra, sorted(k for k in kernel_bytes if k not in allowed)


def predicted_ratio(extra_bytes, step_ms, device_bandwidth):
    """Step time over the residual baseline's when the connection adds `extra_bytes` per
    token and sub-layer at D=12, moved at BANDWIDTH_USE of the GPU's bandwidth."""
    seconds = extra_bytes * D12["tokens"] * 2 * D12["n_layer"] / (BANDWIDTH_USE * device_bandwidth)
    return 1 + 1e3 * seconds / step_ms


def depth_ratio(ratio_12, depth, vocab_size=32768, sequence_len=2048):
    """The step ratio over residual's at `depth` (a prediction) from the one at D=12: what the
    connection adds is stream traffic, bytes per token over 2 x depth sub-layers of C channels
    (the same streams, wider), and residual's step is its FLOPs per token (a constant MFU,
    which its matmuls, growing as C^2, make truer with depth). So the extra scales with
    depth x C over residual's FLOPs."""
    from nanochat.gpt import GPT, model_config_from_depth

    def size(d):
        config = model_config_from_depth(d, vocab_size, sequence_len)
        with torch.device("meta"):
            flops = GPT(config).estimate_flops()
        return 2 * d * config.n_embd, flops

    (bytes_12, flops_12), (bytes_d, flops_d) = size(D12["n_layer"]), size(depth)
    return 1 + (ratio_12 - 1) * (bytes_d / bytes_12) / (flops_d / flops_12)
