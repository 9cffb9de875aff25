"""Paper-layout tables and figures from run directories.

Reads only what training and evaluation leave in a run directory (config.toml, metrics.jsonl,
summary.json, core.json, hc_stats.json) and writes report/README.md with the KromHC paper's
tables (ours beside the paper's numbers from `nanochat.paper_results` wherever a run matches a
paper row by configuration) and PNG figures in the paper's styles. Nothing is invented: a
value that no file holds is printed as a dash, runs that were expected but not found are
listed, and runs without summary.json are marked incomplete.

A run matches a paper row when depth, variant, number of streams n, KromHC factorization
(as a multiset; unset means the default, all 2s for the paper's powers of two) and the
alpha_res sharing agree. Training length is not part of the match; the tables show it.
"""

import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.figure import Figure

from nanochat import paper_results as paper

MISSING = "—"
RUN_FILES = ("config.toml", "metrics.jsonl", "summary.json", "core.json", "hc_stats.json")
# EMA factor for the loss-gap and gradient-norm curves. The paper smooths with an EMA but
# does not give its factor; 0.98 (a ~50-step memory) keeps 7000-step curves readable.
EMA_BETA = 0.98


# ------------------------------------------------------------------------------------------
# Reading runs

@dataclass
class Run:
    """One run directory, or an expected run that was not found (found=False, config from its TOML)."""
    name: str
    path: Path
    found: bool = True
    config: dict = field(default_factory=dict)
    summary: dict | None = None
    metrics: dict = field(default_factory=dict)  # kind -> rows sorted by step
    core: dict | None = None
    hc_stats: dict | None = None

    def _get(self, key, default=None):
        if self.summary and self.summary.get(key) is not None:
            return self.summary[key]
        return self.config.get(key, default)

    @property
    def depth(self):
        return self._get("depth")

    @property
    def variant(self):
        """The connection variant; base_train's default (residual) when a config omits it, None
        for a run that was not found and whose config is unknown."""
        return self._get("hc", "residual" if (self.config or self.summary) else None)

    @property
    def n(self):
        if self.variant == "residual":
            return 1
        n = self._get("hc_streams")
        # hc_streams = 0 in a config means the variant's default, 4 (nanochat/train_config.py).
        return paper.PAPER_STREAMS if n == 0 else n

    @property
    def factors(self):
        """KromHC factors as given (None when unset, i.e. the default factorization)."""
        return parse_factors(self._get("hc_factors")) if self.variant == "kromhc" else None

    @property
    def alpha_shared(self):
        return bool(self._get("hc_alpha_shared", True))

    @property
    def complete(self):
        return bool(self.summary and self.summary.get("complete", False))

    @property
    def last_step(self):
        if self.summary and self.summary.get("step") is not None:
            return self.summary["step"]
        steps = [rows[-1]["step"] for rows in self.metrics.values() if rows]
        return max(steps) if steps else None

    @property
    def num_iterations(self):
        """The planned steps: summary.json's, else an explicit --num-iterations (-1 means the
        horizon came from a FLOPs or data budget, known only once training started)."""
        steps = self._get("num_iterations")
        return steps if steps is not None and steps > 0 else None

    @property
    def status(self):
        if not self.found:
            return "not found"
        if self.complete:
            return "complete"
        return f"incomplete (step {fmt(self.last_step, 'd')} of {fmt(self.num_iterations, 'd')})"


def parse_factors(value):
    """hc_factors as written to config.toml/summary.json (a list) as a tuple; None if unset."""
    return tuple(int(v) for v in value) if value else None


def read_metrics(path):
    """metrics.jsonl -> {kind: rows sorted by step}. A resumed run logs some steps twice:
    the later line wins. A torn last line (a run killed mid-write) is ignored."""
    by_kind = {}
    lines = Path(path).read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}:{i + 1} is not valid JSON; repair or delete that line") from None
        if "step" not in row or "kind" not in row:
            raise ValueError(f"{path}:{i + 1} lacks 'step' or 'kind' (see the metrics.jsonl format)")
        by_kind.setdefault(row["kind"], {})[row["step"]] = row
    return {kind: [rows[s] for s in sorted(rows)] for kind, rows in by_kind.items()}


def _read_json(path):
    return json.loads(path.read_text()) if path.is_file() else None


def load_run(path, expected_config=None):
    """Read one run directory. A directory holding none of the run files counts as not found;
    then `expected_config` (the TOML it was meant to run) still places it in the tables."""
    path = Path(path)
    name = path.name
    if not path.is_dir() or not any((path / f).is_file() for f in RUN_FILES):
        return Run(name=name, path=path, found=False, config=dict(expected_config or {}))
    config_path = path / "config.toml"
    config = tomllib.loads(config_path.read_text()) if config_path.is_file() else dict(expected_config or {})
    metrics_path = path / "metrics.jsonl"
    return Run(
        name=name, path=path, config=config,
        summary=_read_json(path / "summary.json"),
        metrics=read_metrics(metrics_path) if metrics_path.is_file() else {},
        core=_read_json(path / "core.json"),
        hc_stats=_read_json(path / "hc_stats.json"),
    )


def discover_runs(root):
    """Every sub-directory of `root` that holds a run file, sorted by name."""
    root = Path(root)
    if not root.is_dir():
        raise SystemExit(f"runs root {root} does not exist: train first, or pass --runs DIR ...")
    return sorted(p for p in root.iterdir() if p.is_dir() and any((p / f).is_file() for f in RUN_FILES))


def read_config(path):
    """A configs/**.toml file as a dict (its model_tag names the run directory)."""
    config = tomllib.loads(Path(path).read_text())
    if not config.get("model_tag"):
        raise SystemExit(f"{path} has no model_tag: add model_tag = \"...\" so its run directory is known")
    return config


