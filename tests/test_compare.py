"""scripts.compare and the report's "Compute multiplier" section over run directories that
hold only config.toml, summary.json and metrics.jsonl: a ladder with a known multiplier
(tests/cm_curves.py), seeds pooled, runs written before the compute records, and every bad
input answered by one `error:` or `warning:` line."""

import json
import math
import shutil

import pytest
from cm_curves import ladder_run

from nanochat.studies import compute_multiplier as cm
from nanochat.cli import run
from nanochat.report.build import write_report
from nanochat.report.cm import check_comparable
from nanochat.report.compute import spend_of
from nanochat.report.runs import load_run
from scripts import compare as compare_cli

DEPTHS = (4, 6, 8)
PER_DEPTH_KEYS = {"depth", "seeds", "bpb", "flops", "seconds", "cm", "cm_ci", "wall_cm", "nanochat_cm", "extrapolated",
                  "nanochat_extrapolated"}
FLOPS_PER_SECOND = 1e13


def write_run(root, name, depth, curve, step_flops, hc="residual", seed=42, slower=1.0, complete=True, record=True,
              dataset="fineweb-edu (test)", tokenizer="512 tokens, 0123456789ab", device="NVIDIA H100 80GB HBM3",
              world=8, shift=0.0):
    """A run directory as base_train leaves it (without checkpoints). `record=False` writes what
    runs from before the compute records held; `shift` moves every bpb (seed noise)."""
    run = root / name
    run.mkdir(parents=True)
    batch = 2 ** 15
    config = {"depth": depth, "hc": hc, "hc_streams": 0 if hc == "residual" else 4, "seed": seed, "data_seed": -1,
              "model_tag": name, "total_batch_size": batch, "target_param_data_ratio": 12}
    (run / "config.toml").write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in config.items()))
    records = []
    for flops, bpb in curve:
        step = round(flops / step_flops)
        val = {"step": step, "kind": "val", "bpb": bpb + shift}
        if record:
            val.update(flops=flops, tokens=step * batch, train_seconds=flops * slower / FLOPS_PER_SECOND)
        records.append(val)
    steps = round(curve[-1][0] / step_flops)
    if not complete:
        records = records[: len(records) // 2]
    records.append({"step": 0, "kind": "train", "loss": 5.0, "dt": 0.1})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if complete:
        summary = {"complete": True, "step": steps, "num_iterations": steps, "val_bpb": curve[-1][1] + shift,
                   "hc": hc, "hc_streams": config["hc_streams"] or 1, "depth": depth, "model_dim": 64 * depth}
        if record:
            summary.update(flops_per_token=step_flops / batch, tokens=steps * batch, total_flops=curve[-1][0],
                           train_seconds=curve[-1][0] * slower / FLOPS_PER_SECOND,
                           wall_seconds=1.1 * curve[-1][0] * slower / FLOPS_PER_SECOND, device_name=device,
                           world_size=world, dataset=dataset, tokenizer=tokenizer)
        (run / "summary.json").write_text(json.dumps(summary))
    return run


def ladder(root, k=1.2, seeds=2, depths=DEPTHS, variant_depths=DEPTHS, **kw):
    """Residual and KromHC (worth k, 10 % slower per FLOP) at these depths, `seeds` seeds each."""
    for d in depths:
        step_flops, curve = ladder_run(d)
        for s in range(seeds):
            write_run(root, f"d{d}_residual" + (f"_s{s}" if s else ""), d, curve, step_flops, seed=42 + s,
                      shift=0.002 * s, **kw)
    for d in variant_depths:
        step_flops, curve = ladder_run(d, k)
        for s in range(seeds):
            write_run(root, f"d{d}_kromhc" + (f"_s{s}" if s else ""), d, curve, step_flops, hc="kromhc", seed=42 + s,
                      slower=1.1, shift=0.0015 * s, **kw)


def run_compare(root, *flags, capsys=None):
    out = root / "out"
    compare_cli.main(["--runs-root", str(root), "--json", str(out / "cm.json"), "--out", str(out),
                      "--resamples", "100", *flags])
    return json.loads((out / "cm.json").read_text())


def test_compare_by_label_pools_seeds_and_recovers_the_multiplier(tmp_path, capsys):
    ladder(tmp_path)
    result = run_compare(tmp_path)
    printed = capsys.readouterr().out
    assert "kromhc" in printed and "ladder-level CM" in printed
    v = result["variants"]["kromhc"]
    assert [row["depth"] for row in v["per_depth"]] == list(DEPTHS)
    for row in v["per_depth"]:
        assert PER_DEPTH_KEYS <= set(row) and row["seeds"] == 2
        assert row["cm"] == pytest.approx(1.2, rel=0.05)
        assert row["cm_ci"][0] < row["cm"] < row["cm_ci"][1]
        assert row["wall_cm"] == pytest.approx(row["cm"] / 1.1, rel=1e-6)  # the same fit, in seconds
    assert v["ladder_cm"] == pytest.approx(1.2, rel=0.03) and v["ladder_ci"][0] < v["ladder_cm"] < v["ladder_ci"][1]
    assert "bootstrap" in v["ladder_ci_kind"] and isinstance(v["beyond_noise"], bool)
    assert result["device"] == "NVIDIA H100 80GB HBM3 x 8" and result["baseline"]["fit"]["points"] == 3
    # the per-tag column is nanochat's reading against the seed-matched baseline curve, unrounded
    d6 = next(row for row in v["per_depth"] if row["depth"] == 6)
    pairs = []
    for suffix in ("", "_s1"):
        base = spend_of(load_run(tmp_path / f"d6_residual{suffix}"))[0]
        var = spend_of(load_run(tmp_path / f"d6_kromhc{suffix}"))[0]
        pairs.append(cm.per_tag_cm(base.curve, var.bpb, var.flops).cm)
    assert d6["nanochat_cm"] == pytest.approx(math.sqrt(pairs[0] * pairs[1]), rel=1e-12) and d6["nanochat_extrapolated"]
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "| Depth | Seeds | bpb |" in md and "Ladder-level CM" in md and "Holm-Bonferroni" in md
    assert (tmp_path / "out" / "cm_finals.png").is_file() and (tmp_path / "out" / "cm_vs_compute.png").is_file()


def test_compare_by_tags(tmp_path):
    ladder(tmp_path, seeds=2)
    result = run_compare(tmp_path, "--baseline", "d4_residual,d6_residual,d8_residual",
                         "--variant", "krom=d4_kromhc,d8_kromhc")
    v = result["variants"]["krom"]
    assert [(row["depth"], row["seeds"]) for row in v["per_depth"]] == [(4, 2), (8, 2)]  # tags take their seeds
    assert result["baseline"]["runs"] == sorted(f"d{d}_residual{s}" for d in DEPTHS for s in ("", "_s1"))


def test_one_seed_gives_a_stated_estimate(tmp_path):
    ladder(tmp_path, seeds=1, depths=(4, 6, 8, 10))
    v = run_compare(tmp_path)["variants"]["kromhc"]
    assert all("estimate: one seed" in row["cm_ci_kind"] and "baseline fit's residual" in row["cm_ci_kind"]
               for row in v["per_depth"])
    assert "t over 3 depths" in v["ladder_ci_kind"]


def test_one_seed_on_three_depths_takes_the_noise_from_the_variants_scatter(tmp_path):
    """3 baseline depths fit exactly (no residual) and no seeds: the stated estimate uses the
    variant's scatter about L(k·C) instead."""
    ladder(tmp_path, seeds=1)
    v = run_compare(tmp_path)["variants"]["kromhc"]
    assert all("estimate: one seed" in row["cm_ci_kind"] and "variant's scatter" in row["cm_ci_kind"]
               and row["cm_ci"][0] < row["cm"] < row["cm_ci"][1] for row in v["per_depth"])


def test_runs_from_before_the_compute_records_are_reconstructed(tmp_path):
    """An old run (no flops_per_token, tokens, seconds in its files): FLOPs rebuilt from its
    config and recorded vocabulary by GPT.estimate_flops, marked as such; recorded fields win."""
    import torch

    from nanochat.gpt import GPT, model_config_from_depth
    step_flops, curve = ladder_run(4)
    old = load_run(write_run(tmp_path, "old", 4, curve, step_flops, record=False))
    old.summary["params"] = {"lm_head": 512 * 256}
    old.config.update(max_seq_len=64, window_pattern="SL")
    spend, why = spend_of(old)
    with torch.device("meta"):
        fpt = GPT(model_config_from_depth(4, 512, 64, window_pattern="SL")).estimate_flops()
    steps = old.summary["step"]
    assert why is None and spend.flops == fpt * steps * 2 ** 15 and spend.tokens == steps * 2 ** 15
    assert set(spend.reconstructed) == {"flops_per_token", "tokens", "total_flops", "train_seconds", "val flops"}
    assert spend.curve[0] == (250 * 2 ** 15 * fpt, curve[0][1]) and spend.device is None
    # recorded values are taken as they are, whatever a reconstruction would give
    new = load_run(write_run(tmp_path, "new", 4, curve, step_flops))
    new.summary["params"] = {"lm_head": 512 * 256}
    assert spend_of(new)[0].flops == curve[-1][0] and spend_of(new)[0].reconstructed == ()


def test_old_runs_compare_and_say_what_was_rebuilt(tmp_path, capsys):
    """A whole ladder from before the records: compare works from config.toml, summary.json and
    metrics.jsonl, flags the reconstruction, and refuses the wall-clock CM (no device recorded)."""
    for d in DEPTHS:
        for hc, k in (("residual", 1.0), ("kromhc", 1.2)):
            step_flops, curve = ladder_run(d, k)
            run = write_run(tmp_path, f"d{d}_{hc}", d, curve, step_flops, hc=hc, record=False)
            summary = json.loads((run / "summary.json").read_text())
            summary["params"] = {"lm_head": 512 * 64 * d}
            (run / "summary.json").write_text(json.dumps(summary))
    result = run_compare(tmp_path)
    assert "warning: wall-clock CM refused" in capsys.readouterr().err
    v = result["variants"]["kromhc"]
    assert v["ladder_cm"] is not None and all("total_flops" in row["reconstructed"] for row in v["per_depth"])
    assert "Reconstructed" in (tmp_path / "out" / "compare.md").read_text()


def test_an_anchor_below_the_baseline_floor(tmp_path, capsys):
    """A variant final below the fitted floor a: no baseline compute reaches it; said, not inf."""
    ladder(tmp_path, seeds=1)
    step_flops, curve = ladder_run(10, 1.2)
    write_run(tmp_path, "d10_kromhc", 10, curve, step_flops, hc="kromhc", shift=-0.4)
    result = run_compare(tmp_path)
    row = result["variants"]["kromhc"]["per_depth"][-1]
    assert row["depth"] == 10 and row["bpb"] < result["baseline"]["fit"]["a"]
    assert row["below_floor"] and row["cm"] is None and row["extrapolated"]
    assert "below floor" in capsys.readouterr().out
    assert "below the fit's floor" in (tmp_path / "out" / "compare.md").read_text()


# ------------------------------------------------------------------------------------------
# Bad input: one line each

def lines_with(text, prefix):
    return [line for line in text.splitlines() if line.startswith(prefix)]


def test_one_baseline_depth_keeps_the_per_tag_cm(tmp_path, capsys):
    ladder(tmp_path, seeds=1, depths=(6,), variant_depths=(6, 8))
    v = run_compare(tmp_path)["variants"]["kromhc"]
    warnings = lines_with(capsys.readouterr().err, "warning:")
    assert len(warnings) == 1 and "a ladder fit needs 2 or more" in warnings[0] and "per-tag" in warnings[0]
    assert v["ladder_cm"] is None and v["per_depth"][0]["cm"] is None and v["per_depth"][0]["nanochat_cm"] > 1
    assert v["per_depth"][1]["nanochat_cm"] is None  # no baseline at depth 8


def test_a_baseline_that_does_not_fall_with_compute(tmp_path, capsys):
    for d, shift in ((4, 0.0), (6, 1.0)):  # the larger model ends worse: no a + b·C^-c fits
        step_flops, curve = ladder_run(d)
        write_run(tmp_path, f"d{d}_residual", d, curve, step_flops, shift=shift)
        step_flops, curve = ladder_run(d, 1.2)
        write_run(tmp_path, f"d{d}_kromhc", d, curve, step_flops, hc="kromhc")
    v = run_compare(tmp_path)["variants"]["kromhc"]
    warnings = lines_with(capsys.readouterr().err, "warning:")
    assert warnings == ["warning: baseline ladder (FLOPs): the baseline's final bpb does not fall as compute grows: "
                        "no a + b·C^-c fits it"]
    assert v["ladder_cm"] is None and v["per_depth"][0]["nanochat_cm"] is not None


def test_a_variant_without_a_baseline_depth(tmp_path, capsys):
    ladder(tmp_path, seeds=1, depths=(4, 6), variant_depths=(8,))
    v = run_compare(tmp_path)["variants"]["kromhc"]
    warnings = lines_with(capsys.readouterr().err, "warning:")
    assert warnings == ["warning: variant kromhc has no depth the baseline has (variant: 8; baseline: 4, 6): "
                        "no nanochat-compatible per-tag CM"]
    assert v["per_depth"][0]["cm"] is not None and v["per_depth"][0]["extrapolated"]


def test_unfinished_runs_are_named_and_skipped(tmp_path, capsys):
    ladder(tmp_path, seeds=1)
    step_flops, curve = ladder_run(6, 1.2)
    write_run(tmp_path, "d6_kromhc_s1", 6, curve, step_flops, hc="kromhc", seed=43, complete=False)
    v = run_compare(tmp_path)["variants"]["kromhc"]
    warnings = lines_with(capsys.readouterr().err, "warning:")
    assert len(warnings) == 1 and warnings[0].startswith("warning: d6_kromhc_s1 skipped: unfinished (step ")
    assert [row["seeds"] for row in v["per_depth"]] == [1, 1, 1]


def test_runs_on_other_devices_refuse_the_wall_clock_cm(tmp_path, capsys):
    ladder(tmp_path, seeds=1)
    step_flops, curve = ladder_run(10)
    write_run(tmp_path, "d10_residual", 10, curve, step_flops, device="NVIDIA A100-SXM4-80GB")
    v = run_compare(tmp_path)["variants"]["kromhc"]
    warnings = lines_with(capsys.readouterr().err, "warning:")
    assert len(warnings) == 1 and "wall-clock CM refused" in warnings[0] and "A100" in warnings[0]
    assert all(row["wall_cm"] is None for row in v["per_depth"]) and v["ladder_cm"] is not None


@pytest.mark.parametrize("field, other", [("dataset", "my own text"), ("tokenizer", "512 tokens, fedcba987654")])
def test_mixed_datasets_or_tokenizers_are_an_error(tmp_path, capsys, field, other):
    ladder(tmp_path, seeds=1)
    step_flops, curve = ladder_run(10)
    write_run(tmp_path, "d10_residual", 10, curve, step_flops, **{field: other})
    with pytest.raises(SystemExit) as e:
        run_compare(tmp_path)
    assert e.value.code == 1
    errors = lines_with(capsys.readouterr().err, "error:")
    assert len(errors) == 1 and f"mixed {field}s" in errors[0] and other in errors[0]


def test_runs_of_two_trunks_are_refused_and_compared_one_trunk_at_a_time(tmp_path, capsys):
    ladder(tmp_path, seeds=1)
    for run_dir in sorted(tmp_path.iterdir()):  # the same ladder on the 2026-07 trunk
        moved = shutil.copytree(run_dir, tmp_path / f"{run_dir.name}_t2607")
        with open(moved / "config.toml", "a") as f:
            f.write('trunk = "2026-07"\n')
    with pytest.raises(SystemExit) as e:
        run_compare(tmp_path)
    message = str(e.value.code)
    assert message.startswith("error: runs of 2 trunks (2026-01: d4_kromhc, ") and "2026-07: d4_kromhc_t2607" in message
    assert message.endswith("with --trunk 2026-01 or --trunk 2026-07") and "\n" not in message
    result = run_compare(tmp_path, "--trunk", "2026-07")
    assert result["baseline"]["runs"] and all(name.endswith("_t2607") for name in result["baseline"]["runs"])
    assert result["variants"]["kromhc"]["ladder_cm"] == pytest.approx(1.2, rel=0.03)
    # the study itself refuses spends of two trunks (the report hands it one trunk's)
    spends = [spend_of(load_run(tmp_path / name))[0] for name in ("d4_residual", "d6_residual_t2607")]
    messages = []
    check_comparable(spends, messages)
    assert len(messages) == 1 and messages[0].startswith("error: mixed trunks (2026-01: d4_residual; 2026-07: ")


@pytest.mark.parametrize("flags, message", [
    (["--baseline", "d4_residual,nope"], "--baseline: no run named nope"),
    (["--variant", "k=d4_kromhc", "--baseline", "d4_kromhc_s9"], "no run named d4_kromhc_s9"),
    (["--select", "zzz*"], "matches --select 'zzz*'"),
    (["--baseline-label", "mhc"], "no finished baseline run"),
])
def test_bad_selections_are_one_error(tmp_path, capsys, flags, message):
    ladder(tmp_path, seeds=1)
    with pytest.raises(SystemExit) as e:
        run_compare(tmp_path, *flags)
    text = str(e.value.code) if e.value.code != 1 else capsys.readouterr().err
    assert message in text and text.count("error:") == 1


def test_cli_errors_print_one_line(tmp_path, capsys):
    """Through the CLI's guard (as `python -m scripts.compare` runs): one error line on stderr."""
    for flags, message in ((["--runs-root", str(tmp_path / "absent")], "does not exist"),
                           (["--runs-root", str(tmp_path), "--variant", "no-equals-sign"], "NAME=TAG,TAG")):
        with pytest.raises(SystemExit) as e:
            run(lambda: compare_cli.main(flags))
        # a SystemExit message is printed by the interpreter as the process ends
        err = capsys.readouterr().err + (e.value.code if isinstance(e.value.code, str) else "")
        assert e.value.code != 0 and "Traceback" not in err
        errors = [line for line in err.splitlines() if "error:" in line]
        assert len(errors) == 1 and message in errors[0]


# ------------------------------------------------------------------------------------------
# The report

def test_report_has_a_filled_compute_multiplier_section(tmp_path):
    ladder(tmp_path / "runs", seeds=1)
    runs = [load_run(p) for p in sorted((tmp_path / "runs").iterdir())]
    readme = write_report(runs, tmp_path / "report").read_text()
    section = readme.split("## Compute multiplier (not in the paper)")[1].split("\n## ")[0]
    assert "#### kromhc" in section and "Ladder-level CM" in section and "nanochat CM" in section
    assert "![cm_finals](cm_finals.png)" in section and (tmp_path / "report" / "cm_vs_compute.png").is_file()
    assert "FLOPs: `GPT.estimate_flops`" in section


def test_report_says_what_is_missing(tmp_path):
    ladder(tmp_path / "runs", seeds=1, depths=(6,), variant_depths=())
    runs = [load_run(p) for p in sorted((tmp_path / "runs").iterdir())]
    readme = write_report(runs, tmp_path / "report").read_text()
    section = readme.split("## Compute multiplier (not in the paper)")[1].split("\n## ")[0]
    assert "Not enough runs" in section and "2 or more depths" in section and "another connection" in section
