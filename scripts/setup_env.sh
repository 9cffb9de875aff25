#!/usr/bin/env bash
# Create (or refresh) .venv with everything nanochat-hc needs, on any machine.
#
# torch is installed first and explicitly: a bare "torch" requirement in a fresh
# venv resolves to a multi-GB CUDA build even on machines without a GPU. So we pick
# the build here (CUDA wheel when nvidia-smi sees a GPU, CPU wheel otherwise), then
# install the package with every other dependency pinned by constraints.txt.
# Idempotent: a second run only checks that everything is in place.
#
# Extras (pyproject.toml): NANOCHAT_EXTRAS, default "dev", plus "kernels" (Liger-Kernel and
# Triton, for --hc-kernels liger) on a GPU machine and "eval" (transformers, lm-eval: the
# Hugging Face export and lm-evaluation-harness) when LM_EVAL=1. scripts/test.sh asks for
# "dev,kernels,eval" so that the kernel tests (in Triton's interpreter) and the export and
# lm-eval tests run on CPU too.
set -euo pipefail
cd "$(dirname "$0")/.."

# The torch the project is pinned to and tested with; TORCH_VERSION=X.Y.Z installs another one
# (the declared floor in pyproject.toml is tested too: scripts/test.sh, docs/tests.md "Supported torch, the CUDA side, the kernels").
PINNED_TORCH=2.13.0
TORCH_VERSION="${TORCH_VERSION:-$PINNED_TORCH}"
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
# TORCH_BUILD: cuda | cpu | auto (the default: cuda where nvidia-smi sees a GPU, else cpu).
# TORCH_BUILD=cuda on a machine without a GPU is for the CUDA dry run (docs/tests.md "Supported torch, the CUDA side, the
# kernels"): PyPI's build of torch, whose CUDA libraries run on a CPU too (several GB).
TORCH_BUILD="${TORCH_BUILD:-auto}"
case "$TORCH_BUILD" in
    auto) if has_gpu; then TORCH_BUILD=cuda; else TORCH_BUILD=cpu; fi ;;
    cuda|cpu) ;;
    *) echo "error: TORCH_BUILD=$TORCH_BUILD; choose cuda, cpu or auto" >&2; exit 2 ;;
esac
if [ -z "${NANOCHAT_EXTRAS:-}" ]; then
    NANOCHAT_EXTRAS=dev
    if has_gpu; then NANOCHAT_EXTRAS=dev,kernels; fi
    if [ "${LM_EVAL:-0}" = 1 ]; then NANOCHAT_EXTRAS="$NANOCHAT_EXTRAS,eval"; fi
fi
stamp="$VENV/.nanochat-setup"
state="torch=$TORCH_VERSION build=$TORCH_BUILD $(sha1sum pyproject.toml constraints.txt | sha1sum | cut -c1-12)"

# Up to date: same torch and pins, and every requested extra already installed.
if [ -f "$stamp" ] && [ "$(head -1 "$stamp")" = "$state" ]; then
    have=",$(sed -n 2p "$stamp"),"
    missing=""
    for extra in ${NANOCHAT_EXTRAS//,/ }; do
        case "$have" in *",$extra,"*) ;; *) missing=1 ;; esac
    done
    if [ -z "$missing" ]; then
        echo "setup_env: $VENV is up to date ($state, extras $(sed -n 2p "$stamp"))"
        exit 0
    fi
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

# uv (nanochat's own installer) resolves and installs in parallel: measured here from a fresh
# venv, the dependencies after torch in 44 s against pip's 3 min 38 s. It comes from the index
# like any package, into the venv; where it cannot be had (or NANOCHAT_INSTALLER=pip), pip does
# the same installs. --compile-bytecode: pip writes .pyc files as it installs, uv only when
# asked; without them every fresh process compiles torch's modules again (import torch 4.1 s
# against 1.9 s).
installer="${NANOCHAT_INSTALLER:-uv}"
if [ "$installer" = uv ] && ! "$VENV/bin/python" -m uv --version >/dev/null 2>&1; then
    "${pip[@]}" install -c constraints.txt uv >/dev/null 2>&1 || installer=pip
fi
uv=(env VIRTUAL_ENV="$VENV" "$VENV/bin/python" -m uv pip install -q --compile-bytecode --python "$VENV/bin/python")

# The torch in place will do: this version, and a CUDA build when one is asked for (a CPU
# machine's fallback below is a CUDA build too, which serves the CPU as well).
wanted="torch.__version__.split('+')[0] == '$TORCH_VERSION' and ('$TORCH_BUILD' == 'cpu' or torch.backends.cuda.is_built())"
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(not ($wanted))" 2>/dev/null; then
    if [ "$TORCH_BUILD" = cuda ]; then
        echo "setup_env: installing CUDA torch==$TORCH_VERSION"
        # PyPI's build, past any local configuration that prefers a CPU wheel on disk (uv reads
        # none; pip with --isolated); uv fetches its CUDA libraries (several GB) in parallel.
        if [ "$installer" != uv ] || ! "${uv[@]}" "torch==$TORCH_VERSION"; then
            "${pip[@]}" install --isolated "torch==$TORCH_VERSION"
        fi
    else
        echo "setup_env: no GPU, installing CPU torch==$TORCH_VERSION"
        # A CPU wheel already on this machine (pip's find-links) first, its dependencies
        # then from the index; otherwise PyTorch's CPU-only index; only where that cannot be
        # reached, PyPI's default build, whose CUDA libraries (several GB) run on a CPU too.
        if "${pip[@]}" install --no-index --no-deps "torch==$TORCH_VERSION" 2>/dev/null; then
            "${pip[@]}" install -c constraints.txt "torch==$TORCH_VERSION"
        elif ! "${pip[@]}" install "torch==$TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu 2>/dev/null; then
            echo "setup_env: PyTorch's CPU index unreachable; installing torch==$TORCH_VERSION from PyPI (the CUDA build)"
            "${pip[@]}" install "torch==$TORCH_VERSION"
        fi
    fi
fi

# Every other dependency at the version the test suite was run with. torch is already
# in place and satisfies every floor (liger-kernel asks for torch>=2.1.2), so pip keeps it.
# Another torch than the pinned one requires its own triton: the pin on triton is dropped.
constraints=constraints.txt
if [ "$TORCH_VERSION" != "$PINNED_TORCH" ]; then
    constraints="$VENV/constraints-torch$TORCH_VERSION.txt"
    grep -v '^triton==' constraints.txt > "$constraints"
fi
if [ "$installer" = uv ]; then
    # uv reads no pip configuration: the wheels this machine keeps on disk (pip's find-links) too.
    links=()
    for dir in ${PIP_FIND_LINKS:-} $("$VENV/bin/python" -m pip config get global.find-links 2>/dev/null || true); do
        [ -d "$dir" ] && links+=(--find-links "$dir")
    done
    "${uv[@]}" "${links[@]}" -c "$constraints" -e ".[$NANOCHAT_EXTRAS]" || installer=pip
fi
if [ "$installer" = pip ]; then
    "${pip[@]}" install -c "$constraints" -e ".[$NANOCHAT_EXTRAS]"
fi
printf '%s\n%s\n' "$state" "$NANOCHAT_EXTRAS" > "$stamp"
echo "setup_env: done ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
