"""--from-hf: local jsonl and parquet sources through `datasets` (offline), the shard layout,
the pinned val split, shuffling, kill and resume in a real subprocess, every refusal and
bad-input error, and training the tokenizer and the model on the result."""

import json
import os
import shutil
import signal
import sys

# No test reaches the Hub: conftest.py sets HF_HUB_OFFLINE, HF_DATASETS_OFFLINE and a
# session HF_HOME before anything imports `datasets`.
import pyarrow as pa
import pyarrow.parquet as pq
import launch
import pytest
from filelock import FileLock

from nanochat import dataset
from nanochat.data import hf
from nanochat.data.download import download
from nanochat.data.local import write_corpus
from nanochat.data.shards import (MARKER, VAL_SHARD, DatasetError, list_parquet_files, parquets_iter_batched,
                                  shard_name)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VAL = shard_name(VAL_SHARD)


@pytest.fixture
def docs(small_corpus_dir):
    """120 real documents, unique."""
    out = [d for batch in parquets_iter_batched("train", data_dir=small_corpus_dir) for d in batch]
    return list(dict.fromkeys(out))[:120]


@pytest.fixture
def source(tmp_path, docs):
    """The documents as two jsonl files with noise rows mixed in (an empty text, a
    whitespace-only text, a null, a missing field, a copy of a val document), and the
    clean documents as a parquet file with another column name."""
    rows = []
    for i, d in enumerate(docs):
        rows.append({"text": d, "id": i})
        if i == 30:
            rows += [{"text": "", "id": -1}, {"text": "  \n ", "id": -2}, {"text": None, "id": -3}, {"id": -4},
                     {"text": docs[2], "id": -5}]
    src = tmp_path / "src"
    src.mkdir()
    half = len(rows) // 2
    for name, part in (("a.jsonl", rows[:half]), ("b.jsonl", rows[half:])):
        (src / name).write_text("".join(json.dumps(r) + "\n" for r in part))
    pq.write_table(pa.table({"body": docs, "n": list(range(len(docs)))}), src / "docs.parquet", row_group_size=25)
    return src


def convert(src, out, *flags, pattern="*.jsonl", builder="json"):
    dataset.main(["--from-hf", builder, "--hf-data-files", str(src / pattern), "--data-dir", str(out), *flags])
    return json.load(open(out / MARKER))


def texts(directory):
    """{shard name: documents} of every shard in a directory."""
    return {name: pq.read_table(os.path.join(directory, name)).column("text").to_pylist()
            for name in sorted(os.listdir(directory)) if name.endswith(".parquet")}


# -------------------------------------------------------------------------- conversion

def test_jsonl_and_parquet_give_the_same_shards(tmp_path, source, docs, capsys):
    marker = convert(source, tmp_path / "j", "--shard-docs", "30", "--val-docs", "10")
    shards = texts(tmp_path / "j")
    # the val shard is the first 10 usable documents; train the rest in order, minus the val copy
    assert shards.pop(VAL) == docs[:10]
    assert list(shards) == [shard_name(i) for i in range(4)]
    assert [len(s) for s in shards.values()] == [30, 30, 30, 20]
    assert sum(shards.values(), []) == docs[10:]
    assert marker["complete"] and marker["source"] == "hf" and marker["dataset"] == "json"
    assert marker["skipped"] == {"empty": 2, "non_text": 2, "val_duplicate": 1}
    assert marker["documents"] == 120 and marker["rows_read"] == 125
    assert marker["train_documents"] == 110 and marker["val_documents"] == 10 and marker["train_shards"] == 4
    assert marker["characters"] == sum(map(len, docs))
    assert marker["data_files"] == [str(source / "*.jsonl")] and marker["split"] == "train"
    assert "skipped 2 empty, 2 non text, 1 val duplicate" in capsys.readouterr().out
    for name in shards:  # row groups of 1024 documents: one per shard this small
        assert pq.ParquetFile(tmp_path / "j" / name).metadata.num_row_groups == 1
    assert list_parquet_files("val", tmp_path / "j") == [str(tmp_path / "j" / VAL)]

    convert(source, tmp_path / "p", "--shard-docs", "30", "--val-docs", "10", "--text-column", "body",
            pattern="docs.parquet", builder="parquet")
    assert texts(tmp_path / "p") == texts(tmp_path / "j")
    # again into the same directory: nothing to do
    assert convert(source, tmp_path / "j", "--shard-docs", "30", "--val-docs", "10") == marker


