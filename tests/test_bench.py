"""scripts/bench in a tiny configuration: the JSON it writes, ratios computed from its own
timings, the saved-for-backward count, the table, and its errors."""

import json
import statistics
import sys

import launch
import pytest

from scripts import bench

TINY = ["--depth", "1", "--width", "32", "--head-dim", "16", "--seq-len", "16", "--batch", "2",
        "--vocab-size", "64", "--warmup", "1", "--reps", "3"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    bench.main(TINY + ["--variants", "residual", "hc", "mhc", "kromhc", "--recompute", "both", "--out", str(out)])
    return json.loads(out.read_text())


def test_json_has_every_row_and_field(report):
    rows = report["results"]
    labels = {(r["bench"], r["label"]) for r in rows}
    for bench_name in ("layer", "model"):
        for label in ("residual", "hc", "hc +recompute", "mhc", "mhc +recompute", "kromhc", "kromhc +recompute"):
            assert (bench_name, label) in labels
    assert len(rows) == 14
    for r in rows:
        assert len(r["times_ms"]) == 3 and all(t > 0 for t in r["times_ms"])
        assert r["n"] == (1 if r["variant"] == "residual" else 4)
        assert r["peak_step_mib"] is None  # CPU: no allocator peak, only saved bytes
        assert r["saved_bytes"] > 0
    assert report["env"]["device"] == "cpu" and report["env"]["dtype"] == "float32" and report["env"]["threads"] == 1
    assert report["width"] == 32 and report["args"]["reps"] == 3


def test_statistics_and_ratios_come_from_its_own_timings(report):
    for bench_name in ("layer", "model"):
        rows = [r for r in report["results"] if r["bench"] == bench_name]
        base = next(r for r in rows if r["variant"] == "residual")
        for r in rows:
            ms = r["times_ms"]
            assert r["median_ms"] == pytest.approx(statistics.median(ms))
            assert (r["min_ms"], r["max_ms"]) == (min(ms), max(ms))
            assert r["tokens_per_s"] == pytest.approx(2 * 16 / (r["median_ms"] / 1e3))
            assert r["time_vs_residual"] == pytest.approx(r["median_ms"] / base["median_ms"])
            mhc = next(m for m in rows if m["variant"] == "mhc" and m["recompute"] == r["recompute"])
            assert r["time_vs_mhc"] == pytest.approx(r["median_ms"] / mhc["median_ms"])
            assert r["saved_bytes_per_token"] == pytest.approx(r["saved_bytes"] / 32)
            if bench_name == "model":
                assert r["hc_layers"] == 2
                assert r["extra_saved_bytes_per_layer"] == pytest.approx((r["saved_bytes"] - base["saved_bytes"]) / 2)
        assert base["time_vs_residual"] == 1.0


def test_saved_bytes_are_exact(tmp_path):
    """residual, branch F(u) = u/2 (saves nothing): the block-start layer keeps exactly X and
    x0 (the two products with l_resid and l_x0), B*T*C fp32 each. An HC layer keeps at least
    its streams (n*C per token)."""
    rows = bench.main(TINY + ["--bench", "layer", "--branch", "scale", "--variants", "residual", "hc_identity",
                              "--reps", "1"])
    residual, hc = rows
    assert residual["saved_bytes"] == 2 * (2 * 16 * 32 * 4)
    assert hc["saved_bytes"] >= 2 * 16 * 4 * 32 * 4


def test_delayed_pre_rows_beside_the_papers(tmp_path):
    rows = bench.main(TINY + ["--variants", "residual", "mhc", "kromhc", "--hc-pre", "current,delayed", "--reps", "1"])
    labels = [(r["bench"], r["label"], r["pre"]) for r in rows]
    for bench_name in ("layer", "model"):
        assert (bench_name, "residual", "current") in labels and (bench_name, "kromhc +delayed pre", "delayed") in labels
        delayed = next(r for r in rows if r["bench"] == bench_name and r["label"] == "kromhc +delayed pre")
        mhc = next(r for r in rows if r["bench"] == bench_name and r["label"] == "mhc +delayed pre")
        assert delayed["time_vs_mhc"] == pytest.approx(delayed["median_ms"] / mhc["median_ms"])
        assert delayed["compiled_kernels"] is None  # eager: nothing generated
    assert len(rows) == 10


def test_variants_beyond_the_family_get_the_rows_that_apply(tmp_path):
    """go_mhc is an HC variant (recompute, Liger, delayed pre); frac and attnres run on torch
    only, with their own state (m fractions; attnres one partial block, no recompute)."""
    rows = bench.main(TINY + ["--variants", "residual", "mhc", "go_mhc", "frac", "attnres", "--recompute", "both",
                              "--hc-pre", "current,delayed", "--reps", "1"])
    labels = {(r["bench"], r["label"]) for r in rows}
    for bench_name in ("layer", "model"):
        assert {(bench_name, label) for label in ("go_mhc", "go_mhc +recompute", "go_mhc +delayed pre", "frac",
                                                  "frac +recompute", "attnres")} <= labels
        assert not {(bench_name, label) for label in ("frac +delayed pre", "attnres +recompute")} & labels
        n = {r["variant"]: r["n"] for r in rows if r["bench"] == bench_name}
        assert (n["frac"], n["attnres"], n["go_mhc"]) == (4, 1, 4)
    assert len(rows) == 2 * (1 + 4 + 4 + 2 + 1)


def test_table_is_printed(capsys, report):
    bench.main(TINY + ["--bench", "layer", "--variants", "residual", "mhc", "--reps", "1"])
    out = capsys.readouterr().out
    assert "one connection layer" in out and "x residual" in out and "x mhc" in out
    assert "\nresidual " in out and "\nmhc " in out and "spread = IQR / median" in out


def test_profile_lists_each_cases_top_ops(tmp_path, capsys):
    """--profile K: each row's K ops with the most self time of one step, largest first, with
    calls and shares of that step."""
    out = tmp_path / "bench.json"
    bench.main(TINY + ["--bench", "model", "--variants", "residual", "kromhc", "--reps", "1", "--profile", "4",
                       "--out", str(out)])
    rows = json.loads(out.read_text())["results"]
    assert [r["label"] for r in rows] == ["residual", "kromhc"]
    for r in rows:
        top = r["top_kernels"]
        assert len(top) == 4 and all(op["name"] and op["calls"] >= 1 for op in top)
        assert [op["ms"] for op in top] == sorted((op["ms"] for op in top), reverse=True)
        assert 0 < sum(op["share"] for op in top) <= 1 + 1e-9
    printed = capsys.readouterr().out
    assert "where one step's time goes" in printed and rows[1]["top_kernels"][0]["name"][:40] in printed


def test_help_runs():
    result = launch.run([sys.executable, "-m", "scripts.bench", "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    assert "--compile" in result.stdout and "python -m scripts.bench --device cuda" in result.stdout


@pytest.mark.parametrize("argv, message", [
    (["--variants", "mhc_lite", "--streams", "8"], "at most 6 streams"),
    (["--width", "40"], "not a multiple of --head-dim"),
    (["--reps", "0"], "argument --reps: expected a positive integer"),
    (["--hc-pre", "later"], "expected a comma-separated list of current, delayed"),
])
def test_bad_input_is_one_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(TINY + argv)
    assert message in str(exc.value) + capsys.readouterr().err


def test_infer_bench_has_every_variant_and_ratios_from_its_own_timings(tmp_path):
    """--bench infer at tiny sizes, eager (the compiled path is tests/test_engine.py's): a
    prefill row per variant, length and batch, a decode row per variant and batch, each
    with ratios to residual, mhc and eager computed from the same run."""
    out = tmp_path / "infer.json"
    bench.main(TINY + ["--bench", "infer", "--prefill-lens", "8", "12", "--infer-batches", "1", "2", "--prompt-len", "6",
                       "--new-tokens", "3", "--reps", "2", "--modes", "eager", "--json", str(out)])
    report = json.loads(out.read_text())
    rows = report["results"]
    assert {(r["bench"], r["variant"], r["batch"], r["seq_len"]) for r in rows} == (
        {("prefill", v, b, t) for v in bench.VARIANTS for b in (1, 2) for t in (8, 12)}
        | {("decode", v, b, 6) for v in bench.VARIANTS for b in (1, 2)})
    assert report["env"]["compile"] == "eager" and report["args"]["new_tokens"] == 3
    for r in rows:
        peers = [p for p in rows if (p["bench"], p["batch"], p["seq_len"]) == (r["bench"], r["batch"], r["seq_len"])]
        base = next(p for p in peers if p["variant"] == "residual")
        mhc = next(p for p in peers if p["variant"] == "mhc")
        assert r["time_vs_residual"] == pytest.approx(r["median_ms"] / base["median_ms"])
        assert r["time_vs_mhc"] == pytest.approx(r["median_ms"] / mhc["median_ms"])
        assert r["time_vs_eager"] == 1.0 and r["fallback"] is None and r["peak_mib"] is None
        tokens = r["batch"] * (3 if r["bench"] == "decode" else r["seq_len"])
        assert r["tokens_per_s"] == pytest.approx(tokens / (r["median_ms"] / 1e3))
        if r["bench"] == "decode":
            assert r["ms_per_token"] == pytest.approx(r["median_ms"] / 3) and r["new_tokens"] == 3


def test_infer_bench_refuses_cuda_graphs_without_cuda():
    with pytest.raises(SystemExit, match="cudagraphs needs --device cuda"):
        bench.main(TINY + ["--bench", "decode", "--modes", "eager,cudagraphs", "--variants", "residual"])
