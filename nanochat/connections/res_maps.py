"""How an HC layer's res logits become H_res: one declaration per variant, which both the
PyTorch path and the fused kernels (fused.py) read.

Every variant of the HC family computes H_pre and H_post alike (hc_layer.HyperConnection.gates);
they differ in the map from the R res logits z = a_res * x'W_res + b_res to the n x n H_res.
A layer holds one `ResMap` (`layer.res_map`); its `forward(z)` is the PyTorch form, and
`kind` names the form the fused kernels compute on chip (None: none, the coefficients are
then computed by `forward` between two kernels, one more read of the streams):

  kind           map                                                        variants
  "identity"     H_res = I (no res logits)                                  hc_identity
  "free"         H_res = mat(z), column t*n + s at H_res[t, s]              hc
  "sinkhorn"     Sinkhorn-Knopp of exp(mat(z)), log space (birkhoff.py)    mhc
  "permutations" H_res = U^K kron ... kron U^1, U^g = sum_m c^g_m P^g_m,     mhc_lite (one group, all
                 c^g = (1 - leak_g) e_0 + leak_g softmax(z_g) over group g    n! permutations), kromhc
                                                                            (a group per factor),
                                                                            cmhc (the n cyclic shifts,
                                                                            leak gamma)
  "cayley"       the orthostochastic map of a Cayley transform               go_mhc (m = n s <= 8)
  None           anything PyTorch computes                                  go_mhc beyond m = 8

A new variant needs no kernel code: a ResMap with kind None runs fused, with its
coefficients in PyTorch. Declaring one of the kinds above puts them on chip.

The kernels read the res logits into a register block of KB columns (`kernel_width`): the
n^2 logits at t * NP + s for "free" and "sinkhorn" (NP = `kernel_np(n)`, n rounded up to a
power of two and at least 4, so that the block reshapes to NP x NP and fills the 16 columns
a tensor-core product needs), the R logits in order for the others. For "permutations" they also
read `table()`: per logit column m, the expanded permutation E[m, t * NP + s] = P^g_m[t_g,
s_g] (t_g, s_g: the digits of t and s that factor g acts on), its group, its leak and the
leak's weight on e_0; H_res is then prod_g (c^g @ E) elementwise, which is the Kronecker
product. The identity permutation comes first in every group (birkhoff.permutation_matrices
and `cyclic_shifts`), which is where the leak puts its weight.
"""

import math

import torch
from torch import nn

from nanochat.connections.birkhoff import (convex_permutations, kron_factors, orthostochastic, permutation_matrices,
                                          sinkhorn_log)

KINDS = ("identity", "free", "sinkhorn", "permutations", "cayley")


def next_power_of_two(n):
    return 1 << max(0, n - 1).bit_length()


def kernel_np(n):
    """The side of the padded n x n matrices in the kernels (see the module docstring)."""
    return max(4, next_power_of_two(n))


def cyclic_shifts(n, device=None, dtype=torch.float32):
    """The n powers of the cyclic shift Pi (stream t receives stream t - 1 mod n), (n, n, n):
    Pi^k[t, s] = [s = t - k mod n], the identity first."""
    k, t, s = (torch.arange(n, device=device).view(shape) for shape in ((n, 1, 1), (1, n, 1), (1, 1, n)))
    return ((s - t + k) % n == 0).to(dtype)


class ResMap(nn.Module):
    """The map from res logits (..., R) to H_res (..., n, n), fp32; see the module docstring."""

    kind = None
    identity = False  # H_res is the identity: the post mix adds X instead of multiplying by H_res

    def __init__(self, n):
        super().__init__()
        self.n = n

    def logit_count(self):
        raise NotImplementedError

    def init_buffers(self):
        """Fill the non-persistent buffers (the model is built on the meta device)."""

    def kernel_width(self):
        """KB, the columns of the kernels' res block (0: none)."""
        raise NotImplementedError

    def table(self):
        """The constants the kernels read besides the logits (None: none)."""
        return None


