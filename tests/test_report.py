"""The report from synthetic run directories: table values, paper columns beside matching
runs, missing and incomplete runs, figures; metrics parsing; the paper transcription."""

import json
import math

import pytest

from nanochat.report import paper
from nanochat.report.build import write_report
from nanochat.report.format import MISSING
from nanochat.report.runs import load_run, read_metrics
from scripts import report as report_cli

STEPS = 40
RES_TOTAL = {2: 1_310_976, 6: 73_531_692, 12: 286_262_424}  # nanochat's totals; any numbers would do
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(root, name, config, *, hc_params=None, final_loss=3.0, bpb=1.0, core=None, tasks=None,
              complete=True, steps=STEPS, summary_extra=None, hc_stats=None):
    """A run directory as base_train/base_eval/hc_report leave it (summary only if complete)."""
    run = root / name
    run.mkdir(parents=True)
    (run / "config.toml").write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in config.items()))
    lines = []
    for step in range(steps):
        loss = final_loss + 2.0 * math.exp(-step / 10)
        lines.append({"step": step, "kind": "train", "loss": loss, "loss_smooth": loss + 0.01,
                      "grad_norm": 1.0 + 1.0 / (step + 1), "hc_grad_norm": 0.1 + 0.1 / (step + 1)})
        if step % 10 == 0:
            lines.append({"step": step, "kind": "val", "bpb": bpb + 0.5 * math.exp(-step / 10)})
    lines.append({"step": steps - 1, "kind": "val", "bpb": bpb})
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in lines))
    depth = config["depth"]
    if complete:
        hc = hc_params if hc_params is not None else 2 * depth
        summary = {"complete": True, "step": steps - 1, "num_iterations": steps - 1,
                   "train_loss_smooth": final_loss, "val_bpb": bpb, "min_val_bpb": bpb,
                   "core_metric": core, "params": {"total": RES_TOTAL[depth] - 2 * depth + hc, "hc": hc},
                   "hc": config["hc"], "hc_streams": config.get("hc_streams", 1),
                   "hc_factors": config.get("hc_factors"), "depth": depth, "model_dim": 64 * depth,
                   "tok_per_sec": 1000.0, "step_time": 0.5, "peak_mem_mib": 2000.0, "world_size": 1,
                   "device": "cpu"}
        summary.update(summary_extra or {})
        (run / "summary.json").write_text(json.dumps(summary))
    if tasks is not None:
        (run / "core.json").write_text(json.dumps({
            "core_metric": core, "settings": {},
            "tasks": {label: {"accuracy": acc, "centered": acc, "type": "multiple_choice", "shots": 0,
                              "examples": 10} for label, acc in tasks.items()}}))
    if hc_stats is not None:
        (run / "hc_stats.json").write_text(json.dumps(hc_stats))
    return run