def test_a_prefix_reads_only_the_prefix(tmp_path, source, docs):
    marker = convert(source, tmp_path / "d", "--max-docs", "25", "--val-docs", "5", "--shard-docs", "8")
    assert marker["documents"] == 25 and marker["rows_read"] == 25  # stopped right at the limit
    shards = texts(tmp_path / "d")
    assert shards.pop(VAL) == docs[:5] and sum(shards.values(), []) == docs[5:25]
    assert [len(s) for s in shards.values()] == [8, 8, 4]
    budget = sum(map(len, docs[:12]))
    marker = convert(source, tmp_path / "c", "--max-chars", str(budget), "--val-docs", "5")
    assert marker["documents"] == 12 and marker["characters"] == budget


def test_shuffle_is_seeded_and_keeps_every_document(tmp_path, source, docs):
    flags = ["--shard-docs", "40", "--val-docs", "10", "--shuffle-seed", "0", "--shuffle-buffer", "50"]
    for name, seed in (("a", "0"), ("b", "0"), ("c", "1")):
        convert(source, tmp_path / name, *flags[:5], seed, *flags[6:])
    first, other = texts(tmp_path / "a"), texts(tmp_path / "c")
    assert texts(tmp_path / "b") == first
    order = first[VAL] + sum((first[shard_name(i)] for i in range(3)), [])
    assert order != docs and other != first
    assert sorted(order) == sorted(docs)  # a permutation: nothing lost, nothing twice
    assert not set(first[VAL]) & set(order[10:])  # val never overlaps train


# ----------------------------------------------------------------------- kill and resume

KILLER = """
import os, signal, sys
from nanochat import dataset
from nanochat.data import hf
real, calls = hf.write_shard, []

def write_shard(path, docs, rows_per_group):
    calls.append(path)
    if len(calls) == 3 and sys.argv[1] == "mid-write":  # torn: a temporary file, never renamed
        open(path + ".1.tmp", "wb").write(b"PAR1 half a shard")
        os.kill(os.getpid(), signal.SIGKILL)
    real(path, docs, rows_per_group)
    if len(calls) == 3:  # renamed, but the marker does not count it yet
        os.kill(os.getpid(), signal.SIGKILL)

hf.write_shard = write_shard
dataset.main(sys.argv[2:])
"""


@pytest.mark.parametrize("where, shuffle", [("mid-write", ["--shuffle-seed", "3", "--shuffle-buffer", "30"]),
                                            ("after-rename", [])])
