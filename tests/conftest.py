"""Fixtures for the whole suite, built once per session: real text in shard format and a
small tokenizer trained on it.

offline_corpus_dir  the offline corpus (Python's own documentation, ~4.5 MB)
small_corpus_dir    ~300 of its documents in many small shards and row groups (16 docs
                    each), so that loaders cross files and epochs within a few batches
tokenizer_dir       a 512-token BPE trained on the offline corpus (with token_bytes.pt)
make_run            writes a run directory with the checkpoint of a tiny GPT (any config)

`--quick` (bash scripts/test.sh --quick) runs the quick tier, QUICK below, instead of the suite;
`--floor` the floor tier, FLOOR below (CI's run on the lowest torch); `--references` the
reference tier, REFERENCES below (CI's runs under other CPU capabilities). docs/tests.md.
"""

import atexit
import os
import shutil
import tempfile

# Triton's interpreter, so that the fused-kernel tests (test_liger.py) run Liger's Triton
# kernels on CPU tensors. It must be set before triton is first imported (torch._dynamo
# imports it; triton.language defines its own jit helpers at import), hence here, before
# any test module. The suite is CPU-only: nothing else runs Triton.
os.environ["TRITON_INTERPRET"] = "1"
# Hugging Face's libraries (datasets, transformers, lm-eval) read these once, when first
# imported, whichever test module imports them first: no test may reach the Hub, and their
# caches (datasets' lock files and arrow files, transformers' remote-code modules) go to a
# directory of the session's own.
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="nanochat_hf_home_")
atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)

# The test suite's own wiring, Static HC (tests/wirings/static_hc.py: docs/connections.md's
# second worked example), registered from outside the package as a user's would be, before
# nanochat.connections is first imported: every shared check that iterates over the registry
# runs on it too, in this process and in the commands the tests start. Appended to what the
# variable already names, so that a user's wiring goes through the same checks
# (docs/connections.md, "A wiring outside the package").
STATIC_HC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wirings", "static_hc.py")
_named = [path for path in os.environ.get("NANOCHAT_WIRINGS", "").split(os.pathsep) if path]
os.environ["NANOCHAT_WIRINGS"] = os.pathsep.join(_named + ([STATIC_HC] if STATIC_HC not in _named else []))

import pytest  # noqa: E402


