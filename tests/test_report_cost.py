"""The report's Cost section: training rows from the runs' summaries, inference rows from an
inference benchmark's JSON (scripts.bench --bench infer), "not measured" with the command
when there is none, the published anchors, and the --infer-bench flag's errors."""

import json

import pytest

from nanochat.report.build import write_report
from nanochat.report.cost import ANCHORS, cost_section, load_infer_bench
from nanochat.report.format import MISSING
from nanochat.report.runs import load_run
from scripts import report as report_cli
from test_report import cfg, section, table, write_run

HEADING = "## Cost: training and inference (not in the paper)"


def infer_json(path, depth=6, modes=("eager", "compiled")):
    """A benchmark with known times: mhc 3x and kromhc 1.5x residual's prefill in eager mode,
    2x and 1.2x compiled; decode 4x and 2x (both modes), over two shapes."""
    factor = {"prefill": {"eager": {"residual": 1, "mhc": 3, "kromhc": 1.5},
                          "compiled": {"residual": 1, "mhc": 2, "kromhc": 1.2}},
              "decode": {m: {"residual": 1, "mhc": 4, "kromhc": 2} for m in modes}}
    rows = []
    for kind in ("prefill", "decode"):
        for mode in modes:
            for batch, base_ms in ((1, 2.0), (8, 10.0)):
                for variant, f in factor[kind][mode].items():
                    rows.append({"bench": kind, "variant": variant, "mode": mode, "batch": batch, "seq_len": 128,
                                 "median_ms": base_ms * f, "time_vs_residual": f, "fallback": None})
    path.write_text(json.dumps({"args": {"depth": depth, "vocab_size": 4096, "prefill_lens": [128], "new_tokens": 32,
                                         "prompt_len": 96, "infer_batches": [1, 8]},
                                "env": {"device": "cpu", "dtype": "float32", "torch": "2.13"}, "width": 128,
                                "results": rows}))
    return path


def runs_at(tmp_path, depth=6):
    root = tmp_path / "runs"
    extra = {"residual": dict(step_time=0.2, peak_mem_mib=800.0), "mhc": dict(step_time=0.5, peak_mem_mib=1000.0),
             "kromhc": dict(step_time=0.3, peak_mem_mib=880.0)}
    return [load_run(write_run(root, f"d{depth}_{v}", cfg(depth, v), summary_extra=e)) for v, e in extra.items()]


def test_cost_rows_from_runs_and_the_inference_benchmark(tmp_path):
    readme = write_report(runs_at(tmp_path), tmp_path / "report",
                          infer_bench=load_infer_bench(infer_json(tmp_path / "infer.json"))).read_text()
    text = section(readme, HEADING)
    rows = {r["Method"]: r for r in table(text)}
    assert rows["mHC"]["step time"] == "2.50x" and rows["mHC"]["peak mem"] == "1.25x"
    assert rows["KromHC"]["step time"] == "1.50x" and rows["KromHC"]["peak mem"] == "1.10x"
    assert rows["Residual"]["step time"] == "1.00x" and rows["Residual"]["train mode"] == "eager"
    assert rows["mHC"]["prefill eager"] == "3.00x" and rows["mHC"]["prefill compiled"] == "2.00x"
    assert rows["KromHC"]["prefill compiled"] == "1.20x" and rows["KromHC"]["decode eager"] == "2.00x"
    assert "infer.json" in text and "geometric mean" in text and "Not measured" not in text
    for source, *_ in ANCHORS:
        assert source in text
    assert "1.067x" in text and "+11.4 %" in text and "0.49x / 1.31x" in text


def test_cost_inference_not_measured_says_how(tmp_path):
    text = cost_section(runs_at(tmp_path), [6], None)
    rows = {r["Method"]: r for r in table(text)}
    assert rows["mHC"]["step time"] == "2.50x" and rows["mHC"]["prefill eager"] == MISSING
    assert "Inference not measured at this depth" in text and "python -m scripts.bench --bench infer --depth 6" in text


def test_cost_eager_only_benchmark_names_the_missing_mode(tmp_path):
    bench = load_infer_bench(infer_json(tmp_path / "infer.json", modes=("eager",)))
    text = cost_section(runs_at(tmp_path), [6], bench)
    rows = {r["Method"]: r for r in table(text)}
    assert rows["mHC"]["decode eager"] == "4.00x" and "decode compiled" not in rows["mHC"]
    assert "Not measured: compiled inference (`--modes compiled`)" in text


def test_infer_bench_flag(tmp_path, capsys):
    runs = runs_at(tmp_path)
    path = infer_json(tmp_path / "infer.json")
    report_cli.main(["--runs", *(str(r.path) for r in runs), "--infer-bench", str(path),
                     "--out", str(tmp_path / "report")])
    assert "prefill compiled" in (tmp_path / "report" / "README.md").read_text()
    (tmp_path / "training.json").write_text(json.dumps({"args": {"depth": 4}, "results": [{"bench": "model"}]}))
    with pytest.raises(SystemExit) as exc:
        report_cli.main(["--runs", str(runs[0].path), "--infer-bench", str(tmp_path / "training.json")])
    assert "holds no prefill or decode rows" in str(exc.value) and str(exc.value).startswith("error:")
