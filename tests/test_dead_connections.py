"""A wiring that cannot learn does not train silently: base_train tells, in one line, a wiring
whose gradient is rounding alone in the first step after an update, a saddle of its own (DAR's
zero gate over the full sources) from a slow start, looked at again a few steps later (ReZero's
alpha = 0 written naively, in front of nanochat's zero output projections, is still dead then);
and hc_report says so of a checkpoint whose connection parameters sit exactly at their start."""

import dataclasses
import json
import sys
from pathlib import Path

import launch
import pytest
import torch

from nanochat import connections
from nanochat import checkpoint_manager as checkpoint
from nanochat.connections import liveness
from nanochat.gpt import GPTConfig, build_model
from scripts import hc_report
from nanochat.optim import build_optimizer
from scripts.base_train import connection_grad_norm, dead_connections, slow_start_over, start_check
from test_gpt import randomize
from wiring_checks import assert_every_connection_parameter_gets_a_gradient, tokens
from test_train_e2e import REPO, TINY, base, env_for  # noqa: F401 (a fixture)

WARNING = "warning: every connection parameter"
# base_train with a wiring registered in the process: x + alpha F(x) per sub-layer with alpha
# from 0 and the model's zero output projections, so that neither gets a gradient.
NAIVE_REZERO = """
import sys, types, torch
from nanochat import connections
from nanochat.cli import run
from nanochat.connections.frame import ConnectionLayer
from scripts import base_train


class ScaledLayer(ConnectionLayer):
    def __init__(self):
        super().__init__()
        self.alpha = torch.nn.Parameter(torch.empty(1))

    def init_weights(self):
        self.alpha.data.zero_()

    def step(self, X, branch, x0, carry):
        return X + self.alpha * branch(X.squeeze(-2)).unsqueeze(-2), carry


module = types.ModuleType("naive_rezero")
module.SPEC = dict(label="naive ReZero", description="x + alpha F(x), alpha from 0", source="tests", state="single",
                   has_h_res=False, in_paper=False, equals_prenorm_at_init=False, params=lambda cfg: 2 * cfg.n_layer)
module.resolve = lambda cfg: setattr(cfg, "hc_streams", 1)
module.make_layers = lambda cfg: [ScaledLayer() for _ in range(2 * cfg.n_layer)]
connections.VARIANTS["naive_rezero"] = module
sys.argv[0] = "base_train"
run(lambda: base_train.main(sys.argv[1:]))
"""


def test_the_warning_is_for_a_connection_gradient_at_rounding_only():
    """Exactly zero, or rounding against the model's gradient (64 fp32 roundoffs of it:
    connections/liveness.py), warns; a small real gradient does not."""
    line = dead_connections(0.0, 1.0, "rezero", 0)
    assert line.startswith(WARNING) and "hc='rezero'" in line and "\n" not in line and "init_sublayers" in line
    assert dead_connections(1e-9, 1.0, "rezero", 0) is not None  # noise: dead, which "> 0" called alive
    assert dead_connections(1e-4, 1.0, "rezero", 0) is None
    assert dead_connections(1e-9, 1e-6, "rezero", 0) is None  # small, but well above rounding of its scale
    assert dead_connections(None, 1.0, "prenorm", 0) is None  # no connection parameter at all


@pytest.mark.slow
def test_base_train_tells_a_saddle_from_a_slow_start(base):  # noqa: F811
    """The first gradient after an optimizer step decides (step 1: in step 0 the zero output
    projections leave HC and the residual scalars without a gradient too, which is no
    warning). Naive ReZero gets rounding in step 1 but is no saddle of its own (with the body
    moved its alpha learns): a slow start, looked at again 5 steps later, where it is still
    dead (its zero alpha and the zero projections hold each other): the warning. DAR's zero
    gate over the full sources is a saddle: a warning in step 1, after the zero gate's own
    warning at the start. Live wirings print no warning."""
    args = [*TINY, "--num-iterations", "7", "--model-tag"]
    dead = launch.run([sys.executable, "-c", NAIVE_REZERO, *args, "naive", "--hc", "naive_rezero"], cwd=REPO,
                      env=env_for(base), capture_output=True, text=True, timeout=300)
    assert dead.returncode == 0, dead.stderr[-3000:]
    lines = [line for line in dead.stdout.splitlines() if line.startswith((WARNING, "slow start"))]
    assert len(lines) == 2 and lines[0].startswith("slow start:") and "in step 1" in lines[0] \
        and "looking again in step 6" in lines[0], dead.stdout[-3000:]
    assert lines[1].startswith(WARNING) and "in step 6" in lines[1], dead.stdout[-3000:]
    saddle = launch.run([sys.executable, "-m", "scripts.base_train", *TINY, "--num-iterations", "2", "--model-tag",
                         "dar_zero", "--hc", "dar", "--dar-gate", "zero"], cwd=REPO, env=env_for(base),
                        capture_output=True, text=True, timeout=300)
    warned = [line for line in saddle.stdout.splitlines() if line.startswith("warning:")]
    assert saddle.returncode == 0 and len(warned) == 2, saddle.stdout[-3000:]
    assert "--dar-gate zero is the start for converting a pretrained checkpoint" in warned[0]
    assert "starts at a saddle" in warned[1] and "in step 1" in warned[1]
    for hc in ("hc_identity", "residual", "dar"):
        alive = launch.run([sys.executable, "-m", "scripts.base_train", *args, hc, "--hc", hc], cwd=REPO,
                           env=env_for(base), capture_output=True, text=True, timeout=300)
        assert alive.returncode == 0 and "warning:" not in alive.stdout, (hc, alive.stdout[-2000:])
        slow = [line.split(":")[0] for line in alive.stdout.splitlines() if line.startswith("slow start")]
        # DAR's default gate at this batch's small LR: rounding in step 1 (its reads wait for the
        # body), live by step 6
        assert slow == (["slow start", "slow start over"] if hc == "dar" else []), (hc, alive.stdout[-2000:])
    records = [json.loads(line) for line in (Path(base) / "runs" / "hc_identity" / "metrics.jsonl").open()]
    first = next(r for r in records if r["kind"] == "train" and r["step"] == 0)
    assert first["hc_grad_norm"] == 0.0  # step 0: no branch output yet, and no warning for it


