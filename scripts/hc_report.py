"""Hyper-connection report: parameter counts beside the KromHC paper's, and the Figure-2
stability diagnostics of a trained checkpoint.

python -m scripts.hc_report --params [--depth D --streams N [--factors 2 2] [--width C]]
python -m scripts.hc_report --checkpoint RUN_DIR [--step N] [--random-tokens] [--batch-size 4]
python -m scripts.hc_report --memory [--depth 12] [--batch-size 32] [--nproc 8]
python -m scripts.hc_report --memory-check

--params prints the model sizes beside the paper's (~60M, ~186M) for both layouts (nanochat at
the pin; a 65,536 vocab without value embeddings), the FLOP convention's shares at D = 12, n = 4
(connection projections counted, stream mixes and Sinkhorn not), the paper's ΔParams column (n = 4, D = 6
and 12; go-mHC beside the paper's family), what the options beyond the paper add (LSS,
learned head, delayed pre-weights), the variants beyond the family (go-mHC at s = 1..3,
Frac-Connections, Block Attention Residuals), KromHC's width-n table (D = 12) and the
params-vs-n figure (per HC layer, C = 512, i_k = 2, go-mHC at s = 2).
--checkpoint runs one batch of validation tokens through the model, writes hc_stats.json
in the run directory and prints the per-layer and composite numbers and the stream-collapse
measures (connections/collapse.py) per layer and for the final state; for Block Attention
Residuals, which has neither streams nor H_res (those measures do not apply), the weights
each read puts on its sources. It warns, in one line, when the connection parameters sit
exactly at their start (a wiring that never learned).
--memory prints the estimated peak memory per rank on a GPU (nanochat/planning/memory.py: bf16, CUDA's
dtype rules, T = 2048, vocab 32,768) of every variant, compiled and eager, relative to the
residual baseline; --memory-check the estimate beside the measured peak of real CPU steps for
every variant and option, eager and compiled, at two sizes (nanochat/planning/memory_check.py; minutes).
"""

import argparse
import dataclasses
import json
import math
import os

import torch

from nanochat import connections
from nanochat.cli import choice, existing_dir, int_at_least, nonneg_int, positive_int, run
from nanochat.common import text_table
from nanochat.connections import liveness
from nanochat.connections.diagnostics import (attnres_read_params, collect_hc_stats, frac_layer_params, frame_params,
                                              hc_layer_params, model_hc_params)
from nanochat.connections.mhc_lite import MAX_STREAMS as MHC_LITE_MAX_STREAMS
from nanochat.report import paper
from nanochat.report.format import fmt

PAPER_WIDTHS = {6: 384, 12: 768}  # model_dim of the paper's D = 6 and D = 12 (head dim 128)


def family_variants():
    """The HC family's members in registry order (SPEC family "hc"): the rows of the paper's
    ΔParams column, the options table and the params-vs-n figure."""
    return list(connections.specs(family="hc"))


def connection_params(variant, depth, C, **fields):
    """Connection parameters of a whole model of `depth` blocks and width C, as the variant's
    SPEC counts them for the resolved config (ValueError for a config it refuses)."""
    from nanochat.gpt import GPTConfig
    cfg = GPTConfig(n_layer=depth, n_embd=C, n_head=1, n_kv_head=1, hc=variant, **fields)
    return connections.spec(variant).params(cfg)


def kilo(x):
    return f"{x / 1e3:.1f}K"


def pct(ours, theirs):
    return f"{100 * (ours - theirs) / theirs:+.2f}%"


