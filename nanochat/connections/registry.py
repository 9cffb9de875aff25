"""The registry of the wirings: discovery, the queries the rest of the project asks it, and
the resolution of a config's hc fields into a built `StreamConnections` (streams.py).

Discovery. Every module of the package `nanochat.connections` that assigns `SPEC` at its top
level is a wiring, registered under its file name (`discover`: a new wiring is a new file and
nothing else); a file outside the package registers through NANOCHAT_WIRINGS (below). It runs
once, when the package is imported: its `__init__` imports this module after the names a
wiring imports from it (the layer bases, the one-state check, the step helpers), so that the
wirings it imports here find them.

What a wiring module provides. `SPEC` (spec.py: display name, source, state, parameter count,
where tables list it, and what it is: its family, its layers' kernel kind, the backends and
stream options it takes, the parameters its math leaves dead), `resolve(cfg)` (validate and
fill its config fields in place) and `make_layers(cfg)` (the 2 * n_layer layers); optionally
`param_groups(layers, lrs)`, `make_expand(cfg)` and `make_reduce(cfg)` (when its state is not
n copies of x0 folded by the frame's reduce: frame.py), `init_sublayers(cfg, sublayers)`
(start values of its own for the sub-layers, set after the model's init), `FIELDS` /
`FIELD_HELP` / `FIELD_TYPES` (its own config fields, which become GPTConfig fields and
base_train flags, and which every other variant refuses to see changed) and
`pretraining_warning(cfg)` (a line for a fresh run from a start meant for something else).
docs/connections.md, "The variant contract", says each in full.

Everything else (bench, plan, hc_report, the report, the model card, the tests' lists) reads
the registry through `specs()`: which backend or option a wiring takes comes from its
declaration, never from its state.
"""

import copy
import importlib
import importlib.util
import math
import os
import pkgutil
import re
import sys
import types

import torch

from nanochat.connections import frame
from nanochat.connections.backends import ops
from nanochat.connections.hc_layer import PRES, HyperConnection
from nanochat.connections.spec import OPTIONS, SpecError, listed_order, spec_of
from nanochat.connections.streams import StreamConnections


def discover():
    """{name: module} of the wirings: the modules of the package that declare a SPEC dict,
    each under its file name, in the order tables list them (SPEC `order`, then the name).
    Found by listing the package, so that a new wiring is a new file and nothing else. An
    exported model's flat copy of this file (connections_registry.py) belongs to no such
    package: its assembler (nanochat/interop/hf/assemble.py) imports the wiring modules above
    this point as plain imports, and they are taken from this module's names."""
    if __name__ == f"{__package__}.registry":
        package = sys.modules[__package__]
        # Only the files that assign SPEC are imported: the others need not be importable here
        # (fused_kernels.py imports Triton, an optional extra).
        modules = {info.name: importlib.import_module(f"{__package__}.{info.name}")
                   for info in pkgutil.iter_modules(package.__path__) if _declares_spec(info)}
    else:
        modules = {name: value for name, value in globals().items() if isinstance(value, types.ModuleType)}
    wirings = {name: module for name, module in modules.items() if isinstance(getattr(module, "SPEC", None), dict)}
    for name, module in external_wirings().items():
        if name in wirings:
            raise SystemExit(f"error: {EXTERNAL}: {module.__file__} would register hc={name!r}, which the "
                             "package already has; rename the file")
        wirings[name] = module
    return dict(sorted(wirings.items(), key=lambda item: listed_order(*item)))


# Wirings kept outside the package (an experiment's, or the test suite's: tests/wirings/): the
# .py files this variable names, os.pathsep-separated, each registered under its file name.
# Read once, when the package is imported, so that their FIELDS become GPTConfig fields like
# the package's own; a subprocess inherits it.
EXTERNAL = "NANOCHAT_WIRINGS"


