"""Reading run directories, the values the report's tables show, matching runs to the
paper's rows, and grouping runs that differ only in their seeds.

A run matches a paper row when depth, variant, number of streams n, KromHC factorization
(as a multiset; unset means the default, all 2s for the paper's powers of two) and the
alpha_res sharing agree. Training length is not part of the match; the tables show it.
"""

import fnmatch
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from nanochat import connections, trunks
from nanochat.connections.collapse import MEASURE_VERSION
from nanochat.report import paper
from nanochat.report.format import MISSING, fmt
from nanochat.train_config import FLAG_DEFAULTS, RESUMABLE_CHANGES

# The options beyond the paper (connections/frame.py, hc_layer.py): config key -> label of each
# non-default choice. A run with none of them is in the paper's configuration.
OPTION_LABELS = {"hc_expand": {"lss": "LSS"}, "hc_reduce": {"learned": "learned head"},
                 "hc_pre": {"delayed": "delayed pre"}}


# What the report needs to know of a variant comes from its SPEC (nanochat/connections); a
# name this version does not register (an old run's) counts as a stream variant with H_res,
# outside the paper.
def single_state(variant):
    """n = 1 whatever a config says, no stream measures."""
    return variant in connections.VARIANTS and not connections.spec(variant).streams


def has_h_res(variant):
    """Whether the doubly-stochastic measures apply (a variant without H_res has none)."""
    return variant not in connections.VARIANTS or connections.spec(variant).has_h_res


def beyond_paper_variant(variant):
    """A variant from the work after the paper: its runs, like the options', go to "Beyond the paper"."""
    if variant is None:  # a run not found, its config unknown
        return False
    return variant not in connections.VARIANTS or connections.spec(variant).beyond_paper

RUN_FILES = ("config.toml", "metrics.jsonl", "summary.json", "core.json", "hc_stats.json", "failed.json",
             "lm_eval.json")
# Settings in which runs of one row may differ: their seeds, their names, and what never
# changes the weights' trajectory.
SEED_SETTINGS = {"seed", "data_seed", "model_tag"} | RESUMABLE_CHANGES
DEFAULT_SEEDS = (42, -1)  # base_train's --seed and --data-seed defaults


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
    failure: dict | None = None  # failed.json: what speedrun recorded when a step of this run failed
    corpus: dict | None = None  # corpus.json: what base_train says the run trained on
    lm_eval: dict | None = None  # lm_eval.json: lm-evaluation-harness results (scripts.lm_eval)

    def _get(self, key, default=None):
        if self.summary and self.summary.get(key) is not None:
            return self.summary[key]
        return self.config.get(key, default)

    @property
    def depth(self):
        return self._get("depth")

    @property
    def trunk(self):
        """The trunk it trained on (config.toml's `trunk`); a run recorded before the field existed ran
        on the default one."""
        return self._get("trunk", trunks.DEFAULT)

    @property
    def variant(self):
        """The connection variant; base_train's default (residual) when a config omits it, None
        for a run that was not found and whose config is unknown."""
        return self._get("hc", "residual" if (self.config or self.summary) else None)

    @property
    def n(self):
        if single_state(self.variant):
            return 1
        n = self._get("hc_streams")
        # hc_streams = 0 in a config means the variant's default, 4 (nanochat/train_config.py).
        return paper.PAPER_STREAMS if n == 0 else n

    @property
    def factors(self):
        """KromHC factors as given (None when unset, i.e. the default factorization)."""
        return parse_factors(self._get("hc_factors")) if self.variant == "kromhc" else None

    @property
    def options(self):
        """Labels of the options beyond the paper this run uses (empty: the paper's configuration)."""
        labels = []
        for key, names in OPTION_LABELS.items():
            value = self._get(key, FLAG_DEFAULTS[key])
            if value != FLAG_DEFAULTS[key]:
                labels.append(names.get(value, f"{key} {value}"))
        lss_init = self._get("hc_lss_init", FLAG_DEFAULTS["hc_lss_init"])
        if self._get("hc_expand") == "lss" and lss_init != FLAG_DEFAULTS["hc_lss_init"]:
            labels[0] += f" init {lss_init}"
        return tuple(labels)

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
        if self.failure:
            return f"failed ({self.failure.get('stage', '?')}): {self.failure.get('reason', 'no reason logged')}"
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
        failure=_read_json(path / "failed.json"),
        corpus=_read_json(path / "corpus.json"),
        lm_eval=_read_json(path / "lm_eval.json"),
    )


def discover_runs(root):
    """Every sub-directory of `root` that holds a run file, sorted by name."""
    root = Path(root)
    if not root.is_dir():
        raise SystemExit(f"runs root {root} does not exist: train first, or pass --runs DIR ...")
    return sorted(p for p in root.iterdir() if p.is_dir() and any((p / f).is_file() for f in RUN_FILES))


def select_runs(runs_root, pattern):
    """The run directories under `runs_root` (default: the base dir's runs/) whose names match the
    glob `pattern`, for the study scripts (scripts.compare, scripts.isoflop): one error line when
    the root is missing or nothing matches."""
    if runs_root:
        root = Path(runs_root)
    else:
        from nanochat.common import base_dir
        root = Path(base_dir()) / "runs"
    if not root.is_dir():
        raise SystemExit(f"error: runs root {root} does not exist: train first, or pass --runs-root DIR")
    dirs = [d for d in discover_runs(root) if fnmatch.fnmatch(d.name, pattern)]
    if not dirs:
        raise SystemExit(f"error: no run directory under {root} matches --select {pattern!r}")
    return dirs


