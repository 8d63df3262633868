#!/usr/bin/env bash
# Issue 22, where the row scale costs its kernel time, one call: Nsight Compute's source
# counters (warp-state sampling per SASS instruction) and warp-state statistics of a fused
# database's fastest row-scaled kernel and of the same design without the row scale
# (bench/experiments/ncu_row_scale.py), clocks as found:
#
#   DB=bench/results/h200-llama-prefill-fused-twins.measurements.jsonl.gz \
#     EPILOGUE=rmsnorm SHAPE="2048 6144 4096" bash ci/gpu_ncu_rows.sh      (carry .whl)
#
# Under $OUT: gpu.txt, sass-rows.csv and sass-plain.csv (ncu --page source --print-source
# sass --csv: each SASS instruction with its samples by stall reason), details-rows.csv and
# details-plain.csv (--page details --csv: the sections' metrics), ncu-run.txt.
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
ncu_setup
read -r m n k <<<"${SHAPE:-2048 6144 4096}"
for role in rows plain; do
  step "ncu source counters ($role): ${EPILOGUE:-rmsnorm} at ${m}x${n}x${k}"
  rep="$OUT/src-$role"
  timeout 240 "$NCU" --clock-control none --cache-control all --replay-mode kernel \
    --nvtx --nvtx-include "$role/" --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight \
    --import-source no --export "$rep" --force-overwrite \
    $PY bench/experiments/ncu_row_scale.py --db "${DB:?DB is required}" \
    --epilogue "${EPILOGUE:-rmsnorm}" --shape "$m" "$n" "$k" \
    2>&1 | tee -a "$OUT/ncu-run.txt" | grep -v "^==PROF==" | tail -4
  "$NCU" --import "$rep.ncu-rep" --page source --print-source sass --csv > "$OUT/sass-$role.csv"
  "$NCU" --import "$rep.ncu-rep" --page details --csv > "$OUT/details-$role.csv"
  rm -f "$rep.ncu-rep"
  wc -l "$OUT/sass-$role.csv"
done
