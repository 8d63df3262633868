#!/usr/bin/env bash
# On a GPU machine: a family's GPU tests, the sweeps and the product manifests built
# into their databases, then every vendor baseline benchmarked beside each built
# wheel. Databases (gzipped: $OUT gives back files of up to 16 MiB), wheels' bench
# results and logs land under $OUT.
#
#   TESTS='pytest -k expression' SWEEPS='sweep-a.toml sweep-b.toml' bash ci/gpu_session.sh
#
# SWEEPS (default: sweep-direct-h100.toml) are built into the llm-public database, so
# their measurements compete in that manifest's selection; GRID_SWEEPS (default none)
# likewise into the grid-sample database. PRODUCTS=0 stops after the sweeps; BENCH=0
# stops after the product builds (the wheels stay under $OUT/dist for ci/gpu_bench.sh).
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"

if [ -n "${TESTS:-}" ]; then
  step "gpu tests -k '$TESTS'"
  $PY -m pytest -m gpu tests -q -p no:cacheprovider -k "$TESTS" > "$OUT/gpu-tests.txt" 2>&1 || true
  tail -3 "$OUT/gpu-tests.txt"
fi

build() {  # MANIFEST_PATH DB
  # recorded so far (plain, or the shipped .gz)
  [ -f "$OUT/$2" ] || zcat -f "manifests/$2" > "$OUT/$2" 2>/dev/null \
    || zcat "manifests/$2.gz" > "$OUT/$2" 2>/dev/null || rm -f "$OUT/$2"
  step "cudal2-build $1"
  cudal2-build "$1" --measurements "$OUT/$2" --out "$OUT/dist" 2>&1 | quiet | tail -4
}
for sweep in ${SWEEPS:-sweep-direct-h100.toml}; do
  build "bench/manifests/$sweep" llm-public-h100.measurements.jsonl
  rm -f "$OUT"/dist/cudal2_kernels_sweep_*.whl
done
for sweep in ${GRID_SWEEPS:-}; do
  build "bench/manifests/$sweep" grid-sample-h100.measurements.jsonl
  rm -f "$OUT"/dist/cudal2_kernels_sweep_*.whl
done
[ "${PRODUCTS:-1}" = 0 ] && exit 0
build manifests/llm-public-h100.toml llm-public-h100.measurements.jsonl
build manifests/grid-sample-h100.toml grid-sample-h100.measurements.jsonl
[ "${BENCH:-1}" = 0 ] && exit 0

for pair in llm-public:llm_public_h100 cuda-l2-grid-sample:grid_sample_h100; do
  shapes=${pair%%:*}; pkg=${pair##*:}
  name=${shapes#cuda-l2-}
  res="$OUT/h100-$name.jsonl"
  wheel=$(ls "$OUT"/dist/cudal2_kernels_"$pkg"-*.whl)
  step "cudal2-bench $shapes"
  cudal2-bench "bench/shapes/$shapes.toml" --kernels "$wheel" --mode both --out "$res" 2>&1 | quiet | tail -2
  for mode in offline server; do
    echo "--- $name $mode"
    cudal2-bench summarize "$res" --mode "$mode" --json | tr -d '\n '; echo
  done
done
