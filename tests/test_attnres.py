"""Block Attention Residuals: with every pseudo-query zero each read is the plain mean of its
sources; with learned queries the reads equal a plain transcription of the paper's
pseudocode (stacked sources, RMS-normed keys, softmax, weighted sum), for Full (S = 1),
Block and one-block layouts; the parameter count equals its formula; the diagnostics say
that the doubly-stochastic ones do not apply; its configuration errors."""

import math

import pytest
import torch
import torch.nn.functional as F

from nanochat import connections
from nanochat.connections.diagnostics import NOT_APPLICABLE, collect_hc_stats, model_hc_params
from nanochat.gpt import GPTConfig, build_model
from test_connections import hc_config

C = 8


def attnres_config(n_layer, block_size, norm_weight=True):
    cfg = hc_config("attnres", 0, C, n_layer=n_layer, norm_weight=norm_weight)
    cfg.attnres_block_size = block_size
    return cfg


def attnres(n_layer, block_size, norm_weight=True):
    conn = connections.build(attnres_config(n_layer, block_size, norm_weight))
    conn.init_weights()
    return conn


def recording_branches(L, seed=0):
    """L fixed random branches u -> tanh(u M_l) that record what they read."""
    g = torch.Generator().manual_seed(seed)
    mats = [torch.randn(C, C, generator=g) / math.sqrt(C) for _ in range(L)]
    seen = []

    def branch(M):
        return lambda u: seen.append(u) or torch.tanh(u @ M)

    return [branch(M) for M in mats], seen


def reference(conn, x0, branches, block_size, zero_queries=False):
    """The paper's pseudocode per module (blocks + partial, stacked, keys RMS-normed with the
    gain, softmax without temperature, weighted sum), then the final read; also returns what
    each branch read."""
    def read(sources, module):
        V = torch.stack(sources)
        if zero_queries:
            return V.mean(0)
        K = F.rms_norm(V, (C,), module.gain)
        return torch.einsum("nbt,nbtd->btd", torch.einsum("d,nbtd->nbt", module.query, K).softmax(0), V)

    blocks, partial, reads = [], x0, []
    for l, (branch, layer) in enumerate(zip(branches, conn.layers)):
        if l % block_size == 0:
            blocks.append(partial)
            partial = None
        h = read(blocks + ([partial] if partial is not None else []), layer.read)
        reads.append(h)
        y = branch(h)
        partial = y if partial is None else partial + y
    return read(blocks + [partial], conn.reduce), reads


LAYOUTS = [(3, 1), (3, 2), (3, 3), (3, 4), (2, 8)]  # (n_layer, S): Full, blocks, ragged, one block


@pytest.mark.parametrize("n_layer, block_size", LAYOUTS)
def test_zero_queries_read_the_plain_mean_of_their_sources(n_layer, block_size):
    conn = attnres(n_layer, block_size)
    x0 = torch.randn(2, 3, C)
    branches, seen = recording_branches(2 * n_layer)
    out = conn(x0, branches)
    expected, reads = reference(conn, x0, recording_branches(2 * n_layer)[0], block_size, zero_queries=True)
    assert len(seen) == len(reads) == 2 * n_layer
    for got, want in zip(seen, reads):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(seen[0], x0)  # the first module reads b_0 = x0 alone


@pytest.mark.parametrize("n_layer, block_size", LAYOUTS)
def test_learned_queries_match_the_papers_pseudocode(n_layer, block_size):
    conn = attnres(n_layer, block_size)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in conn.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    x0 = (3 * torch.randn(2, 3, C, generator=g)).requires_grad_()
    x0_ref = x0.detach().clone().requires_grad_()
    out = conn(x0, recording_branches(2 * n_layer)[0])
    expected, _ = reference(conn, x0_ref, recording_branches(2 * n_layer)[0], block_size)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    out.square().sum().backward()
    grads = {name: p.grad.clone() for name, p in conn.named_parameters()}
    conn.zero_grad()
    expected.square().sum().backward()
    torch.testing.assert_close(x0.grad, x0_ref.grad, atol=1e-5, rtol=1e-5)
    for name, p in conn.named_parameters():
        # the first read has one source (x0): a softmax over one logit, whose query and gain
        # get no gradient (the paper has and counts them all the same)
        assert (grads[name].abs().sum() > 0) == (not name.startswith("layers.0.")), name
        assert (grads[name] - p.grad).norm() <= 1e-5 * p.grad.norm(), name  # fp32, gradients up to ~100