def config_files(paths):
    """Expand files and directories (recursively) into a sorted list of .toml paths."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(p.rglob("*.toml")))
        elif p.is_file():
            out.append(p)
        else:
            raise SystemExit(f"config path {p} does not exist")
    return out


# ------------------------------------------------------------------------------------------
# Values from a run (None when no file holds them)

def last_value(run, kind, key):
    for row in reversed(run.metrics.get(kind, [])):
        if row.get(key) is not None:
            return row[key]
    return None


def train_loss(run):
    if run.complete and run.summary.get("train_loss_smooth") is not None:
        return run.summary["train_loss_smooth"]
    return last_value(run, "train", "loss_smooth")


def val_bpb(run):
    if run.complete and run.summary.get("val_bpb") is not None:
        return run.summary["val_bpb"]
    return last_value(run, "val", "bpb")


def core_score(run):
    """(CORE x 100, source): the standalone evaluation (core.json) first, then the final
    in-training one (summary.json), then the last sub-sampled one logged in metrics.jsonl."""
    if run.core and run.core.get("core_metric") is not None:
        return 100 * run.core["core_metric"], "core.json"
    if run.summary and run.summary.get("core_metric") is not None:
        return 100 * run.summary["core_metric"], "summary.json"
    value = last_value(run, "core", "core_metric")
    return (None, None) if value is None else (100 * value, "metrics.jsonl")


def task_accuracy(run, label):
    """Accuracy in percent of one CORE task, from core.json or else the last logged CORE."""
    if run.core and label in run.core.get("tasks", {}):
        return 100 * run.core["tasks"][label]["accuracy"]
    results = last_value(run, "core", "results")
    if results and results.get(label) is not None:
        return 100 * results[label]
    return None


def params(run, key="total"):
    if run.summary and isinstance(run.summary.get("params"), dict):
        return run.summary["params"].get(key)
    return None


def stability(run):
    """(Figure-2 diagnostics dict, source): hc_stats.json, else the last 'hc' metrics row."""
    if run.hc_stats:
        return run.hc_stats, "hc_stats.json"
    rows = run.metrics.get("hc", [])
    return (rows[-1], "metrics.jsonl") if rows else (None, None)


# ------------------------------------------------------------------------------------------
# Matching runs to the paper's rows

def is_default_factors(factors, n):
    """True for an unset factorization or one of all 2s (the paper's choice for n = 2^K)."""
    return factors is None or (set(factors) == {2} and 2 ** len(factors) == n)


def is_main(run):
    """A run of the main comparison: n = 4 (or residual), KromHC 2x2 with shared alpha."""
    if run.variant is None:
        return False
    if run.variant == "residual":
        return True
    if run.n != paper.PAPER_STREAMS:
        return False
    return run.variant != "kromhc" or (is_default_factors(run.factors, run.n) and run.alpha_shared)


def paper_key(run):
    """(depth, variant) of the paper's Tables 3-5 row this run reproduces, or None."""
    key = (run.depth, run.variant)
    return key if is_main(run) and key in paper.MAIN else None


def method_label(run):
    if run.variant is None:
        return MISSING
    label = paper.METHOD_NAMES.get(run.variant, run.variant)
    if run.variant == "residual":
        return label
    extras = []
    if run.n != paper.PAPER_STREAMS:
        extras.append(f"n={fmt(run.n, 'd')}")
    if run.variant == "kromhc":
        if not is_default_factors(run.factors, run.n):
            extras.append("x".join(map(str, run.factors)))
        if not run.alpha_shared:
            extras.append("alpha per factor")
    return f"{label} ({', '.join(extras)})" if extras else label


def method_order(run):
    order = list(paper.METHOD_NAMES)
    return (order.index(run.variant) if run.variant in order else len(order), run.n or 0, run.name)


# ------------------------------------------------------------------------------------------
# Markdown helpers

def fmt(value, spec=".3f"):
    return MISSING if value is None else format(value, spec)


def signed(value, spec=".2f"):
    return MISSING if value is None else format(value, "+" + spec)


def md_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def relative_pct(value, reference):
    if value is None or not reference:
        return None
    return 100.0 * (value / reference - 1.0)


# ------------------------------------------------------------------------------------------
# Tables

def runs_table(runs):
    rows = []
    for r in sorted(runs, key=lambda r: (r.depth or 0, method_order(r))):
        factors = "x".join(map(str, r.factors)) if r.factors else MISSING
        alpha = ("shared" if r.alpha_shared else "per factor") if r.variant == "kromhc" else MISSING
        rows.append((r.name, method_label(r), fmt(r.depth, "d"), fmt(r.n, "d"), factors, alpha,
                     f"{fmt(r.last_step, 'd')} / {fmt(r.num_iterations, 'd')}",
                     r.status, r.summary.get("device", MISSING) if r.summary else MISSING))
    return md_table(("Run", "Method", "D", "n", "Factors", "alpha_res", "Steps", "Status", "Device"), rows)


def corpus_lines(runs):
    """What the runs trained on, one line per corpus, from the corpus.json base_train writes
    beside config.toml (runs from before it existed are listed as unknown)."""
    by_corpus = {}
    for r in runs:
        if r.found:
            record = _read_json(r.path / "corpus.json")
            by_corpus.setdefault(record["description"] if record else "unknown (no corpus.json)", []).append(r.name)
    return "\n".join(f"- Trained on {corpus}: {', '.join(names)}" for corpus, names in by_corpus.items())


def residual_reference(runs, depth):
    """The complete residual run at this depth whose parameter count is known, or None."""
    refs = [r for r in runs if r.depth == depth and r.variant == "residual" and params(r) is not None]
    return refs[0] if refs else None


def main_table(runs, depth):
    """Table 3 layout for one depth: ours beside the paper's numbers."""
    ref = residual_reference(runs, depth)
    notes, rows, core_from_training, core_partial = [], [], [], []
    for r in sorted((r for r in runs if r.depth == depth and is_main(r)), key=method_order):
        p = paper.MAIN.get(paper_key(r)) if paper_key(r) else None
        if r.variant == "residual":
            delta = "--"
        elif ref is None or params(r) is None:
            delta = MISSING
        else:
            delta = fmt((params(r) - params(ref)) / 1e3, ".1f")
            if params(r, "hc") is not None and params(ref, "hc") is not None and \
                    params(r) - params(r, "hc") != params(ref) - params(ref, "hc"):
                delta += " †"
                notes.append(f"† {r.name}: the non-HC parameters differ from {ref.name} (another vocab or width), "
                             "so its ΔParams is not the connection's cost alone.")
        core, source = core_score(r)
        if source and source != "core.json":
            core_from_training.append(r.name)
        elif source and r.core.get("partial"):
            core_partial.append(f"{r.name} ({len(r.core.get('tasks', {}))})")
        rows.append((
            method_label(r), r.name, r.status,
            delta, "--" if p and p.delta_params_k is None else fmt(p.delta_params_k if p else None, ".0f"),
            fmt(train_loss(r)), fmt(p.train_loss if p else None),
            fmt(val_bpb(r)), fmt(p.val_bpb if p else None),
            fmt(core), fmt(p.core if p else None),
        ))
    if not rows:
        return None
    header = ("Method", "Run", "Status", "ΔParams (K)", "paper", "Train loss", "paper",
              "Val BPB", "paper", "CORE", "paper")
    text = [md_table(header, rows)]
    if ref is None:
        notes.insert(0, f"No complete residual run at D={depth}: ΔParams cannot be computed.")
    else:
        notes.insert(0, f"ΔParams = params.total of the run minus that of {ref.name} (summary.json).")
    if core_from_training:
        notes.append("CORE from the in-training evaluation (possibly sub-sampled; no core.json from "
                     "scripts.base_eval): " + ", ".join(core_from_training) + ".")
    if core_partial:
        notes.append("CORE averages only the tasks the eval bundle held (core.json: partial; tasks in "
                     "parentheses), not all 22: " + ", ".join(core_partial) + ".")
    if depth not in paper.PAPER_DEPTHS:
        notes.append(f"The paper reports D=6 and D=12 only: no paper numbers for D={depth} "
                     "(see 'The paper's numbers' below).")
    return "\n\n".join(text + ["\n".join(f"- {n}" for n in dict.fromkeys(notes))])


def task_table(runs, depth, columns, paper_rows):
    """Tables 4/5 layout: for each run a row of ours and, when it matches, the paper's row beneath."""
    header = ("Method", "Run", "Avg") + tuple(h for h, _ in columns)
    rows, partial = [], []
    for r in sorted((r for r in runs if r.depth == depth and is_main(r)), key=method_order):
        accs = [task_accuracy(r, label) for _, label in columns]
        present = [a for a in accs if a is not None]
        avg = fmt(sum(present) / len(present), ".1f") if present else MISSING
        if present and len(present) < len(accs):
            avg += "*"
            partial.append(r.name)
        rows.append((method_label(r), r.name, avg) + tuple(fmt(a, ".1f") for a in accs))
        key = paper_key(r)
        if key in paper_rows:
            rows.append((f"{method_label(r)} (paper)", "", *(fmt(v, ".1f") for v in paper_rows[key])))
    if not rows:
        return None
    notes = ["Accuracy in percent; Avg is the mean of the tasks shown, as in the paper."]
    if partial:
        notes.append("* averaged over the tasks present only (" + ", ".join(partial) + "); "
                     "a dash is a task missing from core.json (e.g. not in the eval bundle).")
    return md_table(header, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes)


def n_scaling_table(runs, depth):
    """Table 6 layout: KromHC (all-2 factors, shared alpha) at each width n."""
    group = [r for r in runs if r.depth == depth and r.variant == "kromhc" and r.alpha_shared
             and r.n is not None and is_default_factors(r.factors, r.n)]
    ns = sorted({r.n for r in group} | (set(paper.N_SCALING_DELTA_PARAMS_M) if depth == paper.N_SCALING_DEPTH else set()))
    if len(ns) < 2:
        return None
    ref = residual_reference(runs, depth)
    base = next((r for r in group if r.n == paper.PAPER_STREAMS and r.found), None)
    rows = []
    for n in ns:
        runs_n = [r for r in group if r.n == n] or [None]
        for r in runs_n:
            measured = None
            if r is not None and ref is not None and params(r) is not None:
                measured = (params(r) - params(ref)) / 1e6
            # The width of the run, else the paper's width for this depth (rows not run).
            model_dim = (r.summary or {}).get("model_dim") if r else None
            if model_dim is None:
                model_dim = paper.SCALE_HYPERPARAMS.get(depth, {}).get("model_dim")
            formula = None
            if model_dim is not None:
                norm_weight = bool(r.config.get("hc_norm_weight", True)) if r else True
                per_layer = hc_params_per_layer("kromhc", n, model_dim, factors=r.factors if r else None,
                                                norm_weight=norm_weight)
                formula = 2 * depth * per_layer / 1e6
            gap_loss = gap_bpb = None
            if r is not None and base is not None and r is not base:
                gap_loss = _diff(train_loss(r), train_loss(base))
                gap_bpb = _diff(val_bpb(r), val_bpb(base))
            p = paper.N_SCALING_DELTA_PARAMS_M.get(n) if depth == paper.N_SCALING_DEPTH else None
            rows.append((fmt(n, "d"), r.name if r else MISSING, r.status if r else "not run",
                         fmt(measured, ".2f"), fmt(formula, ".2f"), fmt(p, ".2f"),
                         fmt(train_loss(r) if r else None), fmt(val_bpb(r) if r else None),
                         fmt(core_score(r)[0] if r else None), signed(gap_loss, ".3f"), signed(gap_bpb, ".3f")))
    header = ("n", "Run", "Status", "ΔParams (M)", "formula (M)", "paper (M)", "Train loss", "Val BPB",
              "CORE", "Δloss vs n=4", "ΔBPB vs n=4")
    notes = ["ΔParams: measured against the residual run of the same depth"
             + (f" ({ref.name})" if ref else " (none found, so a dash)") + "; formula: 2·D HC layers × "
             "`hc_layer_params` (with the RMSNorm weight unless the run turned it off)."]
    if depth == paper.N_SCALING_DEPTH:
        notes.append("Paper: " + paper.N_SCALING_NOTE + ".")
        notes.append(f"{paper.N_SCALING_FIGURE} shows the gaps as curves only: {paper.N_SCALING_CLAIM}.")
    return md_table(header, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes)


def _diff(a, b):
    return None if a is None or b is None else a - b


def alpha_table(runs):
    """Figure 6 ablation: KromHC with one alpha_res per factor versus the shared one."""
    per_factor = [r for r in runs if r.variant == "kromhc" and not r.alpha_shared]
    rows = []
    for r in sorted(per_factor, key=lambda r: (r.depth or 0, r.n or 0, r.name)):
        shared = [s for s in runs if s.variant == "kromhc" and s.alpha_shared and s.depth == r.depth
                  and s.n == r.n and _same_factors(s, r)]
        for s in shared or [None]:
            for run, label in ((s, "shared"), (r, "per factor")):
                if run is None:
                    rows.append((fmt(r.depth, "d"), fmt(r.n, "d"), label, MISSING, "not run",
                                 MISSING, MISSING, MISSING, MISSING, MISSING))
                    continue
                d_loss = _diff(train_loss(r), train_loss(s)) if s and run is r else None
                d_bpb = _diff(val_bpb(r), val_bpb(s)) if s and run is r else None
                rows.append((fmt(run.depth, "d"), fmt(run.n, "d"), label, run.name, run.status,
                             fmt(train_loss(run)), fmt(val_bpb(run)), fmt(core_score(run)[0]),
                             signed(d_loss, ".3f"), signed(d_bpb, ".3f")))
    claim = f"Paper ({paper.ALPHA_FIGURE}, D={paper.ALPHA_DEPTH}, n={paper.ALPHA_STREAMS}, curves only): {paper.ALPHA_CLAIM}."
    if not rows:
        return "No run with a per-factor alpha_res.\n\n- " + claim
    header = ("D", "n", "alpha_res", "Run", "Status", "Train loss", "Val BPB", "CORE",
              "Δloss vs shared", "ΔBPB vs shared")
    return md_table(header, rows) + "\n\n- " + claim


def _same_factors(a, b):
    fa, fb = a.factors, b.factors
    if is_default_factors(fa, a.n) and is_default_factors(fb, b.n):
        return True
    return fa is not None and fb is not None and sorted(fa) == sorted(fb)


def _factor_key(run):
    return (2,) * int(math.log2(run.n)) if run.factors is None else tuple(sorted(run.factors, reverse=True))


def factorization_table(runs):
    """Appendix ablation: KromHC factorizations of the same n (paper: 2x2x2 versus 4x2 at n = 8)."""
    krom = [r for r in runs if r.variant == "kromhc" and r.alpha_shared and r.n]
    groups = {}
    for r in krom:
        if r.factors is None and 2 ** int(math.log2(r.n)) != r.n:
            continue  # default factorization of a non-power of two: nothing to compare it with here
        groups.setdefault((r.depth, r.n), []).append(r)
    rows, deltas = [], []
    for (depth, n), group in sorted(groups.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1])):
        if len({_factor_key(r) for r in group}) < 2:
            continue
        for r in sorted(group, key=lambda r: (_factor_key(r), r.name)):
            rows.append((fmt(depth, "d"), fmt(n, "d"), "x".join(map(str, _factor_key(r))), r.name, r.status,
                         fmt(train_loss(r)), fmt(val_bpb(r)), fmt(core_score(r)[0])))
        fine, coarse = (next((r for r in group if _factor_key(r) == f), None) for f in paper.FACTORIZATION_COMPARED)
        if n == paper.FACTORIZATION_STREAMS and fine and coarse:
            paper_here = depth == paper.FACTORIZATION_DEPTH
            deltas.append((fmt(depth, "d"), fmt(n, "d"), "train loss", signed(_diff(train_loss(fine), train_loss(coarse)), ".3f"),
                           signed(paper.FACTORIZATION_DELTA["train_loss"], ".3f") if paper_here else MISSING))
            deltas.append((fmt(depth, "d"), fmt(n, "d"), "val BPB", signed(_diff(val_bpb(fine), val_bpb(coarse)), ".3f"),
                           signed(paper.FACTORIZATION_DELTA["val_bpb"], ".3f") if paper_here else MISSING))
    claim = (f"Paper ({paper.FACTORIZATION_SECTION}, D={paper.FACTORIZATION_DEPTH}, n={paper.FACTORIZATION_STREAMS}): "
             f"2x2x2 minus 4x2 = {paper.FACTORIZATION_DELTA['train_loss']:+.3f} train loss, "
             f"{paper.FACTORIZATION_DELTA['val_bpb']:+.3f} val BPB.")
    if not rows:
        return "No two KromHC runs of the same depth and n with different factorizations.\n\n- " + claim
    text = md_table(("D", "n", "Factors", "Run", "Status", "Train loss", "Val BPB", "CORE"), rows)
    if deltas:
        text += "\n\n2x2x2 minus 4x2:\n\n" + md_table(("D", "n", "Metric", "Ours", "paper"), deltas)
    return text + "\n\n- " + claim


