#!/usr/bin/env bash
# Reproduce the KromHC paper's experiments end to end, or run the offline CPU demo.
#
#   bash speedrun.sh cpu          # offline demo: every variant, tiny models, minutes on 2 CPU cores
#   bash speedrun.sh paper-d6     # Table 2/3/4, D=6  (5 runs x 2500 steps)
#   bash speedrun.sh paper-d12    # Table 2/3/4, D=12 (5 runs x 7000 steps)
#   bash speedrun.sh n-scaling    # KromHC at n = 4, 8, 16 (D=12)
#   bash speedrun.sh ablations    # factorization, shared alpha, identity H_res (D=12)
#   bash speedrun.sh frontier     # beyond the paper (D=12): the HC options and every later wiring
#                                 # (configs/frontier/), and the runs they are compared against
#                                 # (each wiring's SPEC baseline; skipped when done)
#   bash speedrun.sh all          # every GPU mode above
#   bash speedrun.sh ladder       # what a connection is worth: every variant of VARIANTS at every
#                                 # depth of LADDER_DEPTHS, ratio-sized horizons, then scripts.compare
#   bash speedrun.sh isoflop      # the budget x depth grid (FLOPS_BUDGETS x LADDER_DEPTHS), then
#                                 # the compute-optimal frontier per variant (scripts.isoflop)
#   bash speedrun.sh gpt2         # nanochat's GPT-2 record run on the 2026-07 trunk (d24, data:param 8,
#                                 # fp8) for residual and KromHC (configs/gpt2/), on ClimbMix
#   bash speedrun.sh MODE --dry-run   # (or PLAN_ONLY=1) print the plan and its GPU-hours, train nothing
#
# The ladder and the grid (docs/compute_multiplier.md, "The ladder and the iso-FLOP grid"): VARIANTS (default
# residual,mhc,mhc_lite,kromhc; names of configs/paper/d12_<name>.toml, whose hyper-parameters the
# runs keep, or TOML paths), LADDER_DEPTHS (default "6 8 10 12 14 16": the paper's D=6 and D=12
# and four more), LADDER_RATIO (default 20 tokens per scaling parameter), FLOPS_BUDGETS (default
# "2e17 6e17 2e18"). Their plan prices a run from its own or its relatives' measurements (the
# same wiring at another depth, its family's members: marked ≈) and, where none was measured, at
# an assumed MFU (PLAN_MFU, default 0.4) of the peak of the GPU nvidia-smi names (PLAN_GPU
# overrides it, e.g. PLAN_GPU=H200 to plan a node from a login machine); the arithmetic of the
# defaults is in docs/compute_multiplier.md. On GPUs every mode's plan also shows each run's
# estimated peak memory per rank and its device batch (base_train --device-batch-size auto;
# PLAN_MEMORY=0 skips the estimates).
#
# Trunks (docs/trunks.md): every mode but gpt2 trains on the 2026-01 trunk (the paper's) as its
# configs say. TRUNK=2026-07 moves the ladder's, the iso-FLOP grid's and the frontier's runs to
# the 2026-07 trunk: --trunk 2026-07 and that trunk's defaults for every flag whose default
# differs by trunk (its automatic batch, schedules, ClimbMix), the frontier's horizon its
# data:param ratio (the ladder keeps its ratio, the grid its budgets), each run's tag with the
# suffix _t2607, so that both trunks' runs live in one base dir. The report, scripts.compare
# and scripts.isoflop read each trunk's runs apart. gpt2 downloads the ClimbMix shards its plan needs
# and trains its tokenizer on them (tokenizer_climbmix beside tokenizer).
#
# Environment: NPROC (processes per node; default: every visible GPU), SEEDS (seeds per config,
# default 1: seed 0 is the config as written, seed s > 0 the run <model_tag>_s<s> with init seed
# seed + s), VARY_DATA_ORDER=1 (seeds > 0 also shuffle the data order: <model_tag>_s<s>_data),
# WANDB_RUN (wandb run-name prefix; default: no wandb), NANOCHAT_BASE_DIR (data, tokenizer,
# runs; default ~/.cache/nanochat; the cpu demo keeps its own files under <base>/cpu-demo so its
# offline corpus and small tokenizer never mix with real data), NANOCHAT_EVAL_BUNDLE (a local
# CORE bundle instead of downloading it), LM_EVAL=1 (after CORE, each run is also evaluated on
# lm-evaluation-harness tasks, scripts.lm_eval's default list or LM_EVAL_TASKS=a,b,...; their
# data comes from the Hugging Face Hub: without network speedrun says so and goes on without
# them). Before training it prints the runs, their steps and
# tokens and the estimated GPU-hours (scripts.plan). Finished runs are skipped, interrupted ones
# resume; a run that fails (its log line in the report) does not stop the others, and the script
# then exits non-zero. SIGTERM or SIGUSR1 (preemption) makes the run in training save a
# checkpoint (torchrun gives its workers SHUTDOWN_TIMEOUT seconds, default 300); the script then
# exits with status 75, and run again it continues (docs/cluster.md). For several
# nodes, run train steps yourself with torchrun --nnodes (see docs/cluster.md).
set -euo pipefail
cd "$(dirname "$0")"

