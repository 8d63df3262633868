#!/usr/bin/env bash
# Issue 22 on the H100, one call: a kernel family's GPU tests, a sweep manifest built from
# an empty database into a wheel (policy/grid proposals, every candidate verified and
# timed beside torch, cuBLASLt autotuned), the SASS counts of every compiled kernel, then
# cudal2-bench on the prefill shapes (llm-public M >= 1024, 4096^3, 8192^3) with that
# wheel beside every vendor in one process, summarised at M >= 1024:
#
#   TESTS='<pytest -k expression>' SWEEP=bench/manifests/sweep-tma-v5-h100.toml \
#     bash ci/gpu_prefill.sh                                   (carry .whl: nvmath-python)
#
# sm90tma v5 tile N (docs/kernels.md "sm90tma v5 tile N"): TESTS='tile_n' selects its GPU
# tests in both default files (the kernels on every residue, the strided bulk store, the
# fused epilogues, memcheck: 46), TEST_TIMEOUT=300 leaves them room:
#
#   TESTS='tile_n' TEST_TIMEOUT=300 SWEEP=bench/manifests/sweep-tma-v5-n-h100.toml BENCH=0 \
#     bash ci/gpu_prefill.sh
#
# sm90tma v5 ping-pong (docs/kernels.md "sm90tma v5 ping-pong"): TESTS='tma_v5_pingpong'
# selects its GPU tests in both default files (the kernels on every residue and K = 1024,
# the strided bulk store, the fused epilogues in place and under memcheck: 42):
#
#   TESTS='tma_v5_pingpong' TEST_TIMEOUT=240 SWEEP=bench/manifests/sweep-tma-v5-pingpong-h100.toml \
#     BENCH=0 bash ci/gpu_prefill.sh
#
# sm90tma v5 overlap (docs/kernels.md "sm90tma v5 overlap"): TESTS='overlap' selects its
# GPU tests in both default files (the kernels on every residue, the strided bulk store,
# the fused epilogues in place and under memcheck: 30); VENDOR_KERNELS=1 then names
# torch.matmul's cuBLAS kernels on the prefill shapes (bench/experiments/vendor_kernels.py):
#
#   TESTS='overlap' TEST_TIMEOUT=300 SWEEP=bench/manifests/sweep-tma-v5-overlap-h100.toml \
#     BENCH=0 VENDOR_KERNELS=1 bash ci/gpu_prefill.sh
#
# sm90tma v5 TMA store (docs/kernels.md "sm90tma v5 TMA store"): TESTS='tma_v5_tma or
# pingpong_tma' selects its GPU tests (the kernels on every residue N % 8 == 0, the strided
# output, a misaligned C refused, the fused epilogues in place and under memcheck: 101):
#
#   TESTS='tma_v5_tma or pingpong_tma' TEST_TIMEOUT=400 SWEEP=bench/manifests/sweep-tma-v5-tma-h100.toml \
#     BENCH=0 bash ci/gpu_prefill.sh
#
# sm90tma v5 uniform warpgroup index, ping-pong pair and tall TMA store (docs/kernels.md,
# the tenth slice): TESTS='pppair or tma_v5_uniform or tma_v5_tall' selects their GPU tests
# (68), best in a call of their own beside the small tall sweep; the uniform sweep seeded
# with its records, and the pair sweep seeded with the uniform sweep's, measure only their
# new designs (the sweeps search trial designs: [search] trial = true):
#
#   TESTS='pppair or tma_v5_uniform or tma_v5_tall' TEST_TIMEOUT=420 \
#     SWEEP=bench/manifests/sweep-tma-v5-tall-h100.toml BENCH=0 bash ci/gpu_prefill.sh
#   SEED_DB=<the tall database> SWEEP=bench/manifests/sweep-tma-v5-uniform-h100.toml \
#     BENCH=0 bash ci/gpu_prefill.sh
#   SEED_DB=<the uniform database> SWEEP=bench/manifests/sweep-tma-v5-pppair-h100.toml \
#     BENCH=0 bash ci/gpu_prefill.sh
#
# A wheel built elsewhere (WHEEL=path, carried: e.g. the shipped llm-public wheel packaged
# on the CPU machine from its committed databases, `cudal2-build
# manifests/llm-public-h100.toml --no-measure --out dist`): no build; CHECK=1 installs it
# and checks it against an fp32 reference first (ci/check_wheel.py), then the bench:
#
#   TESTS=tma_v5_uniform WHEEL=dist/<the wheel> CHECK=1 DTYPES="fp16 bf16" \
#     MODE="offline server" bash ci/gpu_prefill.sh                (carry .whl and dist)
#
# TESTS empty: no tests. BENCH=0: no cudal2-bench. MODE (default offline; "offline server"
# for both), DTYPES (default fp16). SEED_DB: databases the build starts from, e.g. the
# shipped llm-public records and the sweeps' (tracked files: nothing to carry):
#
#   SWEEP=manifests/llm-public-h100.toml DTYPES="fp16 bf16" MODE="offline server" \
#     SEED_DB="manifests/llm-public-h100.measurements.jsonl.gz bench/results/h100-sweep-tma-v5*.gz" \
#     bash ci/gpu_prefill.sh
#
# Under $OUT: gpu.txt, gpu-tests.txt, <sweep>.measurements.jsonl.gz, build.txt, sass.txt,
# the wheel (dist/), prefill.jsonl (bench rows), prefill-summary.txt and
# prefill-summary.json.txt (`cudal2-bench summarize --m-min 1024 --json` per dtype and mode),
# vendor-kernels.json (VENDOR_KERNELS=1).
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
if [ -z "${WHEEL:-}" ]; then
  SWEEP=${SWEEP:?SWEEP=path/to/sweep.toml (or WHEEL=path/to/wheel) is required}
  STEM=$(basename "$SWEEP" .toml)