def cfg(depth, hc, n=4, **extra):
    config = {"depth": depth, "hc": hc, "num_iterations": STEPS - 1, "model_tag": f"d{depth}_{hc}"}
    if hc != "residual":
        config["hc_streams"] = n
    config.update(extra)
    return config


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Runs at D=6 (main comparison, one incomplete, one missing) and D=12 (n-scaling, ablations)."""
    root = tmp_path_factory.mktemp("runs")
    commonsense = {label: 0.30 + 0.01 * i for i, (_, label) in enumerate(paper.COMMONSENSE_COLUMNS)}
    del commonsense["hellaswag"]  # as with the shared eval bundle, which lacks it
    dirs = [
        write_run(root, "d6_residual", cfg(6, "residual"), final_loss=3.50, bpb=1.05, core=0.06),
        write_run(root, "d6_mhc", cfg(6, "mhc"), hc_params=461_124, final_loss=3.49, bpb=1.04, core=0.07,
                  summary_extra={"tok_per_sec": 800.0, "step_time": 0.625, "peak_mem_mib": 2500.0}),
        write_run(root, "d6_kromhc", cfg(6, "kromhc", hc_factors=[2, 2]), hc_params=239_796, final_loss=3.48,
                  bpb=1.03, core=0.09, tasks=commonsense, summary_extra={"tok_per_sec": 1000.0}),
        write_run(root, "d6_mhc_lite", cfg(6, "mhc_lite"), final_loss=3.7, complete=False, steps=20),
        root / "d6_hc",  # asked for, never trained
        write_run(root, "d12_residual", cfg(12, "residual"), final_loss=2.97, bpb=0.86),
        write_run(root, "d12_mhc", cfg(12, "mhc"), hc_params=1_843_848, final_loss=2.96, bpb=0.861,
                  hc_stats={"composite_col_mae": 1e-7, "composite_row_mae": 0.031, "fwd_gain": 1.2,
                            "bwd_gain": 1.3, "layers": [], "variant": "mhc", "n": 4}),
        write_run(root, "d12_kromhc", cfg(12, "kromhc"), hc_params=958_824, final_loss=2.966, bpb=0.862),
        write_run(root, "d12_kromhc_n8", cfg(12, "kromhc", n=8, hc_factors=[2, 2, 2]), hc_params=3_392_000,
                  final_loss=2.950, bpb=0.857),
        write_run(root, "d12_kromhc_n8_4x2", cfg(12, "kromhc", n=8, hc_factors=[4, 2]), hc_params=6_340_000,
                  final_loss=2.954, bpb=0.861),
        write_run(root, "d12_kromhc_alpha", cfg(12, "kromhc", hc_alpha_shared=False), hc_params=958_824,
                  final_loss=2.970, bpb=0.865),
        write_run(root, "d12_hc_identity", cfg(12, "hc_identity"), hc_params=100_000, final_loss=2.99, bpb=0.87),
    ]
    out = tmp_path_factory.mktemp("report")
    report_cli.main(["--runs", *map(str, dirs), "--out", str(out)])
    return root, out, (out / "README.md").read_text()


def section(readme, heading):
    """The text from a heading line to the next heading of the same or higher level."""
    lines = readme.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == heading)
    level = len(heading) - len(heading.lstrip("#"))
    end = next((i for i in range(start + 1, len(lines))
                if lines[i].startswith("#") and len(lines[i]) - len(lines[i].lstrip("#")) <= level), len(lines))
    return "\n".join(lines[start:end])


def table(text):
    """The first markdown table in text as a list of dicts keyed by header (repeated headers get a suffix)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = lines[start:end]
    header = []
    for cell in (c.strip() for c in rows[0].strip("|").split("|")):
        header.append(cell if cell not in header else f"{cell}#{sum(h.split('#')[0] == cell for h in header)}")
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in rows[2:]]


def row(rows, **match):
    found = [r for r in rows if all(r[k] == v for k, v in match.items())]
    assert len(found) == 1, (match, rows)
    return found[0]


def test_main_table_delta_params_and_paper_columns(built):
    _, _, readme = built
    rows = table(section(readme, f"## Main results, D=6 ({paper.MAIN_TABLE})"))
    mhc = row(rows, Run="d6_mhc")
    assert mhc["ΔParams (K)"] == f"{(RES_TOTAL[6] - 12 + 461_124 - RES_TOTAL[6]) / 1e3:.1f}"
    assert mhc["paper"] == f"{paper.MAIN[(6, 'mhc')].delta_params_k:.0f}"
    krom = row(rows, Run="d6_kromhc")
    assert krom["ΔParams (K)"] == f"{(239_796 - 12) / 1e3:.1f}"
    assert krom["Train loss"] == "3.480" and krom["paper#1"] == f"{paper.MAIN[(6, 'kromhc')].train_loss:.3f}"
    assert krom["Val BPB"] == "1.030" and krom["paper#2"] == f"{paper.MAIN[(6, 'kromhc')].val_bpb:.3f}"
    assert krom["CORE"] == "9.000" and krom["paper#3"] == f"{paper.MAIN[(6, 'kromhc')].core:.3f}"
    assert row(rows, Run="d6_residual")["ΔParams (K)"] == "--"


