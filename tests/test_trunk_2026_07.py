"""The residual wiring on the 2026-07 trunk is nanochat 92d63d4's GPT: the same init draws
from one seed, and with the same weights and batch the same logits, loss, gradients and
optimizer step, bitwise in fp32 on the CPU. The golden values come from nanochat's own code
at that commit (tests/goldens/upstream_gpt.py says how to regenerate them)."""

import json
import os
import sys

import pytest
import torch

from nanochat.gpt import GPTConfig, build_model
from nanochat.optim import build_optimizer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "goldens"))
from upstream_gpt import BATCH, OPTIMIZER, SEED, SHAPE, offsets  # noqa: E402
from weights import batch, digest, tensor_for  # noqa: E402

GOLDEN = json.load(open(os.path.join(os.path.dirname(__file__), "goldens", "gpt_92d63d4.json")))


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


def modern_model():
    torch.manual_seed(SEED)
    return build_model(GPTConfig(**SHAPE, trunk="2026-07", attention="sdpa"), "cpu")


def with_golden_weights():
    model = modern_model()
    with torch.no_grad():
        for name in GOLDEN["init"]:
            value = tensor_for(name, tuple(GOLDEN["init"][name]["shape"]), offsets(name))
            if name in ("resid_lambdas", "x0_lambdas"):
                for i in range(model.config.n_layer):
                    upstream_names(model)[f"{name}.{i}"][0].copy_(value[i:i + 1])
            else:
                gathered(model, name).copy_(value)
    return model


def assert_matches(section, model, of=lambda p: p):
    mismatched = [name for name, want in GOLDEN[section].items()
                  if digest(gathered(model, name, of))["sha256"] != want["sha256"]]
    detail = {name: (digest(gathered(model, name, of))["sum"], GOLDEN[section][name]["sum"]) for name in mismatched}
    assert not mismatched, f"{section}: differ from nanochat {GOLDEN['commit']} (ours, theirs): {detail}"


def test_init_draws_are_upstreams():
    assert_matches("init", modern_model())


def test_every_upstream_parameter_has_a_counterpart():
    model = modern_model()
    ours = sum(p.numel() for p in model.parameters())
    assert ours == sum(torch.Size(v["shape"]).numel() for v in GOLDEN["init"].values())


def test_logits_loss_and_gradients_are_upstreams():
    model = with_golden_weights()
    idx, targets = batch(SHAPE["vocab_size"], **BATCH)
    with torch.no_grad():
        assert digest(model(idx))["sha256"] == GOLDEN["logits"]["sha256"]
    loss = model(idx, targets)
    loss.backward()
    assert digest(loss)["sha256"] == GOLDEN["loss"]["sha256"], (loss.item(), GOLDEN["loss"]["sum"])
    assert_matches("grads", model, of=lambda p: p.grad)


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