def test_rounding_in_step_1_is_a_saddle_or_a_slow_start_as_the_probe_says():
    """DAR's zero gate over the full sources is a saddle (the body's moving leaves its gradient
    at rounding); over the block sources it is a slow start, looked at again 5 steps later
    (base_train printed the dead-wiring warning for both before); a live gradient says nothing."""
    full, block = (tiny("dar", 0, dar_gate="zero", dar_source=source).config for source in ("full", "block"))
    line, again = start_check(1e-12, 1.0, full, 1)
    assert line.startswith("warning: hc='dar' starts at a saddle") and again is None and "\n" not in line
    line, again = start_check(1e-12, 1.0, block, 1)
    assert line.startswith("slow start: hc='dar'") and again == 6 and "looking again in step 6" in line
    assert start_check(1e-4, 1.0, full, 1) == (None, None)
    assert dead_connections(1e-4, 1.0, "dar", 6) is None and "slow start over" in slow_start_over(1e-4, 1.0, "dar", 6)


def after_one_update(hc, **fields):
    """A tiny model of the wiring after base_train's first update, with its step-1 gradients,
    and the optimizer's norms of them."""
    model = tiny(hc, seed=0, **fields)
    optimizer = build_optimizer(model.param_groups(), world_size=1)
    idx = tokens()
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        model(idx[:, :-1], idx[:, 1:]).backward()
        optimizer.step(measure_grad_norm=True)
    return model, optimizer.grad_norms


@pytest.mark.parametrize("hc", connections.VARIANTS)
def test_no_registered_wiring_is_dead_after_one_update(hc):
    """What base_train checks, with its optimizer and groups: after one update every wiring
    with parameters has a connection gradient above rounding (against the model's: parts of
    it may still be at rounding here, e.g. the HC family's alphas and norm weights, whose
    gradients scale with W, zero at init and one update from it)."""
    _, norms = after_one_update(hc)
    assert dead_connections(connection_grad_norm(norms), float(norms["total"]), hc, 1) is None


@pytest.mark.parametrize("source", ["full", "block"])
def test_dar_learns_from_its_default_gate_and_not_from_the_zero_gate_over_the_full_sources(source):
    """The default gate (none) learns over every source form; the zero gate, kept for converting
    checkpoints, over the full sources gets rounding alone: each read is h / N, which the norm
    undoes (docs/variants.md, 'Dead by construction')."""
    _, norms = after_one_update("dar", dar_source=source)
    assert dead_connections(connection_grad_norm(norms), float(norms["total"]), "dar", 1) is None
    _, norms = after_one_update("dar", dar_source=source, dar_gate="zero")
    learns = dead_connections(connection_grad_norm(norms), float(norms["total"]), "dar", 1) is None
    assert learns == (source == "block")


def save(run_dir, model, step=10):
    """A run directory holding `model` as the checkpoint of `step`."""
    meta = {"step": step, "model_config": dataclasses.asdict(model.config), "world_size": 1,
            "settings": {"depth": model.config.n_layer, "hc": model.config.hc, "total_batch_size": 1024, "seed": 0}}
    checkpoint.save_rank_files(run_dir, step, 0, {}, model_state=model.state_dict(), meta=meta)
    checkpoint.mark_latest(run_dir, step)


