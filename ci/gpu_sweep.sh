#!/usr/bin/env bash
# On a GPU machine: a family's GPU tests, then a sweep manifest built into its own
# database, with the SASS counts of every kernel compiled. Under $OUT: gpu.txt,
# gpu-tests.txt, <sweep>.measurements.jsonl.gz, build.txt, sass.txt.
#
#   bash ci/gpu_sweep.sh SWEEP_MANIFEST [PYTEST_K_EXPR]
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
MANIFEST=$1
STEM=$(basename "$MANIFEST" .toml)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"

tests_rc=0
if [ -n "${2:-}" ]; then
  step "gpu tests -k '$2'"
  $PY -m pytest -m gpu tests -q -p no:cacheprovider -k "$2" > "$OUT/gpu-tests.txt" 2>&1 || tests_rc=$?
  tail -8 "$OUT/gpu-tests.txt"
fi

step "cudal2-build $MANIFEST"
DB="$OUT/$STEM.measurements.jsonl"
/usr/bin/time -f "build wall time %e s" cudal2-build "$MANIFEST" --measurements "$DB" \
  --out "$OUT/dist" 2>&1 | tee "$OUT/build.txt" | noprogress | tail -40
rm -rf "$OUT/dist"

step "SASS of every compiled kernel"
mapfile -t cubins < <(ls "$CUDAL2_CACHE"/*/*/kernel.cubin)
sass_table "${cubins[@]}" > "$OUT/sass.txt"
sass_summary "$OUT/sass.txt"
exit $tests_rc