def test_missing_and_incomplete_runs(built):
    root, _, readme = built
    rows = table(section(readme, f"## Main results, D=6 ({paper.MAIN_TABLE})"))
    lite = row(rows, Run="d6_mhc_lite")
    assert lite["Status"] == f"incomplete (step 19 of {STEPS - 1})"
    assert lite["Train loss"] == f"{3.7 + 2.0 * math.exp(-19 / 10) + 0.01:.3f}"  # last logged loss_smooth
    assert lite["ΔParams (K)"] == MISSING and lite["CORE"] == MISSING
    assert lite["paper"] == f"{paper.MAIN[(6, 'mhc_lite')].delta_params_k:.0f}"
    assert f"not found: `{root / 'd6_hc'}`" in readme
    runs = table(section(readme, "## Runs"))
    assert row(runs, Run="d6_hc")["Status"] == "not found"
    assert row(runs, Run="d6_hc")["Method"] == MISSING  # its config is unknown: no guess
    assert "d6_hc" not in readme.split("## The paper's numbers")[0].split("## Ablations")[1]


def test_core_task_tables(built):
    _, _, readme = built
    rows = table(section(readme, "### Commonsense and reasoning, D=6"))
    ours = row(rows, Run="d6_kromhc")
    accs = [100 * (0.30 + 0.01 * i) for i, (_, label) in enumerate(paper.COMMONSENSE_COLUMNS) if label != "hellaswag"]
    assert ours["Avg"] == f"{sum(accs) / len(accs):.1f}*"
    assert ours["HS"] == MISSING and ours["HS-ZS"] == f"{100 * 0.31:.1f}"
    paper_row = row(rows, Method="KromHC (paper)")
    assert rows.index(paper_row) == rows.index(ours) + 1
    assert [paper_row[h] for h in ("Avg", "HS", "BoolQ")] == [f"{v:.1f}" for v in
                                                             (paper.COMMONSENSE[(6, "kromhc")][0],
                                                              paper.COMMONSENSE[(6, "kromhc")][1],
                                                              paper.COMMONSENSE[(6, "kromhc")][-1])]
    assert row(rows, Run="d6_mhc")["Avg"] == MISSING  # no CORE at all


def test_no_core_task_table_without_a_number(tmp_path):
    """A ladder's training-only runs at a depth the paper lacks leave no all-dash task tables; at
    a paper depth the paper's rows still show beside runs not yet evaluated."""
    dirs = [write_run(tmp_path / "runs", "d2_residual", cfg(2, "residual")),
            write_run(tmp_path / "runs", "d2_kromhc", cfg(2, "kromhc")),
            write_run(tmp_path / "runs", "d6_kromhc", cfg(6, "kromhc"))]
    report_cli.main(["--runs", *map(str, dirs), "--out", str(tmp_path / "report")])
    readme = (tmp_path / "report" / "README.md").read_text()
    assert "## Main results, D=2" in readme and "### Commonsense and reasoning, D=2" not in readme
    assert "### Language modeling, BigBench, evaluation suite, D=2" not in readme
    assert row(table(section(readme, "### Commonsense and reasoning, D=6")), Method="KromHC (paper)")
    report_cli.main(["--runs", *map(str, dirs[:2]), "--out", str(tmp_path / "d2")])
    core = section((tmp_path / "d2" / "README.md").read_text(),
                   f"## CORE tasks ({paper.COMMONSENSE_TABLE}, {paper.LANGUAGE_TABLE})")
    assert "No run here has CORE task results" in core and "|" not in core


def test_n_scaling_and_ablations(built):
    _, _, readme = built
    rows = table(section(readme, "### D=12"))
    n8 = row(rows, n="8")
    assert n8["ΔParams (M)"] == f"{(3_392_000 - 24) / 1e6:.2f}" and n8["paper (M)"] == "2.67"
    assert n8["Δloss vs n=4"] == f"{2.950 - 2.966:+.3f}" and n8["ΔBPB vs n=4"] == f"{0.857 - 0.862:+.3f}"
    assert row(rows, n="16")["Status"] == "not run"  # a paper row with no run still shows the paper's number
    fact = section(readme, f"### Factorization ({paper.FACTORIZATION_SECTION})")
    deltas = table(fact[fact.index("2x2x2 minus 4x2"):])
    assert row(deltas, Metric="train loss")["Ours"] == f"{2.950 - 2.954:+.3f}"
    assert row(deltas, Metric="val BPB")["paper"] == f"{paper.FACTORIZATION_DELTA['val_bpb']:+.3f}"
    alpha = table(section(readme, f"### alpha_res shared or per factor ({paper.ALPHA_FIGURE})"))
    assert row(alpha, Run="d12_kromhc_alpha")["ΔBPB vs shared"] == f"{0.865 - 0.862:+.3f}"
    ident = table(section(readme, "### H_res = I (not in the paper)"))
    assert row(ident, minus="KromHC (d12_kromhc)")["Δ val BPB"] == f"{0.87 - 0.862:+.3f}"


