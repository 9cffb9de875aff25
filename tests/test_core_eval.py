"""CORE: rendering, spans, few-shot draws, scoring and centering on a hand-made bundle with a
bigram stub model whose answers are known; the real bundle (when it sits beside the repo);
the bundle download from a local HTTP server; the distributed striding."""

import functools
import http.server
import json
import math
import os
import random
import threading
import zipfile
from pathlib import Path

import launch
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml

from nanochat import core_eval
from nanochat.core_eval import (centered_accuracy, crop_left, download_eval_bundle, encode_prompts, evaluate_core,
                                evaluate_task, fewshot_examples, load_task_data, read_reference_csv, render_prompts,
                                resolve_eval_bundle, score_rows, select_tasks)

REAL_BUNDLE = Path(__file__).resolve().parents[2] / "shared" / "eval_bundle"
BOS = 256


class ByteTokenizer:
    """UTF-8 bytes as token ids, BOS = 256."""

    def get_bos_token_id(self):
        return BOS

    def get_vocab_size(self):
        return 257

    def encode(self, text, prepend=None, append=None):
        if isinstance(text, list):
            return [self.encode(t, prepend, append) for t in text]
        ids = list(text.encode("utf-8"))
        return ([prepend] if prepend is not None else []) + ids + ([append] if append is not None else [])

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class BigramModel:
    """Next-token logits depend on the current token only: zero everywhere except the boosted
    (current, next) pairs. Records every batch it is given."""

    def __init__(self, pairs, boost=8.0):
        self.table = torch.zeros(257, 257)
        for cur, nxt in pairs:
            self.table[ord(cur), ord(nxt)] = boost
        self.inputs = []

    def __call__(self, input_ids):
        self.inputs.append(input_ids.clone())
        return self.table[input_ids]


def ids(text):
    return [BOS] + list(text.encode("utf-8"))


# ----------------------------------------------------------------------------- rendering

def test_render_multiple_choice_token_by_token():
    shots = [{"query": "Q1?", "choices": ["no", "yes"], "gold": 1}, {"query": "Q2?", "choices": ["up"], "gold": 0}]
    item = {"query": "Q3?", "choices": ["red", "blue"], "gold": 0}
    prompts = render_prompts(item, "multiple_choice", "\nA: ", shots)
    head = "Q1?\nA: yes\n\nQ2?\nA: up\n\nQ3?\nA: "
    assert prompts == [head + "red", head + "blue"]
    rows, starts, ends = encode_prompts(ByteTokenizer(), prompts, "multiple_choice")
    assert rows == [ids(head + "red"), ids(head + "blue")]
    assert starts == [len(ids(head))] * 2 and ends == [len(rows[0]), len(rows[1])]
    assert [bytes(r[s:e]) for r, s, e in zip(rows, starts, ends)] == [b"red", b"blue"]


def test_render_schema_token_by_token():
    shots = [{"context_options": ["A cat", "A dog"], "continuation": "barked.", "gold": 1}]
    item = {"context_options": ["The trophy", "The suitcase"], "continuation": "was too big.", "gold": 0}
    prompts = render_prompts(item, "schema", " ", shots)
    assert prompts == ["A dog barked.\n\nThe trophy was too big.", "A dog barked.\n\nThe suitcase was too big."]
    rows, starts, ends = encode_prompts(ByteTokenizer(), prompts, "schema")
    assert rows == [ids(p) for p in prompts]
    # the span is the common token suffix: here " was too big." (the 'e' of "suitcase"
    # differs from the 'y' of "trophy")
    assert [bytes(r[s:e]) for r, s, e in zip(rows, starts, ends)] == [b" was too big."] * 2
    assert ends == [len(r) for r in rows]


def test_schema_suffix_is_token_level():
    # "he" is a suffix of "she": the common suffix runs into the options themselves
    prompts = render_prompts({"context_options": ["he", "she"], "continuation": "ran.", "gold": 0}, "schema", " ", [])
    rows, starts, ends = encode_prompts(ByteTokenizer(), prompts, "schema")
    assert [bytes(r[s:e]) for r, s, e in zip(rows, starts, ends)] == [b"he ran."] * 2