def test_killed_conversion_resumes_to_the_same_result(tmp_path, source, where, shuffle, capsys):
    flags = ["--shard-docs", "20", "--val-docs", "10", "--max-docs", "100", *shuffle]
    reference = convert(source, tmp_path / "ref", *flags)
    args = ["--from-hf", "json", "--hf-data-files", str(source / "*.jsonl"), "--data-dir", str(tmp_path / "out"), *flags]
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = launch.run([sys.executable, "-c", KILLER, where, *args], cwd=REPO, env=env, capture_output=True,
                      text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    marker = json.load(open(tmp_path / "out" / MARKER))
    assert marker["complete"] is False and marker["checkpoint"]["train_shards"] == 1  # val + shard 0 finished
    # an unshuffled stream saves its position, so the resumed run does not read the first rows again
    assert ("stream_state" in marker["checkpoint"]) == (not shuffle)
    with pytest.raises(DatasetError, match=r"unfinished build: run `python -m nanochat.dataset --from-hf json"):
        list_parquet_files("train", tmp_path / "out")
    kept = (tmp_path / "out" / shard_name(0)).read_bytes()

    capsys.readouterr()
    resumed = convert(source, tmp_path / "out", *flags)
    assert "(1 train shards kept)" in capsys.readouterr().out
    assert (tmp_path / "out" / shard_name(0)).read_bytes() == kept  # finished shards are kept, not redone
    assert texts(tmp_path / "out") == texts(tmp_path / "ref")
    assert not [f for f in os.listdir(tmp_path / "out") if f.endswith(".tmp")]
    assert comparable(resumed) == comparable(reference)


def comparable(marker):
    """A marker without what may differ between equal conversions: the command (it names
    the directory) and the library's bookkeeping of its stream position."""
    checkpoint = {k: v for k, v in marker["checkpoint"].items() if k != "stream_state"}
    return {**{k: v for k, v in marker.items() if k != "command"}, "checkpoint": checkpoint}


def test_a_complete_conversion_extends_to_a_larger_limit(tmp_path, source):
    small = convert(source, tmp_path / "x", "--shard-docs", "20", "--val-docs", "10", "--max-docs", "45")
    assert small["train_shards"] == 2
    convert(source, tmp_path / "x", "--shard-docs", "20", "--val-docs", "10", "--max-docs", "90")
    convert(source, tmp_path / "y", "--shard-docs", "20", "--val-docs", "10", "--max-docs", "90")
    assert texts(tmp_path / "x") == texts(tmp_path / "y")
    with pytest.raises(SystemExit, match="a smaller limit needs another --data-dir"):
        convert(source, tmp_path / "x", "--shard-docs", "20", "--val-docs", "10", "--max-docs", "50")


# ------------------------------------------------------------------------------ refusals

def test_a_second_conversion_is_refused_by_the_lock(tmp_path, source):
    (tmp_path / "out").mkdir()
    with FileLock(str(tmp_path / "out" / hf.LOCK)):
        with pytest.raises(SystemExit, match=r"another conversion is writing into .*out"):
            convert(source, tmp_path / "out", "--val-docs", "5")
    assert os.listdir(tmp_path / "out") == [hf.LOCK]  # nothing written
    convert(source, tmp_path / "out", "--val-docs", "5")  # free again


def test_a_directory_of_another_corpus_is_refused(tmp_path, source, docs):
    write_corpus(docs[:30], tmp_path / "text", {"source": "text", "inputs": ["notes.txt"]})
    with pytest.raises(SystemExit, match=r"holds the 'text' corpus"):
        convert(source, tmp_path / "text", "--val-docs", "5")
    (tmp_path / "fw").mkdir()
    pq.write_table(pa.table({"text": docs[:3]}), tmp_path / "fw" / shard_name(0))
    with pytest.raises(SystemExit, match=r"holds shards without CORPUS.json"):
        convert(source, tmp_path / "fw", "--val-docs", "5")

    convert(source, tmp_path / "hf", "--val-docs", "5", "--max-docs", "20")
    with pytest.raises(SystemExit, match=r"holds another conversion, json \(split train.*differs in shuffle_seed"):
        convert(source, tmp_path / "hf", "--val-docs", "5", "--max-docs", "20", "--shuffle-seed", "1")
    with pytest.raises(SystemExit, match=r"differs in dataset, data_files, text_column"):
        convert(source, tmp_path / "hf", "--val-docs", "5", "--max-docs", "20", "--text-column", "body",
                pattern="docs.parquet", builder="parquet")
    with pytest.raises(DatasetError, match="would mix"):  # and the other way round
        download(1, tmp_path / "hf", base_url="http://127.0.0.1:9")
    with pytest.raises(DatasetError, match=r"holds the 'hf' corpus"):
        write_corpus(docs[:30], tmp_path / "hf", {"source": "text"})
    assert len(texts(tmp_path / "hf")) == 2


def test_missing_text_column_lists_the_columns(tmp_path, source):
    with pytest.raises(SystemExit, match=r"json has no column 'content'; its columns: text, id. Pass --text-column"):
        convert(source, tmp_path / "out", "--text-column", "content", "--val-docs", "5")
    with pytest.raises(SystemExit, match=r"gave 58 usable documents .* Lower --val-docs"):
        convert(source, tmp_path / "few", "--val-docs", "60", pattern="a.jsonl")


# ------------------------------------------------------------------------------ bad input

NUMERIC = ["-n", "--num-workers", "--max-docs", "--max-chars", "--shard-docs", "--val-docs", "--shuffle-seed",
           "--shuffle-buffer"]
# Values that mean something for a flag, and the words of its help that say what.
MEANINGFUL = {("-n", "0"): "0 means only the val shard", ("-n", "-1"): "-1 means all of them",
              ("--shuffle-seed", "0"): "0 is a valid seed"}


@pytest.mark.parametrize("flag", NUMERIC)
@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_numeric_flags_reject_bad_values(flag, value, capsys, tmp_path):
    if (flag, value) in MEANINGFUL:
        assert MEANINGFUL[flag, value] in " ".join(dataset.build_parser().format_help().split())
        return
    hf_flags = [] if flag in ("-n", "--num-workers") else ["--from-hf", "json", "--hf-data-files", "x.jsonl",
                                                          "--shuffle-seed", "1"]
    with pytest.raises(SystemExit) as err:
        dataset.main([*hf_flags, flag, value, "--data-dir", str(tmp_path)])
    assert err.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(lines) == 1 and flag.lstrip("-") in lines[0] and "expected" in lines[0]


@pytest.mark.parametrize("argv, message", [
    (["--from-hf", "json", "--hf-data-files", "{tmp}/none/*.jsonl"], "no file matches"),
    (["--from-hf", "json"], "reads local files: add --hf-data-files"),
    (["--from-hf", "json", "--hf-data-files", "{src}/*.jsonl", "--val-docs", "10", "--max-docs", "10"],
     "leaves no train documents"),
    (["--from-hf", "json", "--hf-data-files", "{src}/*.jsonl", "--hf-split", "test"], "cannot stream json"),
    (["--from-hf", "json", "--hf-data-files", "{src}/*.jsonl", "--data-dir", "{src}/a.jsonl"], "is a file"),
    (["--from-hf", "json", "--hf-data-files", "{src}/*.jsonl", "--data-dir", "{src}/a.jsonl/sub"], "is a file"),
    (["--hf-config", "x", "-n", "2"], "--hf-config: options of --from-hf NAME"),
    (["--from-hf", "json", "--hf-data-files", "{src}/*.jsonl", "--shuffle-buffer", "5"], "needs --shuffle-seed"),
])
def test_bad_input_is_one_error_line(argv, message, tmp_path, source, capsys):
    argv = [a.format(tmp=tmp_path, src=source) for a in argv]
    if "--data-dir" not in argv:
        argv += ["--data-dir", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as err:
        dataset.main(argv)
    # parser errors print to stderr and exit 2; the others exit with their message
    output = capsys.readouterr().err if err.value.code == 2 else str(err.value.code)
    errors = [line for line in output.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], output


def test_a_bad_source_through_the_cli_has_no_traceback(tmp_path, source):
    proc = launch.run([sys.executable, "-m", "nanochat.dataset", "--from-hf", "json", "--hf-data-files",
                           str(source / "*.jsonl"), "--hf-split", "test", "--data-dir", str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO), timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "error: cannot stream json" in proc.stderr


# ------------------------------------------------------------------------------ training

@pytest.mark.slow
def test_tokenizer_and_model_train_on_a_converted_corpus(tmp_path, source, tokenizer_dir):
    from test_train_e2e import train

    from nanochat.report.build import write_report
    from nanochat.report.runs import load_run
    from scripts import tok_train

    data = tmp_path / "corpus"
    convert(source, data, "--shard-docs", "40", "--val-docs", "20")
    tok = tok_train.main(["--vocab-size", "300", "--data-dir", str(data), "--tokenizer-dir", str(tmp_path / "tok")])
    assert tok.get_vocab_size() == 300
    info = json.load(open(tmp_path / "tok" / "tokenizer.json"))["info"]
    assert info["source"] == "hf" and info["corpus"].startswith("json (split train")

    base = tmp_path / "base"
    shutil.copytree(tokenizer_dir, base / "tokenizer")
    proc = train(str(base), "--num-iterations", "5", "--data-dir", str(data), "--model-tag", "hf")
    assert f"data: json (split train, files {source}/*.jsonl, 120 documents) in {data}" in proc.stdout
    run = base / "runs" / "hf"
    summary = json.load(open(run / "summary.json"))
    assert summary["complete"] and summary["step"] == 5
    corpus = json.load(open(run / "corpus.json"))
    assert corpus["marker"]["dataset"] == "json" and corpus["data_dir"] == str(data)
    readme = write_report([load_run(run)], tmp_path / "report")
    assert f"- Trained on json (split train, files {source}/*.jsonl, 120 documents): hf" in readme.read_text()


def test_a_failing_source_says_how_to_resume(tmp_path, source, docs):
    (source / "b.jsonl").write_text((source / "b.jsonl").read_text() + "{this is not json\n")
    with pytest.raises(SystemExit, match=r"error: reading json failed \(.*\): run the same command again to resume"):
        convert(source, tmp_path / "out", "--val-docs", "5", "--shard-docs", "20")
    marker = json.load(open(tmp_path / "out" / MARKER))
    assert marker["complete"] is False and marker["checkpoint"]["train_shards"] >= 1


def test_a_shuffled_conversion_resumes_only_with_its_datasets_version(tmp_path, source):
    flags = ["--val-docs", "5", "--shard-docs", "10", "--shuffle-seed", "0"]
    convert(source, tmp_path / "out", *flags, "--max-docs", "30")
    marker = json.load(open(tmp_path / "out" / MARKER))
    json.dump(dict(marker, datasets_version="1.0.0"), open(tmp_path / "out" / MARKER, "w"))
    with pytest.raises(SystemExit, match=r"made with datasets 1.0.0.*pip install datasets==1.0.0"):
        convert(source, tmp_path / "out", *flags, "--max-docs", "60")


def test_the_hub_revision_is_read_from_the_resolved_files():
    sha = "0123456789abcdef0123456789abcdef01234567"
    resolved = type("Config", (), {"data_files": {"train": [f"hf://datasets/org/name@{sha}/data/train-0.parquet"]}})
    assert hf._revision_of(type("Builder", (), {"config": resolved})) == sha
    local = type("Config", (), {"data_files": {"train": ["/data/a.jsonl"]}})
    assert hf._revision_of(type("Builder", (), {"config": local})) is None
