"""`hc_kernels = fused`: the HC family's stream work in Triton kernels of our own, fused across
the boundary between two sub-layers (kernels in fused_kernels.py).

Why across the boundary. A connection layer adds under 1 % FLOPs and moves the n*C stream
several times; its cost is bytes. Layer by layer, the post/res mix of sub-layer l writes
X_{l+1}, and the projection and the pre mix of sub-layer l+1 read it again, twice. Here one
kernel, a *seam*, takes X_l and the sub-layer's output y_l and computes

    X_{l+1} = H_res X_l + H_post^T y_l          (written once: the next seam reads it)
    x' W, mean(x^2) of X_{l+1}                  (the next layer's projection, one tensor-core
                                                 product per stream, the norm weight folded in)
    H_pre, H_post, H_res of layer l+1           (fp32, on chip: res_maps.py's kinds)
    u_{l+1} = norm(H_pre X_{l+1})               (the next sub-layer's input, through its RMSNorm)

so the streams are read once and written once per sub-layer (the pre mix reads the tile a
second time, just after the first, from cache; with delayed pre-weights, whose H_pre is known
before X_{l+1} exists, in the same pass). The sub-layer's input norm is the seam's (the frame
hands the kernels the raw sub-layers: StreamConnections.norms_sublayer_inputs), so no
C-wide un-normed input is written or kept. Its backward reads the incoming stream gradient
once and writes one stream gradient in the stream dtype, with every use of X_{l+1} (the next
layer's mix, the pre mix and its norm, the projection) summed on chip; it recomputes X_{l+1}
from X_l and y_l, and the projection and the coefficients from X_{l+1}, rather than keeping
them: a seam keeps X_l, y_l and n projected pre-weights per token. The gradient of W reduces
over tokens in deterministic partial sums (blocks of W x token chunks, no atomics): two
backward passes are bitwise equal.

The frame owns the seams: `run` replaces the layer-by-layer loop of StreamConnections, with
the entry (X_0 = expand(x0) given, layer 0's coefficients and read) and the exit (the last
post mix folded straight into the reduce: the sum, the carried pre-weights, or the learned
head, whose projection is one more seam target) as seams too. A layer still declares its
coefficients in one place: H_pre and H_post are the family's sigmoids, H_res its ResMap
(res_maps.py). A map the kernels know is computed on chip (go-mHC's Cayley transform while
m = n s <= 8); any other runs in PyTorch between two kernels: the seam writes X_{l+1} and its
projection, PyTorch computes the coefficients, and a second seam reads X_{l+1} for the pre
mix, one more read of the streams forward, and its stream gradient is summed by autograd
backward.

Precision: streams in the compute dtype, rounded once per value; coefficients, the
projection and every accumulation in fp32; the projection's products take TF32 where
PyTorch's fp32 matmuls do (torch.backends.cuda.matmul.allow_tf32), H_res's convex
combinations never (exact double stochasticity). `hc_recompute` changes nothing here: the
coefficients are always recomputed in backward.

Two designs (`hc_seam`, docs/kernels.md): "onepass", the above in one kernel a seam; "split",
three kernels forward, split where the reduction is (the post/res mix, X_{l+1} and its
projection's partial sums over channel splits; then their sum and the coefficients; then the
read of X_{l+1} from memory, whole rows in one pass) and two backward (the reductions over the
channels; then a streaming pass for the stream gradients), each with a tiling of its own
(SPLIT_TILING), the same function. And stream checkpoints (`hc_stream_checkpoint` K, `run`):
backward keeps every K-th stream and recomputes the others.

Every seam is one torch.library custom op forward (nanochat::hc_seam) and one backward, so
torch.compile sees one node each and compiles the sub-layers between them. As Liger's
kernels (liger.py), only training reaches them (ops.uses_fused); with TRITON_INTERPRET=1 set
before Triton is imported they run on CPU tensors, which is how the tests check them.
Which wirings: every HC-family variant (hc, hc_identity, mhc, mhc_lite, kromhc, cmhc, go_mhc),
any n, current and delayed pre-weights, LSS, the learned head, with or without the norm
weight, one alpha per factor. Not frac (m fractions of one state with per-fraction norms and
an m x m read: not n streams with per-stream weights) nor gated (its read gate is per
channel, nC numbers per token from a rank-r bottleneck, not k numbers): their work is not
this kernel's.
"""

import ast
import dataclasses
import functools
import importlib
import importlib.util
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from nanochat.connections.backends import triton_device
from nanochat.connections.backends.custom_ops import custom_op
from nanochat.connections.res_maps import cayley_pad, kernel_np, next_power_of_two

INSTALL_HINT = "pip install -e '.[kernels]'"
AVAILABLE = importlib.util.find_spec("triton") is not None
# The tiling, from an H200 (docs/gpu_measured.md, scripts/bench_seams.py). A program walks the
# channels in chunks, each a step of dependent loads, tensor-core products and mixes: its time
# is chunks x one step's latency. 16 tokens over 8 warps left most warps idle in the products
# (a product takes 16 rows per warp) and the D=12 KromHC step at 4.3x residual's; 64 tokens
# over 4 warps took it to 1.6x, and 32 over 4 timed within 4 % of that in the seams' sweep
# without the backward spills 64 costs (the AOT check, docs/kernels.md).
BLOCK_T = 32  # tokens per program (backward_tiling: fewer for the widest H_res maps)
NUM_WARPS = 4
# Let ptxas give a seam kernel every register it can (255) rather than spill to stay at an
# occupancy step (it capped some at 128 and spilled).
MAX_REGISTERS = 255
SOURCES = ("given", "post")
READS = ("none", "given", "projected")
COEFS = ("none", "projection", "gates", "head")
RES_KINDS = ("identity", "free", "sinkhorn", "permutations", "cayley")
# The weight gradient's programs: blocks of W's rows times token chunks, at least two waves
# of an H100's 132 SMs when the tokens allow.
WEIGHT_GRAD_PROGRAMS = 2 * 2 * 132
WEIGHT_GRAD_BLOCK_TT = 32


