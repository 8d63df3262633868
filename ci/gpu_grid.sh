#!/usr/bin/env bash
# Issue 22's grid-sample target on the H100, one call: the v5 sweep of the grid sample's two
# M >= 1024 shapes the v5 sweeps lack (bench/manifests/sweep-tma-v5-grid-h100.toml, from an
# empty database: every design verified and timed beside torch, cuBLASLt autotuned), then
# the grid sample's build from its committed database with that sweep read beside the v5
# sweeps (manifests/grid-sample-h100.toml, [build] reuse): its own proposals measured, the
# run-offs, the memcheck gate, the wheel:
#
#   bash ci/gpu_grid.sh                                            (carry .whl)
#   BEFORE=dist/grid-A/grid-sample-h100.toml bash ci/gpu_grid.sh   (carry .whl and dist)
#
# BEFORE: a wheel, or a manifest (e.g. the grid sample's before its reuse, with the
# database as it was beside it: dist/grid-A/grid-sample-h100.measurements.jsonl) whose
# wheel ci/gpu_wheel_ab.sh packages here; it then benches that wheel and the new one
# round-robin on the grid sample's shapes (ROUNDS, default 2). SWEEP_DB: the sweep's
# database from an earlier call (no sweep). TESTS / TEST_PATHS: GPU tests first, as
# ci/gpu_prefill.sh runs them.
# Under $OUT: sweep/ and grid/ (ci/gpu_prefill.sh's files of each build: build.txt,
# sass.txt, the database gzipped; commit sweep/'s as
# bench/results/h100-sweep-tma-v5-grid.measurements.jsonl.gz and grid/'s, gunzipped, over
# manifests/grid-sample-h100.measurements.jsonl), then ci/gpu_wheel_ab.sh's files.
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
top=$OUT
swept=bench/results/h100-sweep-tma-v5-grid.measurements.jsonl.gz
if [ -n "${SWEEP_DB:-}" ]; then
  cp "$SWEEP_DB" "$swept"
else
  OUT=$top/sweep SWEEP=bench/manifests/sweep-tma-v5-grid-h100.toml BENCH=0 \
    BUILD_TIMEOUT=${SWEEP_TIMEOUT:-300} bash ci/gpu_prefill.sh || echo "sweep: exit $?"
  cp "$top/sweep/sweep-tma-v5-grid-h100.measurements.jsonl.gz" "$swept"
  rm -rf "$top/sweep/dist"  # the sweep's wheel: not a product
fi
OUT=$top/grid SWEEP=manifests/grid-sample-h100.toml SEED_DB=manifests/grid-sample-h100.measurements.jsonl \
  BENCH=0 TESTS= bash ci/gpu_prefill.sh || echo "grid build: exit $?"
if [ -n "${BEFORE:-}" ]; then
  OUT=$top WHEELS="$BEFORE $(ls "$top"/grid/dist/*.whl | head -1)" \
    SHAPES=bench/shapes/cuda-l2-grid-sample.toml STEM=grid-sample-h100 bash ci/gpu_wheel_ab.sh
fi
