"""A wiring declares what it is (SPEC family, kernel, backends, options, dead), and everything
that iterates over wirings reads the declaration: the frame's configuration checks, bench,
bench --traffic, kernel_check's workloads, hc_report. Static HC (tests/wirings/static_hc.py,
registered through NANOCHAT_WIRINGS by conftest.py) is the family member whose layers are not
hc.HyperConnection: it goes through all of them as one file, and `--hc-kernels fused`
refuses it in one line."""

import json
import os
import sys
import types

import launch
import pytest
import torch

from nanochat import connections
from nanochat.planning import kernel_aot
from nanochat.planning import plan, throughput
from nanochat.cli import run
from nanochat.connections.spec import SpecError
from nanochat.gpt import GPTConfig, build_model
from scripts import bench, bench_traffic, hc_report
from test_variant_contract import BENCH, dummy_module
from wiring_checks import assert_train_flag_error, random_branches, tiny_config

STATIC = "static_hc"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = dict(sequence_len=16, vocab_size=64, n_layer=1, n_head=2, n_kv_head=2, n_embd=32)


def test_the_test_wiring_is_registered_from_outside_the_package():
    assert STATIC in connections.VARIANTS and not connections.in_package(STATIC)
    assert connections.in_package("kromhc")
    spec = connections.spec(STATIC)
    assert (spec.family, spec.kernel, spec.backends) == ("hc", None, ("torch",))


@pytest.mark.parametrize("flags, phrases", [
    (["--hc-kernels", "fused"], ["hc_kernels='fused' does not run hc='static_hc'", "hc.HyperConnection",
                                 "SPEC backends: torch", "use hc_kernels='torch' or 'auto'"]),
    (["--hc-kernels", "liger"], ["hc_kernels='liger' does not run hc='static_hc'"]),
    (["--hc-pre", "delayed"], ["hc_pre='delayed' does not apply to hc='static_hc'", "hc_expand, hc_reduce only"]),
    (["--hc-recompute", "true"], ["hc_recompute=True does not apply to hc='static_hc'"]),
])
def test_what_the_wiring_does_not_declare_is_refused_in_one_line(flags, phrases):
    assert_train_flag_error(["--hc", STATIC, *flags], phrases)


def test_what_it_declares_it_takes():
    for fields in (dict(hc_expand="lss"), dict(hc_reduce="learned"), dict(hc_kernels="auto")):
        model = build_model(tiny_config(STATIC, **fields), "cpu")
        assert model.connections.kernels == "torch"  # auto picks among its own: torch


def test_its_forward_is_the_h_convention_of_its_own_coefficients():
    """Every HC family member: X_next = H_res X + H_post^T F(H_pre X) with the coefficients its
    layer reports (what the H_res diagnostics read), here for layers it has moved off init."""
    for name, spec in connections.specs(family="hc").items():
        conn = connections.build(tiny_config(name, hc_streams=3 if name != "kromhc" else 4))
        conn.init_weights()
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in conn.parameters():
                p.add_(0.1 * torch.randn(p.shape, generator=g))
        layer = conn.layers[1]
        X = torch.randn(2, 3, conn.n, 32, generator=g)
        branch = random_branches(1, 32, dtype=torch.float32)[0]
        h_pre, h_post, h_res = layer.coefficients(X)
        expected = h_res @ X + h_post[..., None] * branch((h_pre[..., None, :] @ X).squeeze(-2))[..., None, :]
        torch.testing.assert_close(layer(X, branch), expected, atol=1e-5, rtol=1e-5, msg=name)


def test_hc_report_params_prints_it_with_its_dead_start(capsys):
    hc_report.main(["--params", "--depth", "2", "--streams", "4"])
    out = capsys.readouterr().out
    dead = out.split("Dead by construction")[1].split("\n\n\n")[0]
    assert "Static HC" in dead and "layers.0.h_pre" in dead
    options = out.split("Options beyond the paper")[1].split("\n\n\n")[0]
    row = next(line for line in options.splitlines() if line.startswith("Static HC"))
    assert row.split()[-1] == "-"  # delayed pre: not an option it takes