def test_render_language_modeling_token_by_token():
    shots = [{"context": "  What is 1+1? ", "continuation": "2"}]
    item = {"context": "What is 2+2?\t \n", "continuation": "4"}
    without, with_ = render_prompts(item, "language_modeling", "\nAnswer: ", shots)
    # contexts are trimmed; the prompt without the continuation loses its trailing space
    assert without == "What is 1+1?\nAnswer: 2\n\nWhat is 2+2?\nAnswer:"
    assert with_ == "What is 1+1?\nAnswer: 2\n\nWhat is 2+2?\nAnswer: 4"
    rows, starts, ends = encode_prompts(ByteTokenizer(), [without, with_], "language_modeling")
    assert rows == [ids(with_)] and starts == [len(ids(without))] and ends == [len(ids(with_))]
    assert bytes(rows[0][starts[0]:ends[0]]) == b" 4"


def test_language_modeling_prefix_violation_is_an_error():
    class MergingTokenizer(ByteTokenizer):
        """Merges "= " into one token (id 300), so "2+2=" no longer encodes to a prefix of "2+2= 4"."""

        def encode(self, text, prepend=None, append=None):
            if isinstance(text, list):
                return [self.encode(t, prepend, append) for t in text]
            row = super().encode(text, prepend, append)
            out = []
            for t in row:
                if out and out[-1] == ord("=") and t == ord(" "):
                    out[-1] = 300
                else:
                    out.append(t)
            return out

    prompts = render_prompts({"context": "2+2=", "continuation": "4"}, "language_modeling", " ", [])
    assert prompts == ["2+2=", "2+2= 4"]
    with pytest.raises(ValueError, match="prefix"):
        encode_prompts(MergingTokenizer(), prompts, "language_modeling")


def test_unknown_task_type():
    with pytest.raises(ValueError, match="unknown task type"):
        render_prompts({}, "generation", " ", [])


# ----------------------------------------------------------------------------- few-shot, shuffle, crop

def test_fewshot_draw_is_deterministic_and_excludes_the_item():
    data = [{"n": i} for i in range(30)]
    for idx in (0, 7, 29):
        shots = fewshot_examples(data, idx, 10)
        assert shots == fewshot_examples(data, idx, 10)
        picked = [s["n"] for s in shots]
        assert len(set(picked)) == 10 and idx not in picked
        # the protocol: random.Random(1234 + idx).sample over the other indices
        others = [i for i in range(30) if i != idx]
        assert picked == random.Random(1234 + idx).sample(others, 10)
    assert fewshot_examples(data, 3, 0) == []
    # different items draw different examples
    assert fewshot_examples(data, 1, 10) != fewshot_examples(data, 2, 10)
    # after cropping, the examples come from the kept items only
    cropped = [s["n"] for s in fewshot_examples(data[:12], 3, 10)]
    assert cropped == random.Random(1237).sample([i for i in range(12) if i != 3], 10)
    assert all(n < 12 for n in cropped)


def test_fewshot_needs_enough_items():
    with pytest.raises(ValueError, match="max_per_task > 10"):
        fewshot_examples([{}] * 10, 0, 10)


def test_load_task_data_shuffles_with_1337_and_crops(tmp_path):
    bundle = make_bundle(tmp_path)
    meta = {m["label"]: m for m in core_eval.load_task_metas(bundle)}["mc"]
    lines = [json.loads(line) for line in open(core_eval.task_path(bundle, meta))]
    full = load_task_data(bundle, meta)
    expected = list(lines)
    random.Random(1337).shuffle(expected)
    assert full == expected and full != lines
    assert load_task_data(bundle, meta, max_per_task=3) == expected[:3]


# ----------------------------------------------------------------------------- scoring