def check(n=None):
    """ValueError unless the fused kernels can be used here (config time)."""
    if not AVAILABLE:
        raise ValueError(f"hc_kernels='fused' needs Triton, which is not installed: {INSTALL_HINT} "
                         "(or use hc_kernels='torch')")


def check_design(cfg):
    """hc_seam (config time): one of DESIGNS, or "auto" (backends/auto.py decides it at the start
    of a run; a model built with it unresolved runs the one-pass design)."""
    if cfg.hc_seam not in (*DESIGNS, "auto"):
        raise ValueError(f"unknown hc_seam={cfg.hc_seam!r}; choose one of {', '.join(DESIGNS)} or auto")


def check_stream_checkpoint(cfg):
    """hc_stream_checkpoint (config time): a positive K, for the fused seams only, which keep or
    recompute the streams (the other backends keep every layer's, as autograd does)."""
    K = cfg.hc_stream_checkpoint
    if isinstance(K, bool) or not isinstance(K, int) or K < 1:
        raise ValueError(f"hc_stream_checkpoint={K!r} must be a positive integer (1 keeps every stream)")
    if K > 1 and cfg.hc_kernels not in ("fused", "auto"):
        raise ValueError(f"hc_stream_checkpoint={K} recomputes the streams between the fused seams: it needs "
                         f"hc_kernels='fused' (or 'auto'), not {cfg.hc_kernels!r}; or drop it")


runs_on = triton_device.runs_on


def check_device(X):
    triton_device.check(X, "fused", runs_on)


@functools.cache
def kernels():
    # imported on first use: importing Triton takes seconds, and an exported model (which
    # never trains) must not need it
    return importlib.import_module("nanochat.connections.backends.fused_kernels")


# ----- what one seam computes -----

@dataclasses.dataclass(frozen=True)
class Seam:
    """The static shape of one seam (fused_kernels' constexpr switches, by name):
    source     "given": X_next is the input; "post": X_next = h_res X + h_post^T y
    res_in     (post) whether h_res is a matrix (False: the identity)
    read       "none", "given" (read weights passed in), "projected" (from the coefficients)
    coef       "none", "projection" (x'W only, coefficients off chip), "gates" (an HC
               layer's), "head" (the learned head's)
    res_kind   (gates) the ResMap kind; sk_iters, groups, m_pad: Sinkhorn rounds, mixture
               groups, the side of go-mHC's padded tiles
    k, a_cols  the projection's columns (W is n C x k) and how many of them block A holds
    ka, kb     the register blocks' widths: A (pre | post, the head's, or every column off
               chip), B (the res logits)
    write_x    store X_next; emit_carry: the projected pre-weights go to the next seam
               (delayed pre-weights) rather than being read now
    norm       the read is the sub-layer's input: write it through the model's RMSNorm (eps_u
               its epsilon)
    recompute  stream checkpoints (`run`): 0 keeps X for backward; r > 0 keeps instead the last
               kept stream and the r post mixes since (chain_res: whether they mix with an
               H_res), from which backward recomputes X
    keep_next  keep X_next for backward (the weight gradient reads it); False: the backward
               kernel writes it again from X and y as it recomputes it
    design     "onepass" or "split" (DESIGNS; only a seam whose coefficients are on chip splits)"""
    n: int
    source: str = "given"
    res_in: bool = True
    read: str = "none"
    coef: str = "none"
    res_kind: str = "identity"
    sk_iters: int = 0
    groups: int = 0
    m_pad: int = 4
    k: int = 0
    a_cols: int = 0
    ka: int = 16
    kb: int = 0
    read_eps: float = 0.0
    write_x: bool = False
    emit_carry: bool = False
    norm: bool = False
    eps: float = 0.0
    eps_u: float = 0.0
    recompute: int = 0
    chain_res: bool = True
    keep_next: bool = True
    design: str = "onepass"

    def encode(self):
        return ";".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))

    @property
    def projects(self):
        return self.coef != "none"

    @property
    def kbx(self):
        """Block B's width in registers: at least a tensor-core product's 16 columns."""
        return self.kb or 16

    @property
    def on_chip(self):
        return self.coef in ("gates", "head")

    def constexprs(self):
        """The kernels' compile-time arguments."""
        return dict(NS=self.n, NP=kernel_np(self.n), SOURCE=SOURCES.index(self.source), RES_IN=int(self.res_in),
                    READ=READS.index(self.read), COEF=COEFS.index(self.coef), RES_KIND=RES_KINDS.index(self.res_kind),
                    SK_ITERS=self.sk_iters, NUM_GROUPS=self.groups, MP=self.m_pad, K=self.k, A_COLS=self.a_cols,
                    KA=self.ka, KB=self.kb, KBX=self.kbx, READ_EPS=self.read_eps, NORM=self.norm,
                    BLOCK_T=BLOCK_T, BLOCK_C=block_c(self.n))

    def forward_constexprs(self):
        return dict(self.constexprs(), WRITE_X=self.write_x)

    def backward_constexprs(self):
        # the Sinkhorn backward keeps every round's potentials: a power-of-two register tile
        c = self.constexprs()
        return dict(c, SK_HIST=next_power_of_two(max(1, self.sk_iters)), BLOCK_C=block_c(self.n, backward=True),
                    BLOCK_T=backward_tiling(c["KBX"])[0], WRITE_XN=self.rewrites_next)

    @property
    def splits(self):
        """Whether this seam runs as the split design's kernels: three forward, two backward."""
        return self.design == "split" and self.on_chip

    @property
    def proj_width(self):
        """The split design's projection hand-over per token: both register blocks and the sum of squares."""
        return self.ka + self.kbx + 1

    @property
    def needs_next(self):
        """Whether backward reads X_next from memory: the weight gradient of a post seam's projection."""
        return self.projects and self.source == "post"

    @property
    def rewrites_next(self):
        """Whether the backward kernel writes X_next again (it was not kept)."""
        return self.needs_next and not self.keep_next


