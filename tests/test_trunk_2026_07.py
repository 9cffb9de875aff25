"""The residual wiring on the 2026-07 trunk is nanochat 92d63d4's GPT: the same init draws
from one seed, and with the same weights and batch the same logits, loss, gradients and
optimizer step. The golden values come from nanochat's own code at that commit
(tests/goldens/upstream_gpt.py says how to regenerate them), as fingerprints
(tests/goldens/weights.py), computed in fp64 on the CPU; our model is built in fp64 to match.

Tolerances, measured (tests/goldens/weights.py `mismatch`: the largest deviation of a
fingerprint's statistics, over the golden's L1 norm):
- RTOL, for everything computed in fp64. On one CPU capability ours equals the goldens
  exactly (0.0). Across capabilities (ATEN_CPU_CAPABILITY=default against avx2, the goldens'
  own; nanochat's code against itself differs as much) the logits differ by 1.7e-16, the
  step by 4.1e-15, every gradient by at most 6.4e-15 but one: lambda_b's, a sum of 20480
  products that cancels to 2e-4 of their absolute sum, by 1.2e-13. A formula changed by
  one fp32 ulp moves the logits by 2.4e-10 (the rotary base) to 4.7e-9 (the QK scale):
  test_a_formula_changed_by_one_fp32_ulp_is_caught. 1e-11 sits 80x above the largest
  rounding (room for avx512's other sum orders) and 24x below the smallest such change.
- RTOL_INIT, for the init: nanochat draws it in fp32, and torch's fp32 normal_ kernels
  round differently by capability (2.4e-8, under one fp32 ulp, default against avx2). 1e-6
  is 40x that; a wrong std, bound or draw order moves the draws by O(1)."""

import dataclasses
import json
import os
import sys

import pytest
import torch

from nanochat import trunks
from nanochat.gpt import GPTConfig, build_model
from nanochat.optim import build_optimizer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "goldens"))
from upstream_gpt import BATCH, OPTIMIZER, SEED, SHAPE, offsets  # noqa: E402
from weights import batch, mismatch, mismatches, tensor_for  # noqa: E402

GOLDEN = json.load(open(os.path.join(os.path.dirname(__file__), "goldens", "gpt_92d63d4.json")))
RTOL = 1e-11
RTOL_INIT = 1e-6


def upstream_names(model):
    """{nanochat 92d63d4's parameter name: (our tensor, index or None)}: the same names except
    its per-layer scalar vectors, which are our residual layers' one-element scalars."""
    names = {}
    for name, p in model.named_parameters():
        if name.startswith("connections."):
            continue
        names[name] = (p, None)
    starts = model.connections.layers[::2]
    for i, layer in enumerate(starts):
        names[f"resid_lambdas.{i}"] = (layer.l_resid, 0)
        names[f"x0_lambdas.{i}"] = (layer.l_x0, 0)
    return names


def gathered(model, name, of=lambda p: p):
    """A parameter (or of(parameter)) under nanochat's name, the scalars gathered into its vectors."""
    names = upstream_names(model)
    if name in ("resid_lambdas", "x0_lambdas"):
        return torch.stack([of(names[f"{name}.{i}"][0])[0] for i in range(model.config.n_layer)])
    return of(names[name][0])


def modern_model(dtype=None):
    torch.manual_seed(SEED)
    return build_model(GPTConfig(**SHAPE, trunk="2026-07", attention="sdpa"), "cpu", dtype=dtype)


def with_golden_weights():
    model = modern_model(torch.float64)
    with torch.no_grad():
        for name in GOLDEN["init"]:
            value = tensor_for(name, tuple(GOLDEN["init"][name]["shape"]), offsets(name))
            if name in ("resid_lambdas", "x0_lambdas"):
                for i in range(model.config.n_layer):
                    upstream_names(model)[f"{name}.{i}"][0].copy_(value[i:i + 1])
            else:
                gathered(model, name).copy_(value)
    return model


def assert_matches(section, model, of=lambda p: p, rtol=RTOL):
    wrong = mismatches({name: gathered(model, name, of) for name in GOLDEN[section]}, GOLDEN[section], rtol)
    assert not wrong, f"{section}: beyond {rtol} of nanochat {GOLDEN['commit']}'s (deviation, statistic): {wrong}"


def logits_of(model):
    with torch.no_grad():
        return model(batch(SHAPE["vocab_size"], **BATCH)[0])


def test_init_draws_are_upstreams():
    assert_matches("init", modern_model(), rtol=RTOL_INIT)


def test_every_upstream_parameter_has_a_counterpart():
    model = modern_model()
    ours = sum(p.numel() for p in model.parameters())
    assert ours == sum(torch.Size(v["shape"]).numel() for v in GOLDEN["init"].values())


def test_logits_loss_and_gradients_are_upstreams():
    model = with_golden_weights()
    deviation, statistic = mismatch(logits_of(model), GOLDEN["logits"])
    assert deviation <= RTOL, (deviation, statistic)
    loss = model(*batch(SHAPE["vocab_size"], **BATCH))
    loss.backward()
    assert mismatch(loss, GOLDEN["loss"])[0] <= RTOL, (loss.item(), GOLDEN["loss"]["sum"])
    assert_matches("grads", model, of=lambda p: p.grad)


@pytest.mark.parametrize("field", ["qk_scale", "rope_base"])
def test_a_formula_changed_by_one_fp32_ulp_is_caught(monkeypatch, field):
    """The tolerance hides rounding, not formulas: the QK scale 1.2 or the rotary base 100000
    moved to the next fp32 number (1.2000002, 100000.0078) moves the logits past RTOL."""
    recipe = trunks.RECIPES["2026-07"]
    value = torch.tensor(getattr(recipe, field), dtype=torch.float32)
    nudged = torch.nextafter(value, torch.tensor(float("inf"))).item()
    monkeypatch.setitem(trunks.RECIPES, "2026-07", dataclasses.replace(recipe, **{field: nudged}))
    deviation, _ = mismatch(logits_of(with_golden_weights()), GOLDEN["logits"])
    assert deviation > 10 * RTOL, deviation


def test_one_optimizer_step_is_upstreams():
    model = with_golden_weights()
    idx, targets = batch(SHAPE["vocab_size"], **BATCH)
    model(idx, targets).backward()
    groups = model.param_groups(unembedding_lr=OPTIMIZER["unembedding_lr"], embedding_lr=OPTIMIZER["embedding_lr"],
                                matrix_lr=OPTIMIZER["matrix_lr"], weight_decay=OPTIMIZER["weight_decay"],
                                scalar_lr=OPTIMIZER["scalar_lr"], x0_betas=(0.96, 0.95))
    build_optimizer(groups, world_size=1).step()
    assert_matches("step", model)


@pytest.mark.parametrize("trunk", ["2026-01", "2026-07"])
def test_the_trunks_differ_only_where_declared(trunk):
    """The default trunk keeps 4d8dbaf's shape: no trunk scalars, half windows, base 10000."""
    model = build_model(GPTConfig(**SHAPE, trunk=trunk), "cpu")
    modern = trunk == "2026-07"
    assert bool(model.trunk_scalars()) == modern
    assert model.window_sizes[0] == (128 if modern else 256)
    assert model.transformer.h[1].attn.ve_gate.weight.shape[1] == (12 if modern else 32)
