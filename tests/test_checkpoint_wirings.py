"""A checkpoint does not depend on which other wirings were registered when it trained: a run
records the frame's fields and its own wiring's (checkpoint.config_record, config.toml), an
old checkpoint holding other wirings' fields still loads, and one whose wiring this process has
not registered ends in one `error:` line naming the file to register. The two wirings of
tests/wirings/ stand for a user's: static_hc.py (registered for the whole suite, conftest.py)
and layerscale.py (registered here, beside it, in the commands these tests start)."""

import dataclasses
import json
import os
import sys
from pathlib import Path

import launch
import pytest

from nanochat import checkpoint_manager as ckpt
from nanochat import connections
from nanochat.gpt import GPTConfig, build_model
from test_train_e2e import REPO, TINY, base, env_for  # noqa: F401 (a fixture)

WIRINGS = Path(__file__).resolve().parent / "wirings"
STATIC, LAYERSCALE = str(WIRINGS / "static_hc.py"), str(WIRINGS / "layerscale.py")
SIZES = dict(sequence_len=16, vocab_size=64, n_layer=1, n_head=2, n_kv_head=2, n_embd=32)


def test_a_record_holds_the_frames_fields_and_its_own_wirings():
    record = ckpt.config_record(GPTConfig(**SIZES, hc="kromhc", hc_factors=[2, 2]))
    frame = {f.name for f in dataclasses.fields(GPTConfig)} - set(connections.variant_fields())
    assert set(record) == frame | set(connections.VARIANTS["kromhc"].FIELDS)
    assert record["hc_factors"] == [2, 2] and "dar_gate" not in record and "cmhc_beta" not in record


def test_an_old_record_with_the_fields_of_other_wirings_still_loads():
    """Written before config_record: every wiring registered then, one this process lacks too."""
    config = GPTConfig(**SIZES, hc="static_hc")
    model = build_model(config, "cpu")
    old = {**dataclasses.asdict(config), "layerscale_init": 0.1}
    loaded = ckpt.model_from_state(old, model.state_dict(), "cpu")
    assert loaded.config == config


def test_a_wiring_this_process_has_not_registered_is_one_error_line_naming_its_file():
    record = {**ckpt.config_record(GPTConfig(**SIZES, hc="prenorm")), "hc": "layerscale", "layerscale_init": 0.1}
    with pytest.raises(SystemExit) as e:
        ckpt.config_from_record(record, "run X", LAYERSCALE)
    assert e.value.code.startswith("error: run X holds a model of hc='layerscale'") and "\n" not in e.value.code
    assert f"NANOCHAT_WIRINGS={LAYERSCALE}" in e.value.code
    with pytest.raises(SystemExit, match="PATH/layerscale.py"):  # a record from before wiring_file
        ckpt.config_from_record(record, "run X")


@pytest.mark.slow
def test_a_run_of_one_outside_wiring_loads_without_the_other(base):  # noqa: F811
    """static HC trained with LayerScale registered beside it: its records leave layerscale_init
    out, hc_report reads it with static HC alone, and without static HC says which file to
    register (the export, base_eval and resume read the same records)."""
    both = dict(env_for(base), NANOCHAT_WIRINGS=os.pathsep.join([STATIC, LAYERSCALE]))
    train = launch.run([sys.executable, "-m", "scripts.base_train", *TINY, "--num-iterations", "2", "--model-tag",
                        "static", "--hc", "static_hc"], cwd=REPO, env=both, capture_output=True, text=True,
                       timeout=300)
    assert train.returncode == 0, train.stderr[-3000:]
    run = Path(base) / "runs" / "static"
    meta = ckpt.load_meta(str(run), 2)
    assert "layerscale_init" not in meta["model_config"] and "layerscale_init" not in meta["settings"]
    assert meta["wiring_file"] == STATIC and "layerscale_init" not in (run / "config.toml").read_text()
    assert "layerscale_init" not in json.loads((run / "summary.json").read_text())
    report = [sys.executable, "-m", "scripts.hc_report", "--checkpoint", str(run), "--random-tokens",
              "--device-type", "cpu", "--batch-size", "2"]
    alone = launch.run(report, cwd=REPO, env=dict(env_for(base), NANOCHAT_WIRINGS=STATIC), capture_output=True,
                       text=True, timeout=300)
    assert alone.returncode == 0 and "wrote" in alone.stdout, alone.stderr[-3000:]
    none = launch.run(report, cwd=REPO, env=dict(env_for(base), NANOCHAT_WIRINGS=""), capture_output=True,
                      text=True, timeout=300)
    assert none.returncode == 1 and "Traceback" not in none.stderr, none.stderr[-3000:]
    assert none.stderr.strip().splitlines() == [
        f"error: the checkpoint of step 2 in {run} holds a model of hc='static_hc', a wiring this process has not "
        f"registered: register its file, NANOCHAT_WIRINGS={STATIC} (docs/connections.md, 'A wiring outside the "
        "package')"]