def test_multiple_choice_uses_the_mean_not_the_sum():
    # option 0: "a" (boosted after ' ') then six unboosted tokens; option 1: "b" alone.
    # Mean CE prefers option 0, the sum would prefer option 1.
    model = BigramModel([(" ", "a")])
    prompts = render_prompts({"query": "Q", "choices": ["axxxxxx", "b"], "gold": 0}, "multiple_choice", " ", [])
    rows, starts, ends = encode_prompts(ByteTokenizer(), prompts, "multiple_choice")
    boosted = math.log(math.exp(8) + 256) - 8   # CE of the boosted token
    unboosted = math.log(math.exp(8) + 256)     # CE of another token after ' '
    flat = math.log(257)                        # CE after an unboosted token
    assert (boosted + 6 * flat) / 7 < unboosted < boosted + 6 * flat
    assert score_rows(model, rows, starts, ends, "multiple_choice", 0, BOS, "cpu")
    assert not score_rows(model, rows, starts, ends, "multiple_choice", 1, BOS, "cpu")


def test_multiple_choice_empty_span_behaves_as_nanochat():
    # "ice" is the common prefix of both options: its span is empty and its mean NaN;
    # like Python's min over nanochat's list, a leading NaN is the pick.
    model = BigramModel([(" ", "i")])
    prompts = render_prompts({"query": "Q", "choices": ["ice", "ice cream"], "gold": 0}, "multiple_choice", " ", [])
    rows, starts, ends = encode_prompts(ByteTokenizer(), prompts, "multiple_choice")
    assert starts[0] == ends[0]
    assert score_rows(model, rows, starts, ends, "multiple_choice", 0, BOS, "cpu")
    prompts = render_prompts({"query": "Q", "choices": ["ice cream", "ice"], "gold": 0}, "multiple_choice", " ", [])
    rows, starts, ends = encode_prompts(ByteTokenizer(), prompts, "multiple_choice")
    assert score_rows(model, rows, starts, ends, "multiple_choice", 0, BOS, "cpu")


def test_options_are_batched_right_padded_with_bos():
    model = BigramModel([(" ", "a")])
    prompts = render_prompts({"query": "Q", "choices": ["a", "bcd"], "gold": 0}, "multiple_choice", " ", [])
    rows, starts, ends = encode_prompts(ByteTokenizer(), prompts, "multiple_choice")
    assert score_rows(model, rows, starts, ends, "multiple_choice", 0, BOS, "cpu")
    (batch,) = model.inputs
    assert batch.tolist() == [ids("Q a") + [BOS, BOS], ids("Q bcd")]


def test_language_modeling_needs_every_token():
    model = BigramModel([("?", " "), (" ", "a"), ("a", "b"), ("b", "c")])
    meta = {"task_type": "language_modeling", "num_fewshot": 0, "continuation_delimiter": " "}
    data = [{"context": "Q?", "continuation": c} for c in ("abc", "ab", "abd", "x", "bc")]
    outcomes = [core_eval.evaluate_example(i, model, ByteTokenizer(), data, "cpu", meta) for i in range(len(data))]
    assert outcomes == [True, True, False, False, False]


def test_crop_left_shifts_spans_and_keeps_scores():
    model = BigramModel([("?", " "), (" ", "a"), ("a", "b")])
    meta = {"task_type": "language_modeling", "num_fewshot": 2, "continuation_delimiter": " "}
    data = [{"context": f"Question number {i}?", "continuation": "ab" if i % 2 else "ba"} for i in range(6)]
    full = [core_eval.evaluate_example(i, model, ByteTokenizer(), data, "cpu", meta) for i in range(6)]
    model.inputs.clear()
    cropped = [core_eval.evaluate_example(i, model, ByteTokenizer(), data, "cpu", meta, max_seq_len=8)
               for i in range(6)]
    assert cropped == full == [False, True] * 3
    assert all(x.shape[1] <= 8 for x in model.inputs)
    rows, starts, ends = crop_left([list(range(20)), list(range(5))], [15, 3], [20, 5], 8)
    assert rows == [list(range(12, 20)), list(range(5))] and starts == [3, 3] and ends == [8, 5]
    with pytest.raises(ValueError, match="too short"):
        crop_left([list(range(20))], [15], [20], 5)


# ----------------------------------------------------------------------------- a hand-made bundle

MC_ITEMS = [  # gold names "a" (the stub's pick) in items 0-4 only: 5/8 correct
    {"query": f"Q{i}?", "choices": ["c", "a", "b", "d"] if i % 2 else ["a", "b", "c", "d"],
     "gold": (1 if i % 2 else 0) if i < 5 else 2} for i in range(8)]
