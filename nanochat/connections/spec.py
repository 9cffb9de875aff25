"""What a wiring declares about itself, so that the rest of the project (config, CLI, bench,
plan, hc_report, the report, the model card, the tests) derives from the registry instead
of naming variants.

Every variant module defines a module-level dict `SPEC` with these keys:

    label                   display name, as the wiring's paper names it
    description             one line: what the wiring does
    source                  where it comes from (an arXiv id, "nanochat" for the baseline)
    state                   "streams": n parallel streams, --hc-streams applies;
                            "single": one (B, T, C) state, n = 1
    has_h_res               layer.coefficients() gives an n x n H_res, so the Figure-2 and
                            doubly-stochastic diagnostics apply
    in_paper                a row of the KromHC paper's tables
    equals_prenorm_at_init  the model computes the plain pre-norm residual at init
    params                  cfg -> connection parameters of the whole model (int) for a
                            resolved GPTConfig (layers may differ in their counts)

and may add, with these defaults:

    beside_paper=False      shown with the paper's rows though not one of them (the project's
                            ablations of the family: hc, hc_identity); otherwise a variant
                            outside the paper goes to the report's "Beyond the paper"
    bench_layer=0           the layer the layer benchmark times and the one a "called alone"
                            check runs: a sub-layer index in [0, 2 * n_layer); block-level
                            wirings name a block end (1), where their work happens
    stream_flops=None       cfg -> training FLOPs per token of the stream work the FLOP
                            convention leaves out (hc_report's FLOP table), None: not sized
    stream_symbol="n"       what --hc-streams counts, as tables write it (frac: "m")
    baseline="residual"     the variant its runs are read against in the report's "Beyond the
                            paper" section (its nearest relative: go-mHC's is mHC)
    settings=None           cfg -> a short phrase on the variant's own settings (e.g. KromHC's
                            factors), for the training log, hc_report and the model card
    shared_fields=()        the frame's config fields (GPTConfig's hc_*, beside its own FIELDS)
                            that shape it, e.g. hc_streams, hc_norm_weight: with its FIELDS,
                            the settings the model card lists (own_settings)
    sublayer_prenorm=True   the model's branches norm their input, u -> F(norm(u)); False: the
                            wiring calls the raw sub-layer u -> F(u) and norms where its math
                            says (post-norm, ReZero)
    order=None              where tables, reports and the registry list it: by this number,
                            then by name; None: after every numbered one (the wirings so far
                            are numbered in tens, so a new one can sit between two)

and declares what it is, so that nothing reads "has n streams" as "is a HyperConnection":

    family=None             "hc": a member of the hyper-connection family (n streams under the
                            H-convention, `layer.coefficients(X) -> (h_pre, h_post, h_res)`);
                            the cost plan prices an unmeasured member from its measured
                            relatives. None: a family of its own
    kernel=None             "hyper_connection": its layers are hc_layer.HyperConnection (one
                            projection of the normed streams gives the sigmoid H_pre, H_post
                            and a res_maps.ResMap's H_res): the family's projection checks
                            (tests/test_connections.py), Liger's ops and the fused seams
                            compute exactly that. None: its layers are its own, run in PyTorch
    backends=("torch",)     the --hc-kernels backends it runs on ("liger" and "fused" need
                            kernel="hyper_connection"); "auto" picks among them, any other
                            is refused at configuration with one error line
    options=()              the frame's stream options it takes (OPTIONS: hc_expand,
                            hc_reduce and hc_recompute need state "streams", hc_pre
                            kernel="hyper_connection"); a non-default value of any other is
                            refused at configuration with one error line
    dead=None               cfg -> {parameter name: reason} of the connection parameters
                            the math leaves without a gradient for that config (a name may
                            end in "[a:b]", a slice of the first axis, or "[:, a:b]", of the
                            second); the gradient checks, the dead-connection warning and
                            hc_report name them rather than count them as learning
    parts=None              cfg -> [parameter name[slice], ...]: slices of its parameters
                            that are judged on their own (same forms as `dead`), so that a
                            dead slice of a live parameter shows (the HC layers: the pre,
                            post and res columns of each W, bias and alpha); the rest of
                            each parameter is judged whole
    backout=BACKOUT         what the 2026-07 trunk's backout subtracts for it (one phrase, for
                            docs/variants.md, hc_report and the model card): always the wiring's
                            own readout (`reduce`) of its state and carry after block floor(L/2),
                            which StreamConnections computes; the phrase says what that is here

Beside SPEC, a module may define `FIELDS = {name: default}` (its own config fields; they
become GPTConfig fields and base_train flags / TOML keys), `FIELD_HELP = {name: help}` (one
per field, required with FIELDS) and `FIELD_TYPES = {name: parser}` (an argparse type;
default: from the default's type), `init_sublayers(cfg, sublayers)`: the start values its
sub-layers need, set after the model's own init (the attention and MLP modules in branch
order; e.g. non-zero output projections where the wiring's own start would block every
gradient), and `pretraining_warning(cfg) -> str | None`: the one `warning:` line base_train
prints when a fresh run starts from a setting meant for something else (DAR's zero gate, a
start for converting a pretrained checkpoint).
"""

