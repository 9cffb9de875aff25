"""scripts.bench_seams at toy sizes under Triton's interpreter: every tiling computes what the
kernels' own does, the fastest one is picked among those that do, and bad tilings are one
error line."""

import json

import pytest

from scripts import bench_seams


def test_a_sweep_times_every_tiling_against_the_first(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from nanochat.connections.backends import fused
    before = fused.tiling(), fused.TMA
    seen = []
    monkeypatch.setattr(fused, "uses_tma", lambda *streams: seen.append(fused.TMA) or False)
    bench_seams.main(["--out", str(tmp_path), "--variants", "hc_identity", "--tilings", "16,8,128,64", "32,2,256,128,tma",
                      "--reps", "1", "--warmup", "0"])
    assert (fused.tiling(), fused.TMA) == before  # the sweep leaves the kernels' own tiling in place
    assert seen.count(True) and seen.count(False)  # through TMA where a tiling says so
    result = json.loads((tmp_path / "bench_seams.json").read_text())
    rows = result["rows"]
    assert [(r["variant"], r["tiling"]) for r in rows] == [("hc_identity", [16, 8, 128, 64]),
                                                           ("hc_identity", [32, 2, 256, 128, "tma"])]
    assert rows[0]["max_rel_gap"] == 0 and all(r["max_rel_gap"] < 1e-5 for r in rows)  # fp32: the same function
    for r in rows:
        assert r["step_ms"] > r["forward_ms"] > 0
        assert r["x_torch"] == pytest.approx(r["step_ms"] / result["torch_backend"]["hc_identity"]["step_ms"])
    assert tuple(result["fastest"]) == min((tuple(r["tiling"]) for r in rows),
                                           key=lambda t: next(r["step_ms"] for r in rows if tuple(r["tiling"]) == t))
    assert "fastest:" in capsys.readouterr().out


def test_fastest_skips_tilings_that_failed_or_differ():
    rows = [dict(variant=v, tiling=t, step_ms=ms, max_rel_gap=gap) for v, t, ms, gap in
            [("a", [1], 5.0, 0.0), ("b", [1], 5.0, 0.0), ("a", [2], 1.0, 0.5), ("b", [2], 1.0, 0.0),
             ("a", [4], 4.0, 1e-3), ("b", [4], 4.0, 1e-3), ("a", [8], 1.0, 0.0)]]
    rows.append(dict(variant="b", tiling=[8], error="RuntimeError: out of resources"))
    assert bench_seams.fastest(rows, ["a", "b"]) == (4,)
    assert bench_seams.fastest(rows[:1], ["a", "b"]) is None


@pytest.mark.parametrize("argv, phrase", [
    (["--tilings", "16,8,128"], "four powers of two"),
    (["--tilings", "16,8,100,64"], "four powers of two"),
    (["--tilings", "16,8,128,64,fast"], "four powers of two"),
    (["--variants", "laurel"], "has no fused seams"),
])
def test_bad_flags_are_one_error_line(argv, phrase, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(SystemExit) as exc:
        bench_seams.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "error:" in line][0].count(phrase) == 1
    assert "Traceback" not in err


def test_on_a_gpu_the_dots_take_trainings_precision(monkeypatch):
    """The seams' products follow torch's fp32 matmul setting (TF32 in training): the sweep
    must take its device through the same setup as training's tools, or it times IEEE dots."""
    class Taken(Exception):
        pass

    def single_gpu_device():
        raise Taken

    monkeypatch.setattr(bench_seams.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench_seams, "single_gpu_device", single_gpu_device)
    with pytest.raises(Taken):
        bench_seams.main(["--variants", "kromhc"])


def test_the_default_sweep_starts_from_the_kernels_own_tiling():
    from nanochat.connections.backends import fused
    tilings = bench_seams.build_parser().parse_args([]).tilings
    assert tilings[0] == fused.tiling() and len(set(tilings)) == len(tilings) == 10
    assert tilings[1] == fused.tiling() + ("tma",)  # the same through TMA: what it buys on the GPU