SCHEMA_ITEMS = [  # the option ending in X wins: 3/4 correct
    {"context_options": [f"case {i} X", f"case {i} Y"], "continuation": "ok.", "gold": 0 if i < 3 else 1}
    for i in range(4)]
LM_ITEMS = [  # correct iff the continuation follows ? -> ' ' -> a -> b -> c: 3/5 (trailing spaces trimmed)
    {"context": f"Say {i}?" + ("   " if i == 1 else ""), "continuation": c}
    for i, c in enumerate(["abc", "ab", "abd", "x", "a"])]
STUB_PAIRS = [(" ", "a"), ("X", " "), ("?", " "), ("a", "b"), ("b", "c")]
FIXTURE_TASKS = [
    ("mc", "multiple_choice", 2, "\nA: ", 25.0, "group/mc.jsonl", MC_ITEMS),
    ("sc", "schema", 0, " ", 50.0, "group/sc.jsonl", SCHEMA_ITEMS),
    ("lm", "language_modeling", 1, None, 0.0, "other/lm.jsonl", LM_ITEMS),
]


def make_bundle(root, tasks=FIXTURE_TASKS, skip_files=()):
    """A bundle in the real layout: core.yaml, eval_meta_data.csv, eval_data/<uri>."""
    bundle = Path(root) / "eval_bundle"
    entries, meta_rows = [], ["Eval Task,Task Category,Task Type,#shots,#datapoints,Random baseline,Centered Metric?,Description"]
    for label, ttype, shots, delim, rb, uri, items in tasks:
        entry = {"label": label, "dataset_uri": uri, "num_fewshot": [shots], "icl_task_type": ttype}
        if delim is not None:
            entry["continuation_delimiter"] = delim
        entries.append(entry)
        meta_rows.append(f'{label},test,{ttype},{shots},{len(items)},{rb},,"a test task, with a comma"')
        if label not in skip_files:
            path = bundle / "eval_data" / uri
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(it) + "\n" for it in items))
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / "core.yaml").write_text(yaml.safe_dump({"icl_tasks": entries}))
    (bundle / "eval_meta_data.csv").write_text("\n".join(meta_rows) + "\n")
    return str(bundle)


def test_fixture_core_accuracy_centering_and_metric(tmp_path):
    bundle = make_bundle(tmp_path)
    out = evaluate_core(BigramModel(STUB_PAIRS), ByteTokenizer(), "cpu", bundle)
    assert out["results"] == {"mc": 5 / 8, "sc": 3 / 4, "lm": 3 / 5}
    expected_centered = {"mc": (5 / 8 - 0.25) / 0.75, "sc": (3 / 4 - 0.5) / 0.5, "lm": 3 / 5}
    assert out["centered_results"] == pytest.approx(expected_centered, abs=1e-12)
    assert out["core_metric"] == pytest.approx((0.5 + 0.5 + 0.6) / 3, abs=1e-12)
    assert out["tasks"]["mc"] == {"type": "multiple_choice", "shots": 2, "examples": 8, "accuracy": 5 / 8,
                                  "centered": out["centered_results"]["mc"]}
    assert out["tasks"]["lm"]["shots"] == 1 and out["tasks"]["sc"]["type"] == "schema"
    assert out["tasks_missing"] == [] and out["partial"] is False


def test_fixture_max_per_task_keeps_the_shuffled_head(tmp_path):
    bundle = make_bundle(tmp_path)
    shuffled = list(MC_ITEMS)
    random.Random(1337).shuffle(shuffled)
    kept = shuffled[:4]
    expected = sum(it["choices"][it["gold"]] == "a" for it in kept) / 4
    out = evaluate_core(BigramModel(STUB_PAIRS), ByteTokenizer(), "cpu", bundle, max_per_task=4, tasks="mc")
    assert out["results"] == {"mc": expected} and out["tasks"]["mc"]["examples"] == 4
    assert out["partial"] is True


