"""Stream-collapse measures (connections/collapse.py) against direct computations on
hand-made streams and matrices, and as collect_hc_stats reports them for a model."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanochat.connections.collapse import (MEASURE_VERSION, best_assignment, effective_count, logit_range,
                                           mixing_measures, state_measures)
from nanochat.connections.diagnostics import COLLAPSE_SUMMARY, collect_hc_stats
from nanochat.gpt import GPTConfig, build_model


def gram(X):
    return X @ X.transpose(-1, -2)


def test_one_dominant_stream_gives_one_effective_stream():
    X = torch.zeros(3, 5, 4, 16)
    X[..., 2, :] = torch.randn(3, 5, 16)
    m = state_measures(gram(X))
    assert m["effective_streams"] == pytest.approx(1) and m["dominant_share"] == pytest.approx(1)
    assert m["dominant_stream"] == 2 and m["energy_share"] == pytest.approx([0, 0, 1, 0])


def test_equal_orthogonal_streams_give_n_effective_streams_and_cosine_zero():
    n = 4
    X = 3.0 * torch.eye(n, 8).expand(2, 6, n, 8)  # every token: n orthogonal streams of equal norm
    m = state_measures(gram(X))
    assert m["effective_streams"] == pytest.approx(n) and m["dominant_share"] == pytest.approx(1 / n)
    assert m["stream_cosine"] == pytest.approx(0) and m["energy_share"] == pytest.approx([1 / n] * n)


def test_copies_have_cosine_one_and_a_two_stream_split_is_its_participation_ratio():
    x = torch.randn(7, 16)
    copies = x[:, None, :].expand(7, 3, 16)
    assert state_measures(gram(copies))["stream_cosine"] == pytest.approx(1)
    # orthogonal streams, energies 1 : 3 -> shares 1/4, 3/4 -> participation ratio 1 / (1/16 + 9/16) = 1.6
    X = torch.stack([torch.eye(16)[0], math.sqrt(3) * torch.eye(16)[1]]).expand(7, 2, 16)
    assert state_measures(gram(X))["effective_streams"] == pytest.approx(1.6)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_copies_and_scaled_copies_are_one_effective_stream(n):
    """Streams that all point one way span one direction, however many and however scaled
    (a negative scale spans the same line)."""
    x = torch.randn(5, 1, 32)
    assert state_measures(gram(x.expand(5, n, 32)))["effective_streams"] == pytest.approx(1)
    scales = torch.linspace(-2, 3, n).reshape(1, n, 1)
    assert state_measures(gram(scales * x))["effective_streams"] == pytest.approx(1)


def test_copies_that_differ_by_bf16_rounding_read_one_effective_stream():
    """Copies that went through different bf16 roundings are one stream at the reports' two
    decimals: the measure is second order in the difference (collapse.spectral_participation)."""
    x = torch.randn(64, 1, 768)
    X = torch.cat([(x * (1 + 1e-3 * s)).bfloat16().float() for s in range(4)], dim=1).double()
    assert not torch.equal(X[:, 0], X[:, 1])
    assert state_measures(gram(X))["effective_streams"] == pytest.approx(1, abs=1e-4)


def test_groups_of_copies_count_as_their_number_of_directions():
    a, b, c = torch.eye(24)[:3]
    two_groups = torch.stack([a, a, b, b]).expand(3, 4, 24)
    assert state_measures(gram(two_groups))["effective_streams"] == pytest.approx(2)
    # random directions in 256 dimensions are nearly orthogonal: about 2
    u, v = torch.randn(2, 10, 1, 256).unbind(0)
    assert state_measures(gram(torch.cat([u, u, v, v], dim=1)))["effective_streams"] == pytest.approx(2, abs=0.2)
    # one direction twice and two more once: eigenvalues 2, 1, 1 -> (4)^2 / (4 + 1 + 1) = 8/3, between 1 and 4
    mixture = torch.stack([a, a, b, c]).expand(3, 4, 24)
    assert state_measures(gram(mixture))["effective_streams"] == pytest.approx(8 / 3)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 6), rank=st.integers(1, 6), seed=st.integers(0, 2**31 - 1))
def test_effective_streams_is_the_participation_ratio_of_the_singular_values(n, rank, seed):
    """Against the squared singular values of each token's n x C stream matrix, and within
    [1, the rank the streams span]."""
    g = torch.Generator().manual_seed(seed)
    rank = min(rank, n)
    X = torch.randn(4, n, rank, generator=g, dtype=torch.float64) @ torch.randn(4, rank, 12, generator=g,
                                                                                 dtype=torch.float64)
    lam = torch.linalg.svdvals(X).square()
    expected = (lam.sum(-1).square() / lam.square().sum(-1)).mean().item()
    measured = state_measures(gram(X))["effective_streams"]
    assert measured == pytest.approx(expected) and 1 - 1e-9 <= measured <= rank + 1e-9


def test_a_permutation_is_at_distance_zero_and_a_derangement_has_offdiagonal_mass_one():
    P = torch.eye(4)[[1, 2, 3, 0]].expand(5, 4, 4)
    m = mixing_measures(P)
    assert m["perm_distance"] == pytest.approx(0, abs=1e-12) and m["offdiag_mass"] == pytest.approx(1)
    assert m["identity_fro"] == pytest.approx(math.sqrt(8))
    m = mixing_measures(torch.eye(3).expand(2, 3, 3))
    assert (m["perm_distance"], m["offdiag_mass"], m["identity_fro"]) == (0, 0, 0)
    uniform = mixing_measures(torch.full((1, 4, 4), 0.25))
    assert uniform["perm_distance"] == pytest.approx(0.75) and uniform["offdiag_mass"] == pytest.approx(0.75)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 6), seed=st.integers(0, 2**31 - 1))
def test_best_assignment_is_the_best_over_all_permutations(n, seed):
    h = torch.randn(3, n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    brute = torch.stack([torch.stack([h[b, torch.arange(n), list(p)].sum() for p in itertools.permutations(range(n))]).max()
                         for b in range(3)])
    torch.testing.assert_close(best_assignment(h), brute)


def test_read_and_write_concentration():
    assert effective_count(torch.tensor([[0.0, 2.0, 0.0, 0.0]])) == pytest.approx(1)
    assert effective_count(torch.full((3, 4), 0.7)) == pytest.approx(4)
    assert effective_count(torch.tensor([[1.0, 1.0, 2.0]])) == pytest.approx(1 / (2 / 16 + 4 / 16))


def test_logit_range():
    z = torch.tensor([[[0.0, -8.0, 1.0]], [[2.0, 2.0, -2.0]]])
    assert logit_range(z) == pytest.approx((9 + 4) / 2)
    assert logit_range(None) is None


@pytest.mark.parametrize("variant", ["mhc", "kromhc", "hc_identity"])
def test_model_stats_hold_the_collapse_measures_per_layer_and_final(variant):
    cfg = GPTConfig(sequence_len=16, vocab_size=300, n_layer=2, n_head=2, n_kv_head=2, n_embd=32, hc=variant)
    stats = collect_hc_stats(build_model(cfg, "cpu"), torch.randint(0, 300, (2, 16)))
    for layer in stats["layers"]:
        assert 1 - 1e-9 <= layer["effective_streams"] <= 4 + 1e-9
        assert layer["perm_distance"] is not None and layer["read_effective"] > 1
    assert all(f"{key}_mean" in stats for key in COLLAPSE_SUMMARY)
    assert stats["collapse_version"] == MEASURE_VERSION == 2  # what the report reads (hc_stats.json, the log)
    # at init every stream is a copy of the embedding (one direction) and H_res is (close to) the identity
    assert stats["final"]["stream_cosine"] == pytest.approx(1, abs=1e-6)
    assert stats["final"]["effective_streams"] == pytest.approx(1, abs=1e-6)
    assert stats["offdiag_mass_mean"] < 2e-3 and stats["layers"][0]["effective_streams"] == pytest.approx(1)
    assert (stats["layers"][0]["res_logit_range"] is None) == (variant == "hc_identity")


def test_a_static_hc_whose_streams_stay_copies_reads_about_one_effective_stream():
    """Static HC (tests/wirings/static_hc.py) gives every stream the same F from one init: after
    20 steps its streams are still copies to within a cosine of 0.99, and they count as one
    stream, not n."""
    torch.manual_seed(0)
    cfg = GPTConfig(sequence_len=16, vocab_size=64, n_layer=2, n_head=2, n_kv_head=2, n_embd=32, hc="static_hc")
    model = build_model(cfg, "cpu")
    batch = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.8, 0.95), weight_decay=0.0)
    for _ in range(20):
        loss = model(batch[:, :-1], batch[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    stats = collect_hc_stats(model, batch[:, :-1])
    assert stats["n"] == 4 and stats["final"]["stream_cosine"] > 0.99
    assert 1 <= stats["final"]["effective_streams"] < 1.05 and stats["effective_streams_mean"] < 1.05
    # every stream holds energy (scaled copies): a count of energies alone reads close to 4
    assert min(stats["final"]["energy_share"]) > 0.15