def main_table():
    n = paper.PAPER_STREAMS
    rows, diffs = [], []
    for variant in family_variants():
        row = [connections.label(variant)]
        for depth in paper.PAPER_DEPTHS:
            C = PAPER_WIDTHS[depth]
            ours = connection_params(variant, depth, C, hc_streams=n)
            ref = paper.MAIN.get((depth, variant))
            theirs = ref.delta_params_k * 1000 if ref else None
            if theirs:
                diffs.append(abs(ours - theirs) / theirs)
            row += [kilo(ours), f"{theirs / 1e3:.0f}K" if theirs else "-", pct(ours, theirs) if theirs else "-",
                    kilo(connection_params(variant, depth, C, hc_streams=n, hc_norm_weight=False))]
        rows.append(row)
    header = ["variant"]
    for depth in paper.PAPER_DEPTHS:
        header += [f"D={depth} (C={PAPER_WIDTHS[depth]})", "paper", "diff", "no norm w."]
    return (f"{paper.MAIN_TABLE}, the ΔParams column: connection parameters, n = {n}, L = 2D HC layers,\n"
            f"counting the RMSNorm weight over nC (the paper's table does; its closed-form formula omits it).\n"
            f"Per layer: nC(2n+R) + (2n+R) + 3 + nC with R = n^2 (HC, mHC), n! (mHC-lite), sum_k i_k! (KromHC),\n"
            f"ns(ns-1)/2 (go-mHC, s = 2: not in the paper); HC (H_res = I): nC*2n + 2n + 2 + nC.\n"
            f"Largest difference to the paper: {100 * max(diffs):.2f}% (its entries are rounded to 1K).\n\n"
            + text_table(header, rows))


def options_table():
    """Connection parameters of each HC variant at D = 12, n = 4 with each option beyond the paper."""
    depth, n = 12, paper.PAPER_STREAMS
    C = PAPER_WIDTHS[depth]
    options = (("the paper", {}), ("+ LSS", dict(hc_expand="lss")), ("+ learned head", dict(hc_reduce="learned")),
               ("delayed pre", dict(hc_pre="delayed")))
    rows = [[connections.label(v), *(f"{connection_params(v, depth, C, hc_streams=n, **o):,}"
                                     if all(connections.takes_option(v, field) for field in o) else "-"
                                     for _, o in options)]
            for v in family_variants()]
    return (f"Options beyond the paper (D = {depth}, C = {C}, n = {n}): connection parameters of the model.\n"
            f"LSS adds n*C = {frame_params(n, C, expand='lss'):,} (one (n, C) scale at expansion); the learned head "
            f"n*n*C + n + 1 = {frame_params(n, C, reduce='learned'):,};\ndelayed pre-weights add none (each layer's "
            f"pre columns serve the next layer; the last layer's fold the final state); - : an option the\n"
            f"variant does not take (SPEC options).\n\n"
            + text_table(["variant", *(name for name, _ in options)], rows))


def beyond_table():
    """Connection parameters of the variants beyond the paper's family at its depths."""
    n = paper.PAPER_STREAMS
    rows = [[f"{connections.label('go_mhc')} (n = {n}, s = {s})",
             *(f"{model_hc_params('go_mhc', n, PAPER_WIDTHS[d], d, s=s):,}" for d in paper.PAPER_DEPTHS)]
            for s in (1, 2, 3)]
    for variant, spec in connections.specs(in_paper=False).items():
        if spec.family == "hc":
            continue
        streams = dict(hc_streams=n) if spec.streams else {}
        rows.append([connections.label(variant) + (f" ({spec.stream_symbol} = {n})" if spec.streams else ""),
                     *(f"{connection_params(variant, d, PAPER_WIDTHS[d], **streams):,}" for d in paper.PAPER_DEPTHS)])
    C = PAPER_WIDTHS[12]
    return ("Beyond the paper's family: connection parameters of the model (not in the paper).\n"
            "go-mHC: the HC layer with R = ns(ns-1)/2 res logits (the strict upper triangle of its skew-symmetric\n"
            f"generator). Frac-Connections, per layer (Eqs. 16-20 with an RMSNorm): (C/m)(2m+1) + m(2m+1) + 2 + C/m\n"
            f"= {frac_layer_params(n, C):,} at C = {C}, m = {n} (the paper's check, OLMo-1B: 32 x "
            f"{frac_layer_params(n, 2048):,} = {32 * frac_layer_params(n, 2048):,}).\nBlock AttnRes, a baseline: a "
            f"pseudo-query and a key-norm gain (2C = {attnres_read_params(C):,}) per sub-layer and for the final\n"
            "read, (2D + 1) * 2C whatever the block size.\n\n"
            + text_table(["variant", *(f"D={d} (C={PAPER_WIDTHS[d]})" for d in paper.PAPER_DEPTHS)], rows))


