"""The iso-FLOP grid's math against closed forms: the parabola in ln(params) and its vertex,
the flags of an unbracketed or a downward U, the frontier over budgets, and the CM along it
(a variant whose frontier is the baseline's at k times the compute reads k). Then the same
through run directories: scripts.isoflop's table and JSON, and the report's subsection (under
"Compute multiplier", through cm_section's hook)."""

import json
import shutil
import math

import pytest

from nanochat.studies import isoflop
from nanochat.report.cm_section import cm_section
from nanochat.report.isoflop_section import isoflop_markdown
from nanochat.report.runs import load_run
from scripts import isoflop as isoflop_cli

# The baseline's frontier, L*(C) = A + B*C^-ALPHA, and its compute-optimal size N*(C) = G*C^0.5.
A, B, ALPHA, G = 0.8, 40.0, 0.12, 0.09
CURVATURE = 0.05  # bpb per (ln params)^2 around the vertex
SIZES = [1e6, 3e6, 1e7, 3e7, 1e8]


def frontier_loss(C):
    return A + B * C ** -ALPHA


def u_curve(C, k=1.0):
    """(params, bpb) of a budget's runs: a parabola in ln params around N*(C), its floor the
    baseline frontier at k*C (a variant worth k times the compute)."""
    x0 = math.log(G * C ** 0.5)
    return [(n, frontier_loss(k * C) + CURVATURE * (math.log(n) - x0) ** 2) for n in SIZES]


def test_parabola_and_its_vertex():
    x0, floor = math.log(2e7), 1.25
    points = [(n, floor + 0.03 * (math.log(n) - x0) ** 2) for n in SIZES]
    fit = isoflop.fit_parabola(*zip(*points))
    assert fit.p2 == pytest.approx(0.03) and fit.vertex == pytest.approx(x0)
    best = isoflop.optimum("residual", 1e15, points)
    assert best.params == pytest.approx(2e7) and best.bpb == pytest.approx(floor)
    assert best.fitted and not best.extrapolated and best.sizes == 5
    # The vertex beyond the largest size trained: the U is not bracketed.
    far = [(n, floor + 0.03 * (math.log(n) - math.log(1e9)) ** 2) for n in SIZES]
    assert isoflop.optimum("residual", 1e15, far).extrapolated
    # Opening downwards: no minimum, the best run stands in, flagged.
    cap = [(n, floor - 0.03 * (math.log(n) - x0) ** 2) for n in SIZES]
    down = isoflop.optimum("residual", 1e15, cap)
    assert not down.fitted and down.extrapolated and down.params == 1e6 and down.bpb == pytest.approx(cap[0][1])
    with pytest.raises(ValueError, match="3 or more model sizes"):
        isoflop.fit_parabola([1e6, 1e6, 2e6], [1.0, 1.1, 1.2])


@pytest.mark.parametrize("k", [1.0, 1.3, 0.8])
def test_frontier_and_the_cm_along_it(k):
    budgets = [1e15, 1e16, 1e17, 1e18]
    points = {("residual", C): u_curve(C) for C in budgets}
    points |= {("kromhc", C): u_curve(C, k) for C in budgets}
    points[("kromhc", 1e19)] = u_curve(1e19, k)[:2]  # 2 sizes: left out, with a note
    notes = []
    front = isoflop.frontier(points, notes)
    assert [o.budget for o in front["kromhc"]] == budgets and "kromhc at 1e+19 FLOPs left out" in notes[0]
    for o in front["residual"]:
        assert o.params == pytest.approx(G * o.budget ** 0.5) and o.bpb == pytest.approx(frontier_loss(o.budget))
    law, cms = isoflop.frontier_cm(front["residual"], front["kromhc"])
    assert (law.a, law.c) == (pytest.approx(A, rel=1e-3), pytest.approx(ALPHA, rel=1e-3))
    assert [c.cm for c in cms] == [pytest.approx(k, rel=1e-3)] * 4
    # Inside the baseline frontier's bpb range only where the variant's L* is.
    lows = [frontier_loss(C) for C in budgets]
    assert [c.extrapolated for c in cms] == [not (min(lows) <= frontier_loss(k * C) <= max(lows)) for C in budgets]