def test_bench_defaults_skip_what_a_wiring_refuses(tmp_path, capsys):
    """Every backend, both pre-weights and recompute both ways over the default variants
    complete: each wiring runs what it declares and says in one line what it skips."""
    out = tmp_path / "bench.json"
    variants = ["residual", "gated", "frac", STATIC]
    bench.main(BENCH + ["--bench", "model", "--variants", *variants, "--hc-pre", "current,delayed",
                        "--recompute", "both", "--out", str(out)])
    rows = json.loads(out.read_text())["results"]
    assert {r["variant"] for r in rows} == set(variants)
    assert {(r["recompute"], r["pre"]) for r in rows if r["variant"] == "frac"} == {(False, "current"),
                                                                                   (True, "current")}
    printed = capsys.readouterr().out
    assert f"bench: {STATIC} skips --recompute on; --hc-pre delayed" in printed
    assert "bench: gated skips --recompute on; --hc-pre delayed" in printed


def test_traffic_counts_each_wiring_on_the_backends_it_runs_on(capsys):
    args = bench.parse_args(["--traffic", "--variants", "kromhc", STATIC, "gated", "residual",
                             "--hc-kernels", "torch,liger,fused,fused-split"])
    assert bench_traffic.cases(args) == [("residual", "torch"), ("kromhc", "torch"), ("kromhc", "liger"),
                                         ("kromhc", "fused"), ("kromhc", "fused-split"), (STATIC, "torch"),
                                         ("gated", "torch")]
    out = capsys.readouterr().out
    assert f"skipped {STATIC} on liger, fused, fused-split" in out
    assert "one state, no streams" not in out  # no single-state wiring among them
    single = bench.parse_args(["--traffic", "--variants", "kromhc", "rezero", "dar", "residual"])
    assert [v for v, _ in bench_traffic.cases(single)] == ["residual", "kromhc", "kromhc", "kromhc", "kromhc"]
    lines = [line for line in capsys.readouterr().out.splitlines() if "rezero" in line or "dar" in line]
    assert len(lines) == 1 and lines[0].startswith("skipped rezero, dar: one state, no streams"), lines
    delayed = bench.parse_args(["--traffic", "--variants", "kromhc", STATIC, "--hc-pre", "delayed"])
    assert [v for v, _ in bench_traffic.cases(delayed)] == ["residual", "kromhc", "kromhc", "kromhc", "kromhc"]


def test_kernel_check_compiles_the_wirings_that_declare_the_kernels():
    fused = {w.fields["hc"] for w in kernel_aot.fused_workloads()}
    assert fused == {name for name, spec in connections.specs().items() if "fused" in spec.backends}
    assert STATIC not in fused and "gated" not in fused and "kromhc" in fused
    assert {w.fields["hc"] for w in kernel_aot.liger_workloads()} == set(connections.specs(kernel="hyper_connection"))


@pytest.mark.parametrize("change, message", [
    (dict(backends=("torch", "fused")), "backends fused compute hc.HyperConnection layers"),
    (dict(kernel="hyper_connection"), "declare family='hc'"),
    (dict(family="hc"), "family='hc' needs state='streams'"),
    (dict(options=("hc_expand",)), "act on n streams"),
    (dict(backends=("fused",)), "torch included"),
    (dict(family="mixers"), "SPEC family='mixers'"),
    (dict(dead=["layers.0.scale"]), "SPEC dead must be a function"),
])
def test_a_declaration_that_cannot_hold_is_named(monkeypatch, change, message):
    module = dummy_module()
    module.SPEC.update(change)
    monkeypatch.setitem(connections.VARIANTS, "declared", module)
    with pytest.raises(SpecError, match=message):
        connections.spec("declared")