def scaling_table():
    depth, C = paper.N_SCALING_DEPTH, PAPER_WIDTHS[paper.N_SCALING_DEPTH]
    rows = []
    for n, theirs in paper.N_SCALING_DELTA_PARAMS_M.items():
        factors = list(paper.N_SCALING_FACTORS[n])
        ours = model_hc_params("kromhc", n, C, depth, factors)
        rows.append([n, "x".join(map(str, factors)), f"{ours / 1e6:.2f}M", f"{theirs:.2f}M", pct(ours, theirs * 1e6),
                     f"{model_hc_params('kromhc', n, C, depth, factors, norm_weight=False) / 1e6:.2f}M"])
    return (f"{paper.N_SCALING_TABLE}: KromHC ΔParams at D = {depth} (C = {C})\n\n"
            + text_table(["n", "factors", "ours", "paper", "diff", "no norm w."], rows)
            + f"\n\nNote: {paper.N_SCALING_NOTE}. We report our count.")


def params_vs_n_table(C=paper.PARAMS_VS_N_C, streams=range(2, 17)):
    family = family_variants()
    rows = []
    for n in streams:
        row = [n]
        for variant in family:
            fields = dict(hc_streams=n)
            if variant == "kromhc":
                k = round(math.log2(n))
                fields["hc_factors"] = [2] * k if 2 ** k == n else []  # i_k = 2 where n is a power of two
            if variant == "mhc_lite" and n > MHC_LITE_MAX_STREAMS:
                row.append(f"{hc_layer_params(variant, n, C):.2e} (infeasible)")
                continue
            try:
                count = f"{connection_params(variant, 1, C, **fields) // 2:,}"  # depth 1: two HC layers
            except ValueError:
                count = "n/a (prime > 5)"
            if variant == "kromhc" and not fields["hc_factors"] and "n/a" not in count:
                count += " *"
            row.append(count)
        rows.append(row)
    return (f"{paper.PARAMS_VS_N_FIGURE}: parameters per HC layer against n, C = {C}, with the norm weight;\n"
            f"KromHC with i_k = 2 (n = 2^K); * = other n, prime factors <= 5; mHC-lite refused above "
            f"n = {MHC_LITE_MAX_STREAMS}; go-mHC at s = 2.\n\n"
            + text_table(["n", *(connections.label(v) for v in family)], rows))


def custom_table(depth, n, factors, width):
    from nanochat.gpt import model_config_from_depth
    C = width or model_config_from_depth(depth, vocab_size=64, sequence_len=64).n_embd
    rows = []
    for variant, spec in connections.specs().items():
        fields = dict(hc_streams=n) if spec.streams else {}
        if factors and "hc_factors" in getattr(connections.VARIANTS[variant], "FIELDS", {}):
            fields["hc_factors"] = list(factors)
        if variant == "mhc_lite" and n > MHC_LITE_MAX_STREAMS:
            rows.append([spec.label, f"refused: n > {MHC_LITE_MAX_STREAMS}", "", ""])
            continue
        try:
            total = connection_params(variant, depth, C, **fields)
            rows.append([spec.label, f"{total / (2 * depth):,.0f}", f"{total:,}",
                         f"{connection_params(variant, depth, C, hc_norm_weight=False, **fields):,}"])
        except ValueError as e:
            rows.append([spec.label, f"n/a: {e}", "", ""])
    return (f"n = {n}, D = {depth} (C = {C}, L = {2 * depth})"
            + (f", KromHC factors {'x'.join(map(str, factors))}" if factors else "") + "\n\n"
            + text_table(["variant", "mean per layer", "model", "model, no norm w."], rows))


