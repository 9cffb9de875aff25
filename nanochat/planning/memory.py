"""Peak memory per rank of a training step, before the run: will a run fit, and which device
batch fits.

An estimate (`estimate`) is the sum, per rank, of
- parameters, gradients and optimizer state, the state as DistMuonAdamW shards it at the world
  size (nanochat/optim.py: AdamW moments of sharded params divided by the world size, of the
  replicated and small ones whole; Muon buffers for the ceil(K/W) matrices a rank owns);
- one micro-step's forward and backward, traced on fake tensors (FakeTensorMode: shapes and
  dtypes, no memory, a few seconds at D=12, batch 32): eagerly, under torch's own
  `MemTracker`, which follows every tensor the autograd engine keeps and frees (the saved
  activations, the head's logits, the gradients as they appear); compiled, by AOTAutograd's
  min-cut partition with Inductor's decompositions (what torch.compile keeps for the backward),
  then a walk over the forward and backward graphs counting the buffers live at each node;
- gradient accumulation: after the first micro-step the gradients stay live through the others;
  the optimizer step, after the activations are freed, holds the gradients and a stacked copy;
- a margin: `MARGIN_FRACTION` of the peak for the caching allocator (fragmentation; base_train
  sets expandable_segments) and `MARGIN_GIB` outside it (CUDA context, NCCL buffers, cuBLAS
  workspaces), which `torch.cuda.max_memory_allocated` does not see.

The model is traced whole, at the run's own batch and length, rather than a block at a small
size scaled by tokens: fake tensors cost no memory and their trace time does not depend on the
batch or the length (only on the number of ops), so nothing is extrapolated.

CUDA's dtypes without a GPU: the trace runs on fake CPU tensors under CPU bf16 autocast, with
CUDA's fp32 rules added to the CPU autocast key for the ops CUDA's autocast has a kernel for and
CPU's lacks (asked of the dispatcher of the torch in use: `rms_norm` is among them from torch
2.12 on, `pow`, `sum` and `softmax` on every version). Fake CUDA tensors would give the same
without emulation but need a CUDA build of torch (a +cpu build cannot take views of them); the
emulation runs on every build, so the plan reads the same on a laptop and on the node.

Attention is traced as SDPA over full-context windows: on CUDA FlexAttention (windowed layers)
and flash (full ones) both save q, k, v, the output and the log-sum-exp, which is what CPU SDPA
saves for a causal mask; an explicit window mask on CPU would instead save a T x T matrix.
Liger's kernels are traced as their plain-PyTorch references (`hc_kernels = torch`); our fused
seams as themselves (their custom ops' fake forms), since what they keep for backward is
theirs: a seam keeps X_l, y_l and a few numbers per token, and with stream checkpoints
(`hc_stream_checkpoint` K) only every K-th X (connections/backends/fused.py, `run`).
Under --fp8 the traced model is converted first (nanochat/fp8.py), so that the step keeps what a
float8 layer keeps for its backward: its input and weight in float8 (1 byte an element) and two
scales, in place of the bf16 input.

Compiled: Inductor fuses chains of pointwise ops into one kernel, so their intermediates are
never allocated, and its generated code frees a graph's inputs (the saved activations, in the
backward) after their last use. With `inductor=True` (the default, what a GPU runs) the walk
models both (`graph_peak`); with `inductor=False` it runs the graphs as backend
"aot_eager_decomp_partition" does, op by op with the inputs held to the end, which is what the
CPU check measures: the same partition, no code generation.
The estimate is a model of the allocator's peak, not a measurement: `scripts.gpu_check` prints
it beside `max_memory_allocated` on a GPU. Traces are cached on disk (`<base dir>/memory/`), by
config, batch, mode and torch version: the plan prices every run of a mode in seconds after the
first time.
"""

import contextlib
import dataclasses
import functools
import glob
import hashlib
import json
import math
import operator
import os
from dataclasses import dataclass
from unittest import mock

import torch

GIB = 2**30
# The allocator's fragmentation on top of its peak (expandable segments keep it low) and what
# lives outside it on every rank (CUDA context ~0.5 GiB, NCCL and NVLS buffers, cuBLAS workspaces).
MARGIN_FRACTION = 0.10
MARGIN_GIB = 2.0