def test_centered_accuracy():
    assert centered_accuracy(0.25, 25) == 0.0
    assert centered_accuracy(1.0, 62) == pytest.approx(1.0)
    assert centered_accuracy(0.5, 0) == 0.5
    assert centered_accuracy(0.81, 62) == pytest.approx(0.5)
    assert centered_accuracy(0.0, 50) == -1.0


def test_missing_files_error_and_available(tmp_path):
    bundle = make_bundle(tmp_path, skip_files=("sc",))
    with pytest.raises(ValueError) as err:
        select_tasks(bundle)
    message = str(err.value)
    assert "sc" in message and "group/sc.jsonl" in message and "--tasks" in message and "--eval-bundle" in message
    assert "mc:" not in message and "lm:" not in message
    with pytest.raises(ValueError, match="lacks the data"):
        evaluate_core(BigramModel(STUB_PAIRS), ByteTokenizer(), "cpu", bundle)
    out = evaluate_core(BigramModel(STUB_PAIRS), ByteTokenizer(), "cpu", bundle, tasks="available")
    assert list(out["results"]) == ["mc", "lm"]
    assert out["tasks_missing"] == ["sc"] and out["partial"] is True
    assert out["core_metric"] == pytest.approx((0.5 + 0.6) / 2, abs=1e-12)
    out = evaluate_core(BigramModel(STUB_PAIRS), ByteTokenizer(), "cpu", bundle, tasks="lm, mc")
    assert list(out["results"]) == ["lm", "mc"] and out["tasks_missing"] == ["sc"]


def test_bad_requests_are_clear_errors(tmp_path):
    bundle = make_bundle(tmp_path)
    with pytest.raises(ValueError, match="unknown CORE task.*'nope'.*mc, sc, lm"):
        select_tasks(bundle, "mc,nope")
    with pytest.raises(ValueError, match="--max-per-task 2 .* 2-shot task mc.*at least 3"):
        select_tasks(bundle, None, max_per_task=2)
    selected, absent = select_tasks(bundle, None, max_per_task=3)
    assert [m["label"] for m in selected] == ["mc", "sc", "lm"] and absent == []
    assert selected[1]["continuation_delimiter"] == " " and selected[0]["random_baseline"] == 25.0
    with pytest.raises(ValueError, match="not a CORE eval bundle"):
        resolve_eval_bundle(str(tmp_path))


def test_missing_random_baseline(tmp_path):
    bundle = make_bundle(tmp_path)
    csv_path = Path(bundle) / "eval_meta_data.csv"
    csv_path.write_text("\n".join(l for l in csv_path.read_text().splitlines() if not l.startswith("sc,")) + "\n")
    with pytest.raises(ValueError, match="no random baseline for task sc"):
        select_tasks(bundle)


# ----------------------------------------------------------------------------- download

class _CountingHandler(http.server.SimpleHTTPRequestHandler):
    hits = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.hits.append(self.path)
        super().do_GET()


@pytest.fixture
def http_root(tmp_path):
    root = tmp_path / "served"
    root.mkdir()
    _CountingHandler.hits = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_CountingHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_download_from_a_local_server(tmp_path, http_root, monkeypatch):
    root, url = http_root
    source = make_bundle(tmp_path / "src")
    with zipfile.ZipFile(root / "eval_bundle.zip", "w") as z:
        for path in Path(source).rglob("*"):
            z.write(path, Path("eval_bundle") / path.relative_to(source))
    dest = tmp_path / "base"
    bundle = download_eval_bundle(str(dest), url=url + "/eval_bundle.zip")
    assert bundle == str(dest / "eval_bundle")
    assert (Path(bundle) / "eval_data/group/mc.jsonl").read_text() == (Path(source) / "eval_data/group/mc.jsonl").read_text()
    assert sorted(p.name for p in dest.iterdir()) == ["eval_bundle", "eval_bundle.lock"]  # no temporaries left
    assert download_eval_bundle(str(dest), url=url + "/eval_bundle.zip") == bundle
    assert _CountingHandler.hits == ["/eval_bundle.zip"]  # the second call found it in place
    # the default location is base_dir()/eval_bundle, and the downloaded bundle evaluates
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(dest))
    monkeypatch.delenv("NANOCHAT_EVAL_BUNDLE", raising=False)
    assert resolve_eval_bundle(url=url + "/eval_bundle.zip") == bundle
    out = evaluate_core(BigramModel(STUB_PAIRS), ByteTokenizer(), "cpu", bundle)
    assert out["results"] == {"mc": 5 / 8, "sc": 3 / 4, "lm": 3 / 5}
    monkeypatch.setenv("NANOCHAT_EVAL_BUNDLE", source)
    assert resolve_eval_bundle(url="http://127.0.0.1:9/unused") == source


