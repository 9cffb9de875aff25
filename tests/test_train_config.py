"""Training settings (CLI over TOML), schedules, batch arithmetic and checkpoint files."""

import json
import os
import signal
import tomllib

import pytest
import torch

from nanochat import checkpoint_manager as ckpt
from nanochat.gpt import GPTConfig, build_model
from nanochat.cluster.preempt import StopRequest
from nanochat.train_config import FLAG_NAMES, dumps_toml, parse_args, settings
from scripts.base_train import (check_resume_settings, clean_metrics_log, grad_accum_steps, lr_multiplier,
                                muon_momentum, muon_weight_decay)


def write(path, text):
    path.write_text(text)
    return str(path)


def test_cli_wins_over_toml(tmp_path):
    cfg = write(tmp_path / "c.toml", 'depth = 6\nhc = "kromhc"\nhc_factors = [2, 2]\nhc_alpha_shared = false\n')
    args = parse_args(["--config", cfg, "--depth", "8"])
    assert args.depth == 8 and args.hc == "kromhc" and args.hc_factors == [2, 2] and args.hc_alpha_shared is False
    assert parse_args(["--hc-factors", "4x2"]).hc_factors == [4, 2]
    assert parse_args(["--hc-alpha-shared", "false"]).hc_alpha_shared is False


def test_unknown_toml_key_and_bad_values_are_clear(tmp_path, capsys):
    cfg = write(tmp_path / "c.toml", "depht = 6\n")
    with pytest.raises(SystemExit, match="unknown key.*depht"):
        parse_args(["--config", cfg])
    with pytest.raises(SystemExit, match="not found"):
        parse_args(["--config", str(tmp_path / "missing.toml")])
    bad = write(tmp_path / "b.toml", 'hc_factors = "two"\n')
    with pytest.raises(SystemExit, match="hc_factors"):
        parse_args(["--config", bad])
    with pytest.raises(SystemExit):
        parse_args(["--no-such-flag", "1"])
    assert "unrecognized arguments" in capsys.readouterr().err


def test_resolved_settings_round_trip_through_toml(tmp_path):
    args = parse_args(["--hc", "mhc", "--hc-factors", "", "--model-tag", 'a "quoted" tag'])
    values = {k: v for k, v in settings(args).items() if v is not None}
    text = dumps_toml(values, header="resolved")
    back = tomllib.loads(text)
    assert back == values
    assert set(back) <= set(FLAG_NAMES)


def test_lr_schedule_matches_nanochat():
    n = 7000  # paper D=12: constant through step 4200, then linear to 0
    assert lr_multiplier(0, n, 0.0, 0.4, 0.0) == 1.0
    assert lr_multiplier(4200, n, 0.0, 0.4, 0.0) == 1.0
    assert lr_multiplier(4201, n, 0.0, 0.4, 0.0) == pytest.approx(2799 / 2800)
    assert lr_multiplier(6999, n, 0.0, 0.4, 0.0) == pytest.approx(1 / 2800)
    assert lr_multiplier(6999, n, 0.0, 0.4, 0.1) == pytest.approx(1 / 2800 + (1 - 1 / 2800) * 0.1)
    assert lr_multiplier(4, 100, 0.1, 0.4, 0.0) == pytest.approx(0.5)  # warmup of 10 steps
    assert muon_momentum(0) == pytest.approx(0.85) and muon_momentum(150) == pytest.approx(0.90)
    assert muon_momentum(300) == muon_momentum(5000) == pytest.approx(0.95)
    assert muon_weight_decay(0, 100, 0.8) == 0.8 and muon_weight_decay(50, 100, 0.8) == pytest.approx(0.4)


def test_grad_accum_and_its_error():
    assert grad_accum_steps(524288, 32, 2048, 8) == 1
    assert grad_accum_steps(524288, 16, 2048, 1) == 16
    with pytest.raises(SystemExit) as e:
        grad_accum_steps(524288, 24, 2048, 1)
    msg = str(e.value)
    assert "--device-batch-size in" in msg and "16" in msg and "32" in msg and "--total-batch-size" in msg
    # the suggested total batch sizes are multiples of the per-step tokens
    assert "--total-batch-size 540672" in msg and "or 491520" in msg


