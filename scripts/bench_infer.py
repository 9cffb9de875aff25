"""The inference benchmarks of scripts/bench (`--bench infer`, `prefill`, `decode`): what each
connection costs once the model is trained, through the path evaluation and generation take
(nanochat/engine.py: a StaticKVCache, eager or compiled, decode steps under CUDA graphs).

  prefill  the prompt into the KV cache: T tokens per row (--prefill-lens), B rows
           (--infer-batches); tokens/s = B * T / median time
  decode   after a --prompt-len prompt (prefilled untimed), --new-tokens greedy tokens, one
           forward per token, fed back on the device (no host sync per token); ms/token =
           median time / new tokens (a step of B rows), tokens/s = B * new tokens / time
Modes (--modes): eager; compiled (torch.compile: prefill with dynamic length, decode with
static shapes); cudagraphs (decode only: the compiled decode replayed as a CUDA graph; its
prefill is the compiled mode's graph; CUDA only). Ratios in
the same run: x residual and x mhc (same bench, mode and shape), x eager (same variant).
Peak memory (CUDA): the allocator's peak over one timed call minus what was allocated before.
"""

import torch

from nanochat.common import text_table
from nanochat.engine import Inference

MODES = ("eager", "compiled", "cudagraphs")


def default_modes(device):
    return list(MODES) if device.type == "cuda" else ["eager", "compiled"]


def check_modes(modes, device):
    if "cudagraphs" in modes and device.type != "cuda":
        raise SystemExit("error: --modes cudagraphs needs --device cuda (CUDA graphs); use eager,compiled")


def infer_model(args, variant, device, dtype, bench):
    """The whole GPT of the training bench's shape, with a context that holds the longest
    prefill and the decode's prompt plus its new tokens."""
    longest = max(max(args.prefill_lens), args.prompt_len + args.new_tokens)
    cfg = bench.make_config(args, variant, False, n_layer=args.depth)
    cfg.sequence_len = longest
    from nanochat.gpt import build_model
    torch.manual_seed(args.seed)
    return build_model(cfg, device).eval()  # bf16 on CUDA through autocast, as base_eval runs it


def prefill_case(inference, batch, length, device, vocab, gen):
    ids = torch.randint(0, vocab, (batch, length), device=device, generator=gen)
    cache = inference.cache(batch, length)

    def step():
        cache.reset()
        inference.step(ids, cache)

    return dict(step=step, tokens=batch * length)


def decode_case(inference, batch, prompt_len, new_tokens, device, vocab, gen):
    prompt = torch.randint(0, vocab, (batch, prompt_len), device=device, generator=gen)
    cache = inference.cache(batch, prompt_len + new_tokens)
    first = inference.step(prompt, cache)[:, -1].argmax(-1, keepdim=True)

    def step():
        cache.pos.fill_(prompt_len)  # back to just after the prompt; later slots are rewritten
        ids = first
        for _ in range(new_tokens):
            ids = inference.step(ids, cache)[:, -1].argmax(-1, keepdim=True)

    return dict(step=step, tokens=batch * new_tokens)


def run_infer(args, benches, device, dtype, autocast, bench):
    """Rows of the prefill and/or decode benchmarks for every variant and mode."""
    modes = args.modes or default_modes(device)
    check_modes(modes, device)
    cases = {}
    with torch.inference_mode(), autocast:
        for variant in args.variants:
            model = infer_model(args, variant, device, dtype, bench)
            for mode in modes:
                inference = Inference(model, compile=mode != "eager", cuda_graphs=mode == "cudagraphs")
                gen = torch.Generator(device=device).manual_seed(args.seed)
                shapes = []
                if "prefill" in benches and mode != "cudagraphs":  # its prefill is the compiled mode's
                    shapes += [("prefill", b, t) for b in args.infer_batches for t in args.prefill_lens]
                if "decode" in benches:
                    shapes += [("decode", b, args.prompt_len) for b in args.infer_batches]
                for kind, b, t in shapes:
                    graphs = inference.graphs()
                    if kind == "prefill":
                        case = prefill_case(inference, b, t, device, args.vocab_size, gen)
                    else:
                        case = decode_case(inference, b, t, args.new_tokens, device, args.vocab_size, gen)
                    label = f"{kind} {variant} {mode} B={b} T={t}"
                    cases[label] = dict(case, bench=kind, variant=variant, mode=mode, batch=b, seq_len=t,
                                        model=model, inference=inference, graphs_before=graphs)
        if any(mode != "eager" for mode in modes):
            bench.allow_compiled_cases(len(cases))
        times = bench.time_interleaved(cases, args.warmup, args.reps, device)
        rows = []
        for label, case in cases.items():
            row = {"bench": case["bench"], "label": label, "variant": case["variant"], "mode": case["mode"],
                   "batch": case["batch"], "seq_len": case["seq_len"],
                   "new_tokens": args.new_tokens if case["bench"] == "decode" else None,
                   **bench.summarize(times[label], case["tokens"]),
                   "fallback": case["inference"].fallback,
                   "peak_mib": bench.peak_step_mib(case["model"], case["step"], device)}
            if case["bench"] == "decode":
                row["ms_per_token"] = row["median_ms"] / args.new_tokens
            rows.append(row)
    return add_infer_ratios(rows)


def add_infer_ratios(rows):
    """time_vs_residual, time_vs_mhc (same bench, mode, batch and length) and time_vs_eager
    (same variant, bench and shape); None when the peer is absent."""
    def peer(row, **match):
        key = {**{k: row[k] for k in ("bench", "variant", "mode", "batch", "seq_len")}, **match}
        return next((r for r in rows if all(r[k] == v for k, v in key.items())), None)

    for row in rows:
        for name, match in (("time_vs_residual", dict(variant="residual")), ("time_vs_mhc", dict(variant="mhc")),
                            ("time_vs_eager", dict(mode="eager"))):
            other = peer(row, **match)
            row[name] = row["median_ms"] / other["median_ms"] if other else None
    return rows


def print_infer(rows, args, width, fmt):
    for kind in ("prefill", "decode"):
        picked = [r for r in rows if r["bench"] == kind]
        if not picked:
            continue
        shape = (f"T in {args.prefill_lens}" if kind == "prefill"
                 else f"{args.new_tokens} new tokens after a {args.prompt_len}-token prompt")
        print(f"\n{kind}: whole model, depth {args.depth} C={width} head_dim={args.head_dim} vocab={args.vocab_size}, "
              f"{shape}")
        header = (["variant", "mode", "B", "T", "median ms", "spread", "tok/s"]
                  + (["ms/token"] if kind == "decode" else []) + ["x residual", "x mhc", "x eager", "peak MiB"])
        lines = []
        for r in picked:
            lines.append([r["variant"], r["mode"] + (" (fell back)" if r["fallback"] else ""), str(r["batch"]),
                          str(r["seq_len"]), f"{r['median_ms']:.2f}", f"{r['spread_pct']:.1f}%",
                          f"{r['tokens_per_s']:,.0f}"]
                         + ([f"{r['ms_per_token']:.3f}"] if kind == "decode" else [])
                         + [fmt(r["time_vs_residual"], ".3f"), fmt(r["time_vs_mhc"], ".3f"),
                            fmt(r["time_vs_eager"], ".3f"), fmt(r["peak_mib"], ".1f")])
        print(text_table(header, lines))
