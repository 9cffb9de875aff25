"""The CORE metric (DCLM's 22 in-context-learning tasks) computed exactly as nanochat does,
plus the eval bundle that holds its data.

Protocol (nanochat core_eval / base_eval): each task's JSONL is shuffled with
random.Random(1337) and cropped to `max_per_task`; example `idx` draws its few-shot examples
with random.Random(1234 + idx) among the other items of the cropped list; prompts are
rendered per task type (multiple_choice, schema, language_modeling), encoded with BOS
prepended, and scored in one forward pass per example: multiple choice and schema pick the
option with the lowest mean cross-entropy over its answer span, language modeling is correct
iff the greedy prediction equals every continuation token. Accuracy is centered against the
task's random baseline and CORE is the mean of the centered accuracies.

Bundle layout: core.yaml (key `icl_tasks`), eval_meta_data.csv (columns `Eval Task` and
`Random baseline`, in percent), eval_data/<dataset_uri>.jsonl.
"""

import csv
import json
import os
import random
import shutil
import tempfile
import time
import zipfile

import requests
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from filelock import FileLock

from nanochat.common import base_dir, print0

# nanochat's public copy of the DCLM eval data (source: nanochat core_eval/base_eval).
EVAL_BUNDLE_URL = "https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip"
TASK_TYPES = ("multiple_choice", "schema", "language_modeling")


# -----------------------------------------------------------------------------
# The bundle: where it is, which tasks it defines, which of their files are present

def download_eval_bundle(dest_dir=None, url=EVAL_BUNDLE_URL, timeout=60):
    """Fetch and unzip the bundle into dest_dir/eval_bundle (default base_dir()) unless it is
    already there. A file lock serializes concurrent ranks and processes; the archive goes to
    a temporary file and is unpacked into a temporary directory that is renamed into place
    only when complete, so an interrupted download never leaves a half bundle behind."""
    dest_dir = dest_dir or base_dir()
    os.makedirs(dest_dir, exist_ok=True)
    bundle = os.path.join(dest_dir, "eval_bundle")
    with FileLock(os.path.join(dest_dir, "eval_bundle.lock")):
        if os.path.isfile(os.path.join(bundle, "core.yaml")):
            return bundle
        print0(f"Downloading the CORE eval bundle from {url} ...")
        fd, archive = tempfile.mkstemp(dir=dest_dir, prefix="eval_bundle.", suffix=".zip.tmp")
        unpack = tempfile.mkdtemp(dir=dest_dir, prefix="eval_bundle.unpack.")
        try:
            with os.fdopen(fd, "wb") as f:
                try:
                    with requests.get(url, stream=True, timeout=timeout) as r:
                        r.raise_for_status()
                        for chunk in r.iter_content(chunk_size=1 << 20):
                            f.write(chunk)
                except requests.RequestException as e:
                    raise ConnectionError(f"could not download the CORE eval bundle from {url}: {e}. "
                                          "Download it elsewhere and pass --eval-bundle PATH") from e
            try:
                with zipfile.ZipFile(archive) as z:
                    z.extractall(unpack)
            except zipfile.BadZipFile as e:
                raise ValueError(f"{url} did not serve a zip archive ({e}); check --eval-bundle-url") from e
            # the archive holds eval_bundle/...; accept a bundle at its top level too
            found = os.path.join(unpack, "eval_bundle")
            if not os.path.isfile(os.path.join(found, "core.yaml")):
                found = unpack
            if not os.path.isfile(os.path.join(found, "core.yaml")):
                raise ValueError(f"the archive from {url} has no eval_bundle/core.yaml; check --eval-bundle-url")
            os.replace(found, bundle)
        finally:
            if os.path.exists(archive):
                os.remove(archive)
            shutil.rmtree(unpack, ignore_errors=True)
    print0(f"CORE eval bundle ready at {bundle}")
    return bundle


def resolve_eval_bundle(path=None, url=EVAL_BUNDLE_URL):
    """The bundle directory: `path` if given, else $NANOCHAT_EVAL_BUNDLE, else
    base_dir()/eval_bundle (downloaded from `url` when absent). Raises ValueError for a
    directory or archive that is not a bundle, ConnectionError when the download fails."""
    path = path or os.environ.get("NANOCHAT_EVAL_BUNDLE")
    if path:
        if not os.path.isfile(os.path.join(path, "core.yaml")):
            raise ValueError(f"{path} is not a CORE eval bundle (no core.yaml); pass --eval-bundle (or "
                             "NANOCHAT_EVAL_BUNDLE) as the directory holding core.yaml, eval_meta_data.csv "
                             "and eval_data/")
        return path
    return download_eval_bundle(url=url)