# CUDA's autocast kernels that CPU's lacks are in three families: the lower-precision ones
# (matmuls, convolutions, RNN cells, fused attention), the promoting ones (named below), and
# the fp32 ones, which are all the rest (autocast_mode.cpp's fp32 and fp32_set_opt_dtype lists).
_LOWER_PRECISION = ("conv", "mm", "mv", "dot", "matmul", "linear", "bilinear", "einsum", "tensordot", "cell",
                    "attention", "addr", "multi_dot")
_PROMOTE = ("atan2", "cross", "addcdiv", "addcmul", "index_put", "scatter_add")


@dataclass(frozen=True)
class Estimate:
    """Bytes per rank of one training step, by part; `peak` is what max_memory_allocated would
    report, `needed` adds the margin."""
    device_batch: int
    params: int
    grads: int
    optimizer: int
    step: int  # the forward and backward's peak above the parameters (activations, logits, grads so far)
    accumulation: int  # gradients held across micro-steps (0 without accumulation)

    @property
    def peak(self):
        # The optimizer step comes after the activations are freed: then the gradients and their
        # stacked copies (Muon stacks a group's gradients; DistMuonAdamW reduce-scatters the stack).
        return self.params + self.optimizer + max(self.step + self.accumulation, 2 * self.grads)

    @property
    def needed(self):
        return math.ceil(self.peak * (1 + MARGIN_FRACTION) + MARGIN_GIB * GIB)

    def describe(self):
        g = lambda b: f"{b / GIB:.1f}"  # noqa: E731
        return (f"{g(self.peak)} GiB peak (params {g(self.params)}, optimizer {g(self.optimizer)}, step "
                f"{g(self.step + self.accumulation)}) + margin = {g(self.needed)} GiB")


# ----------------------------------------------------------------------------- CUDA's dtype rules

def cuda_fp32_ops():
    """The aten ops CUDA autocast runs in fp32 and CPU autocast leaves alone, on this torch."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    names = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")]
    return sorted(n for n in names if has(n, "AutocastCUDA") and not has(n, "AutocastCPU")
                  and not any(k in n.split("::")[1].split(".")[0] for k in _LOWER_PRECISION + _PROMOTE))


def _fp32_kernel(op):
    """CUDA's fp32 rule for one op, as a CPU autocast kernel: ops that take a dtype get dtype
    fp32 when none is given (fp32_set_opt_dtype), the others have their floating inputs cast."""
    names = [a.name for a in op._schema.arguments]
    at = names.index("dtype") if "dtype" in names else None
    excluded = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    def to_fp32(x):
        return x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            if at is None:
                return op(*[to_fp32(a) for a in args], **{k: to_fp32(v) for k, v in kwargs.items()})
            given = args[at] if len(args) > at else kwargs.get("dtype")
            if given is None and args[0].dtype in (torch.bfloat16, torch.float16):
                if len(args) > at:
                    args = (*args[:at], torch.float32, *args[at + 1:])
                else:
                    kwargs = {**kwargs, "dtype": torch.float32}
            return op(*args, **kwargs)
    return kernel


class cuda_autocast_rules:
    """Within: CPU autocast also applies CUDA's fp32 rules (`cuda_fp32_ops`). A torch.library
    registration on the AutocastCPU key, the level where CUDA applies its own, so that the
    autograd engine saves the fp32 copies CUDA's would."""

    def __enter__(self):
        self.lib = torch.library.Library("aten", "IMPL")
        for name in cuda_fp32_ops():
            base, _, overload = name.split("::")[1].partition(".")
            op = getattr(getattr(torch.ops.aten, base), overload or "default")
            self.lib.impl(name.split("::")[1], _fp32_kernel(op), "AutocastCPU")
        return self

    def __exit__(self, *exc):
        self.lib._destroy()


class _CudaRMSNorm(torch.autograd.Function):
    """rms_norm saving for backward what CUDA's fused kernel saves: the input in its own dtype
    and the fp32 inverse RMS (and the weight, a parameter). The CPU runs the composite form
    instead, which keeps an fp32 copy of the input (twice a bf16 input's bytes) and would
    overstate an eager step's memory."""

    @staticmethod
    def forward(ctx, x, shape, weight=None, eps=None):
        assert len(shape) == 1, "the model's norms are over the last dim"
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        eps = torch.finfo(x.dtype).eps if eps is None else eps
        rstd = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        y = xf * rstd
        return (y if weight is None else y * weight).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        g, y = grad.to(rstd.dtype), x.to(rstd.dtype) * rstd
        gw = g if weight is None else g * weight
        dx = (rstd * (gw - y * (gw * y).mean(-1, keepdim=True))).to(x.dtype)
        dw = None if weight is None else (g * y).flatten(0, -2).sum(0).to(weight.dtype)
        return dx, None, dw, None


