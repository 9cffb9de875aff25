"""The variant contract (docs/connections.md): every registered wiring goes through what a user
runs on it (bench in model and inference modes, hc_report --params and --checkpoint, the
plan, the report on its run directory, KV-cache decoding; the Hugging Face export of every
in-package wiring is loaded back without the project in tests/test_hf_export.py), its SPEC
is checked against the model it builds (parameter count, state, H_res, equals pre-norm at
init), and a wiring registered with nothing but SPEC, resolve and make_layers passes the
same battery or fails it with a clear message, never a traceback.

Tiny models throughout; one run directory per variant, shared by the checks."""

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from nanochat import connections
from nanochat.planning import plan
from nanochat.connections import liveness
from nanochat.connections.spec import SpecError
from nanochat.connections.frame import ConnectionLayer
from nanochat.gpt import GPT, GPTConfig, build_model
from scripts import bench, hc_report
from scripts import report as report_cli
from test_gpt import randomize
from wiring_checks import (assert_decode_matches, assert_every_connection_parameter_gets_a_gradient, prenorm_logits,
                           tiny, tiny_config)

NAMES = list(connections.VARIANTS)
SIZES = dict(sequence_len=32, vocab_size=512, n_layer=2, n_head=2, n_kv_head=2, n_embd=64)
BENCH = ["--depth", "1", "--width", "32", "--head-dim", "16", "--seq-len", "8", "--batch", "1", "--vocab-size", "64",
         "--warmup", "0", "--reps", "1"]
INFER = ["--bench", "infer", "--prefill-lens", "8", "--infer-batches", "1", "--prompt-len", "4", "--new-tokens", "2",
         "--modes", "eager"]


class PlainLayer(ConnectionLayer):
    """The dummy wiring's layer: x + F(x), one learned scale, no capture code of its own."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.empty(1))

    def init_weights(self):
        self.scale.data.fill_(1.0)

    def step(self, X, branch, x0, carry):
        return X + self.scale * branch(X.squeeze(-2)).unsqueeze(-2), carry


def dummy_module():
    """A wiring declared the minimal way: SPEC, resolve and make_layers, nothing else."""
    module = types.ModuleType("experiment_dummy")
    module.SPEC = dict(label="Dummy", description="x + s * F(x) per sub-layer", source="tests", state="single",
                       has_h_res=False, in_paper=False, equals_prenorm_at_init=True,
                       params=lambda cfg: 2 * cfg.n_layer)
    module.resolve = lambda cfg: setattr(cfg, "hc_streams", 1)
    module.make_layers = lambda cfg: [PlainLayer() for _ in range(2 * cfg.n_layer)]
    return module


@pytest.fixture
def dummy(monkeypatch):
    monkeypatch.setitem(connections.VARIANTS, "dummy", dummy_module())
    return "dummy"


@pytest.fixture(scope="module")
def base(base_with_tokenizer):
    return base_with_tokenizer


def run_of(base, make_run, name):
    """The run directory of variant `name` (written once per module) and its model."""
    run_dir = base / "runs" / name
    if not (run_dir / "summary.json").exists():
        make_run(run_dir, **SIZES, hc=name)
    from nanochat.checkpoint_manager import load_model
    return run_dir, load_model(run_dir, device="cpu")[0]


# ----- SPEC against the model -----

@pytest.mark.parametrize("name", NAMES)
def test_spec_describes_the_model_it_builds(name):
    spec = connections.spec(name)
    for n_layer in (2, 3):
        model = build_model(GPTConfig(**{**SIZES, "n_layer": n_layer}, hc=name), "cpu")
        assert spec.params(model.config) == model.param_counts()["connections"]
        assert (model.connections.n == 1) == (not spec.streams)
        assert 0 <= spec.bench_layer < 2 * n_layer
    assert all(isinstance(getattr(spec, key), str) and getattr(spec, key) for key in ("label", "description", "source"))
    has_h_res = hasattr(model.connections.layers[0], "coefficients")
    assert has_h_res == spec.has_h_res


def option_settings(name):
    """Every combination of the stream options a wiring declares (SPEC options), but the pair
    the frame refuses (a learned head under delayed pre-weights)."""
    choices = {**connections.HC_OPTIONS, "hc_recompute": (False, True)}
    declared = [option for option in choices if connections.takes_option(name, option)]
    for values in itertools.product(*(choices[option] for option in declared)):
        fields = dict(zip(declared, values))
        if not (fields.get("hc_reduce") == "learned" and fields.get("hc_pre") == "delayed"):
            yield fields


@pytest.mark.parametrize("name", NAMES)
def test_its_parameter_count_is_the_models_under_every_option_it_takes(name):
    """SPEC params counts what the stream options add (diagnostics.option_params) for every
    wiring that takes them, the package's and one registered from outside alike."""
    spec = connections.spec(name)
    for fields in option_settings(name):
        config = GPTConfig(**SIZES, hc=name, **fields)
        with torch.device("meta"):
            built = sum(p.numel() for p in GPT(config).connections.parameters())
        assert spec.params(config) == built, fields