def external_wirings():
    """{name: module} of the files NANOCHAT_WIRINGS names (see above). A path that is not a
    wiring file ends the process with one `error:` line: it is read on import, before any
    command's own error handling, and nothing can run with the registry it meant."""
    found = {}
    for path in filter(None, os.environ.get(EXTERNAL, "").split(os.pathsep)):
        name = os.path.splitext(os.path.basename(path))[0]
        if not path.endswith(".py") or not os.path.isfile(path):
            raise SystemExit(f"error: {EXTERNAL} names {path!r}, which is not a .py file; give the path of a "
                             "wiring module (docs/connections.md, 'A wiring outside the package')")
        module_spec = importlib.util.spec_from_file_location(f"nanochat_wirings.{name}", path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module
        module_spec.loader.exec_module(module)
        if not isinstance(getattr(module, "SPEC", None), dict):
            raise SystemExit(f"error: {EXTERNAL}: {path} defines no SPEC dict (docs/connections.md, 'Adding a "
                             "wiring')")
        found[name] = module
    return found


def in_package(name):
    """Whether a wiring is one of the package's own (not registered from outside it: the test
    suite's, an experiment's), which is what the project's configs, README and export cover."""
    return getattr(VARIANTS.get(name), "__name__", "").startswith(f"{__package__}.")


def _declares_spec(info):
    """Whether a module of the package (a pkgutil ModuleInfo) assigns SPEC at its top level (a
    subpackage, the stream backends', holds no wiring)."""
    if info.ispkg:
        return False
    with open(os.path.join(info.module_finder.path, f"{info.name}.py")) as f:
        return re.search(r"^SPEC\s*=", f.read(), re.MULTILINE) is not None


# name -> module declaring SPEC and exposing `resolve(cfg)`, `make_layers(cfg)` and the
# optional hooks above; the order is the one tables and reports list the variants in.
VARIANTS = discover()
# The options of the HC family (frame.py, hc_layer.py), their choices and their defaults (what a
# config or checkpoint that predates them ran).
HC_OPTIONS = {"hc_expand": frame.EXPANDS, "hc_reduce": frame.REDUCES, "hc_pre": PRES}


def spec(name):
    """The Spec of a registered variant (spec.py); ValueError for an unknown name, SpecError
    for a module that does not declare what the project needs."""
    if name not in VARIANTS:
        raise ValueError(f"unknown connection variant hc={name!r}; choose one of {', '.join(VARIANTS)}")
    return spec_of(name, VARIANTS[name])


def specs(**where):
    """{name: Spec} of every registered variant in registry order, those whose Spec
    attributes equal `where` (e.g. state="streams", has_h_res=True)."""
    found = {name: spec(name) for name in VARIANTS}
    return {name: s for name, s in found.items() if all(getattr(s, k) == v for k, v in where.items())}


def runs_on(name, backend):
    """Whether a wiring runs on --hc-kernels `backend` (its SPEC backends; "auto": always)."""
    return spec(name).takes(backend)


def takes_option(name, option):
    """Whether a wiring takes the frame's stream option `option` (its SPEC options)."""
    return option in spec(name).options


def hyper_connection_layers(name):
    """Whether a wiring's layers are hc_layer.HyperConnection (SPEC kernel "hyper_connection"): the
    family's projection checks, Liger's ops and the fused seams compute them."""
    return spec(name).kernel == "hyper_connection"


def label(name):
    """A variant's display name; the name itself for one this version does not know (an old run's)."""
    return spec(name).label if name in VARIANTS else name


def pretraining_warning(cfg):
    """The warning line a fresh training run of this config prints, or None (its module's
    optional `pretraining_warning(cfg)`: a setting meant for something else than pre-training)."""
    hook = getattr(VARIANTS[cfg.hc], "pretraining_warning", None)
    return hook(cfg) if hook is not None else None


def own_settings(cfg):
    """{field: value} of the settings that shape the config's wiring: the frame's fields it
    declares (SPEC shared_fields), then its module's own FIELDS."""
    names = [*spec(cfg.hc).shared_fields, *getattr(VARIANTS[cfg.hc], "FIELDS", {})]
    return {name: getattr(cfg, name) for name in names}


def other_fields(name):
    """The own config fields (FIELDS) of every registered wiring but `name` (a module registered
    under two names counts as one): what a run of `name` leaves out of its records, since its
    wiring never reads them (and they sit at their defaults: resolve_fields)."""
    return {field for field, (*_, owner) in variant_fields().items() if VARIANTS[owner] is not VARIANTS.get(name)}


def wiring_file(name):
    """The file that defines wiring `name` (what a process must register to load its runs)."""
    return getattr(VARIANTS[name], "__file__", None)


def variant_fields():
    """{field: (default, help, parser or None, variant)} of every variant's own config
    fields, in registry order (a module registered under two names counts once)."""
    out, seen = {}, set()
    for name, module in VARIANTS.items():
        if id(module) in seen:
            continue
        seen.add(id(module))
        helps, types = getattr(module, "FIELD_HELP", {}), getattr(module, "FIELD_TYPES", {})
        for field, default in getattr(module, "FIELDS", {}).items():
            if field in out:
                raise SpecError(f"config field {field!r} is declared by both hc={out[field][3]!r} and hc={name!r}")
            if field not in helps:
                raise SpecError(f"variant {name!r}: FIELD_HELP has no help for {field}")
            out[field] = (default, helps[field], types.get(field), name)
    return out


def resolve_fields(cfg):
    """A variant's own fields (its module's FIELDS) keep their defaults under every other
    variant; a list field given as a tuple (or None: unset) is made the list it stands for."""
    for name, module in VARIANTS.items():
        for field, default in getattr(module, "FIELDS", {}).items():
            if isinstance(default, list):
                setattr(cfg, field, list(getattr(cfg, field) or []))
            if module is not VARIANTS[cfg.hc] and getattr(cfg, field) != default:
                raise ValueError(f"{field}={getattr(cfg, field)!r} only applies to hc={name!r} (got hc={cfg.hc!r}); "
                                 "drop it")


def resolve_options(cfg):
    """The frame's stream options: valid choices, only for a wiring whose SPEC `options`
    declares them, and not in conflict."""
    for name, choices in HC_OPTIONS.items():
        if getattr(cfg, name) not in choices:
            raise ValueError(f"unknown {name}={getattr(cfg, name)!r}; choose one of {', '.join(choices)}")
    declared = spec(cfg.hc)
    refused = [f"{name}={getattr(cfg, name)!r}" for name, default in OPTIONS.items()
               if getattr(cfg, name) != default and name not in declared.options]
    if refused:
        takes = (f"it takes {', '.join(declared.options)} only" if declared.options
                 else "it takes none of the stream options")
        raise ValueError(f"{', '.join(refused)} does not apply to hc={cfg.hc!r} ({takes}: SPEC options); drop it"
                         + ("" if declared.options else " or pick a variant such as --hc kromhc"))
    if cfg.hc_reduce == "learned" and cfg.hc_pre == "delayed":
        raise ValueError("hc_reduce='learned' and hc_pre='delayed' both fold the final state: with delayed "
                         "pre-weights the last layer's pre-weights do it (DeepSeek-V4.1 has no separate head); "
                         "choose one")
    if not isinstance(cfg.hc_lss_init, (int, float)) or not math.isfinite(cfg.hc_lss_init):
        raise ValueError(f"hc_lss_init={cfg.hc_lss_init!r} must be a finite number (the source's: {frame.LSS_INIT})")


def resolve_backend(cfg):
    """hc_kernels: a known backend, one the wiring's SPEC `backends` declares ("auto" always:
    it picks among them), and installed (the declaration first: a wiring that cannot run a
    backend is not helped by installing it)."""
    declared = spec(cfg.hc)
    if cfg.hc_kernels in ops.KERNELS and not declared.takes(cfg.hc_kernels):
        why = ("its layers are not the hc.HyperConnection that Liger's and the fused kernels compute; "
               if declared.kernel != "hyper_connection" else "")
        raise ValueError(f"hc_kernels={cfg.hc_kernels!r} does not run hc={cfg.hc!r} ({why}SPEC backends: "
                         f"{', '.join(declared.backends)}); use hc_kernels='torch' or 'auto'")
    if cfg.hc_stream_checkpoint != 1 and not declared.takes("fused"):
        raise ValueError(f"hc_stream_checkpoint={cfg.hc_stream_checkpoint!r} recomputes the streams between fused "
                         f"seams, which hc={cfg.hc!r} does not run (SPEC backends: {', '.join(declared.backends)}); "
                         "drop it")
    ops.resolve_kernels(cfg)


def resolve_config(cfg):
    """Validate the config's hc fields and fill variant defaults, in place; one clear
    ValueError per mistake, raised at configuration time rather than mid-forward."""
    spec(cfg.hc)
    resolve_fields(cfg)
    VARIANTS[cfg.hc].resolve(cfg)
    resolve_options(cfg)
    resolve_backend(cfg)


def build(cfg):
    resolve_config(cfg)
    variant = VARIANTS[cfg.hc]
    expand = getattr(variant, "make_expand", frame.make_expand)(cfg)
    reduce = getattr(variant, "make_reduce", frame.make_reduce)(cfg)
    init = getattr(variant, "init_sublayers", None)
    layers = variant.make_layers(cfg)
    check_layers(cfg.hc, layers)
    kernels = cfg.hc_kernels if hyper_connection_layers(cfg.hc) else "torch"
    return StreamConnections(cfg.hc_streams, layers, expand, reduce,
                             getattr(variant, "param_groups", None), spec(cfg.hc).sublayer_prenorm,
                             None if init is None else lambda sublayers: init(cfg, sublayers), kernels,
                             cfg.hc_stream_checkpoint, "onepass" if cfg.hc_seam == "auto" else cfg.hc_seam)


def check_layers(name, layers):
    """A wiring that declares kernel="hyper_connection" builds hc_layer.HyperConnection layers: the
    backends it declares then read their projection and H_res map. SpecError otherwise, at
    build time, rather than an AttributeError inside a kernel."""
    if hyper_connection_layers(name):
        odd = sorted({type(layer).__name__ for layer in layers if not isinstance(layer, HyperConnection)})
        if odd:
            raise SpecError(f"variant {name!r} declares kernel='hyper_connection' but builds {', '.join(odd)} "
                            "layers, not hc.HyperConnection; declare kernel=None (and backends=('torch',))")


def seed_free_init(cfg):
    """{name: tensor} of the connection parameters whose start does not depend on the seed
    (equal under two seeds; a random projection's is left out), as build(cfg) and
    init_weights() give them."""
    starts = []
    for seed in (1, 2):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            conn = build(copy.deepcopy(cfg))
            conn.init_weights()
        starts.append(dict(conn.named_parameters()))
    return {name: p.detach() for name, p in starts[0].items() if torch.equal(p, starts[1][name])}


def sits_at_init(conn, cfg):
    """Whether a model's connections (`conn`, a StreamConnections of config `cfg`) hold
    exactly their start: every parameter whose start does not depend on the seed equals it.
    Those with a random start are not compared (their start is the training run's RNG's):
    a connection that learned moves its seed-free ones too (biases, scales, gates), since
    an exactly zero gradient leaves AdamW's update at zero. None when it has no such
    parameter (e.g. none at all)."""
    start = seed_free_init(cfg)
    if not start:
        return None
    params = dict(conn.named_parameters())
    return all(torch.equal(params[name].detach().to(p.dtype).cpu(), p) for name, p in start.items())
