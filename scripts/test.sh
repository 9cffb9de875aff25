#!/usr/bin/env bash
# The test suite on a fresh machine: set up .venv (idempotent), then run pytest on the CPU.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/test_gpt.py -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
# Tests are CPU-only and fp32 by design (see DESIGN.md section 10), whatever the machine.
export CUDA_VISIBLE_DEVICES="" NANOCHAT_DTYPE=float32 WANDB_MODE=disabled
exec .venv/bin/python -m pytest "$@"