def test_the_counts_the_options_once_left_out():
    """C-mHC and the outside static HC counted their layers alone: 13,372 and 576 where the
    models with LSS have 13,628 and 3,648 (n = 4; width 64, 2 blocks and width 768, 12 blocks)."""
    assert connections.spec("cmhc").params(GPTConfig(**SIZES, hc="cmhc", hc_expand="lss")) == 13_628
    config = GPTConfig(n_layer=12, n_embd=768, n_head=6, n_kv_head=6, hc="static_hc", hc_expand="lss")
    assert connections.spec("static_hc").params(config) == 3_648


@pytest.mark.parametrize("name", NAMES)
def test_its_shared_fields_are_the_frames_fields_that_shape_it(name):
    """SPEC shared_fields (what the model card lists beside its own FIELDS) names frame fields,
    hc_streams exactly when it has streams, and hc_norm_weight exactly when that changes its
    parameter count."""
    spec = connections.spec(name)
    frame = {f.name for f in dataclasses.fields(GPTConfig)} - set(connections.variant_fields())
    assert set(spec.shared_fields) <= frame, set(spec.shared_fields) - frame
    assert ("hc_streams" in spec.shared_fields) == spec.streams
    counts = {flag: spec.params(GPTConfig(**SIZES, hc=name, hc_norm_weight=flag)) for flag in (True, False)}
    assert ("hc_norm_weight" in spec.shared_fields) == (counts[True] != counts[False])


