"""The nanochat GPT: shapes, init, parameter buckets, windows, KV-cache decoding, training."""

import math

import pytest
import torch

from nanochat.gpt import GPT, GPTConfig, attention_mask, build_model, model_config_from_depth

VOCAB = 300


def tiny_config(**kw):
    base = dict(sequence_len=32, vocab_size=VOCAB, n_layer=3, n_head=4, n_kv_head=2, n_embd=64, window_pattern="SL")
    base.update(kw)
    return GPTConfig(**base)


def randomize(model, seed=0):
    """Init zeroes the output projections; give every weight a value so paths are exercised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


def test_shapes_and_padded_vocab():
    model = build_model(tiny_config(), "cpu")
    assert model.padded_vocab_size == 320  # next multiple of 64
    idx = torch.randint(0, VOCAB, (2, 16))
    logits = model(idx)
    assert logits.shape == (2, 16, VOCAB) and logits.dtype == torch.float32
    per_token = model(idx, idx, loss_reduction="none")
    assert per_token.shape == (2, 16)
    assert torch.allclose(per_token.mean(), model(idx, idx))


def test_loss_at_init_is_log_vocab():
    torch.manual_seed(0)
    model = build_model(tiny_config(), "cpu")
    idx = torch.randint(0, VOCAB, (4, 32))
    # head ~ N(0, 1e-3): logits are nearly uniform at init.
    assert abs(model(idx, idx).item() - math.log(VOCAB)) < 0.02


def test_softcap_bounds_logits():
    model = randomize(build_model(tiny_config(), "cpu"))
    with torch.no_grad():
        model.lm_head.weight.mul_(1000)
    logits = model(torch.randint(0, VOCAB, (1, 8)))
    assert logits.abs().max() <= 15.0 + 1e-4
    assert logits.abs().max() > 10.0  # the cap is actually reached, not a no-op


def test_ignore_index():
    model = randomize(build_model(tiny_config(), "cpu"))
    idx = torch.randint(0, VOCAB, (1, 8))
    targets = idx.clone()
    targets[0, :4] = -1
    per_token = model(idx, targets, loss_reduction="none")
    assert torch.all(per_token[0, :4] == 0)
    assert torch.allclose(model(idx, targets), per_token[0, 4:].mean())


def test_init_values_follow_nanochat():
    cfg = tiny_config()
    model = build_model(cfg, "cpu")
    for block in model.transformer.h:
        assert torch.all(block.attn.c_proj.weight == 0) and torch.all(block.mlp.c_proj.weight == 0)
        bound = math.sqrt(3 / cfg.n_embd)
        assert block.attn.c_q.weight.abs().max() <= bound
        assert abs(block.attn.c_q.weight.std().item() - 1 / math.sqrt(cfg.n_embd)) < 0.02
    assert abs(model.transformer.wte.weight.std().item() - 1.0) < 0.05
    assert abs(model.lm_head.weight.std().item() - 1e-3) < 1e-4
    # value embeddings on alternating layers, always including the last one
    assert sorted(model.value_embeds.keys()) == ["0", "2"]
    assert model.transformer.h[1].attn.ve_gate is None and model.transformer.h[2].attn.ve_gate is not None


def test_meta_init_is_deterministic_under_seed():
    torch.manual_seed(123)
    a = build_model(tiny_config(), "cpu").state_dict()
    torch.manual_seed(123)
    b = build_model(tiny_config(), "cpu").state_dict()
    torch.manual_seed(124)
    c = build_model(tiny_config(), "cpu").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["transformer.wte.weight"], c["transformer.wte.weight"])


@pytest.mark.parametrize("variant", ["residual", "kromhc"])
def test_param_groups_cover_every_parameter_once(variant):
    model = build_model(tiny_config(hc=variant), "cpu")
    groups = model.param_groups()
    seen = [id(p) for g in groups for p in g["params"]]
    assert sorted(seen) == sorted(id(p) for p in model.parameters())
    hc_ids = {id(p) for p in model.connections.parameters()}
    for g in groups:
        if g["kind"] == "muon":
            assert not hc_ids & {id(p) for p in g["params"]}, "connection parameters must never reach Muon"
            assert len({tuple(p.shape) for p in g["params"]}) == 1
    connection = [g for g in groups if g["name"].startswith("hc")]
    assert {id(p) for g in connection for p in g["params"]} == hc_ids
    assert all(g["kind"] == "adamw" and g["weight_decay"] == 0.0 for g in connection)
    if variant != "residual":  # every HC parameter in one group at the paper's LR
        assert [(g["name"], g["lr"], g["betas"]) for g in connection] == [("hc", 0.005, (0.8, 0.95))]


def test_param_counts_partition_model():
    model = build_model(tiny_config(), "cpu")
    counts = model.param_counts()
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert counts["connections"] == 2 * 3  # residual: l_resid and l_x0 per block
    assert counts["non_embedding"] == counts["total"] - counts["wte"] - counts["value_embeds"]


def test_width_from_depth_matches_nanochat():
    cfg = model_config_from_depth(12, 32768, 2048)
    assert (cfg.n_embd, cfg.n_head, cfg.n_kv_head) == (768, 6, 6)
    cfg = model_config_from_depth(6, 32768, 2048)
    assert (cfg.n_embd, cfg.n_head) == (384, 3)
    with torch.device("meta"):
        from nanochat.gpt import GPT
        model = GPT(model_config_from_depth(12, 32768, 2048))
    counts = model.param_counts()
    # d12 counts from nanochat at commit 4d8dbaf
    assert counts["transformer_matrices"] == 84_935_808
    assert counts["value_embeds"] == 150_994_944
    assert counts["lm_head"] == counts["wte"] == 25_165_824
    assert model.window_sizes == [1024, 1024, 1024, 2048] * 3


def test_window_pattern_last_layer_full():
    model = build_model(tiny_config(n_layer=4, window_pattern="S"), "cpu")
    assert model.window_sizes == [16, 16, 16, 32]


def test_sliding_window_limits_attention():
    mask, is_causal = attention_mask(6, 6, 2, "cpu")
    assert not is_causal
    expected = torch.tensor([[j <= i and j >= i - 2 for j in range(6)] for i in range(6)])
    assert torch.equal(mask, expected)
    assert attention_mask(6, 6, 6, "cpu") == (None, True)
    # a single decoded token with a full window attends to the whole cache
    assert attention_mask(1, 9, 32, "cpu") == (None, False)
    mask, _ = attention_mask(2, 9, 32, "cpu")
    assert torch.equal(mask, torch.tensor([[True] * 8 + [False], [True] * 9]))


def test_model_is_causal():
    torch.manual_seed(0)
    model = randomize(build_model(tiny_config(n_layer=2, window_pattern="S"), "cpu"))
    idx = torch.randint(0, VOCAB, (1, 32))
    full = model(idx)
    # changing token 20 changes no earlier position, and does change later ones
    idx2 = idx.clone()
    idx2[0, 20] = (idx[0, 20] + 1) % VOCAB
    out2 = model(idx2)
    assert torch.allclose(full[0, :20], out2[0, :20], atol=1e-5)
    assert not torch.allclose(full[0, 20:], out2[0, 20:], atol=1e-5)


@pytest.mark.parametrize("pattern", ["L", "SL"])
def test_kv_cache_decoding_equals_full_forward(pattern):
    from nanochat.gpt import KVCache
    torch.manual_seed(0)
    cfg = tiny_config(window_pattern=pattern, sequence_len=16)
    model = randomize(build_model(cfg, "cpu"))
    idx = torch.randint(0, VOCAB, (2, 24))  # longer than the S window (8) and the context
    with torch.no_grad():
        full = model(idx)
        cache = KVCache(2, cfg.n_layer, cfg.n_kv_head, model.head_dim, 24, "cpu", torch.float32)
        prefill = model(idx[:, :10], kv_cache=cache)
        steps = [model(idx[:, t:t + 1], kv_cache=cache) for t in range(10, 24)]
    assert torch.allclose(prefill, full[:, :10], atol=1e-4)
    assert torch.allclose(torch.cat(steps, dim=1), full[:, 10:], atol=1e-4)
    assert cache.pos == 24


@pytest.mark.parametrize("hc", ["residual", "kromhc"])
def test_left_padded_rows_equal_each_row_alone(hc):
    """padding_mask (what the Hugging Face export's batched generate() passes): each row of a
    left-padded batch gives the logits of that row alone, in a full forward (rows longer
    than the S window) and then in KV-cache decoding."""
    from nanochat.gpt import KVCache
    torch.manual_seed(0)
    cfg = tiny_config(hc=hc, sequence_len=16)
    model = randomize(build_model(cfg, "cpu"))
    rows = [torch.randint(0, VOCAB, (n,)) for n in (20, 13)]
    width = max(len(r) for r in rows)
    ids = torch.full((2, width), 7)
    mask = torch.zeros(2, width, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = row
        mask[i, width - len(row):] = True
    step_ids = torch.randint(0, VOCAB, (2, 1))
    with torch.no_grad():
        batched = model(ids, padding_mask=mask)
        cache = KVCache(2, cfg.n_layer, cfg.n_kv_head, model.head_dim, width + 1, "cpu", torch.float32)
        model(ids, kv_cache=cache, padding_mask=mask)
        step = model(step_ids, kv_cache=cache, padding_mask=torch.cat([mask, torch.ones(2, 1, dtype=torch.bool)], 1))
        for i, row in enumerate(rows):
            assert torch.allclose(batched[i, width - len(row):], model(row[None])[0], atol=1e-5)
            assert torch.allclose(step[i, 0], model(torch.cat([row, step_ids[i]])[None])[0, -1], atol=1e-5)
        assert batched.isfinite().all()


def test_generate_greedy_matches_argmax_of_full_forward():
    torch.manual_seed(0)
    model = randomize(build_model(tiny_config(), "cpu"))
    prompt = [1, 2, 3, 4]
    out = list(model.generate(prompt, max_tokens=6, temperature=0))
    seq = list(prompt)
    for _ in range(6):
        with torch.no_grad():
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    assert out == seq[len(prompt):]
    # sampling is reproducible under a seed
    a = list(model.generate(prompt, 8, temperature=1.0, top_k=20, seed=7))
    b = list(model.generate(prompt, 8, temperature=1.0, top_k=20, seed=7))
    assert a == b and all(0 <= t < VOCAB for t in a)


def test_tiny_model_overfits_one_batch():
    torch.manual_seed(0)
    model = build_model(tiny_config(), "cpu")
    idx = torch.randint(0, VOCAB, (2, 32))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(60):
        loss = model(idx[:, :-1], idx[:, 1:])
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.3 * first, (first, loss.item())


def test_bad_config_errors():
    with pytest.raises(ValueError, match="window_pattern"):
        tiny_config(window_pattern="SX")
    with pytest.raises(ValueError, match="n_kv_head"):
        tiny_config(n_kv_head=3)
    with pytest.raises(ValueError, match="unknown connection variant"):
        tiny_config(hc="nope")
    with pytest.raises(ValueError, match="single stream"):
        tiny_config(hc="residual", hc_streams=4)


def test_building_a_model_leaves_dynamo_unimported():
    """build_model constructs on the meta device; an init there (normal_, arange) goes through
    torch._refs, whose first call imports torch._dynamo: 1.5 s of every command that builds a
    model without compiling it (evaluation, export, reports). A process of its own: the suite
    has imported dynamo long since."""
    import subprocess
    import sys
    code = ("import sys; from nanochat.gpt import GPTConfig, build_model; "
            "m = build_model(GPTConfig(sequence_len=16, vocab_size=64, n_layer=2, n_head=2, n_kv_head=2, n_embd=32), "
            "'cpu'); print('torch._dynamo' in sys.modules, float(m.cos[0, 1, 0, 0]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=__file__.rsplit("/tests/", 1)[0]).stdout.split()
    assert out[0] == "False" and float(out[1]) == pytest.approx(math.cos(1.0))  # the tables computed for real


# nanochat 92d63d4's own count of this model: GPT(GPTConfig(**UPSTREAM_D4)).estimate_flops() on the
# meta device, in a process with a checkout of 92d63d4 first on sys.path (as tests/goldens/upstream.py
# sets it up); an integer, so it travels between machines.
UPSTREAM_D4 = dict(sequence_len=128, vocab_size=512, n_layer=4, n_head=2, n_kv_head=2, n_embd=128, window_pattern="SL")
UPSTREAM_D4_FLOPS = 5_898_672


def test_flops_per_token_are_nanochats_own_count():
    """The residual wiring on the 2026-07 trunk counts what nanochat 92d63d4 counts, to the FLOP:
    its one-element scalars (l_resid, l_x0, lambda_s, lambda_b) are not matmul weights (they
    added 12 + 12 L: 5,898,732 here). Every wiring's multi-element parameters still count."""
    with torch.device("meta"):
        model = GPT(GPTConfig(**UPSTREAM_D4, trunk="2026-07"))
        rezero = GPT(GPTConfig(**UPSTREAM_D4, trunk="2026-07", hc="rezero"))
        kromhc = GPT(GPTConfig(**UPSTREAM_D4, trunk="2026-07", hc="kromhc"))
    assert model.estimate_flops() == UPSTREAM_D4_FLOPS
    assert rezero.estimate_flops() == UPSTREAM_D4_FLOPS  # one alpha per sub-layer: scalars too
    assert kromhc.estimate_flops() == UPSTREAM_D4_FLOPS + 6 * kromhc.param_counts()["connections"]
