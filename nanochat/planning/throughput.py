"""The tokens/s a planned run is priced at: measured, a measured relative's, or assumed.

The cost of a run is its training tokens over a throughput, the first of:
Only measurements on the device the plan is for price it: the GPU --gpu-name names (or any
GPU where it names none), or the CPU for the offline demo (`measured_from_runs`,
`read_gpu_check`).
1. its own measurement (the same variant, depth, n and --hc-kernels backend): from finished run
   directories (summary.json's median tokens/s, per GPU), a `gpu_check.json` (schema in
   `read_gpu_check`), or the measurement committed as docs/gpu_check.json where the plan is for
   the GPU that made it (`committed_measurement`; nanochat.gpus.same_gpu takes the README's
   short names, "H200", "A100 40GB"), in that order;
2. a measured relative's (marked "≈ ... from <relative>"): the same wiring at another depth or n,
   or another member of its SPEC family (`family_of`: the HC members share the stream passes
   that residual's single state does without), on the same backend; the same depth first, from
   another depth scaled by the run's FLOPs per token there over here, from another n as measured
   (and said so: the stream passes' bytes grow with n; `relative_throughput`);
3. with no relative measured, another variant's measurement at the same depth (marked
   "assumed ... as <variant>"; never the committed one's, which prices only its own family);
4. on a GPU whose peak is known (nanochat/gpus.py), an assumed MFU of that peak over the run's
   FLOPs per token (marked "assumed");
else none and the plan says so. Evaluation is not counted: on the paper's configs it is a few
percent of a run. The files are read by nanochat/measurements.py.
"""

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from nanochat import connections, gpus, measurements
from nanochat.planning.sizing import flops_at_depth, resolve, stream_count
from nanochat.report.format import format_count
from nanochat.report.runs import single_state

# The MFU the plan assumes where nothing was measured: an assumption, not a measurement. Well-tuned
# dense bf16 pretraining at these sizes on one H100 node runs at roughly 30-50 % of peak (nanochat's
# logs print it); the HC variants' memory-bound stream passes sit below the residual baseline's.
# A finished run or scripts.gpu_check replaces it with a measurement; --mfu (PLAN_MFU) changes it.
ASSUMED_MFU = 0.40


@dataclass
class Throughput:
    variant: str
    depth: int
    n: int
    per_gpu: float  # tokens/s of one GPU
    source: str
    kernels: str = "torch"  # the --hc-kernels backend it ran on
    exact_only: bool = False  # prices its own runs and its relatives' (`relative_throughput`), no other variant's


def measured_from_runs(runs_root, gpu_name="", device="cuda"):
    """Per-device tokens/s of every finished run under runs_root that trained on the device the
    plan prices: a GPU ("cuda"), the one `gpu_name` names where it names one (`gpus.same_gpu`
    against the run's recorded device_name; a run that records none is left out), or the CPU
    ("cpu": the offline demo's plan). A run on another device says nothing of this one's speed:
    a tiny CPU run priced an H200 run at 10,000 times its cost."""
    out = []
    root = Path(runs_root)
    if not root.is_dir():
        return out
    for run_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        s = measurements.read(run_dir / "summary.json")
        if not s or not s.get("complete") or not s.get("tok_per_sec") or s.get("device") != device:
            continue
        name = s.get("device_name")
        if device == "cuda" and gpu_name and not (isinstance(name, str) and gpus.same_gpu(gpu_name, name)):
            continue
        variant = s.get("hc", "residual")
        n = stream_count(variant, s.get("hc_streams"))
        # tok_per_sec counts the whole step's tokens, i.e. every rank's.
        out.append(Throughput(variant, s.get("depth"), n, s["tok_per_sec"] / max(1, s.get("world_size", 1)),
                              f"run {run_dir.name} on {name or device}"))
    return out


def read_gpu_check(path, exact_only=False, gpu_name=""):
    """Throughputs from scripts.gpu_check's JSON (one GPU; none when `gpu_name` names another
    GPU than its env's device_name, or it names none): a forward + backward step without
    the optimizer (a slight overestimate of training throughput). From its "model" section, one
    entry per (depth, variant) with "label", "variant", "depth", "n" and "tokens_per_s" (the
    torch backend; the full-causal reference rows, label != variant, are skipped); and from its
    "kernels" section the whole-model rows ("run" "model D<depth>") with their "kernels"
    backend. A --tiny run's CPU toy numbers are not measurements of a paper run and are
    skipped, as are malformed entries. exact_only: see Throughput."""
    data = measurements.read(path)
    if not isinstance(data, dict) or data.get("profile") != "gpu":
        return []
    device = measurements.device(data)
    if gpu_name and not (device and gpus.same_gpu(gpu_name, device)):
        return []
    entries = [dict(e, kernels="torch") for e in measurements.model_rows(data) if e.get("label") == e.get("variant")]
    for e in measurements.kernel_rows(data):
        run = e.get("run")
        if isinstance(run, str) and run.startswith("model D") and run[7:].isdigit():
            entries.append(dict(e, depth=e.get("depth", int(run[7:]))))
    out = []
    for e in entries:
        variant, depth, rate, n, backend = (e.get(k) for k in ("variant", "depth", "tokens_per_s", "n", "kernels"))
        if not isinstance(variant, str) or not isinstance(depth, int) or not isinstance(rate, (int, float)) \
                or not rate > 0 or not isinstance(backend, str):
            continue
        n = stream_count(variant, n if isinstance(n, int) else None)
        out.append(Throughput(variant, depth, n, float(rate), Path(path).name, backend, exact_only))
    return out