def test_download_failure_leaves_nothing_behind(tmp_path, http_root):
    root, url = http_root
    (root / "not_a_zip.zip").write_text("hello")
    dest = tmp_path / "base"
    with pytest.raises(ConnectionError, match="could not download.*--eval-bundle"):
        download_eval_bundle(str(dest), url=url + "/missing.zip")
    with pytest.raises(ValueError, match="did not serve a zip"):
        download_eval_bundle(str(dest), url=url + "/not_a_zip.zip")
    assert [p.name for p in dest.iterdir()] == ["eval_bundle.lock"]


# ----------------------------------------------------------------------------- distributed striding

def _strided_worker(rank, world, init_file, bundle, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        meta = {m["label"]: m for m in core_eval.load_task_metas(bundle)}["mc"]
        data = load_task_data(bundle, meta)
        model = BigramModel(STUB_PAIRS)
        acc = evaluate_task(model, ByteTokenizer(), data, "cpu", meta)
        queries = [ByteTokenizer().decode(x[0].tolist()).rsplit("\n\n", 1)[-1].split("\n")[0] for x in model.inputs]
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"acc": acc, "queries": queries}))
    finally:
        dist.destroy_process_group()


def test_ranks_stride_and_sum(tmp_path):
    bundle = make_bundle(tmp_path)
    mp.spawn(_strided_worker, args=(2, str(tmp_path / "rdv"), bundle, str(tmp_path)), nprocs=2)
    meta = {m["label"]: m for m in core_eval.load_task_metas(bundle)}["mc"]
    data = load_task_data(bundle, meta)
    single = evaluate_task(BigramModel(STUB_PAIRS), ByteTokenizer(), data, "cpu", meta)
    assert single == 5 / 8
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["acc"] == single
        assert got["queries"] == [data[i]["query"] for i in range(rank, len(data), 2)]


# ----------------------------------------------------------------------------- the real bundle

needs_real_bundle = pytest.mark.skipif(not (REAL_BUNDLE / "core.yaml").is_file(),
                                       reason=f"no eval bundle at {REAL_BUNDLE}")


@needs_real_bundle
def test_real_bundle_tasks_and_missing_files():
    metas = core_eval.load_task_metas(str(REAL_BUNDLE))
    assert len(metas) == 22
    assert {m["task_type"] for m in metas} == set(core_eval.TASK_TYPES)
    with pytest.raises(ValueError) as err:
        select_tasks(str(REAL_BUNDLE))
    absent = [m["label"] for m in metas if not os.path.isfile(core_eval.task_path(str(REAL_BUNDLE), m))]
    for label in absent:
        assert f"  {label}: " in str(err.value)
    selected, missing = select_tasks(str(REAL_BUNDLE), "available")
    assert missing == absent and len(selected) + len(absent) == 22
    assert [m["label"] for m in selected] == [m["label"] for m in metas if m["label"] not in absent]


@needs_real_bundle
def test_real_bundle_renders_every_available_task():
    tok = ByteTokenizer()
    selected, _ = select_tasks(str(REAL_BUNDLE), "available")
    for meta in selected:
        data = load_task_data(str(REAL_BUNDLE), meta)
        assert len(data) > meta["num_fewshot"]
        for idx in range(3):
            item = data[idx]
            shots = fewshot_examples(data, idx, meta["num_fewshot"])
            prompts = render_prompts(item, meta["task_type"], meta["continuation_delimiter"], shots)
            rows, starts, ends = encode_prompts(tok, prompts, meta["task_type"])
            assert all(r[0] == BOS for r in rows) and all(0 < s <= e == len(r) for r, s, e in zip(rows, starts, ends))
            if meta["task_type"] == "multiple_choice":
                assert len(prompts) == len(item["choices"])
                # the span is the tail of the choice after the tokens every choice shares
                assert all(c.endswith(tok.decode(r[s:])) for r, s, c in zip(rows, starts, item["choices"]))
            elif meta["task_type"] == "schema":
                assert tok.decode(rows[0][starts[0]:]).endswith(meta["continuation_delimiter"] + item["continuation"])
            else:
                without, with_ = prompts
                assert with_.startswith(without) and with_.endswith(item["continuation"])
                assert tok.decode(rows[0][starts[0]:]) == with_[len(without):]
            # the few-shot examples precede the item, separated by blank lines
            assert prompts[0].count("\n\n") >= meta["num_fewshot"]


