"""The Triton kernels of `hc_kernels = fused` (fused.py says what they compute and why).

Three kernels:
  seam_forward   one pass across the boundary between two sub-layers, per tile of BLOCK_T
                 tokens: the streams X_next (the post/res mix of the sub-layer before, or given),
                 the projection x W of the next layer with its mean square, the coefficients
                 (sigmoids, Sinkhorn, permutation mixtures), and the pre mix u = h_read X_next.
  seam_backward  its gradient, per token tile: the coefficient gradients on chip, then one
                 read-modify of the stream gradient: G = dL/dX_next from every use of X_next,
                 and from it the gradients of X, y, h_post and h_res of the layer before.
  weight_grad    dL/dW = sum over tokens of X_next^T (dL/d xW), as deterministic partial sums
                 (a block of D x token chunks per program, no atomics), summed by the caller.

Layouts: streams (N, NS, C) contiguous in the stream dtype; per-token coefficients fp32,
h_post (N, NS), h_res (N, NS, NS) with h_res[t, s] the weight of stream s in stream t; the
projection W (n C, K) as the layer holds it, its K columns [pre | post | res] read as two
register blocks: A (KA wide: pre | post, the head's or, off chip, every column) and B (KB
wide: the res logits, an NP x NP block for the square maps, res_maps.ResMap.kernel_width).
Every stream value X_next is rounded to the stream dtype before anything reads it, as the
layer-by-layer path stores and reloads it; arithmetic is fp32; each stored result is
rounded once. Gradients of X_next recompute X_next from X and y instead of keeping it.

Codes of the constexpr switches (fused.Seam holds their names):
  SOURCE    0: X_next given (x_ptr), 1: X_next = h_res X + h_post^T y
  RES_IN    (SOURCE 1) 0: h_res is the identity, 1: read from hres_ptr
  READ      0: no pre mix, 1: read weights given (hread_ptr, any strides), 2: projected
  COEF      0: no projection, 1: projection only (coefficients off chip), 2: HC gates
            (pre, post, res), 3: the learned head (pre + READ_EPS)
  RES_KIND  (COEF 2) 0: identity, 1: free, 2: Sinkhorn, 3: permutation mixture, 4: Cayley
            (go-mHC; MP: the side of its padded tiles)
  PHASE     0: the whole seam (the one-pass design); the split design's kernels:
            forward 1: X_next and its raw projection, per (token tile, channel split): SPLITS
            partial sums (SPLIT_C channels each) in part_ptr (SPLITS, N, KA + KBX + 1), 2: their
            sum in order (proj_ptr, kept for backward) and from it the coefficients, 3: the read
            of X_next (given: SOURCE 0), whole rows (BLOCK_C >= C) in one pass; backward 1: the
            reductions over the channels and the coefficients' gradients (per token, handed
            over in gxw_ptr and bridge_ptr), 2: the streaming pass for the stream gradients
  WRITE_XN  (backward) store X_next as it is recomputed (stream checkpoints: it was not kept)
  TMA       load X and y in the channel loops with the projection's products through tensor
            descriptors (sm_90's TMA, fused.uses_tma), the others through masked loads; set only
            for a kernel whose loops have products (fused.tma_kernel)
"""

import triton
import triton.language as tl


@triton.jit
def _rows(t, INT64: tl.constexpr):
    """Token indices as offsets: int32 unless a tensor's elements overflow it (INT64): 64-bit
    offsets cost two registers per element of every tile address."""
    if INT64:
        t = t.to(tl.int64)
    return t


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _column(tile, cols, j):
    """tile[:, j] as a vector (j a compile-time column)."""
    return tl.sum(tl.where(cols[None, :] == j, tile, 0.0), axis=1)


@triton.jit
def _zeros_tuple(count: tl.constexpr, BLOCK_T: tl.constexpr):
    out = ()
    for _ in tl.static_range(count):
        out = out + (tl.zeros((BLOCK_T,), tl.float32),)
    return out


@triton.jit
def _post_coefficients(hpost_ptr, hres_ptr, row, tmask, NS: tl.constexpr, SOURCE: tl.constexpr,
                       RES_IN: tl.constexpr, BLOCK_T: tl.constexpr):
    """(h_post[s], h_res[t*NS + s]) as per-token vectors, for a post source."""
    hp = ()
    hr = ()
    if SOURCE == 1:
        for s in tl.static_range(NS):
            hp = hp + (tl.load(hpost_ptr + row * NS + s, mask=tmask, other=0.0),)
        if RES_IN == 1:
            for q in tl.static_range(NS * NS):
                hr = hr + (tl.load(hres_ptr + row * (NS * NS) + q, mask=tmask, other=0.0),)
    return hp, hr


@triton.jit
def _given_read(hread_ptr, hread_st, hread_ss, row, tmask, NS: tl.constexpr, READ: tl.constexpr):
    out = ()
    if READ == 1:
        for s in tl.static_range(NS):
            out = out + (tl.load(hread_ptr + row * hread_st + s * hread_ss, mask=tmask, other=0.0),)
    return out


@triton.jit
def _stream_tiles(ptr, row, cols, mask, C, NS: tl.constexpr):
    out = ()
    for s in tl.static_range(NS):
        out = out + (tl.load(ptr + row[:, None] * (NS * C) + s * C + cols[None, :], mask=mask, other=0.0)
                     .to(tl.float32),)
    return out


