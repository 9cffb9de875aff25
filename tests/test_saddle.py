"""Every shipped config's wiring learns from its configured start (nanochat/saddle.py): with the
body moved off its init and the connections at theirs, the wiring's gradient is above rounding
against the model's. DAR's zero gate over the full sources, d12_dar's start before its gate
became the sources' pre-training default, is the saddle the check exists for."""

from pathlib import Path

import pytest

from nanochat import saddle
from nanochat.connections import liveness
from nanochat.train_config import model_config_for, parse_args

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs").rglob("*.toml"))


def configured(path, *flags):
    return model_config_for(parse_args(["--config", str(path), *flags]), 32768)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_shipped_config_starts_off_a_saddle(path):
    config = configured(path)
    own, total = saddle.probe(config)
    assert own is None or not liveness.wiring_is_dead(own, total), \
        f"{path.name}: hc={config.hc!r} gets {own / total:.1e} of the model's gradient at its start"


def test_the_probe_finds_dar_s_zero_gate_over_the_full_sources_a_saddle():
    """The old d12_dar start: 1e-9 of the model's gradient where every shipped start has 7e-3 or
    more; the block sources with the same gate learn (the read is not a scaled h there)."""
    path = next(p for p in CONFIGS if p.name == "d12_dar.toml")
    own, total = saddle.probe(configured(path, "--dar-gate", "zero"))
    assert own / total < 1e-8
    assert saddle.is_saddle(configured(path, "--dar-gate", "zero"))
    assert not saddle.is_saddle(configured(path, "--dar-gate", "zero", "--dar-source", "block"))
    assert not saddle.is_saddle(configured(path))


def test_the_probe_keeps_the_wiring_and_shrinks_the_body():
    config = configured(next(p for p in CONFIGS if p.name == "d12_mhar.toml"))
    small = saddle.probe_config(config)
    assert (small.hc, small.mhar_heads, small.n_layer, small.trunk) == (config.hc, config.mhar_heads, 12, config.trunk)
    assert small.n_embd == 96 and small.vocab_size == 64 and small.hc_kernels == "torch"  # 6 heads divide 96, not 64
