#!/usr/bin/env bash
# The test suite on a fresh machine: set up .venv (idempotent), then run pytest on the CPU.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/test_gpt.py -x`). `--quick` is
# one of them: the quick tier of tests/conftest.py (QUICK), for contributors between full runs.
set -euo pipefail
cd "$(dirname "$0")/.."
# On another torch (TORCH_VERSION=2.9.1 bash scripts/test.sh) or build (TORCH_BUILD=cuda: the
# CUDA dry run's fake CUDA tensors need a CUDA build): a venv of its own beside .venv.
if [ "${TORCH_BUILD:-}" = cuda ]; then
    pinned=$(sed -n 's/^PINNED_TORCH=//p' scripts/setup_env.sh)
    export VENV="${VENV:-.venv-torch${TORCH_VERSION:-$pinned}-cuda}" NANOCHAT_REQUIRE_FAKE_CUDA=1
fi
[ -z "${TORCH_VERSION:-}" ] || export VENV="${VENV:-.venv-torch$TORCH_VERSION}"
export VENV="${VENV:-.venv}"
# With the kernels extra: the Liger/Triton tests run (on CPU, in Triton's interpreter), not skip.
# With the eval extra: the export and lm-eval tests run (transformers, lm-eval), not skip.
NANOCHAT_EXTRAS="${NANOCHAT_EXTRAS:-dev,kernels,eval}" bash scripts/setup_env.sh
# Tests are CPU-only and fp32 by design (see docs/architecture.md, "Tests"), whatever the machine.
# One thread per process: the tests use tiny tensors, for which thread hand-offs cost more
# than they save (measured: the GPT tests run 3x faster), and some tests start 2 processes.
export CUDA_VISIBLE_DEVICES="" NANOCHAT_DTYPE=float32 WANDB_MODE=disabled OMP_NUM_THREADS=1
# Three pytest-xdist workers, a test file each at a time (module fixtures stay in one worker):
# many tests wait on the processes they start, so on 2 cores a third worker fills that time
# (measured on the whole suite, 2026-12-02: 9m55s with two workers, 8m23s with three; one
# worker per core before that cut about 40 %). NANOCHAT_TEST_WORKERS=0 runs in one process.
echo "test: $("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)')"
# A worker that dies (a native crash) is not replaced: with --dist loadfile, xdist 3.8 can then
# wait forever for work the dead worker held (pytest-xdist issue 1378), where this fails at once
# and names the test.
exec "$VENV/bin/python" -m pytest -n "${NANOCHAT_TEST_WORKERS:-3}" --dist loadfile --max-worker-restart 0 "$@"