def test_stability_and_system_tables(built):
    _, _, readme = built
    stab = table(section(readme, f"## Stability of the composite residual map ({paper.STABILITY_FIGURE})"))
    mhc = row(stab, Run="d12_mhc")
    assert mhc["row MAE"] == f"{0.031:.2e}" and mhc["paper"] == "≈0.05" and mhc["source"] == "hc_stats.json"
    assert mhc["col MAE"] == f"{1e-7:.2e}"
    assert row(stab, Run="d6_kromhc")["row MAE"] == MISSING
    system = table(section(readme, f"## System metrics ({paper.SYSTEM_TABLE})").split("### D=6", 1)[1])
    krom = row(system, Run="d6_kromhc")
    assert krom["Δ% vs mHC"] == f"{100 * (1000 / 800 - 1):+.2f}" and krom["Δ%"] == f"{100 * (0.5 / 0.625 - 1):+.2f}"
    assert krom["paper"] == MISSING  # the paper's system table is D=12 only


def test_stability_says_how_far_h_res_moved(tmp_path):
    """H_res − I and HC params per run, and the sentence naming the exact and the drifting variants."""
    def stats(row_mae, dists):
        return {"composite_row_mae": row_mae, "composite_col_mae": 1e-8, "fwd_gain": 1.0, "bwd_gain": 1.0,
                "layers": [{"identity_dist": d} for d in dists]}
    dirs = [write_run(tmp_path, "d6_residual", cfg(6, "residual")),
            write_run(tmp_path, "d6_mhc", cfg(6, "mhc"), hc_params=461_124, hc_stats=stats(0.12, [0.2, 0.4])),
            write_run(tmp_path, "d6_kromhc", cfg(6, "kromhc"), hc_params=239_796, hc_stats=stats(2e-7, [0.1, 0.2]))]
    out = tmp_path / "out"
    report_cli.main(["--runs", *map(str, dirs), "--out", str(out)])
    text = section((out / "README.md").read_text(), f"## Stability of the composite residual map ({paper.STABILITY_FIGURE})")
    stab = table(text)
    assert row(stab, Run="d6_mhc")["H_res − I"] == f"{0.3:.3g}" and row(stab, Run="d6_mhc")["HC params"] == "461,124"
    assert row(stab, Run="d6_kromhc")["H_res − I"] == f"{0.15:.3g}"
    assert "H_res left its identity init by mHC 0.3, KromHC 0.15." in text
    assert "at rounding (< 1e-5): KromHC (2.0e-07)" in text and "more than rounding: mHC (1.2e-01)" in text


def test_figures_are_png(built):
    _, out, readme = built
    expected = ["loss_d6.png", "loss_gap_d6.png", "grad_norm_d6.png", "grad_norm_tail_d6.png", "loss_d12.png",
                "n_scaling_gap_d12.png", "alpha_gap_d12_kromhc_alpha.png", "params_vs_n.png"]
    for name in expected:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000, name
        assert f"({name})" in readme


def test_params_vs_n_table_uses_formula(built):
    from nanochat.connections.diagnostics import hc_layer_params
    _, _, readme = built
    rows = table(section(readme, f"## Parameters per HC layer against n ({paper.PARAMS_VS_N_FIGURE})"))
    assert row(rows, n="8")["KromHC"] == f"{hc_layer_params('kromhc', 8, 512, factors=[2, 2, 2]):,}"
    assert row(rows, n="4")["mHC"] == f"{hc_layer_params('mhc', 4, 512):,}"


