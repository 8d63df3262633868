#!/usr/bin/env bash
# Issue 22, where in the own kernel its warps stall, one call: Nsight Compute's source
# counters (warp-state sampling per SASS instruction) of the fastest own kernel of each
# database on one shape (bench/experiments/ncu_prefill_pair.py), clocks as found:
#
#   DBS="a.jsonl b.jsonl" SHAPE="4096 4096 4096" bash ci/gpu_ncu_source.sh   (carry .whl)
#
# Each database in DBS is profiled on its own (its fastest own kernel); each must hold the
# shape's cuBLASLt record too (ncu_prefill_pair.py launches both, ncu profiles only the
# own one: without it the script stops on a KeyError). WHO=cublaslt profiles the
# database's cuBLASLt algorithm instead: its SASS with the samples. cuBLASLt's nvjet
# kernels are built at run time (no SASS of them is stored in libcublasLt.so.13: its
# .rodata holds only their name templates and the ELF section names it writes), so
# this is where their instructions can be read:
#
#   WHO=cublaslt DBS=a.jsonl SHAPE="8192 8192 8192" bash ci/gpu_ncu_source.sh
#
# Under $OUT:
# gpu.txt, sass-<n>.csv (ncu --page source --print-source sass --csv: each SASS
# instruction with its samples by stall reason), ncu-run.txt.
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
ncu_setup
read -r m n k <<<"${SHAPE:-4096 4096 4096}"
i=0
for db in ${DBS:?DBS is required}; do
  i=$((i + 1))
  step "ncu source counters (${WHO:-own}): $db at ${m}x${n}x${k}"
  rep="$OUT/src-$i"
  timeout 240 "$NCU" --clock-control none --cache-control all --replay-mode kernel \
    --nvtx --nvtx-include "${WHO:-own}/" --launch-count 1 \
    --section SourceCounters --section WarpStateStats --import-source no \
    --export "$rep" --force-overwrite \
    $PY bench/experiments/ncu_prefill_pair.py --db "$db" --shape "$m" "$n" "$k" --launches 1 \
    2>&1 | tee -a "$OUT/ncu-run.txt" | grep -v "^==PROF==" | tail -3
  "$NCU" --import "$rep.ncu-rep" --page source --print-source sass --csv > "$OUT/sass-$i.csv"
  rm -f "$rep.ncu-rep"
  wc -l "$OUT/sass-$i.csv"
  head -3 "$OUT/sass-$i.csv" | cut -c1-600
done