class IdentityMap(ResMap):
    kind = "identity"
    identity = True

    def logit_count(self):
        return 0

    def forward(self, logits):
        eye = torch.eye(self.n, device=logits.device, dtype=logits.dtype)
        return eye.expand(*logits.shape[:-1], self.n, self.n)

    def kernel_width(self):
        return 0


class SquareMap(ResMap):
    """A map of n^2 logits laid out as the n x n matrix."""

    def logit_count(self):
        return self.n * self.n

    def kernel_width(self):
        return kernel_np(self.n) ** 2


class FreeMap(SquareMap):
    kind = "free"

    def forward(self, logits):
        return logits.unflatten(-1, (self.n, self.n))


class SinkhornMap(SquareMap):
    kind = "sinkhorn"

    def __init__(self, n, iters):
        super().__init__(n)
        self.iters = iters

    def forward(self, logits):
        return sinkhorn_log(logits.unflatten(-1, (self.n, self.n)), self.iters)


class PermutationMixture(ResMap):
    """H_res = U^K kron ... kron U^1 over groups g = 1..K (U^1 on the fastest digit of the
    stream index), U^g = sum_m c^g_m P^g_m with c^g = (1 - leak_g) e_0 + leak_g softmax(z_g).
    `groups`: (size i_g, "all" for the i_g! permutations or "cyclic" for the i_g shifts,
    leak_g) per group."""

    kind = "permutations"

    def __init__(self, n, groups):
        super().__init__(n)
        self.groups = [(i, family, float(leak)) for i, family, leak in groups]
        if math.prod(i for i, _, _ in self.groups) != n:
            raise ValueError(f"permutation groups of sizes {[i for i, _, _ in self.groups]} do not multiply to n={n}")
        self.sizes = [self.count(i, family) for i, family, _ in self.groups]
        # One (count, i*i) buffer per distinct (size, family), filled by init_buffers.
        for key in sorted({(i, family) for i, family, _ in self.groups}):
            self.register_buffer(self.buffer_name(*key), torch.empty(self.count(*key), key[0] ** 2), persistent=False)

    @staticmethod
    def count(i, family):
        return math.factorial(i) if family == "all" else i

    @staticmethod
    def buffer_name(i, family):
        return f"perms_{i}" if family == "all" else f"shifts_{i}"

    def perms(self, i, family):
        return getattr(self, self.buffer_name(i, family))

    def logit_count(self):
        return sum(self.sizes)

    @torch.no_grad()
    def init_buffers(self):
        for i, family in {(i, family) for i, family, _ in self.groups}:
            buf = self.perms(i, family)
            build = permutation_matrices if family == "all" else cyclic_shifts
            buf.copy_(build(i, device=buf.device).flatten(1))

    def weights(self, logits):
        """[c^1, ..., c^K]: each group's weights on its permutations, (..., count_g)."""
        out, start = [], 0
        for (_, _, leak), m in zip(self.groups, self.sizes):
            c = torch.softmax(logits[..., start:start + m], dim=-1)
            if leak != 1.0:
                c = leak * c
                c = torch.cat([c[..., :1] + (1 - leak), c[..., 1:]], dim=-1)
            out.append(c)
            start += m
        return out

    def factors(self, logits):
        """[U^1, ..., U^K], each (..., i_g, i_g)."""
        return [convex_permutations(c, self.perms(i, family)).unflatten(-1, (i, i))
                for c, (i, family, _) in zip(self.weights(logits), self.groups)]

    def forward(self, logits):
        return kron_factors(self.factors(logits))

    def kernel_width(self):
        return max(16, next_power_of_two(self.logit_count()))

    def table(self):
        """(KB, NP*NP + 3) fp32: per logit column m, E[m] (the expanded permutation), then its
        group, its leak, and the leak's weight on e_0 (1 - leak at a group's first column, else 0).
        Padding columns: group -1."""
        n, NP, KB = self.n, kernel_np(self.n), self.kernel_width()
        device = self.perms(*self.groups[0][:2]).device
        tab = torch.zeros(KB, NP * NP + 3, device=device)
        tab[:, NP * NP] = -1
        t = torch.arange(n, device=device)
        stride, row = 1, 0
        for g, ((i, family, leak), m) in enumerate(zip(self.groups, self.sizes)):
            digit = (t // stride) % i  # the digit of each stream index that this group acts on
            P = self.perms(i, family).view(m, i, i)
            E = P[:, digit[:, None], digit[None, :]]  # (m, n, n)
            block = torch.zeros(m, NP, NP, device=device)
            block[:, :n, :n] = E
            tab[row:row + m, :NP * NP] = block.flatten(1)
            tab[row:row + m, NP * NP] = g
            tab[row:row + m, NP * NP + 1] = leak
            tab[row, NP * NP + 2] = 1 - leak
            stride *= i
            row += m
        return tab


class OrthostochasticMap(ResMap):
    """go-mHC's map (birkhoff.orthostochastic): A = skew(logits) (m x m, m = n s), Q = (I - A)(I +
    A)^-1, H_res = (1/s) times the s x s block sums of Q o Q. On chip ("cayley") while m <= 8:
    the kernels invert I + A by Gauss-Jordan elimination (no pivoting needed: x^T (I + A) x =
    |x|^2, so every leading block is invertible and I + A is well conditioned), with the
    generator's signs and the block sums as 0/+-1 and 0/(1/s) tables (`table`). Beyond m = 8
    in PyTorch (kind None): an m x m tile per token would not fit the registers."""

    MAX_ON_CHIP = 8

    def __init__(self, n, s):
        super().__init__(n)
        self.s = s
        self.m = n * s
        self.kind = "cayley" if self.m <= self.MAX_ON_CHIP else None
        if self.kind:  # filled by init_buffers (the model is built on the meta device)
            self.register_buffer("tables", torch.empty(self.table_size()), persistent=False)

    def table_size(self):
        MP, NP = cayley_pad(self.m), kernel_np(self.n)
        return self.kernel_width() * MP * MP + MP * MP * NP * NP

    @torch.no_grad()
    def init_buffers(self):
        if self.kind:
            self.tables.copy_(self.build_tables())

    def logit_count(self):
        return self.m * (self.m - 1) // 2

    def forward(self, logits):
        return orthostochastic(logits, self.n, self.s)

    def kernel_width(self):
        return max(16, next_power_of_two(self.logit_count()))

    def table(self):
        return self.tables if self.kind else None

    def build_tables(self):
        """Two tables, flattened one after the other (MP = cayley_pad(m), NP = kernel_np(n)):
        E (KB, MP*MP), +1 at (i, j) and -1 at (j, i) for the k-th generator logit's pair i < j
        (birkhoff.skew_symmetric's order); B (MP*MP, NP*NP), 1/s from Q entry (i, j) to H_res
        entry (i // s, j // s) for i, j < m."""
        m, s, MP, NP = self.m, self.s, cayley_pad(self.m), kernel_np(self.n)
        rows, cols = torch.triu_indices(m, m, offset=1)
        E = torch.zeros(self.kernel_width(), MP, MP)
        k = torch.arange(rows.numel())
        E[k, rows, cols] = 1.0
        E[k, cols, rows] = -1.0
        i = torch.arange(m)
        B = torch.zeros(MP, MP, NP, NP)
        B[i[:, None], i[None, :], (i // s)[:, None], (i // s)[None, :]] = 1.0 / s
        return torch.cat([E.flatten(), B.flatten()])


def cayley_pad(m):
    """The side of go-mHC's padded m x m tiles in the kernels (a power of two, at least 4)."""
    return max(4, next_power_of_two(m))