def _cache_interpreter_patches():
    """Triton's interpreter patches triton.language's builtins before every kernel launch, and
    again before every call of a @triton.jit helper inside the kernel, finding them each time
    with inspect.getmembers over the language's modules: over a third of a small kernel's run
    in the interpreter. Two shortcuts that change nothing the kernels compute: which members
    are builtins is looked up once per module (each launch restores what it patched, so the
    list is the same every time), and a helper's call inside a launch that already patched
    its language modules patches nothing more. Ours, because the interpreter is only a test
    harness here (no GPU code path changes)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    if not all(hasattr(interpreter, name) for name in ("_patch_builtin", "_patch_attr", "_patch_lang",
                                                       "_LangPatchScope")):
        return
    tl, inspect = interpreter.tl, interpreter.inspect
    found, active = {}, set()

    def patch_builtin(pkg, builder, scope):
        if pkg not in found:
            found[pkg] = [(name, member) for name, member in inspect.getmembers(pkg) if tl.core.is_builtin(member)]
        for name, member in found[pkg]:
            interpreter._patch_attr(pkg, name, member, builder, scope)

    patch_lang_once = interpreter._patch_lang

    def patch_lang(fn):
        langs = {id(value) for value in fn.__globals__.values() if inspect.ismodule(value) and value in (tl, tl.core)}
        if langs and langs <= active:
            return interpreter._LangPatchScope()
        scope = patch_lang_once(fn)
        active.update(langs)
        restore = scope.restore

        def restore_and_forget():
            active.clear()
            restore()

        scope.restore = restore_and_forget
        return scope

    interpreter._patch_builtin = patch_builtin
    interpreter._patch_lang = patch_lang


_cache_interpreter_patches()

from nanochat.data.local import build_offline_corpus, write_corpus  # noqa: E402
from nanochat.data.shards import parquets_iter_batched  # noqa: E402
from nanochat.tokenizer import Tokenizer  # noqa: E402


# The quick tier: what a contributor runs before pushing, under 2 minutes on 2 cores; the full
# suite stays the gate (CI). File name -> the tests of it to run: None for all of them but the
# slow ones (subprocesses), or a list of names (a name with its parameters in brackets picks
# that case, a bare name every case; slow ones included when named). One real training through
# the command a user runs, and the fast unit tests of the core it rests on.
QUICK = {
    # base_train end to end (data, tokenizer, model, optimizer, diagnostics, checkpoint,
    # summary) on the wiring the project is about
    "test_train_e2e.py": ["test_each_kind_of_connection_trains_and_writes_its_run[kromhc]"],
    "test_gpt.py": None,
    "test_optim.py": None,
    "test_connections.py": None,  # the HC family's math against the references
    # the variant contract on the baseline and on KromHC, without the run-directory checks
    # (those train a tokenizer first)
    "test_variant_contract.py": [f"{test}[{name}]" for name in ("residual", "kromhc") for test in (
        "test_spec_describes_the_model_it_builds", "test_equals_prenorm_at_init_exactly_when_its_spec_says_so",
        "test_its_shared_fields_are_the_frames_fields_that_shape_it")]
        + ["test_every_connection_parameter_learns_but_what_its_wiring_declares_dead[kromhc]",
           "test_a_spec_missing_a_key_is_named", "test_a_module_without_spec_is_named"],
    "test_collapse.py": None,
    "test_train_config.py": None,
    "test_cli_errors.py": None,  # parse-time errors of every CLI; its runtime mistakes are slow
}

# The floor tier: what CI runs again on the lowest torch pyproject.toml allows (.ci/run), where an
# API differs across the supported range: the quick tier, and every file that reaches what moves
# between torch releases (torch.compile and its graphs, custom ops and their registrations,
# AOTAutograd's partition the memory planner traces, FlexAttention, torch.distributed, float8,
# Triton through the kernel backends). Files whose code only calls the stable tensor API are
# run on the pin alone.
FLOOR = QUICK | {name: None for name in (
    "test_attention.py", "test_compile_modes.py", "test_compiled_connections.py", "test_connections_fastpath.py",
    "test_custom_ops.py", "test_engine.py", "test_fp8.py", "test_fused.py", "test_liger.py", "test_memory.py",
    "test_optim_2026.py", "test_trunk.py", "test_hc_options.py", "test_loss_eval.py",
    # the CUDA dry run: on the floor its setup and TF32 tests (its fake CUDA tensors need 2.10+)
    "test_cuda_dryrun.py", "test_cuda_setup.py", "test_cuda_tf32.py")}
# The reference tier: every test that holds our code to values computed elsewhere (nanochat
# 92d63d4's own code, stored under tests/goldens/), which CI runs again under each CPU
# capability it can stand in for (ATEN_CPU_CAPABILITY=default, avx2: .ci/run), so that a stored
# value that only holds on the CPU it was made on fails there and not on a user's machine.
REFERENCES = {name: None for name in ("test_trunk_2026_07.py", "test_optim_2026.py", "test_dataloader_2026.py")}
TIERS = {"quick": QUICK, "floor": FLOOR, "references": REFERENCES}

# The files that take longest, first: pytest-xdist hands whole files (--dist loadfile) to its
# workers in collection order, so a long file started last would leave one worker idle at the
# end while it runs alone (measured with --durations=0, docs/tests.md).
LONGEST_FIRST = ("test_fused.py", "test_train_e2e.py", "test_train_cluster.py", "test_gpu_check.py",
                 "test_speedrun.py", "test_memory.py", "test_variant_contract.py", "test_hf_export.py",
                 "test_engine.py", "test_core_eval.py", "test_speedrun_study.py", "test_liger.py")


def tier(config):
    """The tier a run selects (TIERS), or None for the whole suite."""
    return next((TIERS[name] for name in TIERS if config.getoption(name)), None)


def pytest_addoption(parser):
    parser.addoption("--quick", action="store_true",
                     help="run the quick tier (tests/conftest.py QUICK), not the whole suite")
    parser.addoption("--floor", action="store_true",
                     help="run the floor tier (tests/conftest.py FLOOR: CI's run on the lowest torch)")
    parser.addoption("--references", action="store_true",
                     help="run the reference tier (tests/conftest.py REFERENCES: CI's runs under other CPU capabilities)")


def pytest_ignore_collect(collection_path, config):
    """Under a tier, the files outside it are not even imported: collecting the whole suite
    alone takes about 20 s per worker."""
    selected = tier(config)
    if selected is not None and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return collection_path.name not in selected
    return None


def pytest_collection_modifyitems(config, items):
    """Under a tier, keep its tests and deselect the rest. A file or a name in the tier that
    no longer exists is an error, so that the tier cannot shrink unnoticed."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    selected = tier(config)
    if selected is None:
        return
    kept, dropped, matched = [], [], set()
    for item in items:
        hit = quick_match(item, selected.get(item.path.name, ()))
        (kept if hit else dropped).append(item)
        matched.add((item.path.name, hit))
    collected = {item.path.name for item in items}
    here = os.path.dirname(os.path.abspath(__file__))
    stale = [file for file in selected if not os.path.exists(os.path.join(here, file))]
    stale += [f"{file}::{name}" for file, names in selected.items() if names and file in collected
              for name in names if (file, name) not in matched]
    if stale:
        kept.append(StaleQuickNames.from_parent(items[0].session, name="QUICK", stale=stale))
    items[:] = kept
    if dropped:
        config.hook.pytest_deselected(items=dropped)