def test_configs_list_expected_runs(tmp_path):
    root = tmp_path / "runs"
    write_run(root, "cpu_residual", cfg(6, "residual", model_tag="cpu_residual"))
    configs = tmp_path / "configs"
    configs.mkdir()
    for tag, hc in (("cpu_residual", "residual"), ("cpu_kromhc", "kromhc")):
        (configs / f"{tag}.toml").write_text(f'depth = 6\nhc = "{hc}"\nhc_streams = 4\nmodel_tag = "{tag}"\n')
    runs = report_cli.collect_runs(report_cli.parse_args(["--runs-root", str(root), "--configs", str(configs)]))
    assert [(r.name, r.found) for r in runs] == [("cpu_kromhc", False), ("cpu_residual", True)]
    readme = write_report(runs, tmp_path / "out").read_text()
    main = table(section(readme, f"## Main results, D=6 ({paper.MAIN_TABLE})"))
    assert row(main, Run="cpu_kromhc")["Status"] == "not found"
    assert row(main, Run="cpu_kromhc")["paper"] == f"{paper.MAIN[(6, 'kromhc')].delta_params_k:.0f}"


def test_read_metrics_resume_and_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "kind": "train", "loss": 5.0}\n{"step": 2, "kind": "train", "loss": 4.0}\n'
                    '{"step": 2, "kind": "train", "loss": 3.5}\n{"step": 3, "kind": "tr')
    rows = read_metrics(path)["train"]
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 5.0), (2, 3.5)]
    path.write_text('{"step": 1, "kind": "train"}\nnot json\n{"step": 2, "kind": "train"}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        read_metrics(path)


def test_no_runs_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no run directories"):
        report_cli.collect_runs(report_cli.parse_args(["--runs-root", str(tmp_path)]))


def test_paper_averages_match_their_rows():
    """Transcription check: each Avg is the mean of its row up to rounding (0.05 for the
    Avg, 0.05 for the mean of rounded values), except one inconsistency in the paper."""
    known_mismatch = {("commonsense", (6, "mhc_lite"))}
    for name, table_, columns in (("commonsense", paper.COMMONSENSE, paper.COMMONSENSE_COLUMNS),
                                  ("language", paper.LANGUAGE, paper.LANGUAGE_COLUMNS)):
        assert set(table_) == set(paper.MAIN)
        for key, values in table_.items():
            assert len(values) == len(columns) + 1
            off = abs(values[0] - sum(values[1:]) / len(columns))
            assert (off > 0.1) == ((name, key) in known_mismatch), (name, key, off)


def test_paper_delta_params_match_formula():
    """Table 3's ΔParams against the per-layer formula with the norm weight (docs/connections.md, "Parameter accounting":
    within 0.2%), at n = 4 with 2 HC layers per block."""
    from nanochat.connections.diagnostics import hc_layer_params
    for (depth, method), result in paper.MAIN.items():
        if result.delta_params_k is None:
            continue
        C = paper.SCALE_HYPERPARAMS[depth]["model_dim"]
        ours = 2 * depth * hc_layer_params(method, 4, C) / 1e3
        assert abs(ours / result.delta_params_k - 1) < 0.002, (depth, method, ours)


def test_fidelity_notes(tmp_path, built):
    """The residual row's LRs, the model-size question with the command that answers it, and
    what differs from the paper's code by design; runs in the size-matched layout are named."""
    notes = section(built[2], "## Fidelity notes")
    assert "`--scalar-lr` 0.5" in notes and "resid at 0.005" in notes
    assert f"{paper.PIN_SIZES_M[12]}M" in notes and f"{paper.SIZE_MATCHED_SIZES_M[12]}M" in notes
    assert "--vocab-size 65536 --value-embeds false" in notes and "No run here uses that layout" in notes
    assert "+0.05 %" in notes and "±0.001" in notes and "4d8dbaf" in notes
    root = tmp_path / "runs"
    runs = [load_run(write_run(root, "d12_residual_sized", cfg(12, "residual", value_embeds=False))),
            load_run(write_run(root, "d12_residual", cfg(12, "residual")))]
    notes = section(write_report(runs, tmp_path / "out").read_text(), "## Fidelity notes")
    assert "Runs here in that layout: d12_residual_sized." in notes
