"""scripts/hc_report: the parameter tables and the checkpoint diagnostics (hc_stats.json)."""

import dataclasses
import json
import sys

import launch
import pytest
import torch

from nanochat import checkpoint_manager as checkpoint
from nanochat.connections.diagnostics import model_hc_params
from nanochat.gpt import GPT, GPTConfig, build_model, model_config_from_depth
from scripts import hc_report


def test_params_tables(capsys):
    hc_report.main(["--params"])
    out = capsys.readouterr().out
    for variant, name in (("mhc", "mHC"), ("mhc_lite", "mHC-lite"), ("kromhc", "KromHC")):
        row = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert f"{model_hc_params(variant, 4, 384, 6) / 1e3:.1f}K" in row
        assert f"{model_hc_params(variant, 4, 768, 12) / 1e3:.1f}K" in row
    assert "Largest difference to the paper: 0.19%" in out
    assert "3.39M" in out and "12.09M" in out and "match no parameter convention" in out
    assert "(infeasible)" in out and "n/a (prime > 5)" in out


def test_params_flop_convention_at_d12(capsys):
    """The FLOP convention's shares at D = 12, n = 4: connection projections counted (6 per
    parameter, as GPT.estimate_flops does), stream mixes and building H_res not (under 1 %)."""
    from nanochat.connections.diagnostics import stream_mix_flops
    hc_report.main(["--params"])
    section = capsys.readouterr().out.split("FLOP convention at D=12, n=4")[1].split("\n\n")[1]
    rows = {line.rsplit(None, 3)[0]: line.split()[-3:] for line in section.splitlines()[2:]}
    for variant, name in (("mhc", "mHC"), ("kromhc", "KromHC"), ("residual", "Residual")):
        config = model_config_from_depth(12, 32768, 2048, hc=variant, hc_streams=0 if variant == "residual" else 4)
        with torch.device("meta"):
            model = GPT(config)
        counted = model.estimate_flops()
        left_out = 0 if variant == "residual" else 24 * stream_mix_flops(variant, 4, 768)
        assert rows[name] == [f"{counted / 1e9:.3f}G", f"{100 * 6 * model.param_counts()['connections'] / counted:.2f}%",
                              f"{100 * left_out / counted:.2f}%"]
    assert all(0 < float(cells[2].rstrip("%")) < 1 for name, cells in rows.items() if name != "Residual")
    assert float(rows["KromHC"][1].rstrip("%")) < float(rows["mHC"][1].rstrip("%"))


def test_params_model_sizes_beside_the_papers(capsys):
    """Both layouts at D = 6 and 12 beside the paper's ~60M / ~186M, counted from real models."""
    hc_report.main(["--params"])
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.split("Table 3")[0].splitlines()
            if line.split() and line.split()[0] in ("6", "12")}
    for depth, paper_size in ((6, "~60M"), (12, "~186M")):
        expected = [paper_size]
        for vocab, value_embeds in ((32768, True), (65536, False)):
            with torch.device("meta"):
                counts = GPT(model_config_from_depth(depth, vocab, 2048, value_embeds=value_embeds)).param_counts()
            expected += [f"{counts['total'] / 1e6:.1f}M", f"{counts['non_embedding'] / 1e6:.1f}M"]
        assert rows[str(depth)][1:] == expected
    assert rows["6"][2] == "73.5M" and rows["6"][4] == "60.9M"  # nanochat's and the paper's sizes
    assert "--vocab-size 65536 --value-embeds false" in out


def test_params_custom_depth_and_factors(capsys):
    hc_report.main(["--params", "--depth", "6", "--streams", "8", "--factors", "4", "2"])
    out = capsys.readouterr().out.split("n = 8, D = 6")[1]
    assert f"{model_hc_params('kromhc', 8, 384, 6, [4, 2]):,}" in out
    assert "refused: n > 6" in out