def model_size_table():
    """The paper's stated model sizes beside the two layouts one flag apart (whole model,
    residual baseline; the HC variants add the Table-3 ΔParams column)."""
    import torch

    from nanochat.gpt import GPT, model_config_from_depth
    layouts = (("nanochat at the pin", paper.PIN_LAYOUT), ("size-matched", paper.SIZE_MATCHED_LAYOUT))
    rows = []
    for depth in paper.PAPER_DEPTHS:
        row = [depth, f"~{paper.MODEL_SIZES_M[depth]}M"]
        for _, layout in layouts:
            config = model_config_from_depth(depth, layout["vocab_size"], 2048, value_embeds=layout["value_embeds"])
            with torch.device("meta"):
                counts = GPT(config).param_counts()
            row += [f"{counts['total'] / 1e6:.1f}M", f"{counts['non_embedding'] / 1e6:.1f}M"]
        rows.append(row)
    header = ["D", "paper"]
    for name, layout in layouts:
        header += [f"{name} total", "non-emb."]
    notes = "; ".join(f"{name}: vocab {layout['vocab_size']:,}, value embeddings {'on' if layout['value_embeds'] else 'off'}"
                      for name, layout in layouts)
    return ("Model size (residual baseline, whole model) beside the paper's stated sizes, which set its\n"
            f"step counts at ~20 tokens per parameter. {notes}.\n"
            "Non-embedding = total less wte and the value embeddings. The size-matched layout is\n"
            "`--vocab-size 65536 --value-embeds false` (tokenizer: `tok_train --vocab-size 65536`).\n\n"
            + text_table(header, rows))


def flop_convention_table(depth=12, n=paper.PAPER_STREAMS, layout=paper.PIN_LAYOUT):
    """The FLOP convention of GPT.estimate_flops (what compute multipliers are in) at one size:
    per variant the training FLOPs per token it counts, the share of them that are connection
    parameters (counted as matmuls), and the stream work it leaves out (stream_mix_flops)."""
    from nanochat.gpt import GPT, model_config_from_depth
    rows = []
    sized = [v for v, spec in connections.specs().items() if spec.stream_flops is not None]
    for variant in ("residual", *sized):  # the baseline, then every variant that sizes its stream work
        config = model_config_from_depth(depth, layout["vocab_size"], 2048, value_embeds=layout["value_embeds"],
                                         hc=variant, hc_streams=0 if variant == "residual" else n)
        with torch.device("meta"):
            model = GPT(config)
        counted = model.estimate_flops()
        projections = 6 * sum(p.numel() for p in model.connections.parameters() if p.numel() > 1)
        left_out = 0 if variant == "residual" else connections.spec(variant).stream_flops(config)
        rows.append([connections.label(variant), f"{counted / 1e9:.3f}G", f"{100 * projections / counted:.2f}%",
                     f"{100 * left_out / counted:.2f}%"])
    return (f"FLOP convention at D={depth}, n={n} (GPT.estimate_flops; compute multipliers are in these FLOPs):\n"
            "counted: 6 per matmul weight and token (every parameter but the embeddings and one-element scalars),\n"
            "connection projections included, and attention 12·h·d·window "
            "per layer; not counted: embeddings, the stream mixes (pre, post, res, the RMSNorm over nC) and building\n"
            "H_res (Sinkhorn, permutation mixtures), memory-bound element-wise passes.\n\n"
            + text_table(["Method", "FLOPs/token counted", "of which connections", "not counted (mixes, H_res)"],
                         rows))


def dead_table(depth=12, n=paper.PAPER_STREAMS):
    """The connection parameters each wiring's math leaves without a gradient at its defaults
    (SPEC dead), with the reason: named, not counted as learning (connections/liveness.py)."""
    from nanochat.gpt import GPTConfig
    rows = []
    for variant, spec in connections.specs().items():
        config = GPTConfig(n_layer=depth, n_embd=PAPER_WIDTHS[depth], n_head=1, n_kv_head=1, hc=variant,
                           hc_streams=n if spec.streams else 0)
        by_reason = {}
        for name, reason in spec.dead_parameters(config).items():
            by_reason.setdefault(reason, []).append(name)
        rows += [[spec.label, ", ".join(names), reason] for reason, names in by_reason.items()]
    return (f"Dead by construction (D = {depth}, n = {n}, each wiring's defaults): connection parameters whose "
            "gradient is rounding\n"
            "alone, declared by the wiring (SPEC dead); the gradient checks require them dead and every other one "
            "live.\n\n" + text_table(["variant", "parameters", "why"], rows))


