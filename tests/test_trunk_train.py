"""The 2026-07 trunk through the real CLI: a run killed and resumed equals the straight one
bitwise, the log names the trunk, a resume on the other trunk is refused with one line; and
its rules that set the run's size (automatic batch, weight decay, schedules) as nanochat 92d63d4
states them."""

import ast
import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest

from nanochat import trunks
from nanochat.train_config import horizon_tokens, model_config_for, parse_args, resolve_total_batch
from scripts.base_train import lr_multiplier, muon_momentum, muon_weight_decay
from test_train_e2e import base, kill_resume_and_compare, train  # noqa: F401  (base: the fixture)

MODERN = ["--trunk", "2026-07"]


@pytest.mark.slow
def test_a_2026_07_run_resumes_bitwise_and_keeps_its_trunk(base):  # noqa: F811
    """On its own corpus directory and tokenizer (ClimbMix's, by default: here the tests' corpus
    and tokenizer copied there), a run killed and resumed equals the straight one."""
    for default, climbmix in (("base_data", "base_data_climbmix"), ("tokenizer", "tokenizer_climbmix")):
        shutil.move(os.path.join(base, default), os.path.join(base, climbmix))
    kill_resume_and_compare(base, [*MODERN, "--hc", "kromhc", "--num-iterations", "8", "--save-every", "2"])
    corpus = json.load(open(os.path.join(base, "runs", "straight", "corpus.json")))
    assert corpus["data_dir"] == os.path.join(base, "base_data_climbmix")
    proc = train(base, "--num-iterations", "8", "--model-tag", "straight", "--resume", "true", "--corpus", "climbmix",
                 check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "trained on the 2026-07 trunk, not 2026-01: resume it with --trunk 2026-07" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("depth, batch", [(12, 2 ** 19), (24, 2 ** 20), (26, 2 ** 20), (8, 2 ** 18)])
def test_the_automatic_batch_is_nanochats(depth, batch):
    """2^19 at depth 12 and 1M tokens at depth 26 (NANOCHAT_2026's record 3); depth 8 and 24 by
    the rule: B = 2^round(log2(2^19 (N/N_12)^0.383)), N the scaling parameters."""
    args = parse_args(["--trunk", "2026-07", "--depth", str(depth)])
    assert args.total_batch_size == "auto"
    got, line = resolve_total_batch(args, model_config_for(args, 32768), 32768)
    assert got == batch and "auto" in line


def test_an_explicit_batch_wins_over_the_trunks_auto():
    assert parse_args(["--trunk", "2026-07", "--total-batch-size", "1024"]).total_batch_size == 1024


def test_weight_decay_follows_the_batch_and_the_horizon():
    """lambda = lambda_ref sqrt(B / 2^19) (D_12 / D): at depth 12 and 2^19, unchanged."""
    assert trunks.scaled_weight_decay("2026-07", 0.28, 12, 2 ** 19, (1000, 1000.0)) == 0.28
    assert trunks.scaled_weight_decay("2026-07", 0.28, 24, 2 ** 20, (4000, 1000.0)) == pytest.approx(
        0.28 * math.sqrt(2) / 4)
    assert trunks.scaled_weight_decay("2026-01", 0.2, 24, 2 ** 20) == pytest.approx(0.05)


# nanochat 92d63d4's base_train.py at its defaults (depth 20, data:param 12, aspect 64, head dim 128,
# T 2048, vocab 32,768), its lines run with its own GPT on the meta device from a checkout:
# target_tokens = int(12 * N_20), D_REF = 12 * N_12 (a float), the auto batch, and
# weight_decay_scaled = 0.28 * math.sqrt(total_batch_size / B_REF) * (D_REF / target_tokens).
UPSTREAM_D20 = dict(target_tokens=5_221_922_880, D_REF=1_321_210_944.0, batch=2 ** 20, weight_decay=0.1001877764255601)


def test_weight_decay_at_depth_20_is_nanochats_to_the_last_bit():
    """fp64, bitwise (Python floats: every step correctly rounded, the same on every machine):
    our horizons, batch and decay are 92d63d4's; dividing by the horizon ratio instead, as this
    code did, lands one ulp away."""
    args = parse_args(["--trunk", "2026-07", "--depth", "20"])
    config = model_config_for(args, 32768)
    target, reference = horizon_tokens(args, config, 32768)
    batch = resolve_total_batch(args, config, 32768)[0]
    assert (target, reference, batch) == (UPSTREAM_D20["target_tokens"], UPSTREAM_D20["D_REF"], UPSTREAM_D20["batch"])
    ours = trunks.scaled_weight_decay("2026-07", args.weight_decay, 20, batch, (target, reference))
    assert ours == 0.28 * math.sqrt(batch / 2 ** 19) * (reference / target) == UPSTREAM_D20["weight_decay"]
    other_order = 0.28 * math.sqrt(batch / 2 ** 19) / (target / reference)
    assert abs(other_order - ours) == math.ulp(ours)


def test_the_2026_07_schedules():
    n, warmdown = 2000, 0.65  # the warmdown starts at step 700, after the 400-step momentum ramp
    start = n - round(warmdown * n)
    assert lr_multiplier(0, n, 0.0, warmdown, 0.05, warmup_steps=40) == pytest.approx(1 / 40)
    assert lr_multiplier(39, n, 0.0, warmdown, 0.05, warmup_steps=40) == 1.0
    assert lr_multiplier(start, n, 0.0, warmdown, 0.05, warmup_steps=40) == 1.0
    assert lr_multiplier(n, n, 0.0, warmdown, 0.05, warmup_steps=40) == pytest.approx(0.05)
    assert muon_momentum(0, "2026-07", n, warmdown) == 0.85
    assert muon_momentum(200, "2026-07", n, warmdown) == pytest.approx(0.91)
    assert muon_momentum(start - 1, "2026-07", n, warmdown) == 0.97
    assert muon_momentum(n, "2026-07", n, warmdown) == pytest.approx(0.90)
    assert muon_momentum(300, "2026-01") == 0.95  # the paper trunk's: 0.85 -> 0.95 over 300 steps
    assert muon_weight_decay(0, n, 0.2, "2026-07") == 0.2
    assert muon_weight_decay(n // 2, n, 0.2, "2026-07") == pytest.approx(0.1)
    assert muon_weight_decay(n, n, 0.2, "2026-07") == pytest.approx(0.0, abs=1e-12)
    assert muon_weight_decay(n // 2, n, 0.2, "2026-01") == pytest.approx(0.1)  # linear there


def test_the_trunks_defaults_and_an_explicit_flag():
    old, new = parse_args([]), parse_args(["--trunk", "2026-07"])
    for name, value in trunks.FLAG_DEFAULTS["2026-01"].items():
        assert getattr(old, name) == value, name
    for name, value in trunks.FLAG_DEFAULTS["2026-07"].items():
        assert getattr(new, name) == value, name
    assert parse_args(["--trunk", "2026-07", "--warmdown-ratio", "0.3"]).warmdown_ratio == 0.3


def test_what_a_trunk_does_is_read_from_its_record_only():
    """Every value that differs by trunk is a field of its record (nanochat/trunks.py), and each
    record sets the same flags: no other module compares a trunk's name to a literal."""
    assert len({frozenset(r.flag_defaults) for r in trunks.RECIPES.values()}) == 1
    root = Path(__file__).resolve().parent.parent
    found = []
    for path in [*(root / "nanochat").rglob("*.py"), *(root / "scripts").rglob("*.py")]:
        if path.name == "trunks.py" and path.parent.name == "nanochat":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                    isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"\d{4}-\d{2}", n.value)
                    for n in (node.left, *node.comparators)):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not found, found


@pytest.mark.slow
def test_fp8_off_cuda_is_one_error_line(base):  # noqa: F811
    proc = train(base, "--fp8", "true", "--num-iterations", "1", check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert lines[-1].startswith("error: --fp8 needs a CUDA GPU") and "drop --fp8" in lines[-1], lines[-1]
