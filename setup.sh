#!/usr/bin/env bash
# One-time set-up on a fresh machine: CPU torch first (no multi-GB CUDA download), then pivotrl
# with its dev, serve and BFCL extras, and bubblewrap for the shell sandbox.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if ! $PY -c "import torch" 2>/dev/null; then
  $PY -m pip install torch==2.13.0
fi
$PY -m pip install -e '.[dev,serve,bfcl]'
# BFCL's data and backends, without its ~15 provider SDKs (DESIGN.md).
$PY -m pip install --no-deps bfcl-eval==2026.3.23
if ! command -v bwrap >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    apt-get install -y bubblewrap >/dev/null || (apt-get update >/dev/null && apt-get install -y bubblewrap >/dev/null)
  else
    echo "warning: bubblewrap (bwrap) not found; the shell verifier and terminal world need it" >&2
  fi
fi
echo "pivotrl set up. Run the tests with: OMP_NUM_THREADS=1 python3 -m pytest -q -n auto"
