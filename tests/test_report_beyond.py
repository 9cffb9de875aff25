"""The report's sections past the paper, from synthetic run directories: stream collapse
(table and figures against depth and step) and "Beyond the paper" (runs with the HC
options, beside the same variant in the paper's configuration, kept out of the paper's
tables)."""

import json

import pytest

from nanochat.report import paper
from scripts import report as report_cli
from test_report import PNG_MAGIC, cfg, row, section, table, write_run


def collapse_stats(eff, offdiag, layers=4):
    per_layer = [{"index": j, "effective_streams": eff - 0.1 * j, "offdiag_mass": offdiag + 0.01 * j}
                 for j in range(layers)]
    return {"variant": "kromhc", "n": 4, "collapse_version": 2, "composite_col_mae": 1e-7, "composite_row_mae": 1e-7,
            "fwd_gain": 1.0, "bwd_gain": 1.0, "layers": per_layer, "effective_streams_mean": eff - 0.15, "dominant_share_mean": 0.4,
            "stream_cosine_mean": 0.9, "read_effective_mean": 2.5, "write_effective_mean": 2.0,
            "offdiag_mass_mean": offdiag + 0.015, "perm_distance_mean": 0.01,
            "final": {"energy_share": [0.7, 0.1, 0.1, 0.1], "dominant_share": 0.7, "dominant_stream": 0,
                      "effective_streams": 1.9, "stream_cosine": 0.8}}


def add_hc_rows(run, values):
    """Training-time diagnostics rows (kind 'hc') at steps 0, 10, ... with these mean effective streams."""
    with open(run / "metrics.jsonl", "a") as f:
        for i, eff in enumerate(values):
            f.write(json.dumps({"step": 10 * i, "kind": "hc", "effective_streams_mean": eff,
                                "offdiag_mass_mean": 0.01 * i, "layers": [], "collapse_version": 2}) + "\n")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    krom = write_run(root, "d12_kromhc", cfg(12, "kromhc"), hc_params=958_824, final_loss=2.966, bpb=0.862,
                     hc_stats=collapse_stats(3.5, 0.02))
    lss = write_run(root, "d12_kromhc_lss", cfg(12, "kromhc", hc_expand="lss"), hc_params=961_896,
                    final_loss=2.950, bpb=0.858, hc_stats=collapse_stats(2.5, 0.05))
    add_hc_rows(krom, [4.0, 3.8, 3.6])
    add_hc_rows(lss, [3.0, 2.7, 2.6])
    dirs = [write_run(root, "d12_residual", cfg(12, "residual"), final_loss=2.97, bpb=0.86), krom, lss,
            write_run(root, "d12_mhc_delayed", cfg(12, "mhc", hc_pre="delayed"), hc_params=1_843_848,
                      final_loss=2.96, bpb=0.861)]
    out = tmp_path_factory.mktemp("report")
    report_cli.main(["--runs", *map(str, dirs), "--out", str(out)])
    return out, (out / "README.md").read_text()


def test_runs_with_options_stay_out_of_the_papers_tables(built):
    _, readme = built
    main = table(section(readme, f"## Main results, D=12 ({paper.MAIN_TABLE})"))
    assert {r["Run"] for r in main} == {"d12_residual", "d12_kromhc"}
    assert row(table(section(readme, "## Runs")), Run="d12_kromhc_lss")["Method"] == "KromHC (LSS)"
    assert "## Other runs" not in readme  # each run has its place


def test_beyond_the_paper_reads_each_option_against_the_paper_configuration(built):
    _, readme = built
    rows = table(section(readme, "## Beyond the paper"))
    lss = row(rows, Run="d12_kromhc_lss")
    assert lss["Method"] == "KromHC (LSS)" and lss["against"] == "d12_kromhc"
    assert lss["Δ loss"] == "-0.016" and lss["Δ BPB"] == "-0.004"
    assert lss["ΔParams (K)"] == f"{(961_896 - 24) / 1e3:.1f}" and lss["eff. streams"] == "2.35"
    delayed = row(rows, Run="d12_mhc_delayed")
    assert delayed["Method"] == "mHC (delayed pre)" and delayed["against"] == "—"  # no plain mHC run here
    assert "Learned Stream Scaling" in section(readme, "## Beyond the paper")


def test_stream_collapse_table_and_figures(built):
    out, readme = built
    text = section(readme, "## Stream collapse (not in the paper)")
    rows = table(text)
    assert [r["Run"] for r in rows] == ["d12_mhc_delayed", "d12_kromhc", "d12_kromhc_lss"]  # the paper's order
    lss = row(rows, Run="d12_kromhc_lss")
    assert (lss["eff. streams"], lss["final"], lss["dominant (final)"]) == ("2.35", "1.90", "0.70 (stream 0)")
    assert row(rows, Run="d12_mhc_delayed")["eff. streams"] == "—"  # no diagnostics in that run
    for name in ("collapse_depth_d12.png", "collapse_steps_d12.png"):
        assert f"({name})" in text and (out / name).read_bytes().startswith(PNG_MAGIC)


