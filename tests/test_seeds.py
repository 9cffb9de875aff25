"""Seeds: the data-order seed of the loader, the t quantile and paired intervals, and the
report of real tiny runs trained with two seeds (mean ± std rows, paired 95 % intervals)."""

import json
import math
import statistics

import numpy as np
import pytest
from test_report import row, section, table
from test_train_e2e import make_base, train

from nanochat.planning import plan
from nanochat.dataloader import BestFitLoader
from nanochat.report import paper
from nanochat.studies.stats import T_975, paired_diff, summarize, t_975
from nanochat.tokenizer import get_tokenizer
from scripts import report as report_cli

LOADER = dict(B=2, T=64, split="train", buffer_size=16, tokenizer_batch_size=5)


def first_batches(tokenizer_dir, corpus, n=4, **kwargs):
    with BestFitLoader(get_tokenizer(tokenizer_dir), data_dir=corpus, **LOADER, **kwargs) as loader:
        return [next(loader)[0].numpy().copy() for _ in range(n)], loader.state_dict()


def test_data_seed_changes_the_order_and_resumes_exactly(tokenizer_dir, small_corpus_dir):
    fixed, _ = first_batches(tokenizer_dir, small_corpus_dir)
    seeded, _ = first_batches(tokenizer_dir, small_corpus_dir, order_seed=1)
    again, _ = first_batches(tokenizer_dir, small_corpus_dir, order_seed=1)
    other, _ = first_batches(tokenizer_dir, small_corpus_dir, order_seed=2)
    assert all(np.array_equal(a, b) for a, b in zip(seeded, again))  # a seed is an order
    assert not np.array_equal(fixed[0], seeded[0]) and not np.array_equal(seeded[0], other[0])
    # Resuming mid-stream with the same seed continues the shuffled stream exactly.
    _, state = first_batches(tokenizer_dir, small_corpus_dir, n=2, order_seed=1)
    with BestFitLoader(get_tokenizer(tokenizer_dir), data_dir=small_corpus_dir, state=state, order_seed=1,
                       **LOADER) as loader:
        resumed = [next(loader)[0].numpy() for _ in range(2)]
    assert all(np.array_equal(a, b) for a, b in zip(resumed, seeded[2:]))


def test_t_quantile_table_and_expansion():
    assert t_975(1) == 12.706 and t_975(2) == 4.303 and t_975(30) == T_975[-1] == 2.042
    # Beyond the table: the expansion against published values (df 40, 60, 120, infinity).
    for df, published in ((40, 2.021), (60, 2.000), (120, 1.980), (10**7, 1.960)):
        assert abs(t_975(df) - published) < 1e-3, df
    assert abs(t_975(31) - 2.0395) < 1e-3  # and it joins the table smoothly
    with pytest.raises(ValueError):
        t_975(0)


def test_paired_difference_interval():
    a = {1: 3.0, 2: 3.2, 3: 3.1, 4: None}
    b = {1: 2.9, 2: 3.0, 3: 3.05, 5: 1.0}
    d = paired_diff(a, b)
    diffs = [0.1, 0.2, 0.05]
    half = 4.303 * statistics.stdev(diffs) / math.sqrt(3)
    assert d.n == 3 and d.mean == pytest.approx(statistics.fmean(diffs))
    assert (d.low, d.high) == (pytest.approx(d.mean - half), pytest.approx(d.mean + half))
    assert d.beyond_noise == (d.low > 0)
    one = paired_diff({1: 2.0}, {1: 1.0})
    assert one.n == 1 and not one.known and not one.beyond_noise
    assert paired_diff({1: 2.0}, {2: 1.0}) is None
    assert summarize([None, 2.0]).std is None and summarize([]) is None


TINY_CONFIG = """depth = 2
aspect_ratio = 32
head_dim = 32
max_seq_len = 64
window_pattern = "SL"
device_batch_size = 4
total_batch_size = 512
num_iterations = 3
eval_every = -1
eval_tokens = 512
core_metric_every = -1
sample_every = -1
hc_stats_every = -1
device_type = "cpu"
"""