def test_a_wiring_claiming_hyper_connection_layers_must_build_them(monkeypatch):
    """kernel="hyper_connection" on layers of its own fails when the model is built, in one
    message, not inside a kernel."""
    module = types.ModuleType("claims")
    module.__dict__.update({k: getattr(sys.modules["nanochat_wirings.static_hc"], k)
                            for k in ("resolve", "make_layers")})
    module.SPEC = dict(sys.modules["nanochat_wirings.static_hc"].SPEC, kernel="hyper_connection",
                       backends=("torch", "fused"))
    monkeypatch.setitem(connections.VARIANTS, "claims", module)
    with pytest.raises(SpecError, match="declares kernel='hyper_connection' but builds StaticHCLayer layers"):
        connections.build(GPTConfig(**{**SIZES, "hc": "claims"}))



@pytest.mark.parametrize("value, message", [("no/such/file.py", "is not a .py file"),
                                             ("tests/wirings", "is not a .py file")])
def test_nanochat_wirings_names_a_bad_path_in_one_line(value, message):
    run = launch.run([sys.executable, "-m", "scripts.hc_report", "--params"], cwd=REPO, capture_output=True,
                     text=True, env=dict(os.environ, NANOCHAT_WIRINGS=value), timeout=120)
    assert run.returncode != 0 and message in run.stderr
    assert run.stderr.count("NANOCHAT_WIRINGS") == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]


def test_a_false_kernel_claim_is_one_error_line(monkeypatch, capsys):
    """A wiring whose SPEC says kernel='hyper_connection' but whose layers are its own (static
    HC's, claimed): the command that builds it stops in one `error:` line naming the fix, not
    in a SpecError traceback."""
    static = connections.VARIANTS[STATIC]
    claimed = types.ModuleType("claimed")
    claimed.SPEC = dict(static.SPEC, kernel="hyper_connection")
    claimed.resolve, claimed.make_layers = static.resolve, static.make_layers
    monkeypatch.setitem(connections.VARIANTS, "claimed", claimed)
    with pytest.raises(SystemExit) as e:
        run(lambda: bench.main(BENCH + ["--bench", "model", "--variants", "claimed"]))
    assert e.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: variant 'claimed' declares kernel='hyper_connection' but "
                                               "builds StaticHCLayer layers") and "declare kernel=None" in err[0]


def test_a_member_of_the_family_that_does_not_say_so_is_told_it_could(monkeypatch, tmp_path, capsys):
    """Static HC without `family`: priced as another variant and left out of the family's
    tables, which hc_report --params and the plan say in one line; the wirings that are a
    family of their own (frac, the gated residual: not the H-convention) get no such line."""
    static = connections.VARIANTS[STATIC]
    loose = types.ModuleType("loose_hc")
    loose.SPEC = {key: value for key, value in static.SPEC.items() if key != "family"}
    loose.resolve, loose.make_layers = static.resolve, static.make_layers
    monkeypatch.setitem(connections.VARIANTS, "loose_hc", loose)
    hint = "hc='loose_hc' has n streams and an H_res in the H-convention but declares no family: it could declare"
    hc_report.main(["--params"])
    lines = [line for line in capsys.readouterr().out.splitlines() if "declares no family" in line]
    assert len(lines) == 1 and lines[0].startswith(hint) and 'family="hc"' in lines[0]
    config = tmp_path / "loose.toml"
    config.write_text('model_tag = "loose"\nhc = "loose_hc"\ndepth = 2\nnum_iterations = 10\n'
                      'total_batch_size = 1024\nvocab_size = 512\n')
    text = plan.plan_table(plan.plan_runs([str(config)]), [], 1, assumption=throughput.assumption_for("H100"))
    assert [line for line in text.splitlines() if "declares no family" in line] == [lines[0]]
    assert throughput.family_hint(STATIC) is None and throughput.family_hint("frac") is None and throughput.family_hint("gated") is None
