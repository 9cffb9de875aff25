"""Every wiring on the 2026-07 trunk (nanochat/trunks.py): it builds with the trunk's own
scalars beside its parameters, every connection parameter learns (but what its SPEC declares
dead), the backout reads the wiring's own state, decoding through both KV caches gives the full
forward (the smear keeps the embedding before), and the Hugging Face export gives the same
logits. The 2026-01 trunk's battery is tests/test_variant_contract.py."""

import pytest
import torch

from nanochat import connections, engine
from nanochat.gpt import EagerSteps, GPTConfig, build_model
from test_gpt import randomize
from wiring_checks import assert_decode_matches, assert_every_connection_parameter_gets_a_gradient, tokens

NAMES = list(connections.VARIANTS)
MODERN = "2026-07"
SIZES = dict(sequence_len=32, vocab_size=64, n_layer=3, n_head=2, n_kv_head=2, n_embd=32, window_pattern="SL")


def modern(name, seed=0, **fields):
    torch.manual_seed(seed)
    return build_model(GPTConfig(**SIZES, hc=name, trunk=MODERN, **fields), "cpu")


@pytest.mark.parametrize("name", NAMES)
def test_builds_with_the_trunk_scalars_beside_its_own(name):
    model = modern(name)
    counts = model.param_counts()
    assert counts["connections"] == connections.spec(name).params(model.config)
    assert counts["trunk_scalars"] == 24 + 1 + 1
    assert model.backout_lambda.item() == pytest.approx(0.2) and model.smear_lambda.item() == 0


@pytest.mark.parametrize("name", [n for n in NAMES if connections.spec(n).params(GPTConfig(**SIZES, hc=n))])
def test_every_connection_parameter_learns(name):
    assert_every_connection_parameter_gets_a_gradient(modern(name))


@pytest.mark.parametrize("name", NAMES)
def test_kv_cache_decoding_equals_the_full_forward(name):
    model = randomize(modern(name), seed=4)
    idx = tokens(vocab=SIZES["vocab_size"], T=12)
    assert_decode_matches(model, idx, prefix=5)
    # the static cache of generation (gpt.EagerSteps; compiled: engine.py), a prefill and then
    # one token at a time
    steps = engine.Inference(model, compile=True, backend="aot_eager") if name == "residual" else EagerSteps(model)
    with torch.no_grad():
        full = model(idx[:1])
        cache = steps.cache(1, idx.size(1))
        outs = [steps.step(idx[:1, :5], cache)] + [steps.step(idx[:1, t:t + 1], cache) for t in range(5, idx.size(1))]
    torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["residual", "kromhc", "denseformer", "attnres"])
def test_backout_subtracts_the_wirings_readout_of_its_mid_depth_state(name):
    """With lambda_b = 0 the logits are those of the trunk without backout; with lambda_b set,
    the folded state loses lambda_b times what the wiring returns had the trunk ended after
    block floor(L/2)."""
    model = randomize(modern(name), seed=2)
    conn = model.connections
    x0 = torch.randn(2, 8, SIZES["n_embd"], generator=torch.Generator().manual_seed(1))
    branches = [lambda u, j=j: torch.tanh(u + j) for j in range(len(conn.layers))]
    lam = torch.tensor([0.3])
    with torch.no_grad():
        plain = conn(x0, branches)
        backed = conn(x0, branches, backout=lam)
        mid = conn.backout_layer()
        X, carry = conn.expand(x0), None
        for layer, branch in zip(conn.layers[:mid + 1], branches):
            X, carry = layer.step(X, branch, x0, carry)
        torch.testing.assert_close(backed, plain - 0.3 * conn.reduce(X, carry))
    assert mid == 3  # the end of block 1 of 3, as nanochat caches the stream at layer L // 2


def test_smear_mixes_only_the_token_before():
    """Position t's input changes with token t-1 (the smear) and not with t-2, before any layer."""
    model = randomize(modern("residual"), seed=3)
    idx = tokens(vocab=SIZES["vocab_size"], T=8)
    e = torch.nn.functional.rms_norm(model.transformer.wte(idx), (SIZES["n_embd"],))
    x = model.smear(e)
    torch.testing.assert_close(x[:, 0], e[:, 0], rtol=0, atol=0)
    changed = e.clone()
    changed[:, 3] += 1.0
    y = model.smear(changed)
    assert not torch.allclose(y[:, 4], x[:, 4]) and torch.equal(y[:, 5], x[:, 5]) and torch.equal(y[:, 2], x[:, 2])


def test_a_left_padded_row_smears_nothing_from_its_padding():
    model = randomize(modern("residual"), seed=3)
    idx = tokens(vocab=SIZES["vocab_size"], T=8, rows=1)
    padded = torch.cat([torch.zeros(1, 3, dtype=idx.dtype), idx], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.bool), torch.ones(1, 8, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, padding_mask=mask)[:, 3:], model(idx), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", [n for n in NAMES if connections.in_package(n)])
def test_hf_export_loads_with_the_same_logits(make_run, tmp_path, base_with_tokenizer, name):
    transformers = pytest.importorskip("transformers")
    from nanochat.interop.hf.export import export
    run_dir = tmp_path / name
    model = make_run(run_dir, hc=name, trunk=MODERN)
    out = export(run_dir, tmp_path / "export", overwrite=True)["dir"]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    idx = tokens(vocab=512, T=10, rows=1)
    with torch.no_grad():
        torch.testing.assert_close(loaded(idx).logits[..., :512], model(idx), rtol=1e-5, atol=1e-5)
        # generate() through transformers' cache: the smear's embedding travels on it
        ours = list(model.generate(idx[0].tolist(), 4, temperature=0))
        theirs = loaded.generate(idx, max_new_tokens=4, do_sample=False)[0, idx.size(1):].tolist()
    assert theirs == ours


def test_each_wiring_of_the_package_says_what_its_backout_subtracts():
    """SPEC backout: a phrase of its own (docs/variants.md lists them), shown on the model card."""
    from nanochat.connections.spec import BACKOUT
    from nanochat.interop.hf.model_card import _trunk_line
    text = open("docs/variants.md").read()
    section = text[text.index("## Backout"):]
    for name, spec in connections.specs().items():
        if connections.in_package(name):
            assert spec.backout != BACKOUT, name
            assert f"| {spec.label} |" in section, name
            assert spec.backout in _trunk_line(GPTConfig(**SIZES, hc=name, trunk=MODERN))


@pytest.mark.parametrize("name", ["kromhc", "attnres"])
def test_hc_report_reads_a_2026_07_checkpoint(make_run, tmp_path, capsys, name):
    """hc_report --checkpoint on a 2026-07 run: without autocast, its liveness table naming the
    connection parameters (the trunk's own scalars are not a wiring's)."""
    import json

    from scripts import hc_report
    run_dir = tmp_path / name
    model = make_run(run_dir, hc=name, trunk=MODERN)
    hc_report.main(["--checkpoint", str(run_dir), "--random-tokens", "--device-type", "cpu", "--batch-size", "2"])
    stats = json.loads((run_dir / "hc_stats.json").read_text())
    assert stats["variant"] == name and len(stats["layers"]) == 2 * model.config.n_layer
    assert "wrote" in capsys.readouterr().out
    assert not [row for row in stats["liveness"] if "lambda" in row["name"] or "smear" in row["name"]]
