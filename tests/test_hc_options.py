"""The options every HC variant takes beyond the paper: Learned Stream Scaling
(hc_expand = lss), DeepSeek-V4's learned head (hc_reduce = learned) and V4.1's delayed
pre-weights (hc_pre = delayed): exact parameter counts, gradients to every new parameter,
the head equal to the sum at init, what delayed pre-weights read, one compiled graph,
one error line where an option does not apply, old checkpoints, and bitwise resume."""

import dataclasses
import os
import shutil

import pytest
import torch
import torch._dynamo

from nanochat import checkpoint_manager as ckpt
from nanochat.connections.diagnostics import model_hc_params
from nanochat.connections.frame import LSS_INIT
from nanochat.gpt import GPTConfig, build_model
from test_train_e2e import base, final_state, train, train_records  # noqa: F401  (base: a fixture)

VOCAB = 300
OPTIONS = [dict(hc_expand="lss"), dict(hc_reduce="learned"), dict(hc_pre="delayed"),
           dict(hc_expand="lss", hc_pre="delayed"), dict(hc_expand="lss", hc_reduce="learned")]
VARIANTS = [dict(hc="hc"), dict(hc="hc_identity"), dict(hc="mhc"), dict(hc="mhc_lite", hc_streams=3),
            dict(hc="kromhc", hc_streams=6)]


def ids(case):
    return "-".join(f"{v}" for v in case.values())


def tiny(seed=0, n_layer=2, **fields):
    torch.manual_seed(seed)
    cfg = GPTConfig(sequence_len=16, vocab_size=VOCAB, n_layer=n_layer, n_head=2, n_kv_head=2, n_embd=32,
                    window_pattern="L", **fields)
    return build_model(cfg, "cpu")


def perturb(model, scale=0.05, seed=1):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return model