def identity_table(runs):
    """Beyond the paper: HC with H_res fixed to I against the other methods of its depth and n."""
    rows = []
    for r in sorted((r for r in runs if r.variant == "hc_identity"), key=lambda r: (r.depth or 0, r.name)):
        others = [o for o in runs if o.depth == r.depth and o is not r and o.found and is_main(o)
                  and (o.variant == "residual" or o.n == r.n)]
        for o in sorted(others, key=method_order):
            rows.append((fmt(r.depth, "d"), r.name, f"{method_label(o)} ({o.name})",
                         signed(_diff(train_loss(r), train_loss(o)), ".3f"), signed(_diff(val_bpb(r), val_bpb(o)), ".3f"),
                         signed(_diff(core_score(r)[0], core_score(o)[0]), ".3f")))
    note = "- Not in the paper: it isolates what the stream mixing H_res buys over dynamic pre/post weights alone."
    if not rows:
        return "No hc_identity run.\n\n" + note
    return md_table(("D", "Run (H_res = I)", "minus", "Δ train loss", "Δ val BPB", "Δ CORE"), rows) + "\n\n" + note


def stability_table(runs):
    """Figure 2: composite residual products; paper values beside matching runs."""
    rows, sources = [], []
    for r in sorted((r for r in runs if r.variant not in ("residual", None) and r.found),
                    key=lambda r: (r.depth or 0, method_order(r))):
        stats, source = stability(r)
        if stats is None:
            rows.append((method_label(r), r.name, fmt(r.depth, "d"), MISSING, MISSING, MISSING, MISSING, MISSING, MISSING))
            continue
        if source != "hc_stats.json":
            sources.append(r.name)
        p = None
        if r.depth == paper.STABILITY_DEPTH and is_main(r) and r.variant in paper.STABILITY_COL_MAE:
            p = paper.STABILITY_COL_MAE[r.variant]
            p = ("≈" if r.variant in paper.STABILITY_APPROXIMATE else "") + f"{p:g}"
        rows.append((method_label(r), r.name, fmt(r.depth, "d"),
                     fmt(stats.get("composite_row_mae"), ".2e"), p or MISSING,
                     fmt(stats.get("composite_col_mae"), ".2e"),
                     fmt(stats.get("fwd_gain"), ".3g"), fmt(stats.get("bwd_gain"), ".3g"), source))
    if not rows:
        return None
    notes = ["MAE of the row (column) sums of the product of every HC layer's H_res, per token, against 1; "
             "gains: largest absolute row (forward) and column (backward) sum of that product.",
             "The paper's code stores A = H_res^T, so the column sums it plots are our row sums: its value "
             "stands beside our row MAE. Our mHC ends each Sinkhorn pass on columns, so its error shows in rows.",
             f"Paper ({paper.STABILITY_FIGURE}, D={paper.STABILITY_DEPTH}): a plot; mHC 'around 0.05', "
             "mHC-lite and KromHC zero."]
    if sources:
        notes.append("From the last training-time diagnostic (no hc_stats.json): " + ", ".join(sources) + ".")
    header = ("Method", "Run", "D", "row MAE", "paper", "col MAE", "fwd gain", "bwd gain", "source")
    return md_table(header, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes)