@needs_real_bundle
def test_real_bundle_evaluates_with_a_stub(tmp_path):
    out = evaluate_core(BigramModel(STUB_PAIRS), ByteTokenizer(), "cpu", str(REAL_BUNDLE), max_per_task=11,
                        tasks="available")
    assert len(out["results"]) == 22 - len(out["tasks_missing"]) and out["partial"]
    assert all(t["examples"] == 11 for t in out["tasks"].values())
    assert all(0.0 <= a <= 1.0 for a in out["results"].values())


@needs_real_bundle
def test_gpt2_reference_csvs_parse_and_center_consistently():
    baselines = {m["label"]: m["random_baseline"] for m in core_eval.load_task_metas(str(REAL_BUNDLE))}
    files = sorted(REAL_BUNDLE.glob("openai-community-gpt2*.csv"))
    assert len(files) == 4
    cores = {}
    for path in files:
        rows, core = read_reference_csv(path)
        assert set(rows) == set(baselines)
        for task, (accuracy, centered) in rows.items():
            assert centered_accuracy(accuracy, baselines[task]) == pytest.approx(centered, abs=2e-6)
        assert core == pytest.approx(sum(c for _, c in rows.values()) / len(rows), abs=2e-6)
        cores[path.stem] = core
    # nanochat's published GPT-2 CORE values
    assert cores["openai-community-gpt2"] == pytest.approx(0.1139, abs=1e-4)
    assert cores["openai-community-gpt2-xl"] == pytest.approx(0.256525, abs=1e-6)


