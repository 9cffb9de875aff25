"""The GPT of nanochat (late January 2026), with its residual stream handed to a
pluggable `StreamConnections` (see nanochat/connections).

Kept from nanochat: weightless RMSNorm after the embedding, before attention, before the
MLP, on q and k (after rotary) and before the head; rotary base 10000; relu^2 MLP at 4x
width; no biases; untied embedding and head; value embeddings on alternating layers mixed
into v through a per-head gate; logits softcapped at 15 in fp32; vocab padded to a multiple
of 64; sliding windows from a pattern string; GQA; meta-device construction followed by
`init_weights()`. What changes is the trunk: the model builds its sub-layers as branches
(u -> sub-layer(norm(u))) and hands the embedding and the branches to `StreamConnections`,
which runs the whole residual path and returns the folded state; nothing here knows streams.
A wiring may take the raw sub-layers instead (u -> sub-layer(u): post-norm, ReZero) and give
them start values of its own after `init_weights` (StreamConnections.init_sublayers).
The attention branch also takes a triple (u_q, u_k, u_v), each normed on its own, for a
wiring that feeds query, key and value from different states (MUDDFormer).
The attention kernel is chosen by the `attention` field (flex | sdpa | auto) in one place,
`CausalSelfAttention.forward`.

The `trunk` field picks the recipe around the stream (nanochat/trunks.py, docs/trunks.md), whose
record (`GPTConfig.recipe`) the model reads: 2026-01 is all of the above; 2026-07 is nanochat
92d63d4's (the casting `Linear` instead of autocast, the value gate, q/k scale and RoPE base;
quarter windows; its inits; the smear of the embedding, `GPT.smear`, and the backout, which
StreamConnections applies through each wiring's readout).
"""

import contextlib
import functools
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from nanochat import connections, optim, trunks
from nanochat.common import compute_dtype


ATTENTION_BACKENDS = ("auto", "flex", "sdpa")


def with_variant_fields(cls):
    """Add every variant's own config fields (its module's FIELDS, nanochat/connections) to
    the config class, with their defaults, so that a new wiring adds none here; a checkpoint
    written before a field existed rebuilds with its default."""
    for name, (default, *_) in connections.variant_fields().items():
        cls.__annotations__[name] = type(default)
        setattr(cls, name, field(default_factory=lambda d=default: list(d)) if isinstance(default, list) else default)
    return cls


@dataclass
@with_variant_fields
class GPTConfig:
    sequence_len: int = 2048
    vocab_size: int = 32768
    n_layer: int = 12
    n_head: int = 6
    n_kv_head: int = 6
    n_embd: int = 768
    window_pattern: str = "SSSL"
    # nanochat's value embeddings (on at the pin). Off, with a 65,536 vocab, gives the
    # paper's stated sizes (~60M at D=6, ~186M at D=12); see docs/variants.md, "The residual row".
    value_embeds: bool = True
    # Stream connections (docs/connections.md). hc_streams = 0 means "the variant's default"
    # (1 for the single-state variants, 4 for the others). Each variant's own fields
    # (hc_factors, hc_go_s, attnres_block_size, ...) come from its module: with_variant_fields.
    hc: str = "residual"
    hc_streams: int = 0
    hc_sk_iters: int = 20
    hc_norm_weight: bool = True
    hc_recompute: bool = False
    hc_kernels: str = "torch"  # stream-op backend: torch | liger | fused | auto (connections/backends/ops.py)
    # fused seams: backward keeps the streams at every K-th seam and recomputes the others
    # (connections/backends/fused.py, run); 1 keeps every one
    hc_stream_checkpoint: int = 1
    # fused seams: onepass (one kernel a seam), split (split where the reduction is:
    # docs/kernels.md), or auto (decided at the start of a run, backends/auto.py; onepass
    # unresolved); the same function either way
    hc_seam: str = "auto"
    # Options of every HC variant (connections/frame.py, hc_layer.py); the first choice of each is
    # the paper's, and what checkpoints written before the options existed ran.
    hc_expand: str = "copy"  # copy | lss (Learned Stream Scaling)
    hc_lss_init: float = 0.6
    hc_reduce: str = "sum"  # sum | learned (DeepSeek-V4's head)
    hc_pre: str = "current"  # current | delayed (DeepSeek-V4.1's single-pass pre-weights)
    # Attention kernel: "flex" (FlexAttention, block-sparse sliding windows), "sdpa"
    # (scaled_dot_product_attention, an explicit mask for windows), "auto" (flex on CUDA,
    # sdpa elsewhere). Checkpoints written before the field existed load as "auto".
    attention: str = "auto"
    # nanochat's recipe the model follows (nanochat/trunks.py, docs/trunks.md): 2026-01 (4d8dbaf,
    # the paper's) or 2026-07 (92d63d4: smear, backout, q/k scale, RoPE base 100,000, quarter
    # windows, a 3 sigma value gate over 12 channels, its inits, no autocast). Checkpoints written
    # before the field existed ran 2026-01.
    trunk: str = trunks.DEFAULT

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head={self.n_head} is not a multiple of n_kv_head={self.n_kv_head} (GQA groups)")
        if not self.window_pattern or set(self.window_pattern.upper()) - set("SL"):
            raise ValueError(f"window_pattern={self.window_pattern!r} must be a non-empty string of 'S' and 'L'")
        if self.attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention={self.attention!r}; choose one of {', '.join(ATTENTION_BACKENDS)}")
        trunks.check(self.trunk)
        connections.resolve_config(self)

    @property
    def recipe(self):
        """The trunk's record (nanochat/trunks.py): every value the model takes from its recipe."""
        return trunks.recipe(self.trunk)


