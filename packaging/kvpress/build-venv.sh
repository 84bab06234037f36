#!/usr/bin/env bash
# Build the separate venv in which kvpress, the reference library of KV-cache compression, runs beside kvviz.
#
# kvpress 0.5.5 pins transformers<5.3 (it gets 5.2.0), which clashes with kvviz's own 5.24, so it lives apart
# (default: .venv-kvpress at the repository root, gitignored). `make test-kvpress` runs kvpress's presses in it
# (packaging/kvpress/reference.py) and compares what kvviz's strategies keep with what they kept.
# Usage: packaging/kvpress/build-venv.sh [VENV_DIR]     (idempotent: does nothing if it already works)
set -euo pipefail

here="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${1:-$here/.venv-kvpress}"
python="${PYTHON:-python3.11}"
export PIP_FIND_LINKS="${PIP_FIND_LINKS:-/opt/wheels}"   # torch 2.13.0+cpu wheel lies here

check() {
    "$venv/bin/python" -c "import kvpress; from importlib.metadata import version; assert version('kvpress') == '0.5.5'" \
        >/dev/null 2>&1
}

if [ -x "$venv/bin/python" ] && check; then
    echo "kvpress venv ready: $venv"
    exit 0
fi

start=$(date +%s)
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
# torch pinned in the same command, so the resolver never reaches for a CUDA build.
"$venv/bin/python" -m pip install --quiet "torch==2.13.0" "kvpress==0.5.5"
check || { echo "kvpress venv built but 'import kvpress' fails" >&2; exit 1; }
echo "kvpress venv built in $(( $(date +%s) - start )) s: $venv"
