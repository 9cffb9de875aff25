"""The plan on the 2026-07 trunk: a config's missing flags take that trunk's defaults, its
automatic total batch and data:param horizon price it, TRUNK moves a mode's runs there under
their own tags, and ClimbMix shards are counted at that corpus's rate."""

import argparse
import math

import pytest

from nanochat import trunks
from nanochat.planning import plan, sizing
from nanochat.train_config import model_config_for, parse_args, scaling_params
from scripts import plan as plan_cli

TINY = {"depth": 2, "aspect_ratio": 32, "head_dim": 32, "max_seq_len": 64, "vocab_size": 512}


def write_config(directory, tag, **settings):
    path = directory / f"{tag}.toml"
    path.write_text("".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in {"model_tag": tag, **settings}.items()))
    return str(path)


def test_a_2026_07_config_is_priced_with_its_auto_batch_and_its_horizon(tmp_path):
    config = write_config(tmp_path, "t", trunk="2026-07", hc="residual", **TINY)
    run = plan.plan_runs([config])[0]
    assert (run.trunk, run.corpus, run.batch, run.steps, run.tokens) == ("2026-07", "climbmix", None, None, None)
    sizing.resolve(run)
    # nanochat 92d63d4's rule, written out: 2^19 x (N / N at depth 12)^0.383 to a power of two,
    # and the trunk's 12 tokens per scaling parameter.
    args = parse_args(["--config", config])
    n = scaling_params(model_config_for(args, 512))
    n12 = scaling_params(model_config_for(argparse.Namespace(**{**vars(args), "depth": 12}), 512))
    batch = 2 ** round(math.log2(2 ** 19 * (n / n12) ** 0.383))
    assert (run.batch, run.steps) == (batch, int(12 * n) // batch)
    assert run.tokens == run.steps * batch and run.flops == run.tokens * run.flops_per_token


def test_trunk_moves_a_paper_config_to_that_trunks_defaults_under_its_own_tag():
    paper = plan.RunSpec("configs/paper/d12_kromhc.toml")
    assert plan.on_trunk(paper, "2026-01") is paper
    with pytest.raises(ValueError, match="2026-07"):
        plan.on_trunk(paper, "2025-12")
    run = plan.plan_runs([plan.on_trunk(paper, "2026-07")])[0]
    assert (run.tag, run.trunk, run.batch, run.steps) == ("paper_d12_kromhc_t2607", "2026-07", None, None)
    # base_train, given the run's flags over the paper's TOML (which pins 2026-01's values),
    # trains with every default of 2026-07 and the trunk's data:param horizon
    args = sizing._train_args(sizing._shape_key(run))
    for name, value in trunks.FLAG_DEFAULTS["2026-07"].items():
        assert getattr(args, name) == value, name
    assert (args.trunk, args.num_iterations, args.target_flops) == ("2026-07", -1, -1.0)
    assert run.flags[-2:] == ["--model-tag", "paper_d12_kromhc_t2607"]
    # a ladder's run keeps its own horizon
    ladder = plan.on_trunk(plan.ladder_specs(["configs/paper/d12_kromhc.toml"], [6], 20)[0], "2026-07")
    run = plan.plan_runs([ladder], seeds=2)[1]
    args = sizing._train_args(sizing._shape_key(run))
    assert run.tag == "ladder_d6_kromhc_t2607_s1"
    assert (args.trunk, args.depth, args.target_param_data_ratio, args.total_batch_size) == ("2026-07", 6, 20.0, "auto")


def test_climbmix_shards_for_the_record_run_and_one_corpus_per_mode(tmp_path, capsys):
    record = "configs/gpt2/d24_residual.toml"
    runs = plan.plan_runs([record])
    assert (runs[0].trunk, runs[0].corpus, runs[0].fp8) == ("2026-07", "climbmix", True)
    # nanochat 92d63d4's speedrun.sh downloads about 150 shards for this run: 10 % on top
    assert plan.shards_needed(runs) == 165
    assert plan_cli.main(["--configs", record, "--runs-root", str(tmp_path), "--gpu-check", "none", "--corpus"]) is None
    assert capsys.readouterr().out == "climbmix\n"
    with pytest.raises(SystemExit, match="^error: the runs read climbmix and fineweb-edu; a mode trains on one"):
        plan_cli.main(["--configs", record, "configs/paper/d6_residual.toml", "--runs-root", str(tmp_path),
                       "--gpu-check", "none", "--shards"])