def test_help_runs():
    result = launch.run([sys.executable, "-m", "scripts.hc_report", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "--checkpoint" in result.stdout


def save_checkpoint(tmp_path, variant):
    cfg = GPTConfig(sequence_len=16, vocab_size=64, n_layer=2, n_head=2, n_kv_head=2, n_embd=32, hc=variant)
    model = build_model(cfg, "cpu")
    run_dir = str(tmp_path / "run")
    meta = {"model_config": dataclasses.asdict(cfg), "step": 5, "world_size": 1}
    checkpoint.save_rank_files(run_dir, 5, 0, {}, model.state_dict(), meta)
    checkpoint.mark_latest(run_dir, 5)
    return model, run_dir


@pytest.mark.parametrize("variant", ("kromhc", "residual", "go_mhc"))
def test_checkpoint_writes_hc_stats(tmp_path, capsys, variant):
    model, run_dir = save_checkpoint(tmp_path, variant)
    hc_report.main(["--checkpoint", run_dir, "--random-tokens", "--device-type", "cpu", "--batch-size", "2"])
    out = capsys.readouterr().out
    assert "random tokens" in out and "hc_stats.json" in out
    stats = json.load(open(tmp_path / "run" / "hc_stats.json"))
    assert stats["variant"] == variant and stats["n"] == model.connections.n and stats["step"] == 5
    assert stats["tokens"] == 2 * 16 and len(stats["layers"]) == 4
    for key in ("composite_col_mae", "composite_row_mae", "fwd_gain", "bwd_gain", "effective_streams_mean"):
        assert isinstance(stats[key], float)
    # at init every stream is a copy of the embedding: one direction, whatever n
    assert "stream collapse" in out and stats["final"]["effective_streams"] == pytest.approx(1)


def test_params_lists_what_the_options_add(capsys):
    hc_report.main(["--params"])
    out = capsys.readouterr().out.split("Options beyond the paper")[1].split("Table")[0]
    kromhc = next(line.split() for line in out.splitlines() if line.startswith("KromHC"))
    assert kromhc[1:] == [f"{model_hc_params('kromhc', 4, 768, 12, **o):,}"
                          for o in ({}, dict(expand="lss"), dict(reduce="learned"), dict(pre="delayed"))]


def test_checkpoint_missing_run_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="neither a directory nor a model tag"):
        hc_report.main(["--checkpoint", str(tmp_path / "nope"), "--random-tokens"])


def test_checkpoint_of_attention_residuals_shows_its_reads(tmp_path, capsys):
    """No streams, no H_res: the weights of each read, and the other measures named not applicable."""
    _, run_dir = save_checkpoint(tmp_path, "attnres")
    hc_report.main(["--checkpoint", run_dir, "--random-tokens", "--device-type", "cpu", "--batch-size", "2"])
    out = capsys.readouterr().out
    stats = json.load(open(tmp_path / "run" / "hc_stats.json"))
    assert stats["doubly_stochastic"] == "not applicable" and "composite_row_mae" not in stats
    assert [layer["sources"] for layer in stats["layers"]] == [1, 2, 3, 4]  # depth 2: blocks of 1 module (Full)
    assert "block size 1 sub-layers (4 blocks; default size 1)" in out and "not applicable" in out
    assert "0.50 0.50" in out  # a plain mean at init


def test_params_lists_the_variants_beyond_the_family(capsys):
    hc_report.main(["--params", "--depth", "12"])
    out = capsys.readouterr().out
    beyond = out.split("Beyond the paper's family")[1].split("Table")[0]
    rows = {line.rsplit(None, 2)[0]: line.split()[-2:] for line in beyond.splitlines() if line[:2] in ("go", "Fr", "Bl")}
    assert rows["Frac-Connections (m = 4)"] == ["11,976", "46,992"]  # the Frac paper's formula at d6, d12
    assert rows["Block AttnRes (baseline)"] == [f"{13 * 768:,}", "38,400"]
    assert rows["go-mHC (n = 4, s = 2)"] == [f"{model_hc_params('go_mhc', 4, C, d):,}" for d, C in ((6, 384), (12, 768))]
    custom = out.split("n = 4, D = 12")[1]
    assert "46,992" in custom and "38,400" in custom and "go-mHC" in custom
