"""The experiment configs (configs/**.toml): flat TOML with known keys only, a header that
names the paper table or figure each feeds, the paper's hyper-parameters, the runs the
paper's tables need, and a CPU demo that covers every variant."""

import re
import tomllib
from pathlib import Path

import pytest

from nanochat import connections
from nanochat.connections.residual import RESID_LR_FRACTION
from nanochat.report import paper
from nanochat.report.runs import Run, beyond_paper, paper_key
from nanochat.train_config import FLAG_NAMES

CONFIG_ROOT = Path(__file__).resolve().parent.parent / "configs"
GROUPS = ("paper", "n_scaling", "ablations", "cpu", "frontier", "gpt2")

# The config keys: base_train flags with underscores.
KNOWN_KEYS = set(FLAG_NAMES)
VARIANTS = set(connections.VARIANTS)
# The paper's rows and the project's ablations of them (the cpu demo's variants).
PAPER_FAMILY = {name for name, spec in connections.specs().items() if not spec.beyond_paper}
# A paper reference in a header: "Table 3 (tab:loss)", "Figures 5 and 8 (fig:...", or the
# appendix section that has neither.
CITATION = re.compile(r"(Tables?|Figures?) \d+[^()]*\((tab|fig):|Appendix \"Factorization Choices\"|"
                      r"appendix \"Factorization Choices\"")


def config_files(group=None):
    """Every config file, or those of one group (a sub-directory of configs/), sorted."""
    root = CONFIG_ROOT / group if group else CONFIG_ROOT
    return sorted(root.rglob("*.toml"))


def load(path):
    return tomllib.loads(path.read_text())


def header(path):
    """The comment block at the top of the file, without the '#' marks."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def as_run(path):
    return Run(name=path.stem, path=path, found=False, config=load(path))


def test_every_group_has_configs():
    for group in GROUPS:
        assert config_files(group), f"configs/{group}/ is empty"
    assert set(config_files()) == {p for g in GROUPS for p in config_files(g)}, "a config outside the groups"


@pytest.mark.parametrize("path", config_files(), ids=lambda p: str(p.relative_to(CONFIG_ROOT)))
def test_config_is_flat_known_and_cited(path):
    config = load(path)
    unknown = set(config) - KNOWN_KEYS
    assert not unknown, f"unknown keys {sorted(unknown)}"
    for key, value in config.items():
        assert not isinstance(value, dict), f"{key} is a table; configs are flat"
        if isinstance(value, list):
            assert all(isinstance(v, int) for v in value), key
    assert config["hc"] in VARIANTS
    assert re.fullmatch(r"[a-z0-9_]+", config["model_tag"])
    if path.parent.name == "frontier":  # not in the paper: its report section and its source instead
        assert "Beyond the paper" in header(path) and re.search(r"arXiv \d{4}\.\d{5}|DeepSeek-V4", header(path))
    elif path.parent.name == "gpt2":  # nanochat's record run, on the trunk that trains it
        assert "nanochat 92d63d4" in header(path) and config["trunk"] == "2026-07"
    else:
        assert CITATION.search(header(path)), f"the header of {path.name} names no table or figure"


def test_shared_model_tags_mean_identical_runs():
    """One run may feed several tables under several configs; then the settings must agree,
    or resuming the shared run directory would mix two experiments."""
    by_tag = {}
    for path in config_files():
        by_tag.setdefault(load(path)["model_tag"], []).append(path)
    for tag, paths in by_tag.items():
        first = load(paths[0])
        for other in paths[1:]:
            assert load(other) == first, f"{paths[0].name} and {other.name} share model_tag {tag} but differ"


@pytest.mark.parametrize("path", config_files("paper") + config_files("n_scaling") + config_files("ablations"),
                         ids=lambda p: str(p.relative_to(CONFIG_ROOT)))
def test_paper_hyperparameters(path):
    """Tables 7-8 (tab:hyperparams, tab:scale_specific_hyperparams) and nanochat's SSSL windows."""
    config = load(path)
    for key in ("total_batch_size", "max_seq_len", "head_dim", "warmdown_ratio", "matrix_lr", "weight_decay"):
        assert config[key] == paper.HYPERPARAMS[key], key
    # The paper's "LR for residual connections": every HC parameter, or nanochat's resid scalar
    # (scalar_lr * 0.01; x0 trains at scalar_lr itself, which the paper does not list).
    if config["hc"] == "residual":
        assert "hc_lr" not in config and config["scalar_lr"] == 0.5
        assert config["scalar_lr"] * RESID_LR_FRACTION == paper.HYPERPARAMS["hc_lr"]
    else:
        assert config["hc_lr"] == paper.HYPERPARAMS["hc_lr"] and "scalar_lr" not in config
    scale = paper.SCALE_HYPERPARAMS[config["depth"]]
    assert config["num_iterations"] == scale["num_iterations"]
    assert config["depth"] * config["aspect_ratio"] == scale["model_dim"]
    assert (config["warmup_ratio"], config["final_lr_frac"], config["window_pattern"]) == (0.0, 0.0, "SSSL")
    # The paper prints nanochat's width-scaled AdamW LRs (0.424 -> "0.43" at D=6).
    width_scale = (scale["model_dim"] / 768) ** -0.5
    for key in ("embedding_lr", "unembedding_lr"):
        assert abs(config[key] * width_scale / scale[key] - 1) < 0.02, key
    # The total batch must split evenly into micro-batches on 1, 2, 4 or 8 GPUs.
    for world in (1, 2, 4, 8):
        assert config["total_batch_size"] % (config["device_batch_size"] * config["max_seq_len"] * world) == 0


