"""lm-evaluation-harness tasks on a checkpoint: which tasks (lm-eval's own, or task YAMLs
from an include path), the checks that fail before any model time is spent, the evaluation
(lm_eval.simple_evaluate over NanochatLM) and its record, lm_eval.json in the run directory.

lm-eval reads its tasks' data from the Hugging Face Hub (through `datasets`); a task whose
YAML says `dataset_path: json` with local `data_files` needs no network. `load_task_data`
loads every task's data once, so that a missing network is found (and said) before a run.

Record (lm_eval.json): versions (lm-eval's and each task's), settings, and per task and
metric the value and its standard error (lm-eval's: closed form for means, bootstrap for
the others), with the number of documents evaluated.
"""

import json
from pathlib import Path

# The default suite: zero-shot cloze and multiple-choice tasks that small base models score
# above chance (the usual table of the Pythia and Mamba papers), beside CORE's DCLM tasks.
DEFAULT_TASKS = ("hellaswag", "arc_easy", "arc_challenge", "piqa", "winogrande", "lambada_openai", "openbookqa",
                 "sciq")
LS_HINT = "`lm-eval ls tasks` lists lm-eval's tasks; your own task YAMLs come in with --include-path DIR"


def record_path(run_dir, step=None):
    """lm_eval.json for the latest checkpoint, lm_eval_<step>.json for a given step (as
    base_eval names core.json), so that evaluating an older step never overwrites it."""
    return Path(run_dir) / ("lm_eval.json" if step is None else f"lm_eval_{step:06d}.json")


def lm_eval_record(run_dir, step):
    """The run's lm-eval record of checkpoint `step`, or None."""
    for path in (record_path(run_dir, step), record_path(run_dir)):
        if path.is_file():
            record = json.loads(path.read_text())
            if record["settings"]["step"] == step:
                return record
    return None


def parse_tasks(text):
    tasks = [t.strip() for t in text.split(",") if t.strip()]
    if not tasks:
        raise ValueError(f"--tasks needs comma-separated task names; {LS_HINT}")
    return list(dict.fromkeys(tasks))


def _unknown(manager, tasks):
    return [t for t in tasks if not manager.match_tasks([t])]


def task_manager(tasks, include_path=None):
    """A TaskManager that knows every task of `tasks` (names, groups or globs). The include
    path alone is indexed first (instant); lm-eval's own index (some seconds) only when a
    task is not there. Raises ValueError naming the unknown tasks."""
    from lm_eval.tasks import TaskManager

    if include_path is not None:
        if not any(Path(include_path).rglob("*.yaml")):
            raise ValueError(f"--include-path {include_path} holds no task YAML (*.yaml); point it at the "
                             "directory of your task configs")
        own = TaskManager(include_path=str(include_path), include_defaults=False)
        if not _unknown(own, tasks):
            return own
    manager = TaskManager(include_path=str(include_path) if include_path else None)
    unknown = _unknown(manager, tasks)
    if unknown:
        where = f" nor in {include_path}" if include_path else ""
        raise ValueError(f"unknown lm-eval task(s) {', '.join(unknown)}: not among lm-eval's tasks{where}; {LS_HINT}")
    return manager


def load_task_data(manager, tasks):
    """Load (download, or read from the cache) every task's data; raises ConnectionError
    with the fix when it cannot be reached."""
    try:
        manager.load(list(tasks))
    except (ConnectionError, OSError) as e:
        raise ConnectionError(f"the data of lm-eval task(s) {', '.join(tasks)} could not be loaded ({e}). lm-eval "
                              "reads it from the Hugging Face Hub: check the network, or set HF_HOME to a cache "
                              "that holds it (with HF_DATASETS_OFFLINE=1)") from None


def evaluate(lm, tasks, manager, num_fewshot=None, limit=None, bootstrap_iters=100000, log_samples=False):
    """lm_eval.simple_evaluate's results on rank 0 (None on the other ranks)."""
    import lm_eval

    try:
        return lm_eval.simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, num_fewshot=num_fewshot,
                                       limit=limit, bootstrap_iters=bootstrap_iters, log_samples=log_samples)
    except (ConnectionError, OSError) as e:
        raise ConnectionError(f"lm-eval could not load its task data ({e}): check the network, or run "
                              "`python -m scripts.lm_eval --check-data` first") from None


def _metric_values(task_results):
    """{metric: {value, stderr}} from lm-eval's 'metric,filter' keys (the 'none' filter
    unnamed); a stderr lm-eval did not compute is None."""
    out = {}
    for key, value in task_results.items():
        if "," not in key or "_stderr," in key or not isinstance(value, (int, float)):
            continue
        metric, filt = key.split(",", 1)
        stderr = task_results.get(f"{metric}_stderr,{filt}")
        name = metric if filt == "none" else f"{metric} ({filt})"
        out[name] = {"value": float(value), "stderr": float(stderr) if isinstance(stderr, (int, float)) else None}
    return out


def record(results, settings):
    """lm_eval.json's content from simple_evaluate's results."""
    import lm_eval

    return {
        "versions": {"lm_eval": lm_eval.__version__,
                     "tasks": {t: results["versions"].get(t) for t in results["results"]}},
        "settings": settings,
        "results": {task: _metric_values(r) for task, r in results["results"].items()},
        "higher_is_better": results.get("higher_is_better", {}),
        "n_shot": results.get("n-shot", {}),
        "n_samples": results.get("n-samples", {}),
    }