def print_params(args):
    from nanochat.planning.throughput import family_hint
    for hint in filter(None, map(family_hint, connections.VARIANTS)):
        print(hint, end="\n\n")
    print(model_size_table(), end="\n\n")
    print(main_table(), end="\n\n")
    print(flop_convention_table(), end="\n\n")
    print(options_table(), end="\n\n")
    print(dead_table(), end="\n\n")
    print(beyond_table(), end="\n\n")
    print(scaling_table(), end="\n\n")
    print(params_vs_n_table())
    if args.depth or args.streams:
        print()
        print(custom_table(args.depth or 12, args.streams or paper.PAPER_STREAMS, args.factors, args.width))


def resolve_run_dir(path):
    from nanochat.checkpoint_manager import run_dir_for
    if os.path.isdir(path):
        return path
    tagged = run_dir_for(path)
    if os.path.isdir(tagged):
        return tagged
    raise SystemExit(f"error: --checkpoint {path}: neither a directory nor a model tag under {os.path.dirname(tagged)}")


def checkpoint_tokens(args, model, device, run_dir):
    """(token ids (B, T), description): a validation batch, or random ids when asked."""
    T = args.seq_len or model.config.sequence_len
    if T > model.rotary_len:
        raise SystemExit(f"error: --seq-len {T} exceeds the {model.rotary_len} tokens the model accepts; lower it")
    if args.random_tokens:
        g = torch.Generator().manual_seed(args.seed)
        return torch.randint(0, model.config.vocab_size, (args.batch_size, T), generator=g).to(device), \
            f"random tokens (seed {args.seed}), not validation data"
    from nanochat.data.shards import DatasetError
    from nanochat.dataloader import build_val_loader
    from nanochat.tokenizer import get_tokenizer, run_tokenizer_dir
    try:
        tokenizer = get_tokenizer(args.tokenizer_dir or run_tokenizer_dir(run_dir))
        if tokenizer.get_vocab_size() != model.config.vocab_size:
            raise SystemExit(f"error: the tokenizer has {tokenizer.get_vocab_size()} tokens but the model was "
                             f"trained with {model.config.vocab_size}; pass the run's --tokenizer-dir "
                             "(or --random-tokens)")
        with build_val_loader(tokenizer, args.batch_size, T, device=device, data_dir=args.data_dir) as loader:
            x, _ = next(loader)
    except (DatasetError, FileNotFoundError) as e:
        raise SystemExit(f"error: no validation tokens ({e}); pass --random-tokens to run on random ids instead")
    return x, "the first validation batch"


def layer_table(stats):
    rows = [[l["index"], l["sublayer"], f"{l['row_err']:.2e}", f"{l['col_err']:.2e}", f"{l['min_entry']:.2e}",
             f"{l['identity_dist']:.3f}", f"{l['composite_row_mae']:.2e}", f"{l['composite_col_mae']:.2e}",
             " ".join(f"{r:.2f}" for r in l["stream_rms"])] for l in stats["layers"]]
    header = ["layer", "F", "row err", "col err", "min", "|H-I|", "prod row MAE", "prod col MAE", "stream RMS"]
    return text_table(header, rows)


def collapse_table(stats):
    rows = [[l["index"], l["sublayer"], f"{l['effective_streams']:.2f}",
             f"{l['dominant_share']:.2f} (s{l['dominant_stream']})", fmt(l["stream_cosine"], ".2f"),
             f"{l['read_effective']:.2f}", f"{l['write_effective']:.2f}", f"{l['offdiag_mass']:.3f}",
             f"{l['identity_fro']:.3f}", fmt(l["perm_distance"], ".3f"), fmt(l["res_logit_range"], ".1f")]
            for l in stats["layers"]]
    final = stats["final"]
    rows.append(["final", "", f"{final['effective_streams']:.2f}",
                 f"{final['dominant_share']:.2f} (s{final['dominant_stream']})", fmt(final["stream_cosine"], ".2f"),
                 *[""] * 6])
    header = ["layer", "F", "eff. streams", "dominant", "cosine", "reads", "writes", "off-diag", "|H-I|_F",
              "to perm.", "logit range"]
    return text_table(header, rows)


