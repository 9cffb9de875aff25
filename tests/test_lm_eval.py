"""lm-evaluation-harness (nanochat/interop/lm_eval_adapter.py, nanochat/interop/lm_eval_run.py,
scripts/lm_eval.py), offline: task YAMLs over local jsonl files written here (lm-eval's
`dataset_path: json`), with HF_HUB_OFFLINE and HF_DATASETS_OFFLINE set. Our adapter against
lm-eval's own `hf` model over the exported directory: the same per-item log-likelihoods
(1e-4) and accuracy on a multiple-choice and a rolling log-likelihood task, the same text
on a generation task (which the hf model generates in left-padded batches). The
tokenization contract (contexts start with <|bos|> as in CORE; rolling scores every token
once and never <|bos|>), lm_eval.json, bad input, and two ranks under torchrun."""

import contextlib
import io
import json
import math
import os
import shutil
import sys
from pathlib import Path

import launch
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("lm_eval", reason="needs the eval extra: pip install -e '.[eval]'")

import lm_eval  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from nanochat import cli  # noqa: E402
from nanochat.interop.hf.export import export  # noqa: E402
from nanochat.interop.lm_eval_adapter import NanochatLM  # noqa: E402
from nanochat.tokenizer import Tokenizer  # noqa: E402
from scripts.lm_eval import main as lm_eval_main  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MC = [
    ("The sky on a clear day is", ["blue and bright", "made of green cheese", "a loud noise"]),
    ("Water boils at sea level at", ["one hundred degrees", "minus forty degrees", "the speed of light"]),
    ("A cat is a kind of", ["small animal", "musical chord", "kitchen table"]),
    ("To open a locked door you use a", ["key made of metal", "glass of water", "happy thought"]),
    ("Python is a programming", ["language used widely", "snake in a zoo", "cake recipe"]),
    ("The opposite of hot is", ["cold weather", "very hot", "a green tree"]),
]
PPL = ["The quick brown fox jumps over the lazy dog. " * k + "Done." for k in (1, 4, 12)] + \
      ["def f(x):\n    return x + 1\n\nprint(f(2))  # <|bos|> is plain text here"]
GEN = ["Q: What is two plus two?\nA:", "Q: Name a color.\nA:", "Q: Hello\nA:", "Q: Why is the sky blue?\nA:"]
TASKS = {
    "toy_mc": """output_type: multiple_choice
doc_to_text: "{{query}}"
doc_to_choice: choices
doc_to_target: gold
metric_list:
  - metric: acc
  - metric: acc_norm""",
    "toy_ppl": """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
    aggregation: weighted_perplexity
    higher_is_better: false""",
    "toy_gen": """output_type: generate_until
doc_to_text: "{{question}}"
doc_to_target: "{{answer}}"
generation_kwargs:
  until: ["\\n", "Q:"]
  max_gen_toks: 10
  do_sample: false
metric_list:
  - metric: exact_match""",
}


def write_tasks(directory):
    """The three task YAMLs and their jsonl data (absolute paths: lm-eval resolves relative
    data_files against the working directory)."""
    directory.mkdir()
    docs = {"toy_mc": [{"query": q, "choices": c, "gold": 0} for q, c in MC],
            "toy_ppl": [{"text": t} for t in PPL],
            "toy_gen": [{"question": q, "answer": "four"} for q in GEN]}
    for task, body in TASKS.items():
        data = directory / f"{task}.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in docs[task]))
        (directory / f"{task}.yaml").write_text(
            f"task: {task}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
            f"test_split: test\n{body}\nmetadata:\n  version: 1.0\n")
    return directory


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tokenizer_dir, make_run):
    """(run dir, its export, the tasks directory, the model, its tokenizer), offline (the
    Hugging Face variables are set by conftest.py, before lm-eval and datasets read them)."""
    base = tmp_path_factory.mktemp("lm_eval_base")
    shutil.copytree(tokenizer_dir, base / "tokenizer")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NANOCHAT_BASE_DIR", str(base))
        assert os.environ["HF_HUB_OFFLINE"] == os.environ["HF_DATASETS_OFFLINE"] == "1"  # conftest.py
        run_dir = base / "runs" / "mhc"
        model = make_run(run_dir, hc="mhc")
        exported = Path(export(run_dir, base / "exports" / "mhc")["dir"])
        yield run_dir, exported, write_tasks(base / "tasks"), model, Tokenizer.from_directory(tokenizer_dir)


def per_item(results, task):
    return [[r[0] for r in sample["resps"]] for sample in results["samples"][task]]


