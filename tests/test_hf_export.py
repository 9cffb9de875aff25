"""The Hugging Face export (nanochat/hf, scripts/export.py). For every connection variant of
nanochat.connections.VARIANTS and a few layouts (n and KromHC factorization, value
embeddings off, GQA and a window pattern, the HC options, bf16 weights), a tiny model is
exported and then loaded by transformers in a Python environment that has torch and
transformers but not this project (tests/hf_load_check.py): the same logits (fp32, relative 1e-5) and loss, the
same non-persistent buffers, the same 32-token greedy continuation, batched left-padded
generation equal to one prompt at a time, reproducible sampling, and the tokenizer's ids
equal to ours on a battery of texts. Also: the exported code is the project's own modules
with only their imports rewritten, the assembler's rules, the model card, bad input."""

import ast
import contextlib
import io
import json
import math
import os
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

pytest.importorskip("transformers", reason="needs the eval extra: pip install -e '.[eval]'")

from nanochat import cli, connections  # noqa: E402
from nanochat.connections import VARIANTS  # noqa: E402
from nanochat.interop.hf.assemble import AssemblyError, assemble, check_imports  # noqa: E402
from nanochat.interop.hf.export import ENTRY_MODULES, discovered_modules, export  # noqa: E402
from nanochat.interop.hf.model_card import without_other_wirings  # noqa: E402
from nanochat.tokenizer import Tokenizer  # noqa: E402
from scripts.export import main as export_main  # noqa: E402

HERE = Path(__file__).parent
# Every variant in its default layout, then the layouts that change the model's shape.
CASES = {name: {"hc": name} for name in VARIANTS if connections.in_package(name)} | {
    "kromhc_4x2_alphas": {"hc": "kromhc", "hc_streams": 8, "hc_factors": [4, 2], "hc_alpha_shared": False},
    "mhc_lite_n3_no_value_embeds": {"hc": "mhc_lite", "hc_streams": 3, "value_embeds": False},
    "hc_gqa_windows": {"hc": "hc", "n_layer": 3, "n_head": 4, "n_kv_head": 2, "window_pattern": "SL"},
    "kromhc_lss_learned_head": {"hc": "kromhc", "hc_expand": "lss", "hc_reduce": "learned"},
    "mhc_delayed_pre": {"hc": "mhc", "hc_pre": "delayed"},
}
BF16_CASE = "kromhc_bf16"
BATTERY = [
    "", "Hello, world!", "naïve café, Ünïcödé: 日本語のテキスト, emoji 🙂🚀, עברית", "   leading and trailing   ",
    "tabs\tand\t\tnewlines\n\n\r\n  mixed \n\t ", "digits 0 12 345 6789 3.14159 1e-10 1,000,000",
    "def f(x):\n    return {'a': [x ** 2, x // 3]}  # comment\n\nclass A(B): pass\n",
    "<|bos|>", "a <|bos|> b <|user_start|>hi<|user_end|><|assistant_start|>", "<|bos|<|not special|>",
]
GREEDY_TOKENS, NEW_TOKENS = 16, 6


@pytest.fixture(scope="module")
def base(base_with_tokenizer):
    return base_with_tokenizer


@pytest.fixture(scope="module")
def exported(base, make_run):
    """{case: (export dir, native model)} for every case, plus the bf16 export of kromhc."""
    out = {}
    for case, config in CASES.items():
        model = make_run(base / "runs" / case, **config)
        out[case] = (Path(export(base / "runs" / case, base / "exports" / case)["dir"]), model)
    bf16 = export(base / "runs" / "kromhc", base / "exports" / BF16_CASE, dtype="bfloat16")
    out[BF16_CASE] = (Path(bf16["dir"]), out["kromhc"][1])
    return out