def system_table(runs, depth):
    """Table 9 layout: tokens/s, step time and peak memory, relative to the mHC run of this depth."""
    group = sorted((r for r in runs if r.depth == depth and is_main(r) and r.summary), key=method_order)
    if not group:
        return None
    ref = next((r for r in group if r.variant == paper.SYSTEM_REFERENCE), None)
    rows, notes = [], []
    rs = ref.summary if ref else {}
    for r in group:
        s = r.summary
        p = paper.SYSTEM.get(r.variant) if depth == paper.SYSTEM_DEPTH else None
        if ref and (s.get("device"), s.get("world_size")) != (rs.get("device"), rs.get("world_size")):
            notes.append(f"{r.name} ran on {s.get('device')} x{s.get('world_size')}, the mHC run on "
                         f"{rs.get('device')} x{rs.get('world_size')}: its relative numbers compare hardware too.")
        cells = [method_label(r), r.name, f"{s.get('device', MISSING)} x{s.get('world_size', MISSING)}"]
        for key, spec, paper_value in (("tok_per_sec", ",.0f", p and p.throughput_pct),
                                       ("step_time", ".4f", p and p.step_time_pct),
                                       ("peak_mem_mib", ",.0f", p and p.memory_pct)):
            ours = "(ref)" if r is ref else signed(relative_pct(s.get(key), rs.get(key)))
            theirs = "(ref)" if p and r.variant == paper.SYSTEM_REFERENCE else signed(paper_value if p else None)
            cells += [fmt(s.get(key), spec), ours, theirs]
        rows.append(cells)
    header = ("Method", "Run", "Device", "tok/s", "Δ% vs mHC", "paper", "step time (s)", "Δ%", "paper",
              "peak mem (MiB)", "Δ%", "paper")
    notes.insert(0, "Medians over the steps after warm-up (summary.json); Δ% is relative to the mHC run "
                 + (f"({ref.name})." if ref else "— none at this depth, so a dash."))
    if depth == paper.SYSTEM_DEPTH:
        notes.append(f"Paper ({paper.SYSTEM_TABLE}): pure PyTorch, n=4, 8 RTX PRO 6000 GPUs.")
    return md_table(header, rows) + "\n\n" + "\n".join(f"- {n}" for n in dict.fromkeys(notes))


