"""The report's "Published elsewhere" table: the wirings beyond the HC family as another harness
measured them, beside our runs of the same wirings.

The numbers are those of hyper-connection-factory (github.com/wdlctc/hyper-connection-factory,
`results/scaling_gpu/scaling.md` at commit cb51c55 for the S to XL ladder, its README's table
for the laptop-scale runs): the validation loss of each wiring minus its pre-norm baseline's,
in nats per token. Another recipe throughout: a Llama-style body (SwiGLU, affine RMSNorm, tied
embeddings, no value embeddings), AdamW with a warmup-stable-decay schedule, the GPT-2
tokenizer, about 20 tokens per parameter. Ours, beside them: each run's train loss minus that
of our pre-norm run (`--hc prenorm`) of the same depth, smoothed, first seeds, nanochat's
recipe. Only the sign and the order are comparable, not the values."""

from nanochat.report.format import MISSING, md_table, signed
from nanochat.report.runs import method_label, train_loss
from nanochat.report.tables import row_runs

# The factory's model sizes (parameters) and its pre-norm baseline's validation loss at each.
SIZES = ("tiny 9.6M", "S 38.5M", "M 85.0M", "L 303.6M", "XL 1214M")
PRENORM_LOSS = (5.3204, 3.4439, 3.1993, 2.8405, 2.4751)
DIVERGED = "diverged"

# (factory name, our wiring: a predicate on a run, Δ val loss vs pre-norm per size of SIZES;
# None where the factory has no run). The tiny runs: MPS fp32, one seed unless the factory says.
ROWS = (
    ("muddformer", lambda r: r.variant == "muddformer" and not r._get("mudd_prepost_norm", False),
     (-0.1964, -0.1115, -0.0698, DIVERGED, None)),
    ("muddformer-ppn", lambda r: r.variant == "muddformer" and bool(r._get("mudd_prepost_norm", False)),
     (None, None, -0.0650, -0.0710, -0.0605)),
    ("mhc-n4", lambda r: r.variant == "mhc" and r.n == 4 and not r.options, (0.0347, -0.0621, -0.0495, -0.0396, -0.0287)),
    ("hc-dynamic-n4", lambda r: r.variant == "hc" and r.n == 4 and not r.options, (None, -0.0699, -0.0457, -0.0360, None)),
    ("mhar-h4", lambda r: r.variant == "mhar", (-0.0631, -0.0426, -0.0292, -0.0378, None)),
    ("attnres-full", lambda r: r.variant == "attnres" and r._get("attnres_block_size") == 1,
     (None, -0.0407, -0.0130, -0.0318, None)),
    ("attnres-block", lambda r: r.variant == "attnres" and r._get("attnres_block_size") != 1,
     (-0.0158, None, None, None, None)),
    ("frac-dynamic-m2", lambda r: r.variant == "frac" and r.n == 2, (None, -0.0245, -0.0150, -0.0014, None)),
    ("denseformer", lambda r: r.variant == "denseformer", (-0.0275, None, None, None, None)),
    ("laurel-rw-lr", lambda r: r.variant == "laurel" and r._get("laurel_form", "rw_lr") == "rw_lr",
     (-0.0198, None, None, None, None)),
    ("dar-block", lambda r: r.variant == "dar" and r._get("dar_source") == "block", (-0.0209, None, None, None, None)),
    ("dar", lambda r: r.variant == "dar" and r._get("dar_source", "full") == "full", (0.0204, None, None, None, None)),
)


def prenorm_reference(runs, depth):
    """Our pre-norm run of this depth with a train loss, or None."""
    found = [r for r in runs if r.found and r.variant == "prenorm" and r.depth == depth and train_loss(r) is not None]
    return sorted(found, key=lambda r: r.name)[0] if found else None


def ours(runs, matches):
    """'Method Dd: Δ' for each of our runs of the wiring, against our pre-norm run of its depth."""
    cells = []
    for r in sorted((r for r in runs if r.found and r.variant and matches(r)), key=lambda r: (r.depth or 0, r.name)):
        ref = prenorm_reference(runs, r.depth)
        loss = train_loss(r)
        delta = None if ref is None or loss is None else loss - train_loss(ref)
        cells.append(f"{method_label(r)} D{r.depth}: {signed(delta, '.4f')}")
    return "; ".join(cells) or MISSING


def published_table(runs, groups=None):
    """The factory's Δ val loss per wiring and size, and ours (module docstring)."""
    runs = row_runs(runs, groups)
    cell = lambda v: MISSING if v is None else (v if isinstance(v, str) else signed(v, ".4f"))
    rows = [(name, *map(cell, deltas), ours(runs, matches)) for name, matches, deltas in ROWS]
    header = ("factory wiring", *SIZES, "ours: Δ train loss vs our pre-norm")
    reference = ", ".join(f"{size} {loss:.4f}" for size, loss in zip(SIZES, PRENORM_LOSS))
    notes = [f"Published by hyper-connection-factory (commit cb51c55 and its README): Δ validation loss against its "
             f"pre-norm run of the same size ({reference}); tiny: MPS fp32, one seed. **Another recipe** (Llama-style "
             "body, AdamW with a warmup-stable-decay schedule, the GPT-2 tokenizer): only signs and order compare "
             "with ours. The factory's hc-static-n4 has no counterpart here. Ours train with `bash speedrun.sh "
             "frontier` (the pre-norm reference is `configs/frontier/d12_prenorm.toml`)."]
    return md_table(header, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes)
