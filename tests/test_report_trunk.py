"""The report never reads runs of two trunks together: the paper's sections take the 2026-01
runs, each other trunk gets its own runs table, results per depth (ΔParams against its own
residual run) and compute-multiplier section."""

from test_report import RES_TOTAL, cfg, write_run

from nanochat.report.build import write_report
from nanochat.report.runs import load_run

KROMHC_HC = 239_796  # any count would do


def section(text, heading):
    """The text under `heading` up to the next heading of its level or above."""
    level = heading.split(" ")[0]
    body = text.split(heading + "\n", 1)[1]
    ends = [i for i in range(len(body)) if body.startswith("\n#", i)
            and len(body[i + 1:].split(" ")[0]) <= len(level)]
    return body[:ends[0]] if ends else body


def test_runs_of_two_trunks_get_their_own_tables(tmp_path):
    root = tmp_path / "runs"
    runs = [load_run(d) for d in (
        write_run(root, "d6_residual", cfg(6, "residual"), final_loss=3.50, bpb=1.05),
        write_run(root, "d6_kromhc", cfg(6, "kromhc"), hc_params=KROMHC_HC, final_loss=3.48, bpb=1.03),
        # the 2026-07 residual has 1000 more parameters than the 2026-01 one, so a ΔParams taken
        # against the other trunk's residual would show
        write_run(root, "d6_residual_t2607", cfg(6, "residual", trunk="2026-07"), final_loss=3.30, bpb=0.98,
                  summary_extra={"params": {"total": RES_TOTAL[6] + 1000, "hc": 12}}),
        write_run(root, "d6_kromhc_t2607", cfg(6, "kromhc", trunk="2026-07"), hc_params=KROMHC_HC, final_loss=3.29,
                  bpb=0.97),
    )]
    assert [r.trunk for r in runs] == ["2026-01", "2026-01", "2026-07", "2026-07"]
    text = write_report(runs, tmp_path / "report").read_text()

    paper = section(text, "## Main results, D=6 (Table 3 (tab:loss))")
    assert "d6_kromhc " in paper and "_t2607" not in paper
    assert f"{(KROMHC_HC - 12) / 1e3:.1f}" in paper  # against d6_residual
    assert "_t2607" not in section(text, "## Runs")

    heading = "Trunk 2026-07 (nanochat 92d63d4's recipe)"
    runs_07 = section(text, f"## {heading}: runs")
    assert "d6_residual_t2607" in runs_07 and "d6_kromhc |" not in runs_07
    table = section(text, f"### {heading}: D=6")
    kromhc_row = next(line for line in table.splitlines() if "d6_kromhc_t2607" in line)
    assert f"| {(KROMHC_HC - 12 - 1000) / 1e3:.1f} |" in kromhc_row  # against d6_residual_t2607
    assert "| 0.970 |" in kromhc_row and "d6_residual |" not in table
    assert (tmp_path / "report" / "loss_t2607_d6.png").is_file()  # the trunk as run tags write it

    # one compute-multiplier section per trunk, each over its own runs
    assert "## Compute multiplier (not in the paper)" in text
    cm = section(text, f"## {heading}: compute multiplier")
    assert "`TRUNK=2026-07 bash speedrun.sh ladder` trains a ladder" in cm
    assert "No table, ratio or compute multiplier reads runs of two trunks together." in text


def test_a_report_of_one_trunk_alone_has_no_paper_sections(tmp_path):
    root = tmp_path / "runs"
    runs = [load_run(write_run(root, "d6_residual_t2607", cfg(6, "residual", trunk="2026-07")))]
    text = write_report(runs, tmp_path / "report").read_text()
    assert "## Trunk 2026-07 (nanochat 92d63d4's recipe): runs" in text
    assert "## Main results" not in text and "## The paper's numbers" not in text
