"""Whether a wiring's configured start is a saddle: a start from which its parameters get no
gradient above rounding even once the rest of the model has moved.

At init nanochat zeroes both output projections, so in the first steps many wirings get
little or no gradient (no branch output yet): that is a slow start, which the first updates
of the body end. A saddle is the wiring's own doing: its start makes the loss flat in every
one of its parameters whatever the body holds (DAR with full sources, zero queries and the
zero gate: each read is h / N and the gated sum only rescales h, which the sub-layer's norm
undoes). From a saddle the wiring leaves only when AdamW's eps turns rounding into steps, in a
direction the hardware's rounding picks.

The probe tells the two apart on a copy of the wiring at a small width: the same connection
fields (streams, options, the wiring's own fields, depth and trunk), the body (embeddings,
sub-layers, head, the trunk's scalars) moved off its init by BODY_MOVE * N(0, 1) and the
connections at their init, one fp32 backward on random tokens on the CPU. The wiring's
gradient is then judged against the model's by liveness.py's rule for a wiring as a whole
(one fp32 roundoff of the model's gradient norm, 1.2e-7 of it). Measured at the shipped
configs' starts: every wiring at least 7e-3 of the model's gradient; DAR's zero gate over the
full sources 2e-9.
base_train asks it when a run's wiring gets rounding alone after the first update;
tests/test_saddle.py asks it of every shipped config.
"""

import dataclasses

import torch

from nanochat.connections import liveness
from nanochat.gpt import build_model

BODY_MOVE = 0.05
# The probe's model: the connection fields as configured, the body small (2 heads, 16
# positions, a 64-token vocabulary), the stream ops and attention in plain PyTorch; the width
# the first of WIDTHS that the wiring's fields divide (MHAR's heads, Frac's fractions), else
# the configured one.
PROBE_SHAPE = dict(sequence_len=16, vocab_size=64, n_head=2, n_kv_head=2, hc_kernels="torch", attention="sdpa",
                   hc_stream_checkpoint=1, hc_seam="auto")
WIDTHS = (64, 96, 192)


def probe_config(config):
    """The probe's model config: `config`'s wiring and depth at PROBE_SHAPE's size."""
    for width in WIDTHS:
        try:
            return dataclasses.replace(config, **PROBE_SHAPE, n_embd=width)
        except ValueError:
            continue
    return dataclasses.replace(config, **PROBE_SHAPE)


def probe(config, seed=0):
    """(the wiring's gradient norm or None when it has no parameter, the model's gradient norm)
    at the wiring's configured start with the body moved off its init (see the module docstring)."""
    cfg = probe_config(config)
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)  # the CPU's alone: a CUDA run's RNG stays its own
        model = build_model(cfg, "cpu").float()  # the 2026-07 trunk may keep its tables in bf16
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if not name.startswith("connections."):
                    p.add_(BODY_MOVE * torch.randn(p.shape, generator=g))
        idx = torch.randint(0, cfg.vocab_size, (2, cfg.sequence_len + 1), generator=g)
        model(idx[:, :-1], idx[:, 1:]).backward()
    norm = lambda params: sum(float(p.grad.double().square().sum()) for p in params if p.grad is not None) ** 0.5
    own = list(model.connections.parameters())
    return (norm(own) if own else None), norm(model.parameters())


def is_saddle(config, seed=0):
    """Whether the wiring of `config` starts at a saddle (its gradient at the probe is rounding)."""
    return liveness.wiring_is_dead(*probe(config, seed))