def tiny(hc, seed, **fields):
    torch.manual_seed(seed)
    return build_model(GPTConfig(sequence_len=32, vocab_size=512, n_layer=2, n_head=2, n_kv_head=2, n_embd=64, hc=hc,
                                 **fields), "cpu")


@pytest.mark.parametrize("hc", ["cmhc", "kromhc", "dar"])
def test_hc_report_says_when_the_connections_sit_at_their_start(tmp_path, capsys, hc):
    """C-mHC's projection starts random (another seed here than the 'run's'): its seed-free
    parameters decide. The body moved alone still warns; the connections moved do not."""
    at_start = randomize(tiny(hc, seed=3), seed=1)
    with torch.no_grad():
        at_start.connections.init_weights()
    trained = randomize(tiny(hc, seed=3), seed=1)
    for name, model in (("at_start", at_start), ("trained", trained)):
        save(tmp_path / name, model)
        hc_report.main(["--checkpoint", str(tmp_path / name), "--random-tokens", "--device-type", "cpu",
                        "--batch-size", "2"])
        warned = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
        assert len(warned) == (name == "at_start") and all("sits exactly at its start" in w for w in warned), name


def test_only_seed_free_starts_are_compared():
    cfg = tiny("cmhc", seed=0).config
    start = connections.seed_free_init(cfg)
    assert start and not any(name.endswith(".weight") and p.dim() == 2 for name, p in start.items())  # phi is random
    assert connections.sits_at_init(tiny("prenorm", seed=0).connections, tiny("prenorm", 0).config) is None


def test_a_dead_slice_of_a_live_parameter_shows_when_the_slice_is_judged_on_its_own():
    """Judged whole, W learns; judged by its declared column groups, its res columns do not."""
    grads = {"w": torch.cat([torch.ones(4, 2), torch.full((4, 2), 1e-20)], dim=1), "a": torch.ones(3)}
    assert not liveness.surprises(liveness.report(grads, {}, dtype=torch.float64))
    rows = liveness.report(grads, {}, ["w[:, 0:2]", "w[:, 2:4]", "a[0:1]"], torch.float64)
    assert [r["name"] for r in liveness.surprises(rows)] == ["w[:, 2:4]"]
    assert [r["name"] for r in rows if r["part"] == "live"] == ["w[:, 0:2]", "w[:, 2:4]", "a[0:1]", "a"]
    rows = liveness.report(grads, {"w[:, 2:4]": "dead"}, ["w[:, 0:2]", "w[:, 2:4]"], torch.float64)
    assert not liveness.surprises(rows) and [r["part"] for r in rows] == ["live", "live", "declared dead"]


def shipped_wirings():
    """One tiny config per distinct wiring setting of the shipped configs (depth 2, width 64)."""
    from nanochat.saddle import probe_config
    from nanochat.train_config import model_config_for, parse_args
    seen = {}
    for path in sorted((Path(__file__).resolve().parent.parent / "configs").rglob("*.toml")):
        config = probe_config(dataclasses.replace(model_config_for(parse_args(["--config", str(path)]), 512),
                                                  n_layer=2, window_pattern="SL", attnres_block_size=0))
        if connections.spec(config.hc).params(config):
            seen.setdefault((config.hc, repr(connections.own_settings(config)), config.trunk), (path, config))
    return list(seen.values())


@pytest.mark.parametrize("path, config", shipped_wirings(),
                         ids=lambda v: f"{v.parent.name}/{v.stem}" if isinstance(v, Path) else "")
def test_every_shipped_wiring_is_dead_exactly_where_it_declares(path, config):
    """Every parameter randomized, fp64, each declared slice judged on its own: the last
    sub-layer's res slices are dead under the summed readout of the exactly doubly stochastic
    wirings (the gpt2 KromHC and the LSS configs included), layer 0's res slices under delayed
    pre-weights too, and nothing else (the learned head reads them)."""
    torch.manual_seed(0)
    assert_every_connection_parameter_gets_a_gradient(build_model(config, "cpu"))
    spec = connections.spec(config.hc)
    dead = spec.dead_parameters(config)
    if spec.kernel == "hyper_connection":  # every layer's column groups are judged on their own
        assert len(spec.judged_parts(config)) == 2 * config.n_layer * (9 if config.hc != "hc_identity" else 6)
    last = f"layers.{2 * config.n_layer - 1}.bias"
    if config.hc in ("mhc", "mhc_lite", "kromhc", "go_mhc", "cmhc"):
        assert any(name.startswith(last) for name in dead) == (config.hc_reduce == "sum" and config.hc_pre == "current")
    if config.hc_pre == "delayed" and config.hc in ("kromhc", "mhc_lite", "go_mhc", "cmhc"):
        assert "layers.0.alpha[2:3]" in dead and "layers.0.alpha[0:1]" not in dead