class Linear(nn.Linear):
    """A linear layer whose fp32 master weight is cast to the input's dtype: the 2026-07 trunk's
    dtype management without autocast (nanochat 92d63d4, gpt.py): activations carry the compute
    dtype from the embedding on, and every matmul runs in it."""

    def forward(self, x):
        return F.linear(x, self.weight.to(x.dtype))


def linear_layer(recipe):
    """The matmul layer of a recipe: autocast's nn.Linear, or the casting Linear."""
    return nn.Linear if recipe.autocast else Linear


SMEAR_CHANNELS = 24  # the smear gate reads the first 24 channels of the normed embedding (92d63d4)
BACKOUT_INIT = 0.2
TRUNK_SCALAR_LR = 0.2  # the smear gate, smear and backout scalars train at this fixed AdamW LR (92d63d4)


def norm(x):
    """Weightless RMSNorm in x's own dtype. Autocast is kept out: CUDA autocast runs rms_norm
    in fp32 from torch 2.12 on (older torch and CPU autocast do not), which would make every
    normed activation, and what backward keeps of it, fp32 on one torch and bf16 on another.
    In bf16 the kernel still accumulates in fp32, as on the torch of the paper's nanochat."""
    with torch.autocast(x.device.type, enabled=False):
        return F.rms_norm(x, (x.size(-1),))


def norm_inputs(u):
    """A branch's input normed: a state, or a (u_q, u_k, u_v) triple with a norm of its own
    for each (attention's inputs from different states)."""
    return tuple(norm(t) for t in u) if isinstance(u, tuple) else norm(u)


def has_value_embedding(layer_idx, config):
    """Alternating layers, always including the last one (when value embeddings are on)."""
    return config.value_embeds and layer_idx % 2 == (config.n_layer - 1) % 2


def apply_rotary_emb(x, cos, sin):
    # x: (B, T, H, D); rotate the pair (first half, second half) of the head dim.
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1)