def tokens(seed=2, B=2):
    return torch.randint(0, VOCAB, (B, 16), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("variant", VARIANTS, ids=ids)
@pytest.mark.parametrize("option", OPTIONS, ids=ids)
def test_parameter_count_is_the_formula(variant, option):
    model = tiny(**variant, **option)
    cfg = model.config
    expected = model_hc_params(cfg.hc, cfg.hc_streams, cfg.n_embd, cfg.n_layer, cfg.hc_factors or None,
                               expand=cfg.hc_expand, reduce=cfg.hc_reduce, pre=cfg.hc_pre)
    assert model.param_counts()["connections"] == expected


@pytest.mark.parametrize("option", OPTIONS, ids=ids)
def test_gradients_reach_every_connection_parameter(option):
    model = perturb(tiny(hc="kromhc", **option))
    model(tokens(), tokens(3)).backward()
    for name, p in model.connections.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    if option.get("hc_pre") == "delayed":  # every layer's pre columns: applied one layer on, or by reduce
        for layer in model.connections.layers:
            assert layer.weight.grad[:, :layer.n].abs().sum() > 0


def test_learned_head_at_init_gives_the_logits_of_the_sum():
    summed = perturb(tiny(hc="mhc"))
    head = tiny(hc="mhc", hc_reduce="learned")
    missing, unexpected = head.load_state_dict(summed.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("connections.reduce.") for k in missing)
    with torch.no_grad():
        torch.testing.assert_close(head(tokens()), summed(tokens()), rtol=1e-5, atol=1e-5)


def test_lss_starts_at_its_init_with_xavier_noise():
    lss = tiny(hc="mhc", hc_expand="lss", hc_lss_init=0.6).connections.expand.lss
    bound = (6 / (lss.shape[0] + lss.shape[1])) ** 0.5
    assert lss.shape == (4, 32) and LSS_INIT == 0.6
    assert ((lss - 0.6).abs() <= bound).all() and (lss - 0.6).std() > bound / 4


def test_delayed_pre_reads_stream_zero_first_then_the_previous_layers_weights():
    conn = perturb(tiny(hc="kromhc", hc_pre="delayed"), scale=0.5).connections
    x0 = torch.randn(2, 16, 32)
    X, carry, applied, computed = conn.expand(x0), None, [], []
    with conn.capture() as captured, torch.no_grad():
        for layer in conn.layers:
            computed.append(layer.coefficients(X)[0])
            X, carry = layer.step(X, torch.tanh, x0, carry)
        out = conn.reduce(X, carry)
    applied = [rec["h_pre"] for rec in captured["layers"]]
    assert torch.equal(applied[0], torch.tensor([1.0, 0, 0, 0]).expand(2, 16, 4))
    for j in range(1, len(conn.layers)):
        torch.testing.assert_close(applied[j], computed[j - 1])
    torch.testing.assert_close(out, (computed[-1][..., None] * X).sum(-2))  # the last layer's weights fold the state
    # the pre bias of layer j puts its +1 at the home stream of layer j + 1, which applies it
    for j, layer in enumerate(tiny(hc="kromhc", hc_pre="delayed").connections.layers):
        assert int(layer.bias[:4].argmax()) == (j + 1) % 4 and int(layer.bias[4:8].argmax()) == j % 4


@pytest.mark.parametrize("option", [dict(hc_expand="lss", hc_reduce="learned"), dict(hc_pre="delayed")], ids=ids)
def test_one_graph_without_breaks(option):
    model = tiny(hc="kromhc", **option)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(tokens(), tokens(3))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@pytest.mark.parametrize("fields, message", [
    (dict(hc="residual", hc_expand="lss"), "does not apply to hc='residual'"),
    (dict(hc="residual", hc_pre="delayed"), "does not apply to hc='residual'"),
    (dict(hc="mhc", hc_reduce="learned", hc_pre="delayed"), "choose one"),
    (dict(hc="mhc", hc_expand="scaled"), "unknown hc_expand='scaled'"),
])
def test_refused_with_one_clear_error(fields, message):
    with pytest.raises(ValueError, match=message):
        tiny(**fields)


def test_checkpoints_written_before_the_options_load_as_the_paper(tmp_path):
    model = perturb(tiny(hc="kromhc"))
    saved = dataclasses.asdict(model.config)
    for name in ("hc_expand", "hc_lss_init", "hc_reduce", "hc_pre"):
        del saved[name]
    loaded = ckpt.model_from_state(saved, model.state_dict(), "cpu")
    assert (loaded.config.hc_expand, loaded.config.hc_reduce, loaded.config.hc_pre) == ("copy", "sum", "current")
    with torch.no_grad():
        assert torch.equal(loaded(tokens()), model(tokens()))


@pytest.mark.slow
@pytest.mark.parametrize("flags", [("--hc", "kromhc", "--hc-expand", "lss", "--hc-reduce", "learned"),
                                   ("--hc", "mhc", "--hc-expand", "lss", "--hc-pre", "delayed")],
                         ids=["kromhc-lss-learned", "mhc-lss-delayed"])
def test_resume_is_bitwise_with_the_options_on(base, flags):  # noqa: F811
    args = [*flags, "--num-iterations", "4", "--save-every", "2", "--model-tag", "run"]
    train(base, *args)
    # Keep the uninterrupted run aside, then leave the run as a kill after its step-2
    # checkpoint would: the later files gone, `latest` lost.
    run = os.path.join(base, "runs", "run")
    shutil.copytree(run, run + "_straight")
    for name in os.listdir(run):
        if "000004" in name or name in ("summary.json", "latest"):
            os.remove(os.path.join(run, name))
    train(base, *args, "--resume", "true")
    assert [r["loss"] for r in train_records(base, "run")] == [r["loss"] for r in train_records(base, "run_straight")]
    a, b = final_state(base, "run_straight"), final_state(base, "run")
    assert any(k.startswith("connections.expand.") for k in a) and all(torch.equal(a[k], b[k]) for k in a)