def bare_python(directory):
    """A virtual environment that sees this one's packages (torch, transformers) through a
    .pth line but not the project: directories named in a .pth file are not scanned for .pth
    files themselves, and the project's editable install is one."""
    venv.create(directory, with_pip=False)
    site_packages = next(Path(directory).glob("lib/python*/site-packages"))
    (site_packages / "host_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return Path(directory) / "bin" / "python"


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return Tokenizer.from_directory(tokenizer_dir)


@pytest.fixture(scope="module")
def spec(tokenizer):
    g = torch.Generator().manual_seed(0)
    bos = tokenizer.get_bos_token_id()
    return {"input_ids": torch.randint(0, tokenizer.get_vocab_size(), (2, 40), generator=g).tolist(),
            "prompt": tokenizer.encode("The capital of France is", prepend=bos),
            "prompts": ["Hi", "The opposite of hot is a word that means"], "battery": BATTERY,
            "greedy_tokens": GREEDY_TOKENS, "new_tokens": NEW_TOKENS}


@pytest.fixture(scope="module")
def loaded(exported, spec, tmp_path_factory):
    """What transformers gives, without the project, for every export (one process)."""
    work = tmp_path_factory.mktemp("bare")
    python = bare_python(work / "venv")
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec | {"dirs": [str(d) for d, _ in exported.values()],
                                            "out": str(work / "results.pt")}))
    env = {"PATH": os.environ["PATH"], "HOME": str(work), "HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([str(python), str(HERE / "hf_load_check.py"), str(spec_path)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = torch.load(work / "results.pt", weights_only=False)
    assert results.pop("nanochat_importable") is False, "the bare environment must not see the project"
    return {case: results[str(d)] for case, (d, _) in exported.items()}


def until_end(tokens, end):
    """The tokens up to and including the first `end` (transformers stops there)."""
    return tokens[:tokens.index(end) + 1] if end in tokens else tokens


@pytest.mark.parametrize("case", list(CASES))
def test_transformers_without_the_project_reproduces_the_native_model(case, exported, loaded, spec, tokenizer):
    _, model = exported[case]
    got = loaded[case]
    assert got["class"] == "NanochatHCForCausalLM"
    ids = torch.tensor(spec["input_ids"])
    with torch.no_grad():
        logits = model(ids)
    assert (got["logits"] - logits).abs().max() <= 1e-5 * logits.abs().max()
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    assert math.isclose(got["loss"], loss.item(), rel_tol=1e-5)
    native_buffers = dict(model.named_buffers())
    assert set(got["buffers"]) == {f"model.{name}" for name in native_buffers}
    for name, buf in native_buffers.items():
        assert torch.equal(got["buffers"][f"model.{name}"], buf), name

    bos = tokenizer.get_bos_token_id()
    native = list(model.generate(spec["prompt"], GREEDY_TOKENS, temperature=0))
    assert got["greedy"] == until_end(native, bos)
    # Left-padded rows generate what each prompt generates alone; the first one is padded.
    assert len(set(map(len, (tokenizer.encode(p) for p in spec["prompts"])))) == 2
    for row, alone, text in zip(got["batched"], got["single"], spec["prompts"]):
        assert until_end(row, bos) == alone
        assert alone == until_end(list(model.generate(tokenizer.encode(text, prepend=bos), NEW_TOKENS,
                                                      temperature=0)), bos)
    first, second = got["sampled"]
    assert first == second and all(0 <= t < tokenizer.get_vocab_size() for t in first)


def test_the_tokenizer_gives_our_ids(exported, loaded, tokenizer):
    got = loaded["kromhc"]
    bos = tokenizer.get_bos_token_id()
    assert got["bos_token_id"] == bos and got["padding_side"] == "left"
    for text, (plain, default, decoded) in zip(BATTERY, got["battery"]):
        assert plain == tokenizer.encode(text), text
        assert default == [bos] + tokenizer.encode(text), text
        assert decoded == text


def test_bf16_export_keeps_the_connections_in_fp32(exported, loaded, spec):
    got = loaded[BF16_CASE]
    _, model = exported[BF16_CASE]
    for name, dtype in got["dtypes"].items():
        assert dtype == ("torch.float32" if ".connections." in name else "torch.bfloat16"), name
    with torch.no_grad():
        logits = model(torch.tensor(spec["input_ids"]))
    assert (got["logits"] - logits).abs().max() <= 0.05 * logits.abs().max()


class DropImports(ast.NodeTransformer):
    def __init__(self, which):
        self.which = which

    def visit_ImportFrom(self, node):
        return None if self.which(node) else node


def without_imports(source, which):
    """The module's AST, dumped, without the ImportFrom statements `which` selects."""
    return ast.dump(DropImports(which).visit(ast.parse(source)))


def test_exported_code_is_the_projects_own(exported, tmp_path):
    """Each exported file is a module of the project with its `nanochat` imports made
    relative and nothing else changed; the variants' modules are all there."""
    export_dir, _ = exported["kromhc"]
    files = assemble(ENTRY_MODULES, tmp_path, names=ENTRY_MODULES, discovered=discovered_modules())
    assert sorted(files) == sorted(p.name for p in export_dir.glob("*.py"))
    for name, module in files.items():
        text = (export_dir / name).read_text()
        assert text == (tmp_path / name).read_text()
        source = Path(sys.modules[module].__file__).read_text()
        assert without_imports(text, lambda node: node.level == 1) == \
            without_imports(source, lambda node: node.level == 0 and node.module.split(".")[0] == "nanochat"), name
    exported_modules = set(files.values())
    assert {"nanochat.gpt", *(v.__name__ for name, v in VARIANTS.items() if connections.in_package(name))} \
        <= exported_modules


def test_assembler_rewrites_imports_into_a_loadable_flat_package(tmp_path, monkeypatch):
    src = tmp_path / "src"
    (src / "pkg" / "sub").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "sub" / "__init__.py").write_text("from pkg.sub import leaf\nVALUE = leaf.f(1)\n")
    (src / "pkg" / "sub" / "leaf.py").write_text("def f(x):\n    return x + 1\n")
    (src / "pkg" / "bad.py").write_text("import pkg.sub\n")
    (src / "pkg" / "top.py").write_text(
        "from pkg import sub\n"
        "from pkg.sub import (\n    VALUE,\n    leaf as renamed,\n)\n"
        "from .sub.leaf import f as g\n\n\n"
        "def lazy():\n    from pkg.sub.leaf import f\n    return f(10)\n\n\n"
        "RESULT = (sub.VALUE, VALUE, renamed.f(2), g(3), lazy())\n")
    monkeypatch.syspath_prepend(str(src))
    out = tmp_path / "flat"
    out.mkdir()
    (out / "__init__.py").write_text("")
    files = assemble(["pkg.top"], out, package="pkg")
    assert files == {"top.py": "pkg.top", "sub.py": "pkg.sub", "sub_leaf.py": "pkg.sub.leaf"}
    top = (out / "top.py").read_text()
    assert "from . import sub\n" in top and "    from .sub_leaf import f\n" in top
    assert "from .sub import VALUE\nfrom . import sub_leaf as renamed\n" in top
    monkeypatch.syspath_prepend(str(tmp_path))
    import flat.top

    assert flat.top.RESULT == (2, 2, 3, 4, 11)

    with pytest.raises(AssemblyError, match="cannot be exported"):
        assemble(["pkg.bad"], out, package="pkg")