def committed_measurement(gpu_name, path=measurements.GPU_CHECK):
    """read_gpu_check of the committed measurement when it was made on the GPU named
    (`gpus.same_gpu`), each marked exact_only and "docs/..., <GPU>"; else []."""
    data = measurements.read(path)
    device = measurements.device(data)
    if not gpu_name or not device or not gpus.same_gpu(gpu_name, device):
        return []
    return [dataclasses.replace(m, source=f"docs/{Path(path).name}, {device}")
            for m in read_gpu_check(path, exact_only=True)]


def covered_line(measured):
    """Which runs the committed measurement prices (None when it prices none)."""
    committed = sorted({(m.source, m.variant, m.depth, m.kernels) for m in measured if m.exact_only})
    if not committed:
        return None
    return (f"measured in {committed[0][0]}: " + ", ".join(f"{v} D{d}" + ("" if k == "torch" else f" ({k})")
                                                          for _, v, d, k in committed)
            + "; any other run of the plan is priced otherwise (its column says how)")


@dataclass(frozen=True)
class Assumption:
    """Where nothing was measured: an MFU of the GPU's peak bf16 FLOP/s (nanochat/gpus.py)."""
    gpu: str
    peak: float  # FLOP/s of one GPU
    mfu: float = ASSUMED_MFU

    def throughput(self, run):
        """Tokens/s of one GPU for a run, from its FLOPs per token."""
        if resolve(run).flops_per_token is None:
            return None
        rate = self.mfu * self.peak / run.flops_per_token
        return Throughput(run.variant, run.depth, run.n, rate,
                          f"assumed: {self.mfu:.0%} MFU of {self.peak / 1e12:.0f} TFLOP/s, {self.gpu}")

    def describe(self):
        return (f"assumed: {self.mfu:.0%} MFU of the {self.gpu}'s peak bf16 {self.peak / 1e12:.0f} TFLOP/s (NVIDIA's "
                "data sheet, dense), over each run's FLOPs per token (gpt.estimate_flops); an assumption, not a "
                "measurement: a finished run or `python -m scripts.gpu_check` replaces it")


def assumption_for(gpu_name, mfu=ASSUMED_MFU):
    """The MFU assumption for a GPU by name, or None when the name is empty or its peak unknown."""
    if not gpu_name:
        return None
    peak = gpus.peak_flops(gpu_name)
    return Assumption(gpu_name, peak, mfu) if math.isfinite(peak) else None


def family_of(variant):
    """The family a wiring declares (its SPEC's family: "hc" for the hyper-connections), None
    for a wiring that is a family of its own or a name this version does not register."""
    if variant not in connections.VARIANTS:
        return None
    return connections.spec(variant).family


_H_CONVENTION = {}  # wiring -> whether its layers follow the H-convention (one check per process)


def follows_h_convention(variant):
    """Whether a wiring's layers compute X_next = H_res X + H_post^T F(H_pre X) with the
    (h_pre, h_post, h_res) their `coefficients(X)` gives, of shapes (..., n), (..., n),
    (..., n, n): what SPEC family="hc" promises. Checked once on a tiny model (width 32, n as
    it defaults), its parameters moved off their init; False for any layer that cannot say."""
    if variant not in _H_CONVENTION:
        import torch

        from nanochat.gpt import GPTConfig
        holds = False
        try:
            with torch.random.fork_rng(devices=[]):
                g = torch.Generator().manual_seed(0)
                conn = connections.build(GPTConfig(sequence_len=8, vocab_size=64, n_layer=1, n_head=2, n_kv_head=2,
                                                   n_embd=32, hc=variant))
                conn.init_weights()
                with torch.no_grad():
                    for p in conn.parameters():
                        p.add_(0.1 * torch.randn(p.shape, generator=g))
                    M = torch.randn(32, 32, generator=g) / 32 ** 0.5
                    branch = lambda u: torch.tanh(u @ M)  # noqa: E731
                    layer, n = conn.layers[1], conn.n
                    X = torch.randn(2, 3, n, 32, generator=g)
                    h_pre, h_post, h_res = layer.coefficients(X)
                    if (h_pre.shape, h_post.shape, h_res.shape) == ((2, 3, n), (2, 3, n), (2, 3, n, n)):
                        read = branch((h_pre[..., None, :] @ X).squeeze(-2))
                        mixed = h_res @ X + h_post[..., None] * read[..., None, :]
                        holds = torch.allclose(layer(X, branch), mixed, atol=1e-5, rtol=1e-5)
        except Exception:  # a layer without coefficients(), or whose shapes do not broadcast so
            holds = False
        _H_CONVENTION[variant] = holds
    return _H_CONVENTION[variant]