def other_runs_table(runs, placed):
    # Runs neither found nor configured are already listed as missing, with nothing to show.
    rest = [r for r in runs if r.name not in placed and r.variant is not None]
    if not rest:
        return None
    rows = [(method_label(r), r.name, fmt(r.depth, "d"), r.status, fmt(train_loss(r)), fmt(val_bpb(r)),
             fmt(core_score(r)[0])) for r in sorted(rest, key=lambda r: (r.depth or 0, method_order(r)))]
    return md_table(("Method", "Run", "D", "Status", "Train loss", "Val BPB", "CORE"), rows)


def paper_reference():
    """The paper's Tables 3-5 in full, for runs at depths the paper did not train."""
    rows = []
    for (depth, method), p in paper.MAIN.items():
        rows.append((fmt(depth, "d"), paper.METHOD_NAMES[method],
                     "--" if p.delta_params_k is None else f"{p.delta_params_k:.0f}",
                     f"{p.train_loss:.3f}", f"{p.val_bpb:.3f}", f"{p.core:.3f}"))
    text = [f"{paper.MAIN_TABLE}:", md_table(("D", "Method", "ΔParams (K)", "Train loss", "Val BPB", "CORE"), rows)]
    for title, columns, table in ((paper.COMMONSENSE_TABLE, paper.COMMONSENSE_COLUMNS, paper.COMMONSENSE),
                                  (paper.LANGUAGE_TABLE, paper.LANGUAGE_COLUMNS, paper.LANGUAGE)):
        header = ("D", "Method", "Avg") + tuple(h for h, _ in columns)
        body = [(fmt(d, "d"), paper.METHOD_NAMES[m]) + tuple(f"{v:.1f}" for v in vals) for (d, m), vals in table.items()]
        text += [f"{title} (accuracy %):", md_table(header, body)]
    text.append(f"- {paper.COMMONSENSE_TABLE}: the paper's Avg for mHC-lite at D=6 (41.0) is not the mean of its "
                "row (40.87); every other Avg matches its row within rounding.")
    return "\n\n".join(text)


