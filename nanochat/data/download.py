"""Downloading nanochat's shards of a corpus (shards.SOURCES: FineWeb-Edu or ClimbMix):
parallel, retried with backoff, one lock per shard, each written to a temporary file,
verified, then renamed into place. The corpus's val shard always comes too."""

import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import requests
from filelock import FileLock

from nanochat.data.shards import (DEFAULT_CORPUS, MARKER, SOURCES, DatasetError, check_corpus, data_dir as _data_dir,
                                  read_marker, shard_name, verify_shard, write_marker)


def source_url(base_url=None, corpus=DEFAULT_CORPUS):
    """--base-url, else $NANOCHAT_DATA_URL (a mirror of the corpus being downloaded), else the corpus's own."""
    return (base_url or os.environ.get("NANOCHAT_DATA_URL") or SOURCES[check_corpus(corpus)].url).rstrip("/")


def _fetch(url, path, timeout):
    """One attempt: stream into a private temporary file, verify, rename into place."""
    directory, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=name + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f, requests.get(url, stream=True, timeout=timeout) as r:
            if r.status_code == 404:
                raise FileNotFoundError(f"{url} does not exist (HTTP 404)")
            r.raise_for_status()
            for chunk in r.iter_content(chunk_size=1 << 20):
                f.write(chunk)
        verify_shard(tmp, full=True)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def download_shard(index, directory, base_url=None, attempts=5, backoff=2.0, timeout=30, corpus=DEFAULT_CORPUS):
    """Make shard `index` present and valid in `directory`; return its path.

    A lock per shard serializes concurrent processes or ranks: the second one waits, then
    finds the verified file and returns. A corrupt file already on disk is deleted and
    fetched again. Attempt k (from 0) failing waits backoff * 2**k seconds."""
    name = shard_name(index)
    path = os.path.join(directory, name)
    url = f"{source_url(base_url, corpus)}/{name}"
    with FileLock(path + ".lock"):
        if os.path.exists(path):
            try:
                verify_shard(path)
                return path
            except DatasetError as e:
                print(f"{name}: {e}; deleting it and downloading again", flush=True)
                os.remove(path)
        for attempt in range(attempts):
            try:
                _fetch(url, path, timeout)
                print(f"{name}: downloaded ({os.path.getsize(path) / 1e6:.1f} MB)", flush=True)
                return path
            except FileNotFoundError as e:
                raise DatasetError(f"{e}: check --base-url / NANOCHAT_DATA_URL and the shard index") from e
            except (requests.RequestException, DatasetError, OSError) as e:
                if attempt + 1 == attempts:
                    raise DatasetError(f"could not download {url} after {attempts} attempts: {e}") from e
                wait = backoff * 2 ** attempt
                print(f"{name}: attempt {attempt + 1}/{attempts} failed ({e}); retrying in {wait:g}s", flush=True)
                time.sleep(wait)


def _claim(directory, base_url, corpus):
    """Refuse to download into a directory holding another corpus; record the source."""
    marker = read_marker(directory)
    if marker is not None and marker.get("source") != corpus:
        raise DatasetError(
            f"{directory} holds the {marker.get('source')!r} corpus ({MARKER}); downloading {SOURCES[corpus].title} "
            f"shards into it would mix the two. Use another --data-dir, or delete {directory} first.")
    if marker is None:
        os.makedirs(directory, exist_ok=True)
        write_marker(directory, {"source": corpus, "url": source_url(base_url, corpus)})


def wanted_shards(num_files, corpus=DEFAULT_CORPUS):
    """The pinned val shard first (every run needs it), then train shards 0..num_files-1."""
    source = SOURCES[check_corpus(corpus)]
    if num_files == -1:
        num_files = source.max_shard
    if not 0 <= num_files <= source.max_shard:
        raise ValueError(f"-n must be in 0..{source.max_shard} {source.title} train shards (or -1 for all), "
                         f"got {num_files}")
    return [source.val_shard] + list(range(num_files))


def download(num_files, data_dir=None, workers=4, base_url=None, attempts=5, backoff=2.0, timeout=30,
             corpus=DEFAULT_CORPUS):
    """Download the corpus's pinned val shard and train shards 0..num_files-1 (-1: all of
    them) into `data_dir`, else the corpus's default directory."""
    indices = wanted_shards(num_files, corpus)
    directory = _data_dir(data_dir, corpus)
    _claim(directory, base_url, corpus)
    print(f"Fetching {len(indices)} {SOURCES[corpus].title} shards (val {shard_name(indices[0])} + "
          f"{len(indices) - 1} train) from {source_url(base_url, corpus)} into {directory} with {workers} workers",
          flush=True)

    def one(index):
        try:
            return download_shard(index, directory, base_url, attempts, backoff, timeout, corpus), None
        except DatasetError as e:
            return None, e

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(one, indices))
    failed = [e for _, e in results if e is not None]
    print(f"Shards ready: {len(indices) - len(failed)}/{len(indices)}", flush=True)
    if failed:
        lines = "\n  ".join(str(e) for e in failed[:5])
        raise DatasetError(f"{len(failed)} of {len(indices)} shards failed:\n  {lines}\n"
                           "Run the same command again to retry; finished shards are kept.")
    return [path for path, _ in results]


def source_reachable(base_url=None, timeout=5.0, corpus=DEFAULT_CORPUS):
    """One quick request for the val shard's headers, no retries."""
    url = f"{source_url(base_url, corpus)}/{shard_name(SOURCES[corpus].val_shard)}"
    try:
        r = requests.head(url, timeout=timeout, allow_redirects=True)
        return r.status_code < 400
    except requests.RequestException:
        return False