@pytest.mark.parametrize("name", NAMES)
def test_equals_prenorm_at_init_exactly_when_its_spec_says_so(name):
    """Shared weights moved off their init (zero output projections would make every wiring
    the identity), the connections at theirs: the logits equal the transcribed pre-norm
    residual's if and only if SPEC says equals_prenorm_at_init."""
    model = randomize(build_model(GPTConfig(**SIZES, hc=name), "cpu"), seed=1)
    model.connections.init_weights()
    idx = torch.randint(0, SIZES["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, plain = model(idx), prenorm_logits(model, idx)
    same = torch.allclose(ours, plain, rtol=1e-5, atol=1e-5)
    assert same == connections.spec(name).equals_prenorm_at_init, (ours - plain).abs().max()


# ----- what a user runs -----

def kv_decode_matches(model):
    assert_decode_matches(model, torch.randint(0, SIZES["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(3)),
                          prefix=5)


def check_checkpoint_report(run_dir, model, capsys):
    hc_report.main(["--checkpoint", str(run_dir), "--random-tokens", "--device-type", "cpu", "--batch-size", "2"])
    out = capsys.readouterr().out
    stats = json.loads((run_dir / "hc_stats.json").read_text())
    assert stats["variant"] == model.config.hc and len(stats["layers"]) == 2 * model.config.n_layer
    assert connections.label(model.config.hc) in out and "wrote" in out
    spec = connections.spec(model.config.hc)
    declared, parts = spec.dead_parameters(model.config), spec.judged_parts(model.config)
    for name in declared:  # named with its reason, and measured dead on this batch too
        assert f"dead by construction: {name} " in out, name
    assert "declared dead but learns" not in out and "gets rounding alone" not in out
    # a row per declared part, one per parameter that parts and dead ones leave something of
    params = dict(model.connections.named_parameters())
    covered = liveness.masks(params, [*declared, *parts])
    rest = [name for name, p in params.items() if name not in covered or not covered[name].all()]
    assert len(stats["liveness"]) == len([p for p in parts if p not in declared]) + len(rest) + len(declared)
    return out


def check_plan(tmp_path, name):
    config = tmp_path / f"{name}.toml"
    config.write_text(f'model_tag = "{name}"\nhc = "{name}"\ndepth = 4\nnum_iterations = 10\n'
                      f'total_batch_size = 1024\n')
    (run,) = plan.plan_runs([str(config)])
    assert run.n == (4 if connections.spec(name).streams else 1)


@pytest.mark.parametrize("name", [name for name in NAMES if connections.spec(name).params(tiny_config(name))])
def test_every_connection_parameter_learns_but_what_its_wiring_declares_dead(name):
    """A gradient well above rounding (connections/liveness.py) on every connection parameter,
    but on the parts its SPEC declares dead, which must be rounding alone."""
    assert_every_connection_parameter_gets_a_gradient(tiny(name))


@pytest.mark.slow
def test_the_contract_runs_on_a_users_wiring_file():
    """docs/connections.md's command: NANOCHAT_WIRINGS names the user's file, and the suite's
    own wiring is added beside it (tests/conftest.py), not in its place."""
    wiring = Path(__file__).resolve().parent / "wirings" / "layerscale.py"
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "tests/test_variant_contract.py", "-k", "layerscale or static_hc"],
                          cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, NANOCHAT_WIRINGS=str(wiring)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    assert len([i for i in ids if "[layerscale]" in i]) >= 7 and [i for i in ids if "[static_hc]" in i], ids


def test_a_wiring_registered_from_outside_is_refused_by_the_export(base, make_run, tmp_path):
    from nanochat.interop.hf.export import export
    with pytest.raises(ValueError, match="registered from outside the nanochat package"):
        export(run_of(base, make_run, "static_hc")[0], tmp_path / "export")


@pytest.mark.parametrize("name", NAMES)
def test_kv_cache_decoding_equals_the_full_forward(base, make_run, name):
    kv_decode_matches(run_of(base, make_run, name)[1])


@pytest.mark.parametrize("name", NAMES)
def test_hc_report_checkpoint_and_plan(base, make_run, tmp_path, capsys, name):
    run_dir, model = run_of(base, make_run, name)
    check_checkpoint_report(run_dir, model, capsys)
    check_plan(tmp_path, name)


def test_hc_report_params_counts_every_variant(capsys):
    hc_report.main(["--params", "--depth", "2", "--streams", "4"])
    custom = capsys.readouterr().out.split("n = 4, D = 2")[1]
    for name, spec in connections.specs().items():
        row = next(line for line in custom.splitlines() if line.startswith(spec.label + " "))
        config = GPTConfig(n_layer=2, n_embd=128, n_head=1, n_kv_head=1, hc=name, hc_streams=4 if spec.streams else 0)
        assert f"{spec.params(config):,}" in row


def test_bench_model_and_inference_run_every_variant(tmp_path):
    out = tmp_path / "bench.json"
    bench.main(BENCH + ["--bench", "model", "--variants", *NAMES, "--out", str(out)])
    assert {r["variant"] for r in json.loads(out.read_text())["results"]} == set(NAMES)
    bench.main(BENCH + INFER + ["--variants", *NAMES, "--out", str(out)])
    rows = json.loads(out.read_text())["results"]
    assert {(r["bench"], r["variant"]) for r in rows} == {(b, v) for b in ("prefill", "decode") for v in NAMES}


def test_report_lists_every_variant_under_its_label(base, make_run, tmp_path):
    dirs = [str(run_of(base, make_run, name)[0]) for name in NAMES]
    report_cli.main(["--runs", *dirs, "--out", str(tmp_path)])
    readme = (tmp_path / "README.md").read_text()
    for name in NAMES:
        assert connections.label(name) in readme


# ----- a wiring registered with nothing else -----

def test_a_variant_registered_with_nothing_else_passes_or_says_why(dummy, base, make_run, tmp_path, capsys):
    assert connections.spec(dummy).label == "Dummy"
    run_dir, model = run_of(base, make_run, dummy)
    kv_decode_matches(model)
    assert "not applicable" in check_checkpoint_report(run_dir, model, capsys)  # no H_res, no reads: its states
    check_plan(tmp_path, dummy)
    out = tmp_path / "bench.json"
    bench.main(BENCH + ["--bench", "both", "--variants", dummy, "--out", str(out)])
    bench.main(BENCH + INFER + ["--variants", dummy, "--out", str(out)])
    report_cli.main(["--runs", str(run_dir), "--out", str(tmp_path / "report")])
    assert "Dummy" in (tmp_path / "report" / "README.md").read_text()
    from nanochat.interop.hf.export import export
    with pytest.raises(ValueError, match="registered from outside the nanochat package"):
        export(run_dir, tmp_path / "export")


@pytest.mark.parametrize("drop", ["label", "params"])
def test_a_spec_missing_a_key_is_named(monkeypatch, drop):
    module = dummy_module()
    del module.SPEC[drop]
    monkeypatch.setitem(connections.VARIANTS, "broken", module)
    with pytest.raises(SpecError, match=f"variant 'broken' .*SPEC lacks {drop}"):
        GPTConfig(hc="broken")


def test_a_module_without_spec_is_named(monkeypatch):
    module = dummy_module()
    del module.SPEC
    monkeypatch.setitem(connections.VARIANTS, "bare", module)
    with pytest.raises(SpecError, match="variant 'bare' .*defines no SPEC dict; declare label, description"):
        connections.specs()


class RecordingLayer(PlainLayer):
    """PlainLayer that keeps what its branch received and returned."""

    def step(self, X, branch, x0, carry):
        self.seen = (X.squeeze(-2), branch(X.squeeze(-2)))
        return X + self.scale * self.seen[1].unsqueeze(-2), carry


@pytest.mark.parametrize("prenorm", [True, False])
def test_a_wiring_may_take_the_raw_sub_layers_and_set_their_start(monkeypatch, prenorm):
    """SPEC sublayer_prenorm=False hands the wiring u -> F(u) instead of u -> F(norm(u)), and
    its init_sublayers(cfg, sublayers) runs after the model's init, over the attention and MLP
    modules in branch order."""
    module = dummy_module()
    module.SPEC["sublayer_prenorm"] = prenorm
    module.make_layers = lambda cfg: [RecordingLayer() for _ in range(2 * cfg.n_layer)]
    module.init_sublayers = lambda cfg, sublayers: [s.c_proj.weight.data.fill_(0.01 * i)
                                                    for i, s in enumerate(sublayers, start=1)]
    monkeypatch.setitem(connections.VARIANTS, "raw", module)
    model = build_model(GPTConfig(**SIZES, hc="raw"), "cpu")
    subs = [s for block in model.transformer.h for s in (block.attn, block.mlp)]
    assert [s.c_proj.weight.unique().tolist() for s in subs] == [[pytest.approx(0.01 * i)] for i in range(1, 5)]
    with torch.no_grad():
        model(torch.randint(0, SIZES["vocab_size"], (2, 8)))
        u, out = model.connections.layers[1].seen  # the first MLP's branch
        mlp = model.transformer.h[0].mlp
        torch.testing.assert_close(out, mlp(torch.nn.functional.rms_norm(u, (u.size(-1),))) if prenorm else mlp(u))
        assert not torch.allclose(mlp(u), mlp(torch.nn.functional.rms_norm(u, (u.size(-1),))))


# The registry's order before the wirings registered themselves: tables list them so.
EARLIER = ["residual", "hc", "hc_identity", "mhc", "mhc_lite", "kromhc", "go_mhc", "frac", "attnres", "prenorm",
           "denseformer", "muddformer", "laurel", "mhar", "dar", "cmhc", "gated"]
WIRING_SOURCE = """
SPEC = dict(label="{label}", description="a test wiring", source="tests", state="single", has_h_res=False,
            in_paper=False, equals_prenorm_at_init=True, params=lambda cfg: 0{order})


def resolve(cfg):
    cfg.hc_streams = 1


def make_layers(cfg):
    return []
"""


def test_the_registry_keeps_its_order():
    assert [name for name in connections.VARIANTS if name in EARLIER] == EARLIER


def test_a_module_in_the_package_registers_itself(tmp_path, monkeypatch):
    """A file in nanochat/connections/ that declares SPEC is a wiring under its file name,
    listed by its SPEC order (unnumbered: last); nothing else is edited."""
    (tmp_path / "aa_numbered.py").write_text(WIRING_SOURCE.format(label="Numbered", order=", order=95"))
    (tmp_path / "aa_unnumbered.py").write_text(WIRING_SOURCE.format(label="Unnumbered", order=""))
    (tmp_path / "aa_helper.py").write_text("HELPER = 1\n")  # no SPEC: not a wiring
    monkeypatch.setattr(connections, "__path__", [*connections.__path__, str(tmp_path)])
    for name in ("aa_numbered", "aa_unnumbered", "aa_helper"):
        monkeypatch.delitem(sys.modules, f"nanochat.connections.{name}", raising=False)
    found = list(connections.discover())
    assert [name for name in found if not name.startswith("aa_")] == NAMES
    assert found[found.index("aa_numbered") + 1] == "denseformer"  # order 95: before DenseFormer's 100
    assert found[-1] == "aa_unnumbered"
    for name in ("aa_numbered", "aa_unnumbered", "aa_helper"):
        sys.modules.pop(f"nanochat.connections.{name}", None)


def test_config_fields_come_from_the_modules():
    """Every variant's own field is a GPTConfig field and a base_train flag with its help."""
    from nanochat.train_config import FLAGS
    flags = {name: help_text for name, _, _, help_text in FLAGS}
    fields = {f.name: f for f in dataclasses.fields(GPTConfig)}
    for name, (default, help_text, _, variant) in connections.variant_fields().items():
        assert name in fields and flags[name] == help_text
        assert getattr(GPTConfig(), name) == default