import math
from dataclasses import MISSING, dataclass, fields
from typing import Callable

STATES = ("streams", "single")
FAMILIES = ("hc",)
KERNELS = ("hyper_connection",)
BACKENDS = ("torch", "liger", "fused")
# The frame's stream options (GPTConfig fields), each with the value a wiring that does not
# take it must leave it at: the HC options' first choices and no recompute.
OPTIONS = {"hc_expand": "copy", "hc_reduce": "sum", "hc_pre": "current", "hc_recompute": False}
# The backout state of a wiring that does not say more (SPEC backout).
BACKOUT = "its readout of the state after block floor(L/2)"


@dataclass(frozen=True)
class Spec:
    name: str
    label: str
    description: str
    source: str
    state: str
    has_h_res: bool
    in_paper: bool
    equals_prenorm_at_init: bool
    params: Callable
    beside_paper: bool = False
    bench_layer: int = 0
    stream_flops: Callable | None = None
    stream_symbol: str = "n"
    baseline: str = "residual"
    settings: Callable | None = None
    shared_fields: tuple = ()
    sublayer_prenorm: bool = True
    order: float | None = None
    family: str | None = None
    kernel: str | None = None
    backends: tuple = ("torch",)
    options: tuple = ()
    dead: Callable | None = None
    parts: Callable | None = None
    backout: str = BACKOUT

    @property
    def streams(self):
        return self.state == "streams"

    def takes(self, backend):
        """Whether it runs on --hc-kernels `backend` ("auto" always: it picks among its own)."""
        return backend == "auto" or backend in self.backends

    def dead_parameters(self, cfg):
        """{parameter name: reason} the math leaves without a gradient under `cfg` (SPEC dead)."""
        return dict(self.dead(cfg)) if self.dead is not None else {}

    def judged_parts(self, cfg):
        """[parameter name[slice], ...] judged on their own under `cfg` (SPEC parts)."""
        return list(self.parts(cfg)) if self.parts is not None else []

    @property
    def beyond_paper(self):
        return not (self.in_paper or self.beside_paper)


REQUIRED = tuple(f.name for f in fields(Spec) if f.default is MISSING and f.name != "name")
OPTIONAL = tuple(f.name for f in fields(Spec) if f.name not in REQUIRED and f.name != "name")


def listed_order(name, module):
    """The sort key of a wiring in the registry: its SPEC `order` (unnumbered last), then its name."""
    order = getattr(module, "SPEC", {}).get("order")
    return (math.inf if order is None else order, name)


class SpecError(ValueError):
    """A variant module that does not declare what the project needs of it."""


