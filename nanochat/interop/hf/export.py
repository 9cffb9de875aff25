"""A run's checkpoint as a Hugging Face model directory:

    model.safetensors        the weights (no pickle); bf16 on request, the connections in fp32
    config.json              NanochatHCConfig with auto_map, generation_config.json
    configuration_nanochat_hc.py, modeling_nanochat_hc.py and the modules they import
                             (assemble.py: the project's own code, flat)
    tokenizer.json, tokenizer_config.json
    README.md                the model card

The directory is written under a temporary name beside `out` and renamed when complete, so
a failed export leaves nothing half-written; an existing export is replaced only when asked.
"""

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from nanochat import connections
from nanochat import checkpoint_manager as checkpoint
from nanochat.interop.hf.assemble import assemble, check_imports
from nanochat.interop.hf.configuration import MODEL_TYPE, NanochatHCConfig
from nanochat.interop.hf.model_card import model_card
from nanochat.interop.hf.tokenizer import export_tokenizer
from nanochat.interop.lm_eval_run import lm_eval_record
from nanochat.tokenizer import check_vocab, get_tokenizer, run_tokenizer_dir

CONFIG_MODULE = f"configuration_{MODEL_TYPE}"
MODELING_MODULE = f"modeling_{MODEL_TYPE}"
ENTRY_MODULES = {"nanochat.interop.hf.modeling": MODELING_MODULE, "nanochat.interop.hf.configuration": CONFIG_MODULE}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def check_out_dir(out, overwrite):
    """Raise ValueError unless `out` can receive the export: absent, empty, or (with
    overwrite) an earlier export of ours."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {out} is a file; give a directory")
    if path.is_dir() and any(path.iterdir()):
        config = path / "config.json"
        ours = config.is_file() and json.loads(config.read_text()).get("model_type") == MODEL_TYPE
        if not overwrite:
            raise ValueError(f"--out {out} is not empty; pass --overwrite to replace "
                             f"{'the export there' if ours else 'it'}, or choose another directory")
        if not ours:
            raise ValueError(f"--out {out} holds something other than an export of this project; "
                             "--overwrite only replaces an earlier export; choose another directory")


def hf_config(model_config, bos_id, dtype):
    """The exported config: the model's own fields (Liger's kernels and ours, a GPU-only training
    choice, become `auto`: the same function wherever the kernels cannot run), the special
    tokens, the dtype and the auto_map that points transformers at the exported code."""
    config = NanochatHCConfig.from_gpt_config(model_config, bos_token_id=bos_id, eos_token_id=bos_id,
                                              pad_token_id=bos_id, dtype=dtype,
                                              architectures=["NanochatHCForCausalLM"])
    if config.hc_kernels in ("liger", "fused"):
        config.hc_kernels = "auto"
    config.auto_map = {"AutoConfig": f"{CONFIG_MODULE}.NanochatHCConfig",
                       "AutoModelForCausalLM": f"{MODELING_MODULE}.NanochatHCForCausalLM"}
    return config


def _plain_permissions(directory):
    """The modes a plain mkdir and open would have given (the temporary directory and some
    writers' files are private to their owner): an export is meant to be shared."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.iterdir():
        path.chmod(0o666 & ~umask)


def check_variant_ships(name):
    """The export carries the package's own modules (assemble.py): a variant registered from
    outside nanochat (an experiment's module) would be missing from the loaded model."""
    module = connections.VARIANTS.get(name)
    where = getattr(module, "__name__", "")
    if not where.startswith("nanochat."):
        raise ValueError(f"hc={name!r} is registered from outside the nanochat package ({where or type(module).__name__})"
                         f" and an export carries only nanochat's modules; move its module into nanochat/connections/ "
                         f"(it registers itself there)")


def discovered_modules():
    """What the registry (connections/registry.py) finds by listing its package, which its
    flat copy cannot: the wiring modules, for assemble()."""
    return {connections.registry.__name__: [m.__name__ for m in connections.VARIANTS.values()
                                            if m.__name__.startswith("nanochat.")]}


def export(run_dir, out, step=None, dtype="float32", overwrite=False):
    """Write the export of run_dir's checkpoint (`step`, default the latest) to `out`, with
    the trained tokenizer of the run's corpus (base_dir()/tokenizer, or tokenizer_climbmix),
    which must be the run's."""
    from nanochat.interop.hf.modeling import NanochatHCForCausalLM  # transformers: imported when used

    check_out_dir(out, overwrite)
    tokenizer_dir = run_tokenizer_dir(run_dir)
    tokenizer = get_tokenizer(tokenizer_dir)
    model, meta = checkpoint.load_model(run_dir, step=step, device="cpu")
    check_variant_ships(model.config.hc)
    step = meta["step"]
    check_vocab(tokenizer, model.config.vocab_size)
    config = hf_config(model.config, tokenizer.get_bos_token_id(), dtype)
    with torch.device("meta"):
        hf_model = NanochatHCForCausalLM(config)
    hf_model.model = model
    if dtype != "float32":
        hf_model.to(DTYPES[dtype])
        model.connections.float()  # coefficients stay fp32 (docs/connections.md, "Precision"), as on loading
    counts = model.param_counts()

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.export."))
    try:
        hf_model.save_pretrained(staging)
        files = assemble(ENTRY_MODULES, staging, names=ENTRY_MODULES, discovered=discovered_modules())
        check_imports(staging, files)
        export_tokenizer(tokenizer_dir, tokenizer, staging, model_max_length=model.config.sequence_len)
        card = model_card(run_dir, model.config, step, counts, meta["settings"]["total_batch_size"],
                          out.name, lm_eval_record(run_dir, step))
        (staging / "README.md").write_text(card, encoding="utf-8")
        _plain_permissions(staging)
        if out.exists():  # the earlier export goes aside first: an interruption leaves one of the two
            os.replace(out, staging.with_name(staging.name + ".old"))
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(staging.with_name(staging.name + ".old"), ignore_errors=True)
    return {"step": step, "dir": str(out), "files": sorted(p.name for p in out.iterdir()), "params": counts}
