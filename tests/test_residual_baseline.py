"""The paper's Residual row is nanochat's baseline: its two per-block scalars in their own
AdamW groups at nanochat's LRs, and value embeddings one flag away (the paper's model sizes)."""

import dataclasses

import pytest
import torch

from nanochat import checkpoint_manager as ckpt
from nanochat.gpt import GPTConfig, build_model, has_value_embedding, model_config_from_depth
from nanochat.optim import build_optimizer
from nanochat.report import paper

VOCAB = 300


def tiny_config(**kw):
    base = dict(sequence_len=32, vocab_size=VOCAB, n_layer=4, n_head=4, n_kv_head=2, n_embd=64, window_pattern="SL")
    return GPTConfig(**{**base, **kw})


def scalar_groups(model, **lrs):
    groups = model.param_groups(**lrs)
    return {g["name"]: g for g in groups if g["name"].startswith("hc")}, groups


def test_residual_groups_are_nanochats():
    """nanochat 4d8dbaf (gpt.py setup_optimizer): resid at scalar_lr * 0.01, x0 at scalar_lr,
    each its own AdamW group without weight decay; never Muon."""
    model = build_model(tiny_config(), "cpu")
    starts = model.connections.layers[::2]
    by_name, groups = scalar_groups(model, scalar_lr=0.5, x0_betas=(0.96, 0.95))
    assert set(by_name) == {"hc_resid", "hc_x0"}
    resid, x0 = by_name["hc_resid"], by_name["hc_x0"]
    assert [id(p) for p in resid["params"]] == [id(layer.l_resid) for layer in starts]
    assert [id(p) for p in x0["params"]] == [id(layer.l_x0) for layer in starts]
    assert len(resid["params"]) == len(x0["params"]) == model.config.n_layer
    assert resid["lr"] == pytest.approx(0.005) and x0["lr"] == 0.5
    assert resid["betas"] == (0.8, 0.95) and x0["betas"] == (0.96, 0.95)
    assert resid["kind"] == x0["kind"] == "adamw" and resid["weight_decay"] == x0["weight_decay"] == 0.0
    muon = {id(p) for g in groups if g["kind"] == "muon" for p in g["params"]}
    assert not muon & {id(p) for p in model.connections.parameters()}
    # Init as the paper's appendix: l_resid = 1, l_x0 = 0.
    assert all(layer.l_resid.item() == 1.0 and layer.l_x0.item() == 0.0 for layer in starts)


def test_hc_variants_ignore_scalar_lr():
    model = build_model(tiny_config(hc="mhc"), "cpu")
    by_name, _ = scalar_groups(model, hc_lr=0.007, scalar_lr=123.0)
    assert list(by_name) == ["hc"] and by_name["hc"]["lr"] == 0.007


def test_one_adam_step_moves_x0_a_hundred_times_further_than_resid():
    model = build_model(tiny_config(), "cpu")
    starts = model.connections.layers[::2]
    _, groups = scalar_groups(model)
    optimizer = build_optimizer(groups, world_size=1)
    before = [(layer.l_resid.item(), layer.l_x0.item()) for layer in starts]
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    for layer in starts:
        layer.l_resid.grad.fill_(1.0)
        layer.l_x0.grad.fill_(1.0)
    optimizer.step()
    for layer, (r0, x0) in zip(starts, before):
        moved_resid, moved_x0 = abs(layer.l_resid.item() - r0), abs(layer.l_x0.item() - x0)
        assert moved_resid > 0
        assert moved_x0 / moved_resid == pytest.approx(100, rel=1e-4)


def test_base_train_scales_both_scalar_lrs_with_the_batch():
    """The batch-size LR factor applies to both scalar groups, as to every other group."""
    from nanochat.train_config import parse_args

    args = parse_args(["--scalar-lr", "0.5", "--total-batch-size", str(2**17)])
    scale = (args.total_batch_size / 2**19) ** 0.5
    model = build_model(tiny_config(), "cpu")
    by_name, _ = scalar_groups(model, scalar_lr=args.scalar_lr * scale, x0_betas=(args.x0_beta1, 0.95))
    assert by_name["hc_x0"]["lr"] == pytest.approx(0.25) and by_name["hc_resid"]["lr"] == pytest.approx(0.0025)
    assert by_name["hc_x0"]["betas"] == (0.8, 0.95)  # the paper's betas by default


