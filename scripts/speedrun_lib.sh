# Functions of speedrun.sh that train and evaluate a mode's runs, one after another, so that
# one run's failure does not stop the others. Sourced by speedrun.sh (and by the tests).
#
# Reads: NANOCHAT_BASE_DIR, NPROC, WANDB_RUN, PLAN_ARGS (scripts.plan flags: configs, seeds,
# nproc), TRAIN_ARGS, EVALS and EVAL_ARGS (extra base_train / base_eval flags of the mode),
# LM_EVAL (1: lm-evaluation-harness after CORE) and LM_EVAL_ARGS (its scripts.lm_eval flags).
# Sets: RUN_DIRS (every run of the plan, for the report) and FAILED (run steps that failed).
# A run the plan marks `train` (the compute-multiplier ladder's and grid's extra points) is
# judged by the final val bpb its training logs: no evaluation, lm-eval or diagnostics after it.
#
# Preemption: a SIGTERM or SIGUSR1 to this shell (SLURM's --signal, Kubernetes, a spot
# instance's notice) is passed on to the step in flight; a training step finishes its step,
# saves a checkpoint and exits with PREEMPTED_EXIT (also when the signal reached only the
# training processes: their run directory then holds preempted.json). run_all then stops and
# returns PREEMPTED_EXIT, recording no failure; the same command run again skips the finished
# runs and resumes the interrupted one.

PREEMPTED_EXIT=75  # EX_TEMPFAIL, as nanochat/cluster/preempt.py's EXIT_PREEMPTED
PREEMPTED=         # the signal that asked this shell to stop
STEP_PID=          # the step in flight
SIGNALLED=         # a signal came while waiting for it

# launch -m MODULE ARGS...: python on one process, torchrun on NPROC. It replaces the shell it
# runs in (run_step starts it in a subshell), so that a signal run_step passes on reaches it.
launch() {
    if [ "$NPROC" -gt 1 ]; then
        # No flags that only some torch versions know: torchrun 2.9 rejects --signals-to-handle,
        # 2.11 --shutdown-timeout. pass_on signals the workers themselves, so torchrun's own
        # forwarding and grace period do not matter for a signal that comes through this script.
        # For one sent to torchrun directly (a process-group kill), the same settings through
        # the environment, which the versions that know them read and the others ignore:
        # forward SIGUSR1 too (PET_ stands for a torchrun flag) and give the workers
        # SHUTDOWN_TIMEOUT seconds to save (torchrun's default is 30). The `--` keeps torchrun's
        # parser off the module's flags (`--run` would abbreviate its --run-path).
        PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 \
        TORCH_ELASTIC_SHUTDOWN_TIMEOUT="${SHUTDOWN_TIMEOUT:-300}" \
            exec torchrun --standalone --nproc_per_node="$NPROC" "$1" "$2" -- "${@:3}"
    else
        exec python "$@"
    fi
}

# children_of PID: the pids of the processes PID started (torchrun's workers), read from each
# process's /proc/<pid>/stat (its 4th field, after the command name in parentheses), which
# every Linux kernel has; neither procps nor /proc/<pid>/task/*/children is always there.
children_of() {
    local parent=$1 stat line fields
    for stat in /proc/[0-9]*/stat; do
        { read -r line < "$stat"; } 2>/dev/null || continue  # gone since the glob
        read -r -a fields <<< "${line##*) }"                  # state, ppid, ...
        [ "${fields[1]}" = "$parent" ] && echo "${stat//[^0-9]/}"
    done
    return 0
}

# pass_on SIGNAL: remember the preemption and pass the signal on to the step in flight. Under
# torchrun it goes to the workers, which finish the step, save and exit 75 together (their
# checkpoint ends in an all-reduce); torchrun then stops on its own. Before the workers exist
# torchrun gets SIGTERM, which every version handles, and there is nothing to save yet.
pass_on() {
    PREEMPTED=$1 SIGNALLED=1
    [ -n "$STEP_PID" ] || return 0
    local workers=""
    [ "$NPROC" -gt 1 ] && workers=$(children_of "$STEP_PID")
    if [ -n "$workers" ]; then
        # shellcheck disable=SC2086  # one pid per word
        kill -s "$1" $workers 2>/dev/null || true
    elif [ "$NPROC" -gt 1 ]; then
        kill -s TERM "$STEP_PID" 2>/dev/null || true
    else
        kill -s "$1" "$STEP_PID" 2>/dev/null || true
    fi
}