def spec_of(name, module):
    """The Spec of variant `name` from its module's SPEC dict; SpecError naming what is missing."""
    where = f"variant {name!r}" + (f" (module {module.__name__})" if hasattr(module, "__name__") else "")
    raw = getattr(module, "SPEC", None)
    if not isinstance(raw, dict):
        raise SpecError(f"{where} defines no SPEC dict; declare {', '.join(REQUIRED)} "
                        "(see docs/connections.md, 'Adding a wiring')")
    missing = [k for k in REQUIRED if k not in raw]
    if missing:
        raise SpecError(f"{where}: SPEC lacks {', '.join(missing)} (see docs/connections.md, 'Adding a wiring')")
    unknown = sorted(set(raw) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise SpecError(f"{where}: SPEC has unknown key(s) {', '.join(unknown)}; known: "
                        f"{', '.join(REQUIRED + OPTIONAL)}")
    if raw["state"] not in STATES:
        raise SpecError(f"{where}: SPEC state={raw['state']!r}; choose one of {', '.join(STATES)}")
    if raw.get("order") is not None and (isinstance(raw["order"], bool) or not isinstance(raw["order"], (int, float))):
        raise SpecError(f"{where}: SPEC order={raw['order']!r} must be a number (where tables list it)")
    if not isinstance(raw.get("sublayer_prenorm", True), bool):
        raise SpecError(f"{where}: SPEC sublayer_prenorm={raw['sublayer_prenorm']!r} must be True or False")
    if not callable(raw["params"]):
        raise SpecError(f"{where}: SPEC params must be a function of the config (cfg -> int)")
    check_declaration(where, raw)
    for hook in ("resolve", "make_layers"):
        if not callable(getattr(module, hook, None)):
            raise SpecError(f"{where} defines no {hook}(cfg) (see docs/connections.md, 'Adding a wiring')")
    if hasattr(module, "init_sublayers") and not callable(module.init_sublayers):
        raise SpecError(f"{where}: init_sublayers must be a function (cfg, sublayers) -> None")
    if hasattr(module, "pretraining_warning") and not callable(module.pretraining_warning):
        raise SpecError(f"{where}: pretraining_warning must be a function cfg -> a warning line or None")
    own = getattr(module, "FIELDS", {})
    helps = getattr(module, "FIELD_HELP", {})
    undocumented = [f for f in own if f not in helps]
    if undocumented:
        raise SpecError(f"{where}: FIELD_HELP has no help for {', '.join(undocumented)}")
    return Spec(name=name, **{**raw, "backends": tuple(raw.get("backends", ("torch",))),
                              "options": tuple(raw.get("options", ()))})


def check_declaration(where, raw):
    """SpecError unless the wiring's family, kernel, backends and options are known and agree."""
    state, kernel = raw["state"], raw.get("kernel")
    if raw.get("family") not in (None, *FAMILIES):
        raise SpecError(f"{where}: SPEC family={raw['family']!r}; choose None or one of {', '.join(FAMILIES)}")
    if raw.get("family") == "hc" and (state != "streams" or not raw["has_h_res"]):
        raise SpecError(f"{where}: SPEC family='hc' needs state='streams' and has_h_res=True (the H-convention)")
    if kernel not in (None, *KERNELS):
        raise SpecError(f"{where}: SPEC kernel={kernel!r}; choose None or one of {', '.join(KERNELS)}")
    if kernel and raw.get("family") != "hc":
        raise SpecError(f"{where}: SPEC kernel={kernel!r} is the HC family's layer; declare family='hc'")
    backends, options = raw.get("backends", ("torch",)), raw.get("options", ())
    if isinstance(backends, str) or not set(backends) <= set(BACKENDS) or "torch" not in backends:
        raise SpecError(f"{where}: SPEC backends={backends!r} must list some of {', '.join(BACKENDS)}, torch "
                        "included (the reference every backend is checked against)")
    kernel_backends = sorted(set(backends) - {"torch"})
    if kernel_backends and kernel != "hyper_connection":
        raise SpecError(f"{where}: SPEC backends {', '.join(kernel_backends)} compute hc.HyperConnection layers; "
                        "declare kernel='hyper_connection' (its layers then must be HyperConnections) or drop them")
    if isinstance(options, str) or not set(options) <= set(OPTIONS):
        raise SpecError(f"{where}: SPEC options={options!r} must list some of {', '.join(OPTIONS)}")
    if options and state != "streams":
        raise SpecError(f"{where}: SPEC options {', '.join(options)} act on n streams; state={state!r} takes none")
    if "hc_pre" in options and kernel != "hyper_connection":
        raise SpecError(f"{where}: SPEC option hc_pre (delayed pre-weights) carries hc.HyperConnection's "
                        "projected pre-weights; declare kernel='hyper_connection' or drop it")
    if not isinstance(raw.get("backout", BACKOUT), str) or not raw.get("backout", BACKOUT).strip():
        raise SpecError(f"{where}: SPEC backout must be a phrase naming the state the 2026-07 trunk's backout "
                        "subtracts (its readout after block floor(L/2))")
    if raw.get("dead") is not None and not callable(raw["dead"]):
        raise SpecError(f"{where}: SPEC dead must be a function cfg -> {{parameter name: reason}}")
    if raw.get("parts") is not None and not callable(raw["parts"]):
        raise SpecError(f"{where}: SPEC parts must be a function cfg -> [parameter name[slice], ...]")
