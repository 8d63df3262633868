#!/usr/bin/env bash
# On a GPU machine: the decode sweep and the product manifests built into their
# databases, then every vendor baseline benchmarked beside each built wheel.
# Databases, wheels and bench results land under $OUT.
#
#   bash ci/gpu_session.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export CUDAL2_CACHE=${CUDAL2_CACHE:-$PWD/.cache/artifacts}
PY=${PYTHON:-python3}
if [ -d .whl ]; then FIND=(--no-index --find-links .whl); else FIND=(); fi
$PY -c "import cudal2" 2>/dev/null || $PY -m pip install -q "${FIND[@]}" --no-build-isolation -e . 2>&1 | grep -v "WARNING: Running pip as" || true
$PY -c "import nvmath" 2>/dev/null || $PY -m pip install -q "${FIND[@]}" --no-deps nvmath-python 2>&1 | grep -v "WARNING: Running pip as" || true
quiet() { grep -v "it/s\]\|s/it\]\|^H100\|^NVIDIA" || true; }

build() {  # MANIFEST DB
  [ -f "$OUT/$2" ] || cp "manifests/$2" "$OUT/$2" 2>/dev/null || true  # recorded so far
  echo "=== cudal2-build $1 ($(date -u +%H:%M:%S))"
  cudal2-build "manifests/$1" --measurements "$OUT/$2" --out "$OUT/dist" 2>&1 | quiet | tail -8
}
build sweep-decode-h100.toml llm-public-h100.measurements.jsonl
rm -f "$OUT"/dist/cudal2_kernels_sweep_decode_h100-*.whl
build llm-public-h100.toml llm-public-h100.measurements.jsonl
build grid-sample-h100.toml grid-sample-h100.measurements.jsonl

for pair in llm-public:llm_public_h100 cuda-l2-grid-sample:grid_sample_h100; do
  shapes=${pair%%:*}; pkg=${pair##*:}
  name=${shapes#cuda-l2-}
  res="$OUT/h100-$name.jsonl"
  wheel=$(ls "$OUT"/dist/cudal2_kernels_"$pkg"-*.whl)
  echo "=== cudal2-bench $shapes ($(date -u +%H:%M:%S))"
  cudal2-bench "bench/shapes/$shapes.toml" --kernels "$wheel" --mode both --out "$res" 2>&1 | quiet | tail -2
  for mode in offline server; do
    echo "--- $name $mode"
    cudal2-bench summarize "$res" --mode "$mode" --json | tr -d '\n '; echo
  done
done
