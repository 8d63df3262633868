#!/usr/bin/env bash
# Issue 22, why stream-K lost (docs/kernels.md "sm90tma v5 stream-K"), one call: Nsight
# Compute's speed-of-light, memory and warp-state sections of the stream-K sweep's fastest
# stream-K kernel and its data-parallel twin (bench/experiments/ncu_streamk.py) on each
# shape, clocks as found:
#
#   bash ci/gpu_ncu_streamk.sh                     (carry .whl: nvmath-python)
#
# SHAPES (default "1024 4096 14336;4096 8192 1024": the largest loss, the smallest), DB
# (default: the H100 stream-K sweep). Under $OUT: gpu.txt, ncu-streamk-<M>x<N>x<K>.csv
# (the details page of both kernels, ncu --csv) and ncu-run.txt. Commit the CSVs as
# bench/results/h100-ncu-streamk-<M>x<N>x<K>.csv.
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
ncu_setup
DB=${DB:-bench/results/h100-sweep-tma-v5-streamk.measurements.jsonl.gz}
IFS=';' read -r -a SHAPE_LIST <<<"${SHAPES:-1024 4096 14336;4096 8192 1024}"
for shape in "${SHAPE_LIST[@]}"; do
  read -r m n k <<<"$shape"
  step "ncu: stream-K and its data-parallel twin at ${m}x${n}x${k}"
  rep="$OUT/ncu-streamk-${m}x${n}x${k}"
  timeout 200 "$NCU" --clock-control none --cache-control all --replay-mode kernel \
    --nvtx --nvtx-include "sk/" --nvtx-include "dp/" --launch-count 2 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --metrics "dram__bytes_read.sum,lts__t_sector_hit_rate.pct,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active" \
    --export "$rep" --force-overwrite \
    $PY bench/experiments/ncu_streamk.py --db "$DB" --shape "$m" "$n" "$k" \
    2>&1 | tee -a "$OUT/ncu-run.txt" | grep -v "^==PROF==" | tail -4
  "$NCU" --import "$rep.ncu-rep" --csv --page details > "$rep.csv"
  rm -f "$rep.ncu-rep"
  wc -l "$rep.csv"
done