def test_collapse_measures_of_an_earlier_version_are_named_not_mixed_in(tmp_path):
    """An hc_stats.json written before effective streams counted directions held the energies'
    participation ratio under the same key: the report leaves its measures out of the collapse
    and "Beyond the paper" columns and names the run in one line, its loss and the Figure-2
    numbers still read."""
    old = {key: value for key, value in collapse_stats(3.9, 0.01).items() if key != "collapse_version"}
    krom = write_run(tmp_path, "d12_kromhc", cfg(12, "kromhc"), hc_params=958_824, final_loss=2.966, bpb=0.862,
                     hc_stats=collapse_stats(3.5, 0.02))
    lss = write_run(tmp_path, "d12_kromhc_lss", cfg(12, "kromhc", hc_expand="lss"), hc_params=961_896,
                    final_loss=2.950, bpb=0.858, hc_stats=old)
    add_hc_rows(krom, [4.0, 3.8])
    with open(lss / "metrics.jsonl", "a") as f:  # its training log: the old measure too
        f.write(json.dumps({"step": 0, "kind": "hc", "effective_streams_mean": 3.9, "layers": []}) + "\n")
    out = tmp_path / "out"
    report_cli.main(["--runs", str(krom), str(lss), "--out", str(out)])
    readme = (out / "README.md").read_text()
    collapse = section(readme, "## Stream collapse (not in the paper)")
    assert row(table(collapse), Run="d12_kromhc_lss")["eff. streams"] == "—"
    assert row(table(collapse), Run="d12_kromhc")["eff. streams"] == "3.35"
    lines = [line for line in readme.splitlines() if "Not shown: the stream-collapse measures of" in line]
    assert len(lines) == 2 and all("d12_kromhc_lss" in line and "d12_kromhc," not in line for line in lines)
    assert "python -m scripts.hc_report --checkpoint RUN" in lines[0]
    assert row(table(section(readme, "## Beyond the paper")), Run="d12_kromhc_lss")["eff. streams"] == "—"


def test_variants_beyond_the_family_against_their_baselines(tmp_path):
    """go-mHC against mHC, Frac-Connections and Block AttnRes against the residual run; none in
    the paper's tables; AttnRes has no streams and no H_res: n/a, not zeros, where those are shown."""
    go_stats = {**collapse_stats(3.2, 0.03), "variant": "go_mhc", "composite_row_mae": 2e-6,
                "composite_col_mae": 3e-6, "layers": [{"index": 0, "identity_dist": 0.2, "effective_streams": 3.2}]}
    reads = {"variant": "attnres", "n": 1, "doubly_stochastic": "not applicable",
             "layers": [{"index": 0, "sources": 1, "source_weights": [1.0], "entropy": 0.0}]}
    dirs = [write_run(tmp_path, "d12_residual", cfg(12, "residual"), final_loss=2.97, bpb=0.86),
            write_run(tmp_path, "d12_mhc", cfg(12, "mhc"), hc_params=1_843_848, final_loss=2.96, bpb=0.861),
            write_run(tmp_path, "d12_go_mhc", cfg(12, "go_mhc", hc_go_s=2), hc_params=2_728_872, final_loss=2.955,
                      bpb=0.859, hc_stats=go_stats),
            write_run(tmp_path, "d12_frac", cfg(12, "frac"), hc_params=46_992, final_loss=2.965, bpb=0.858),
            write_run(tmp_path, "d12_attnres", cfg(12, "attnres", attnres_block_size=3), hc_params=38_400,
                      final_loss=2.975, bpb=0.862, hc_stats=reads)]
    out = tmp_path / "out"
    report_cli.main(["--runs", *map(str, dirs), "--out", str(out)])
    readme = (out / "README.md").read_text()
    main = table(section(readme, f"## Main results, D=12 ({paper.MAIN_TABLE})"))
    assert {r["Run"] for r in main} == {"d12_residual", "d12_mhc"}
    beyond = section(readme, "## Beyond the paper")
    rows = table(beyond)
    go = row(rows, Run="d12_go_mhc")
    assert (go["Method"], go["against"], go["Δ loss"]) == ("go-mHC", "d12_mhc", "-0.005")
    frac = row(rows, Run="d12_frac")
    assert (frac["Method"], frac["against"], frac["Δ BPB"]) == ("Frac-Connections", "d12_residual", "-0.002")
    attnres = row(rows, Run="d12_attnres")
    assert (attnres["Method"], attnres["against"], attnres["n"]) == ("Block AttnRes (baseline)", "d12_residual", "1")
    assert attnres["eff. streams"] == attnres["off-diag"] == "n/a"
    assert "**go-mHC**" in beyond and "**Frac-Connections**" in beyond and "a baseline, not an HC variant" in beyond
    stability = section(readme, f"## Stability of the composite residual map ({paper.STABILITY_FIGURE})")
    stab = table(stability)
    assert all(row(stab, Run="d12_attnres")[k] == "n/a" for k in ("row MAE", "col MAE", "fwd gain", "H_res − I"))
    assert "at rounding (< 1e-5): go-mHC (3.0e-06)" in stability and "do not apply to it" in stability
    collapse = table(section(readme, "## Stream collapse (not in the paper)"))
    assert "d12_attnres" not in {r["Run"] for r in collapse} and "d12_go_mhc" in {r["Run"] for r in collapse}


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """Our runs of wirings another harness published: pre-norm and two MUDDFormer forms at D=12, a
    mHC at D=12 and D=6 (no pre-norm there), and the report's 'Published elsewhere' table."""
    root = tmp_path_factory.mktemp("runs")
    dirs = [write_run(root, "d12_prenorm", cfg(12, "prenorm"), final_loss=3.000),
            write_run(root, "d12_muddformer", cfg(12, "muddformer"), final_loss=2.950),
            write_run(root, "d12_muddformer_ppn", cfg(12, "muddformer", mudd_prepost_norm=True), final_loss=2.960),
            write_run(root, "d12_mhc", cfg(12, "mhc"), final_loss=2.980),
            write_run(root, "d6_mhc", cfg(6, "mhc"), final_loss=3.300)]
    out = tmp_path_factory.mktemp("report")
    report_cli.main(["--runs", *map(str, dirs), "--out", str(out)])
    text = section((out / "README.md").read_text(),
                   "### Published elsewhere: the wirings beyond the HC family in another harness")
    return table(text), text