@triton.jit
def _next_streams(x_ptr, y_ptr, row, cols, mask, C, hp, hr, NS: tl.constexpr, SOURCE: tl.constexpr,
                  RES_IN: tl.constexpr):
    """(X tiles, y tile, X_next tiles) of one chunk of channels: X_next given (SOURCE 0) or
    sum_s h_res[t, s] X[s] + h_post[t] y, rounded to the stream dtype (SOURCE 1)."""
    xs = _stream_tiles(x_ptr, row, cols, mask, C, NS)
    y = tl.zeros_like(xs[0])
    if SOURCE == 1:
        y = tl.load(y_ptr + row[:, None] * C + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    return _post_mix(x_ptr, xs, y, hp, hr, NS, SOURCE, RES_IN)


@triton.jit
def _stream_source(ptr, N, C, NS: tl.constexpr, TMA: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """What a loop loads (N, NS, C) streams through: their pointer, or (TMA) a tensor descriptor
    whose boxes are BLOCK_T tokens x one stream x BLOCK_C channels. A box is one bulk copy,
    issued by one thread without an address per element; positions past N tokens or C channels
    read as zeros, as the masked loads do."""
    src = ptr
    if TMA:
        src = tl.make_tensor_descriptor(ptr, shape=[N, NS, C], strides=[NS * C, C, 1],
                                        block_shape=[BLOCK_T, 1, BLOCK_C])
    return src


@triton.jit
def _box(src, s, t0, c0):
    """Stream s of the box at token t0 and channel c0 of a descriptor (_stream_source), in fp32."""
    tile = src.load([t0, s, c0])
    return tl.reshape(tile, (tile.shape[0], tile.shape[2])).to(tl.float32)


@triton.jit
def _sources(x_ptr, y_ptr, N, C, NS: tl.constexpr, SOURCE: tl.constexpr, TMA: tl.constexpr, BLOCK_T: tl.constexpr,
             BLOCK_C: tl.constexpr):
    """The program's first token, and what its loops with products load X and y through."""
    return tl.program_id(0) * BLOCK_T, (_stream_source(x_ptr, N, C, NS, TMA, BLOCK_T, BLOCK_C),
                                          _stream_source(y_ptr, N, C, 1, TMA and SOURCE == 1, BLOCK_T, BLOCK_C))


@triton.jit
def _next_streams_in(x_ptr, y_ptr, row, cols, mask, C, hp, hr, NS: tl.constexpr, SOURCE: tl.constexpr,
                     RES_IN: tl.constexpr, src, t0, c0, TMA: tl.constexpr):
    """_next_streams of the chunk at channel c0, its loads through the descriptors of `src`
    (_sources) where TMA. Only a loop with tensor-core products takes them: Triton's pipeliner
    keeps such a loop's copies iterations ahead, where a loop without one would wait on each
    box before issuing the next (its masked loads are all issued before the first is used)."""
    if TMA:
        xs = ()
        for s in tl.static_range(NS):
            xs = xs + (_box(src[0], s, t0, c0),)
        y = tl.zeros_like(xs[0])
        if SOURCE == 1:
            y = _box(src[1], 0, t0, c0)
        out = _post_mix(x_ptr, xs, y, hp, hr, NS, SOURCE, RES_IN)
    else:
        out = _next_streams(x_ptr, y_ptr, row, cols, mask, C, hp, hr, NS, SOURCE, RES_IN)
    return out


@triton.jit
def _post_mix(x_ptr, xs, y, hp, hr, NS: tl.constexpr, SOURCE: tl.constexpr, RES_IN: tl.constexpr):
    """(X tiles, y tile, X_next tiles) from a chunk's X and y tiles (_next_streams)."""
    if SOURCE == 0:
        xn = xs
    else:
        xn = ()
        for t in tl.static_range(NS):
            acc = hp[t][:, None] * y
            if RES_IN == 1:
                for s in tl.static_range(NS):
                    acc += hr[t * NS + s][:, None] * xs[s]
            else:
                acc += xs[t]
            xn = xn + (acc.to(x_ptr.dtype.element_ty).to(tl.float32),)
    return xs, y, xn


@triton.jit
def _square_offsets(row, NS: tl.constexpr, NP: tl.constexpr):
    """Offsets and mask of an (BLOCK_T, NP*NP) tile of n x n matrices stored (N, NS, NS)."""
    q = tl.arange(0, NP * NP)
    a = q // NP
    b = q % NP
    return row[:, None] * (NS * NS) + (a * NS + b)[None, :], ((a < NS) & (b < NS))[None, :]


# ----- H_res on chip -----

@triton.jit
def _sinkhorn_round(Z, r, c, valid):
    """One round of log-space Sinkhorn-Knopp on exp(Z) (BLOCK_T, NP, NP), rows then columns,
    as potentials: the iterate after each step is Z - r - c. `valid` (1, NP) marks the real
    rows and columns; the padding keeps potential 0 (its Z is -inf)."""
    L = Z - r[:, :, None] - c[:, None, :]
    m = tl.where(valid, tl.max(L, axis=2), 0.0)
    r = r + tl.where(valid, m + tl.log(tl.sum(tl.exp(L - m[:, :, None]), axis=2)), 0.0)
    L = Z - r[:, :, None] - c[:, None, :]
    m = tl.where(valid, tl.max(L, axis=1), 0.0)
    c = c + tl.where(valid, m + tl.log(tl.sum(tl.exp(L - m[:, None, :]), axis=1)), 0.0)
    return r, c


@triton.jit
def _sinkhorn_logits(zB, NS: tl.constexpr, NP: tl.constexpr, BLOCK_T: tl.constexpr):
    a = tl.arange(0, NP)
    rvalid = (a < NS)[None, :]
    valid = (a[:, None] < NS) & (a[None, :] < NS)
    Z = tl.where(valid[None, :, :], tl.reshape(zB, (BLOCK_T, NP, NP)), float("-inf"))
    return Z, rvalid, valid


@triton.jit
def _mixture_weights(zB, gid, gam, lb, g: tl.constexpr):
    """c^g over the KB logit columns (0 outside group g): (1 - leak) e_0 + leak softmax(z_g),
    and the softmax itself."""
    ing = (gid == g)[None, :]
    zg = tl.where(ing, zB, float("-inf"))
    m = tl.max(zg, axis=1)
    e = tl.where(ing, tl.exp(zg - m[:, None]), 0.0)
    p = e / tl.sum(e, axis=1)[:, None]
    return gam[None, :] * p + tl.where(ing, lb[None, :], 0.0), p


@triton.jit
def _mixture_table(tab_ptr, KBX: tl.constexpr, NN: tl.constexpr):
    kb = tl.arange(0, KBX)
    q = tl.arange(0, NN)
    E = tl.load(tab_ptr + kb[:, None] * (NN + 3) + q[None, :])
    gid = tl.load(tab_ptr + kb * (NN + 3) + NN).to(tl.int32)
    gam = tl.load(tab_ptr + kb * (NN + 3) + NN + 1)
    lb = tl.load(tab_ptr + kb * (NN + 3) + NN + 2)
    return E, gid, gam, lb


@triton.jit
def _res_forward(zB, tab_ptr, RES_KIND: tl.constexpr, SK_ITERS: tl.constexpr, NUM_GROUPS: tl.constexpr,
                 NS: tl.constexpr, NP: tl.constexpr, KBX: tl.constexpr, MP: tl.constexpr, BLOCK_T: tl.constexpr):
    """H_res (BLOCK_T, NP*NP) from the res logits (BLOCK_T, KBX)."""
    if RES_KIND == 1:
        H = zB
    elif RES_KIND == 2:
        Z, rvalid, valid = _sinkhorn_logits(zB, NS, NP, BLOCK_T)
        r = tl.zeros((BLOCK_T, NP), tl.float32)
        c = tl.zeros((BLOCK_T, NP), tl.float32)
        for _ in range(SK_ITERS):
            r, c = _sinkhorn_round(Z, r, c, rvalid)
        P = tl.exp(Z - r[:, :, None] - c[:, None, :])
        H = tl.reshape(tl.where(valid[None, :, :], P, 0.0), (BLOCK_T, NP * NP))
    elif RES_KIND == 3:
        E, gid, gam, lb = _mixture_table(tab_ptr, KBX, NP * NP)
        H = tl.full((BLOCK_T, NP * NP), 1.0, tl.float32)
        for g in tl.static_range(NUM_GROUPS):
            cg, _ = _mixture_weights(zB, gid, gam, lb, g)
            # exact: each entry sums a subset of the weights (E is 0/1), in fp32 without TF32
            H = H * tl.dot(cg, E, input_precision="ieee")
    else:
        E, B = _cayley_tables(tab_ptr, KBX, MP, NP * NP)
        M, eye = _cayley_inverse(zB, E, MP, BLOCK_T)
        Q = 2.0 * M - eye
        H = tl.dot(tl.reshape(Q * Q, (BLOCK_T, MP * MP)), B, input_precision="ieee")  # the block sums
    return H


@triton.jit
def _res_backward(zB, gH, tab_ptr, RES_KIND: tl.constexpr, SK_ITERS: tl.constexpr, SK_HIST: tl.constexpr,
                  NUM_GROUPS: tl.constexpr, NS: tl.constexpr, NP: tl.constexpr, KBX: tl.constexpr,
                  MP: tl.constexpr, BLOCK_T: tl.constexpr):
    """dL/d(res logits) (BLOCK_T, KBX) from dL/dH_res (BLOCK_T, NP*NP), recomputing the map."""
    if RES_KIND == 1:
        gz = gH
    elif RES_KIND == 2:
        # The forward again, with every round's potentials kept in registers (no history in
        # memory), then the exact gradient of the iteration as run, last step first: a step
        # l -> l - logsumexp(l) over rows (columns) maps g to g - P * sum(g) over them, P the
        # exp of the step's output.
        Z, rvalid, valid = _sinkhorn_logits(zB, NS, NP, BLOCK_T)
        rounds = tl.arange(0, SK_HIST)[None, :, None]
        r = tl.zeros((BLOCK_T, NP), tl.float32)
        c = tl.zeros((BLOCK_T, NP), tl.float32)
        rh = tl.zeros((BLOCK_T, SK_HIST, NP), tl.float32)
        ch = tl.zeros((BLOCK_T, SK_HIST, NP), tl.float32)
        for k in range(SK_ITERS):
            r, c = _sinkhorn_round(Z, r, c, rvalid)
            rh = tl.where(rounds == k, r[:, None, :], rh)
            ch = tl.where(rounds == k, c[:, None, :], ch)
        g = tl.reshape(gH, (BLOCK_T, NP, NP)) * tl.exp(Z - r[:, :, None] - c[:, None, :])
        for i in range(SK_ITERS):
            k = SK_ITERS - 1 - i
            r = tl.sum(tl.where(rounds == k, rh, 0.0), axis=1)
            c = tl.sum(tl.where(rounds == k, ch, 0.0), axis=1)
            P = tl.exp(Z - r[:, :, None] - c[:, None, :])  # after the column step of round k
            g = g - P * tl.sum(g, axis=1)[:, None, :]
            c = tl.sum(tl.where(rounds == k - 1, ch, 0.0), axis=1)  # before it (0 in round 0)
            P = tl.exp(Z - r[:, :, None] - c[:, None, :])  # after the row step of round k
            g = g - P * tl.sum(g, axis=2)[:, :, None]
        gz = tl.reshape(tl.where(valid[None, :, :], g, 0.0), (BLOCK_T, NP * NP))
    elif RES_KIND == 4:
        # Q = 2M - I with M = (I + A)^-1: dQ = -2 M dA M, so dL/dA = -2 M^T (dL/dQ) M^T, and the
        # logit of pair i < j collects dL/dA[i, j] - dL/dA[j, i] (E's signs)
        E, B = _cayley_tables(tab_ptr, KBX, MP, NP * NP)
        M, eye = _cayley_inverse(zB, E, MP, BLOCK_T)
        Q = 2.0 * M - eye
        gQ = 2.0 * Q * tl.reshape(tl.dot(gH, tl.trans(B), input_precision="ieee"), (BLOCK_T, MP, MP))
        mtg = tl.sum(M[:, :, :, None] * gQ[:, :, None, :], axis=1)  # M^T gQ
        gA = -2.0 * tl.sum(mtg[:, :, None, :] * M[:, None, :, :], axis=3)  # (M^T gQ) M^T
        gz = tl.dot(tl.reshape(gA, (BLOCK_T, MP * MP)), tl.trans(E), input_precision="ieee")
    else:
        E, gid, gam, lb = _mixture_table(tab_ptr, KBX, NP * NP)
        Ms = ()
        for g in tl.static_range(NUM_GROUPS):
            cg, _ = _mixture_weights(zB, gid, gam, lb, g)
            Ms = Ms + (tl.dot(cg, E, input_precision="ieee"),)
        gz = tl.zeros((BLOCK_T, KBX), tl.float32)
        for g in tl.static_range(NUM_GROUPS):
            others = tl.full((BLOCK_T, NP * NP), 1.0, tl.float32)
            for h in tl.static_range(NUM_GROUPS):
                if h != g:
                    others = others * Ms[h]
            gc = tl.dot(gH * others, tl.trans(E), input_precision="ieee")  # dL/dc^g (BLOCK_T, KBX)
            _, p = _mixture_weights(zB, gid, gam, lb, g)
            gp = tl.where((gid == g)[None, :], gam[None, :] * gc, 0.0)
            gz += p * (gp - tl.sum(p * gp, axis=1)[:, None])
    return gz


@triton.jit
def _cayley_tables(tab_ptr, KBX: tl.constexpr, MP: tl.constexpr, NN: tl.constexpr):
    """go-mHC's tables (res_maps.OrthostochasticMap.table): the generator's signs E (KBX,
    MP*MP) and the block sums B (MP*MP, NN)."""
    kb = tl.arange(0, KBX)
    q = tl.arange(0, MP * MP)
    E = tl.load(tab_ptr + kb[:, None] * (MP * MP) + q[None, :])
    B = tl.load(tab_ptr + KBX * MP * MP + q[:, None] * NN + tl.arange(0, NN)[None, :])
    return E, B


@triton.jit
def _cayley_inverse(zB, E, MP: tl.constexpr, BLOCK_T: tl.constexpr):
    """(M = (I + A)^-1, I) for A = skew(generator logits), (BLOCK_T, MP, MP), by Gauss-Jordan
    elimination without pivoting (res_maps.OrthostochasticMap says why it needs none). The
    padding (past m) is the identity throughout."""
    A = tl.reshape(tl.dot(zB, E, input_precision="ieee"), (BLOCK_T, MP, MP))  # exact: +-one logit
    idx = tl.arange(0, MP)
    rows = idx[None, :, None]
    cols = idx[None, None, :]
    eye = tl.where(rows == cols, 1.0, 0.0)
    T = A + eye
    M = tl.zeros((BLOCK_T, MP, MP), tl.float32) + eye
    for k in tl.static_range(MP):
        row_t = tl.sum(tl.where(rows == k, T, 0.0), axis=1)
        row_m = tl.sum(tl.where(rows == k, M, 0.0), axis=1)
        pivot = tl.sum(tl.where(idx[None, :] == k, row_t, 0.0), axis=1)
        row_t = row_t / pivot[:, None]
        row_m = row_m / pivot[:, None]
        factor = tl.where(idx[None, :] == k, 0.0, tl.sum(tl.where(cols == k, T, 0.0), axis=2))
        T = tl.where(rows == k, row_t[:, None, :], T - factor[:, :, None] * row_t[:, None, :])
        M = tl.where(rows == k, row_m[:, None, :], M - factor[:, :, None] * row_m[:, None, :])
    return M, eye


# ----- the sub-layer's input -----

@triton.jit
def _pre_mix(weights, xn, dtype, NS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """u = sum_s w_s X_next[s] for one chunk, rounded to the stream dtype (as stored)."""
    u = tl.zeros((BLOCK_T, BLOCK_C), tl.float32)
    for s in tl.static_range(NS):
        u += weights[s][:, None] * xn[s]
    return u.to(dtype).to(tl.float32)


@triton.jit
def _read_pass(x_ptr, y_ptr, u_ptr, row, tmask, cols, C: tl.constexpr, hp, hr, weights, scale, STORE: tl.constexpr,
               REVERSE: tl.constexpr, NS: tl.constexpr, SOURCE: tl.constexpr, RES_IN: tl.constexpr,
               BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """A pass over the tile for the sub-layer's input: u = sum_s w_s X_next[s] per chunk, stored
    times `scale` (a per-token factor: 1, or the input norm's 1 / rms) when STORE, else only
    sum_c u^2 returned. REVERSE: last chunk first (the most recently read ones are likeliest
    still in cache after a pass in order)."""
    sq = tl.zeros((BLOCK_T,), tl.float32)
    chunks: tl.constexpr = (C + BLOCK_C - 1) // BLOCK_C
    for i in range(0, chunks):
        if REVERSE:
            cc = (chunks - 1 - i) * BLOCK_C + cols
        else:
            cc = i * BLOCK_C + cols
        mask = tmask[:, None] & (cc < C)[None, :]
        _, _, xn = _next_streams(x_ptr, y_ptr, row, cc, mask, C, hp, hr, NS, SOURCE, RES_IN)
        u = _pre_mix(weights, xn, x_ptr.dtype.element_ty, NS, BLOCK_T, BLOCK_C)
        if STORE:
            tl.store(u_ptr + row[:, None] * C + cc[None, :], (u * scale[:, None]).to(u_ptr.dtype.element_ty),
                     mask=mask)
        else:
            sq += tl.sum(u * u, axis=1)
    return sq


@triton.jit
def _read_rows(x_ptr, u_ptr, row, tmask, cols, C: tl.constexpr, weights, eps_u, NORM: tl.constexpr,
               NS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """u = sum_s w_s X[s] over whole rows (BLOCK_C >= C), through the input norm (NORM): each
    stream value is loaded once and u, only C wide, stays on chip between its sum of squares
    and its store."""
    mask = tmask[:, None] & (cols < C)[None, :]
    xs = _stream_tiles(x_ptr, row, cols, mask, C, NS)
    u = _pre_mix(weights, xs, x_ptr.dtype.element_ty, NS, BLOCK_T, BLOCK_C)
    if NORM:
        u = u * (1.0 / tl.sqrt(tl.sum(u * u, axis=1) / C + eps_u))[:, None]
    tl.store(u_ptr + row[:, None] * C + cols[None, :], u.to(u_ptr.dtype.element_ty), mask=mask)


# ----- the gates -----

@triton.jit
def _columns_a(KA: tl.constexpr, A_COLS: tl.constexpr):
    """Block A's columns: the projection's first A_COLS columns (pre | post, the head's, or all
    of an off-chip projection's), in order."""
    j = tl.arange(0, KA)
    return j, j < A_COLS


@triton.jit
def _columns_b(KBX: tl.constexpr, NS: tl.constexpr, NP: tl.constexpr, RES_KIND: tl.constexpr,
               A_COLS: tl.constexpr, K: tl.constexpr):
    """Block B's columns -> the projection's res columns: a square map's block is NP x NP (column
    t * NP + s holds logit t * n + s), the others' hold the logits in order."""
    j = tl.arange(0, KBX)
    if RES_KIND == 1 or RES_KIND == 2:
        idx = A_COLS + (j // NP) * NS + j % NP
        valid = (j // NP < NS) & (j % NP < NS)
    else:
        idx = A_COLS + j
        valid = idx < K
    return idx, valid


@triton.jit
def _project_chunk(xn, w_ptr, cc, cmask, accA, accB, ss, idxA, validA, idxB, validB, C, K: tl.constexpr,
                   KB: tl.constexpr, NS: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One chunk's share of the projection x W (tensor cores, per stream) and of sum(x^2)."""
    for s in tl.static_range(NS):
        wrow = (s * C + cc)[:, None] * K
        accA += tl.dot(xn[s], tl.load(w_ptr + wrow + idxA[None, :], mask=cmask[:, None] & validA[None, :],
                                      other=0.0), input_precision=DOT_PRECISION)
        if KB > 0:
            accB += tl.dot(xn[s], tl.load(w_ptr + wrow + idxB[None, :], mask=cmask[:, None] & validB[None, :],
                                          other=0.0), input_precision=DOT_PRECISION)
        ss += tl.sum(xn[s] * xn[s], axis=1)
    return accA, accB, ss


@triton.jit
def _logits(acc, rstd, scale_ptr, bias_ptr, idx, valid):
    """z = scale * (x W) / rms + bias on a block's columns (0 past the used ones)."""
    scale = tl.load(scale_ptr + idx, mask=valid, other=0.0)
    bias = tl.load(bias_ptr + idx, mask=valid, other=0.0)
    return acc * rstd[:, None] * scale[None, :] + bias[None, :]


@triton.jit
def _gates_forward(accA, accB, rstd, scale_ptr, bias_ptr, tab_ptr, row, tmask, hpost_out_ptr, hres_out_ptr,
                   pre_ptr, idxA, validA, idxB, validB, NS: tl.constexpr, NP: tl.constexpr, COEF: tl.constexpr,
                   RES_KIND: tl.constexpr, SK_ITERS: tl.constexpr, NUM_GROUPS: tl.constexpr, KA: tl.constexpr,
                   KBX: tl.constexpr, MP: tl.constexpr, READ_EPS: tl.constexpr, BLOCK_T: tl.constexpr):
    """Store the layer's pre-weights (read now or carried to the next seam; kept for backward),
    h_post and h_res; return the pre-weights."""
    kA = tl.arange(0, KA)
    sA = _sigmoid(_logits(accA, rstd, scale_ptr, bias_ptr, idxA, validA))
    rowA = row[:, None] * NS + kA[None, :]
    tl.store(pre_ptr + rowA, sA + READ_EPS, mask=tmask[:, None] & (kA[None, :] < NS))
    read = ()
    for s in tl.static_range(NS):
        read = read + (_column(sA, kA, s) + READ_EPS,)
    if COEF == 2:
        tl.store(hpost_out_ptr + rowA - NS, 2.0 * sA, mask=tmask[:, None] & (kA[None, :] >= NS)
                 & (kA[None, :] < 2 * NS))
        if RES_KIND > 0:
            H = _res_forward(_logits(accB, rstd, scale_ptr, bias_ptr, idxB, validB), tab_ptr, RES_KIND, SK_ITERS,
                             NUM_GROUPS, NS, NP, KBX, MP, BLOCK_T)
            offs, valid = _square_offsets(row, NS, NP)
            tl.store(hres_out_ptr + offs, H, mask=tmask[:, None] & valid)
    return read


@triton.jit
def _gates_backward(accA, accB, rstd, g_read, scale_ptr, bias_ptr, tab_ptr, row, tmask, ghpo_ptr, ghro_ptr,
                    gpre_ptr, idxA, validA, idxB, validB, NS: tl.constexpr, NP: tl.constexpr, READ: tl.constexpr,
                    COEF: tl.constexpr, RES_KIND: tl.constexpr, SK_ITERS: tl.constexpr, SK_HIST: tl.constexpr,
                    NUM_GROUPS: tl.constexpr, KA: tl.constexpr, KBX: tl.constexpr, MP: tl.constexpr,
                    HAS_GHPO: tl.constexpr, HAS_GHRO: tl.constexpr, HAS_GPRE: tl.constexpr, BLOCK_T: tl.constexpr):
    """(dL/dz of block A, of block B) from the gradients of what the forward computed from the
    logits z: the pre-weights read (g_read) or carried on (the pre output's), h_post, h_res."""
    kA = tl.arange(0, KA)
    sA = _sigmoid(_logits(accA, rstd, scale_ptr, bias_ptr, idxA, validA))
    rowA = row[:, None] * NS + kA[None, :]
    gA = tl.zeros((BLOCK_T, KA), tl.float32)
    if READ == 2:
        for s in tl.static_range(NS):
            gA = tl.where(kA[None, :] == s, g_read[s][:, None], gA)
    if HAS_GPRE:
        gA += tl.load(gpre_ptr + rowA, mask=tmask[:, None] & (kA[None, :] < NS), other=0.0)
    if COEF == 2 and HAS_GHPO:
        gA += 2.0 * tl.load(ghpo_ptr + rowA - NS, mask=tmask[:, None] & (kA[None, :] >= NS)
                            & (kA[None, :] < 2 * NS), other=0.0)
    gzA = gA * sA * (1.0 - sA)
    gzB = tl.zeros((BLOCK_T, KBX), tl.float32)
    if COEF == 2 and RES_KIND > 0 and HAS_GHRO:
        offs, valid = _square_offsets(row, NS, NP)
        gH = tl.load(ghro_ptr + offs, mask=tmask[:, None] & valid, other=0.0)
        gzB = _res_backward(_logits(accB, rstd, scale_ptr, bias_ptr, idxB, validB), gH, tab_ptr, RES_KIND,
                            SK_ITERS, SK_HIST, NUM_GROUPS, NS, NP, KBX, MP, BLOCK_T)
    return gzA, gzB


@triton.jit
def _store_columns(ptr, row, tmask, tile, idx, valid, K: tl.constexpr):
    tl.store(ptr + row[:, None] * K + idx[None, :], tile, mask=tmask[:, None] & valid[None, :])


@triton.jit
def _store_projection(proj_ptr, row, tmask, accA, accB, ss, KA: tl.constexpr, KBX: tl.constexpr):
    """The split design's hand-over from its first kernel to its second: a token's raw
    projection, both register blocks as they are, and its sum of squares ((N, KA + KBX + 1) fp32)."""
    PW: tl.constexpr = KA + KBX + 1
    a = tl.arange(0, KA)
    b = tl.arange(0, KBX)
    tl.store(proj_ptr + row[:, None] * PW + a[None, :], accA, mask=tmask[:, None])
    tl.store(proj_ptr + row[:, None] * PW + KA + b[None, :], accB, mask=tmask[:, None])
    tl.store(proj_ptr + row * PW + KA + KBX, ss, mask=tmask)


@triton.jit
def _load_projection(proj_ptr, row, tmask, KA: tl.constexpr, KBX: tl.constexpr):
    PW: tl.constexpr = KA + KBX + 1
    a = tl.arange(0, KA)
    b = tl.arange(0, KBX)
    accA = tl.load(proj_ptr + row[:, None] * PW + a[None, :], mask=tmask[:, None], other=0.0)
    accB = tl.load(proj_ptr + row[:, None] * PW + KA + b[None, :], mask=tmask[:, None], other=0.0)
    ss = tl.load(proj_ptr + row * PW + KA + KBX, mask=tmask, other=0.0)
    return accA, accB, ss


@triton.jit
def _sum_partials(part_ptr, row, tmask, N, KA: tl.constexpr, KBX: tl.constexpr, SPLITS: tl.constexpr,
                  INT64: tl.constexpr):
    """The projection from the channel splits' partial sums, added in split order (so the
    same every run: no atomics)."""
    accA, accB, ss = _load_projection(part_ptr, row, tmask, KA, KBX)
    for p in tl.static_range(1, SPLITS):
        a, b, q = _load_projection(part_ptr, _rows(p * N, INT64) + row, tmask, KA, KBX)
        accA += a
        accB += b
        ss += q
    return accA, accB, ss


# ----- the kernels -----

@triton.jit
def _tile(hpost_ptr, hres_ptr, hread_ptr, hread_st, hread_ss, N, NS: tl.constexpr, NP: tl.constexpr,
          SOURCE: tl.constexpr, RES_IN: tl.constexpr, READ: tl.constexpr, RES_KIND: tl.constexpr, K: tl.constexpr,
          A_COLS: tl.constexpr, KA: tl.constexpr, KBX: tl.constexpr, INT64: tl.constexpr, BLOCK_T: tl.constexpr,
          BLOCK_C: tl.constexpr):
    """What both seam kernels start from: the program's tokens (mask, rows), the channel
    offsets of a chunk, the projection's column maps, the post mix's coefficients and the given
    read weights."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = t < N
    row = _rows(t, INT64)
    cols = tl.arange(0, BLOCK_C)
    idxA, validA = _columns_a(KA, A_COLS)
    idxB, validB = _columns_b(KBX, NS, NP, RES_KIND, A_COLS, K)
    hp, hr = _post_coefficients(hpost_ptr, hres_ptr, row, tmask, NS, SOURCE, RES_IN, BLOCK_T)
    read = _given_read(hread_ptr, hread_st, hread_ss, row, tmask, NS, READ)
    return tmask, row, cols, idxA, validA, idxB, validB, hp, hr, read


@triton.jit
def seam_forward(x_ptr, y_ptr, hpost_ptr, hres_ptr, hread_ptr, hread_st, hread_ss, w_ptr, scale_ptr, bias_ptr,
                 tab_ptr, xout_ptr, u_ptr, hpost_out_ptr, hres_out_ptr, pre_ptr, xw_ptr, rstd_ptr, proj_ptr,
                 part_ptr, N, eps,
                 eps_u, C: tl.constexpr, NS: tl.constexpr, NP: tl.constexpr, SOURCE: tl.constexpr, RES_IN: tl.constexpr,
                 READ: tl.constexpr, COEF: tl.constexpr, RES_KIND: tl.constexpr, SK_ITERS: tl.constexpr,
                 NUM_GROUPS: tl.constexpr, K: tl.constexpr, A_COLS: tl.constexpr, KA: tl.constexpr, KB: tl.constexpr,
                 KBX: tl.constexpr, READ_EPS: tl.constexpr, WRITE_X: tl.constexpr, NORM: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, MP: tl.constexpr, INT64: tl.constexpr, PHASE: tl.constexpr,
                 SPLITS: tl.constexpr, SPLIT_C: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
                 TMA: tl.constexpr):
    tmask, row, cols, idxA, validA, idxB, validB, hp, hr, read = _tile(
        hpost_ptr, hres_ptr, hread_ptr, hread_st, hread_ss, N, NS, NP, SOURCE, RES_IN, READ, RES_KIND, K, A_COLS,
        KA, KBX, INT64, BLOCK_T, BLOCK_C)
    t0, src = _sources(x_ptr, y_ptr, N, C, NS, SOURCE, TMA, BLOCK_T, BLOCK_C)
    if PHASE == 3:  # split, third kernel: the read of X_next, whole rows (the norm's sum on chip)
        if READ == 2:
            read = _given_read(pre_ptr, NS, 1, row, tmask, NS, 1)
        _read_rows(x_ptr, u_ptr, row, tmask, cols, C, read, eps_u, NORM, NS, BLOCK_T, BLOCK_C)
    else:
        accA = tl.zeros((BLOCK_T, KA), tl.float32)
        accB = tl.zeros((BLOCK_T, KBX), tl.float32)
        ss = tl.zeros((BLOCK_T,), tl.float32)
        usq = tl.zeros((BLOCK_T,), tl.float32)
        if PHASE == 2:  # split, second kernel: the first one's partial projections of X_next, summed
            accA, accB, ss = _sum_partials(part_ptr, row, tmask, N, KA, KBX, SPLITS, INT64)
            if SPLITS > 1:  # kept for backward (one split: the first kernel wrote it there)
                _store_projection(proj_ptr, row, tmask, accA, accB, ss, KA, KBX)
        else:
            c_lo = 0
            if PHASE == 1:  # this program's channel split
                c_lo = tl.program_id(1) * SPLIT_C
            for c0 in range(0, SPLIT_C, BLOCK_C):
                cc = c_lo + c0 + cols
                cmask = cc < C
                mask = tmask[:, None] & cmask[None, :]
                _, _, xn = _next_streams_in(x_ptr, y_ptr, row, cc, mask, C, hp, hr, NS, SOURCE, RES_IN, src, t0,
                                            c_lo + c0, TMA)
                if WRITE_X:
                    for s in tl.static_range(NS):
                        tl.store(xout_ptr + row[:, None] * (NS * C) + s * C + cc[None, :],
                                 xn[s].to(xout_ptr.dtype.element_ty), mask=mask)
                if COEF > 0:
                    accA, accB, ss = _project_chunk(xn, w_ptr, cc, cmask, accA, accB, ss, idxA, validA, idxB, validB, C,
                                                    K, KB, NS, DOT_PRECISION)
                if READ == 1 and PHASE == 0:
                    u = _pre_mix(read, xn, x_ptr.dtype.element_ty, NS, BLOCK_T, BLOCK_C)
                    if NORM:
                        usq += tl.sum(u * u, axis=1)
                    else:
                        tl.store(u_ptr + row[:, None] * C + cc[None, :], u.to(u_ptr.dtype.element_ty), mask=mask)
        if PHASE == 1:  # split, first kernel: X_next and its split's partial projection only
            _store_projection(part_ptr, _rows(tl.program_id(1) * N, INT64) + row, tmask, accA, accB, ss, KA, KBX)
        else:
            _coefficients_and_read(x_ptr, y_ptr, u_ptr, scale_ptr, bias_ptr, tab_ptr, hpost_out_ptr, hres_out_ptr,
                                   pre_ptr, xw_ptr, rstd_ptr, row, tmask, cols, idxA, validA, idxB, validB, hp, hr,
                                   read, accA, accB, ss, usq, eps, eps_u, C, NS, NP, SOURCE, RES_IN, READ, COEF,
                                   RES_KIND, SK_ITERS, NUM_GROUPS, K, KA, KBX, READ_EPS, NORM, MP, PHASE, BLOCK_T,
                                   BLOCK_C)


@triton.jit
def _coefficients_and_read(x_ptr, y_ptr, u_ptr, scale_ptr, bias_ptr, tab_ptr, hpost_out_ptr, hres_out_ptr, pre_ptr,
                           xw_ptr, rstd_ptr, row, tmask, cols, idxA, validA, idxB, validB, hp, hr, read, accA, accB,
                           ss, usq, eps, eps_u, C: tl.constexpr, NS: tl.constexpr, NP: tl.constexpr,
                           SOURCE: tl.constexpr, RES_IN: tl.constexpr, READ: tl.constexpr, COEF: tl.constexpr,
                           RES_KIND: tl.constexpr, SK_ITERS: tl.constexpr, NUM_GROUPS: tl.constexpr, K: tl.constexpr,
                           KA: tl.constexpr, KBX: tl.constexpr, READ_EPS: tl.constexpr, NORM: tl.constexpr,
                           MP: tl.constexpr, PHASE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """The seam forward after its pass over the streams: the coefficients from the projection,
    then the read of X_next where it needs passes of its own (one-pass only: the split design
    reads in a kernel of its own)."""
    if COEF > 0:
        rstd = 1.0 / tl.sqrt(ss / (NS * C) + eps)
        if COEF == 1:  # the coefficients are computed off chip, from these
            _store_columns(xw_ptr, row, tmask, accA, idxA, validA, K)
            tl.store(rstd_ptr + row, rstd, mask=tmask)
        else:
            projected = _gates_forward(accA, accB, rstd, scale_ptr, bias_ptr, tab_ptr, row, tmask, hpost_out_ptr,
                                       hres_out_ptr, pre_ptr, idxA, validA, idxB, validB, NS, NP, COEF, RES_KIND,
                                       SK_ITERS, NUM_GROUPS, KA, KBX, MP, READ_EPS, BLOCK_T)
            if READ == 2:
                read = projected
    # The read weights from the projection need all of it first, and the sub-layer's input norm
    # (NORM) all of u: one or two more passes over the tile, from cache (the split design reads
    # in a kernel of its own, PHASE 3).
    if PHASE == 0:
        ones = tl.full((BLOCK_T,), 1.0, tl.float32)
        if NORM:
            if READ == 2:
                usq = _read_pass(x_ptr, y_ptr, u_ptr, row, tmask, cols, C, hp, hr, read, ones, False, True, NS,
                                 SOURCE, RES_IN, BLOCK_T, BLOCK_C)
            urstd = 1.0 / tl.sqrt(usq / C + eps_u)
            _read_pass(x_ptr, y_ptr, u_ptr, row, tmask, cols, C, hp, hr, read, urstd, True, READ == 1, NS, SOURCE,
                       RES_IN, BLOCK_T, BLOCK_C)
        elif READ == 2:
            _read_pass(x_ptr, y_ptr, u_ptr, row, tmask, cols, C, hp, hr, read, ones, True, True, NS, SOURCE, RES_IN,
                       BLOCK_T, BLOCK_C)


@triton.jit
def seam_backward(x_ptr, y_ptr, hpost_ptr, hres_ptr, hread_ptr, hread_st, hread_ss, w_ptr, scale_ptr, bias_ptr,
                  tab_ptr, xw_ptr, rstd_ptr, pre_ptr, gxo_ptr, gu_ptr, ghpo_ptr, ghro_ptr, gpre_ptr, gxw_ext_ptr,
                  grstd_ext_ptr, gx_ptr, gy_ptr, ghp_ptr, ghr_ptr, ghread_ptr, gz_ptr, gzx_ptr, gxw_ptr, xn_out_ptr,
                  proj_ptr, bridge_ptr, N, eps, eps_u, C: tl.constexpr, NS: tl.constexpr, NP: tl.constexpr,
                  SOURCE: tl.constexpr, RES_IN: tl.constexpr, READ: tl.constexpr, COEF: tl.constexpr,
                  RES_KIND: tl.constexpr, SK_ITERS: tl.constexpr, SK_HIST: tl.constexpr, NUM_GROUPS: tl.constexpr, K: tl.constexpr,
                  A_COLS: tl.constexpr, KA: tl.constexpr, KB: tl.constexpr, KBX: tl.constexpr, READ_EPS: tl.constexpr,
                  NORM: tl.constexpr, HAS_GXO: tl.constexpr, HAS_GU: tl.constexpr, HAS_GHPO: tl.constexpr,
                  HAS_GHRO: tl.constexpr, HAS_GPRE: tl.constexpr, HAS_GEXT: tl.constexpr, NEED_GHREAD: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, INT64: tl.constexpr, MP: tl.constexpr, WRITE_XN: tl.constexpr,
                  PHASE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, TMA: tl.constexpr):
    tmask, row, cols, idxA, validA, idxB, validB, hp, hr, read = _tile(
        hpost_ptr, hres_ptr, hread_ptr, hread_st, hread_ss, N, NS, NP, SOURCE, RES_IN, READ, RES_KIND, K, A_COLS,
        KA, KBX, INT64, BLOCK_T, BLOCK_C)
    t0, src = _sources(x_ptr, y_ptr, N, C, NS, SOURCE, TMA, BLOCK_T, BLOCK_C)
    if READ == 2:  # the pre-weights the forward projected and kept
        read = _given_read(pre_ptr, NS, 1, row, tmask, NS, 1)

    if PHASE == 2:
        # split, second kernel: what the first one reduced over the channels, per token
        gxwA = tl.load(gxw_ptr + row[:, None] * K + idxA[None, :], mask=tmask[:, None] & validA[None, :],
                       other=0.0)
        gxwB = tl.load(gxw_ptr + row[:, None] * K + idxB[None, :], mask=tmask[:, None] & validB[None, :],
                       other=0.0)
        coefx = tl.load(bridge_ptr + row * 3, mask=tmask, other=0.0)
        urstd = tl.load(bridge_ptr + row * 3 + 1, mask=tmask, other=0.0)
        vdot = tl.load(bridge_ptr + row * 3 + 2, mask=tmask, other=0.0)
    else:
        # A pass over the tile first, for what the rest needs whole: the projection again (nothing
        # of it is kept from the forward), the read weights' gradient dL/dw_s = sum_c g_u X_next[s]
        # when they came from it, and the input norm's (NORM) sums: with v = u / rms(u), dL/du =
        # (g_v - v mean(g_v v)) / rms(u) and dL/dw_s = (sum g_v X_s - mean(g_v v) sum v X_s) / rms(u).
        accA = tl.zeros((BLOCK_T, KA), tl.float32)
        accB = tl.zeros((BLOCK_T, KBX), tl.float32)
        ss = tl.zeros((BLOCK_T,), tl.float32)
        g_read = _zeros_tuple(NS, BLOCK_T)
        ux = _zeros_tuple(NS, BLOCK_T)
        usq = tl.zeros((BLOCK_T,), tl.float32)
        gudot = tl.zeros((BLOCK_T,), tl.float32)
        GRADS_A: tl.constexpr = HAS_GU and (NORM or READ == 2)
        if PHASE == 1 and COEF > 1:  # split: the projection the forward's first kernel handed over
            accA, accB, ss = _load_projection(proj_ptr, row, tmask, KA, KBX)
        if (COEF > 1 and PHASE == 0) or GRADS_A:
            for c0 in range(0, C, BLOCK_C):
                cc = c0 + cols
                cmask = cc < C
                mask = tmask[:, None] & cmask[None, :]
                _, _, xn = _next_streams_in(x_ptr, y_ptr, row, cc, mask, C, hp, hr, NS, SOURCE, RES_IN, src, t0, c0,
                                            TMA and COEF > 1 and PHASE == 0)  # (the projection's pass)
                if COEF > 1 and PHASE == 0:
                    accA, accB, ss = _project_chunk(xn, w_ptr, cc, cmask, accA, accB, ss, idxA, validA, idxB, validB,
                                                    C, K, KB, NS, DOT_PRECISION)
                if GRADS_A:
                    gu = tl.load(gu_ptr + row[:, None] * C + cc[None, :], mask=mask, other=0.0).to(tl.float32)
                    new_g = ()
                    for s in tl.static_range(NS):
                        new_g = new_g + (g_read[s] + tl.sum(gu * xn[s], axis=1),)
                    g_read = new_g
                    if NORM:
                        u = _pre_mix(read, xn, x_ptr.dtype.element_ty, NS, BLOCK_T, BLOCK_C)
                        usq += tl.sum(u * u, axis=1)
                        gudot += tl.sum(gu * u, axis=1)
                        new_u = ()
                        for s in tl.static_range(NS):
                            new_u = new_u + (ux[s] + tl.sum(u * xn[s], axis=1),)
                        ux = new_u
        urstd = tl.zeros((BLOCK_T,), tl.float32)
        vdot = tl.zeros((BLOCK_T,), tl.float32)
        if NORM:
            urstd = 1.0 / tl.sqrt(usq / C + eps_u)
            vdot = urstd * gudot / C  # mean(g_v v), v = u / rms(u)
            new_g = ()
            for s in tl.static_range(NS):
                new_g = new_g + (urstd * (g_read[s] - vdot * urstd * ux[s]),)
            g_read = new_g

        # The projection's gradient: dL/dz of the gates on chip (COEF > 1), or given by the caller
        # (COEF 1: the coefficients were computed off chip from the projection it wrote).
        gxwA = tl.zeros((BLOCK_T, KA), tl.float32)
        gxwB = tl.zeros((BLOCK_T, KBX), tl.float32)
        coefx = tl.zeros((BLOCK_T,), tl.float32)
        if COEF > 0:
            if COEF == 1:
                accA = tl.load(xw_ptr + row[:, None] * K + idxA[None, :], mask=tmask[:, None] & validA[None, :],
                               other=0.0)
                rstd = tl.load(rstd_ptr + row, mask=tmask, other=0.0)
            else:
                rstd = 1.0 / tl.sqrt(ss / (NS * C) + eps)
            gxwnA = tl.zeros((BLOCK_T, KA), tl.float32)
            gxwnB = tl.zeros((BLOCK_T, KBX), tl.float32)
            if COEF > 1:
                gzA, gzB = _gates_backward(accA, accB, rstd, g_read, scale_ptr, bias_ptr, tab_ptr, row, tmask, ghpo_ptr,
                                           ghro_ptr, gpre_ptr, idxA, validA, idxB, validB, NS, NP, READ, COEF, RES_KIND,
                                           SK_ITERS, SK_HIST, NUM_GROUPS, KA, KBX, MP, HAS_GHPO, HAS_GHRO, HAS_GPRE,
                                           BLOCK_T)
                # per token, for the caller's sums over tokens: dL/dbias = g_z, dL/dscale = g_z x'W
                _store_columns(gz_ptr, row, tmask, gzA, idxA, validA, K)
                _store_columns(gzx_ptr, row, tmask, gzA * accA * rstd[:, None], idxA, validA, K)
                gxwnA = gzA * tl.load(scale_ptr + idxA, mask=validA, other=0.0)[None, :]
                if KB > 0:
                    _store_columns(gz_ptr, row, tmask, gzB, idxB, validB, K)
                    _store_columns(gzx_ptr, row, tmask, gzB * accB * rstd[:, None], idxB, validB, K)
                    gxwnB = gzB * tl.load(scale_ptr + idxB, mask=validB, other=0.0)[None, :]
            # x'W = (xW) * rstd: the gradients of the raw projection and of rstd
            grstd = tl.sum(gxwnA * accA, axis=1) + tl.sum(gxwnB * accB, axis=1)
            gxwA = gxwnA * rstd[:, None]
            gxwB = gxwnB * rstd[:, None]
            if HAS_GEXT:
                gxwA += tl.load(gxw_ext_ptr + row[:, None] * K + idxA[None, :], mask=tmask[:, None] & validA[None, :],
                                other=0.0)
                grstd += tl.load(grstd_ext_ptr + row, mask=tmask, other=0.0)
            _store_columns(gxw_ptr, row, tmask, gxwA, idxA, validA, K)
            if KB > 0:
                _store_columns(gxw_ptr, row, tmask, gxwB, idxB, validB, K)
            # rstd = (sum(x^2) / D + eps)^-1/2: d rstd / dx = -rstd^3 x / D
            coefx = -grstd * rstd * rstd * rstd / (NS * C)
        if PHASE == 1:  # split, first kernel: hand the per-token reductions to the second
            tl.store(bridge_ptr + row * 3, coefx, mask=tmask)
            tl.store(bridge_ptr + row * 3 + 1, urstd, mask=tmask)
            tl.store(bridge_ptr + row * 3 + 2, vdot, mask=tmask)
            if READ == 1 and NEED_GHREAD and NORM:
                for s in tl.static_range(NS):
                    tl.store(ghread_ptr + row * NS + s, g_read[s], mask=tmask)

    if PHASE != 1:  # (split: the second kernel)
        # One pass: G = dL/dX_next from the next layer, the pre mix and the projection; then the
        # gradients of what X_next was made from.
        g_hp = _zeros_tuple(NS, BLOCK_T)
        g_hr = _zeros_tuple(NS * NS, BLOCK_T)
        g_hread = _zeros_tuple(NS, BLOCK_T)
        for c0 in range(0, C, BLOCK_C):
            cc = c0 + cols
            cmask = cc < C
            mask = tmask[:, None] & cmask[None, :]
            xs, y, xn = _next_streams_in(x_ptr, y_ptr, row, cc, mask, C, hp, hr, NS, SOURCE, RES_IN, src, t0, c0,
                                         TMA)
            if WRITE_XN:  # X_next was not kept (stream checkpoints): the weight gradient reads it from here
                for s in tl.static_range(NS):
                    tl.store(xn_out_ptr + row[:, None] * (NS * C) + s * C + cc[None, :],
                             xn[s].to(xn_out_ptr.dtype.element_ty), mask=mask)
            gu = tl.zeros((BLOCK_T, BLOCK_C), tl.float32)
            if READ > 0 and HAS_GU:
                gu = tl.load(gu_ptr + row[:, None] * C + cc[None, :], mask=mask, other=0.0).to(tl.float32)
                if NORM:  # the gradient of the normed input v, turned into u's
                    v = _pre_mix(read, xn, x_ptr.dtype.element_ty, NS, BLOCK_T, BLOCK_C) * urstd[:, None]
                    gu = urstd[:, None] * (gu - v * vdot[:, None])
            G = ()
            for s in tl.static_range(NS):
                g = tl.zeros((BLOCK_T, BLOCK_C), tl.float32)
                if HAS_GXO:
                    g += tl.load(gxo_ptr + row[:, None] * (NS * C) + s * C + cc[None, :], mask=mask,
                                 other=0.0).to(tl.float32)
                if READ > 0 and HAS_GU:
                    g += read[s][:, None] * gu
                if COEF > 0:
                    wrow = (s * C + cc)[None, :] * K
                    g += tl.dot(gxwA, tl.load(w_ptr + wrow + idxA[:, None], mask=validA[:, None] & cmask[None, :],
                                              other=0.0), input_precision=DOT_PRECISION)
                    if KB > 0:
                        g += tl.dot(gxwB, tl.load(w_ptr + wrow + idxB[:, None], mask=validB[:, None] & cmask[None, :],
                                                  other=0.0), input_precision=DOT_PRECISION)
                    g += coefx[:, None] * xn[s]
                G = G + (g,)
            if READ == 1 and NEED_GHREAD and not NORM:
                new = ()
                for s in tl.static_range(NS):
                    new = new + (g_hread[s] + tl.sum(gu * xn[s], axis=1),)
                g_hread = new
            if SOURCE == 0:
                for s in tl.static_range(NS):
                    tl.store(gx_ptr + row[:, None] * (NS * C) + s * C + cc[None, :], G[s].to(gx_ptr.dtype.element_ty),
                             mask=mask)
            else:
                gy = tl.zeros((BLOCK_T, BLOCK_C), tl.float32)
                new_hp = ()
                for t2 in tl.static_range(NS):
                    gy += hp[t2][:, None] * G[t2]
                    new_hp = new_hp + (g_hp[t2] + tl.sum(G[t2] * y, axis=1),)
                g_hp = new_hp
                tl.store(gy_ptr + row[:, None] * C + cc[None, :], gy.to(gy_ptr.dtype.element_ty), mask=mask)
                for s in tl.static_range(NS):
                    if RES_IN == 1:
                        gxs = tl.zeros((BLOCK_T, BLOCK_C), tl.float32)
                        for t2 in tl.static_range(NS):
                            gxs += hr[t2 * NS + s][:, None] * G[t2]
                    else:
                        gxs = G[s]
                    tl.store(gx_ptr + row[:, None] * (NS * C) + s * C + cc[None, :], gxs.to(gx_ptr.dtype.element_ty),
                             mask=mask)
                if RES_IN == 1:
                    new_hr = ()
                    for q in tl.static_range(NS * NS):
                        new_hr = new_hr + (g_hr[q] + tl.sum(G[q // NS] * xs[q % NS], axis=1),)
                    g_hr = new_hr
        if SOURCE == 1:
            for s in tl.static_range(NS):
                tl.store(ghp_ptr + row * NS + s, g_hp[s], mask=tmask)
            if RES_IN == 1:
                for q in tl.static_range(NS * NS):
                    tl.store(ghr_ptr + row * (NS * NS) + q, g_hr[q], mask=tmask)
        if READ == 1 and NEED_GHREAD and (PHASE == 0 or not NORM):
            if NORM:
                g_hread = g_read
            for s in tl.static_range(NS):
                tl.store(ghread_ptr + row * NS + s, g_hread[s], mask=tmask)


@triton.jit
def weight_grad(x_ptr, g_ptr, out_ptr, N, D, K: tl.constexpr, KP: tl.constexpr, STEPS: tl.constexpr,
                DOT_PRECISION: tl.constexpr, INT64: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_TT: tl.constexpr):
    """out[split, d, k] = sum over the split's tokens t of x[t, d] g[t, k]; a split is STEPS
    tiles of BLOCK_TT tokens (a compile-time count: a loop bound taken from a runtime argument
    fails in the interpreter of Triton 3.5, torch 2.9's). The loop has no branch, so that Triton
    pipelines its loads; tiles past the tokens are masked (only a last split has any)."""
    d = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)
    split = tl.program_id(1)
    dmask = d < D
    k = tl.arange(0, KP)
    kmask = k < K
    acc = tl.zeros((BLOCK_D, KP), tl.float32)
    for i in range(0, STEPS):
        t = (split * STEPS + i) * BLOCK_TT + tl.arange(0, BLOCK_TT)
        tm = t < N
        rows = _rows(t, INT64)
        xt = tl.load(x_ptr + rows[None, :] * D + d[:, None], mask=dmask[:, None] & tm[None, :], other=0.0)
        gt = tl.load(g_ptr + rows[:, None] * K + k[None, :], mask=tm[:, None] & kmask[None, :], other=0.0)
        acc += tl.dot(xt.to(tl.float32), gt, input_precision=DOT_PRECISION)
    out = out_ptr + (_rows(split, INT64) * D + d[:, None]) * K + k[None, :]
    tl.store(out, acc, mask=dmask[:, None] & kmask[None, :])