def describe(constexprs):
    """A seam kernel's switches in a few words, e.g. "post > gates sinkhorn > projected read"."""
    c = constexprs
    source = SOURCES[c["SOURCE"]] + ("" if c["SOURCE"] == 0 or c["RES_IN"] else " (H_res = I)")
    coef = COEFS[c["COEF"]] + (f" {RES_KINDS[c['RES_KIND']]}" if c["COEF"] == 2 else "")
    read = READS[c["READ"]] + " read" + (", normed" if c["NORM"] else "")
    kernels = ("reduce", "stream") if "HAS_GXO" in c else ("mix", "gates", "read")  # backward's, forward's
    phase = f", split: {kernels[c['PHASE'] - 1]}" if c.get("PHASE", 0) else ""
    rewrite = ", X_next again" if c.get("WRITE_XN") else ""
    tma = ", TMA" if c.get("TMA") else ""
    return " > ".join((source, coef, read)) + phase + rewrite + tma


@functools.cache
def decode(text):
    values = {}
    for item in text.split(";"):
        name, _, raw = item.partition("=")
        values[name] = ast.literal_eval(raw)
    return Seam(**values)


# Channels per chunk times the padded stream count, forward and backward: with BLOCK_T, tiles
# whose registers fit without spilling at every n (the AOT check, docs/kernels.md).
CHUNK_FORWARD = 128
CHUNK_BACKWARD = 64


def block_c(n, backward=False):
    """Channels per chunk: the backward holds more per channel."""
    return channels_per_chunk(CHUNK_BACKWARD if backward else CHUNK_FORWARD, n)