# run_step STAGE RUN_DIR LOG COMMAND...: run COMMAND with its output shown and kept in LOG;
# on failure record failed.json in RUN_DIR (stage, exit status, the log line that says why);
# returns PREEMPTED_EXIT when a preemption stopped it.
run_step() {
    local stage=$1 run_dir=$2 log=$3 rc out tee_pid
    shift 3
    # The step runs in the background: bash runs a trap only once a foreground command ends,
    # and the signal must reach the step now. tee ignores the signals, so the log outlives them.
    exec {out}> >(trap '' TERM USR1; exec tee "$log")
    tee_pid=$!
    "$@" >&"$out" 2>&1 &
    STEP_PID=$!
    exec {out}>&-
    while :; do
        SIGNALLED= rc=0
        wait "$STEP_PID" || rc=$?
        [ -n "$SIGNALLED" ] || break  # else the trap cut the wait short: the step still runs
    done
    STEP_PID=
    wait "$tee_pid" || true  # the end of the log is written
    if [ -n "$PREEMPTED" ] || [ -f "$run_dir/preempted.json" ]; then
        return "$PREEMPTED_EXIT"
    fi
    if [ "$rc" -ne 0 ]; then
        python -m nanochat.cluster.failure "$run_dir" "$stage" "$log" "$rc"
        return 1
    fi
}

# lm_eval_ready: with LM_EVAL=1, fetch (or find in the cache) the data of the lm-eval tasks of
# LM_EVAL_ARGS once, before any run; when it cannot be had (no network), say so in one line
# and set LM_EVAL=0: the runs go on without lm-eval and are not marked failed.
lm_eval_ready() {
    [ "${LM_EVAL:-0}" = 1 ] || return 0
    if ! python -m scripts.lm_eval --check-data "${LM_EVAL_ARGS[@]}"; then
        echo "speedrun: LM_EVAL=1 but the lm-eval task data could not be loaded (no network?); continuing without lm-eval"
        LM_EVAL=0
    fi
}

# run_all PLAN_TSV: train, evaluate and diagnose every run of the plan (scripts.plan --tsv):
# finished steps are skipped, interrupted training resumes, a failed step moves on to the
# next run. Returns non-zero when any step failed, PREEMPTED_EXIT at once when preempted.
run_all() {
    local plan=$1 k=0 n logs fields config tag evals run_dir run_name stage status
    n=$(wc -l < "$plan")
    logs="$NANOCHAT_BASE_DIR/logs"
    mkdir -p "$logs"
    RUN_DIRS=()
    FAILED=()
    trap 'pass_on TERM' TERM
    trap 'pass_on USR1' USR1
    # The plan is read on descriptor 3: the commands in the loop may read stdin.
    while IFS=$'\t' read -r -u 3 -a fields; do
        k=$((k + 1))
        config=${fields[0]}
        tag=${fields[1]}
        evals=${fields[2]}
        run_dir="$NANOCHAT_BASE_DIR/runs/$tag"
        RUN_DIRS+=("$run_dir")
        run_name=dummy
        [ "$WANDB_RUN" = dummy ] || run_name="${WANDB_RUN}_${tag}"
        echo "speedrun: $(python -m scripts.plan "${PLAN_ARGS[@]}" --progress "$k")"
        rm -f "$run_dir/failed.json" "$run_dir/preempted.json"
        status=0
        if [ -f "$run_dir/summary.json" ]; then
            echo "speedrun: $tag already trained, skipping"
        else
            stage=training
            run_step training "$run_dir" "$logs/$tag.train.log" launch -m scripts.base_train --config "$config" \
                "${fields[@]:3}" --resume true --run "$run_name" "${TRAIN_ARGS[@]}" || status=$?
        fi
        if [ "$status" -eq 0 ] && [ "$evals" = all ] && [ ! -f "$run_dir/eval.json" ]; then
            stage=evaluation
            run_step evaluation "$run_dir" "$logs/$tag.eval.log" \
                launch -m scripts.base_eval --model-tag "$tag" --eval "$EVALS" "${EVAL_ARGS[@]}" || status=$?
        fi
        if [ "$status" -eq 0 ] && [ "$evals" = all ] && [ "${LM_EVAL:-0}" = 1 ] && [ ! -f "$run_dir/lm_eval.json" ]; then
            stage=lm-eval
            run_step lm-eval "$run_dir" "$logs/$tag.lm_eval.log" \
                launch -m scripts.lm_eval --model-tag "$tag" "${LM_EVAL_ARGS[@]}" || status=$?
        fi
        if [ "$status" -eq 0 ] && [ "$evals" = all ] && [ ! -f "$run_dir/hc_stats.json" ]; then
            stage=diagnostics
            run_step diagnostics "$run_dir" "$logs/$tag.hc_report.log" \
                python -m scripts.hc_report --checkpoint "$run_dir" || status=$?
        fi
        if [ "$status" -eq "$PREEMPTED_EXIT" ]; then
            echo "speedrun: preempted (${PREEMPTED:+SIG$PREEMPTED, }during the $stage of $tag); run the same" \
                 "command again to continue: finished runs are skipped, $tag resumes from its last checkpoint" >&2
            return "$PREEMPTED_EXIT"
        fi
        [ "$status" -eq 0 ] || FAILED+=("$tag ($stage)")
    done 3< "$plan"
    [ "${#FAILED[@]}" -eq 0 ]
}

