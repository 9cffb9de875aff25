"""Shards on disk: downloads from a local HTTP server (success, transient failures,
truncated files, concurrent downloaders, 404), the pinned val split, listing errors, the
data-size check, the offline corpus (deterministic, through the CLI) and --from-text."""

import http.server
import json
import math
import os
import socket
import sys
import threading
import time
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import launch
import pytest

from nanochat import dataset
from nanochat.data import local, shards
from nanochat.data.download import download, download_shard, wanted_shards
from nanochat.data.shards import (DatasetError, MARKER, VAL_SHARD, check_enough_data, list_parquet_files,
                                  parquets_iter_batched, shard_name, split_stats, verify_shard)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VAL = shard_name(VAL_SHARD)


@pytest.fixture(autouse=True)
def private_base_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(tmp_path / "base"))
    monkeypatch.delenv("NANOCHAT_DATA_URL", raising=False)


class ShardServer:
    """Serves `files` (name -> bytes) on 127.0.0.1 and counts GETs per name. fail[name] = k:
    the next k GETs answer 503; truncate[name] = k: the next k GETs send the first half of
    the file (with a matching Content-Length, so only the content check can notice)."""

    def __init__(self, files):
        self.files, self.fail, self.truncate = dict(files), {}, {}
        self.delay, self.gets, self.lock = 0.0, Counter(), threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.send_response(200 if self.path.lstrip("/") in server.files else 404)
                self.end_headers()

            def do_GET(self):
                name = self.path.lstrip("/")
                with server.lock:
                    server.gets[name] += 1
                    fail, cut = server.fail.get(name, 0), server.truncate.get(name, 0)
                    server.fail[name], server.truncate[name] = max(0, fail - 1), max(0, cut - 1)
                time.sleep(server.delay)
                if name not in server.files:
                    self.send_error(404)
                    return
                if fail:
                    self.send_error(503)
                    return
                body = server.files[name][:len(server.files[name]) // 2] if cut else server.files[name]
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _shard_bytes(docs, tmp_path, name):
    path = tmp_path / f"src_{name}"
    pq.write_table(pa.table({"text": docs}), path, row_group_size=8, compression="zstd")
    return path.read_bytes()


def shard_server(tmp_path, small_corpus_dir, val_name):
    """A server holding train shards 0..2 and the val shard `val_name`, made of real text."""
    docs = [d for batch in parquets_iter_batched("train", data_dir=small_corpus_dir) for d in batch]
    files = {shard_name(i): _shard_bytes(docs[i * 40:(i + 1) * 40], tmp_path, shard_name(i)) for i in range(3)}
    files[val_name] = _shard_bytes(docs[120:150], tmp_path, val_name)
    return ShardServer(files)


@pytest.fixture
def served(tmp_path, small_corpus_dir):
    """FineWeb-Edu's names: train shards 0..2 and the val shard."""
    server = shard_server(tmp_path, small_corpus_dir, VAL)
    yield server
    server.close()


def _closed_port_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _leftovers(directory):
    return [f for f in os.listdir(directory) if f.endswith(".tmp")]


# ------------------------------------------------------------------------------ download

def test_download_fetches_val_and_train_shards(served, tmp_path):
    d = tmp_path / "data"
    paths = download(2, d, workers=2, base_url=served.url, backoff=0)
    assert sorted(map(os.path.basename, paths)) == sorted([VAL, shard_name(0), shard_name(1)])
    for path in paths:
        assert open(path, "rb").read() == served.files[os.path.basename(path)]
    assert json.load(open(d / MARKER))["source"] == "fineweb-edu"
    assert list_parquet_files("val", d) == [str(d / VAL)]
    assert list_parquet_files("train", d) == [str(d / shard_name(0)), str(d / shard_name(1))]
    # A second run finds every shard verified on disk and makes no request.
    before = sum(served.gets.values())
    download(2, d, base_url=served.url, backoff=0)
    assert sum(served.gets.values()) == before
    assert _leftovers(d) == []


def test_transient_failures_are_retried(served, tmp_path, capsys):
    served.fail[shard_name(0)] = 2
    path = download_shard(0, str(tmp_path), base_url=served.url, attempts=3, backoff=0.01)
    assert served.gets[shard_name(0)] == 3
    assert open(path, "rb").read() == served.files[shard_name(0)]
    assert capsys.readouterr().out.count("retrying") == 2


def test_persistent_failure_raises_and_leaves_nothing(served, tmp_path):
    served.fail[shard_name(0)] = 10
    with pytest.raises(DatasetError, match=r"after 3 attempts"):
        download_shard(0, str(tmp_path), base_url=served.url, attempts=3, backoff=0.01)
    assert served.gets[shard_name(0)] == 3
    assert not os.path.exists(tmp_path / shard_name(0)) and _leftovers(tmp_path) == []


def test_truncated_file_is_never_kept(served, tmp_path):
    served.truncate[shard_name(1)] = 1  # first answer truncated, second complete
    path = download_shard(1, str(tmp_path), base_url=served.url, attempts=3, backoff=0.01)
    assert served.gets[shard_name(1)] == 2
    assert open(path, "rb").read() == served.files[shard_name(1)]

    served.truncate[shard_name(2)] = 10  # always truncated: refused, nothing left on disk
    with pytest.raises(DatasetError, match="not a readable parquet shard"):
        download_shard(2, str(tmp_path), base_url=served.url, attempts=2, backoff=0.01)
    assert not os.path.exists(tmp_path / shard_name(2)) and _leftovers(tmp_path) == []


def test_corrupt_file_on_disk_is_fetched_again(served, tmp_path):
    (tmp_path / shard_name(0)).write_bytes(served.files[shard_name(0)][:100])
    path = download_shard(0, str(tmp_path), base_url=served.url, backoff=0)
    assert served.gets[shard_name(0)] == 1
    assert open(path, "rb").read() == served.files[shard_name(0)]


def test_concurrent_downloaders_fetch_once(served, tmp_path):
    served.delay = 0.5  # both start while the first download is in flight
    results, errors = [], []

    def run():
        try:
            results.append(download_shard(0, str(tmp_path), base_url=served.url, backoff=0))
        except Exception as e:  # surfaced by the assert below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 2
    assert served.gets[shard_name(0)] == 1
    assert verify_shard(results[0], full=True) == 40


def test_missing_shard_is_not_retried(served, tmp_path):
    with pytest.raises(DatasetError, match="404"):
        download_shard(7, str(tmp_path), base_url=served.url, attempts=5, backoff=10)
    assert served.gets[shard_name(7)] == 1


def test_bad_shard_count_is_refused(tmp_path):
    with pytest.raises(ValueError, match="-n must be in"):
        download(5000, tmp_path)


def test_cli_download_env_url_and_failure_exit(served, tmp_path):
    env = dict(os.environ, NANOCHAT_DATA_URL=served.url)
    ok = launch.run([sys.executable, "-m", "nanochat.dataset", "-n", "3", "--data-dir", str(tmp_path / "a")],
                    cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert sorted(f for f in os.listdir(tmp_path / "a") if f.endswith(".parquet")) == \
        sorted([shard_name(0), shard_name(1), shard_name(2), VAL])
    # shard_00003 does not exist on the server: non-zero exit and a message naming it
    bad = launch.run([sys.executable, "-m", "nanochat.dataset", "-n", "4", "--base-url", served.url,
                          "--data-dir", str(tmp_path / "b")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0
    assert "shard_00003.parquet" in bad.stderr and "1 of 5 shards failed" in bad.stderr


# ------------------------------------------------------------------------------ listing

def _write(directory, index, docs, row_group_size=4):
    os.makedirs(directory, exist_ok=True)
    pq.write_table(pa.table({"text": docs}), os.path.join(directory, shard_name(index)), row_group_size=row_group_size,
                   compression="zstd", use_dictionary=False, write_statistics=False)  # the shard layout


def test_val_is_the_pinned_shard_not_the_last_on_disk(tmp_path):
    for i in (0, 1, 5):
        _write(tmp_path, i, [f"doc {i}.{j}" for j in range(10)])
    with pytest.raises(DatasetError, match=r"val shard shard_01822.parquet is missing.*python -m nanochat.dataset"):
        list_parquet_files("val", tmp_path)
    _write(tmp_path, VAL_SHARD, ["val doc"])
    assert list_parquet_files("val", tmp_path) == [str(tmp_path / VAL)]
    assert [os.path.basename(p) for p in list_parquet_files("train", tmp_path)] == \
        [shard_name(0), shard_name(1), shard_name(5)]


def test_listing_errors_name_the_fix(tmp_path):
    with pytest.raises(DatasetError, match=r"no shards in .*python -m nanochat.dataset -n 8"):
        list_parquet_files("train", tmp_path / "empty")
    _write(tmp_path, VAL_SHARD, ["v"])
    with pytest.raises(DatasetError, match="no train shards"):
        list_parquet_files("train", tmp_path)
    (tmp_path / shard_name(0)).write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(DatasetError, match=r"corrupt shard: .*shard_00000.parquet.*python -m nanochat.dataset -n 1"):
        list_parquet_files("train", tmp_path)
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / shard_name(0))
    with pytest.raises(DatasetError, match="no `text` column"):
        list_parquet_files("train", tmp_path)
    with pytest.raises(ValueError, match="split must be"):
        list_parquet_files("test", tmp_path)


def test_row_group_iteration_and_metadata_stats(tmp_path):
    docs = {0: [f"alpha {j} " * (20 + j) for j in range(10)], 1: [f"beta {j} " * 30 for j in range(7)]}
    for i, d in docs.items():
        _write(tmp_path, i, d, row_group_size=3)
    _write(tmp_path, VAL_SHARD, ["v1", "v2"])
    groups = list(parquets_iter_batched("train", data_dir=tmp_path))
    assert [len(g) for g in groups] == [3, 3, 3, 1, 3, 3, 1]
    assert sum(groups, []) == docs[0] + docs[1]
    odd = list(parquets_iter_batched("train", start=1, step=2, data_dir=tmp_path))
    assert odd == [docs[0][3:6], docs[0][9:10], docs[1][3:6]]
    stats = split_stats("train", tmp_path)
    assert stats["files"] == 2 and stats["row_groups"] == 7 and stats["docs"] == 17
    true_bytes = sum(len(t) for t in docs[0] + docs[1])
    assert abs(stats["text_bytes"] - true_bytes) <= 0.1 * true_bytes  # an estimate from metadata


def test_check_enough_data(tmp_path):
    _write(tmp_path, 0, ["word " * 2000] * 8)
    _write(tmp_path, VAL_SHARD, ["v"])
    stats = check_enough_data(100, tmp_path)
    assert stats["usable_tokens_estimate"] > 100
    needed = stats["usable_tokens_estimate"] * 3
    with pytest.raises(DatasetError) as err:
        check_enough_data(needed, tmp_path)
    n = math.ceil(needed * shards.CHARS_PER_TOKEN / shards.KEPT_FRACTION / stats["text_bytes"])
    assert n == 3 and f"`python -m nanochat.dataset -n {n} --data-dir {tmp_path}`" in str(err.value)
    assert "estimate" in str(err.value)
    with pytest.raises(DatasetError, match="even all 1822 train shards"):
        check_enough_data(stats["usable_tokens_estimate"] * 5000, tmp_path)


# ----------------------------------------------------------------------- local corpora

def _texts(directory):
    return {os.path.basename(p): pq.read_table(p).column("text").to_pylist()
            for split in ("train", "val") for p in list_parquet_files(split, directory)}


def test_offline_corpus_is_deterministic_and_marked(offline_corpus_dir, tmp_path):
    other = tmp_path / "again"
    env = dict(os.environ, PYTHONHASHSEED="12345")  # a different set/dict order must not matter
    run = launch.run([sys.executable, "-m", "nanochat.dataset", "--offline", "--data-dir", str(other)],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "OFFLINE CORPUS" in run.stdout
    first, second = _texts(offline_corpus_dir), _texts(other)
    assert first == second
    assert VAL in first and len(first) >= 2
    marker = json.load(open(os.path.join(offline_corpus_dir, MARKER)))
    assert marker == json.load(open(other / MARKER))
    assert marker["source"] == "offline" and marker["python"] == ".".join(map(str, sys.version_info[:3]))
    assert marker["documents"] == sum(map(len, first.values())) > 2000
    chars = sum(len(t) for docs in first.values() for t in docs)
    assert marker["characters"] == chars and 3e6 < chars < 9e6


def test_no_mixing_of_corpora(offline_corpus_dir, served, tmp_path):
    with pytest.raises(DatasetError, match="would mix"):
        download(1, offline_corpus_dir, base_url=served.url)
    assert served.gets == Counter()
    d = tmp_path / "fw"
    download(1, d, base_url=served.url, backoff=0)
    with pytest.raises(DatasetError, match="FineWeb-Edu shards"):
        local.write_corpus(["a", "b", "c"], d, {"source": "text"})


def test_offline_fallback(served, tmp_path, monkeypatch):
    built = []
    monkeypatch.setattr(dataset, "build_offline_corpus", lambda directory: built.append(directory))
    t0 = time.time()
    dataset.offline_fallback(2, tmp_path / "a", base_url=_closed_port_url())
    assert built == [str(tmp_path / "a")] and time.time() - t0 < 5
    dataset.offline_fallback(2, tmp_path / "b", base_url=served.url)
    assert built == [str(tmp_path / "a")]
    assert len(list_parquet_files("train", tmp_path / "b")) == 2
    # everything present: no probe, no request, even with the source gone
    before = sum(served.gets.values())
    dataset.offline_fallback(2, tmp_path / "b", base_url=_closed_port_url())
    assert sum(served.gets.values()) == before and len(built) == 1
    with pytest.raises(DatasetError, match="unreachable"):
        dataset.offline_fallback(3, tmp_path / "b", base_url=_closed_port_url())


def test_from_text(tmp_path, capsys):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    long_para = "A long paragraph. " * 300  # > TEXT_DOC_CHARS: kept whole in its own document
    paras = [f"Paragraph {i} says something about topic {i}.\nIt has a second line." for i in range(150)]
    (src / "book.txt").write_text("\n\n".join(paras[:100]) + "\n\n \n\n" + long_para + "\n\n" + "\n\n".join(paras[100:]))
    (src / "sub" / "notes.md").write_text("Short note.")
    (src / "sub" / "ignored.csv").write_text("a,b\n1,2\n")
    (src / "rows.jsonl").write_text("\n".join(json.dumps({"text": f"json document {i}", "id": i}) for i in range(12)) + "\n\n")
    out = tmp_path / "corpus"
    dataset.main(["--from-text", str(src), "--data-dir", str(out)])
    assert "Text corpus:" in capsys.readouterr().out
    texts = _texts(out)
    val, train = texts.pop(VAL), sum(texts.values(), [])
    docs = [None] * (len(val) + len(train))
    docs[::10], rest = val, iter(train)
    docs = [d if d is not None else next(rest) for d in docs]  # undo the every-10th val split
    book = docs[:-13]
    assert "\n\n".join(book) == "\n\n".join(paras[:100] + [long_para.strip("\n")] + paras[100:])
    assert long_para in book and all(len(d) <= local.TEXT_DOC_CHARS for d in book if d != long_para)
    assert docs[-13:] == [f"json document {i}" for i in range(12)] + ["Short note."]
    marker = json.load(open(out / MARKER))
    assert marker["source"] == "text" and marker["documents"] == len(docs)
    assert marker["complete"] is True
    # bad input exits with the file and line; the half-built corpus is marked, so the next build may replace it
    (src / "rows.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(SystemExit, match=r"rows.jsonl:2: .*`text`"):
        dataset.main(["--from-text", str(src), "--data-dir", str(out)])
    assert json.load(open(out / MARKER))["complete"] is False
    with pytest.raises(DatasetError, match=r"unfinished build.*--from-text"):
        list_parquet_files("val", out)
    (src / "rows.jsonl").write_text('{"text": "ok"}\n')
    dataset.main(["--from-text", str(src), "--data-dir", str(out)])
    assert sum(map(len, _texts(out).values())) == len(docs) - 11
    with pytest.raises(SystemExit, match="not a .txt, .md or .jsonl"):
        dataset.main(["--from-text", str(src / "sub" / "ignored.csv"), "--data-dir", str(out)])


# ---------------------------------------------------------------------------- ClimbMix

CLIMBMIX_VAL = shard_name(shards.SOURCES["climbmix"].val_shard)


@pytest.fixture
def climbmix_served(tmp_path, small_corpus_dir):
    """ClimbMix's names: train shards 0..2 and the val shard 06542."""
    server = shard_server(tmp_path, small_corpus_dir, CLIMBMIX_VAL)
    yield server
    server.close()


def test_climbmix_downloads_into_its_own_directory(climbmix_served, tmp_path):
    dataset.main(["--corpus", "climbmix", "-n", "2", "--base-url", climbmix_served.url])
    d = tmp_path / "base" / "base_data_climbmix"
    assert shards.data_dir(corpus="climbmix") == str(d) and not (tmp_path / "base" / "base_data").exists()
    assert sorted(f for f in os.listdir(d) if f.endswith(".parquet")) == [shard_name(0), shard_name(1), CLIMBMIX_VAL]
    assert json.load(open(d / MARKER)) == {"source": "climbmix", "url": climbmix_served.url}
    assert list_parquet_files("val", d) == [str(d / CLIMBMIX_VAL)]
    record = shards.corpus_record(corpus="climbmix")
    assert record["data_dir"] == str(d) and record["corpus"] == "climbmix" and "ClimbMix" in record["description"]
    with pytest.raises(DatasetError, match="would mix"):  # FineWeb-Edu's shards never join it
        download(1, d, base_url=climbmix_served.url)


def test_shard_ranges_are_the_corpus_own(tmp_path):
    assert wanted_shards(3, "climbmix") == [6542, 0, 1, 2]
    assert wanted_shards(-1, "climbmix") == [6542] + list(range(6542))
    assert wanted_shards(-1) == [1822] + list(range(1822))
    with pytest.raises(ValueError, match="0..6542 ClimbMix"):
        download(6543, tmp_path, corpus="climbmix")
    with pytest.raises(SystemExit, match="error: -n must be in 0..1822 FineWeb-Edu"):  # the CLI's bound is ClimbMix's
        dataset.main(["-n", "2000", "--data-dir", str(tmp_path)])
    with pytest.raises(ValueError, match="choose one of fineweb-edu, climbmix"):
        shards.data_dir(corpus="dclm")


def test_climbmix_without_a_marker_is_recognized(tmp_path):
    """Shards downloaded by nanochat itself (no marker): ClimbMix by its val shard."""
    for i in (0, 1):
        _write(tmp_path, i, [f"doc {i}.{j}" for j in range(10)])
    _write(tmp_path, 6542, ["val doc"])
    assert shards.corpus_source(tmp_path) == "climbmix"
    assert list_parquet_files("val", tmp_path) == [str(tmp_path / CLIMBMIX_VAL)]
    assert len(list_parquet_files("train", tmp_path)) == 2
    with pytest.raises(DatasetError, match=rf"python -m nanochat.dataset -n \d+ --corpus climbmix --data-dir {tmp_path}`"):
        check_enough_data(10_000, tmp_path)
    with pytest.raises(DatasetError, match="even all 6542 train shards"):
        check_enough_data(10 ** 12, tmp_path)


def test_climbmix_hints_name_the_corpus(tmp_path):
    d = shards.data_dir(corpus="climbmix")
    with pytest.raises(DatasetError, match=r"-n 8 --corpus climbmix` \(ClimbMix\).*--offline --corpus climbmix`"):
        list_parquet_files("train", d)
    with pytest.raises(DatasetError, match=r"-n 8 --data-dir \S+` \(FineWeb-Edu\)"):
        list_parquet_files("train", tmp_path / "elsewhere")


def test_climbmix_offline_modes_fill_its_directory(climbmix_served, tmp_path, monkeypatch):
    built = []
    monkeypatch.setattr(dataset, "build_offline_corpus", lambda directory: built.append(directory))
    d = str(tmp_path / "base" / "base_data_climbmix")
    dataset.main(["--corpus", "climbmix", "--offline"])
    dataset.main(["--corpus", "climbmix", "--offline-fallback", "-n", "2", "--base-url", _closed_port_url()])
    assert built == [d, d]
    dataset.main(["--corpus", "climbmix", "--offline-fallback", "-n", "2", "--base-url", climbmix_served.url])
    assert len(built) == 2 and len(list_parquet_files("train", d)) == 2


def _tokenizer_trained_on(directory, source):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "tokenizer.json"), "w") as f:
        json.dump({"info": {} if source is None else {"source": source}}, f)
    return str(directory)


def test_a_tokenizer_of_the_other_downloaded_corpus_is_refused(tmp_path):
    climbmix = {"data_dir": shards.data_dir(corpus="climbmix"), "corpus": "climbmix"}
    with pytest.raises(DatasetError, match=r"trained on FineWeb-Edu, the run reads ClimbMix.*tok_train --corpus climbmix`$"):
        shards.check_tokenizer_corpus(climbmix, _tokenizer_trained_on(tmp_path / "old", None))
    with pytest.raises(DatasetError, match="trained on ClimbMix, the run reads FineWeb-Edu"):
        shards.check_tokenizer_corpus({"data_dir": str(tmp_path / "fw"), "corpus": "fineweb-edu"},
                                      _tokenizer_trained_on(tmp_path / "cm", "climbmix"))
    for source in ("climbmix", "offline", "hf"):  # the same corpus, or a local one (demos, tests): allowed
        shards.check_tokenizer_corpus(climbmix, _tokenizer_trained_on(tmp_path / source, source))


def test_tok_train_trains_on_the_corpus_and_records_it(climbmix_served, tmp_path):
    from scripts import tok_train
    dataset.main(["--corpus", "climbmix", "-n", "2", "--base-url", climbmix_served.url])
    out = tmp_path / "tok"
    tok_train.main(["--corpus", "climbmix", "--vocab-size", "300", "--max-chars", "20000", "--tokenizer-dir", str(out)])
    info = json.load(open(out / "tokenizer.json"))["info"]
    assert info["source"] == "climbmix" and info["data_dir"] == shards.data_dir(corpus="climbmix")
    shards.check_tokenizer_corpus(shards.corpus_record(corpus="climbmix"), str(out))


def test_each_corpus_has_its_own_tokenizer_directory_and_a_run_reads_its_own(climbmix_served, tmp_path):
    """tok_train --corpus climbmix writes beside FineWeb-Edu's tokenizer, not over it; a run's
    evaluations read the tokenizer of the corpus its corpus.json names (absent: FineWeb-Edu's)."""
    from nanochat.tokenizer import default_tokenizer_dir, run_tokenizer_dir
    from scripts import tok_train
    dataset.main(["--corpus", "climbmix", "-n", "2", "--base-url", climbmix_served.url])
    tok_train.main(["--corpus", "climbmix", "--vocab-size", "300", "--max-chars", "20000"])
    assert default_tokenizer_dir("climbmix") != default_tokenizer_dir()
    assert os.path.isfile(os.path.join(default_tokenizer_dir("climbmix"), "tokenizer.json"))
    assert not os.path.exists(default_tokenizer_dir())
    run = tmp_path / "run"
    run.mkdir()
    assert run_tokenizer_dir(run) == default_tokenizer_dir()
    (run / "corpus.json").write_text(json.dumps(shards.corpus_record(corpus="climbmix")))
    assert run_tokenizer_dir(run) == default_tokenizer_dir("climbmix")
