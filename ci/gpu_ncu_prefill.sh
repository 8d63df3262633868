#!/usr/bin/env bash
# Issue 22, where the own kernels' tensor pipe waits, one call: Nsight Compute's sections
# for the fastest own kernel of the sweeps' databases and cuBLASLt's autotuned algorithm
# on prefill shapes (bench/experiments/ncu_prefill_pair.py), clocks as found:
#
#   bash ci/gpu_ncu_prefill.sh                     (carry .whl: nvmath-python)
#
# SHAPES (default "4096 4096 4096;4096 8192 1024"), DBS (default: the H200 v5 overlap and
# halves sweeps, fp16), EXTRA_METRICS (more ncu metrics, comma-separated; e.g. the warp
# stall reasons: regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio), TAG
# (a suffix of the files' names), FEED=1 (math_ceiling.cu's math, feed and GEMM-twin
# kernels, their 2-CTA pairs, the paced and tall feed kernels and torch.matmul too, in
# ranges of those names; FEED_KERNELS, comma-separated, names others, e.g. the even shares
# feedsk and feedtallsk). Under $OUT: gpu.txt, ncu-<M>x<N>x<K>.csv (the details page of
# both kernels' sections, ncu --csv) and ncu-run.txt. Commit the CSVs as
# bench/results/h200-ncu-prefill-<M>x<N>x<K>.csv.
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
ncu_setup
DBS=${DBS:-bench/results/h200-sweep-tma-v5-overlap.measurements.jsonl.gz bench/results/h200-sweep-tma-v5-halves.measurements.jsonl.gz}
feed=() ranges=(--nvtx-include "own/" --nvtx-include "cublaslt/")
if [ "${FEED:-0}" = 1 ]; then
  nvcc -cubin -arch=sm_90a -O3 -o "$OUT/math_ceiling.cubin" bench/experiments/math_ceiling.cu
  kernels=${FEED_KERNELS:-feed,gemm,feedpair,gemmpair,feedpaced,feedtall}
  feed=(--feed "$OUT/math_ceiling.cubin" --feed-kernels "$kernels")
  for r in math ${kernels//,/ } torch; do ranges+=(--nvtx-include "$r/"); done
fi
IFS=';' read -r -a SHAPE_LIST <<<"${SHAPES:-4096 4096 4096;4096 8192 1024}"
for shape in "${SHAPE_LIST[@]}"; do
  read -r m n k <<<"$shape"
  step "ncu: own and cuBLASLt at ${m}x${n}x${k}"
  rep="$OUT/ncu-${m}x${n}x${k}${TAG:-}"
  # shellcheck disable=SC2086
  timeout 240 "$NCU" --clock-control none --cache-control all --replay-mode kernel \
    --nvtx "${ranges[@]}" --launch-count $((${#ranges[@]} / 2 * 2)) \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis --section LaunchStats \
    --metrics "sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active${EXTRA_METRICS:+,$EXTRA_METRICS}" \
    --export "$rep" --force-overwrite \
    $PY bench/experiments/ncu_prefill_pair.py --db $DBS --shape "$m" "$n" "$k" --launches 1 "${feed[@]}" \
    2>&1 | tee -a "$OUT/ncu-run.txt" | grep -v "^==PROF==" | tail -5
  "$NCU" --import "$rep.ncu-rep" --csv --page details > "$rep.csv"
  rm -f "$rep.ncu-rep"
  wc -l "$rep.csv"
done
rm -f "$OUT/math_ceiling.cubin"