def write_run(root, name, hc, depth, budget, params, bpb, complete=True):
    run = root / name
    run.mkdir(parents=True)
    (run / "config.toml").write_text(f'hc = "{hc}"\ndepth = {depth}\nnum_iterations = -1\ntarget_flops = {budget!r}\n'
                                     + ("hc_streams = 4\n" if hc != "residual" else ""))
    if complete:
        (run / "summary.json").write_text(json.dumps({
            "complete": True, "val_bpb": bpb, "hc": hc, "depth": depth,
            "params": {"transformer_matrices": params - 1000, "lm_head": 1000}}))


def grid_root(tmp_path, k=1.5):
    root = tmp_path / "runs"
    for C in (1e15, 1e16, 1e17):
        for label, factor in (("residual", 1.0), ("kromhc", k)):
            for depth, (n, bpb) in enumerate(u_curve(C, factor), start=2):
                write_run(root, f"isoflop_{C:.0e}_d{depth}_{label}", label, depth, C, n, bpb)
    write_run(root, "isoflop_1e+17_d9_kromhc", "kromhc", 9, 1e17, 5e8, 1.0, complete=False)
    write_run(root, "ladder_d4_kromhc", "kromhc", 4, -1.0, 1e7, 1.0)  # not a grid run
    return root


def test_cli_and_report_section_from_run_directories(tmp_path, capsys):
    root = grid_root(tmp_path)
    out = tmp_path / "isoflop.json"
    isoflop_cli.main(["--runs-root", str(root), "--json", str(out)])
    printed = capsys.readouterr()
    assert "warning: isoflop_1e+17_d9_kromhc skipped" in printed.err and "baseline frontier: L(C) =" in printed.out
    result = json.loads(out.read_text())
    assert set(result["variants"]) == {"residual", "kromhc"} and result["variants"]["residual"]["frontier_cm"] is None
    cms = result["variants"]["kromhc"]["frontier_cm"]
    assert [c["budget"] for c in cms] == [1e15, 1e16, 1e17] and all(c["cm"] == pytest.approx(1.5, rel=1e-3) for c in cms)
    best = result["variants"]["residual"]["frontier"][1]
    assert best["params"] == pytest.approx(G * 1e16 ** 0.5) and best["sizes"] == 5 and best["fitted"]

    runs = [load_run(d) for d in sorted(root.iterdir())]
    section = cm_section(runs, tmp_path).split("### Iso-FLOP frontier", 1)[1]  # as the report's build calls it
    assert (tmp_path / "isoflop.png").is_file() and "- warning: isoflop_1e+17_d9_kromhc skipped" in section
    lines = [line for line in section.splitlines() if line.startswith("| kromhc | 1e+16 |")]
    assert lines and lines[0].rstrip(" |").endswith("1.500")
    assert isoflop_markdown([r for r in runs if r.name.startswith("ladder")], tmp_path) == ""
    assert "Iso-FLOP" not in cm_section([r for r in runs if r.name.startswith("ladder")], tmp_path)
    # The ladder's readings leave the grid's runs (several per depth) to the frontier.
    assert [r.name for r in runs if not isoflop.is_grid_run(r)] == ["ladder_d4_kromhc"]

    with pytest.raises(SystemExit, match="no finished run trained to a FLOPs budget"):
        isoflop_cli.main(["--runs-root", str(root), "--select", "ladder_*"])


def test_the_grids_of_two_trunks_are_read_one_trunk_at_a_time(tmp_path, capsys):
    """speedrun.sh isoflop under TRUNK=2026-07 leaves its grid beside the 2026-01 one (tags
    _t2607): refused mixed, as scripts.compare refuses them, and read apart with --trunk."""
    root = grid_root(tmp_path)
    for run_dir in sorted(root.glob("isoflop_*")):
        moved = shutil.copytree(run_dir, root / f"{run_dir.name}_t2607")
        with open(moved / "config.toml", "a") as f:
            f.write('trunk = "2026-07"\n')
    with pytest.raises(SystemExit) as e:
        isoflop_cli.main(["--runs-root", str(root), "--select", "isoflop_*"])
    assert str(e.value.code).startswith("error: runs of 2 trunks") and "--trunk 2026-01 or --trunk 2026-07" in \
        str(e.value.code) and "\n" not in str(e.value.code)
    out = tmp_path / "t2607.json"
    isoflop_cli.main(["--runs-root", str(root), "--select", "isoflop_*", "--trunk", "2026-07", "--json", str(out)])
    cms = json.loads(out.read_text())["variants"]["kromhc"]["frontier_cm"]
    assert [c["budget"] for c in cms] == [1e15, 1e16, 1e17] and all(c["cm"] == pytest.approx(1.5, rel=1e-3) for c in cms)