def test_value_embeds_off_removes_exactly_those_parameters():
    on = build_model(tiny_config(), "cpu")
    off = build_model(tiny_config(value_embeds=False), "cpu")
    c_on, c_off = on.param_counts(), off.param_counts()
    cfg = on.config
    kv_dim = cfg.n_kv_head * (cfg.n_embd // cfg.n_head)
    layers = [i for i in range(cfg.n_layer) if has_value_embedding(i, cfg)]
    tables = len(layers) * on.padded_vocab_size * kv_dim
    gates = len(layers) * 32 * cfg.n_kv_head  # the per-head gate reads the first 32 channels
    assert c_on["value_embeds"] == tables and c_off["value_embeds"] == 0
    assert c_on["total"] - c_off["total"] == tables + gates
    assert c_on["transformer_matrices"] - c_off["transformer_matrices"] == gates
    assert not any("value_embeds" in name or "ve_gate" in name for name, _ in off.named_parameters())


def test_model_without_value_embeds_trains():
    torch.manual_seed(0)
    model = build_model(tiny_config(value_embeds=False), "cpu")
    optimizer = build_optimizer(model.param_groups(), world_size=1)
    idx = torch.randint(0, VOCAB, (4, 33), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(8):
        loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        optimizer.step()
        model.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5


@pytest.mark.parametrize("depth", paper.PAPER_DEPTHS)
def test_layouts_match_nanochat_and_the_paper_sizes(depth):
    """nanochat at the pin (32K vocab, value embeddings) has 73.5M / 286.3M parameters; a
    65,536 vocab without value embeddings has the paper's ~60M / ~186M (60.9M / 185.6M)."""
    from nanochat.gpt import GPT
    for layout, sizes in ((paper.PIN_LAYOUT, paper.PIN_SIZES_M), (paper.SIZE_MATCHED_LAYOUT, paper.SIZE_MATCHED_SIZES_M)):
        config = model_config_from_depth(depth, layout["vocab_size"], 2048, value_embeds=layout["value_embeds"])
        with torch.device("meta"):
            total = GPT(config).param_counts()["total"]
        assert round(total / 1e6, 1) == sizes[depth]
    assert abs(paper.SIZE_MATCHED_SIZES_M[depth] / paper.MODEL_SIZES_M[depth] - 1) < 0.02
    assert paper.PIN_SIZES_M == {6: 73.5, 12: 286.3}  # nanochat's own counts at 4d8dbaf


def test_old_checkpoints_load(tmp_path):
    """A checkpoint written before `value_embeds` existed and before the residual scalars
    were split (one packed `lambdas` tensor per block) loads into the same model."""
    torch.manual_seed(0)
    model = build_model(tiny_config(), "cpu")
    with torch.no_grad():
        for j, layer in enumerate(model.connections.layers[::2]):
            layer.l_resid.fill_(1.0 + j)
            layer.l_x0.fill_(0.1 * j)
    state = model.state_dict()
    old_state = {}
    for key, value in state.items():
        if key.endswith(".l_x0"):
            continue
        if key.endswith(".l_resid"):
            prefix = key[:-len("l_resid")]
            old_state[prefix + "lambdas"] = torch.cat([value, state[prefix + "l_x0"]])
        else:
            old_state[key] = value
    old_config = dataclasses.asdict(model.config)
    del old_config["value_embeds"]
    meta = {"step": 3, "model_config": old_config, "settings": {}, "world_size": 1}
    run_dir = str(tmp_path / "old_run")
    ckpt.save_rank_files(run_dir, 3, 0, optimizer_state={}, model_state=old_state, meta=meta)
    ckpt.mark_latest(run_dir, 3)
    loaded, _ = ckpt.load_model(run_dir)
    assert loaded.config.value_embeds is True
    idx = torch.randint(0, VOCAB, (2, 16))
    model.eval()
    assert torch.equal(loaded(idx), model(idx))


def test_resume_of_runs_saved_before_the_new_settings():
    """Settings added since a run was saved count as unchanged at their defaults; a residual
    run whose optimizer held both scalars in one group is refused with the way out."""
    from nanochat.train_config import parse_args, settings
    from scripts.base_train import check_resume_groups, check_resume_settings

    current = settings(parse_args(["--hc", "kromhc"]))
    saved = {k: v for k, v in current.items() if k not in ("scalar_lr", "x0_beta1", "value_embeds")}
    check_resume_settings(saved, current)
    check_resume_groups(saved, "kromhc")
    with pytest.raises(SystemExit, match="value_embeds: True -> False"):
        check_resume_settings(saved, dict(current, value_embeds=False))
    with pytest.raises(SystemExit, match="--scalar-lr.*another --model-tag"):
        check_resume_groups(saved, "residual")
    check_resume_groups(current, "residual")