def _cuda_rms_norm(input, normalized_shape, weight=None, eps=None):
    """F.rms_norm's signature (keywords included) over _CudaRMSNorm."""
    return _CudaRMSNorm.apply(input, normalized_shape, weight, eps)


@contextlib.contextmanager
def cuda_rules(compile):
    """What a step on CUDA does that one on this CPU does not: CUDA autocast's fp32 rules
    (`cuda_autocast_rules`), and eagerly the saved tensors of its fused rms_norm. (Compiled,
    both devices run Inductor's decomposition of rms_norm, which the partition traces.)"""
    import torch.nn.functional as F
    norm = contextlib.nullcontext() if compile else mock.patch.object(F, "rms_norm", _cuda_rms_norm)
    with cuda_autocast_rules(), norm:
        yield


# ----------------------------------------------------------------------------- tracing

def traced_config(config):
    """The config as traced: full-context SDPA, the fused seams where the run trains on them and
    the plain-PyTorch stream ops elsewhere (see the module docstring), the rest unchanged."""
    fused = traces_fused(config)
    return dataclasses.replace(config, window_pattern="L", attention="sdpa", hc_kernels="fused" if fused else "torch",
                               hc_stream_checkpoint=config.hc_stream_checkpoint if fused else 1)


def traces_fused(config):
    """Whether a run trains on the fused seams (hc_kernels fused, a wiring they run, n > 1)."""
    from nanochat import connections
    return (config.hc_kernels == "fused" and connections.runs_on(config.hc, "fused")
            and connections.spec(config.hc).state == "streams" and config.hc_streams != 1)


@contextlib.contextmanager
def kernels_on_cpu():
    """Both kernel backends accept (fake) CPU tensors: nothing launches while tracing."""
    from nanochat.connections.backends import fused, liger
    real = fused.runs_on, liger.runs_on
    fused.runs_on = liger.runs_on = lambda device_type: True
    try:
        yield
    finally:
        fused.runs_on, liger.runs_on = real


def _fake_model(config, bf16, fp8=False):
    """The model with fake parameters, its embedding tables in bf16 as on CUDA (gpt.init_weights),
    its large matmuls in float8 under `fp8` (as base_train converts them)."""
    from nanochat.gpt import GPT
    model = GPT(traced_config(config))
    if bf16:  # not cast_embeddings: Module.to cannot swap a fake parameter's data
        for emb in (model.transformer.wte, *model.value_embeds.values()):
            emb.weight = torch.nn.Parameter(emb.weight.to(torch.bfloat16))
    if fp8:
        from nanochat.fp8 import convert
        convert(model)
    return model


def _nbytes(t):
    return t.numel() * t.element_size()


def _node_bytes(node):
    """Bytes of a graph node's value: a tensor, or a multi-output op's tuple of them."""
    val = node.meta.get("val")
    return sum(_nbytes(v) for v in (val if isinstance(val, (list, tuple)) else [val]) if isinstance(v, torch.Tensor))


def tracked_peak(model, step):
    """Peak bytes of step() (a forward and backward of model) above the model's parameters and
    buffers, by torch's MemTracker."""
    from torch.distributed._tools.mem_tracker import MemTracker
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        step()
    peak = tracker.get_tracker_snapshot("peak")[next(model.parameters()).device]
    return peak["Total"] - sum(peak[k] for k in peak if k != "Total" and k.value in ("Parameter", "Buffer"))


def _eager_step_peak(model, idx, targets, autocast):
    def step():
        with autocast:
            loss = model(idx, targets)
        loss.backward()
    return tracked_peak(model, step)


def _is_view(node):
    target = node.target
    return (isinstance(target, torch._ops.OpOverload) and target._schema.returns
            and target._schema.returns[0].alias_info is not None)