def load_task_metas(bundle_dir):
    """Every task of core.yaml in its order, as dicts: label, dataset_uri, task_type,
    num_fewshot, continuation_delimiter, random_baseline (percent, from eval_meta_data.csv)."""
    with open(os.path.join(bundle_dir, "core.yaml"), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    baselines = {}
    with open(os.path.join(bundle_dir, "eval_meta_data.csv"), encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            baselines[row["Eval Task"].strip()] = float(row["Random baseline"])
    metas = []
    for task in config["icl_tasks"]:
        label = task["label"]
        if task["icl_task_type"] not in TASK_TYPES:
            raise ValueError(f"core.yaml: task {label} has type {task['icl_task_type']!r}, "
                             f"expected one of {TASK_TYPES}")
        if label not in baselines:
            raise ValueError(f"eval_meta_data.csv in {bundle_dir} has no random baseline for task {label}")
        metas.append({
            "label": label,
            "dataset_uri": task["dataset_uri"],
            "task_type": task["icl_task_type"],
            "num_fewshot": task["num_fewshot"][0],  # a list in the yaml; nanochat uses its first entry
            "continuation_delimiter": task.get("continuation_delimiter", " "),
            "random_baseline": baselines[label],
        })
    return metas


def task_path(bundle_dir, meta):
    return os.path.join(bundle_dir, "eval_data", meta["dataset_uri"])


def select_tasks(bundle_dir, tasks=None, max_per_task=-1):
    """Check a CORE request before any model time is spent on it.

    tasks: None or "all" (the whole of core.yaml: every file must be present), "available"
    (the tasks whose file is present: a partial CORE), or labels as a list or a comma-separated
    string. Returns (metas of the selected tasks, labels of core.yaml tasks whose file is
    absent). Raises ValueError with the fix for unknown labels, missing files and a
    max_per_task too small for the few-shot draw (nanochat issue #550)."""
    metas = load_task_metas(bundle_dir)
    absent = [m["label"] for m in metas if not os.path.isfile(task_path(bundle_dir, m))]
    if tasks is None or tasks == "all":
        selected = metas
    elif tasks == "available":
        selected = [m for m in metas if m["label"] not in absent]
        if not selected:
            raise ValueError(f"no task file of core.yaml is present under {bundle_dir}/eval_data; "
                             "pass --eval-bundle PATH pointing at a complete bundle")
    else:
        labels = [t.strip() for t in tasks.split(",")] if isinstance(tasks, str) else list(tasks)
        labels = [t for t in labels if t]
        by_label = {m["label"]: m for m in metas}
        unknown = [t for t in labels if t not in by_label]
        if unknown or not labels:
            raise ValueError(f"unknown CORE task(s) {unknown}; --tasks takes 'all', 'available' or "
                             f"comma-separated labels from: {', '.join(by_label)}")
        selected = [by_label[t] for t in dict.fromkeys(labels)]
    missing = [m for m in selected if m["label"] in absent]
    if missing:
        listing = "\n".join(f"  {m['label']}: {task_path(bundle_dir, m)}" for m in missing)
        raise ValueError(f"the CORE eval bundle at {bundle_dir} lacks the data of {len(missing)} task(s):\n"
                         f"{listing}\nPass --tasks with the tasks you have (--tasks available evaluates "
                         "every task whose file is present and reports a partial CORE), or --eval-bundle "
                         "PATH pointing at a complete bundle")
    most_shots = max(selected, key=lambda m: m["num_fewshot"])
    if 0 < max_per_task <= most_shots["num_fewshot"]:
        raise ValueError(f"--max-per-task {max_per_task} leaves too few examples for the "
                         f"{most_shots['num_fewshot']}-shot task {most_shots['label']} (few-shot examples "
                         f"are drawn from the other kept items); use at least {most_shots['num_fewshot'] + 1}, "
                         "or -1 for all")
    return selected, absent


def load_task_data(bundle_dir, meta, max_per_task=-1):
    """A task's items, shuffled with random.Random(1337) and cropped to max_per_task (> 0)."""
    with open(task_path(bundle_dir, meta), encoding="utf-8") as f:
        data = [json.loads(line) for line in f if line.strip()]
    random.Random(1337).shuffle(data)
    if max_per_task > 0:
        data = data[:max_per_task]
    return data


def read_reference_csv(path):
    """A results CSV in nanochat's base_eval layout (`Task, Accuracy, Centered`, space padded,
    last row `CORE` with only the centered value), such as the GPT-2 files beside the bundle.
    Returns ({task: (accuracy, centered)}, core)."""
    rows, core = {}, None
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader)]
        if header != ["Task", "Accuracy", "Centered"]:
            raise ValueError(f"{path}: expected the header Task, Accuracy, Centered, got {header}")
        for row in reader:
            task, accuracy, centered = (c.strip() for c in row)
            if task == "CORE":
                core = float(centered)
            else:
                rows[task] = (float(accuracy), float(centered))
    return rows, core


