#!/usr/bin/env bash
# The GPU proof kit: run from the repository root on a CUDA machine (no network needed).
#   ./scripts/prepare_wheelhouse.sh     # once, on a machine that reaches PyPI (fills .wheelhouse/)
#   ./scripts/gpu_check.sh [ARGS]       # ARGS go to scripts/gpu_check.py (e.g. --only profile)
# Installs the carried wheels into .gpu_site/ (never into the machine's Python), puts src/ and
# .gpu_site/ first on PYTHONPATH, and runs scripts/gpu_check.py --device cuda within 10 minutes.
# Results: gpu_check.json and logs in $OUT when set, else runs/gpu_check/.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-runs/gpu_check}"
mkdir -p "$out"
py="${PYTHON:-python3}"
site=.gpu_site
wheels="${WHEELHOUSE:-.wheelhouse}"  # another folder only to rehearse with other wheels
started=$(date +%s)

install() {
  if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
    echo "no $wheels/*.whl: using the Python environment as it is"
    return 0
  fi
  rm -rf "$site"
  # --no-deps: the wheelhouse is the whole closure; the resolver must not touch the image's torch.
  if ! "$py" -m pip install --no-index --no-deps --no-compile --target "$site" \
      --disable-pip-version-check --quiet "$wheels"/*.whl; then
    echo "pip install failed; unpacking the wheels instead (a wheel is a zip of its site files)"
    for whl in "$wheels"/*.whl; do "$py" -m zipfile -e "$whl" "$site" || return 1; done
  fi
  # pivotrl's own metadata (entry points: worlds) without its pins; src/ still wins on the path.
  "$py" -m pip install --no-index --no-deps --no-build-isolation --target "$site/.pivotrl" \
      --disable-pip-version-check --quiet . >/dev/null 2>&1 \
    && mv "$site"/.pivotrl/pivotrl-*.dist-info "$site"/ 2>/dev/null
  rm -rf "$site/.pivotrl" build
  echo "installed $(ls "$wheels"/*.whl | wc -l) wheels from $wheels into $site"
}

install 2>&1 | tee "$out/install.log"
export PYTHONPATH="$PWD/src:$PWD/$site${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
left=$((600 - 30 - ($(date +%s) - started)))  # the whole kit fits in 10 minutes
timeout "$left" "$py" scripts/gpu_check.py --device cuda --budget-s $((left - 120)) "$@" \
  2>&1 | tee "$out/console.log"
status=${PIPESTATUS[0]}
[ "$status" = 124 ] && echo "gpu_check.py ran out of time (${left} s); $out/gpu_check.json has what finished"
exit "$status"