# ----------------------------------------------------------------------------- the CLI, end to end

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A base dir with a small corpus, a trained tokenizer and a saved tiny KromHC GPT (untrained)."""
    import dataclasses

    from nanochat import checkpoint_manager as checkpoint
    from nanochat.data.local import write_corpus
    from nanochat.gpt import GPTConfig, build_model
    from nanochat.tokenizer import Tokenizer

    base = tmp_path_factory.mktemp("base")
    rng = random.Random(0)
    words = "the a cat dog sat ran on under tree house river quickly slowly big small red blue".split()
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(20, 60))).capitalize() + "." for _ in range(300)]
    write_corpus(docs, str(base / "base_data"), {"source": "test"}, rows_per_group=16)
    tokenizer = Tokenizer.train_from_iterator(docs, 400)
    tokenizer.save(str(base / "tokenizer"))
    torch.manual_seed(0)
    config = GPTConfig(sequence_len=32, vocab_size=tokenizer.get_vocab_size(), n_layer=2, n_head=2, n_kv_head=2,
                       n_embd=32, window_pattern="L", hc="kromhc", hc_streams=4)
    model = build_model(config, "cpu")
    run_dir = base / "runs" / "tiny"
    meta = {"step": 5, "model_config": dataclasses.asdict(config), "settings": {}, "world_size": 1}
    checkpoint.save_rank_files(str(run_dir), 5, 0, {}, model_state=model.state_dict(), meta=meta)
    checkpoint.mark_latest(str(run_dir), 5)
    return base, run_dir


def run_cli(base, *args):
    import sys

    # one intra-op thread: a tiny model gains nothing from more, and on a shared 2-core
    # machine oversubscribed threads make it ten times slower
    env = dict(os.environ, NANOCHAT_BASE_DIR=str(base), NANOCHAT_DTYPE="float32", CUDA_VISIBLE_DEVICES="",
               OMP_NUM_THREADS="1")
    env.pop("NANOCHAT_EVAL_BUNDLE", None)
    return launch.run([sys.executable, "-m", "scripts.base_eval", *args], cwd=Path(__file__).resolve().parents[1],
                      env=env, capture_output=True, text=True, timeout=300)


@needs_real_bundle
def test_cli_refuses_the_full_task_list_of_an_incomplete_bundle(tiny_run):
    base, _ = tiny_run
    proc = run_cli(base, "--model-tag", "tiny", "--eval", "core", "--eval-bundle", str(REAL_BUNDLE))
    assert proc.returncode != 0
    assert "lacks the data of" in proc.stderr and "--tasks available" in proc.stderr and "Traceback" not in proc.stderr


@needs_real_bundle
@pytest.mark.slow
def test_cli_evaluates_a_tiny_model_on_every_available_task(tiny_run):
    base, run_dir = tiny_run
    proc = run_cli(base, "--model-tag", "tiny", "--eval-bundle", str(REAL_BUNDLE), "--tasks", "available",
                   "--max-per-task", "11", "--device-batch-size", "2", "--split-tokens", "256", "--device-type", "cpu")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CORE (partial: 18 tasks)" in proc.stdout
    metas = core_eval.load_task_metas(str(REAL_BUNDLE))
    absent = [m["label"] for m in metas if not os.path.isfile(core_eval.task_path(str(REAL_BUNDLE), m))]
    core = json.loads((run_dir / "core.json").read_text())
    assert list(core["tasks"]) == [m["label"] for m in metas if m["label"] not in absent]
    assert core["partial"] is True and core["settings"]["tasks_missing"] == absent
    assert core["settings"]["max_per_task"] == 11 and core["settings"]["step"] == 5
    assert core["settings"]["dtype"] == "float32" and core["settings"]["max_seq_len"] == 320  # 10 x sequence_len
    assert core["settings"]["compile"] is False and core["settings"]["graphs"] == 0  # eager: the CPU's default
    baselines = {m["label"]: m["random_baseline"] for m in metas}
    for label, t in core["tasks"].items():
        assert t["examples"] == 11 and t["accuracy"] in {k / 11 for k in range(12)}
        assert t["centered"] == pytest.approx(centered_accuracy(t["accuracy"], baselines[label]), abs=1e-12)
    assert core["core_metric"] == pytest.approx(sum(t["centered"] for t in core["tasks"].values()) / 18, abs=1e-12)
    rows = (run_dir / "core.csv").read_text().splitlines()
    assert rows[0] == "task,type,shots,examples,accuracy,centered" and len(rows) == 20
    assert rows[-1] == f"CORE,,,,,{core['core_metric']:.6f}"
    results = json.loads((run_dir / "eval.json").read_text())
    assert results["step"] == 5
    # an untrained model: close to uniform over the vocabulary, so a few bits per byte
    assert 0 < results["bpb"]["val"] < 20 and 0 < results["bpb"]["train"] < 20
    assert [s["prompt"] for s in results["samples"]["greedy"]][0] == "The capital of France is"
    assert len(results["samples"]["greedy"]) == 7 and len(results["samples"]["temperature"]) == 4

    # the CLI's numbers are evaluate_core's on the same checkpoint
    from nanochat import checkpoint_manager as checkpoint
    from nanochat.tokenizer import get_tokenizer
    model, _ = checkpoint.load_model(str(run_dir), device="cpu")
    tokenizer = get_tokenizer(str(base / "tokenizer"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = evaluate_core(model, tokenizer, "cpu", str(REAL_BUNDLE), max_per_task=11,
                            tasks="copa,winograd,bigbench_operators", max_seq_len=model.rotary_len)
    finally:
        torch.set_num_threads(threads)
    for label, accuracy in out["results"].items():
        assert accuracy == core["tasks"][label]["accuracy"]

    # --step names the outputs after the step
    proc = run_cli(base, "--model-tag", "tiny", "--step", "5", "--eval", "core", "--eval-bundle", str(REAL_BUNDLE),
                   "--tasks", "copa", "--max-per-task", "5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(json.loads((run_dir / "core_000005.json").read_text())["tasks"]) == ["copa"]