def test_adapter_and_lm_evals_hf_model_agree(setup):
    from lm_eval.models.huggingface import HFLM

    run_dir, exported, tasks, model, tokenizer = setup
    manager = TaskManager(include_path=str(tasks), include_defaults=False)
    ours = lm_eval.simple_evaluate(model=NanochatLM(model, tokenizer, "cpu", batch_size=4), tasks=list(TASKS),
                                   task_manager=manager, bootstrap_iters=0, log_samples=True)
    hf_args = dict(pretrained=str(exported), trust_remote_code=True, batch_size=4, device="cpu", dtype="float32")
    theirs = lm_eval.simple_evaluate(model=HFLM(**hf_args), tasks=["toy_mc", "toy_gen"], task_manager=manager,
                                     bootstrap_iters=0, log_samples=True)
    # lm-eval's hf model puts <|bos|> before a rolling document and again as its prefix
    # token unless told not to add it.
    theirs_ppl = lm_eval.simple_evaluate(model=HFLM(**hf_args, add_bos_token=False), tasks=["toy_ppl"],
                                         task_manager=manager, bootstrap_iters=0, log_samples=True)
    for task, other in (("toy_mc", theirs), ("toy_ppl", theirs_ppl)):
        a, b = per_item(ours, task), per_item(other, task)
        assert len(a) == len(b) == len(MC if task == "toy_mc" else PPL)
        for x, y in zip(a, b):
            assert len(x) == len(y)
            for u, v in zip(x, y):
                assert abs((u[0] if isinstance(u, tuple) else u) - (v[0] if isinstance(v, tuple) else v)) < 1e-4
    for metric in ("acc,none", "acc_norm,none"):
        assert ours["results"]["toy_mc"][metric] == theirs["results"]["toy_mc"][metric]
    assert math.isclose(ours["results"]["toy_ppl"]["word_perplexity,none"],
                        theirs_ppl["results"]["toy_ppl"]["word_perplexity,none"], rel_tol=1e-4)
    generations = [s["resps"][0][0] for s in ours["samples"]["toy_gen"]]
    assert generations == [s["resps"][0][0] for s in theirs["samples"]["toy_gen"]]
    assert any(generations), "the generations should not all be empty"


def test_contexts_start_with_bos_as_in_core(setup):
    *_, model, tokenizer = setup
    lm = NanochatLM(model, tokenizer, "cpu")
    bos = tokenizer.get_bos_token_id()
    ctx, cont = lm._encode_pair("Question: what is it?\nAnswer:", " a cat")
    assert ctx + cont == tokenizer.encode("Question: what is it?\nAnswer: a cat", prepend=bos)
    assert ctx == tokenizer.encode("Question: what is it?\nAnswer:", prepend=bos)
    request = Instance("loglikelihood", {}, ("Question: what is it?\nAnswer:", " a cat"), 0)
    empty = Instance("loglikelihood", {}, ("", "a cat"), 1)
    (got, _), (got_empty, _) = lm.loglikelihood([request, empty])
    with torch.no_grad():
        for (c, t), value in (((ctx, cont), got), (([bos], tokenizer.encode("a cat")), got_empty)):
            logprobs = F.log_softmax(model(torch.tensor([c + t[:-1]]))[0], -1)
            expected = logprobs[len(c) - 1:].gather(1, torch.tensor(t)[:, None]).sum()
            assert math.isclose(value, expected.item(), rel_tol=1e-5)


