"""The two trunks a run can train on (`--trunk`, docs/trunks.md).

2026-01  nanochat at 4d8dbaf (2026-01-30), the KromHC paper's trunk, held bitwise to it: the
         default, and what every checkpoint written before the field existed ran.
2026-07  nanochat at 92d63d4 (2026-07-03), its pretraining recipe as a whole: smear, backout,
         per-layer scalar inits, q/k scale 1.2, RoPE base 100,000, quarter-context short
         windows, the value-embedding gate 3 sigma(.) over 12 channels, new inits, dtype
         management without autocast, MuonEq and Muon+, new AdamW groups, the schedules
         (warmup 40 steps, warmdown 65 % to 0.05, momentum 0.85 -> 0.97 -> 0.90, cosine Muon
         weight decay), the automatic total batch size with the LR and weight-decay scaling
         that follows it, data:param 12 and ClimbMix.

The model's differences live in nanochat/gpt.py (GPTConfig.trunk), the optimizer's in
nanochat/optim.py (`trunk_options`: MuonEq, Muon+, Polar Express's 1.01 norm factor, beta2 0.9
and nanochat's order of operations), the schedules in
scripts/base_train.py. This module holds what both sides read: the names, the flags whose
defaults differ by trunk, and the batch and weight-decay rules of 2026-07.
"""

import math

TRUNKS = ("2026-01", "2026-07")
DEFAULT = "2026-01"
MODERN = "2026-07"
TITLES = {"2026-01": "nanochat 4d8dbaf, the paper's", "2026-07": "nanochat 92d63d4's recipe"}

# The flags whose defaults differ by trunk: nanochat 4d8dbaf's (with the paper's values where
# the paper differs) and nanochat 92d63d4's (scripts/base_train.py there). A flag the user
# gives, on the command line or in the TOML, wins over both.
FLAG_DEFAULTS = {
    "2026-01": dict(corpus="fineweb-edu", target_param_data_ratio=10.5, total_batch_size=524288,
                    unembedding_lr=0.004, weight_decay=0.2, warmup_steps=0, warmdown_ratio=0.4,
                    final_lr_frac=0.0, x0_beta1=0.8, eval_tokens=20 * 524288),
    "2026-07": dict(corpus="climbmix", target_param_data_ratio=12.0, total_batch_size="auto",
                    unembedding_lr=0.008, weight_decay=0.28, warmup_steps=40, warmdown_ratio=0.65,
                    final_lr_frac=0.05, x0_beta1=0.96, eval_tokens=80 * 524288),
}

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
    if trunk not in TRUNKS:
        raise ValueError(f"trunk={trunk!r}; choose one of {', '.join(TRUNKS)}")
    return trunk


def auto_total_batch(target_tokens, reference_tokens):
    """2026-07's automatic total batch: 2^19 tokens at the reference horizon, scaled by this
    run's horizon over it to the power 0.383, rounded to a power of two (92d63d4's expression:
    the horizons as train_config.horizon_tokens gives them)."""
    return 2 ** round(math.log2(REFERENCE_BATCH * (target_tokens / reference_tokens) ** BATCH_EXPONENT))


def batch_lr_scale(total_batch):
    """Both trunks scale every learning rate by sqrt(B / 2^19) (AdamW's rule, applied to Muon too)."""
    return (total_batch / REFERENCE_BATCH) ** 0.5


def scaled_weight_decay(trunk, weight_decay, depth, total_batch, horizons=None):
    """The Muon weight decay in force. 2026-01: wd (12/depth)^2. 2026-07: keep B/(lr wd D)
    constant (arXiv 2405.13698) with lr ~ sqrt(B): wd sqrt(B/2^19) (D_12/D), in 92d63d4's
    order of operations (its base_train.py: `weight_decay * math.sqrt(total_batch_size / B_REF)
    * (D_REF / target_tokens)`), `horizons` = (target_tokens, D_REF) as
    train_config.horizon_tokens gives them. Another order (dividing by D/D_12) is 1 ulp off at
    depth 20."""
    if trunk == DEFAULT:
        return weight_decay * (REFERENCE_DEPTH / depth) ** 2
    target_tokens, reference_tokens = horizons
    return weight_decay * math.sqrt(total_batch / REFERENCE_BATCH) * (reference_tokens / target_tokens)