def test_resume_refuses_changed_settings():
    saved = {"depth": 12, "hc": "kromhc", "eval_every": 250, "device_batch_size": 32}
    check_resume_settings(saved, dict(saved, eval_every=100, dist_timeout=60, save_on_signal="none"))
    with pytest.raises(SystemExit, match="hc: 'kromhc' -> 'mhc'"):
        check_resume_settings(saved, dict(saved, hc="mhc"))
    # the micro-batch only splits each step's rows: a run out of GPU memory continues at a smaller one
    check_resume_settings(saved, dict(saved, device_batch_size=16))


def test_a_stop_request_records_the_first_signal_and_notes_the_others(capfd):
    sigterm = signal.getsignal(signal.SIGTERM)  # whatever an earlier test or library installed
    stop = StopRequest("SIGUSR1,SIGUSR2")
    try:
        assert not stop.requested
        signal.raise_signal(signal.SIGUSR2)  # to this thread: handled before the next line
        signal.raise_signal(signal.SIGUSR1)
        assert stop.requested and stop.signal == "SIGUSR2"
        assert capfd.readouterr().out.splitlines() == [
            "SIGUSR2 received: finishing the step in flight, then saving a checkpoint",
            "SIGUSR1 received again: ignored, the checkpoint is being written"]
        assert signal.getsignal(signal.SIGTERM) is sigterm  # not asked for: left alone
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)


def test_save_on_signal_values():
    assert parse_args(["--save-on-signal", "term,SIGUSR1,TERM"]).save_on_signal == "SIGTERM,SIGUSR1"
    assert parse_args([]).save_on_signal == "SIGTERM,SIGUSR1" and parse_args([]).dist_timeout == 600
    assert parse_args(["--save-on-signal", "None"]).save_on_signal == "none"
    for bad in ("SIGKILL", "", "TERM,,USR3"):
        with pytest.raises(SystemExit):
            parse_args(["--save-on-signal", bad])


def test_clean_metrics_log_drops_replayed_and_torn_records(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "kind": "train"}) for s in range(6)]
    path.write_text("\n".join(lines) + '\n{"step": 6, "ki')
    clean_metrics_log(str(path), 4)
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [0, 1, 2, 3]


def tiny_model():
    return build_model(GPTConfig(sequence_len=16, vocab_size=100, n_layer=2, n_head=2, n_kv_head=2, n_embd=32), "cpu")


def test_checkpoint_latest_pointer_and_incomplete_steps(tmp_path):
    run = str(tmp_path / "run")
    model = tiny_model()
    meta = {"step": 3, "model_config": {"sequence_len": 16, "vocab_size": 100, "n_layer": 2, "n_head": 2,
                                        "n_kv_head": 2, "n_embd": 32}, "world_size": 2}
    ckpt.save_rank_files(run, 3, 0, {"opt": 1}, model_state=model.state_dict(), meta=meta)
    assert not ckpt.is_complete(run, 3)  # rank 1's optimizer shard is missing
    with pytest.raises(RuntimeError, match="incomplete"):
        ckpt.mark_latest(run, 3)
    ckpt.save_rank_files(run, 3, 1, {"opt": 2})
    ckpt.mark_latest(run, 3)
    assert ckpt.latest_step(run) == 3
    # a later step whose write was cut short (meta only) is ignored, `latest` stays
    with open(os.path.join(run, "meta_000005.json"), "w") as f:
        json.dump(dict(meta, step=5), f)
    assert ckpt.latest_step(run) == 3
    # a lost pointer falls back to the newest complete checkpoint
    os.remove(os.path.join(run, "latest"))
    assert ckpt.latest_step(run) == 3
    loaded, meta2 = ckpt.load_model(run, device="cpu")
    assert meta2["step"] == 3
    for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), k
    with pytest.raises(FileNotFoundError, match="complete"):
        ckpt.load_model(run, step=5)


def test_atomic_write_leaves_old_file_when_interrupted(tmp_path, monkeypatch):
    path = str(tmp_path / "f.txt")
    ckpt.atomic_write(path, "old")

    def boom(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        ckpt.atomic_write(path, "new")
    assert open(path).read() == "old"
    assert os.listdir(tmp_path) == ["f.txt"]  # no temporary file left behind


def test_rng_state_round_trip():
    state = ckpt.encode_rng_state()
    a = torch.rand(3)
    ckpt.restore_rng_state(state)
    assert torch.equal(torch.rand(3), a)


def test_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all("--" + name.replace("_", "-") in out for name in FLAG_NAMES)