def variant_line(run_dir, stats, config, source):
    """The first line of a checkpoint's printout: run, variant (label and own settings), step, tokens."""
    spec = connections.spec(config.hc)
    settings = f", {spec.settings(config)}" if spec.settings else ""
    return (f"{run_dir}: {stats['variant']} ({spec.label}){settings}, step {stats['step']}, {stats['tokens']} tokens "
            f"from {source}")


def print_reads(run_dir, stats, source, config):
    """A wiring that reads earlier states (Attention Residuals): the mean weight each read
    puts on its sources."""
    print(variant_line(run_dir, stats, config, source) + "\n")
    rows = [[l["index"], l["sublayer"], l["sources"], f"{l['entropy']:.2f} / {math.log(l['sources']):.2f}",
             " ".join(f"{w:.2f}" for w in l["source_weights"])] for l in stats["layers"]]
    print(text_table(["layer", "F", "sources", "entropy / max", "mean weight per source (b_0 = x0 first)"], rows))
    print("Each read is a softmax over its sources (the embedding, the closed blocks, then its own block's partial\n"
          "sum): at init every query is zero and the read is their plain mean (entropy = log of the count).\n"
          "Doubly-stochastic, composite and stream-collapse measures: not applicable (no streams, no H_res).")


def print_states(run_dir, stats, source, config):
    """A wiring whose layers record no coefficients: the stream RMS each layer received and the
    collapse measures of the final state."""
    print(variant_line(run_dir, stats, config, source) + "\n")
    rows = [[l["index"], l["sublayer"], " ".join(f"{r:.2f}" for r in l["stream_rms"])] for l in stats["layers"]]
    print(text_table(["layer", "F", "stream RMS"], rows))
    final = stats["final"]
    if final:
        print(f"final state: {final['effective_streams']:.2f} effective streams, dominant share "
              f"{final['dominant_share']:.2f}")
    print("This wiring records no H_res and no read weights: the doubly-stochastic and composite measures are not "
          "applicable.")


def gradient_liveness(model, x):
    """(rows of connections/liveness.py for the connection gradients, the whole model's
    gradient norm) of one loss on the batch `x` (its own next tokens as targets), on an fp64
    copy of the model: rounding then sits ten orders below a live gradient, so that each part
    its wiring declares (SPEC parts: e.g. an HC layer's res columns) is judged on its own."""
    from nanochat.gpt import build_model
    # the stream ops and attention in plain PyTorch: the Triton kernels and FlexAttention do not run fp64
    config = dataclasses.replace(model.config, hc_kernels="torch", attention="sdpa")
    copy = build_model(config, x.device)
    copy.load_state_dict(model.state_dict())
    copy.double()
    with torch.autocast(x.device.type, enabled=False):
        copy(x[:, :-1], x[:, 1:]).backward()
    grads = {name: p.grad if p.grad is not None else torch.zeros_like(p)
             for name, p in copy.connections.named_parameters()}
    total = float(torch.stack([p.grad.square().sum() for p in copy.parameters() if p.grad is not None]).sum().sqrt())
    spec = connections.spec(config.hc)
    return liveness.report(grads, spec.dead_parameters(config), spec.judged_parts(config), torch.float64), total


def liveness_lines(rows, total, variant):
    """What gradient_liveness found, in a few lines, by the rule base_train's warnings use: the
    wiring against the model, the live count, each declared dead part with its reason, and
    every contradiction of the declaration."""
    if not rows:
        return []
    live = [r for r in rows if r["part"] == "live"]
    scale = rows[0]["scale"]
    out = [f"gradients on this batch (fp64; connections/liveness.py): the wiring's norm {scale:.2e} against the "
           f"model's {total:.2e}"]
    if liveness.wiring_is_dead(scale, total, torch.float64):
        out.append(f"  warning: hc={variant!r} gets no gradient above rounding (within one fp64 roundoff of the "
                   "model's): it cannot learn from here")
    out.append(f"  {sum(r['live'] for r in live)} of {len(live)} parts of the connection parameters learn (a norm "
               f"above {liveness.PART_FACTOR} fp64 roundoffs of the wiring's; each declared slice judged on its own)")
    out += [f"  dead by construction: {r['name']} (norm {r['norm']:.1e}): {r['reason']}" for r in rows
            if r["part"] != "live"]
    out += [f"  warning: {r['name']} " + ("gets rounding alone" if r["part"] == "live" else "is declared dead but learns")
            + f" (norm {r['norm']:.1e})" for r in liveness.surprises(rows)]
    return out