def channels_per_chunk(chunk, n):
    """Channels per chunk of a tiling's `chunk` (channels times the padded stream count), at
    least the 16 of a tensor-core product."""
    return max(16, chunk // kernel_np(n))


def backward_tiling(kbx):
    """(tokens, warps) of a backward program. The H_res map's gradient holds a tokens x KBX tile
    of res logits and its products with the map's tables: past 16 logit columns (mhc-lite's n!
    permutations, go-mHC's generator: 32) each further 16 halve the tokens and double the warps,
    which keeps the registers per thread under a spill (scripts.kernel_check: they spill at
    BLOCK_T tokens, and at half of it over NUM_WARPS)."""
    wide = max(1, kbx // 16)
    return max(16, BLOCK_T // wide), NUM_WARPS * wide


def tiling():
    """The seam kernels' tiling: (tokens per program, warps, forward chunk, backward chunk)."""
    return BLOCK_T, NUM_WARPS, CHUNK_FORWARD, CHUNK_BACKWARD


def set_tiling(block_t, num_warps, chunk_forward, chunk_backward):
    """Another tiling for the kernels compiled from now on (a benchmark's sweep)."""
    global BLOCK_T, NUM_WARPS, CHUNK_FORWARD, CHUNK_BACKWARD
    BLOCK_T, NUM_WARPS, CHUNK_FORWARD, CHUNK_BACKWARD = block_t, num_warps, chunk_forward, chunk_backward


DESIGNS = ("onepass", "split")

# TMA (sm_90's tensor memory accelerator): the kernels' channel loops with the projection's
# products load the streams X and y as bulk copies of (tokens x one stream x channels) boxes
# through tensor descriptors made on chip, one thread issuing each, where masked loads and
# cp.async take an address per element from every thread. Built and held bitwise to the masked
# loads (tests/test_fused.py); off until a GPU has timed it against them (`scripts.bench_seams`
# sweeps the kernels' own tiling both ways): on sm_90 it changes each kernel's registers, and
# some lose a program per SM (docs/kernels.md, "TMA").
TMA = False


def set_tma(value):
    """Whether the kernels launched from now on load through TMA where a GPU has it."""
    global TMA
    TMA = bool(value)


def uses_tma(*streams):
    """Whether a seam launch loads `streams` through tensor descriptors: where TMA is on, on a
    GPU that has it (or in Triton's interpreter, the CPU's tests), and every one meets TMA's
    alignment: a 16-byte base and rows of a multiple of 16 bytes (others keep the masked loads)."""
    if not TMA or not all(t.data_ptr() % 16 == 0 and t.shape[-1] * t.element_size() % 16 == 0 for t in streams):
        return False
    t = streams[0]
    return not t.is_cuda or (torch.version.hip is None and has_tma(torch.cuda.get_device_capability(t.device)[0])
                             and _tma_scratch_ready())


def tma_kernel(seam, backward, phase):
    """Whether a seam kernel (phase: 0 the one-pass design's, else the split design's) has a
    channel loop with the projection's products, the only ones that load through TMA: with a
    pipelined loop's copies kept iterations ahead, where a loop without products would wait on
    each box before issuing the next. The split design's gates and read kernels have no
    channel loop; its backward reduce kernel's loop has no products (the hand-over replaces the
    projection)."""
    return seam.projects and phase in ((0, 2) if backward else (0, 1))


def has_tma(major):
    """Whether NVIDIA GPUs of compute capability `major`.x have TMA (Hopper, 9.0, and later)."""
    return major >= 9


@functools.cache
def _tma_scratch_ready():
    """A descriptor made on chip is written to global scratch memory that Triton asks its
    allocator for at launch: ours, from PyTorch's caching allocator on the current device."""
    importlib.import_module("triton").set_allocator(
        lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    return True


class Tiling(NamedTuple):
    block_t: int  # tokens per program
    warps: int
    block_c: int  # channels per chunk


# The split design's kernels, each with a tiling of its own (tokens, warps, channels per chunk
# times the padded stream count): the forward's mix and projection with >= 64 tokens a program
# for the tensor-core products; its coefficients, and the backward's reductions, small programs
# (16 tokens, the least a tensor-core product takes: the permutation mixtures' and Cayley's
# tables are products); the backward's streaming pass as the one-pass backward's. The forward's
# read holds whole rows: its tokens are READ_ROW_ELEMENTS over the padded width.
SPLIT_TILING = {"forward mix": (64, 4, 64), "forward gates": (16, 2, 16), "backward reduce": (16, 4, 256),
                "backward stream": (32, 4, 64)}
READ_ROW_ELEMENTS, READ_WARPS = 2048, 4
# The mix kernel splits the channels (split-K: partial projections, summed in order by the
# gates kernel) until it launches at least this many programs, or every split is one chunk:
# D=12's 32 x 2048 tokens give 1024 programs of 64 tokens, about 8 per SM on 132 SMs, unsplit; a
# smaller batch or a deeper model's fewer tokens per GPU split.
MIN_MIX_PROGRAMS = 1024
MAX_MIX_SPLITS = 8  # the gates kernel adds the partial sums in an unrolled loop


class Split(NamedTuple):
    """The mix kernel's channel splits: how many, and the channels each (a multiple of the chunk)."""
    count: int
    channels: int


def mix_splits(N, C, tiling):
    """The Split of a mix kernel of `tiling` over N tokens and C channels: powers of two up to
    MIN_MIX_PROGRAMS programs, MAX_MIX_SPLITS splits, or a chunk a split."""
    tiles, chunks = triton_cdiv(N, tiling.block_t), triton_cdiv(C, tiling.block_c)
    count = 1
    while tiles * count < MIN_MIX_PROGRAMS and count * 2 <= min(chunks, MAX_MIX_SPLITS):
        count *= 2
    return Split(count, triton_cdiv(chunks, count) * tiling.block_c)


def split_phases(seam, backward, C):
    """The Tilings of the split design's kernels (forward: mix, gates and, where the seam
    reads, read; backward: reduce, stream) at C channels. The widest H_res maps (more than 16
    res logits) take more warps where their gates are computed, and in the backward's streaming
    pass (which holds their gradient's columns) half the tokens, as the one-pass backward does
    (backward_tiling)."""
    wide = max(1, seam.kbx // 16)
    if not backward:
        (mix_t, mix_w, mix_c), (gates_t, gates_w, gates_c) = SPLIT_TILING["forward mix"], SPLIT_TILING["forward gates"]
        out = [Tiling(mix_t, mix_w, channels_per_chunk(mix_c, seam.n)), Tiling(gates_t, gates_w * wide, gates_c)]
        if seam.read != "none":
            width = next_power_of_two(C)
            out.append(Tiling(max(1, READ_ROW_ELEMENTS // width), READ_WARPS, width))
        return out
    (reduce_t, reduce_w, reduce_c), (stream_t, stream_w, stream_c) = (SPLIT_TILING["backward reduce"],
                                                                      SPLIT_TILING["backward stream"])
    # the reduce kernel's wider warps keep as many bytes a program in flight
    return [Tiling(reduce_t, reduce_w * wide, channels_per_chunk(reduce_c * wide, seam.n)),
            Tiling(max(16, stream_t // wide), stream_w * wide, channels_per_chunk(stream_c, seam.n))]


def needs_int64(*tensors):
    """Whether an element offset into these tensors can pass int32's range (the kernels then
    index in int64; the fp32 per-token tensors are at most as large as the streams)."""
    return max(t.numel() for t in tensors) >= 2**31


def dot_precision(t):
    """TF32 for the projection's products where PyTorch's fp32 matmuls use it, else fp32."""
    return "tf32" if t.is_cuda and torch.backends.cuda.matmul.allow_tf32 else "ieee"


# ----- the custom ops -----

def _empty(x):
    return x.new_empty(0, dtype=torch.float32)


def _outputs(seam, x):
    """Allocated outputs of the forward: (x_next, u, h_post, h_res, pre, xw, rstd): the
    projected pre-weights `pre` on chip (carried on, or kept for backward), the projection and
    its 1 / rms off chip (the coefficients' input)."""
    N, n, C = x.shape
    f32 = dict(dtype=torch.float32)
    gates, off_chip = seam.coef == "gates", seam.coef == "projection"
    xw = (N, seam.proj_width) if seam.splits else (N, seam.k)  # split: the summed hand-over, kept
    return (torch.empty_like(x) if seam.write_x else _empty(x),
            x.new_empty(N, C) if seam.read != "none" else _empty(x),
            x.new_empty(N, n, **f32) if gates else _empty(x),
            x.new_empty(N, n, n, **f32) if gates and seam.res_kind != "identity" else _empty(x),
            x.new_empty(N, n, **f32) if seam.on_chip else _empty(x),
            x.new_empty(*xw, **f32) if off_chip or seam.splits else _empty(x),
            x.new_empty(N, **f32) if off_chip else _empty(x))


@custom_op("nanochat::hc_seam", mutates_args=())
def _seam(x: Tensor, y: Optional[Tensor], h_post: Optional[Tensor], h_res: Optional[Tensor],
          h_read: Optional[Tensor], w: Optional[Tensor], scale: Optional[Tensor], bias: Optional[Tensor],
          table: Optional[Tensor], anchor: Optional[Tensor], chain: list[Tensor],
          spec: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """One seam forward. `anchor` and `chain` (stream checkpoints, Seam.recompute) are not read
    here: they are what backward recomputes x from, kept in its place."""
    seam = decode(spec)
    # the kernels assume contiguous rows (the read weights come with their strides)
    x, y, h_post, h_res, w, scale, bias, table = map(_contiguous, (x, y, h_post, h_res, w, scale, bias, table))
    out = _outputs(seam, x)
    N, _, C = x.shape
    hread_strides = h_read.stride() if h_read is not None else (0, 0)
    common = dict(DOT_PRECISION=dot_precision(x), INT64=needs_int64(x), maxnreg=MAX_REGISTERS)
    tma = uses_tma(*(t for t in (x, y) if t is not None))
    if not seam.splits:
        kernels().seam_forward[seam_grid(N, BLOCK_T)](
            x, _or(y, x), _or(h_post, x), _or(h_res, x), _or(h_read, x), *hread_strides, _or(w, x), _or(scale, x),
            _or(bias, x), _or(table, x), *(_or(o, x) for o in out), x, x, N, seam.eps, seam.eps_u, C=C,
            num_warps=NUM_WARPS, PHASE=0, SPLITS=1, SPLIT_C=C, TMA=tma and tma_kernel(seam, False, 0), **common,
            **seam.forward_constexprs())
        return out
    # split: X_next and its projection's partial sums over channel splits; their sum and the
    # coefficients; the read of X_next
    x_next, u, h_post_out, h_res_out, pre, proj, rstd = out
    x_next = x_next if seam.write_x else torch.empty_like(x)
    mix, gates, *read = split_phases(seam, False, C)
    split = mix_splits(N, C, mix)
    part = proj if split.count == 1 else proj.new_empty(split.count, *proj.shape)
    given = dict(seam.forward_constexprs(), SPLITS=split.count, SPLIT_C=split.channels)
    kernels().seam_forward[(triton_cdiv(N, mix.block_t), split.count)](
        x, _or(y, x), _or(h_post, x), _or(h_res, x), x, 0, 0, w, x, x, x, x_next, x, x, x, x, x, x, x, part, N,
        seam.eps, seam.eps_u, C=C, num_warps=mix.warps, PHASE=1, TMA=tma and tma_kernel(seam, False, 1), **common,
        **dict(given, READ=0, WRITE_X=True, BLOCK_T=mix.block_t, BLOCK_C=mix.block_c))
    # (pre stands in for the stream pointers it does not read: a kernel launched with a stream
    # is held to a streaming kernel's bytes in flight by kernel_check)
    kernels().seam_forward[seam_grid(N, gates.block_t)](
        pre, pre, pre, pre, pre, 0, 0, w, scale, bias, _or(table, pre), pre, pre, _or(h_post_out, pre),
        _or(h_res_out, pre), pre, pre, pre, proj, part, N, seam.eps, seam.eps_u, C=C, num_warps=gates.warps, PHASE=2,
        TMA=tma and tma_kernel(seam, False, 2), **common,
        **dict(given, SOURCE=0, READ=0, WRITE_X=False, BLOCK_T=gates.block_t, BLOCK_C=gates.block_c))
    for tiling in read:  # the pre-weights given, or the ones the gates kernel kept (pre)
        kernels().seam_forward[seam_grid(N, tiling.block_t)](
            x_next, x, x, x, _or(h_read, x), *hread_strides, x, x, x, x, x, u, x, x, pre, x, x, x, x, N, seam.eps,
            seam.eps_u, C=C, num_warps=tiling.warps, PHASE=3, TMA=tma and tma_kernel(seam, False, 3), **common,
            **dict(given, SOURCE=0, COEF=0, WRITE_X=False, BLOCK_T=tiling.block_t, BLOCK_C=tiling.block_c))
    return out


@_seam.register_fake
def _(x, y, h_post, h_res, h_read, w, scale, bias, table, anchor, chain, spec):
    return _outputs(decode(spec), x)


@custom_op("nanochat::hc_seam_backward", mutates_args=())
def _seam_backward(x: Tensor, y: Optional[Tensor], h_post: Optional[Tensor], h_res: Optional[Tensor],
                   h_read: Optional[Tensor], w: Optional[Tensor], scale: Optional[Tensor], bias: Optional[Tensor],
                   table: Optional[Tensor], x_next: Tensor, pre: Tensor, xw: Tensor, rstd: Tensor,
                   g_xnext: Optional[Tensor], g_u: Optional[Tensor], g_hpost: Optional[Tensor],
                   g_hres: Optional[Tensor], g_pre: Optional[Tensor], g_xw: Optional[Tensor],
                   g_rstd: Optional[Tensor], spec: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                                                 Tensor]:
    seam = decode(spec)
    x, y, h_post, h_res, w, scale, bias, table, g_xnext, g_u, g_hpost, g_hres, g_pre, g_xw, g_rstd = map(
        _contiguous, (x, y, h_post, h_res, w, scale, bias, table, g_xnext, g_u, g_hpost, g_hres, g_pre, g_xw, g_rstd))
    grads = _grad_outputs(seam, x, y, h_read)
    gx, gy, ghp, ghr, ghread, gw, gscale, gbias = grads
    N, _, C = x.shape
    per_token = [x.new_empty(N, seam.k, dtype=torch.float32) if cond else _empty(x)
                 for cond in (seam.on_chip, seam.on_chip, seam.projects)]
    gz, gzx, gxw = per_token
    hread_strides = h_read.stride() if h_read is not None else (0, 0)
    constexprs = seam.backward_constexprs()
    if seam.rewrites_next:
        x_next = torch.empty_like(x)
    launch = functools.partial(
        kernels().seam_backward,
        x, _or(y, x), _or(h_post, x), _or(h_res, x), _or(h_read, x), *hread_strides, _or(w, x), _or(scale, x),
        _or(bias, x), _or(table, x), _or(xw, x), _or(rstd, x), _or(pre, x), _or(g_xnext, x), _or(g_u, x),
        _or(g_hpost, x), _or(g_hres, x), _or(g_pre, x), _or(g_xw, x), _or(g_rstd, x), gx, _or(gy, x), _or(ghp, x),
        _or(ghr, x), _or(ghread, x), _or(gz, x), _or(gzx, x), _or(gxw, x), _or(x_next, x))
    flags = dict(C=C, HAS_GXO=g_xnext is not None, HAS_GU=g_u is not None, HAS_GHPO=g_hpost is not None,
                 HAS_GHRO=g_hres is not None, HAS_GPRE=g_pre is not None, HAS_GEXT=g_xw is not None,
                 NEED_GHREAD=ghread.numel() > 0, DOT_PRECISION=dot_precision(x), INT64=needs_int64(x),
                 maxnreg=MAX_REGISTERS)
    tma = uses_tma(*(t for t in (x, y) if t is not None))
    if not seam.splits:
        block_t, num_warps = backward_tiling(constexprs["KBX"])
        launch.func[seam_grid(N, block_t)](*launch.args, x, x, N, seam.eps, seam.eps_u, num_warps=num_warps, PHASE=0,
                                           TMA=tma and tma_kernel(seam, True, 0), **flags, **constexprs)
    else:
        # split: the reductions over the channels (the read weights' and the norm's sums, the
        # coefficients' gradients) per token, then a streaming pass for the stream gradients
        bridge = x.new_empty(N, 3, dtype=torch.float32)
        for phase, tiling in enumerate(split_phases(seam, True, C), start=1):
            launch.func[seam_grid(N, tiling.block_t)](
                *launch.args, xw, bridge, N, seam.eps, seam.eps_u, num_warps=tiling.warps, PHASE=phase,
                TMA=tma and tma_kernel(seam, True, phase), **flags,
                **dict(constexprs, BLOCK_T=tiling.block_t, BLOCK_C=tiling.block_c))
    if seam.projects:
        gw.copy_(weight_grad(x if seam.source == "given" else x_next, gxw))
    if seam.on_chip:  # the per-token gradients of z = scale * x'W + bias, summed over tokens
        gbias.copy_(gz.sum(0))
        gscale.copy_(gzx.sum(0))
    return grads


@_seam_backward.register_fake
def _(x, y, h_post, h_res, h_read, w, scale, bias, table, x_next, pre, xw, rstd, g_xnext, g_u, g_hpost, g_hres,
      g_pre, g_xw, g_rstd, spec):
    return _grad_outputs(decode(spec), x, y, h_read)


def _grad_outputs(seam, x, y, h_read):
    """Allocated gradients (x, y, h_post, h_res, h_read, w, scale, bias); empty where the
    input is absent or needs none."""
    N, n, C = x.shape
    f32 = dict(dtype=torch.float32)
    post = seam.source == "post"
    return (torch.empty_like(x),
            torch.empty_like(y) if post else _empty(x),
            x.new_empty(N, n, **f32) if post else _empty(x),
            x.new_empty(N, n, n, **f32) if post and seam.res_in else _empty(x),
            x.new_empty(N, n, **f32) if seam.read == "given" else _empty(x),
            x.new_empty(n * C, seam.k, **f32) if seam.projects else _empty(x),
            x.new_empty(seam.k, **f32) if seam.on_chip else _empty(x),
            x.new_empty(seam.k, **f32) if seam.on_chip else _empty(x))


def _setup(ctx, inputs, output):
    x, y, h_post, h_res, h_read, w, scale, bias, table, anchor, chain, spec = inputs
    x_next, _, _, _, pre, xw, rstd = output
    seam = decode(spec)
    ctx.spec = spec
    # stream checkpoints: x, or what recomputes it (tensors other seams keep anyway); X_next
    # only where it is kept
    ctx.save_for_backward(None if seam.recompute else x, y, h_post, h_res, h_read, w, scale, bias, table,
                          x_next if seam.keep_next else None, pre, xw, rstd, anchor, *chain)


def _present(g):
    return g if g is not None and g.numel() else None


def _backward(ctx, g_xnext, g_u, g_hpost, g_hres, g_pre, g_xw, g_rstd):
    x, y, h_post, h_res, h_read, w, scale, bias, table, x_next, pre, xw, rstd, anchor, *chain = ctx.saved_tensors
    seam = decode(ctx.spec)
    if seam.splits:  # its projection output is the hand-over between its kernels, no one else's input
        g_xw = g_rstd = None
    if seam.recompute:
        x = restream(anchor, chain, seam.recompute, seam.chain_res, seam.eps, seam.n)
    if x_next is None:
        x_next = _empty(x)
    ext = (_present(g_xw), _present(g_rstd))
    if (ext[0] is None) != (ext[1] is None):  # one of the two without the other: a zero for it
        ext = tuple(torch.zeros_like(t) if g is None else g for g, t in zip(ext, (xw, rstd)))
    grads = _seam_backward(x, y, h_post, h_res, h_read, w, scale, bias, table, x_next, pre, xw, rstd,
                           *map(_present, (g_xnext, g_u, g_hpost, g_hres, g_pre)), *ext, ctx.spec)
    gx, gy, ghp, ghr, ghread, gw, gscale, gbias = grads
    opt = lambda g, t: g if t is not None and g.numel() else None  # noqa: E731
    return (gx, opt(gy, y), opt(ghp, h_post), opt(ghr, h_res), opt(ghread, h_read), opt(gw, w), opt(gscale, scale),
            opt(gbias, bias), None, None, [None] * len(chain), None)


def restream(anchor, chain, steps, res_in, eps, n):
    """A stream that was not kept, again: `steps` post mixes of the anchor, the kept stream
    before it, with chain = [y, h_post, (h_res,)] per step. Each step is the seam forward that
    first wrote it (the same kernel arithmetic, rounded the same), so the stream is bitwise
    the one the forward computed. `n` the stream count (a number, where a traced X.shape[1] may
    be symbolic)."""
    width = 3 if res_in else 2
    X = anchor
    for i in range(steps):
        y, h_post, *h_res = chain[width * i:width * (i + 1)]
        step = Seam(n, source="post", res_in=res_in, write_x=True, eps=eps)
        X = _seam(X, y, h_post, h_res[0] if h_res else None, None, None, None, None, None, None, [],
                  step.encode())[0]
    return X


def _contiguous(t):
    return None if t is None else t.contiguous()


_seam.register_autograd(_backward, setup_context=_setup)


def triton_cdiv(a, b):
    return -(-a // b)


def seam_grid(N, block_t):
    """Programs of a seam kernel for N tokens: one per block_t tokens."""
    return (triton_cdiv(N, block_t),)


def weight_grad_grid(N, D):
    """(grid, token tiles per split, BLOCK_D) of the weight gradient: about WEIGHT_GRAD_PROGRAMS
    programs when the tokens allow. The tiles per split are a power of two, a compile-time
    constant of the kernel: token counts then share a handful of compiled variants. The same
    shapes always give the same splits: the partial sums, and their order, repeat."""
    block_d = min(128, max(16, next_power_of_two(D)))
    d_blocks = triton_cdiv(D, block_d)
    target = triton_cdiv(WEIGHT_GRAD_PROGRAMS, d_blocks)
    steps = next_power_of_two(triton_cdiv(triton_cdiv(N, target), WEIGHT_GRAD_BLOCK_TT))
    return (d_blocks, triton_cdiv(N, steps * WEIGHT_GRAD_BLOCK_TT)), steps, block_d


def _or(t, default):
    return default if t is None or t.numel() == 0 else t


def weight_grad(x, g):
    """sum_t x[t]^T g[t] for x (N, n, C) in the stream dtype and g (N, K) fp32: (n*C, K) fp32,
    from deterministic partial sums over token chunks."""
    N = x.shape[0]
    D, K = x[0].numel(), g.shape[1]
    grid, steps, block_d = weight_grad_grid(N, D)
    partial = g.new_empty(grid[1], D, K)
    kernels().weight_grad[grid](x, g, partial, N, D, K=K, KP=next_power_of_two(K), STEPS=steps,
                                DOT_PRECISION=dot_precision(x), INT64=needs_int64(x, partial),
                                BLOCK_D=block_d, BLOCK_TT=WEIGHT_GRAD_BLOCK_TT)
    return partial.sum(0)


# ----- the layers' coefficients in the kernels' layout -----

class Target(NamedTuple):
    """What a seam projects for: its columns (Seam fields) and its tensors, the layer's own
    (differentiable w.r.t. its parameters): W (n C, k) with the norm weight folded in, the
    alpha of each column, the biases, and the constants of its H_res map."""
    fields: dict
    w: Tensor
    scale: Tensor
    bias: Tensor
    table: Optional[Tensor]


def _block(columns):
    return max(16, next_power_of_two(columns))


def layer_target(layer):
    """An HC layer (hc_layer.HyperConnection): block A = [pre n | post n], block B = its ResMap's
    res logits; or, for a map with no kernel form, every column in block A (off chip)."""
    n, res_map = layer.n, layer.res_map
    w, scale, bias = layer.projection_weight(), layer.column_scale(), layer.bias
    k = w.shape[1]
    if res_map.kind is None:
        return Target(dict(coef="projection", k=k, a_cols=k, ka=_block(k), kb=0), w, scale, bias, None)
    fields = dict(coef="gates", k=k, a_cols=2 * n, ka=_block(2 * n), kb=res_map.kernel_width(), res_kind=res_map.kind,
                  sk_iters=getattr(res_map, "iters", 0), groups=len(getattr(res_map, "groups", ())),
                  m_pad=cayley_pad(getattr(res_map, "m", 1)))
    return Target(fields, w, scale, bias, res_map.table())


def head_target(head):
    """DeepSeek-V4's learned head (frame.LearnedHead): sigmoid(a * x'W + b) + eps, x' without a weight."""
    n = head.n
    return Target(dict(coef="head", k=n, a_cols=n, ka=_block(n), kb=0, read_eps=head.eps), head.weight,
                  head.alpha.expand(n), head.bias, None)


# ----- the seams of the frame -----

class SeamOut(NamedTuple):
    x_next: Optional[Tensor]  # the streams written (None when only read through)
    u: Optional[Tensor]  # the next sub-layer's input (normed with `norm`), or the reduced state
    h_post: Optional[Tensor]  # the next layer's post and res weights, for the next seam
    h_res: Optional[Tensor]
    carry: Optional[Tensor]  # delayed pre-weights for the next seam


class Recipe(NamedTuple):
    """How backward gets back a stream that was not kept (stream checkpoints): the kept stream
    before it and the post mixes since, [y, h_post, (h_res,)] per step."""
    anchor: Tensor
    chain: tuple = ()
    steps: int = 0
    res_in: bool = True

    def then(self, y, post):
        """The recipe of the stream one post mix later."""
        mix = (y, post[0]) if post[1] is None else (y, *post)
        return Recipe(self.anchor, self.chain + mix, self.steps + 1, post[1] is not None)

    def fields(self):
        return dict(recompute=self.steps, chain_res=self.res_in)


def seam(X, y=None, post=(None, None), read=None, target=None, eps=0.0, write_x=False, norm=False, recipe=None,
         keep_next=True, design="onepass"):
    """One boundary: X_next (X itself when y is None, else h_res X + h_post^T y with post =
    (h_post, h_res), h_res None for the identity), then, for `target` (an HC layer, the
    learned head, or None), its coefficients and its read of X_next: with `read` None the
    read weights come from the target's projection, else `read` is them (None target) or
    the weights carried in (a layer with delayed pre-weights, which then carries its own on).
    `norm`: the read is a sub-layer's input, written through the model's RMSNorm (its epsilon
    F.rms_norm's default: that of the dtype it computes in, fp32 for bf16 streams). X (N, n,
    C); y (N, C); coefficients fp32. Stream checkpoints: `recipe` (a Recipe) recomputes X in
    backward rather than keeping it; `keep_next` False does not keep X_next either. `design`:
    DESIGNS, for a target whose coefficients are on chip."""
    n = X.shape[1]
    kept = dict(keep_next=keep_next, **(recipe.fields() if recipe is not None else {}))
    source = dict(source="given") if y is None else dict(source="post", res_in=post[1] is not None)
    norm = dict(norm=norm, eps_u=torch.finfo(torch.promote_types(X.dtype, torch.float32)).eps if norm else 0.0)
    if target is None:
        spec = Seam(n, **source, read="none" if read is None else "given", write_x=write_x, eps=eps, **norm, **kept)
        return _run(spec, X, y, post, read, None, recipe)
    t = layer_target(target) if hasattr(target, "res_map") else head_target(target)
    write_x = write_x or y is not None  # the weight gradient reads X_next
    if t.fields["coef"] == "projection":
        return _off_chip(X, y, post, read, target, t, source, eps, write_x, norm, recipe, keep_next)
    delayed = read is not None
    spec = Seam(n, **source, read="given" if delayed else "projected", write_x=write_x, emit_carry=delayed,
                eps=eps, **norm, **t.fields, **kept, design=design)
    return _run(spec, X, y, post, read, t, recipe)


def _recipe_args(recipe):
    return (None, []) if recipe is None else (recipe.anchor, list(recipe.chain))


def _run(spec, X, y, post, read, t, recipe):
    x_next, u, h_post, h_res, pre, *_ = _seam(
        X, y, *post, read, *((t.w, t.scale, t.bias, t.table) if t is not None else (None,) * 4),
        *_recipe_args(recipe), spec.encode())
    some = lambda v: v if v.numel() else None  # noqa: E731
    return SeamOut(some(x_next) if spec.write_x else None, some(u), some(h_post), some(h_res),
                   pre if spec.emit_carry else None)


def _off_chip(X, y, post, read, layer, t, source, eps, write_x, norm, recipe, keep_next):
    """A layer whose H_res has no kernel form: the projection in one seam, the coefficients
    in PyTorch (the layer's own gates), the read in a second seam over X_next (which, not
    kept, it recomputes from X's recipe and one more post mix)."""
    kept = dict(keep_next=keep_next, **(recipe.fields() if recipe is not None else {}))
    spec = Seam(X.shape[1], **source, write_x=write_x, eps=eps, **t.fields, **kept)
    x_next, _, _, _, _, xw, rstd = _seam(X, y, *post, None, t.w, None, None, None, *_recipe_args(recipe),
                                         spec.encode())
    X_next = x_next if write_x else X
    with torch.autocast(X.device.type, enabled=False):  # coefficients in fp32, as everywhere
        h_pre, h_post, h_res = layer.gates(xw * rstd[:, None])
    h_read, carry = (h_pre, None) if read is None else (read, h_pre)
    next_recipe = None
    if write_x and not keep_next:
        next_recipe = (recipe or Recipe(X)).then(y, post)
    reader = Seam(X.shape[1], source="given", read="given", eps=eps, **norm,
                  **(next_recipe.fields() if next_recipe is not None else {}))
    _, u, *_ = _seam(X_next, None, None, None, h_read, None, None, None, None, *_recipe_args(next_recipe),
                     reader.encode())
    return SeamOut(x_next if write_x else None, u, h_post, layer.mix_matrix(h_res), carry)


def first_read(X):
    """The pre-weights of the first layer under delayed pre: stream 0 alone."""
    e0 = torch.zeros(X.shape[1], device=X.device, dtype=torch.float32)
    e0[0] = 1.0
    return e0.expand(X.shape[0], X.shape[1])


def run(conn, x0, branches, eps, norm=False, keep_after=None, checkpoint=1, design="onepass"):
    """The frame of StreamConnections with fused seams: (x0 (B, T, C) -> the reduced state,
    kept). `norm`: the branches are the raw sub-layers, and the seams write their inputs
    normed. `keep_after` (a layer index short of the last): kept is (the state after that
    layer (B, T, n, C), the carry then (B, T, n) or None), which the seams write anyway.
    `checkpoint` K (hc_stream_checkpoint): backward keeps X_0 = expand(x0), every K-th stream
    after it and the one kept; every other stream it recomputes from the last kept one and
    the sub-layers' outputs since, which the seams keep anyway (fused.restream). `design`
    (hc_seam): DESIGNS, how each seam whose coefficients are on chip runs."""
    B, T, C = x0.shape
    layers = conn.layers
    X = conn.expand(x0).reshape(B * T, conn.n, C)
    recipe = None  # how backward gets X back: None while X is kept
    delayed = layers[0].delayed_pre
    out = seam(X, read=first_read(X) if delayed else None, target=layers[0], eps=eps, norm=norm, design=design)
    kept = None
    for j, branch in enumerate(branches):
        y = branch(out.u.view(B, T, C)).reshape(B * T, C)
        post = (out.h_post, out.h_res)
        if j + 1 < len(layers):
            # delayed: the pre-weights layer j computed, which read X_{j+1}: the torch path's carry after layer j
            carry = out.carry
            keep_next = (j + 1) % checkpoint == 0 or j == keep_after
            out = seam(X, y, post, read=carry, target=layers[j + 1], eps=eps, norm=norm, recipe=recipe,
                       keep_next=keep_next, design=design)
            recipe = None if keep_next else (recipe or Recipe(X)).then(y, post)
            X = out.x_next
            if j == keep_after:
                kept = (X.view(B, T, conn.n, C), None if carry is None else carry.view(B, T, conn.n))
        else:
            return _exit(conn.reduce, X, y, post, out.carry, eps, recipe, checkpoint == 1, design).view(B, T, C), kept


def _exit(reduce, X, y, post, carry, eps, recipe, keep_next, design):
    """The last post mix folded into the reduce: the sum of the streams, the carried
    pre-weights (delayed), or the learned head (a projection of its own, whose weight
    gradient reads the last streams: kept, or written again by the seam's backward)."""
    if carry is not None:
        return seam(X, y, post, read=carry, eps=eps, recipe=recipe).u
    if hasattr(reduce, "weight"):
        return seam(X, y, post, target=reduce, eps=eps, recipe=recipe, keep_next=keep_next, design=design).u
    ones = torch.ones((), device=X.device, dtype=torch.float32).expand(X.shape[0], X.shape[1])
    return seam(X, y, post, read=ones, eps=eps, recipe=recipe).u


def layer_step(layer, X, branch, carry, eps):
    """One HC layer called alone (the layer benchmark, the tests): its read, the branch, and
    its post mix, as two seams. X (..., n, C)."""
    shape = X.shape
    Xf = X.reshape(-1, *shape[-2:])
    if layer.delayed_pre and carry is None:
        carry = first_read(Xf)
    elif carry is not None:
        carry = carry.reshape(-1, shape[-2])
    out = seam(Xf, read=carry if layer.delayed_pre else None, target=layer, eps=eps)
    y = branch(out.u.view(*shape[:-2], shape[-1])).reshape(-1, shape[-1])
    X_next = seam(Xf, y, (out.h_post, out.h_res), read=None, target=None, eps=eps, write_x=True).x_next
    carry = out.carry.view(*shape[:-1]) if out.carry is not None else None
    return X_next.view(shape), carry