elif [ ! -f "$WHEEL" ]; then
  echo "ci/gpu_prefill.sh: WHEEL=$WHEEL is not a file" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.limit --format=csv | tee "$OUT/gpu.txt"
rc=0
if [ -n "${TESTS:-}" ]; then
  step "gpu tests -k '$TESTS'"
  # shellcheck disable=SC2086
  timeout "${TEST_TIMEOUT:-240}" $PY -m pytest -m gpu \
    ${TEST_PATHS:-tests/verify/test_kernels_gpu.py tests/verify/test_epilogue_gpu.py} -q \
    -p no:cacheprovider -k "$TESTS" > "$OUT/gpu-tests.txt" 2>&1 || rc=$?
  tail -15 "$OUT/gpu-tests.txt"
fi
if [ -z "${WHEEL:-}" ]; then
  step "cudal2-build $SWEEP"
  DB="$OUT/$STEM.measurements.jsonl"
  # The seed: the build then measures only what the databases lack and selects from them all.
  if [ -n "${SEED_DB:-}" ]; then
    # shellcheck disable=SC2086
    zcat -f $SEED_DB > "$DB"
    echo "seeded with $(wc -l < "$DB") records"
  fi
  /usr/bin/time -f "build wall time %e s" timeout "${BUILD_TIMEOUT:-400}" cudal2-build "$SWEEP" \
    --measurements "$DB" --out "$OUT/dist" 2>&1 | tee "$OUT/build.txt" | noprogress | tail -45 || rc=$?
  step "SASS of every compiled kernel"
  mapfile -t cubins < <(ls "$CUDAL2_CACHE"/*/*/kernel.cubin 2>/dev/null)
  if [ ${#cubins[@]} -gt 0 ]; then sass_table "${cubins[@]}" > "$OUT/sass.txt"; sass_summary "$OUT/sass.txt"; fi
  WHEEL=$(ls "$OUT"/dist/*.whl 2>/dev/null | head -1 || true)
elif [ "${CHECK:-0}" = 1 ]; then
  step "install $WHEEL and check it"
  check_wheel "$WHEEL" | tail -20 || rc=$?
fi
if [ "${BENCH:-1}" = 1 ] && [ -n "$WHEEL" ]; then
  step "cudal2-bench prefill shapes with $WHEEL"
  read -r -a DTYPE_LIST <<<"${DTYPES:-fp16}"
  timeout "${BENCH_TIMEOUT:-240}" cudal2-bench bench/shapes/llm-public-prefill.toml --kernels "$WHEEL" \
    --mode "$( [ "${MODE:-offline}" = "offline server" ] && echo both || echo "${MODE:-offline}")" \
    --dtype "${DTYPE_LIST[@]}" --out "$OUT/prefill.jsonl" 2>&1 | noprogress | tail -3 || rc=$?
  for dtype in "${DTYPE_LIST[@]}"; do
    for mode in ${MODE:-offline}; do
      cudal2-bench summarize "$OUT/prefill.jsonl" --m-min 1024 --mode "$mode" --dtype "$dtype" \
        2>&1 | tee -a "$OUT/prefill-summary.txt" | tail -24
      echo "$dtype $mode $(cudal2-bench summarize "$OUT/prefill.jsonl" --m-min 1024 --mode "$mode" \
        --dtype "$dtype" --json | tr -d '\n ')" | tee -a "$OUT/prefill-summary.json.txt"
    done
  done
fi
if [ "${VENDOR_KERNELS:-0}" = 1 ]; then
  step "torch.matmul's cuBLAS kernels on the prefill shapes"
  timeout 120 $PY bench/experiments/vendor_kernels.py --out "$OUT/vendor-kernels.json" 2>&1 | tail -40 || rc=$?
fi
echo "exit $rc"
exit "$rc"