def fidelity_notes(runs):
    """What a reader must know before comparing our numbers with the paper's."""
    sized = sorted(r.name for r in runs if r.found and r.config.get("value_embeds") is False)
    d6, d12 = (paper.MODEL_SIZES_M[d] for d in (6, 12))
    pin6, pin12 = (paper.PIN_SIZES_M[d] for d in (6, 12))
    fit6, fit12 = (paper.SIZE_MATCHED_SIZES_M[d] for d in (6, 12))
    vocab = paper.SIZE_MATCHED_LAYOUT["vocab_size"]
    lines = [
        "- **The Residual row is nanochat's baseline** as nanochat trains it: per-block scalars "
        "`x = l_resid * x + l_x0 * x0`, init 1 and 0 (the paper's appendix), x0 in AdamW at `--scalar-lr` 0.5 "
        "and resid at 0.005 (the paper's \"LR for residual connections\"; the paper lists no x0 LR), betas "
        "(0.8, 0.95), both scaled by the batch-size LR factor. nanochat's pin later used x0 beta1 0.96 and x0 "
        "init 0.1 (`--x0-beta1 0.96` gives the former). The HC variants train every connection parameter at "
        "`--hc-lr` 0.005.",
        f"- **Model size, an open question.** The paper states ~{d6}M (D=6) and ~{d12}M (D=12) parameters and "
        f"sets its step counts from them (~20 tokens per parameter). nanochat at the pin (vocab 32,768, value "
        f"embeddings) has {pin6}M / {pin12}M; a {vocab:,}-token vocab without value embeddings has {fit6}M / "
        f"{fit12}M. Our configs follow nanochat at the pin. The size-matched variant: "
        f"`python -m scripts.tok_train --vocab-size {vocab}`, then "
        f"`python -m scripts.base_train --config configs/paper/d12_kromhc.toml --vocab-size {vocab} "
        "--value-embeds false --model-tag paper_d12_kromhc_sized` (likewise for each config). "
        + (f"Runs here in that layout: {', '.join(sized)}." if sized else "No run here uses that layout."),
        "- **By design, unlike the paper's code:** bits per byte count each token's raw bytes "
        "(nanochat's pin counted byte fragments as U+FFFD, 3 bytes): our bpb reads about +0.05 % higher; "
        "the validation shard is pinned (`shard_01822`) where nanochat takes whichever sorts last on disk: "
        "an absolute offset of about ±0.001 bpb shared by every variant; nanochat is assumed at commit "
        "4d8dbaf (2026-01-30), the last before the paper, although the paper's text (x0 init 0, beta1 0.8) "
        "matches the code of 2026-01-18 to 01-24 more closely.",
    ]
    return "\n".join(lines)


def hc_params_per_layer(variant, n, C, factors=None, norm_weight=True):
    """Parameters of one HC layer, from the project's single formula in connections.diagnostics."""
    from nanochat.connections.diagnostics import hc_layer_params
    return hc_layer_params(variant, n, C, factors=factors, norm_weight=norm_weight)


def params_vs_n_table():
    C = paper.PARAMS_VS_N_C
    rows = []
    for n in (2, 4, 8, 16):
        factors = [paper.PARAMS_VS_N_FACTOR] * int(math.log2(n))
        rows.append((str(n),) + tuple(f"{hc_params_per_layer(v, n, C, factors=factors if v == 'kromhc' else None):,}"
                                      for v in paper.PARAMS_VS_N_METHODS))
    return md_table(("n",) + tuple(paper.METHOD_NAMES[v] for v in paper.PARAMS_VS_N_METHODS), rows)


# ------------------------------------------------------------------------------------------
# Figures

def ema(values, beta=EMA_BETA):
    """Bias-corrected exponential moving average and exponentially weighted variance."""
    mean = var = 0.0
    means, variances = [], []
    for t, x in enumerate(values, start=1):
        delta = x - mean
        mean += (1 - beta) * delta
        var = beta * (var + (1 - beta) * delta * delta)
        correction = 1 - beta ** t
        means.append(mean / correction)
        variances.append(var / correction)
    return means, variances


def series(run, kind, key):
    rows = [row for row in run.metrics.get(kind, []) if row.get(key) is not None]
    return [row["step"] for row in rows], [row[key] for row in rows]


