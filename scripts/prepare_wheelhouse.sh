#!/usr/bin/env bash
# Download the wheels scripts/gpu_check.sh installs on a GPU machine with no package index.
# Run on a machine that reaches PyPI, from the repository root. Wheels only (CPython 3.12,
# x86-64 Linux), the versions installed in this environment; fails if the folder is over 64 MiB
# (what a device run carries with the working tree) or a needed project has no wheel.
#   ./scripts/prepare_wheelhouse.sh [DEST]      (default: .wheelhouse, git-ignored)
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.wheelhouse}"
rm -rf "$dest"
python3 scripts/wheelhouse.py download --dest "$dest"
