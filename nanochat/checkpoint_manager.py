"""Run directories and checkpoints: atomic writes, the `latest` pointer, exact resume,
and rebuilding a model from a checkpoint for evaluation.

A checkpoint of step S (S optimizer steps done) is `model_<S>.pt` (rank 0),
`optim_<S>_rank<r>.pt` (every rank: its optimizer shard) and `meta_<S>.json` (rank 0:
model config, settings, loop state, every rank's dataloader state and RNG state). Each
file is written to a temporary name, fsynced and renamed, so a file either exists whole
or not at all; `latest` moves only after every file of the step exists, so a run killed
mid-save resumes from the previous complete checkpoint. A checkpoint of W ranks also
resumes on another number of ranks: every rank then loads all W optimizer files, which
MuonAdamW.load_resharded regroups, and dataloader.reshard_states the W loader states.
The meta's model config holds the frame's fields and its own wiring's alone
(config_record), beside the file that defines the wiring (`wiring_file`): a run does not
depend on which other wirings were registered when it trained.

Disk: prune() keeps the K most recent intermediate checkpoints, the final one and the one
`latest` names, and deletes the rest (with the files of torn saves older than `latest`).
A save that fails (a full disk) deletes what it wrote of its step and leaves the previous
checkpoint, and `latest`, as they were.
"""

import base64
import dataclasses
import io
import json
import os
import re

import torch

from nanochat import connections
from nanochat.common import base_dir
from nanochat.connections.backends import fused, liger
from nanochat.gpt import GPTConfig, build_model


def runs_dir():
    return os.path.join(base_dir(), "runs")


