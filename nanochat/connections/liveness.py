"""Which connection parameters learn: a gradient well above rounding, one rule for the tests,
base_train's dead-connection warning and hc_report.

Why a rule and not "any gradient above 0". A parameter the math leaves without a gradient
still gets one from rounding. Under copy expansion layer 0 of the HC family reads n copies of
x0, so its H_pre only scales x0, which the sub-layer's RMSNorm undoes: its gradient is
(1e-11 .. 1e-9) in fp32 where the layer's others are ~1e-3, and 1e-19 in fp64. "Above 0"
counts it as learning; so did every check before this one.

The rule. A gradient g is *live* when

    ||g|| > factor * eps(dtype) * scale

with eps the unit roundoff of the dtype the gradient was accumulated in (fp32 for the fp32
connection parameters, also under bf16 autocast), at two scales:

- a part of a wiring (a parameter, or a declared slice of one: SPEC parts and dead): `scale`
  is the gradient norm of the wiring's connection parameters together, factor PART_FACTOR =
  64. Rounding makes an error of about eps times the size of the terms a gradient sums, which
  are of the order of the live gradients around it. Measured in fp32 on the tiny models of
  tests/wiring_checks.py (every wiring, body and connections moved off their init, each
  parameter judged whole): the dead parts at most 2.4e-7 of the scale (KromHC's layer-0 res
  columns), every other part at least 2.3e-4 (hc_identity's); the line, 64 eps = 7.6e-6, sits
  30x from both. Judged by slice, fp32 is too coarse: KromHC's a_res of layer 1 gets 5e-6 of
  the scale, below that line, while its last layer's res slices are rounding. The checks that
  judge slices (tests/wiring_checks.py, hc_report --checkpoint) therefore run in fp64: dead
  parts at most 9.2e-16 of the scale (mHC-lite's last b_res), live ones at least 4.4e-6
  (C-mHC's a_res of layer 1), every wiring and option; the line, 64 eps = 1.4e-14, sits 15x
  above the first and eight orders below the second.
- the wiring as a whole (base_train's warning, hc_report's first line): `scale` is the whole
  model's gradient norm, factor WIRING_FACTOR = 1. A wiring's own norm cannot be its scale
  when all of it is rounding; the model's gradient sums terms of the same streams. Measured
  after one update at nanochat's zero output projections: DAR's zero gate over the full
  sources 5.5e-10 of the model's norm (its uniform read of sources that sum to h only scales
  h, which the norm undoes: a saddle), hc_identity 3.7e-6 (in step 1 of a tiny base_train
  run, whose LR the small batch scales down: its branches have barely left zero); the line,
  one eps = 1.2e-7, sits 30x from both. A wiring below the line after one update is at a
  saddle or slow to start (DAR's default gate 5.9e-9 in that tiny run, 1e-6 five steps
  later): nanochat/saddle.py tells which, with the body moved off its init.

Under bf16 autocast the activations round at 2^-8: the rule, at fp32's eps, then tells
exactly-zero and fp32-level gradients apart from real ones, not bf16-level noise.

Parameters the math makes dead are declared by their wiring (SPEC `dead`: name -> reason, a
name optionally ending in a slice of its first or second axis, "[a:b]" or "[:, a:b]"); the
checks then require them dead and everything else live, and hc_report names them.
"""

import re

import torch

PART_FACTOR = 64
WIRING_FACTOR = 1
SLICE = re.compile(r"^(?P<name>[\w.]+)(\[(?P<all>:, )?(?P<start>\d+):(?P<stop>\d+)\])?$")


def threshold(scale, factor=PART_FACTOR, dtype=torch.float32):
    """The norm a gradient must exceed to be live, for a scale and an accumulation dtype."""
    return factor * torch.finfo(dtype).eps * scale


def live(norm, scale, factor=PART_FACTOR, dtype=torch.float32):
    """Whether a gradient of norm `norm` is live against `scale` (see the module docstring)."""
    return norm > threshold(scale, factor, dtype)


def parse(entry):
    """(parameter name, axis, slice) of a declared entry (a dead part, a part judged on its own):
    axis None for the whole tensor."""
    m = SLICE.match(entry)
    if not m:
        raise ValueError(f"parameter part {entry!r}: write NAME, NAME[a:b] or NAME[:, a:b]")
    if m["start"] is None:
        return m["name"], None, None
    return m["name"], 1 if m["all"] else 0, slice(int(m["start"]), int(m["stop"]))


def masks(grads, entries):
    """{parameter name: bool mask of the entries' elements} for the named parameters;
    ValueError for a name the wiring does not have (a stale declaration)."""
    out = {}
    for entry in entries:
        name, axis, where = parse(entry)
        if name not in grads:
            raise ValueError(f"parameter {entry!r} is not a connection parameter of this model")
        mask = out.setdefault(name, torch.zeros(grads[name].shape, dtype=torch.bool))
        if axis is None:
            mask.fill_(True)
        else:
            mask.narrow(axis, where.start, where.stop - where.start).fill_(True)
    return out


def report(grads, declared, parts=(), dtype=torch.float32):
    """One row per part of the connection parameters: dict(name, part ("live" | "declared
    dead"), norm, scale, live, reason). The parts are the wiring's declared slices (`parts`,
    Spec.parts: e.g. the pre, post and res columns of each HC layer's W), each judged on its
    own, so that a dead slice inside a live parameter shows; the declared dead entries
    (`declared`: {entry: reason}, Spec.dead_parameters); and what is left of each parameter.
    A live part's norm leaves out its declared dead elements. `grads`: {name: gradient or
    None}; `dtype`: the dtype the gradients were accumulated in (its roundoff sets the line)."""
    flat = {name: (torch.zeros(()) if g is None else g.detach().double().cpu()) for name, g in grads.items()}
    dead = masks(flat, declared)
    covered = masks(flat, [*declared, *parts])
    scale = sum(float(g.square().sum()) for g in flat.values()) ** 0.5
    nothing = lambda name: torch.zeros(flat[name].shape, dtype=torch.bool)

    def row(name, mask, part, reason=None):
        norm = float(flat[mask[0]][mask[1]].norm())
        return dict(name=name, part=part, norm=norm, scale=scale, live=live(norm, scale, dtype=dtype), reason=reason)

    rows = []
    for entry in parts:
        if entry in declared:
            continue
        name = parse(entry)[0]
        keep = masks(flat, [entry])[name] & ~dead.get(name, nothing(name))
        if keep.any():
            rows.append(row(entry, (name, keep), "live"))
    for name in flat:
        rest = ~covered.get(name, nothing(name))
        if rest.any():
            rows.append(row(name, (name, rest), "live"))
    for entry, reason in declared.items():
        name = parse(entry)[0]
        rows.append(row(entry, (name, masks(flat, [entry])[name]), "declared dead", reason))
    return rows


def surprises(rows):
    """The rows that contradict the declaration: a parameter meant to learn whose gradient is
    rounding, or a declared dead one that learns."""
    return [r for r in rows if r["live"] != (r["part"] == "live")]


def wiring_is_dead(connection_norm, total_norm, dtype=torch.float32):
    """The rule for the wiring as a whole: its connection gradient's norm (None: it has no
    parameter) within WIRING_FACTOR roundoffs of the whole model's."""
    return connection_norm is not None and not live(connection_norm, total_norm, WIRING_FACTOR, dtype)