def _fusible(node):
    """Does Inductor compute this op inside its consumers' kernels? Pointwise ops and dtype
    casts do; so does a scatter into a constant (`full`) tensor, which its
    scatter_upon_const_tensor pattern turns into a pointwise select (cross-entropy's backward)."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if target is torch.ops.aten.scatter.value:
        return node.args[0].target is torch.ops.aten.full.default
    return torch.Tag.pointwise in target.tags or target in (
        torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default, torch.ops.aten.full.default)


# The reductions by name where torch has no reduction tag (torch 2.9): those the model's graphs use.
_REDUCTIONS = {"sum", "mean", "amax", "amin", "prod", "var", "var_mean", "std", "logsumexp", "argmax", "argmin",
               "linalg_vector_norm"}


def _reduction(node):
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    tag = getattr(torch.Tag, "reduction", None)
    return tag in target.tags if tag is not None else target.overloadpacket.__name__ in _REDUCTIONS


# Ops that Inductor lowers to indirect loads (ops.indirect_indexing) inside the kernel that
# computes their input: the loss's gather of the target log-probabilities reads the fp32
# log-softmax of the logits this way, so that (B*T, V) fp32 tensor is never written (measured
# on an H200, torch 2.11, D=12 at batch 32: counting it put the compiled estimate 8 GiB, 30 %,
# above max_memory_allocated; not counting it, 0.1 % below).
_INDIRECT_LOADS = ("gather", "index", "take_along_dim")


def _indirect_load(node):
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target.overloadpacket.__name__ in _INDIRECT_LOADS


def _bases(gm):
    """{node: the node whose buffer it uses}: itself, or for a view (or an element of a view
    op's tuple: split, unbind) its base's. An element of another multi-output op's tuple is a
    buffer of its own, freed after its own last use (a fused seam's streams and its per-token
    numbers are separate allocations: backward may keep some and not others)."""
    base = {}
    for node in gm.graph.nodes:
        src = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
        alias = _is_view(node) or (node.target is operator.getitem and src is not None and _is_view(src))
        base[node] = base[src] if alias and src is not None else node
    return base


def _unread_bytes(node):
    """Bytes of a multi-output op's outputs that no element access reads (allocated, then
    freed with the op); a single output's whole size."""
    taken = {user.args[1] for user in node.users if user.target is operator.getitem}
    val = node.meta.get("val")
    if not isinstance(val, (list, tuple)):
        return _node_bytes(node)
    return sum(_nbytes(v) for i, v in enumerate(val) if isinstance(v, torch.Tensor) and i not in taken)


def written_nodes(gm, inductor=True, fusible=None):
    """The nodes of an FX graph whose values are written to memory: with `inductor`, a
    fusible op's result (`fusible`, default `_fusible`) only when the output or an op that is
    neither fusible nor a reduction nor an indirect load (a matmul, attention, a custom op)
    reads it, every other op's always (Inductor computes the rest inside its consumers'
    kernels); else every op's. Views are not buffers of their own (see _bases); placeholders
    are not included."""
    fusible = fusible or _fusible
    base = _bases(gm)
    found = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or base[node] is not node:
            continue
        if not inductor or not fusible(node):
            found.add(node)
            if not inductor or not (_reduction(node) or _indirect_load(node)):
                found.update(base[arg] for arg in node.all_input_nodes)
    found.update(base[arg] for arg in gm.graph.output_node().all_input_nodes)
    return found


def graph_peak(gm, held, inductor=True):
    """Peak bytes of the buffers an FX graph of aten ops allocates as it runs, its inputs
    holding `held` bytes (the placeholders' sizes, 0 for those counted elsewhere, e.g.
    parameters), its outputs kept to the end. Views share their base's buffer. `inductor`: as
    Inductor's code runs it, a fusible op's result (`_fusible`) being a buffer only when the
    output or an op that is neither fusible nor a reduction nor an indirect load (a matmul,
    attention) reads it (the rest is computed inside their consumers' kernels), and an input
    freed after its last use (the boxed calling convention hands the graph its inputs); else op
    by op, the inputs held to the end, as backend "aot_eager_decomp_partition" runs it. No
    torch tool models Inductor's fusion (MemTracker on the decomposed graphs counts every
    intermediate: 32 GiB of them for the head's backward at D=12, batch 32), hence this walk."""
    nodes = list(gm.graph.nodes)
    base = _bases(gm)
    materialized = written_nodes(gm, inductor)
    output = nodes[-1]
    size = {}
    for i, node in enumerate(n for n in nodes if n.op == "placeholder"):
        size[node] = held[i]
    for node in materialized:
        if node.op == "call_function":
            size[node] = _unread_bytes(node)
    last = {}
    for i, node in enumerate(nodes):
        for arg in node.all_input_nodes:
            last[base[arg]] = i
    keep = {base[a] for a in output.all_input_nodes}
    live = sum(size.get(n, 0) for n in nodes if n.op == "placeholder")
    peak = live
    for i, node in enumerate(nodes):
        if node.op == "call_function" and base[node] is node and node in size:
            live += size[node]
            peak = max(peak, live)
        for arg in {base[a] for a in node.all_input_nodes}:
            if last.get(arg) == i and arg not in keep and arg in size and (inductor or arg.op != "placeholder"):
                live -= size[arg]
    return peak