def test_d6_configs_document_the_weight_decay_choice():
    for path in config_files("paper"):
        if load(path)["depth"] == 6:
            assert "(12/depth)^2" in header(path) or "(12/depth)^2" in path.read_text(), path.name
            assert "0.8" in path.read_text(), path.name


def test_paper_configs_match_the_paper_rows():
    """Each paper config is a row of Tables 3-5 by the report's own matching (HC is our extra row)."""
    keys = {paper_key(as_run(p)) for p in config_files("paper")}
    assert keys - {None} == set(paper.MAIN)
    assert {load(p)["hc"] for p in config_files("paper") if paper_key(as_run(p)) is None} == {"hc"}
    tags = {load(p)["model_tag"] for p in config_files("paper")}
    assert len(tags) == len(config_files("paper")) == 2 * len(paper.PAPER_METHODS + ("hc",))


def test_n_scaling_and_ablation_configs():
    scaling = {load(p)["hc_streams"]: as_run(p) for p in config_files("n_scaling")}
    assert set(scaling) == set(paper.N_SCALING_DELTA_PARAMS_M)
    for n, run in scaling.items():
        assert run.variant == "kromhc" and run.depth == paper.N_SCALING_DEPTH and run.alpha_shared
        assert run.factors == paper.N_SCALING_FACTORS[n]
    ablations = [as_run(p) for p in config_files("ablations")]
    factorizations = {r.factors for r in ablations if r.variant == "kromhc" and r.n == paper.FACTORIZATION_STREAMS}
    assert factorizations == set(paper.FACTORIZATION_COMPARED)
    alphas = {r.alpha_shared for r in ablations if r.variant == "kromhc" and r.n == paper.ALPHA_STREAMS}
    assert alphas == {True, False}
    assert {r.depth for r in ablations} == {paper.ALPHA_DEPTH}
    assert any(r.variant == "hc_identity" for r in ablations)


def test_frontier_configs_are_the_paper_run_of_their_variant_plus_one_option():
    """Each frontier config differs from the paper's D=12 config of its variant only in the
    options beyond the paper (and its tag), so the report's comparison is one change."""
    options = {"hc_expand", "hc_lss_init", "hc_reduce", "hc_pre"}
    seen = set()
    for path in config_files("frontier"):
        config = load(path)
        if config["hc"] not in PAPER_FAMILY:
            continue  # test_frontier_variants_share_the_paper_runs_settings
        base = load(CONFIG_ROOT / "paper" / f"d12_{config['hc']}.toml")
        changed = {k for k in set(config) | set(base) if config.get(k) != base.get(k)} - {"model_tag"}
        assert changed and changed <= options, (path.name, changed)
        assert as_run(path).options and paper_key(as_run(path)) is None
        seen |= {(config["hc"], k, config[k]) for k in changed - {"hc_lss_init"}}
    assert seen == {("kromhc", "hc_expand", "lss"), ("mhc_lite", "hc_expand", "lss"), ("kromhc", "hc_reduce", "learned"),
                    ("mhc", "hc_pre", "delayed"), ("kromhc", "hc_pre", "delayed")}