def test_check_imports_refuses_what_a_user_may_lack(tmp_path):
    (tmp_path / "ok.py").write_text("import math\nimport torch\nfrom transformers import PreTrainedModel\n")
    check_imports(tmp_path, ["ok.py"])
    (tmp_path / "lazy.py").write_text("def f():\n    import numpy\n    return numpy\n")
    with pytest.raises(AssemblyError, match="numpy"):
        check_imports(tmp_path, ["lazy.py"])


def test_model_card(exported):
    export_dir, model = exported["kromhc_4x2_alphas"]
    card = (export_dir / "README.md").read_text()
    header = yaml.safe_load(card.split("---\n")[1])
    assert header["library_name"] == "transformers" and "kromhc" in header["tags"]
    counts = model.param_counts()
    for needle in ["`kromhc` with n = 8 streams, factors 4 x 2, one alpha_res per factor",
                   f"{counts['total']:,} total, {counts['non_embedding']:,} non-embedding, "
                   f"{counts['connections']:,} in the connections",
                   "10,240 (10 steps x 1,024)", "a test corpus of 3 documents",
                   "| final train loss (smoothed) | 5.2500 |",
                   "| val bpb | 1.8750 |", "| CORE | 0.0625 (core.json) |", "| copa | 0 | 16 | 0.5625 | +0.1250 |",
                   'hc = "kromhc"', 'path = "kromhc_4x2_alphas"', "trust_remote_code=True"]:
        assert needle in card, needle
    settings = next(line for line in card.splitlines() if line.startswith("| connection settings |"))
    for own in ("`hc_streams=8`", "`hc_factors=[4, 2]`", "`hc_alpha_shared=False`", "`hc_expand=copy`"):
        assert own in settings, own
    for other in ("hc_go_s", "hc_sk_iters", "cmhc_beta", "dar_gate", "attnres_block_size"):  # other wirings'
        assert other not in settings, other
    prenorm = (exported["prenorm"][0] / "README.md").read_text()
    assert "| connection settings | none (the wiring has no settings) |" in prenorm
    config = json.loads((export_dir / "config.json").read_text())
    assert config["model_type"] == "nanochat_hc" and config["hc_factors"] == [4, 2]
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_nanochat_hc.NanochatHCForCausalLM"