def aot_step(model):
    """(step, graphs): step(*inputs) (a GPT's: idx, targets) runs the module's forward as torch.compile
    partitions it (AOTAutograd, Inductor's decompositions, the min-cut partitioner: the parts of
    backend "aot_eager_decomp_partition"), without dynamo, so that it runs on fake tensors and
    under a dispatch mode (dynamo runs a compiled module eagerly under one); graphs["fw"] and
    graphs["bw"] are the two graphs once a step has run."""
    from functorch.compile import aot_function, make_boxed_func, min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    graphs = {}

    def functional(p, b, *inputs):
        return torch.func.functional_call(model, {**dict(zip(params, p)), **dict(zip(buffers, b))}, inputs)

    def keep(kind):
        def compiler(gm, _inputs):
            graphs[kind] = gm
            return make_boxed_func(gm)
        return compiler

    compiled = aot_function(functional, fw_compiler=keep("fw"), bw_compiler=keep("bw"),
                            partition_fn=min_cut_rematerialization_partition, decompositions=select_decomp_table())

    def step(*inputs):
        # The model's code takes its compiled branches (torch.compiler.is_compiling(): the stream
        # ops' plain forms) while AOTAutograd traces it, as under torch.compile, which sets the
        # same flag, the one is_compiling() reads.
        compiling, torch.compiler._is_compiling_flag = torch.compiler._is_compiling_flag, True
        try:
            return compiled(list(params.values()), list(buffers.values()), *inputs)
        finally:
            torch.compiler._is_compiling_flag = compiling
    return step, graphs


def _compiled_step_peak(model, idx, targets, autocast, inductor):
    """Peak bytes of forward + backward as torch.compile partitions them, parameters excluded,
    and the bytes saved for the backward."""
    step, graphs = aot_step(model)
    with autocast:
        loss = step(idx, targets)
    loss.backward()
    fw, bw = graphs["fw"], graphs["bw"]
    n_static = len(dict(model.named_parameters())) + len(dict(model.named_buffers()))
    fw_inputs = [n for n in fw.graph.nodes if n.op == "placeholder"]
    fw_held = [0] * n_static + [_nbytes(n.meta["val"]) for n in fw_inputs[n_static:]]
    # The forward's outputs: the loss, then what the backward reads. Parameters and their views
    # (a transposed weight) are counted as parameters, views of one buffer once.
    saved = fw.graph.output_node().args[0][1:]
    base = _bases(fw)
    counted = set(fw_inputs[:n_static])
    bw_held = []
    for node in saved:
        val = node.meta.get("val")
        fresh = isinstance(val, torch.Tensor) and base[node] not in counted
        bw_held.append(_node_bytes(base[node]) if fresh else 0)
        counted.add(base[node])
    bw_inputs = [n for n in bw.graph.nodes if n.op == "placeholder"]
    bw_held += [_nbytes(n.meta["val"]) if isinstance(n.meta.get("val"), torch.Tensor) else 0
                for n in bw_inputs[len(bw_held):]]
    return max(graph_peak(fw, fw_held, inductor), graph_peak(bw, bw_held, inductor)), sum(bw_held[:len(saved)])