def test_frontier_variants_share_the_paper_runs_settings():
    """Every registered variant beyond the paper (go_mhc, frac, attnres, ...) has a D=12
    frontier config with the paper's D=12 settings (those of its mHC run), differing only in
    the connection (its own fields among them)."""
    connection = {"hc", "hc_streams", "hc_sk_iters", *connections.variant_fields()}
    base = load(CONFIG_ROOT / "paper" / "d12_mhc.toml")
    variants = {}
    for path in config_files("frontier"):
        config = load(path)
        if config["hc"] in PAPER_FAMILY:
            continue
        changed = {k for k in set(config) | set(base) if config.get(k) != base.get(k)} - {"model_tag"}
        assert changed <= connection, (path.name, changed)
        run = as_run(path)
        assert run.options == () and paper_key(run) is None and beyond_paper(run)
        variants[config["hc"]] = config
    assert set(variants) == {name for name, spec in connections.specs().items()
                             if spec.beyond_paper and connections.in_package(name)}
    assert variants["go_mhc"]["hc_streams"] == variants["frac"]["hc_streams"] == 4
    assert variants["attnres"]["attnres_block_size"] == 3  # 24 modules in ~8 blocks, the default at D=12


def test_cpu_demo_configs():
    """Six tiny runs, one per variant, identical but for the connection settings and tag."""
    configs = [load(p) for p in config_files("cpu")]
    assert sorted(c["hc"] for c in configs) == sorted(PAPER_FAMILY)  # the demo need not run the later ones
    conn_keys = {"hc", "hc_streams", "hc_factors", "hc_alpha_shared", "hc_sk_iters", "hc_norm_weight", "model_tag",
                 "hc_lr", "scalar_lr"}
    shared = [{k: v for k, v in c.items() if k not in conn_keys} for c in configs]
    assert all(s == shared[0] for s in shared), "cpu configs differ beyond the connection settings"
    c = shared[0]
    assert c["device_type"] == "cpu"
    assert c["depth"] <= 4 and c["max_seq_len"] <= 256 and c["vocab_size"] <= 4096 and c["num_iterations"] <= 300
    assert 32 <= c["head_dim"] <= 64
    assert c["total_batch_size"] % (c["device_batch_size"] * c["max_seq_len"]) == 0
    assert c["core_metric_every"] == -1 or c["core_metric_max_per_task"] <= 32
    assert all(cfg.get("hc_streams", 4) == paper.PAPER_STREAMS for cfg in configs if cfg["hc"] != "residual")
    # One connection LR for every HC variant, high enough that H_res leaves its identity init in
    # the demo's few steps (see the configs' comment); the residual scalars at 4x nanochat's, like
    # the model's other LRs.
    by_variant = {cfg["hc"]: cfg for cfg in configs}
    assert len({cfg["hc_lr"] for cfg in configs if cfg["hc"] != "residual"}) == 1
    assert next(cfg["hc_lr"] for cfg in configs if cfg["hc"] != "residual") > 25 * paper.HYPERPARAMS["hc_lr"]
    lr_factor = c["matrix_lr"] / paper.HYPERPARAMS["matrix_lr"]
    assert by_variant["residual"]["scalar_lr"] * RESID_LR_FRACTION == pytest.approx(lr_factor * paper.HYPERPARAMS["hc_lr"])
    assert "hc_lr" not in by_variant["residual"]


@pytest.mark.parametrize("path", config_files(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_config_resolves_through_base_train_and_builds_its_model(path):
    """What `base_train --config PATH` would do before touching data: parse the flags, size
    the model from depth, resolve the connection, build it (on the meta device: no memory),
    and split the batch into micro-steps on 1 and 8 ranks."""
    import torch

    from nanochat.gpt import GPT
    from nanochat.train_config import AUTO, model_config_for, parse_args, resolve_total_batch
    from scripts.base_train import grad_accum_steps

    args = parse_args(["--config", str(path)])
    config = model_config_for(args, args.vocab_size or 32768)
    if args.total_batch_size == AUTO:  # the 2026-07 trunk's, as base_train sizes it
        args.total_batch_size = resolve_total_batch(args, config, args.vocab_size or 32768)[0]
    with torch.device("meta"):
        model = GPT(config)
    assert len(model.connections.layers) == 2 * args.depth
    assert model.connections.n == (args.hc_streams or 4 if connections.spec(args.hc).streams else 1)
    groups = model.param_groups()
    assert not any(g["kind"] == "muon" and g["name"] == "hc" for g in groups)
    for world in ((1,) if args.device_type == "cpu" else (1, 8)):
        assert grad_accum_steps(args.total_batch_size, args.device_batch_size, args.max_seq_len, world) >= 1