def run_dir_for(model_tag):
    return os.path.join(runs_dir(), model_tag)


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path, data):
    """Write bytes or str to `path` so that readers see the old file or the new one, whole."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    mode = "wb" if isinstance(data, bytes) else "w"
    try:
        with open(tmp, mode) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_dir(directory)


def _torch_bytes(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def encode_rng_state():
    """This process's RNG states as JSON-safe text (training itself draws no random
    numbers, but a resumed run must continue exactly like an uninterrupted one)."""
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return base64.b64encode(_torch_bytes(state)).decode("ascii")


def restore_rng_state(text):
    state = torch.load(io.BytesIO(base64.b64decode(text)), weights_only=True)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


_STEP_FILE = re.compile(r"(?:model|meta|optim)_(\d+)(?:_rank\d+)?\.(?:pt|json)")


def _paths(run_dir, step, rank=0):
    return (os.path.join(run_dir, f"model_{step:06d}.pt"),
            os.path.join(run_dir, f"optim_{step:06d}_rank{rank}.pt"),
            os.path.join(run_dir, f"meta_{step:06d}.json"))


def save_rank_files(run_dir, step, rank, optimizer_state, model_state=None, meta=None):
    """Every rank writes its optimizer shard; rank 0 also the model and meta. On failure
    (OSError, e.g. no space left) what this call wrote is deleted before re-raising."""
    model_path, optim_path, meta_path = _paths(run_dir, step, rank)
    # Serialized one at a time, when written: the model and the optimizer state are large.
    files = [(optim_path, lambda: _torch_bytes(optimizer_state))]
    if model_state is not None:
        files.append((model_path, lambda: _torch_bytes(model_state)))
    if meta is not None:
        files.append((meta_path, lambda: json.dumps(meta, indent=1)))
    written = []
    try:
        for path, data in files:
            atomic_write(path, data())
            written.append(path)
    except OSError:
        for path in written:
            os.remove(path)
        raise


def is_complete(run_dir, step):
    model_path, _, meta_path = _paths(run_dir, step)
    if not (os.path.isfile(model_path) and os.path.isfile(meta_path)):
        return False
    try:
        with open(meta_path) as f:
            world_size = json.load(f)["world_size"]
    except (OSError, ValueError, KeyError):
        return False
    return all(os.path.isfile(_paths(run_dir, step, r)[1]) for r in range(world_size))


def mark_latest(run_dir, step):
    """Called by rank 0 after every rank has written its files (after a barrier)."""
    if not is_complete(run_dir, step):
        raise RuntimeError(f"checkpoint {step} in {run_dir} is incomplete; not moving `latest`")
    atomic_write(os.path.join(run_dir, "latest"), f"{step}\n")


def saved_steps(run_dir):
    if not os.path.isdir(run_dir):
        return []
    steps = {int(m.group(1)) for f in os.listdir(run_dir) if (m := re.fullmatch(r"meta_(\d+)\.json", f))}
    return sorted(steps)


def _step_files(run_dir):
    """{step: [file names]} of every checkpoint file in the run directory."""
    files = {}
    for name in os.listdir(run_dir):
        if m := _STEP_FILE.fullmatch(name):
            files.setdefault(int(m.group(1)), []).append(name)
    return files


def prune(run_dir, keep, final_step=None):
    """Delete the checkpoints that --keep-checkpoints K does not keep: all but the K most
    recent complete intermediate ones, the final one (`final_step`) and `latest`'s; also the
    files of incomplete steps older than `latest`. keep = -1 keeps everything. Returns the
    deleted steps. The meta file goes first, so an interrupted prune leaves only files that
    no step claims, which the next prune removes."""
    latest = latest_step(run_dir)
    if keep < 0 or latest is None:
        return []
    files = _step_files(run_dir)
    intermediate = [s for s in sorted(files) if s != final_step and s <= latest and is_complete(run_dir, s)]
    kept = {latest, final_step, *(intermediate[-keep:] if keep else [])}
    pruned = [s for s in sorted(files) if s < latest and s not in kept]
    for step in pruned:
        for name in sorted(files[step], key=lambda n: not n.startswith("meta_")):
            os.remove(os.path.join(run_dir, name))
    if pruned:
        _fsync_dir(run_dir)
    return pruned


def dir_size(path):
    """Bytes of the files under `path`."""
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:  # a temporary file renamed or removed meanwhile
                pass
    return total


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def latest_step(run_dir):
    """The step `latest` points to if that checkpoint is complete; otherwise the newest
    complete one on disk (e.g. `latest` lost); None when there is none."""
    pointer = os.path.join(run_dir, "latest")
    if os.path.isfile(pointer):
        try:
            step = int(open(pointer).read().strip())
            if is_complete(run_dir, step):
                return step
        except ValueError:
            pass
    complete = [s for s in saved_steps(run_dir) if is_complete(run_dir, s)]
    return complete[-1] if complete else None


def load_meta(run_dir, step):
    with open(_paths(run_dir, step)[2]) as f:
        return json.load(f)


def load_model_state(run_dir, step, device):
    return torch.load(_paths(run_dir, step)[0], map_location=device, weights_only=True)


def load_optimizer_state(run_dir, step, rank, device):
    return torch.load(_paths(run_dir, step, rank)[1], map_location=device, weights_only=True)


def config_record(config):
    """The model config as a checkpoint records it: the frame's fields and its own wiring's,
    not the fields of the other wirings this process happens to register (they sit at their
    defaults, and a process without those wirings could not read them back)."""
    other = connections.other_fields(config.hc)
    return {name: value for name, value in dataclasses.asdict(config).items() if name not in other}


def config_from_record(record, where="this checkpoint", wiring_file=None):
    """The GPTConfig of a recorded model config. A record written before config_record holds
    every registered wiring's fields: those this process does not know are dropped (the
    record's own wiring's are known, since it is registered), the others take their recorded
    values (their defaults). A wiring this process has not registered ends the command in
    one `error:` line naming the file to register (`wiring_file`, recorded beside the config)."""
    hc = record.get("hc", "residual")
    if hc not in connections.VARIANTS:
        what = "its file" if wiring_file else "the file that defines it"
        raise SystemExit(f"error: {where} holds a model of hc={hc!r}, a wiring this process has not registered: "
                         f"register {what}, {connections.EXTERNAL}={wiring_file or f'PATH/{hc}.py'} "
                         "(docs/connections.md, 'A wiring outside the package')")
    known = {f.name for f in dataclasses.fields(GPTConfig)}
    return GPTConfig(**{name: value for name, value in record.items() if name in known})


def model_from_state(model_config, state, device, where="this checkpoint", wiring_file=None):
    """Rebuild a GPT from its recorded config (config_from_record) and a state dict. The init
    runs first because it computes the non-persistent buffers; then every persistent tensor is
    overwritten."""
    kernels = {"liger": liger, "fused": fused}.get(model_config.get("hc_kernels"))
    if kernels is not None and not (kernels.AVAILABLE and kernels.runs_on(torch.device(device).type)):
        # Either kernels compute the layers' function (held to the torch ops in the tests), so
        # a model trained with them evaluates anywhere with whichever ops can run there.
        model_config = dict(model_config, hc_kernels="auto")
    model = build_model(config_from_record(model_config, where, wiring_file), device)
    params = dict(model.state_dict())
    for k, v in state.items():
        if k in params and params[k].dtype != v.dtype:
            state[k] = v.to(params[k].dtype)  # e.g. bf16 CUDA embeddings loaded on CPU
    model.load_state_dict(state, strict=True)
    return model


def load_model(run_dir, step=None, device="cpu"):
    """(model, meta) of a run's checkpoint: `step`, or the latest complete one."""
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"run directory {run_dir} does not exist; train it with "
                                f"`python -m scripts.base_train --model-tag {os.path.basename(run_dir)}`")
    if step is None:
        step = latest_step(run_dir)
        if step is None:
            raise FileNotFoundError(f"no complete checkpoint in {run_dir}")
    elif not is_complete(run_dir, step):
        raise FileNotFoundError(f"no complete checkpoint of step {step} in {run_dir} "
                                f"(complete: {[s for s in saved_steps(run_dir) if is_complete(run_dir, s)]})")
    meta = load_meta(run_dir, step)
    model = model_from_state(meta["model_config"], load_model_state(run_dir, step, device), device,
                             f"the checkpoint of step {step} in {run_dir}", meta.get("wiring_file"))
    model.eval()
    return model, meta