def by_trunk(runs):
    """{trunk: its runs}, the trunks in nanochat/trunks.py's order (an unknown name last): no table,
    ratio or compute multiplier reads runs of two trunks together."""
    order = {t: i for i, t in enumerate(trunks.TRUNKS)}
    groups = {}
    for r in runs:
        groups.setdefault(r.trunk, []).append(r)
    return dict(sorted(groups.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))


def one_trunk(runs, trunk=None):
    """The runs of `trunk`, or with none given all of them when they share one trunk; else
    ValueError saying which trunks are mixed."""
    groups = by_trunk(runs)
    if trunk is not None:
        if trunk not in groups:
            raise ValueError(f"no run of trunk {trunk} (the runs are on {', '.join(groups) or 'none'})")
        return groups[trunk]
    if len(groups) > 1:
        listed = "; ".join(f"{t}: {', '.join(r.name for r in members[:3])}{' ...' if len(members) > 3 else ''}"
                           for t, members in groups.items())
        raise ValueError(f"runs of {len(groups)} trunks ({listed}): a trunk changes the model, the data and "
                         "the schedule, so their runs do not compare")
    return runs


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


def current_collapse(stats):
    """Whether a diagnostics dict holds this version's stream-collapse measures
    (connections/collapse.py MEASURE_VERSION; a dict without the key holds version 1's)."""
    return stats.get("collapse_version", 1) == MEASURE_VERSION


def collapse_stats(run):
    """(stability's dict, source) when it holds this version's collapse measures, else
    (None, source): an older hc_stats.json or training log measured effective streams otherwise
    under the same key, and a report does not put the two side by side (stale_collapse_line)."""
    stats, source = stability(run)
    return (stats, source) if stats is None or current_collapse(stats) else (None, source)


def stale_collapse_line(runs):
    """The one line naming the runs whose collapse measures are of an earlier version (left out
    of the columns that show them), or None."""
    stale = [r.name for r in runs if stability(r)[0] is not None and not current_collapse(stability(r)[0])]
    if not stale:
        return None
    return (f"Not shown: the stream-collapse measures of {', '.join(stale)}, from before version {MEASURE_VERSION} "
            "of connections/collapse.py (effective streams then counted the streams' energies, n copies as n "
            "streams, under the same key): `python -m scripts.hc_report --checkpoint RUN` measures them again.")


# ------------------------------------------------------------------------------------------
# Matching runs to the paper's rows

def is_default_factors(factors, n):
    """True for an unset factorization or one of all 2s (the paper's choice for n = 2^K)."""
    return factors is None or (set(factors) == {2} and 2 ** len(factors) == n)


def beyond_paper(run):
    """A run of what the field adopted after the paper: an option beyond it, or a variant
    outside its family (those have their own section of the report)."""
    return bool(run.options) or beyond_paper_variant(run.variant)


def is_main(run):
    """A run of the main comparison: n = 4 (or residual), KromHC 2x2 with shared alpha, none
    of the options beyond the paper."""
    if run.variant is None or beyond_paper(run):
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
    label = connections.label(run.variant)
    if run.variant == "residual":
        return label
    extras = []
    if run.n != paper.PAPER_STREAMS and not single_state(run.variant):
        symbol = connections.spec(run.variant).stream_symbol if run.variant in connections.VARIANTS else "n"
        extras.append(f"{symbol}={fmt(run.n, 'd')}")
    if run.variant == "go_mhc" and run._get("hc_go_s", FLAG_DEFAULTS["hc_go_s"]) != FLAG_DEFAULTS["hc_go_s"]:
        extras.append(f"s={run._get('hc_go_s')}")
    if run.variant == "attnres" and run._get("attnres_block_size") == 1:
        extras.append("Full")
    if run.variant == "kromhc":
        if not is_default_factors(run.factors, run.n):
            extras.append("x".join(map(str, run.factors)))
        if not run.alpha_shared:
            extras.append("alpha per factor")
    extras += run.options
    return f"{label} ({', '.join(extras)})" if extras else label


def method_order(run):
    order = list(connections.VARIANTS)
    return (order.index(run.variant) if run.variant in order else len(order), run.n or 0, run.name)


# ------------------------------------------------------------------------------------------
# Runs that differ only in their seeds

def seeds_of(run):
    """(init seed, data-order seed) of a run, base_train's defaults where its config omits them."""
    return (run.config.get("seed", DEFAULT_SEEDS[0]), run.config.get("data_seed", DEFAULT_SEEDS[1]))


def seed_groups(runs):
    """{name of the first run of a row: the runs of that row, by seed}: runs with the same
    settings but for their seeds share a row; a run whose settings are unknown is alone."""
    # A run saved before a setting existed ran at its default: fill it in, so that a seed-0 run
    # finished long ago still shares a row with the seeds trained after it.
    by_key = {}
    for r in runs:
        key = (tuple(sorted((k, repr(v)) for k, v in {**FLAG_DEFAULTS, **r.config}.items() if k not in SEED_SETTINGS))
               if r.found and r.config else ("run", r.name))
        by_key.setdefault(key, []).append(r)
    groups = {}
    for members in by_key.values():
        members.sort(key=lambda r: (seeds_of(r), r.name))
        groups[members[0].name] = members
    return groups