MODE="${1:-}"
USAGE="usage: bash speedrun.sh {cpu|paper-d6|paper-d12|n-scaling|ablations|frontier|all|ladder|isoflop|gpt2} [--dry-run]"
case "$MODE" in
    cpu|paper-d6|paper-d12|n-scaling|ablations|frontier|all|ladder|isoflop|gpt2) ;;
    *) echo "$USAGE" >&2; exit 2 ;;
esac
TRUNK="${TRUNK:-2026-01}"
case "$MODE:$TRUNK" in
    *:2026-01|ladder:2026-07|isoflop:2026-07|frontier:2026-07) ;;
    *:2026-07) echo "speedrun: error: TRUNK=$TRUNK applies to the ladder, isoflop and frontier modes only; unset it for $MODE" >&2
               exit 2 ;;
    *) echo "speedrun: error: unknown TRUNK '$TRUNK'; use 2026-01 (the default) or 2026-07 (nanochat/trunks.py)" >&2
       exit 2 ;;
esac
case "${2:-}" in
    "") ;;
    --dry-run) PLAN_ONLY=1 ;;
    *) echo "speedrun: error: unknown argument '$2'; $USAGE" >&2; exit 2 ;;
esac
PLAN_ONLY="${PLAN_ONLY:-0}"

bash scripts/setup_env.sh
source .venv/bin/activate
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
WANDB_RUN="${WANDB_RUN:-dummy}"
BASE="${NANOCHAT_BASE_DIR:-$HOME/.cache/nanochat}"

