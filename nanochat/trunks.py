"""The two trunks a run can train on (`--trunk`, docs/trunks.md), one frozen `Recipe` each.

2026-01  nanochat at 4d8dbaf (2026-01-30), the KromHC paper's trunk, held bitwise to it: the
         default, and what every checkpoint written before the field existed ran.
2026-07  nanochat at 92d63d4 (2026-07-03), its pretraining recipe as a whole: smear, backout,
         per-layer scalar inits, q/k scale 1.2, RoPE base 100,000, quarter-context short
         windows, the value-embedding gate 3 sigma(.) over 12 channels, new inits, dtype
         management without autocast, MuonEq and Muon+, new AdamW groups, the schedules
         (warmup 40 steps, warmdown 65 % to 0.05, momentum 0.85 -> 0.97 -> 0.90, cosine Muon
         weight decay), the automatic total batch size with the LR and weight-decay scaling
         that follows it, data:param 12 and ClimbMix.

A record holds every value the code switches on by trunk; its readers look it up by name with
`recipe(trunk)` and never compare trunk names: the model (nanochat/gpt.py, GPTConfig.recipe),
the residual row's starts (connections/residual.py), the optimizer's options (nanochat/optim.py
`trunk_options`), the schedules (scripts/base_train.py) and the flag defaults
(nanochat/train_config.py). A third recipe is one more record in RECIPES. This module also
holds 2026-07's batch and weight-decay rules, which its records name.
"""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    """One trunk: every value the code switches on by trunk, each field named for what it sets.
    Its tables (dicts, so that a model holding its record deep-copies) are read, never written:
    a reader merges or copies them."""
    name: str  # the --trunk value
    title: str  # the report's heading for its runs
    summary: str  # the model card's line
    # The model (nanochat/gpt.py).
    autocast: bool  # True: forward under autocast, nn.Linear, embedding tables bf16 on CUDA; False: the
    #                 casting gpt.Linear, activations and tables in the compute dtype (92d63d4)
    smear_backout: bool  # the smear of the embedding and the backout before the final norm
    qk_scale: float  # q and k are multiplied by this after their norm
    rope_base: float
    ve_gate_channels: int  # the value-embedding gate reads this many channels of the input
    ve_gate_scale: float  # gate = scale * sigmoid(W x[..., :channels])
    short_window_divisor: int  # a short window is T // divisor,
    short_window_tile: int | None  # or, with a tile, T / divisor rounded up to a multiple of it
    # The init (GPT.init_weights; the draws that differ).
    wte_std: float  # wte ~ N(0, std)
    c_fc_bound: float  # c_fc ~ U(+-bound sqrt(3/C)), this times the other matrices' bound
    ve_gate_init: tuple | None  # the value gates' W ~ U(low, high); None: zero (no draw)
    # The residual row's scalars at block i of L, d = i/(L-1): l_resid = a - b d, l_x0 = c - e d
    # as ((a, b), (c, e)), and l_resid's AdamW weight decay (connections/residual.py).
    residual_starts: tuple
    resid_weight_decay: float
    # The optimizer (nanochat/optim.py, GPT.param_groups).
    optimizer_options: dict  # {"adamw": options, "muon": options} merged into every group
    adamw_groups: dict  # {group name: its betas, weight decay}; a group not named takes
    #                     param_groups' adam_betas and no decay
    value_embed_lr: float  # the value embeddings' LR as a fraction of the embedding LR
    # The run (scripts/base_train.py, nanochat/train_config.py).
    muon_momentum: tuple  # (start, peak, steps to peak, end over the LR warmdown or None: held)
    muon_decay: str  # Muon's weight decay over the run: "linear" or "cosine" to 0
    weight_decay_scaling: str  # "depth": wd (12/depth)^2; "horizon": scaled_weight_decay's 2026-07 rule
    batch_refill: bool  # the loader packs rows as 92d63d4's does (a tokenizer batch per refill)
    # The flags whose defaults differ by trunk: nanochat 4d8dbaf's (with the paper's values where
    # the paper differs) and nanochat 92d63d4's (scripts/base_train.py there). A flag the user
    # gives, on the command line or in the TOML, wins over both.
    flag_defaults: dict