class KVCache:
    """Keys and values of every layer for incremental decoding: (B, H_kv, T_max, D) each.
    `pos` counts the tokens already in the cache; the model advances it after a forward."""

    def __init__(self, batch_size, n_layer, n_kv_head, head_dim, max_len, device, dtype):
        shape = (n_layer, batch_size, n_kv_head, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.pos = 0
        self.last_embedding = None

    def swap_embedding(self, last):
        """The 2026-07 trunk's smear reads the embedding of the token before a chunk: return the
        one kept (None before the first chunk) and keep `last` (B, 1, C)."""
        before, self.last_embedding = self.last_embedding, last
        return before

    def insert(self, layer_idx, k, v):
        """Store k, v (B, H_kv, T, D) at the current position; return all keys/values so far."""
        t0, t1 = self.pos, self.pos + k.size(2)
        if t1 > self.k.size(3):
            raise ValueError(f"KV cache is full: {t1} tokens > capacity {self.k.size(3)}")
        self.k[layer_idx, :, :, t0:t1] = k
        self.v[layer_idx, :, :, t0:t1] = v
        return self.k[layer_idx, :, :, :t1], self.v[layer_idx, :, :, :t1]


class StaticKVCache:
    """Keys and values of every layer in buffers of fixed shape (B, H_kv, max_len, D), the
    position a 0-d tensor: every decode step sees the same shapes and the same storage, so
    one compiled graph serves all steps and CUDA graphs can replay it (nanochat/engine.py).
    Each query attends over the whole buffer through a mask from the positions (the slots
    not yet written are masked out): max_len keys per step instead of pos, the price of
    static shapes. Rows are unpadded (no padding_mask). The buffers are one tensor per layer,
    written in place with index_copy_, so that a compiled step updates only the new slots."""

    static = True

    def __init__(self, batch_size, n_layer, n_kv_head, head_dim, max_len, device, dtype, smear_dim=0):
        shape = (batch_size, n_kv_head, max_len, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.pos = torch.zeros((), dtype=torch.long, device=device)
        # the 2026-07 trunk's smear reads the embedding of the token before (KVCache.swap_embedding),
        # kept in a buffer of its own, written in place as the keys are
        self.last_embedding = torch.zeros(batch_size, 1, smear_dim, device=device, dtype=dtype) if smear_dim else None
        for t in (*self.k, *self.v, self.pos, *([self.last_embedding] if smear_dim else [])):
            # the same storage on every call: a CUDA graph reads and writes it where it is
            torch._dynamo.mark_static_address(t)

    @property
    def max_len(self):
        # a tensor size, not an int attribute: dynamic under a compile with dynamic shapes,
        # where an int would be specialized (a recompile per cache capacity)
        return self.k[0].size(2)

    def reset(self):
        """Empty the cache for a new prompt (the old keys are masked out, not cleared)."""
        self.pos.zero_()

    def swap_embedding(self, last):
        """KVCache.swap_embedding in the fixed buffer (what it returns before the first chunk is
        stale: the smear masks it out by the position)."""
        if self.last_embedding is None:
            raise ValueError("this StaticKVCache keeps no embedding for the 2026-07 trunk's smear: build it with "
                             "smear_dim=model.smear_dim")
        before = self.last_embedding.clone()
        self.last_embedding.copy_(last)
        return before

    def positions(self, t):
        """Positions (t,) of the t tokens being added."""
        return self.pos + torch.arange(t, device=self.pos.device)

    def insert(self, layer_idx, k, v):
        """Write k, v (B, H_kv, T, D) at the next T slots; return the whole buffers."""
        slots = self.positions(k.size(2))
        self.k[layer_idx].index_copy_(2, slots, k.to(self.k[layer_idx].dtype))
        self.v[layer_idx].index_copy_(2, slots, v.to(self.v[layer_idx].dtype))
        return self.k[layer_idx], self.v[layer_idx]

    def mask(self, t, window):
        """(t, max_len) bool: query i (at position pos + i) sees the written keys at most
        `window` positions back, as `attention_mask`."""
        q_pos = self.positions(t)[:, None]
        k_pos = torch.arange(self.max_len, device=self.pos.device)[None, :]
        return (k_pos <= q_pos) & (q_pos - k_pos <= window)


def attention_mask(t_q, t_k, window, device, key_mask=None):
    """(mask, is_causal) for SDPA, queries being the last t_q of t_k positions: causal, and
    each query sees at most `window` earlier keys. SDPA's is_causal aligns the triangle to
    the top-left, which is only right when t_q == t_k; otherwise an explicit mask is built.
    key_mask (B, t_k), False at left padding, hides the padding keys from the real queries."""
    if window >= t_k and key_mask is None:
        if t_q == t_k:
            return None, True
        if t_q == 1:
            return None, False  # one new token sees the whole cache
    q_pos = torch.arange(t_k - t_q, t_k, device=device)[:, None]
    k_pos = torch.arange(t_k, device=device)[None, :]
    mask = (k_pos <= q_pos) & (k_pos >= q_pos - window)
    if key_mask is not None:
        # A padding query keeps its causal window (its output is never used): a mask row
        # with no key at all would make SDPA return NaN, which attention would then spread.
        mask = (mask & (key_mask[:, None, :] | ~key_mask[:, t_k - t_q:, None])).unsqueeze(1)
    return mask, False


def attention_backend(attention, device):
    """The kernel `attention` resolves to on `device`: auto means flex on CUDA (where the
    compiled FlexAttention kernel skips the blocks outside a window) and sdpa elsewhere."""
    if attention == "auto":
        return "flex" if torch.device(device).type == "cuda" else "sdpa"
    return attention


# FlexAttention block masks by (length, window, device). Building one evaluates the mask
# over all T x T positions, so it is built once and reused by every layer and step, as
# FlexAttention users do (torchtitan keeps them in a class-level dict). A plain dict read
# is safe under torch.compile: dynamo guards on the key it looks up (an entry added later,
# e.g. for an evaluation prompt, does not recompile the training graph), and a mask missed
# while compiling is built inside the graph without being stored.
_BLOCK_MASKS = {}


def sliding_window_block_mask(t, window, device):
    """Causal block mask over t positions where each query sees at most `window` earlier
    keys (the same rule as `attention_mask`)."""
    key = (t, window, torch.device(device))
    mask = _BLOCK_MASKS.get(key)
    if mask is None:
        def causal_window(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & (q_idx - kv_idx <= window)

        mask = create_block_mask(causal_window, None, None, t, t, device=device)
        if not torch.compiler.is_compiling():
            _BLOCK_MASKS[key] = mask
    return mask


@functools.cache
def _compiled_flex():
    return torch.compile(flex_attention)


def _flex_kernel(device_type):
    """FlexAttention as it should run: inside a compiled model, the plain function (the
    model's compilation covers it); in an eager model on CUDA, its own compiled form (only
    that is block-sparse; built on first use, since creating it imports the compiler); on
    the CPU, eager, which serves the tests (forward only: no backward on CPU)."""
    if torch.compiler.is_compiling() or device_type != "cuda":
        return flex_attention
    return _compiled_flex()


def flex_attend(q, k, v, window, enable_gqa=False):
    """Causal attention over q, k, v (B, H, T, D) of one sequence, each query seeing at most
    `window` earlier keys, by FlexAttention with the cached block mask."""
    block_mask = sliding_window_block_mask(q.size(2), window, q.device)
    # Autocast casts SDPA's inputs to its dtype but leaves FlexAttention alone: q, k and v
    # must reach it in one dtype, whatever produced them. Cast as SDPA would.
    device_type = q.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else v.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    return _flex_kernel(device_type)(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)


def sdpa_attend(q, k, v, window, enable_gqa=False, key_mask=None):
    """The same by scaled_dot_product_attention, the queries being the last of the keys."""
    mask, is_causal = attention_mask(q.size(2), k.size(2), window, q.device, key_mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=enable_gqa)


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head
        self.attention = config.attention
        self.sequence_len = config.sequence_len
        self.head_dim = config.n_embd // config.n_head
        C, hd = config.n_embd, self.head_dim
        recipe = config.recipe
        Linear = linear_layer(recipe)
        self.c_q = Linear(C, self.n_head * hd, bias=False)
        self.c_k = Linear(C, self.n_kv_head * hd, bias=False)
        self.c_v = Linear(C, self.n_kv_head * hd, bias=False)
        self.c_proj = Linear(C, C, bias=False)
        self.ve_gate_channels = recipe.ve_gate_channels
        self.ve_gate_scale = recipe.ve_gate_scale
        self.qk_scale = recipe.qk_scale
        self.ve_gate = (Linear(self.ve_gate_channels, self.n_kv_head, bias=False)
                        if has_value_embedding(layer_idx, config) else None)

    def forward(self, x, ve, cos_sin, window, kv_cache, key_mask=None):
        """x: the normed input (B, T, C), or a triple (x_q, x_k, x_v) when a wiring feeds the
        query, key and value from different states (MUDDFormer); the value embedding's gate
        reads the value's input."""
        x_q, x_k, x_v = x if isinstance(x, tuple) else (x, x, x)
        B, T, C = x_q.shape
        q = self.c_q(x_q).view(B, T, self.n_head, self.head_dim)
        k = self.c_k(x_k).view(B, T, self.n_kv_head, self.head_dim)
        v = self.c_v(x_v).view(B, T, self.n_kv_head, self.head_dim)
        if ve is not None:
            # ResFormer-style value residual, gated per head in (0, 2) (2026-07: (0, 3)).
            gate = self.ve_gate_scale * torch.sigmoid(self.ve_gate(x_v[..., :self.ve_gate_channels]))
            v = v + gate.unsqueeze(-1) * ve.view_as(v).to(v.dtype)
        cos, sin = cos_sin
        q, k = apply_rotary_emb(q, cos, sin), apply_rotary_emb(k, cos, sin)
        q, k = norm(q), norm(k)
        if self.qk_scale != 1.0:  # 2026-07: sharper attention, the scale split between q and k
            q, k = q * self.qk_scale, k * self.qk_scale
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
        gqa = self.n_kv_head != self.n_head
        flex = attention_backend(self.attention, x_q.device) == "flex"
        if kv_cache is None and key_mask is None and window < T == self.sequence_len and flex:
            # A windowed layer over a training-length sequence: the one case where SDPA needs an
            # explicit mask (no flash kernel, every masked block computed) and a block mask skips
            # work. Only at the training length, whose block masks init_weights builds once:
            # evaluation prompts of every other length would each bring a new block mask, and
            # with it a recompile of eager CUDA FlexAttention, until dynamo's limit.
            y = flex_attend(q, k, v, window, gqa)
        else:
            # SDPA for full-context layers (flash with is_causal), for other lengths than the
            # training one, and for decoding through the KV cache: there the queries are the last
            # T of a prefix whose length changes every token, so a block mask would be rebuilt per
            # step, and a one-row query has no blocks to skip.
            if kv_cache is not None:
                k, v = kv_cache.insert(self.layer_idx, k, v)
            if getattr(kv_cache, "static", False):
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=kv_cache.mask(T, window), enable_gqa=gqa)
            else:
                y = sdpa_attend(q, k, v, window, gqa, key_mask)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        Linear = linear_layer(config.recipe)
        self.c_fc = Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        # relu(h) * relu(h), not .square(): square lowers to pow, which CUDA autocast runs in
        # fp32, so eager training would keep an fp32 (B, T, 4C) copy per MLP; mul keeps bf16.
        h = F.relu(self.c_fc(x))
        return self.c_proj(h * h)


class Block(nn.Module):
    """The two sub-layers of a transformer block; the residual wiring lives in the connections."""

    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn = CausalSelfAttention(config, layer_idx)
        self.mlp = MLP(config)


class GPT(nn.Module):
    def __init__(self, config, pad_vocab_size_to=64):
        super().__init__()
        self.config = config
        self.recipe = config.recipe
        self.padded_vocab_size = math.ceil(config.vocab_size / pad_vocab_size_to) * pad_vocab_size_to
        C = config.n_embd
        self.head_dim = C // config.n_head
        kv_dim = config.n_kv_head * self.head_dim
        self.transformer = nn.ModuleDict({
            "wte": Embedding(self.padded_vocab_size, C),
            "h": nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
        })
        self.lm_head = linear_layer(self.recipe)(C, self.padded_vocab_size, bias=False)
        self.value_embeds = nn.ModuleDict({
            str(i): Embedding(self.padded_vocab_size, kv_dim)
            for i in range(config.n_layer) if has_value_embedding(i, config)})
        if self.recipe.smear_backout:
            # 2026-07's trunk scalars, outside every wiring: the smear of the previous token's
            # embedding into x0, and the backout of the mid-depth state before the final norm.
            self.smear_gate = linear_layer(self.recipe)(SMEAR_CHANNELS, 1, bias=False)
            self.smear_lambda = nn.Parameter(torch.empty(1))
            self.backout_lambda = nn.Parameter(torch.empty(1))
        self.connections = connections.build(config)
        self.window_sizes = self._compute_window_sizes()
        # Rotary tables cover 10x the training context so that long evaluation prompts fit.
        self.rotary_len = 10 * config.sequence_len
        cos, sin = self._rotary_tables(self.rotary_len)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _compute_window_sizes(self):
        pattern = self.config.window_pattern.upper()
        full = self.config.sequence_len
        # 2026-01: half the context; 2026-07: a quarter, rounded up to FlashAttention-3's tile of 128
        divisor, tile = self.recipe.short_window_divisor, self.recipe.short_window_tile
        short = full // divisor if tile is None else -(-full // divisor // tile) * tile
        sizes = [full if pattern[i % len(pattern)] == "L" else short for i in range(self.config.n_layer)]
        sizes[-1] = full  # the last layer always sees the whole context
        return sizes

    def _rotary_tables(self, length, device=None, dtype=torch.float32):
        """(cos, sin), each (1, length, 1, head_dim / 2), computed in `dtype`: fp32 as nanochat,
        fp64 in an fp64 model (build_model's dtype), whose tables fp32 would round."""
        base = self.recipe.rope_base
        half = self.head_dim // 2
        if torch.empty(0, device=device).is_meta:
            # only shapes on the meta device (init_weights computes the tables after the move):
            # arange there goes through torch._refs, whose first call imports torch._dynamo (1.5 s)
            shape = (1, length, 1, half)
            return torch.empty(shape, device=device), torch.empty(shape, device=device)
        inv_freq = 1.0 / (base ** (torch.arange(0, half, dtype=dtype, device=device) / half))
        freqs = torch.outer(torch.arange(length, dtype=dtype, device=device), inv_freq)
        return freqs.cos()[None, :, None, :], freqs.sin()[None, :, None, :]

    @torch.no_grad()
    def init_weights(self):
        """All real initialization (construction happens on the meta device)."""
        C = self.config.n_embd
        bound = math.sqrt(3.0) / math.sqrt(C)  # uniform with std 1/sqrt(C)
        recipe = self.recipe
        # 2026-07 (92d63d4): wte N(0, 0.8), c_fc at 0.4x the bound, value gates U(0, 0.02)
        nn.init.normal_(self.transformer.wte.weight, mean=0.0, std=recipe.wte_std)
        nn.init.normal_(self.lm_head.weight, mean=0.0, std=0.001)
        for block in self.transformer.h:
            for lin in (block.attn.c_q, block.attn.c_k, block.attn.c_v):
                nn.init.uniform_(lin.weight, -bound, bound)
            fc_bound = recipe.c_fc_bound * bound
            nn.init.uniform_(block.mlp.c_fc.weight, -fc_bound, fc_bound)
            nn.init.zeros_(block.attn.c_proj.weight)
            nn.init.zeros_(block.mlp.c_proj.weight)
        if recipe.smear_backout:  # the draws in 92d63d4's order, so that one seed gives its weights
            nn.init.zeros_(self.smear_lambda)
            nn.init.constant_(self.backout_lambda, BACKOUT_INIT)
            nn.init.uniform_(self.smear_gate.weight, 0.0, 0.02)
        for ve in self.value_embeds.values():
            nn.init.uniform_(ve.weight, -bound, bound)
        for block in self.transformer.h:
            if block.attn.ve_gate is not None:
                if recipe.ve_gate_init is None:
                    nn.init.zeros_(block.attn.ve_gate.weight)  # gate = 1 at init (no draw)
                else:
                    nn.init.uniform_(block.attn.ve_gate.weight, *recipe.ve_gate_init)
        self.connections.init_weights()
        self.connections.init_sublayers([sub for block in self.transformer.h for sub in (block.attn, block.mlp)])
        self.fill_rotary_tables()
        if attention_backend(self.config.attention, self.cos.device) == "flex":
            # The training length's block masks, built here, outside any compiled region, so
            # that a compiled forward finds them in the cache instead of rebuilding them.
            T = self.config.sequence_len
            for window in sorted({w for w in self.window_sizes if w < T}):
                sliding_window_block_mask(T, window, self.cos.device)
        device_type = self.transformer.wte.weight.device.type
        if not recipe.autocast:
            # 2026-07: the tables in the compute dtype, which the activations then carry without
            # autocast (fp16 keeps them fp32: its gradient scaler cannot unscale fp16 gradients)
            dtype = compute_dtype(device_type)
            if dtype not in (torch.float16, torch.float32):
                self.cast_embeddings(dtype)
        elif device_type == "cuda":
            # As nanochat: embedding tables in bf16 on CUDA (half the memory, and their
            # AdamW state follows); the lookups feed bf16 compute anyway.
            self.cast_embeddings(torch.bfloat16)

    def fill_rotary_tables(self):
        """The rotary buffers, computed in fp32, or in fp64 for fp64 buffers (init_weights fills
        them, and build_model again after a cast); a narrower buffer takes the fp32 tables rounded."""
        dtype = torch.promote_types(self.cos.dtype, torch.float32)
        cos, sin = self._rotary_tables(self.rotary_len, device=self.cos.device, dtype=dtype)
        self.cos.copy_(cos)
        self.sin.copy_(sin)

    def cast_embeddings(self, dtype):
        """The token and value embedding tables in `dtype` (bf16 on CUDA, as nanochat; the CPU
        benchmarks' bf16 runs do the same, so that their activations have CUDA's dtypes)."""
        # New Parameters rather than Module.to: `to` swaps tensor subclasses in place, which
        # fails for the fake CUDA tensors of the dry run (tests/cuda_dryrun.py). Called before
        # any optimizer holds the old ones.
        for emb in (self.transformer.wte, *self.value_embeds.values()):
            emb.weight = nn.Parameter(emb.weight.detach().to(dtype))

    # ----- parameter accounting and optimizer groups -----

    def param_counts(self):
        """Parameters by role (the buckets partition the model exactly), their total, and
        the non-embedding count: the total less the embedding tables (wte, value embeddings)."""
        counts = {
            "wte": self.transformer.wte.weight.numel(),
            "value_embeds": sum(p.numel() for p in self.value_embeds.parameters()),
            "lm_head": self.lm_head.weight.numel(),
            "transformer_matrices": sum(p.numel() for p in self.transformer.h.parameters()),
            "connections": sum(p.numel() for p in self.connections.parameters()),
            "trunk_scalars": sum(p.numel() for p in self.trunk_scalars()),
        }
        counts["total"] = sum(counts.values())
        counts["non_embedding"] = counts["total"] - counts["wte"] - counts["value_embeds"]
        actual = sum(p.numel() for p in self.parameters())
        assert counts["total"] == actual, f"parameter buckets miss parameters: {counts['total']} != {actual}"
        return counts

    @property
    def smear_dim(self):
        """The width of the embedding a KV cache keeps for the smear (0: no smear)."""
        return self.config.n_embd if self.recipe.smear_backout else 0

    def trunk_scalars(self):
        """2026-07's smear gate, smear and backout scalars (none on 2026-01)."""
        if not self.recipe.smear_backout:
            return []
        return [self.smear_gate.weight, self.smear_lambda, self.backout_lambda]

    def num_scaling_params(self):
        """nanochat's scaling count (transformer matrices + lm_head) for ratio-based horizons."""
        counts = self.param_counts()
        return counts["transformer_matrices"] + counts["lm_head"]

    def estimate_flops(self):
        """Training FLOPs per token, the project's FLOP convention (compute multipliers are in
        these units) and nanochat's: 6 per matmul weight (forward + backward, num_matmul_params)
        plus attention scores and values over each layer's effective window. Embeddings are
        lookups and do not count; every connection parameter but the one-element scalars counts
        as a matmul weight (the projection x'W dominates them); the stream mixes (pre, post,
        res), the RMSNorm over the n*C stream and building H_res (Sinkhorn, permutation
        mixtures) are memory-bound element-wise passes and do not count
        (connections.diagnostics.stream_mix_flops sizes them: ~0.4 % at D=12, n=4; printed
        by `python -m scripts.hc_report --params`). For the residual wiring this is nanochat's
        own count, to the FLOP: 92d63d4's (tests/test_trunk.py) and 4d8dbaf's."""
        T = self.config.sequence_len
        attn = sum(12 * self.config.n_head * self.head_dim * min(w, T) for w in self.window_sizes)
        return 6 * self.num_matmul_params() + attn

    def num_matmul_params(self):
        """The parameters counted as matmul weights: every one but the embedding tables and the
        one-element scalars. The scalars multiply a state (the residual wiring's l_resid and l_x0,
        2026-07's lambda_s and lambda_b, ReZero's alpha), 2 FLOPs per element of the state
        rather than per parameter, which nanochat leaves out as it leaves out its per-layer
        lambdas (92d63d4 counts the weights of its Linear layers; 4d8dbaf all parameters but the
        embeddings and the lambdas). Counted by size rather than by layer class, so that the
        float8 layers of --fp8 still count."""
        scalars = sum(1 for p in self.parameters() if p.numel() == 1)
        return self.param_counts()["non_embedding"] - scalars

    def param_groups(self, unembedding_lr=0.004, embedding_lr=0.3, matrix_lr=0.02, weight_decay=0.0,
                     hc_lr=0.005, scalar_lr=0.5, adam_betas=(0.8, 0.95), hc_betas=(0.8, 0.95),
                     x0_betas=(0.8, 0.95)):
        """Optimizer groups: AdamW for head, embeddings (both scaled by (C/768)^-0.5 as
        nanochat does) and the connection parameters (unscaled, no weight decay: hc_lr for
        the HC variants, nanochat's scalar_lr split for the residual baseline; see
        connections.StreamConnections.param_groups); Muon for the transformer matrices, one
        group per shape. Connection parameters never reach Muon."""
        dmodel_scale = (self.config.n_embd / 768) ** -0.5
        adamw = dict(kind="adamw", eps=1e-10, weight_decay=0.0, **optim.trunk_options(self.config.trunk, "adamw"))
        # 2026-07 (92d63d4 gpt.py setup_optimizer): its own betas and weight decays per group,
        # the value embeddings at half the embedding LR; 2026-01: adam_betas and no decay.
        recipe = self.recipe
        head, table, values = ({"betas": adam_betas, **recipe.adamw_groups.get(name, {})}
                               for name in ("lm_head", "wte", "value_embeds"))
        values["lr"] = recipe.value_embed_lr * embedding_lr * dmodel_scale
        groups = [
            dict(adamw, name="lm_head", params=[self.lm_head.weight], lr=unembedding_lr * dmodel_scale, **head),
            dict(adamw, name="wte", params=[self.transformer.wte.weight], lr=embedding_lr * dmodel_scale, **table),
        ]
        if len(self.value_embeds):
            groups.append(dict(adamw, name="value_embeds", params=list(self.value_embeds.parameters()), **values))
        # replicated: the many small connection tensors travel as one flat all-reduce
        groups += [dict(adamw, replicated=True, **g)
                   for g in self.connections.param_groups(hc_lr, scalar_lr, hc_betas, x0_betas)]
        if recipe.smear_backout:  # a fixed LR, not scaled with the batch (92d63d4)
            groups.append(dict(adamw, replicated=True, name="trunk_scalars", params=self.trunk_scalars(),
                               lr=TRUNK_SCALAR_LR, betas=(0.8, 0.95)))
        matrices = list(self.transformer.h.parameters())
        muon = optim.trunk_options(self.config.trunk, "muon")
        for shape in sorted({tuple(p.shape) for p in matrices}):
            groups.append(dict(dict(kind="muon", name=f"muon_{'x'.join(map(str, shape))}",
                                    params=[p for p in matrices if tuple(p.shape) == shape],
                                    lr=matrix_lr, momentum=0.95, ns_steps=5, beta2=0.95, weight_decay=weight_decay),
                               **muon))
        grouped = [p for g in groups for p in g["params"]]
        assert len(grouped) == len(set(map(id, grouped))) == len(list(self.parameters())), \
            "every parameter must be in exactly one optimizer group"
        return groups

    # ----- forward -----

    def forward(self, idx, targets=None, kv_cache=None, loss_reduction="mean", padding_mask=None):
        """padding_mask: for left-padded batches, (B, t0 + T) bool over the cached and the new
        tokens, False at padding; positions then count each row's real tokens."""
        B, T = idx.shape
        static = getattr(kv_cache, "static", False)
        # A static cache's position is a tensor (no host sync, no recompile per step): its
        # capacity is checked instead, once, against the rotary table.
        t0 = kv_cache.pos if kv_cache is not None and not static else 0
        end = kv_cache.max_len if static else t0 + T
        if end > self.rotary_len:
            raise ValueError(f"sequence of {end} tokens exceeds the rotary table ({self.rotary_len})")
        if static:
            if padding_mask is not None:
                raise ValueError("a StaticKVCache takes unpadded rows; use KVCache with padding_mask")
            pos = kv_cache.positions(T)
            cos, sin = self.cos[:, pos], self.sin[:, pos]
        elif padding_mask is None:
            cos, sin = self.cos[:, t0:t0 + T], self.sin[:, t0:t0 + T]
        else:
            if padding_mask.shape != (B, t0 + T):
                raise ValueError(f"padding_mask has shape {tuple(padding_mask.shape)}, expected {(B, t0 + T)}")
            padding_mask = padding_mask.bool()
            pos = (padding_mask.long().cumsum(-1) - 1).clamp(min=0)[:, t0:]
            cos, sin = self.cos[0, pos], self.sin[0, pos]  # (B, T, 1, D/2)
        cos = cos.to(self.activation_dtype(idx))
        sin = sin.to(cos.dtype)
        # The stream dtype is decided here, once: the activation dtype (bf16 under autocast, as
        # nanochat's stream), not whatever the embedding and its norm return.
        x0 = norm(self.transformer.wte(idx)).to(self.activation_dtype(idx))
        if self.recipe.smear_backout:
            x0 = self.smear(x0, kv_cache, padding_mask, t0)
        # Each sub-layer keeps its input RMSNorm, unless the wiring calls it raw where its own
        # math norms elsewhere (SPEC sublayer_prenorm: post-norm, ReZero) or the trunk norms the
        # inputs itself (the fused seams: StreamConnections.norms_sublayer_inputs).
        prenorm = self.connections.sublayer_prenorm and not self.connections.norms_sublayer_inputs(x0)
        pre = norm_inputs if prenorm else (lambda u: u)
        branches = []
        for i, block in enumerate(self.transformer.h):
            window = self.window_sizes[i]

            def attn_branch(u, i=i, block=block, window=window):
                # u: a state, or a (u_q, u_k, u_v) triple (CausalSelfAttention.forward)
                ve = self.value_embeds[str(i)](idx) if str(i) in self.value_embeds else None
                return block.attn(pre(u), ve, (cos, sin), window, kv_cache, padding_mask)

            def mlp_branch(u, block=block):
                return block.mlp(pre(u))

            branches += [attn_branch, mlp_branch]
        if self.recipe.smear_backout:
            x = self.connections(x0, branches, backout=self.backout_lambda)
        else:
            x = self.connections(x0, branches)
        if kv_cache is not None:
            kv_cache.pos += T
        return self.head(x, targets, loss_reduction)

    def smear(self, e, kv_cache=None, padding_mask=None, t0=0):
        """2026-07's smear: x_t = e_t + lambda_s sigmoid(w_s e_t[:24]) e_{t-1}, e the normed
        embedding (unsmeared on both sides), nothing added at the first token. Through a KV
        cache the token before a chunk's first is the cache's last; a padded row adds nothing
        where the token before is padding."""
        lam = self.smear_lambda.to(e.dtype)
        if kv_cache is None and padding_mask is None:
            # 92d63d4's training form, its operations in its order (the order in which backward
            # sums the gradients of e: bitwise equal gradients), the first position untouched
            g = lam * torch.sigmoid(self.smear_gate(e[:, 1:, :SMEAR_CHANNELS]))
            return torch.cat([e[:, :1], e[:, 1:] + g * e[:, :-1]], dim=1)
        gate = lambda x: lam * torch.sigmoid(self.smear_gate(x[..., :SMEAR_CHANNELS]))  # noqa: E731
        before = kv_cache.swap_embedding(e[:, -1:]) if kv_cache is not None else None
        if before is None:
            before = torch.zeros_like(e[:, :1])
        prev = torch.cat([before, e[:, :-1]], dim=1)
        g = gate(e)
        # whether position t0 + j has a token before it: a cache that holds tokens (a tensor
        # position for a static cache: no host sync), and with padding, a real token there
        started = (torch.as_tensor(t0 if not getattr(kv_cache, "static", False) else kv_cache.pos, device=e.device) > 0)
        has_prev = torch.ones(e.shape[:2], dtype=torch.bool, device=e.device)
        has_prev[:, 0] = started
        if padding_mask is not None:
            before_mask = torch.cat([padding_mask[:, :1] & started, padding_mask], dim=1)[:, t0:t0 + e.size(1)]
            has_prev = has_prev & before_mask
        return e + (g * has_prev.unsqueeze(-1).to(g.dtype)) * prev

    def head(self, x, targets=None, loss_reduction="mean"):
        """The folded state (B, T, C) -> softcapped logits, or the loss against `targets`."""
        logits = self.lm_head(norm(x))[..., :self.config.vocab_size]
        # The softcap and the loss in fp32 at least (nanochat's .float()), fp64 in an fp64 model.
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        logits = 15 * torch.tanh(logits / 15)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1),
                               ignore_index=-1, reduction=loss_reduction).view(
            () if loss_reduction == "mean" else targets.shape)

    def compile_regions(self, backend="inductor"):
        """torch.compile each repeated region rather than the model whole: every sub-layer
        (attention, MLP), every connection layer's step (StreamConnections.compile_regions) and
        the head. A region's code is the same at every depth, so dynamo compiles it once per
        distinct setting (attention: window and value-embedding gate; a connection layer: its
        variant) and every layer reuses it: compile time no longer grows with the depth. What
        crosses regions (the trunk's loop, the branches' input norms) runs eagerly. A wiring whose
        layers carry more at every depth (Attention Residuals' sources) compiles its step once
        per depth: dynamo's recompile limit is raised to allow that rather than fall back to
        eager."""
        limit = torch._dynamo.config.cache_size_limit
        torch._dynamo.config.cache_size_limit = max(limit, 2 * len(self.connections.layers))
        for block in self.transformer.h:
            block.attn.compile(dynamic=False, backend=backend)
            block.mlp.compile(dynamic=False, backend=backend)
        self.connections.compile_regions(backend)
        self.head = torch.compile(self.head, dynamic=False, backend=backend)

    def activation_dtype(self, idx):
        """The dtype activations will have: autocast's when active, else the embedding's."""
        device_type = idx.device.type
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
        return self.transformer.wte.weight.dtype

    # ----- inference -----

    @torch.inference_mode()
    def generate(self, tokens, max_tokens, temperature=1.0, top_k=None, seed=42, steps=None):
        """Yield up to max_tokens new token ids after the prompt `tokens` (a list of ints):
        one prefill of the prompt, then one token per step through a StaticKVCache.
        `steps` supplies the cache and the forward (`cache(batch, length)`, `step(ids, cache)`
        -> logits); by default this model, eagerly (nanochat/engine.py: compiled)."""
        if not tokens:
            raise ValueError("generate needs a non-empty prompt (e.g. the BOS token)")
        steps = steps or EagerSteps(self)
        device = self.lm_head.weight.device
        rng = torch.Generator(device=device).manual_seed(seed)
        cache = steps.cache(1, len(tokens) + max_tokens)
        ids = torch.tensor([tokens], dtype=torch.long, device=device)
        for _ in range(max_tokens):
            logits = steps.step(ids, cache)[:, -1, :]
            if temperature == 0:
                next_id = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None and top_k > 0:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits = logits.masked_fill(logits < v[:, [-1]], float("-inf"))
                next_id = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=rng)
            ids = next_id
            yield int(next_id.item())