def family_hint(variant):
    """One line for a registered wiring that has n streams and an H_res, declares no family,
    and whose layers follow the H-convention (follows_h_convention): it could declare
    family="hc", and without it the plan prices it as another variant and hc_report's family
    tables leave it out. None otherwise (frac's and the gated residual's layers do not follow it)."""
    if variant not in connections.VARIANTS:
        return None
    spec = connections.spec(variant)
    if spec.family is not None or not (spec.streams and spec.has_h_res) or not follows_h_convention(variant):
        return None
    return (f"hc={variant!r} has n streams and an H_res in the H-convention but declares no family: it could "
            "declare family=\"hc\" in its SPEC, and be priced from the HC family's measurements and listed in "
            "hc_report's family tables (docs/connections.md, 'The variant contract')")


def related(variant, other):
    """Whether a measurement of `other` may price a run of `variant`: the same wiring, or two
    members of one family (the HC members share the stream passes that residual's single
    state does without, and cost several times its step)."""
    return variant == other or (family_of(variant) is not None and family_of(variant) == family_of(other))


def same_backend(m, run):
    """Whether m ran the run's --hc-kernels backend (a single-state variant has none to differ)."""
    return m.kernels == run.kernels or single_state(run.variant)


def at_depth(m, run):
    """A relative's throughput for the run's depth: as measured at the same depth; at another,
    its tokens/s times the run's FLOPs per token at m's depth over at its own (the MFU kept).
    None where either FLOPs count is unknown (a bad setting)."""
    if m.depth == run.depth:
        return m
    there = flops_at_depth(run, m.depth)
    here = resolve(run).flops_per_token
    return None if there is None or here is None else dataclasses.replace(m, per_gpu=m.per_gpu * there / here)


def relative_throughput(run, measured):
    """For a run nothing measured: its nearest measured relative (`related`) on its backend, the
    same depth first, then the same n, then the nearest depth, then its own variant, as at_depth
    gives it; None where none is measured."""
    relatives = sorted((m for m in measured if related(run.variant, m.variant) and same_backend(m, run)),
                       key=lambda m: (m.depth != run.depth, m.n != run.n, abs(m.depth - run.depth),
                                      m.variant != run.variant))
    return next((t for t in (at_depth(m, run) for m in relatives) if t is not None), None)


def find_throughput(run, measured, assumption=None):
    """The best throughput for a run and how it was had: "measured" (same variant, depth, n and
    backend; any backend for a single-state variant), "≈" (a measured relative's,
    `relative_throughput`), "another" (nothing of its family measured: another variant's at the
    same depth, taken as its own; never from an exact_only measurement), "assumed" (the MFU
    assumption), else (None, None)."""
    exact = [m for m in measured if (m.variant, m.depth, m.n) == (run.variant, run.depth, run.n)
             and same_backend(m, run)]
    if exact:
        return exact[0], "measured"
    relative = relative_throughput(run, measured)
    if relative is not None:
        return relative, "≈"
    same_depth = [m for m in measured if m.depth == run.depth and not m.exact_only]
    if same_depth:
        return same_depth[0], "another"
    rate = None if assumption is None else assumption.throughput(run)
    return (rate, "assumed") if rate is not None else (None, None)


def rate_cell(m, kind, run):
    """The plan's tokens/s column: the rate and where it comes from, marked "≈ ... from <the
    relative>" or "assumed" where it is not the run's own measurement."""
    if m is None:
        return "—"
    rate = format_count(m.per_gpu)
    if kind == "assumed":
        return f"assumed {rate}"
    if kind == "another":
        return f"assumed {rate} as {m.variant} ({m.source})"
    if kind == "≈":
        differs = (("" if m.depth == run.depth else f" D{m.depth}")
                   + ("" if m.n == run.n else f" n={m.n}, taken as measured"))
        return f"≈ {rate} from {m.variant}{differs} ({m.source})"
    return f"{rate} ({m.source})"


# The kinds of throughput (find_throughput) that are assumptions rather than measurements of
# the run or its family; and what the marks of the tokens/s column mean.
ASSUMED_KINDS = frozenset({"assumed", "another"})
LEGEND = ("≈ ... from V: not measured itself; priced from V, a measured relative (the same wiring, or a member of "
          "its SPEC family) on the same --hc-kernels backend, the same depth first, from another depth (D) scaled "
          "by FLOPs per token; from another stream count (n=...) taken as measured, not scaled: the stream passes "
          "move n*C values a token, so the rate of a wider n is high for it and of a narrower one low. assumed ... "
          "as V: no relative measured; another variant's measurement at the same depth taken as its own. Only "
          "measurements on the plan's GPU (--gpu-name, where given) or CPU price it. Evaluation time is not "
          "included.")
