"""scripts.gpu_check at its tiny (CPU) size: every section runs and reports, ratios come from
its own timings, every variant trains, and bad flags give one error line."""

import json
import statistics

import pytest

from scripts import bench, gpu_check


# The single-stream baseline, the ratio reference and the paper's variant: every kind of case
# gpu_check treats apart, at a fraction of every variant's time (each variant's own training,
# decoding and kernels have tests of their own).
TINY_VARIANTS = ["residual", "mhc", "kromhc"]


@pytest.mark.slow
def test_tiny_run_reports_every_section(tmp_path, capsys):
    gpu_check.main(["--out", str(tmp_path), "--tiny", "--variants", *TINY_VARIANTS, "--train-steps", "8"])
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    md = (tmp_path / "gpu_check.md").read_text()
    assert result["profile"] == "tiny" and result["errors"] == []
    assert result["env"]["torch"] and result["env"]["backward_pass_autocast"] == "off"

    attention = {r["label"]: r for r in result["attention"]}
    assert set(attention) == {"S sdpa", "S flex", "L sdpa", "L flex"}
    for r in attention.values():
        sdpa = attention[f"{r['window_name']} sdpa"]
        assert r["vs_sdpa"] == pytest.approx(r["median_ms"] / sdpa["median_ms"])
    assert attention["S flex"]["window"] == 128 and attention["L flex"]["window"] == 256

    model = result["model"]
    labels = ["residual", gpu_check.FULL_CAUSAL, *TINY_VARIANTS[1:]]
    assert [(r["depth"], r["label"]) for r in model] == [(d, v) for d in (1, 2) for v in labels]
    for depth in (1, 2):
        rows = {r["label"]: r for r in model if r["depth"] == depth}
        for r in rows.values():
            assert r["median_ms"] > 0 and r["tokens_per_s"] > 0 and r["n"] == (4 if bench.has_streams(r["variant"]) else 1)
            assert r["vs_residual"] == pytest.approx(r["ms_per_token"] / rows["residual"]["ms_per_token"])
            assert r["vs_mhc"] == pytest.approx(r["ms_per_token"] / rows["mhc"]["ms_per_token"])
        assert rows[gpu_check.FULL_CAUSAL]["window_pattern"] == "L"
        assert all(len(r["top_kernels"]) == gpu_check.TOP_KERNELS for r in rows.values())  # profiled
    # at depth 2 the first layer is windowed (the last one never is): fewer attention FLOPs
    windowed, full = (next(r for r in model if r["depth"] == 2 and r["label"] == label)
                      for label in ("residual", gpu_check.FULL_CAUSAL))
    assert windowed["flops_per_token"] < full["flops_per_token"]

    # traced (dynamo, no code generation) vs eager, fp32 on CPU: the same numbers
    assert [r["variant"] for r in result["grads"]] == TINY_VARIANTS
    assert all(r["max_rel_gap"] < 1e-5 for r in result["grads"])

    train = result["train"]
    assert [r["variant"] for r in train] == TINY_VARIANTS
    for r in train:
        assert r["ok"], r.get("error")
        assert r["steps"] == 8 and r["last_loss"] < r["first_loss"] and r["val_bpb"] > 0

    # torch, liger and fused (the tests run Triton's interpreter: the kernels run on the CPU):
    # the whole model first, the baseline once, then KromHC and mHC per backend, fused first,
    # each timed with the baseline; then one layer of each on every backend
    kernels = result["kernels"]
    assert kernels["available"] and kernels["backends"] == ["torch", "liger", "fused", "fused-split"]
    assert kernels["depth"] == 1  # the tiny profile's: one layer in the interpreter
    assert kernels["errors"] == []
    runs = [(r["run"], r["variant"], r["kernels"]) for r in kernels["rows"]]
    assert runs == ([("model D1", "residual", "torch")]
                    + [("model D1", v, k) for k in ("fused", "fused-split", "torch", "liger")
                       for v in ("kromhc", "mhc")]
                    + [("layer", v, k) for v in ("mhc", "kromhc") for k in ("torch", "liger", "fused")])
    model_rows = [r for r in kernels["rows"] if r["run"] == "model D1"]
    pairs = [r["residual_ms"] for r in model_rows[1:]]
    assert model_rows[0]["median_ms"] == pytest.approx(statistics.median(pairs))
    for r in model_rows[1:]:
        assert r["time_vs_residual"] == pytest.approx(r["median_ms"] / r["residual_ms"])
        torch_row = next(t for t in model_rows if (t["variant"], t["kernels"]) == (r["variant"], "torch"))
        assert r["time_vs_torch"] == pytest.approx(r["time_vs_residual"] / torch_row["time_vs_residual"])
        assert r["compile_s"] > 0 and len(r["top_kernels"]) == gpu_check.TOP_KERNELS
    for r in kernels["rows"]:
        if r["run"] == "layer":
            torch_row = next(t for t in kernels["rows"] if t["run"] == "layer"
                             and (t["variant"], t["kernels"]) == (r["variant"], "torch"))
            assert r["time_vs_torch"] == pytest.approx(r["median_ms"] / torch_row["median_ms"])
            assert r["saved_bytes"] > 0

    assert "not GPU numbers" in md and "## Whole model" in md and "## base_train" in md
    assert "Where each step's time goes" in md
    from nanochat.planning.memory import code_fingerprint
    assert result["env"]["code"] == code_fingerprint() and f"model code {code_fingerprint()}." in md
    assert "## Stream kernels: torch, liger, fused, fused-split" in md
    assert {r["variant"] for r in result["infer"]} == set(TINY_VARIANTS)
    assert "## Inference: prefill and decode" in md
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize("flag", ["--reps", "--batch", "--depths", "--train-steps", "--time-budget"])
@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_numeric_flags_reject_bad_values(flag, value, capsys):
    with pytest.raises(SystemExit) as exc:
        gpu_check.build_parser().parse_args([flag, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "positive integer" in errors[0] and flag in errors[0]
    assert "Traceback" not in err


def test_missing_out_directory_is_made_and_a_file_is_one_error(tmp_path, capsys):
    out = tmp_path / "new" / "dir"
    gpu_check.main(["--out", str(out), "--sections", "env"])
    assert json.loads((out / "gpu_check.json").read_text())["profile"] == "tiny"
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as exc:
        gpu_check.main(["--out", str(tmp_path / "file"), "--sections", "env"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "error:" in line] == [
        f"python -m scripts.gpu_check: error: --out {str(tmp_path / 'file')!r}: cannot make that directory "
        "(File exists); pass another path"]


def test_time_budget_skips_and_lists_what_is_left(tmp_path, monkeypatch):
    """A budget that runs out after the first depth's residual pair: the rest of the model
    section and all of the train section are listed as skipped, not failed."""
    allowed = {"model D1 residual", f"model D1 {gpu_check.FULL_CAUSAL}"}
    monkeypatch.setattr(gpu_check.Budget, "allows",
                        lambda self, what, kind, size=1: what in allowed or self.skipped.append(what))
    gpu_check.main(["--out", str(tmp_path), "--tiny", "--sections", "model", "train"])
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [r["label"] for r in result["model"]] == ["residual", gpu_check.FULL_CAUSAL]
    assert result["train"] == [] and result["errors"] == []
    assert "model D2 residual" in result["skipped"] and "train kromhc" in result["skipped"]
    assert "Skipped (time budget" in (tmp_path / "gpu_check.md").read_text()


def test_kernels_section_says_why_it_cannot_measure(tmp_path, monkeypatch):
    from nanochat.connections.backends import fused, liger
    monkeypatch.setattr(liger, "AVAILABLE", False)
    monkeypatch.setattr(fused, "runs_on", lambda device_type: False)
    gpu_check.main(["--out", str(tmp_path), "--tiny", "--sections", "kernels"])
    kernels = json.loads((tmp_path / "gpu_check.json").read_text())["kernels"]
    assert not kernels["available"] and kernels["backends"] == ["torch"] and kernels["rows"] == []
    assert kernels["reason"] == ("liger: Liger-Kernel not installed (pip install -e '.[kernels]'); fused: no CUDA (cpu); "
                                 "fused-split: no CUDA (cpu)")
    assert "Not measured: liger: Liger-Kernel not installed" in (tmp_path / "gpu_check.md").read_text()


def test_stream_plan_puts_the_paper_pair_first_and_falls_back_per_variant():
    plan = gpu_check.stream_plan(["residual", "kromhc", "frac", "mhc", "go_mhc", "laurel"], ["torch", "liger", "fused"])
    assert plan == [("kromhc", ["fused"]), ("mhc", ["fused"]), ("kromhc", ["torch"]), ("mhc", ["torch"]),
                    ("kromhc", ["liger"]), ("mhc", ["liger"]), ("frac", ["torch"]),
                    ("go_mhc", ["fused", "torch", "liger"]), ("laurel", ["torch"])]
    assert gpu_check.stream_plan(["mhc"], ["torch"]) == [("mhc", ["torch"])]


def test_a_failed_kernel_case_is_an_error_and_the_others_still_run(tmp_path, monkeypatch):
    """frac falls back to torch (fused has no kernels for it); a case that raises is listed
    as an error, and the cases after it are measured."""
    measure = gpu_check._stream_row

    def fails_for_mhc(case, base, variant, kernels, *rest):
        if (variant, kernels) == ("mhc", "fused"):
            raise RuntimeError("planted")
        return measure(case, base, variant, kernels, *rest)

    monkeypatch.setattr(gpu_check, "_stream_row", fails_for_mhc)
    monkeypatch.setattr(gpu_check, "STREAM_ORDER", ("fused", "torch"))
    monkeypatch.setattr(gpu_check.bench, "run_bench", lambda *a: [])  # the layer run: not under test
    with pytest.raises(SystemExit, match="some checks failed"):
        gpu_check.main(["--out", str(tmp_path), "--tiny", "--sections", "kernels",
                        "--variants", "residual", "mhc", "frac"])
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    rows = [(r["variant"], r["kernels"]) for r in result["kernels"]["rows"]]
    assert rows == [("residual", "torch"), ("mhc", "torch"), ("frac", "torch")]
    assert result["errors"] == ["kernels: model D1 mhc [fused]: RuntimeError: planted"]
    assert "planted" in (tmp_path / "gpu_check.md").read_text()


def test_backends_flag_keeps_the_kernels_section_to_those(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check.bench, "run_bench", lambda *a: [])  # the layer run: not under test
    # which cases run is under test, not their measurement (the tiny run's test has that)
    monkeypatch.setattr(gpu_check, "_stream_row", lambda case, base, variant, kernels, *rest: dict(
        variant=variant, kernels=kernels, time_vs_residual=1.0, residual_ms=1.0))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gpu_check.main(["--out", str(tmp_path), "--tiny", "--sections", "kernels", "--backends", "fused",
                    "--variants", "residual", "kromhc"])
    kernels = json.loads((tmp_path / "gpu_check.json").read_text())["kernels"]
    assert kernels["backends"] == ["fused"] and kernels["missing"] == {}
    assert [(r["variant"], r["kernels"]) for r in kernels["rows"]] == [("residual", "torch"), ("kromhc", "fused")]


def test_pre_section_times_delayed_beside_current(tmp_path):
    gpu_check.main(["--out", str(tmp_path), "--tiny", "--sections", "pre", "--variants", "residual", "kromhc"])
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [(r["variant"], r["pre"]) for r in result["pre"]] == [("kromhc", "current"), ("kromhc", "delayed")]
    assert result["pre"][0]["time_vs_current"] == 1.0 and result["pre"][1]["time_vs_current"] > 0
    assert "## Delayed pre-weights (--hc-pre)" in (tmp_path / "gpu_check.md").read_text()


def test_infer_section_measures_every_variant(tmp_path):
    """Without CUDA: eager prefill and decode of every variant (compiled graphs would cost
    minutes on a small CPU), with the ratios to residual in the JSON and the markdown."""
    gpu_check.main(["--out", str(tmp_path), "--tiny", "--sections", "infer"])
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    rows = result["infer"]
    assert result["errors"] == []
    assert {(r["bench"], r["variant"], r["batch"]) for r in rows} == {
        (kind, v, b) for kind in ("prefill", "decode") for v in bench.VARIANTS for b in (1, 2)}
    assert {r["mode"] for r in rows} == {"eager"}
    for r in rows:
        base = next(p for p in rows if (p["bench"], p["variant"], p["batch"]) == (r["bench"], "residual", r["batch"]))
        assert r["time_vs_residual"] == pytest.approx(r["median_ms"] / base["median_ms"])
    assert "## Inference: prefill and decode through the KV cache" in (tmp_path / "gpu_check.md").read_text()


class Killed(BaseException):
    """What a kill from outside does to the run: nothing of it goes on (not an Exception, which
    a section would catch and report)."""


@pytest.mark.parametrize("section, builder", [("grads", "layer_case"), ("model", "model_case")])
def test_a_run_killed_in_its_second_case_keeps_the_first(tmp_path, monkeypatch, section, builder):
    calls = []
    real = getattr(bench, builder)

    def second_is_killed(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise Killed
        return real(*args, **kwargs)

    monkeypatch.setattr(bench, builder, second_is_killed)
    with pytest.raises(Killed):
        gpu_check.main(["--out", str(tmp_path), "--tiny", "--sections", section, "--variants", "residual", "mhc",
                        "--depths", "1"])
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    first = "grads residual" if section == "grads" else "model D1 residual"
    assert result["cases"][first]["wall_s"] >= 0 and "estimate_s" in result["cases"][first]
    if section == "grads":
        assert [r["variant"] for r in result["grads"]] == ["residual"]
    assert first in (tmp_path / "gpu_check.md").read_text()


def test_budget_estimates_a_case_from_its_kind_and_skips_what_would_not_fit(monkeypatch):
    """Before any case of a kind has finished, its estimate is the prior; then the longest
    seconds per unit seen, times the case's size. A case that would end past the budget is
    skipped, with its estimate kept."""
    clock = [1000.0]
    monkeypatch.setattr(gpu_check.time, "time", lambda: clock[0])
    budget = gpu_check.Budget(100, {"model": 10})

    def case(what, kind, size, seconds):
        if not budget.allows(what, kind, size):
            return False
        clock[0] += seconds
        budget.close()
        return True

    assert case("model D6 residual", "model", 6, 30)  # prior: 60 s
    assert case("model D6 mhc", "model", 6, 42)  # 5 s per layer measured: 30 s, to end at 60
    assert case("grads mhc", "layer", 1, 3)  # no prior, none measured: 0 s
    assert not case("model D12 residual", "model", 12, 0)  # 7 s per layer: 84 s, to end at 159
    assert budget.skipped == ["model D12 residual"]
    assert budget.cases == {
        "model D6 residual": {"kind": "model", "size": 6, "estimate_s": 60, "wall_s": 30},
        "model D6 mhc": {"kind": "model", "size": 6, "estimate_s": 30, "wall_s": 42},
        "grads mhc": {"kind": "layer", "size": 1, "estimate_s": 0, "wall_s": 3},
        "model D12 residual": {"kind": "model", "size": 12, "estimate_s": 84}}
