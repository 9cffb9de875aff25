"""Parameter accounting against built layers and the paper's Table 2, the doubly-stochastic
measures, and the Figure-2 composite diagnostic on tiny GPTs of every variant."""

import json
import math

import pytest
import torch

from nanochat import connections
from nanochat.connections.diagnostics import (collect_hc_stats, composite_product, composite_stats, ds_errors,
                                              hc_layer_params, model_hc_params)
from nanochat.gpt import GPTConfig, build_model, norm
from nanochat.report.paper import MAIN, N_SCALING_DELTA_PARAMS_M, PAPER_DEPTHS, PAPER_STREAMS

VARIANTS = ("residual", "hc", "hc_identity", "mhc", "mhc_lite", "kromhc", "go_mhc", "frac")
VOCAB = 64


def tiny_gpt(hc, n_layer=2, **kw):
    # Seeded: the init must not depend on what ran before in the same process (pytest-xdist
    # runs several files in one worker), or thresholds like "really mixing" turn flaky.
    torch.manual_seed(0)
    cfg = GPTConfig(sequence_len=16, vocab_size=VOCAB, n_layer=n_layer, n_head=2, n_kv_head=2, n_embd=32, hc=hc, **kw)
    return build_model(cfg, "cpu")


def perturb_connections(model, scale, seed=0):
    """Connection parameters far from init: x'W ~ N(0, scale^2), alphas 1, random biases."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.connections.layers:
            for name, p in layer.named_parameters():
                if name == "weight":
                    p.copy_(torch.randn(p.shape, generator=g) * scale / math.sqrt(p.shape[0]))
                elif name == "alpha":
                    p.fill_(1.0)
                else:
                    p.add_(torch.randn(p.shape, generator=g) * 0.5)
    return model


# ----- parameter accounting -----

LAYOUTS = [
    *[(v, n, None) for v in ("hc", "hc_identity", "mhc", "kromhc", "go_mhc") for n in (2, 3, 4, 6, 8, 12, 16)],
    *[("mhc_lite", n, None) for n in (2, 3, 4, 5, 6)],
    ("kromhc", 8, [4, 2]), ("kromhc", 12, [4, 3]), ("kromhc", 6, [2, 3]),
]


# one a_res per factor is a kromhc option; the other variants refuse it (test_connections)
@pytest.mark.parametrize("variant, n, factors, alpha_shared",
                         [(*layout, True) for layout in LAYOUTS] + [(*l, False) for l in LAYOUTS if l[0] == "kromhc"])
@pytest.mark.parametrize("norm_weight", (True, False))
def test_layer_formula_equals_numel(variant, n, factors, alpha_shared, norm_weight):
    C = 16
    cfg = GPTConfig(sequence_len=8, vocab_size=VOCAB, n_layer=1, n_head=1, n_kv_head=1, n_embd=C, hc=variant,
                    hc_streams=n, hc_factors=factors or [], hc_norm_weight=norm_weight, hc_alpha_shared=alpha_shared)
    with torch.device("meta"):
        conn = connections.build(cfg)
    for layer in conn.layers:
        numel = sum(p.numel() for p in layer.parameters())
        assert numel == hc_layer_params(variant, n, C, factors, norm_weight=norm_weight, alpha_shared=alpha_shared)
    total = sum(p.numel() for p in conn.parameters())
    assert total == model_hc_params(variant, n, C, 1, factors, norm_weight=norm_weight, alpha_shared=alpha_shared)


def test_formula_terms():
    """The HC layer formula nC(2n+R) + (2n+R) + 3 + nC, spelled out once per R."""
    n, C = 4, 768
    for variant, R in (("mhc", 16), ("hc", 16), ("mhc_lite", 24), ("kromhc", 4)):
        assert hc_layer_params(variant, n, C) == n * C * (2 * n + R) + (2 * n + R) + 3 + n * C
        assert hc_layer_params(variant, n, C, norm_weight=False) == n * C * (2 * n + R) + (2 * n + R) + 3
    assert hc_layer_params("hc_identity", n, C) == n * C * 2 * n + 2 * n + 2 + n * C
    # one a_res per factor adds K - 1 scalars
    assert hc_layer_params("kromhc", 8, C, alpha_shared=False) == hc_layer_params("kromhc", 8, C) + 2


def test_residual_counts_two_scalars_per_block():
    model = tiny_gpt("residual", n_layer=3)
    assert sum(p.numel() for p in model.connections.parameters()) == model_hc_params("residual", 1, 32, 3) == 6


@pytest.mark.parametrize("depth", PAPER_DEPTHS)
@pytest.mark.parametrize("variant", ("mhc", "mhc_lite", "kromhc"))
def test_paper_table2_counts_within_0p3_percent(depth, variant):
    C = {6: 384, 12: 768}[depth]
    ours = model_hc_params(variant, PAPER_STREAMS, C, depth)
    paper = MAIN[(depth, variant)].delta_params_k * 1000
    assert abs(ours - paper) / paper < 0.003


def test_paper_n4_scaling_entry():
    ours = model_hc_params("kromhc", 4, 768, 12)
    assert abs(ours / 1e6 - N_SCALING_DELTA_PARAMS_M[4]) / N_SCALING_DELTA_PARAMS_M[4] < 0.003


@pytest.mark.parametrize("args, message", [
    (("dense", 4, 8), "unknown hyper-connection variant"),
    (("mhc", 1, 8), "n >= 2"),
    (("kromhc", 8, 8, [2, 2]), "multiply to 4"),
    (("kromhc", 7, 8), "nearby n"),
    (("mhc", 4, 8, [2, 2]), "only apply to kromhc"),
])
def test_accounting_rejects_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        hc_layer_params(*args)


# ----- per-layer and composite measures -----

def test_ds_errors_on_known_matrices():
    h = torch.tensor([[[0.5, 0.5], [0.25, 0.5]]])
    err = ds_errors(h)
    assert err["row_err"] == pytest.approx(0.25) and err["col_err"] == pytest.approx(0.25)
    assert err["min_entry"] == 0.25
    assert ds_errors(torch.eye(3)[None]) == {"row_err": 0.0, "col_err": 0.0, "min_entry": 0.0}


def test_composite_is_the_forward_order_product():
    g = torch.Generator().manual_seed(0)
    hs = [torch.rand(5, 3, 3, generator=g) for _ in range(4)]
    P = composite_product(hs)
    assert P.dtype == torch.float64
    expected = hs[3].double() @ hs[2].double() @ hs[1].double() @ hs[0].double()
    torch.testing.assert_close(P, expected)


def test_composite_stats_by_hand():
    # One token: rows sum to (3, 1), columns to (2, 2); entries include a negative one.
    P = torch.tensor([[[1.0, 2.0], [1.0, 0.0]]], dtype=torch.float64)
    s = composite_stats(P)
    assert s["composite_row_mae"] == pytest.approx((2 + 0) / 2)
    assert s["composite_col_mae"] == pytest.approx((1 + 1) / 2)
    assert s["fwd_gain"] == 3 and s["bwd_gain"] == 2
    N = torch.tensor([[[1.0, -1.0], [0.0, 1.0]]], dtype=torch.float64)
    assert composite_stats(N)["fwd_gain"] == 2  # absolute values count
    two = torch.cat([P, torch.eye(2, dtype=torch.float64)[None]])
    s2 = composite_stats(two)
    assert s2["composite_row_mae"] == pytest.approx(0.5) and s2["composite_row_mae_max"] == pytest.approx(1.0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_hc_stats_on_a_tiny_gpt(variant):
    model = tiny_gpt(variant)
    idx = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    stats = collect_hc_stats(model, idx)
    json.dumps(stats, allow_nan=False)
    n = model.connections.n
    assert stats["variant"] == variant and stats["n"] == n and stats["tokens"] == 32
    assert len(stats["layers"]) == 2 * model.config.n_layer
    for key in ("composite_col_mae", "composite_row_mae", "fwd_gain", "bwd_gain"):
        assert math.isfinite(stats[key])
    layer = stats["layers"][0]
    assert {"row_err", "col_err", "min_entry", "stream_rms", "h_pre_mean", "h_post_mean"} <= set(layer)
    assert len(layer["stream_rms"]) == n
    assert all(l.capture is None for l in model.connections.layers)  # capture mode switched off again
    if variant != "residual":
        # at init every variant is (close to) identity mixing: errors at fp32 rounding (go_mhc:
        # that of an m x m inverse per layer)
        rounding = 1e-5 if variant == "go_mhc" else 1e-6
        assert stats["composite_col_mae"] < rounding and stats["composite_row_mae"] < rounding


def test_capture_records_the_coefficients_the_forward_used():
    model = perturb_connections(tiny_gpt("kromhc"), 1.0)
    idx = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    with model.connections.capture() as captured, torch.no_grad():
        model(idx)
    records = captured["layers"]
    X0 = model.connections.expand(norm(model.transformer.wte(idx)))
    h_pre, h_post, h_res = model.connections.layers[0].coefficients(X0)
    torch.testing.assert_close(records[0]["h_res"], h_res)
    torch.testing.assert_close(records[0]["h_pre"], h_pre)
    assert records[0]["stream_rms"].shape == (4,)
    assert all(rec["h_res"].shape == (2, 16, 4, 4) for rec in records)


@pytest.mark.parametrize("variant, rounding", [("mhc_lite", 1e-6), ("kromhc", 1e-6), ("go_mhc", 1e-5)])
def test_birkhoff_composites_stay_exact_far_from_init(variant, rounding):
    """Exact by construction: to fp32 rounding (go_mhc: of an m x m inverse per layer)."""
    model = perturb_connections(tiny_gpt(variant, n_layer=3), 3.0)
    stats = collect_hc_stats(model, torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(2)))
    assert stats["composite_col_mae_max"] < rounding and stats["composite_row_mae_max"] < rounding
    assert stats["fwd_gain"] == pytest.approx(1, abs=rounding) and stats["bwd_gain"] == pytest.approx(1, abs=rounding)
    assert max(l["identity_dist"] for l in stats["layers"]) > 0.1  # really mixing, not identity


def test_mhc_composite_is_exact_on_columns_only():
    model = perturb_connections(tiny_gpt("mhc", n_layer=3), 6.0)
    stats = collect_hc_stats(model, torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(3)))
    assert stats["composite_col_mae"] < 1e-6
    assert stats["composite_row_mae"] > 1e-3
    assert stats["max_layer_row_err"] > 1e-3 and stats["max_layer_col_err"] < 1e-6


def test_hc_composite_drifts_once_trained_away_from_identity():
    model = perturb_connections(tiny_gpt("hc", n_layer=3), 3.0)
    stats = collect_hc_stats(model, torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(4)))
    assert stats["composite_col_mae"] > 1e-2 and stats["composite_row_mae"] > 1e-2
    assert stats["fwd_gain"] > 1.5


def test_residual_composite_is_the_product_of_the_stream_scales():
    model = tiny_gpt("residual", n_layer=3)
    with torch.no_grad():
        for j, layer in enumerate(model.connections.layers[::2]):
            layer.l_resid.fill_(0.5 + j)
    stats = collect_hc_stats(model, torch.randint(0, VOCAB, (1, 8)))
    assert stats["fwd_gain"] == pytest.approx(0.5 * 1.5 * 2.5)
    assert stats["composite_col_mae"] == pytest.approx(abs(0.5 * 1.5 * 2.5 - 1))