def _legend(ax):
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def plot_curves(group, path, title):
    """Training loss (smoothed) and val BPB against steps."""
    fig = Figure(figsize=(11, 4))
    ax_loss, ax_bpb = fig.subplots(1, 2)
    for r in group:
        ax_loss.plot(*series(r, "train", "loss_smooth"), label=f"{method_label(r)} ({r.name})", lw=1)
        ax_bpb.plot(*series(r, "val", "bpb"), marker=".", label=f"{method_label(r)} ({r.name})", lw=1)
    for ax, ylabel in ((ax_loss, "train loss (smoothed)"), (ax_bpb, "val BPB")):
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    _legend(ax_loss)
    fig.suptitle(title)
    return _save(fig, path)


def _gap(run, reference, kind, key, smooth):
    """run minus reference at the steps both logged. No interpolation: val BPB is sparse and
    curved, and a straight line between two evaluations would invent a gap."""
    steps, values = series(run, kind, key)
    ref_steps, ref_values = series(reference, kind, key)
    if smooth:
        values, ref_values = ema(values)[0], ema(ref_values)[0]
    ref = dict(zip(ref_steps, ref_values))
    common = [(s, v - ref[s]) for s, v in zip(steps, values) if s in ref]
    return [s for s, _ in common], [g for _, g in common]


def plot_gap(group, reference, path, title):
    """Figure 4 style: EMA of the raw training loss minus the reference's, and the val BPB gap."""
    fig = Figure(figsize=(11, 4))
    ax_loss, ax_bpb = fig.subplots(1, 2)
    for r in group:
        if r is reference:
            continue
        ax_loss.plot(*_gap(r, reference, "train", "loss", smooth=True), label=f"{method_label(r)} ({r.name})", lw=1)
        ax_bpb.plot(*_gap(r, reference, "val", "bpb", smooth=False), marker=".", label=f"{method_label(r)} ({r.name})", lw=1)
    for ax, ylabel in ((ax_loss, "Δ train loss (EMA)"), (ax_bpb, "Δ val BPB")):
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_xlabel("step")
        ax.set_ylabel(f"{ylabel} vs {reference.name}")
        ax.grid(alpha=0.3)
    _legend(ax_loss)
    fig.suptitle(title)
    return _save(fig, path)


def plot_grad_norms(group, path, title):
    """Figure 8 style: raw total gradient norm and the HC parameters' gradient norm."""
    fig = Figure(figsize=(11, 4))
    ax_total, ax_hc = fig.subplots(1, 2)
    for r in group:
        ax_total.plot(*series(r, "train", "grad_norm"), label=f"{method_label(r)} ({r.name})", lw=0.7)
        ax_hc.plot(*series(r, "train", "hc_grad_norm"), label=f"{method_label(r)} ({r.name})", lw=0.7)
    for ax, ylabel in ((ax_total, "gradient norm (all parameters)"), (ax_hc, "gradient norm (connection parameters)")):
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    _legend(ax_total)
    fig.suptitle(title)
    return _save(fig, path)


def plot_grad_tail(group, path, title):
    """Figure 5 style: EMA of the gradient norm with a band of one EMA standard deviation,
    over the last 2000/7000 of each run (the paper's zoom window, scaled to the run length)."""
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for r in group:
        steps, values = series(r, "train", "grad_norm")
        if not steps:
            continue
        mean, var = ema(values)
        start = steps[-1] * (1 - paper.GRAD_ZOOM_FRACTION)
        keep = [i for i, s in enumerate(steps) if s >= start]
        xs = [steps[i] for i in keep]
        lo = [mean[i] - math.sqrt(var[i]) for i in keep]
        hi = [mean[i] + math.sqrt(var[i]) for i in keep]
        line, = ax.plot(xs, [mean[i] for i in keep], label=f"{method_label(r)} ({r.name})", lw=1)
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("step")
    ax.set_ylabel("gradient norm (EMA)")
    ax.grid(alpha=0.3)
    _legend(ax)
    ax.set_title(title)
    return _save(fig, path)


def plot_params_vs_n(path):
    """Figure 3: parameters per HC layer against n at C = 512, KromHC with 2x...x2 factors."""
    C = paper.PARAMS_VS_N_C
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for variant in paper.PARAMS_VS_N_METHODS:
        if variant == "kromhc":
            ns = [n for n in range(2, 17) if 2 ** int(math.log2(n)) == n]
            counts = [hc_params_per_layer(variant, n, C, factors=[paper.PARAMS_VS_N_FACTOR] * int(math.log2(n)))
                      for n in ns]
        else:
            ns = list(range(2, 17))
            counts = [hc_params_per_layer(variant, n, C) for n in ns]
        ax.plot(ns, counts, marker="o", label=paper.METHOD_NAMES[variant])
    ax.set_yscale("log")
    ax.set_xlabel("residual streams n")
    ax.set_ylabel(f"parameters per HC layer (C={C})")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(paper.PARAMS_VS_N_FIGURE)
    return _save(fig, path)


# ------------------------------------------------------------------------------------------
# The report

def select_reference(group, reference):
    """The run that gaps are measured against: a run name, else the first run of that variant."""
    by_name = [r for r in group if r.name == reference]
    by_variant = [r for r in group if r.variant == reference]
    found = [r for r in by_name + by_variant if r.metrics]
    return found[0] if found else None