def test_rolling_scores_every_token_once_and_never_bos(setup, monkeypatch):
    *_, model, tokenizer = setup
    lm = NanochatLM(model, tokenizer, "cpu", batch_size=3)
    document = PPL[2]
    tokens = tokenizer.encode(document)
    assert len(tokens) > 3 * lm.max_length, "the document must span several windows"
    windows = []
    score = lm._loglikelihood_tokens
    monkeypatch.setattr(lm, "_loglikelihood_tokens", lambda reqs, **kw: windows.extend(reqs) or score(reqs))
    (total,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (document,), 0)])
    scored = [t for _, _, cont in windows for t in cont]
    assert scored == tokens
    assert windows[0][1] == [tokenizer.get_bos_token_id()] and all(len(c) + len(t) <= lm.max_length + 1
                                                                     for _, c, t in windows)
    # a document within one window: one forward of <|bos|> + document
    text = "The quick brown fox."
    short = tokenizer.encode(text)
    assert len(short) <= lm.max_length
    with torch.no_grad():
        logprobs = F.log_softmax(model(torch.tensor([[tokenizer.get_bos_token_id()] + short[:-1]]))[0], -1)
    (got,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    assert math.isclose(got, logprobs.gather(1, torch.tensor(short)[:, None]).sum().item(), rel_tol=1e-5)
    assert total < 0


def run_cli(*argv):
    """(exit status, stdout, stderr) of scripts.lm_eval run in this process through the
    error guard (a SystemExit carrying a message is printed by Python, with status 1)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
        cli.run(lambda: lm_eval_main(list(argv)) or sys.exit(0))
    code = e.value.code
    if isinstance(code, str):
        return 1, out.getvalue(), err.getvalue() + code + "\n"
    return code, out.getvalue(), err.getvalue()


def test_cli_writes_lm_eval_json(setup):
    run_dir, _, tasks, *_ = setup
    code, out, err = run_cli("--run-dir", str(run_dir), "--tasks", "toy_mc,toy_ppl", "--include-path", str(tasks),
                             "--limit", "3", "--num-fewshot", "1", "--batch-size", "2", "--bootstrap-iters", "20")
    assert code == 0, err
    record = json.loads((run_dir / "lm_eval.json").read_text())
    assert record["versions"] == {"lm_eval": lm_eval.__version__, "tasks": {"toy_mc": 1.0, "toy_ppl": 1.0}}
    assert record["settings"] | {"limit": 3, "num_fewshot": 1, "step": 10, "world_size": 1} == record["settings"]
    assert record["settings"]["compile"] is False and record["settings"]["compile_fallback"] is None  # CPU default
    assert record["n_samples"]["toy_mc"] == {"original": len(MC), "effective": 3}
    acc = record["results"]["toy_mc"]["acc"]
    assert 0 <= acc["value"] <= 1 and acc["stderr"] is not None
    assert record["results"]["toy_ppl"]["word_perplexity"]["value"] > 1
    assert "toy_mc" in out and "wrote" in out

    code, _, err = run_cli("--run-dir", str(run_dir), "--step", "10", "--tasks", "toy_mc", "--include-path",
                           str(tasks), "--limit", "2", "--bootstrap-iters", "0")
    assert code == 0, err
    assert json.loads((run_dir / "lm_eval_000010.json").read_text())["settings"]["step"] == 10


def assert_one_error(result, *needles):
    code, _, err = result
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and "Traceback" not in err, err
    assert lines[-1].startswith(("error:", "python -m scripts.lm_eval: error:")), err
    for needle in needles:
        assert needle in lines[-1], (needle, err)


def test_cli_bad_input_is_one_error_line(setup, tmp_path, monkeypatch):
    run_dir, _, tasks, *_ = setup
    empty = tmp_path / "empty"
    empty.mkdir()
    common = ("--run-dir", str(run_dir), "--include-path", str(tasks))
    assert_one_error(run_cli(*common, "--tasks", "toy_mc", "--limit", "0"), "--limit", "positive integer")
    assert_one_error(run_cli(*common, "--tasks", "toy_mc", "--num-fewshot", "-1"), "--num-fewshot")
    assert_one_error(run_cli(*common, "--tasks", " , "), "--tasks")
    assert_one_error(run_cli("--run-dir", str(run_dir), "--tasks", "toy_mc", "--include-path", str(tmp_path / "no")),
                     "--include-path", "is not a directory")
    assert_one_error(run_cli("--run-dir", str(run_dir), "--tasks", "toy_mc", "--include-path", str(empty)),
                     "holds no task YAML")
    assert_one_error(run_cli(*common, "--tasks", "toy_mc,no_such_task"), "unknown lm-eval task(s) no_such_task",
                     "--include-path")
    other = tmp_path / "base"
    small = Tokenizer.train_from_iterator(["some text to train on"] * 20, 300)
    small.save(str(other / "tokenizer"))
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(other))
    assert_one_error(run_cli(*common, "--tasks", "toy_mc"),
                     f"the tokenizer has {small.get_vocab_size()} tokens but the model was trained with 512")


def test_check_data_says_when_the_hub_is_out_of_reach(setup, tmp_path):
    _, _, tasks, *_ = setup
    code, out, err = run_cli("--check-data", "--tasks", "toy_mc", "--include-path", str(tasks))
    assert code == 0 and "lm-eval task data ready: toy_mc" in out, err
    # A task that reads its data from the Hub, as lm-eval's own do (arc_easy's dataset),
    # with the Hub out of reach (offline mode).
    hub = tmp_path / "hub_tasks"
    hub.mkdir()
    (hub / "hub_arc.yaml").write_text("task: hub_arc\ndataset_path: allenai/ai2_arc\ndataset_name: ARC-Easy\n"
                                      "test_split: test\n" + TASKS["toy_mc"] + "\n")
    assert_one_error(run_cli("--check-data", "--tasks", "hub_arc", "--include-path", str(hub)), "hub_arc",
                     "could not be loaded", "check the network")


@pytest.mark.slow
def test_two_ranks_split_the_documents_and_rank0_writes_the_record(setup, tmp_path):
    run_dir, _, tasks, model, tokenizer = setup
    env = dict(os.environ, OMP_NUM_THREADS="1")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = launch.run([*torchrun, "-m", "scripts.lm_eval", "--run-dir", str(run_dir), "--tasks",
                           "toy_mc,toy_ppl", "--include-path", str(tasks), "--device-type", "cpu", "--batch-size", "2",
                           "--bootstrap-iters", "0", "--step", "10"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((run_dir / "lm_eval_000010.json").read_text())
    assert record["settings"]["world_size"] == 2
    manager = TaskManager(include_path=str(tasks), include_defaults=False)
    single = lm_eval.simple_evaluate(model=NanochatLM(model, tokenizer, "cpu"), tasks=["toy_mc", "toy_ppl"],
                                     task_manager=manager, bootstrap_iters=0)
    assert record["results"]["toy_mc"]["acc"]["value"] == single["results"]["toy_mc"]["acc,none"]
    assert math.isclose(record["results"]["toy_ppl"]["word_perplexity"]["value"],
                        single["results"]["toy_ppl"]["word_perplexity,none"], rel_tol=1e-5)
    assert record["n_samples"]["toy_mc"]["effective"] == len(MC)