class StaleQuickNames(pytest.Item):
    """A failing test for the names in QUICK that match nothing: an error raised at collection
    is lost under pytest-xdist (its workers collect), a failed test is reported like any other."""

    def __init__(self, *, stale, **kwargs):
        super().__init__(**kwargs)
        self.stale = stale

    def runtest(self):
        raise AssertionError(f"the tier (QUICK, FLOOR in tests/conftest.py) names what does not exist: "
                             f"{', '.join(self.stale)}")

    def reportinfo(self):
        return self.path, None, self.name


def quick_match(item, names):
    """The QUICK name that selects `item`, True when its file is listed whole (and it is not
    slow), or None."""
    if names is None:
        return None if item.get_closest_marker("slow") else True
    return next((name for name in names if name in (item.name, item.originalname)), None)


def built_once(tmp_path_factory, name, build):
    """A directory `name` that `build(directory)` fills, built once per test run: under
    pytest-xdist the workers share it (the first builds it under a lock, the others wait and
    read it), where each used to build its own."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # this run's directory, above the workers' own
    directory = base / f"shared_{name}"
    with FileLock(str(directory) + ".lock"):
        if not (directory / ".built").exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            build(str(directory))
            (directory / ".built").touch()
    return str(directory)


@pytest.fixture(scope="session")
def offline_corpus_dir(tmp_path_factory):
    return built_once(tmp_path_factory, "offline_corpus", build_offline_corpus)


@pytest.fixture(scope="session")
def small_corpus_dir(tmp_path_factory, offline_corpus_dir):
    def build(directory):
        docs = [d for batch in parquets_iter_batched("val", data_dir=offline_corpus_dir) for d in batch][:300]
        write_corpus(docs, directory, {"source": "offline", "subset": "small"}, rows_per_group=16,
                     shard_chars=60_000)
    return built_once(tmp_path_factory, "small_corpus", build)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, offline_corpus_dir):
    def build(directory):
        texts = (d for batch in parquets_iter_batched("train", data_dir=offline_corpus_dir) for d in batch)
        Tokenizer.train_from_iterator(texts, 512).save(directory)
    return built_once(tmp_path_factory, "tokenizer", build)


@pytest.fixture(scope="module")
def base_with_tokenizer(tmp_path_factory, tokenizer_dir):
    """A base directory holding the tests' tokenizer, set as NANOCHAT_BASE_DIR for the module
    (what an export reads its tokenizer from)."""
    path = tmp_path_factory.mktemp("base")
    shutil.copytree(tokenizer_dir, path / "tokenizer")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NANOCHAT_BASE_DIR", str(path))
        yield path


@pytest.fixture(scope="session")
def make_run():
    """A factory: make_run(run_dir, **config) writes what base_train leaves in a run directory
    (the checkpoint of step 10 of a tiny GPT, config.toml, summary.json, corpus.json, core.json)
    and returns the model. Every parameter is moved off its initialization (where the output
    projections and the connection weights are zero), so that each part of the model shapes
    the logits."""
    import dataclasses
    import json

    from test_gpt import randomize

    from nanochat import checkpoint_manager as checkpoint
    from nanochat.gpt import GPTConfig, build_model

    def make(run_dir, seed=0, **config):
        config = GPTConfig(**{"sequence_len": 32, "vocab_size": 512, "n_layer": 2, "n_head": 2, "n_kv_head": 2,
                              "n_embd": 64, **config})
        model = randomize(build_model(config, "cpu"), seed)
        step, tokens_per_step = 10, 1024
        settings = {"depth": config.n_layer, "max_seq_len": config.sequence_len, "hc": config.hc,
                    "total_batch_size": tokens_per_step, "seed": seed}
        meta = {"step": step, "model_config": dataclasses.asdict(config), "settings": settings, "world_size": 1}
        checkpoint.save_rank_files(run_dir, step, 0, {}, model_state=model.state_dict(), meta=meta)
        checkpoint.mark_latest(run_dir, step)
        files = {
            "config.toml": "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()),
            "summary.json": {"complete": True, "step": step, "train_loss_smooth": 5.25, "val_bpb": 1.875,
                             "core_metric": 0.0625, "hc": config.hc, "hc_streams": config.hc_streams,
                             "hc_factors": config.hc_factors, "depth": config.n_layer},
            "corpus.json": {"description": "a test corpus of 3 documents", "marker": {"source": "text"}},
            "core.json": {"core_metric": 0.0625, "tasks": {"copa": {"type": "multiple_choice", "shots": 0,
                                                                    "examples": 16, "accuracy": 0.5625,
                                                                    "centered": 0.125}}},
        }
        for name, content in files.items():
            text = content if isinstance(content, str) else json.dumps(content)
            checkpoint.atomic_write(os.path.join(run_dir, name), text)
        model.eval()
        return model

    return make
