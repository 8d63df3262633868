#!/usr/bin/env bash
# Issue 20's must-show on the H100: the llm-public decode targets (M <= 256, fp16 and
# bf16) built with PDL on top of llm-public's recorded database, and the wheel measured
# against every vendor baseline, offline and server.
#
#   STEPS=build bash ci/gpu_pdl_public.sh      (carry .whl)            ~4 min
#   STEPS=bench WHEEL=.pdl-public/<wheel> bash ci/gpu_pdl_public.sh   (carry .pdl-public, .whl)
#
# build -> $OUT: pdl-public-build.txt, llm-public-pdl-h100.measurements.jsonl.gz (the
# database: llm-public's records and the new ones), the wheel.
# bench -> $OUT: h100-llm-public-pdl.jsonl (cudal2-bench results), bench-summary.txt.
source "$(dirname "$0")/gpu_env.sh"
STEPS=${STEPS:-build}
if [[ " $STEPS " == *" build "* ]]; then
  DB=$OUT/llm-public-pdl-h100.measurements.jsonl
  zcat manifests/llm-public-h100.measurements.jsonl.gz > "$DB"
  step "build bench/manifests/llm-public-pdl-h100.toml ($(wc -l < "$DB") records to start from)"
  timeout "${BUILD_TIMEOUT:-520}" cudal2-build bench/manifests/llm-public-pdl-h100.toml \
    --measurements "$DB" --out "$OUT/dist" --jobs "$(nproc)" 2>&1 | noprogress > "$OUT/pdl-public-build.txt"
  rc=${PIPESTATUS[0]}
  grep -v "^H100\|^NVIDIA" "$OUT/pdl-public-build.txt" | tail -12
  echo "build exit $rc; records now $(wc -l < "$DB")"
  mv "$OUT"/dist/*.whl "$OUT/" 2>/dev/null; rm -rf "$OUT/dist"
  [ "$rc" -eq 0 ] || exit "$rc"
fi
if [[ " $STEPS " == *" bench "* ]]; then
  res=$OUT/h100-llm-public-pdl.jsonl
  step "cudal2-bench llm-public-decode, fp16 and bf16, offline and server"
  timeout "${BENCH_TIMEOUT:-540}" cudal2-bench bench/shapes/llm-public-decode.toml --kernels "$WHEEL" \
    --mode both --dtype fp16 bf16 --out "$res" 2>&1 | noprogress | tail -3
  for dtype in fp16 bf16; do
    for mode in offline server; do
      echo "=== $dtype $mode"
      cudal2-bench summarize "$res" --mode "$mode" --dtype "$dtype" --m-max 256 --json | tr -d '\n '; echo
    done
  done | tee "$OUT/bench-summary.txt"
fi
