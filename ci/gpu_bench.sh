#!/usr/bin/env bash
# On a GPU machine: every vendor baseline on the benchmark shape files, offline and
# server, beside a cudal2 wheel's dispatch; summaries printed, results under $OUT.
#
#   bash ci/gpu_bench.sh KERNELS [SHAPES...]  (default: bench/shapes/llm-public.toml
#                                              bench/shapes/cuda-l2-grid-sample.toml)
#
# KERNELS: a wheel or a measurement database (see cudal2-bench --kernels).
# DTYPES (environment, default "fp16"): e.g. DTYPES="fp16 bf16".
#
# nvmath-python (cuBLASLt) comes from .whl/ where there is no package index.
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
KERNELS=$1; shift
read -r -a DTYPE_LIST <<<"${DTYPES:-fp16}"
SHAPES=("$@")
[ ${#SHAPES[@]} -gt 0 ] || SHAPES=(bench/shapes/llm-public.toml bench/shapes/cuda-l2-grid-sample.toml)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')
for shapes in "${SHAPES[@]}"; do
  name=$(basename "$shapes" .toml); name=${name#cuda-l2-}
  res="$OUT/$gpu-$name.jsonl"
  cudal2-bench "$shapes" --kernels "$KERNELS" --mode both --dtype "${DTYPE_LIST[@]}" --out "$res" 2>&1 \
    | grep -v "it/s\]\|s/it\]" | tail -3
  for dtype in "${DTYPE_LIST[@]}"; do
    for mode in offline server; do
      echo "=== $name $dtype $mode"
      cudal2-bench summarize "$res" --mode "$mode" --dtype "$dtype" --json | tr -d '\n '; echo
    done
  done
done