class EagerSteps:
    """Generation's cache and forward, eagerly: a StaticKVCache of exactly the length asked
    for (a new one per call), and the model's forward."""

    def __init__(self, model):
        self.model = model

    def cache(self, batch_size, length):
        m = self.model
        dtype = m.activation_dtype(torch.empty(0, device=m.lm_head.weight.device))
        return StaticKVCache(batch_size, m.config.n_layer, m.config.n_kv_head, m.head_dim, length,
                             m.lm_head.weight.device, dtype, smear_dim=m.smear_dim)

    def step(self, ids, cache):
        return self.model(ids, kv_cache=cache)


COMPILE_MODES = ("whole", "regional")


def compiled(model, mode="whole", backend="inductor"):
    """What a training step calls: the model compiled whole (one graph: dynamo unrolls every
    layer), or regionally (GPT.compile_regions: each repeated region once), the model itself."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"unknown compile mode {mode!r}; choose one of {', '.join(COMPILE_MODES)}")
    if mode == "whole":
        return torch.compile(model, dynamic=False, backend=backend)
    model.compile_regions(backend)
    return model


def autocast_for(config, device_type, dtype):
    """The context a forward of this config runs in at compute dtype `dtype`: autocast on the
    2026-01 trunk (fp32 needs none), none on 2026-07 (its layers cast their weights)."""
    if dtype == torch.float32 or not config.recipe.autocast:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype)


def model_config_from_depth(depth, vocab_size, sequence_len, aspect_ratio=64, head_dim=128,
                            window_pattern="SSSL", **hc):
    """nanochat's width-from-depth rule: model_dim = ceil(depth*aspect/head_dim)*head_dim."""
    model_dim = math.ceil(depth * aspect_ratio / head_dim) * head_dim
    n_head = model_dim // head_dim
    return GPTConfig(sequence_len=sequence_len, vocab_size=vocab_size, n_layer=depth, n_head=n_head,
                     n_kv_head=n_head, n_embd=model_dim, window_pattern=window_pattern, **hc)


class Embedding(nn.Embedding):
    """nn.Embedding that leaves a meta tensor uninitialized: its normal_ on the meta device
    goes through torch._refs, whose first call imports torch._dynamo (1.5 s of every process
    that builds a model, compiled or not), and build_model initializes the weights for real
    after moving them (init_weights)."""

    def reset_parameters(self):
        if not self.weight.is_meta:
            super().reset_parameters()


def build_model(config, device, dtype=None):
    """Construct on the meta device (no memory, no wasted init), move to `device`, then
    initialize for real. A checkpoint is loaded on top of this: the init also computes the
    non-persistent buffers (rotary tables, permutation matrices) that state dicts lack.
    dtype (torch.float64 for the comparisons with nanochat's code, tests/goldens/): every
    parameter and buffer cast to it after the init (the same draws, widened), the rotary
    tables computed again in it."""
    with torch.device("meta"):
        model = GPT(config)
    model.to_empty(device=device)
    model.init_weights()
    if dtype is not None:
        model.to(dtype)
        model.fill_rotary_tables()
    return model