RECIPES = {r.name: r for r in (
    Recipe(
        name="2026-01", title="nanochat 4d8dbaf, the paper's", summary="nanochat 4d8dbaf, the KromHC paper's",
        autocast=True, smear_backout=False, qk_scale=1.0, rope_base=10000.0, ve_gate_channels=32,
        ve_gate_scale=2.0, short_window_divisor=2, short_window_tile=None,
        wte_std=1.0, c_fc_bound=1.0, ve_gate_init=None,  # gate = 1 at init
        residual_starts=((1.0, 0.0), (0.0, 0.0)), resid_weight_decay=0.0,
        optimizer_options=dict(adamw=dict(), muon=dict()), adamw_groups=dict(), value_embed_lr=1.0,
        muon_momentum=(0.85, 0.95, 300, None), muon_decay="linear", weight_decay_scaling="depth",
        batch_refill=False,
        flag_defaults=dict(corpus="fineweb-edu", target_param_data_ratio=10.5, total_batch_size=524288,
                           unembedding_lr=0.004, weight_decay=0.2, warmup_steps=0, warmdown_ratio=0.4,
                           final_lr_frac=0.0, x0_beta1=0.8, eval_tokens=20 * 524288)),
    Recipe(
        name="2026-07", title="nanochat 92d63d4's recipe", summary="nanochat 92d63d4: smear, backout, ...",
        autocast=False, smear_backout=True, qk_scale=1.2, rope_base=100000.0, ve_gate_channels=12,
        ve_gate_scale=3.0, short_window_divisor=4, short_window_tile=128,  # FlashAttention-3's tile
        wte_std=0.8, c_fc_bound=0.4, ve_gate_init=(0.0, 0.02),  # slightly above neutral
        residual_starts=((1.15, 0.10), (0.20, 0.15)), resid_weight_decay=0.05,
        # nanochat 92d63d4's step (nanochat/optim.py there: MuonEq lines 138-141, the 1.01 norm
        # factor line 144, Muon+ lines 158-161; Muon's beta2 0.9 and the groups in gpt.py
        # setup_optimizer)
        optimizer_options=dict(adamw=dict(nanochat_order=True),
                               muon=dict(muoneq=True, muon_plus=True, polar_norm_factor=1.01, beta2=0.9,
                                         nanochat_order=True)),
        adamw_groups=dict(lm_head=dict(betas=(0.8, 0.96), weight_decay=0.01),
                          wte=dict(betas=(0.8, 0.995), weight_decay=0.001),
                          value_embeds=dict(betas=(0.8, 0.995), weight_decay=0.01)),
        value_embed_lr=0.5,
        muon_momentum=(0.85, 0.97, 400, 0.90), muon_decay="cosine", weight_decay_scaling="horizon",
        batch_refill=True,
        flag_defaults=dict(corpus="climbmix", target_param_data_ratio=12.0, total_batch_size="auto",
                           unembedding_lr=0.008, weight_decay=0.28, warmup_steps=40, warmdown_ratio=0.65,
                           final_lr_frac=0.05, x0_beta1=0.96, eval_tokens=80 * 524288)),
)}
TRUNKS = tuple(RECIPES)
DEFAULT = "2026-01"
# Views of one field of every record, for readers that want it by name.
TITLES = {name: r.title for name, r in RECIPES.items()}
FLAG_DEFAULTS = {name: r.flag_defaults for name, r in RECIPES.items()}

# 2026-07's reference point, where its hyperparameters were tuned: depth 12 at data:param
# ratio `target_param_data_ratio` and a total batch of 2^19 tokens (92d63d4 base_train.py).
REFERENCE_DEPTH = 12
REFERENCE_BATCH = 2 ** 19
# The optimal batch grows as the token horizon to this power (Power Lines, arXiv 2505.13738,
# the exponent 92d63d4 uses).
BATCH_EXPONENT = 0.383


def tag(trunk):
    """A trunk in run tags and the report's file names, one spelling for both: 2026-07 -> t2607
    (a YYYY-MM name this version does not know, an old or newer run's, the same way)."""
    year, _, month = trunk.partition("-")
    return f"t{year[2:]}{month}"


def tag_suffix(trunk):
    """The model-tag suffix of a run moved to another trunk than its config's (speedrun's TRUNK):
    2026-07 -> _t2607, so that both trunks' runs share a base directory."""
    return f"_{tag(check(trunk))}"


def check(trunk):
    """The trunk name, or ValueError naming the choices."""
    if trunk not in RECIPES:
        raise ValueError(f"trunk={trunk!r}; choose one of {', '.join(RECIPES)}")
    return trunk


def recipe(trunk):
    """The trunk's record, or ValueError naming the choices."""
    return RECIPES[check(trunk)]


def auto_total_batch(target_tokens, reference_tokens):
    """2026-07's automatic total batch: 2^19 tokens at the reference horizon, scaled by this
    run's horizon over it to the power 0.383, rounded to a power of two (92d63d4's expression:
    the horizons as train_config.horizon_tokens gives them)."""
    return 2 ** round(math.log2(REFERENCE_BATCH * (target_tokens / reference_tokens) ** BATCH_EXPONENT))


def batch_lr_scale(total_batch):
    """Both trunks scale every learning rate by sqrt(B / 2^19) (AdamW's rule, applied to Muon too)."""
    return (total_batch / REFERENCE_BATCH) ** 0.5


def scaled_weight_decay(trunk, weight_decay, depth, total_batch, horizons=None):
    """The Muon weight decay in force, by the recipe's `weight_decay_scaling`. "depth" (2026-01):
    wd (12/depth)^2. "horizon" (2026-07): keep B/(lr wd D) constant (arXiv 2405.13698) with
    lr ~ sqrt(B): wd sqrt(B/2^19) (D_12/D), in 92d63d4's order of operations (its base_train.py:
    `weight_decay * math.sqrt(total_batch_size / B_REF) * (D_REF / target_tokens)`), `horizons`
    = (target_tokens, D_REF) as train_config.horizon_tokens gives them. Another order (dividing
    by D/D_12) is 1 ulp off at depth 20."""
    if recipe(trunk).weight_decay_scaling == "depth":
        return weight_decay * (REFERENCE_DEPTH / depth) ** 2
    target_tokens, reference_tokens = horizons
    return weight_decay * math.sqrt(total_batch / REFERENCE_BATCH) * (reference_tokens / target_tokens)