# -----------------------------------------------------------------------------
# Rendering: plain string code producing exactly what nanochat's jinja2 templates render

def fewshot_examples(data, idx, num_fewshot):
    """The few-shot examples of item idx: num_fewshot distinct other items of `data`."""
    if num_fewshot == 0:
        return []
    if len(data) <= num_fewshot:
        raise ValueError(f"{len(data)} items cannot supply {num_fewshot} few-shot examples besides the "
                         f"one evaluated; keep more examples per task (max_per_task > {num_fewshot})")
    rng = random.Random(1234 + idx)
    others = [i for i in range(len(data)) if i != idx]
    return [data[i] for i in rng.sample(others, num_fewshot)]


def render_prompts(item, task_type, delimiter, shots):
    """The prompts of one item: one per choice (multiple_choice), one per context option
    (schema), or [without, with] the continuation (language_modeling). Few-shot examples
    come first, each followed by a blank line."""
    if task_type == "multiple_choice":
        head = "".join(f"{ex['query']}{delimiter}{ex['choices'][ex['gold']]}\n\n" for ex in shots)
        return [f"{head}{item['query']}{delimiter}{choice}" for choice in item["choices"]]
    if task_type == "schema":
        head = "".join(f"{ex['context_options'][ex['gold']]}{delimiter}{ex['continuation']}\n\n" for ex in shots)
        return [f"{head}{option}{delimiter}{item['continuation']}" for option in item["context_options"]]
    if task_type == "language_modeling":
        # contexts are trimmed (some carry trailing whitespace), and so is the prompt without
        # the continuation: a trailing space would merge into the continuation's first token
        # and the without-prompt would not be a token prefix of the with-prompt
        head = "".join(f"{str(ex['context']).strip()}{delimiter}{ex['continuation']}\n\n" for ex in shots)
        without = f"{head}{str(item['context']).strip()}{delimiter}"
        return [without.strip(), without + str(item["continuation"])]
    raise ValueError(f"unknown task type {task_type!r}, expected one of {TASK_TYPES}")


def common_length(seqs, from_end=False):
    """Length of the prefix (or suffix) shared by every sequence."""
    n = min(len(s) for s in seqs)
    for i in range(n):
        j = -1 - i if from_end else i
        if any(s[j] != seqs[0][j] for s in seqs):
            return i
    return n


def encode_prompts(tokenizer, prompts, task_type):
    """BOS-prefixed token rows and, per row, the answer span [start, end): the tokens after the
    common prefix (multiple_choice), the common suffix (schema), or the continuation
    (language_modeling, a single row)."""
    rows = tokenizer.encode(prompts, prepend=tokenizer.get_bos_token_id())
    ends = [len(r) for r in rows]
    if task_type == "multiple_choice":
        starts = [common_length(rows)] * len(rows)
    elif task_type == "schema":
        suffix = common_length(rows, from_end=True)
        starts = [e - suffix for e in ends]
    else:
        without, with_ = rows
        if not (len(without) < len(with_) and with_[:len(without)] == without):
            raise ValueError("language-modeling prompt without the continuation does not encode to a strict "
                             f"token prefix of the prompt with it: {prompts[0][-60:]!r} / {prompts[1][-60:]!r}")
        rows, starts, ends = [with_], [len(without)], [len(with_)]
    return rows, starts, ends


def crop_left(rows, starts, ends, max_seq_len):
    """Keep the last max_seq_len tokens of each row, shifting its span (for models that cannot
    see longer inputs)."""
    out = ([], [], [])
    for row, s, e in zip(rows, starts, ends):
        cut = max(0, len(row) - max_seq_len)
        if s - cut < 1:
            raise ValueError(f"max_seq_len {max_seq_len} is too short for an answer of {e - s} tokens "
                             "plus one token of context")
        out[0].append(row[cut:])
        out[1].append(s - cut)
        out[2].append(e - cut)
    return out


# -----------------------------------------------------------------------------
# Scoring

