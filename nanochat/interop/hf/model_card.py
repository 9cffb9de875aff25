"""README.md of an exported model: the Hub's YAML header, then what a reader needs to
judge and reuse the model: variant, streams and factors, parameter counts, tokens trained,
corpus, final train loss, val bpb, CORE (and per task) and lm-eval results where measured,
the exact training settings, and how to load it.

Every number comes from the run directory (read with the report's own readers); what no
file holds is shown as a dash, never guessed.
"""

from nanochat import connections, trunks
from nanochat.report.format import MISSING, fmt, md_table
from nanochat.report.runs import core_score, load_run, train_loss, val_bpb

REPOSITORY = "nanochat-hc"


def _variant_line(config):
    """`kromhc` with n = 8 streams, factors 4 x 2 (KromHC, arXiv 2601.21579: what it does)."""
    spec = connections.spec(config.hc)
    line = f"`{config.hc}`"
    if spec.streams:
        line += f" with {spec.stream_symbol} = {config.hc_streams} streams"
    if spec.settings:
        line += f"{',' if spec.streams else ''} {spec.settings(config)}"
    return line + f" ({spec.label}, {spec.source}: {spec.description})"


def _trunk_line(config):
    """Which nanochat recipe the model follows; with a backout (2026-07), what it subtracts."""
    recipe = trunks.recipe(config.trunk)
    line = f"`{config.trunk}` ({recipe.summary})"
    return f"{line}; the backout subtracts {connections.spec(config.hc).backout}" if recipe.smear_backout else line


def without_other_wirings(config_toml, hc):
    """The run's config.toml less the keys of other wirings' own fields (every flag is written,
    theirs at their defaults, which the run's wiring never reads)."""
    other = connections.other_fields(hc)
    return "".join(line for line in config_toml.splitlines(keepends=True)
                   if line.split("=", 1)[0].strip() not in other)


def _yaml_header(run, config):
    tags = [REPOSITORY, "hyper-connections", config.hc.replace("_", "-"), "custom_code"]
    lines = ["---", "library_name: transformers", "pipeline_tag: text-generation", "tags:"]
    lines += [f"- {t}" for t in dict.fromkeys(tags)]
    marker = (run.corpus or {}).get("marker", {})
    if marker.get("source") == "hf" and marker.get("dataset"):
        lines += ["datasets:", f"- {marker['dataset']}"]
    return "\n".join(lines + ["---"])


def _results(run, step, exported_step):
    core, source = core_score(run)
    rows = [("final train loss (smoothed)", fmt(train_loss(run), ".4f")),
            ("val bpb", fmt(val_bpb(run), ".4f")),
            ("CORE", MISSING if core is None else f"{core / 100:.4f} ({source})")]
    lines = [md_table(("metric", "value"), rows)]
    if step is not None and step != exported_step:
        lines.append(f"These are the run's numbers at its end (step {step}); this export is of step {exported_step}.")
    if run.core and run.core.get("tasks"):
        tasks = [(label, t["shots"], t["examples"], f"{t['accuracy']:.4f}", f"{t['centered']:+.4f}")
                 for label, t in run.core["tasks"].items()]
        lines += ["CORE per task (`core.json`):",
                  md_table(("task", "shots", "examples", "accuracy", "centered"), tasks)]
    return lines


def _lm_eval_lines(lm_eval):
    rows = [(task, lm_eval["n_shot"].get(task, MISSING), metric, f"{r['value']:.4f}", fmt(r["stderr"], ".4f"))
            for task, metrics in lm_eval["results"].items() for metric, r in metrics.items()]
    limit = lm_eval["settings"].get("limit")
    return [f"lm-evaluation-harness {lm_eval['versions']['lm_eval']} (`lm_eval.json`"
            + (f"; at most {limit} documents per task" if limit else "") + "):",
            md_table(("task", "shots", "metric", "value", "stderr"), rows)]


def model_card(run_dir, config, exported_step, counts, tokens_per_step, repo_name, lm_eval=None):
    """The card's text. config: the model's GPTConfig; counts: GPT.param_counts(); lm_eval:
    the run's lm_eval.json record, if any."""
    run = load_run(run_dir)
    final_step = (run.summary or {}).get("step")
    corpus = (run.corpus or {}).get("description", "unknown (the run has no corpus.json)")
    config_toml = (run.path / "config.toml").read_text() if (run.path / "config.toml").is_file() else None
    if config_toml:
        config_toml = without_other_wirings(config_toml, config.hc)
    overview = [
        ("residual connection", _variant_line(config)),
        ("connection settings", ", ".join(f"`{name}={value}`" for name, value in connections.own_settings(config).items())
         or "none (the wiring has no settings)"),
        ("trunk", _trunk_line(config)),
        ("layers / width / heads", f"{config.n_layer} / {config.n_embd} / {config.n_head} ({config.n_kv_head} kv)"),
        ("value embeddings", "on (alternating layers)" if config.value_embeds else "off"),
        ("parameters", f"{counts['total']:,} total, {counts['non_embedding']:,} non-embedding, "
                       f"{counts['connections']:,} in the connections"),
        ("tokens trained", f"{exported_step * tokens_per_step:,} ({exported_step:,} steps x {tokens_per_step:,})"),
        ("context length", f"{config.sequence_len} tokens (window pattern `{config.window_pattern}`)"),
        ("vocabulary", f"{config.vocab_size:,} tokens"),
        ("corpus", corpus),
    ]
    usage = f"""```python
from transformers import AutoModelForCausalLM, AutoTokenizer

path = "{repo_name}"  # this directory, or its Hub id
tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)
inputs = tokenizer(["The capital of France is"], return_tensors="pt")  # starts with <|bos|>
out = model.generate(**inputs, max_new_tokens=32, do_sample=False)
print(tokenizer.decode(out[0], skip_special_tokens=True))
```"""
    parts = [
        _yaml_header(run, config),
        f"# {repo_name}",
        f"A base language model trained with {REPOSITORY} (nanochat with pluggable hyper-connections) "
        f"at step {exported_step}. The modeling code in this directory is the training code itself, "
        "assembled into flat files: it needs torch and transformers (5.x), not the training repository.",
        md_table(("", ""), overview),
        "## Results", *_results(run, final_step, exported_step),
        *(_lm_eval_lines(lm_eval) if lm_eval else []),
        "## Usage", usage,
        "The tokenizer adds `<|bos|>` (the document separator the model was trained with) at the start; "
        "special-token text in the input is encoded as plain text, as in training. `<|bos|>` also serves as "
        "end-of-text and padding token (batches are padded on the left; `generate()` takes the attention "
        "mask). lm-evaluation-harness: `lm_eval --model hf --model_args pretrained=PATH,trust_remote_code=True` "
        "scores multiple-choice tasks as the native evaluation does; for rolling log-likelihood (perplexity) "
        "tasks add `add_bos_token=False`, or lm-eval's hf model scores `<|bos|>` twice.",
        "## Training configuration",
        *([f"`python -m scripts.base_train --config config.toml` in {REPOSITORY} with this `config.toml` "
           "(the run's resolved settings, every flag but other wirings' own fields, which keep their defaults):",
           f"```toml\n{config_toml.strip()}\n```"]
          if config_toml else ["The run directory holds no config.toml: its settings are unknown."]),
    ]
    return "\n\n".join(parts) + "\n"