if [ "$MODE" = cpu ]; then
    export NANOCHAT_BASE_DIR="$BASE/cpu-demo"
    export OMP_NUM_THREADS="$(nproc)"  # one process: let it use every core
    NPROC=1
    CONFIGS=(configs/cpu/*.toml)
    SHARDS=2
    TOK_ARGS=(--vocab-size 4096 --max-chars 20000000)
    EVAL_ARGS=(--max-per-task 16 --tasks available --split-tokens 65536 --device-batch-size 8)
    LM_EVAL_ARGS=(--limit 50)  # tiny models on a CPU: a check that it runs, not a measurement
else
    export NANOCHAT_BASE_DIR="$BASE"
    if [ -z "${NPROC:-}" ]; then
        NPROC=$(nvidia-smi -L 2>/dev/null | wc -l || true)
        [ "$NPROC" -gt 0 ] || { echo "speedrun: no GPU found; set NPROC or use 'bash speedrun.sh cpu'" >&2; exit 1; }
    fi
    case "$MODE" in
        paper-d6)  CONFIGS=(configs/paper/d6_*.toml) ;;
        paper-d12) CONFIGS=(configs/paper/d12_*.toml) ;;
        n-scaling) CONFIGS=(configs/n_scaling/*.toml) ;;
        ablations) CONFIGS=(configs/ablations/*.toml) ;;
        frontier)  CONFIGS=(configs/frontier/*.toml)
                   # then the runs the report reads them against, from the registry (each wiring's
                   # SPEC baseline, an option's variant as the paper configures it, residual)
                   BASELINES=$(python -m scripts.plan --baselines-of "${CONFIGS[@]}")
                   # shellcheck disable=SC2206  # one config path a word
                   CONFIGS+=($BASELINES) ;;
        all)       CONFIGS=(configs/paper/*.toml configs/n_scaling/*.toml configs/ablations/*.toml
                            configs/frontier/*.toml) ;;
        ladder|isoflop) CONFIGS=() ;;  # derived runs: study_plan_args below
        gpt2)      CONFIGS=(configs/gpt2/d24_residual.toml configs/gpt2/d24_kromhc.toml) ;;
    esac
    # About 34M usable tokens per shard at T=2048 (nanochat's estimate): D=12 x 7000 steps x
    # 524,288 tokens needs ~108 shards, D=6 x 2500 steps ~39. A margin on top. The ladder, the
    # grid, gpt2 and the runs of another TRUNK ask the plan (their longest run decides).
    if [ "$MODE" = paper-d6 ]; then SHARDS=45; else SHARDS=120; fi
    TOK_ARGS=()
    EVAL_ARGS=()
    LM_EVAL_ARGS=()
fi
[ -n "${LM_EVAL_TASKS:-}" ] && LM_EVAL_ARGS+=(--tasks "$LM_EVAL_TASKS")
mkdir -p "$NANOCHAT_BASE_DIR"
echo "speedrun: mode $MODE, $NPROC process(es), base dir $NANOCHAT_BASE_DIR"

# ---- the plan: every run of the mode and its cost, before anything is spent
source scripts/speedrun_lib.sh
PLAN_ARGS=(--seeds "${SEEDS:-1}" --nproc "$NPROC" --runs-root "$NANOCHAT_BASE_DIR/runs"
           --gpu-check "$NANOCHAT_BASE_DIR/gpu_check.json" --trunk "$TRUNK")
[ "${#CONFIGS[@]}" -eq 0 ] || PLAN_ARGS+=(--configs "${CONFIGS[@]}")
[ "${VARY_DATA_ORDER:-0}" = 1 ] && PLAN_ARGS+=(--vary-data-order)
VARIANTS="${VARIANTS:-residual,mhc,mhc_lite,kromhc}"
LADDER_DEPTHS="${LADDER_DEPTHS:-6 8 10 12 14 16}"
LADDER_RATIO="${LADDER_RATIO:-20}"
FLOPS_BUDGETS="${FLOPS_BUDGETS:-2e17 6e17 2e18}"
case "$MODE" in
    ladder|isoflop) study_plan_args "$MODE" ;;
    # The demo's ladder: the residual baseline and KromHC at depths 2 and 3 beside the depth-4 runs
    # above, at their data ratio: 120 steps x 1024 tokens / 1,310,976 scaling params at depth 4 =
    # 0.09373, so 0.09375 gives the depth-4 runs' 120 steps and depths 2 and 3 33 and 66 steps.
    # Training only (the CM reads final val bpb). Each run's whole process timed alone on 2 free
    # cores: depth 2 5.6 s (residual) and 6.3 s (KromHC), depth 3 9.6 s and 11.4 s; 33 s in all,
    # beside 19 s for one depth-4 run (training only) measured the same way.
    cpu) PLAN_ARGS+=(--ladder configs/cpu/residual.toml configs/cpu/kromhc.toml --depths 2 3 --ratio 0.09375
                     --ladder-prefix cpu_ladder --train-only) ;;
esac
if [ "$MODE" = cpu ]; then
    UNIT=CPU
else
    UNIT=GPU
    GPU_NAME="${PLAN_GPU:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)}"
    PLAN_ARGS+=(--gpu-name "$GPU_NAME" --mfu "${PLAN_MFU:-0.4}")
    # Each run's peak memory per rank and the device batch base_train's auto will choose on that
    # GPU (a run that fits at no batch stops the mode here); PLAN_MEMORY=0 skips the estimates.
    [ "${PLAN_MEMORY:-1}" = 0 ] || PLAN_ARGS+=(--memory --auto-batch)
fi
PLAN_FILE="$NANOCHAT_BASE_DIR/speedrun_$MODE.tsv"
python -m scripts.plan "${PLAN_ARGS[@]}" --unit "$UNIT" --tsv "$PLAN_FILE"
if [ "$PLAN_ONLY" = 1 ]; then
    echo "speedrun: plan only (PLAN_ONLY=1 or --dry-run); the run list is $PLAN_FILE"
    exit 0
fi
CORPUS=fineweb-edu
if [ "$MODE" != cpu ]; then
    CORPUS=$(python -m scripts.plan "${PLAN_ARGS[@]}" --corpus)
    case "$MODE:$CORPUS" in
        ladder:*|isoflop:*|gpt2:*|*:climbmix) SHARDS=$(python -m scripts.plan "${PLAN_ARGS[@]}" --shards) ;;
    esac
fi
DIRS=$(corpus_dirs "$CORPUS")
DATA_DIR=${DIRS%%$'\n'*}
TOK_DIR=${DIRS#*$'\n'}

# ---- data: the first shards now (the tokenizer trains on them), the rest in the background;
# the val shard always comes with them
if [ "$MODE" = cpu ]; then
    python -m nanochat.dataset --offline-fallback -n "$SHARDS"
else
    python -m nanochat.dataset --corpus "$CORPUS" -n 8
    python -m nanochat.dataset --corpus "$CORPUS" -n "$SHARDS" &
    DOWNLOAD_PID=$!
fi

# ---- tokenizer, once per corpus
if [ ! -f "$TOK_DIR/token_bytes.pt" ]; then
    python -m scripts.tok_train --corpus "$CORPUS" "${TOK_ARGS[@]}"
    python -m scripts.tok_eval --tokenizer-dir "$TOK_DIR" --data-dir "$DATA_DIR"
fi
if [ -n "${DOWNLOAD_PID:-}" ]; then
    echo "speedrun: waiting for the shard download to finish"
    wait "$DOWNLOAD_PID"
fi

# ---- CORE bundle: local, downloaded, or (cpu demo only) skipped when unreachable
CORE=1
if [ -n "${NANOCHAT_EVAL_BUNDLE:-}" ]; then
    echo "speedrun: CORE bundle from $NANOCHAT_EVAL_BUNDLE"
elif ! python - <<'PY'
import sys
from nanochat.core_eval import resolve_eval_bundle
try:
    resolve_eval_bundle()
except (ConnectionError, OSError, ValueError) as e:
    print(f"speedrun: {e}")
    sys.exit(1)
PY
then
    if [ "$MODE" = cpu ]; then
        echo "speedrun: the CORE bundle could not be downloaded; the cpu demo continues without CORE"
        echo "          (set NANOCHAT_EVAL_BUNDLE=/path/to/eval_bundle to include it)"
        CORE=0
    else
        echo "speedrun: the CORE bundle is needed for the paper's tables; set NANOCHAT_EVAL_BUNDLE or fix the network" >&2
        exit 1
    fi
fi

# ---- train, evaluate and diagnose every run of the plan (scripts/speedrun_lib.sh)
lm_eval_ready
TRAIN_ARGS=()
[ "$CORE" = 1 ] || TRAIN_ARGS=(--core-metric-every -1)
# On GPUs each run's device batch is the largest that fits (docs/memory.md, "Will it fit?").
[ "$MODE" = cpu ] || TRAIN_ARGS+=(--device-batch-size auto)
EVALS="bpb,sample"
[ "$CORE" = 1 ] && EVALS="core,$EVALS"
status=0
run_all "$PLAN_FILE" || status=$?  # the failures are listed below, after the report
# Preempted: the machine is going away, so no report; run_all said how to continue.
[ "$status" -ne "$PREEMPTED_EXIT" ] || exit "$PREEMPTED_EXIT"

# ---- inference cost per connection, for the report's Cost section. The cpu demo measures it
# eagerly at its own size (about 5 s of CPU; compiling would cost minutes); elsewhere the
# section names the command (scripts.bench --bench infer, or gpu_check's infer section).
REPORT_ARGS=(--runs "${RUN_DIRS[@]}")
# The configs place runs not found yet in their rows, by their model tags; runs moved to another
# TRUNK train under other tags, so the report reads those from their directories alone.
[ "${#CONFIGS[@]}" -eq 0 ] || [ "$TRUNK" != 2026-01 ] || REPORT_ARGS+=(--configs "${CONFIGS[@]}")
if [ "$MODE" = cpu ] && python -m scripts.bench --bench infer --variants residual hc hc_identity mhc mhc_lite kromhc \
        --depth 4 --aspect-ratio 32 --head-dim 32 --vocab-size 4096 --window-pattern L --prefill-lens 128 \
        --infer-batches 1 --prompt-len 96 --new-tokens 32 --modes eager --warmup 1 --reps 3 \
        --out "$NANOCHAT_BASE_DIR/infer_bench.json" > "$NANOCHAT_BASE_DIR/infer_bench.log" 2>&1; then
    REPORT_ARGS+=(--infer-bench "$NANOCHAT_BASE_DIR/infer_bench.json")
fi

# ---- the report: tables and figures beside the paper's numbers
python -m scripts.report "${REPORT_ARGS[@]}" --out report
# ---- what a connection is worth: the compute multipliers over the mode's ladder, the frontier
study_report "$MODE" || FAILED+=("the $MODE study's summary (its error line above)")
if [ "${#FAILED[@]}" -gt 0 ]; then
    echo "speedrun: report/README.md written; ${#FAILED[@]} run(s) failed (logs in $NANOCHAT_BASE_DIR/logs):" >&2
    printf '  %s\n' "${FAILED[@]}" >&2
    exit 1
fi
echo "speedrun: done; see report/README.md"