@torch.no_grad()
def score_rows(model, rows, starts, ends, task_type, gold, pad_id, device):
    """Whether one example is answered correctly. The rows (one per option) are padded on the
    right with pad_id and forwarded together; logits at position t predict token t+1, so a
    span [s, e) is scored by the logits at [s-1, e-1)."""
    input_ids = torch.full((len(rows), max(ends)), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
    input_ids = input_ids.to(device)
    logits = model(input_ids)
    if task_type == "language_modeling":
        s, e = starts[0], ends[0]
        return bool(torch.equal(logits[0, s - 1:e - 1].argmax(dim=-1), input_ids[0, s:e]))
    means = torch.stack([
        F.cross_entropy(logits[i, s - 1:e - 1].float(), input_ids[i, s:e], reduction="mean")
        for i, (s, e) in enumerate(zip(starts, ends))
    ]).tolist()
    # Python's min/index as nanochat uses them: an empty span (an option whose tokens are
    # the common prefix itself, e.g. "ice" next to "ice cream") has a NaN mean, which wins
    # only when it comes first.
    return means.index(min(means)) == gold


def evaluate_example(idx, model, tokenizer, data, device, task_meta, max_seq_len=None):
    item = data[idx]
    task_type = task_meta["task_type"]
    shots = fewshot_examples(data, idx, task_meta["num_fewshot"])
    prompts = render_prompts(item, task_type, task_meta["continuation_delimiter"], shots)
    rows, starts, ends = encode_prompts(tokenizer, prompts, task_type)
    if max_seq_len is not None:
        rows, starts, ends = crop_left(rows, starts, ends, max_seq_len)
    # BOS as padding: padded positions come after every scored position, so causal
    # attention never lets them change a score
    return score_rows(model, rows, starts, ends, task_type, item.get("gold"), tokenizer.get_bos_token_id(), device)


def evaluate_task(model, tokenizer, data, device, task_meta, max_seq_len=None):
    """Accuracy on `data`. Under torch.distributed rank r takes examples r, r+W, ... and the
    per-example results are summed across ranks (SUM: gloo has no AVG)."""
    ddp = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if ddp else (0, 1)
    correct = torch.zeros(len(data), dtype=torch.float32, device=device)
    for idx in range(rank, len(data), world):
        correct[idx] = float(evaluate_example(idx, model, tokenizer, data, device, task_meta, max_seq_len))
    if world > 1:
        dist.all_reduce(correct, op=dist.ReduceOp.SUM)
    # the sum of 0/1 values is exact in fp32; dividing in Python keeps the accuracy exact too
    return correct.sum().item() / len(data)


def centered_accuracy(accuracy, random_baseline):
    """Accuracy rescaled so chance is 0 and perfect is 1; random_baseline is in percent."""
    rb = 0.01 * random_baseline
    return (accuracy - rb) / (1.0 - rb)


def evaluate_core(model, tokenizer, device, bundle_dir, max_per_task=-1, tasks=None, max_seq_len=None):
    """CORE over the selected tasks (see select_tasks). `model(input_ids) -> logits` is any
    callable. Returns results and centered_results ({label: value}), core_metric (mean
    centered accuracy), tasks ({label: type, shots, examples, accuracy, centered}),
    tasks_missing (core.yaml tasks whose file is absent from the bundle) and partial (the
    metric does not cover every task of core.yaml)."""
    selected, absent = select_tasks(bundle_dir, tasks, max_per_task)
    n_core = len(load_task_metas(bundle_dir))
    report = {"results": {}, "centered_results": {}, "tasks": {}}
    for meta in selected:
        t0 = time.time()
        data = load_task_data(bundle_dir, meta, max_per_task)
        accuracy = evaluate_task(model, tokenizer, data, device, meta, max_seq_len)
        centered = centered_accuracy(accuracy, meta["random_baseline"])
        label = meta["label"]
        report["results"][label] = accuracy
        report["centered_results"][label] = centered
        report["tasks"][label] = {"type": meta["task_type"], "shots": meta["num_fewshot"], "examples": len(data),
                                  "accuracy": accuracy, "centered": centered}
        print0(f"{label:<34} {meta['num_fewshot']:>2}-shot {meta['task_type']:<17} n={len(data):<6} "
               f"acc {accuracy:.4f}  centered {centered:+.4f}  ({time.time() - t0:.1f}s)")
    centered = list(report["centered_results"].values())
    report["core_metric"] = sum(centered) / len(centered)
    report["tasks_missing"] = absent
    report["partial"] = len(selected) < n_core
    if report["partial"]:
        print0(f"partial CORE over {len(selected)} of {n_core} tasks"
               + (f" (no data for: {', '.join(absent)})" if absent else ""))
    return report