def write_report(runs, out_dir, reference="residual", notes=()):
    """Write out_dir/README.md and the figures beside it; return the README path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    found = [r for r in runs if r.found]
    missing = [r for r in runs if not r.found]
    depths = sorted({r.depth for r in runs if r.depth is not None})
    placed = set()
    parts = ["# nanochat-hc report",
             "Tables and figures in the layout of the KromHC paper (arXiv 2601.21579), from the run "
             "directories below. Our numbers first, the paper's beside them where a run matches a paper "
             "configuration (depth, method, n, KromHC factors, alpha_res sharing). A dash is a value no "
             "run file holds. CORE is on the paper's scale (x100).",
             "## Runs", runs_table(runs), corpus_lines(runs)]
    if missing or notes:
        lines = [f"- not found: `{r.path}`" for r in missing] + [f"- {n}" for n in notes]
        parts += ["Missing:", "\n".join(lines)]

    for depth in depths:
        main = main_table(runs, depth)
        if main is None:
            continue
        group = sorted((r for r in found if r.depth == depth and is_main(r)), key=method_order)
        placed |= {r.name for r in runs if r.depth == depth and is_main(r)}
        parts += [f"## Main results, D={depth} ({paper.MAIN_TABLE})", main]
        if any(r.metrics for r in group):
            parts.append(f"![loss curves D={depth}]({plot_curves(group, out / f'loss_d{depth}.png', f'D={depth}').name})")
            ref = select_reference(group, reference)
            if ref is not None and len(group) > 1:
                gap = plot_gap(group, ref, out / f"loss_gap_d{depth}.png", f"D={depth}: gap to {ref.name} (Figure 4 style)")
                parts.append(f"![loss gap D={depth}]({gap.name})")
            elif ref is None:
                parts.append(f"- No loss-gap figure at D={depth}: no run named or of variant '{reference}' with metrics.")
            grads = plot_grad_norms(group, out / f"grad_norm_d{depth}.png", f"D={depth} ({paper.GRAD_FULL_FIGURE} style)")
            parts.append(f"![gradient norms D={depth}]({grads.name})")
            hc_group = [r for r in group if r.variant != "residual" and series(r, "train", "grad_norm")[0]]
            if hc_group:
                tail = plot_grad_tail(hc_group, out / f"grad_norm_tail_d{depth}.png",
                                      f"D={depth}, last 2/7 of training ({paper.GRAD_ZOOM_FIGURE} style)")
                parts.append(f"![gradient norm tail D={depth}]({tail.name})")
            if depth == paper.STABILITY_DEPTH:
                parts.append(f"- Paper ({paper.GRAD_ZOOM_FIGURE}, {paper.GRAD_FULL_FIGURE}): {paper.GRAD_CLAIM}.")

    parts.append(f"## CORE tasks ({paper.COMMONSENSE_TABLE}, {paper.LANGUAGE_TABLE})")
    for depth in depths:
        for title, columns, table in (("Commonsense and reasoning", paper.COMMONSENSE_COLUMNS, paper.COMMONSENSE),
                                      ("Language modeling, BigBench, evaluation suite", paper.LANGUAGE_COLUMNS, paper.LANGUAGE)):
            text = task_table(runs, depth, columns, table)
            if text:
                parts += [f"### {title}, D={depth}", text]

    parts.append(f"## Width of the residual stream ({paper.N_SCALING_TABLE}, {paper.N_SCALING_FIGURE})")
    scaling_depths = sorted(set(depths) | {paper.N_SCALING_DEPTH})
    for depth in scaling_depths:
        text = n_scaling_table(runs, depth)
        if text is None:
            continue
        group = [r for r in runs if r.depth == depth and r.variant == "kromhc" and r.alpha_shared and r.n
                 and is_default_factors(r.factors, r.n)]
        placed |= {r.name for r in group}
        parts += [f"### D={depth}", text]
        base = next((r for r in group if r.n == paper.PAPER_STREAMS and r.metrics), None)
        if base is not None and any(r.metrics and r.n != base.n for r in group):
            path = plot_gap(sorted((r for r in group if r.metrics), key=lambda r: r.n), base,
                            out / f"n_scaling_gap_d{depth}.png", f"KromHC width, D={depth}: gap to n=4 (Figure 4 style)")
            parts.append(f"![n scaling D={depth}]({path.name})")

    parts += ["## Ablations", f"### alpha_res shared or per factor ({paper.ALPHA_FIGURE})", alpha_table(runs)]
    placed |= {r.name for r in runs if r.variant == "kromhc" and not r.alpha_shared}
    for r in [r for r in found if r.variant == "kromhc" and not r.alpha_shared and r.metrics]:
        shared = [s for s in found if s.variant == "kromhc" and s.alpha_shared and s.depth == r.depth
                  and s.n == r.n and _same_factors(s, r) and s.metrics]
        if shared:
            path = plot_gap([shared[0], r], shared[0], out / f"alpha_gap_{r.name}.png", f"{r.name} vs {shared[0].name}")
            parts.append(f"![alpha ablation {r.name}]({path.name})")
    parts += [f"### Factorization ({paper.FACTORIZATION_SECTION})", factorization_table(runs)]
    placed |= {r.name for r in runs if r.variant == "kromhc" and r.alpha_shared and r.factors is not None}
    parts += ["### H_res = I (not in the paper)", identity_table(runs)]
    placed |= {r.name for r in runs if r.variant == "hc_identity"}

    stab = stability_table(runs)
    parts += [f"## Stability of the composite residual map ({paper.STABILITY_FIGURE})", stab or "No HC run."]

    parts.append(f"## System metrics ({paper.SYSTEM_TABLE})")
    for depth in depths:
        text = system_table(runs, depth)
        if text:
            parts += [f"### D={depth}", text]

    parts += [f"## Parameters per HC layer against n ({paper.PARAMS_VS_N_FIGURE})",
              f"C = {paper.PARAMS_VS_N_C}, KromHC factors all 2, with the RMSNorm weight "
              "(`nanochat.connections.diagnostics.hc_layer_params`).",
              params_vs_n_table(), f"![params vs n]({plot_params_vs_n(out / 'params_vs_n.png').name})"]

    other = other_runs_table(runs, placed)
    if other:
        parts += ["## Other runs", other]
    parts += ["## Fidelity notes", fidelity_notes(runs)]
    parts += ["## The paper's numbers", paper_reference()]
    readme = out / "README.md"
    readme.write_text("\n\n".join(parts) + "\n")
    return readme