def test_the_cards_config_keeps_only_its_own_wirings_fields():
    text = 'depth = 2\nhc = "kromhc"\nhc_factors = [4, 2]\ncmhc_beta = 4.0\ndar_gate = "zero"\nhc_lr = 0.005\n'
    assert without_other_wirings(text, "kromhc") == 'depth = 2\nhc = "kromhc"\nhc_factors = [4, 2]\nhc_lr = 0.005\n'
    assert "cmhc_beta = 4.0" in without_other_wirings(text, "cmhc")


def run_export_cli(*argv):
    """(exit status, stderr) of scripts.export run in this process through the error guard
    (a SystemExit carrying a message is what Python prints to stderr, with status 1)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as e:
        cli.run(lambda: export_main(list(argv)) or sys.exit(0))
    code = e.value.code
    return (1, err.getvalue() + code + "\n") if isinstance(code, str) else (code, err.getvalue())


def assert_one_error(code, stderr, *needles):
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code != 0 and lines[-1].startswith(("error:", "python -m scripts.export: error:")), stderr
    assert "Traceback" not in stderr
    for needle in needles:
        assert needle in lines[-1], (needle, stderr)


def test_export_cli_refuses_bad_input_and_overwrites_only_an_export(exported, base, tmp_path):
    run_dir = str(base / "runs" / "residual")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert_one_error(*run_export_cli("--run-dir", run_dir, "--out", str(tmp_path / "other")), "not empty",
                     "--overwrite")
    assert_one_error(*run_export_cli("--run-dir", run_dir, "--out", str(tmp_path / "other"), "--overwrite"),
                     "only replaces an earlier export")
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
    assert_one_error(*run_export_cli("--run-dir", run_dir, "--step", "99", "--out", str(tmp_path / "x")),
                     "no complete checkpoint of step 99")
    assert_one_error(*run_export_cli("--out", str(tmp_path / "x")), "--model-tag")
    assert_one_error(*run_export_cli("--model-tag", "nope", "--out", str(tmp_path / "x")), "no run directory")
    assert not (tmp_path / "x").exists()

    export_dir, _ = exported["residual"]
    code, stderr = run_export_cli("--run-dir", run_dir, "--out", str(export_dir), "--overwrite")
    assert code == 0, stderr
    assert json.loads((export_dir / "config.json").read_text())["hc"] == "residual"
    assert not list(export_dir.parent.glob(".*export*")), "no staging directory left behind"


def test_export_refuses_a_tokenizer_that_does_not_match(exported, base, tmp_path, monkeypatch):
    other = tmp_path / "base"
    small = Tokenizer.train_from_iterator(["some text to train on"] * 20, 300)
    small.save(str(other / "tokenizer"))
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(other))
    assert_one_error(*run_export_cli("--run-dir", str(base / "runs" / "mhc"), "--out", str(tmp_path / "x")),
                     f"the tokenizer has {small.get_vocab_size()} tokens but the model was trained with 512")
    assert not (tmp_path / "x").exists()