def test_source_counts_full_and_block():
    """Full (S = 1) at L = 6: module l reads x0 and the l outputs before it. S = 2: the first
    module of a block reads the closed blocks, the second adds the partial."""
    for block_size, counts in ((1, [1, 2, 3, 4, 5, 6]), (2, [1, 2, 2, 3, 3, 4]), (3, [1, 2, 2, 2, 3, 3])):
        conn = attnres(3, block_size)
        with conn.capture() as captured:
            conn(torch.randn(1, 2, C), recording_branches(6)[0])
        assert [rec["source_weights"].shape[-1] for rec in captured["layers"]] == counts


def test_parameter_count_is_the_formula():
    assert model_hc_params("attnres", 1, 768, 12) == 25 * 2 * 768 == 38_400
    assert model_hc_params("attnres", 1, 768, 12, norm_weight=False) == 19_200
    for depth, norm_weight in ((2, True), (3, False)):
        cfg = GPTConfig(sequence_len=16, vocab_size=64, n_layer=depth, n_head=2, n_kv_head=2, n_embd=32,
                        hc="attnres", hc_norm_weight=norm_weight)
        with torch.device("meta"):
            conn = connections.build(cfg)
        assert sum(p.numel() for p in conn.parameters()) == model_hc_params("attnres", 1, 32, depth,
                                                                            norm_weight=norm_weight)


@pytest.mark.parametrize("n_layer, expected", [(12, 3), (6, 2), (20, 5), (1, 1)])
def test_default_block_size_gives_about_eight_blocks(n_layer, expected):
    cfg = GPTConfig(sequence_len=16, vocab_size=64, n_layer=n_layer, n_head=2, n_kv_head=2, n_embd=32,
                    hc="attnres")
    assert cfg.attnres_block_size == expected and cfg.hc_streams == 1
    assert math.ceil(2 * n_layer / expected) <= 8


def test_diagnostics_are_the_reads_not_doubly_stochastic_numbers():
    torch.manual_seed(0)
    model = build_model(GPTConfig(sequence_len=16, vocab_size=64, n_layer=2, n_head=2, n_kv_head=2, n_embd=32,
                                  hc="attnres", attnres_block_size=1), "cpu")
    stats = collect_hc_stats(model, torch.randint(0, 64, (2, 8)))
    assert stats["doubly_stochastic"] == NOT_APPLICABLE and "composite_row_mae" not in stats
    layers = stats["layers"]
    assert [len(l["source_weights"]) for l in layers] == [1, 2, 3, 4]
    assert layers[3]["source_weights"] == pytest.approx([0.25] * 4)  # plain mean at init
    assert layers[3]["entropy"] == pytest.approx(math.log(4))


@pytest.mark.parametrize("overrides, message", [
    (dict(hc_streams=4), "has no streams"),
    (dict(attnres_block_size=-1), "whole number of modules"),
    (dict(hc_recompute=True), "hc_recompute=True does not apply to hc='attnres'"),
    (dict(hc_kernels="liger"), "does not run hc='attnres'"),
    (dict(hc_reduce="learned"), "does not apply to hc='attnres'"),
    (dict(hc_alpha_shared=False), "only applies to hc='kromhc'"),
])
def test_bad_configurations_are_one_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(sequence_len=16, vocab_size=64, n_layer=1, n_head=2, n_kv_head=2, n_embd=32, hc="attnres",
                  **overrides)


def test_block_size_belongs_to_attnres():
    with pytest.raises(ValueError, match="attnres_block_size=2 only applies to hc='attnres'"):
        GPTConfig(sequence_len=16, vocab_size=64, n_layer=1, n_head=2, n_kv_head=2, n_embd=32, hc="mhc",
                  attnres_block_size=2)