# variant_config NAME: the config a ladder or grid run of the variant NAME starts from: a TOML
# path as given, else configs/paper/d12_NAME.toml (the paper's hyper-parameters), else the
# ablations' or the frontier's d12_NAME.toml (nanochat/planning/plan.py's CONFIG_DIRS, which finds the
# frontier's comparison runs, keeps the same order). One error line naming the choices when none exists.
variant_config() {
    local name=$1 path
    case "$name" in *.toml) [ -f "$name" ] && { echo "$name"; return 0; } ;; esac
    for path in configs/paper/d12_"$name".toml configs/ablations/d12_"$name".toml configs/frontier/d12_"$name".toml; do
        [ -f "$path" ] && { echo "$path"; return 0; }
    done
    echo "speedrun: error: no config for variant '$name' in VARIANTS; use one of:" \
         "$(ls configs/{paper,ablations,frontier}/d12_*.toml | sed 's|.*/d12_||; s|\.toml$||' | sort -u | tr '\n' ' ')" \
         "or a TOML path" >&2
    return 1
}

# study_plan_args ladder|isoflop: append to PLAN_ARGS the compute-multiplier study's runs: every
# variant of VARIANTS (comma-separated) at every depth of LADDER_DEPTHS, sized by the data ratio
# LADDER_RATIO (ladder) or by each FLOPs budget of FLOPS_BUDGETS (isoflop, training only).
study_plan_args() {
    local kind=$1 names name path configs=()
    IFS=, read -r -a names <<< "$VARIANTS"
    for name in "${names[@]}"; do
        path=$(variant_config "$name") || return 1
        configs+=("$path")
    done
    # shellcheck disable=SC2206  # the depth and budget lists split on spaces
    if [ "$kind" = ladder ]; then
        PLAN_ARGS+=(--ladder "${configs[@]}" --depths $LADDER_DEPTHS --ratio "$LADDER_RATIO")
    else
        PLAN_ARGS+=(--isoflop "${configs[@]}" --depths $LADDER_DEPTHS --budgets $FLOPS_BUDGETS --train-only)
    fi
}

# study_report MODE: after the report, what a connection is worth over the mode's runs under
# $NANOCHAT_BASE_DIR/runs: scripts.compare on the ladder (cpu: the demo's runs, the depth-4 ones
# and the ladder's; ladder: ladder_* of TRUNK, default 2026-01), scripts.isoflop on the grid
# (isoflop_* of TRUNK); into report/ (REPORT_DIR). Other modes: nothing. Non-zero when the command failed.
study_report() {
    local out="${REPORT_DIR:-report}" root="$NANOCHAT_BASE_DIR/runs"
    case "$1" in
        cpu)     python -m scripts.compare --runs-root "$root" --select 'cpu_*' --json "$out/compare.json" --out "$out/compare" ;;
        ladder)  python -m scripts.compare --runs-root "$root" --select 'ladder_*' --trunk "${TRUNK:-2026-01}" \
                     --json "$out/compare.json" --out "$out/compare" ;;
        isoflop) python -m scripts.isoflop --runs-root "$root" --select 'isoflop_*' --trunk "${TRUNK:-2026-01}" \
                     --json "$out/isoflop.json" ;;
    esac
}

# corpus_dirs CORPUS: the corpus's shard directory and its tokenizer's under $NANOCHAT_BASE_DIR,
# one a line (nanochat/data/shards.py data_dir, nanochat/tokenizer.py default_tokenizer_dir).
corpus_dirs() {
    python - "$1" <<'PY'
import sys

from nanochat.data.shards import data_dir
from nanochat.tokenizer import default_tokenizer_dir

print(data_dir(corpus=sys.argv[1]))
print(default_tokenizer_dir(sys.argv[1]))
PY
}