def step_peak(config, device_batch, compile=True, cuda=True, inductor=True, fp8=False):
    """Peak bytes of one micro-step's forward and backward above the parameters (activations,
    logits, gradients), traced on fake tensors. `cuda`: bf16 autocast with CUDA's dtype rules
    and bf16 embeddings, as base_train on a GPU; else fp32, as on the CPU. `fp8`: --fp8's layers."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    rules = cuda_rules(compile) if cuda else contextlib.nullcontext()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    with FakeTensorMode(), rules, kernels_on_cpu():
        model = _fake_model(config, bf16=cuda, fp8=fp8)
        shape = (device_batch, config.sequence_len)
        idx = torch.randint(0, config.vocab_size, shape)
        targets = torch.randint(0, config.vocab_size, shape)
        if compile:
            return _compiled_step_peak(model, idx, targets, autocast, inductor)[0]
        return _eager_step_peak(model, idx, targets, autocast)


# ----------------------------------------------------------------------------- static parts

def static_bytes(config, world_size, cuda=True):
    """(params, grads, optimizer state) bytes per rank, from the model's optimizer groups
    (gpt.param_groups) and DistMuonAdamW's sharding rules."""
    from nanochat.gpt import GPT
    from nanochat.optim import _sharded
    with torch.device("meta"):
        model = GPT(config)
    if cuda:
        model.cast_embeddings(torch.bfloat16)
    params = sum(_nbytes(p) for p in model.parameters())
    state = 0
    for group in model.param_groups():
        group.setdefault("replicated", False)
        if group["kind"] == "adamw":
            for p in group["params"]:
                whole = world_size == 1 or not _sharded(p, group, world_size)
                state += 2 * _nbytes(p) // (1 if whole else world_size)
        else:
            p = group["params"][0]
            owned = -(-len(group["params"]) // world_size)
            rows, cols = p.shape
            state += owned * (_nbytes(p) + max(rows, cols) * p.element_size())
    return params, params, state


# ----------------------------------------------------------------------------- the estimate

@functools.cache
def code_fingerprint():
    """A digest of the code a trace depends on (the model, its connections, its float8 layers, this
    module): an estimate that an older version of them cached is not read back after an update."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # nanochat/
    digest = hashlib.sha256()
    for path in [os.path.join(root, "gpt.py"), os.path.join(root, "fp8.py"), os.path.abspath(__file__),
                 *sorted(glob.glob(os.path.join(root, "connections", "**", "*.py"), recursive=True))]:
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:16]


def _cache_path(key):
    from nanochat.common import base_dir
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return os.path.join(base_dir(), "memory", f"{digest}.json")


def cached_step_peak(config, device_batch, compile=True, cuda=True, inductor=True, fp8=False):
    """step_peak, read from or written to the disk cache."""
    key = {"config": dataclasses.asdict(traced_config(config)), "batch": device_batch, "compile": compile,
           "cuda": cuda, "inductor": inductor, "fp8": fp8, "torch": torch.__version__, "code": code_fingerprint()}
    path = _cache_path(key)
    try:
        with open(path) as f:
            return json.load(f)["step"]
    except (OSError, ValueError, KeyError):
        pass
    value = step_peak(config, device_batch, compile, cuda, inductor, fp8)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"key": key, "step": value}, f)
    os.replace(tmp, path)
    return value


def estimate(config, device_batch, world_size=1, accum=1, compile=True, cuda=True, inductor=True, fp8=False):
    """The Estimate of one rank's peak for a run: its GPTConfig, device batch, world size,
    gradient accumulation steps, compile on or off, on a GPU (`cuda`) or the CPU, --fp8 or not
    (the parameters and optimizer state are the same: float8 copies live within a step)."""
    params, grads, optimizer = static_bytes(config, world_size, cuda)
    step = cached_step_peak(config, device_batch, compile, cuda, inductor, fp8)
    return Estimate(device_batch, params, grads, optimizer, step, grads if accum > 1 else 0)


def fitting_batch(config, max_batch, memory_bytes, accum_for, world_size=1, compile=True, allowed=None, fp8=False):
    """(batch, its estimate, the estimate at the first batch tried) for the largest of max_batch
    and the powers of two below it (those `allowed` accepts: the batches the total batch divides
    into) whose estimate fits `memory_bytes` with the margin; batch None when none fits.
    accum_for(batch): the gradient accumulation steps at that batch; fp8: --fp8."""
    candidates = [max_batch] + [2**k for k in range(int(math.log2(max_batch)), -1, -1) if 2**k < max_batch]
    candidates = [b for b in candidates if allowed is None or allowed(b)] or [max_batch]
    first = est = None
    for batch in candidates:
        est = estimate(config, batch, world_size, accum_for(batch), compile, fp8=fp8)
        first = first or est
        if est.needed <= memory_bytes:
            return batch, est, first
    return None, est, first