@pytest.mark.slow
def test_report_of_two_seeds(tmp_path, small_corpus_dir, tokenizer_dir):
    """Residual, mHC and KromHC, each with two seeds, trained for real (3 steps, the seed
    flags speedrun passes), then the report's rows checked against the run files."""
    base = make_base(tmp_path, small_corpus_dir, tokenizer_dir)
    configs = []
    for variant, extra in (("residual", ""), ("mhc", "hc_streams = 4\n"), ("kromhc", "hc_streams = 4\n")):
        path = tmp_path / f"{variant}.toml"
        path.write_text(TINY_CONFIG + f'hc = "{variant}"\n{extra}model_tag = "t_{variant}"\n')
        configs.append(str(path))
    planned = plan.plan_runs(configs, seeds=2)
    assert [r.tag for r in planned] == ["t_residual", "t_mhc", "t_kromhc", "t_residual_s1", "t_mhc_s1", "t_kromhc_s1"]
    for r in planned:
        train(base, "--config", r.config, *r.flags)
    runs = tmp_path / "base" / "runs"
    summary = {r.tag: json.loads((runs / r.tag / "summary.json").read_text()) for r in planned}
    assert summary["t_mhc"]["train_loss_smooth"] != summary["t_mhc_s1"]["train_loss_smooth"]  # the seeds differ

    out = tmp_path / "report"
    report_cli.main(["--runs", *(str(runs / r.tag) for r in planned), "--configs", *configs, "--out", str(out)])
    readme = (out / "README.md").read_text()
    main = table(section(readme, f"## Main results, D=2 ({paper.MAIN_TABLE})"))
    assert len(main) == 3  # one row per variant, not per run
    for variant in ("residual", "mhc", "kromhc"):
        cells = row(main, Run=f"t_{variant} (+1 seed)")
        for column, key in (("Train loss", "train_loss_smooth"), ("Val BPB", "val_bpb")):
            values = [summary[f"t_{variant}"][key], summary[f"t_{variant}_s1"][key]]
            mean, std = statistics.fmean(values), statistics.stdev(values)
            assert cells[column] == f"{mean:.3f} ± {std:.4f} (n=2)", (variant, column)
        assert cells["Status"] == "complete"

    diffs = table(section(readme, "### Differences and seed noise, D=2"))
    for variant in ("mhc", "kromhc"):
        cells = row(diffs, Run=f"t_{variant} (+1 seed)")
        assert cells["Seeds"] == "2"
        for label, key in (("train loss", "train_loss_smooth"), ("val BPB", "val_bpb")):
            d = [summary[f"t_{variant}{s}"][key] - summary[f"t_residual{s}"][key] for s in ("", "_s1")]
            mean, half = statistics.fmean(d), 12.706 * statistics.stdev(d) / math.sqrt(2)  # t(0.975, 1)
            assert cells[f"Δ {label} vs Residual"] == f"{mean:+.4f} [{mean - half:+.4f}, {mean + half:+.4f}] (n=2)"
    assert row(diffs, Run="t_mhc (+1 seed)")["Δ val BPB vs mHC"] == "--"
    assert row(diffs, Run="t_residual (+1 seed)")["Δ val BPB vs mHC"] == "—"  # said once, by the mHC row
    notes = section(readme, "### Differences and seed noise, D=2")
    assert "- Differences that " in notes and "KromHC − Residual val BPB" in notes
    assert (out / "loss_d2.png").is_file() and (out / "loss_gap_d2.png").is_file()


def test_seed_groups_ignore_seeds_and_settings_added_later(tmp_path):
    from nanochat.report.runs import Run, seed_groups
    base = {"depth": 2, "hc": "mhc", "hc_streams": 4, "model_tag": "a"}
    runs = [Run("a", tmp_path, config=dict(base)),  # saved before data_seed and eval cadence changes
            Run("a_s1", tmp_path, config={**base, "model_tag": "a_s1", "seed": 43, "data_seed": -1, "eval_every": 7}),
            Run("a_s1_data", tmp_path, config={**base, "model_tag": "a_s1_data", "seed": 43, "data_seed": 1}),
            Run("b", tmp_path, config={**base, "model_tag": "b", "hc_lr": 0.1}),  # another setting: its own row
            Run("c", tmp_path, found=False)]
    groups = seed_groups(runs)
    assert {k: [r.name for r in v] for k, v in groups.items()} == {"a": ["a", "a_s1", "a_s1_data"], "b": ["b"], "c": ["c"]}


def test_noise_sentence_decides_with_holm_bonferroni():
    """Two differences whose intervals each exclude zero (p 0.037 and 0.030) do not both survive
    three comparisons: Holm keeps only the strong one (p 0.0001) beyond the seed noise."""
    from nanochat.report.seeds import noise_sentence
    zero = {1: 0.0, 2: 0.0, 3: 0.0}
    weak = paired_diff({1: 0.10, 2: 0.05, 3: 0.07}, zero)
    weaker = paired_diff({1: 0.10, 2: 0.055, 3: 0.07}, zero)
    strong = paired_diff({1: 0.05, 2: 0.051, 3: 0.049}, zero)
    assert weak.beyond_noise and weaker.beyond_noise and weak.p == pytest.approx(0.0371, abs=1e-4)
    text = noise_sentence([("A", "x", weak), ("B", "x", weaker), ("C", "x", strong)], {"x": ".3f"})
    beyond, within = text.split("Differences that do not exceed it")
    assert "Holm-Bonferroni over the 3 differences" in beyond and "C (+0.0500)" in beyond
    assert "A (" in within and "B (" in within and "A (" not in beyond
    alone = noise_sentence([("A", "x", weak)], {"x": ".3f"})
    assert "exceed the seed noise" in alone and "A (+0.0733)" in alone  # one comparison: no correction