def test_published_numbers_stand_beside_ours_against_our_prenorm(published):
    rows, text = published
    mudd = row(rows, **{"factory wiring": "muddformer"})
    assert mudd["S 38.5M"] == "-0.1115" and mudd["L 303.6M"] == "diverged" and mudd["XL 1214M"] == "—"
    assert mudd["ours: Δ train loss vs our pre-norm"] == "MUDDFormer D12: -0.0500"
    ppn = row(rows, **{"factory wiring": "muddformer-ppn"})["ours: Δ train loss vs our pre-norm"]
    assert ppn.endswith("D12: -0.0400") and "-0.0500" not in ppn
    # mHC at D=6 has no pre-norm run of its depth to be read against
    assert row(rows, **{"factory wiring": "mhc-n4"})["ours: Δ train loss vs our pre-norm"] == \
        "mHC D6: —; mHC D12: -0.0200"
    assert row(rows, **{"factory wiring": "laurel-rw-lr"})["ours: Δ train loss vs our pre-norm"] == "—"
    assert "Another recipe" in text


def test_a_wiring_is_read_against_its_declared_baseline_whatever_table_that_belongs_to(tmp_path):
    """LAuReL and Delta AttnRes declare pre-norm, itself a run beyond the paper: each is read
    against the pre-norm run of its own depth; pre-norm against the residual row; a D=6 LAuReL
    with no pre-norm of its depth against nothing."""
    dirs = [write_run(tmp_path, "d12_residual", cfg(12, "residual"), final_loss=2.97, bpb=0.86),
            write_run(tmp_path, "d12_prenorm", cfg(12, "prenorm", n=1), hc_params=0, final_loss=3.000, bpb=0.870),
            write_run(tmp_path, "d12_laurel", cfg(12, "laurel", n=1), hc_params=589_872, final_loss=2.990, bpb=0.866),
            write_run(tmp_path, "d12_dar", cfg(12, "dar", n=1), hc_params=36_888, final_loss=2.985, bpb=0.864),
            write_run(tmp_path, "d6_laurel", cfg(6, "laurel", n=1), hc_params=294_936, final_loss=3.4, bpb=1.0)]
    out = tmp_path / "out"
    report_cli.main(["--runs", *map(str, dirs), "--out", str(out)])
    rows = table(section((out / "README.md").read_text(), "## Beyond the paper"))
    laurel = row(rows, Run="d12_laurel")
    assert (laurel["against"], laurel["Δ loss"], laurel["Δ BPB"]) == ("d12_prenorm", "-0.010", "-0.004")
    assert (row(rows, Run="d12_dar")["against"], row(rows, Run="d12_dar")["Δ loss"]) == ("d12_prenorm", "-0.015")
    assert row(rows, Run="d12_prenorm")["against"] == "d12_residual"
    assert row(rows, Run="d6_laurel")["against"] == "—"