def report_checkpoint(args):
    from nanochat.checkpoint_manager import atomic_write, load_model
    from nanochat.common import autodetect_device_type, compute_dtype
    from nanochat.gpt import autocast_for
    run_dir = resolve_run_dir(args.checkpoint)
    device_type = args.device_type or autodetect_device_type()
    device = torch.device(device_type)
    model, meta = load_model(run_dir, step=args.step, device=device)
    x, source = checkpoint_tokens(args, model, device, run_dir)
    dtype = compute_dtype(device_type)
    with autocast_for(model.config, device_type, dtype):
        stats = collect_hc_stats(model, x)
    stats.update(step=meta.get("step", args.step), tokens_source=source)
    rows, total = gradient_liveness(model, x)
    stats["liveness"] = rows
    path = os.path.join(run_dir, "hc_stats.json")
    atomic_write(path, json.dumps(stats, indent=1))
    if connections.sits_at_init(model.connections, model.config):
        print(f"warning: every connection parameter of this step {stats['step']} checkpoint sits exactly at its "
              f"start: the wiring never learned (its gradients were zero; base_train warns after step 1)")
    if "composite_col_mae" not in stats:  # no H_res: the reads, or the states alone
        reads = all("source_weights" in layer for layer in stats["layers"])
        (print_reads if reads else print_states)(run_dir, stats, source, model.config)
        print("".join(f"\n{line}" for line in liveness_lines(rows, total, model.config.hc)))
        print(f"\nwrote {path}")
        return
    print(f"{variant_line(run_dir, stats, model.config, source)}, n = {stats['n']}; coefficients fp32, streams "
          f"{stats['stream_dtype']}\n")
    print(layer_table(stats), end="\n\n")
    print(f"composite over {len(stats['layers'])} layers (float64 product of each token's H_res):")
    for key in ("composite_col_mae", "composite_row_mae", "composite_col_mae_max", "composite_row_mae_max",
                "fwd_gain", "bwd_gain", "uniform_dist"):
        print(f"  {key:22s} {stats[key]:.3e}")
    print("Rows are target streams (X_next = H_res X): the paper's Figure-2 'column sums' are those of its code's\n"
          "A = H_res^T, i.e. our row sums; mHC here is exact on columns (its last Sinkhorn step), so its error\n"
          f"shows in the row MAE. Paper ({paper.STABILITY_FIGURE}, D = 12): mHC ~0.05, mHC-lite and KromHC 0.")
    print(f"\nstream collapse at each layer's input and at the final state (means over {stats['tokens']} tokens; "
          "nanochat/connections/collapse.py):")
    print(collapse_table(stats))
    print("eff. streams: distinct directions the streams span, in [1, n] (participation ratio of the singular values "
          "squared;\ncopies count once); dominant: the largest energy share and its stream; cosine: between two "
          "streams;\nreads/writes: effective number of coefficients in H_pre / H_post; "
          "off-diag: 1 - tr(H_res)/n;\nto perm.: 1 - the best permutation's mean entry (0: H_res is a permutation); "
          "logit range: max - min of the res logits.")
    print("".join(f"\n{line}" for line in liveness_lines(rows, total, model.config.hc)))
    print(f"\nwrote {path}")


def print_memory(args):
    from nanochat.connections import VARIANTS
    from nanochat.planning.memory import GIB
    from nanochat.planning.memory_check import gpu_rows
    depth, batch = args.depth or 12, args.batch_size
    rows = [(variant, mode, f"{est.params / GIB:.2f}", f"{est.optimizer / GIB:.2f}", f"{est.step / GIB:.1f}",
             f"{est.peak / GIB:.1f}", f"{est.needed / GIB:.1f}", f"{ratio:.3f}x")
            for variant, mode, est, ratio in gpu_rows(list(VARIANTS), depth, batch, world_size=args.nproc)]
    print(f"estimated peak memory per rank, GiB: D={depth}, device batch {batch}, T=2048, {args.nproc} ranks, bf16 "
          f"under CUDA's autocast rules of torch {torch.__version__.split('+')[0]} (nanochat/planning/memory.py)")
    print(text_table(("variant", "mode", "params", "optimizer", "step", "peak", "with margin", "vs residual"), rows))
    print("step: activations saved for the backward, the head's logits, the transient at the start of the "
          "backward and the gradients; peak: what max_memory_allocated would show. Goal on a GPU: KromHC <= 1.15x "
          "residual, compiled.")


def print_memory_check():
    from nanochat.planning.memory_check import COMPILED_TOLERANCE, EAGER_TOLERANCE, check_rows, outside_tolerance
    rows = check_rows()
    print("estimate vs the measured peak of a real fp32 CPU step (live tensor bytes above the parameters, KiB); "
          "width 64, vocab 512:")
    print(text_table(("case", "mode", "size", "estimate", "measured", "error"),
                     [(c, m, size, f"{e / 1024:.0f}", f"{r / 1024:.0f}", f"{err:+.1%}")
                      for c, m, size, e, r, err in rows]))
    bad = outside_tolerance(rows)
    print(f"{len(rows) - len(bad)} of {len(rows)} within the tolerance ({EAGER_TOLERANCE:.0%} eager, "
          f"{COMPILED_TOLERANCE:.0%} compiled)")
    if bad:
        raise SystemExit(f"error: {len(bad)} estimate(s) outside the tolerance: "
                         + ", ".join(f"{c} {m} {s}" for c, m, s, *_ in bad))


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m scripts.hc_report", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--params", action="store_true", help="parameter tables beside the paper's")
    mode.add_argument("--checkpoint", metavar="RUN_DIR", help="run directory (or model tag) to diagnose")
    mode.add_argument("--memory", action="store_true", help="estimated GPU memory per rank of every variant")
    mode.add_argument("--memory-check", action="store_true", help="the memory estimate against real CPU steps")
    parser.add_argument("--depth", type=positive_int(), default=None,
                        help="--params: also tabulate this depth; --memory: the depth (default 12)")
    parser.add_argument("--streams", type=positive_int(), default=None, help="--params: ... and this n (default 4)")
    parser.add_argument("--factors", type=int_at_least(2), nargs="+", default=None, help="--params: KromHC factors")
    parser.add_argument("--width", type=positive_int(), default=None,
                        help="--params: model width C (default from depth)")
    parser.add_argument("--step", type=nonneg_int(), default=None, help="--checkpoint: step (default: latest complete)")
    parser.add_argument("--batch-size", type=positive_int(), default=None,
                        help="--checkpoint: rows of tokens (default 4); --memory: device batch (default 32)")
    parser.add_argument("--nproc", type=positive_int(), default=8, help="--memory: ranks (default 8)")
    parser.add_argument("--seq-len", type=positive_int(), default=None,
                        help="--checkpoint: tokens per row (default: model's)")
    parser.add_argument("--random-tokens", action="store_true", help="--checkpoint: random ids instead of val data")
    parser.add_argument("--seed", type=nonneg_int(), default=0, help="--random-tokens seed")
    parser.add_argument("--device-type", type=choice("", "cuda", "cpu", "mps"), default="",
                        help="cuda|cpu|mps (default: autodetect)")
    parser.add_argument("--data-dir", type=existing_dir, default=None,
                        help="shard directory (default $NANOCHAT_BASE_DIR/base_data)")
    parser.add_argument("--tokenizer-dir", type=existing_dir, default=None, help="default the run's (its corpus's: $NANOCHAT_BASE_DIR/tokenizer or tokenizer_climbmix)")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.params:
        print_params(args)
    elif args.memory:
        args.batch_size = args.batch_size or 32
        print_memory(args)
    elif args.memory_check:
        print_memory_check()
    else:
        args.batch_size = args.batch_size or 4
        report_checkpoint(args)


if __name__ == "__main__":
    run(main)
