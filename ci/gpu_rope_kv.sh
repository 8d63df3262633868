#!/usr/bin/env bash
# Task A of issue 21 on the H100, one call (docs/kernels.md, "RoPE and the KV-cache write
# in the qkv epilogue"): sm90direct's rmsnorm_rope_kv / rmsnorm_bias_rope_kv kernels
#   (a) the GPU tests (tests/verify/test_rope_kv_gpu.py: the correctness suite on
#       Llama-3.1-8B's qkv and residue head splits, fp16 and bf16, four designs; the PDL
#       pair check; an out-of-range position; memcheck) and the runtime op through a
#       generated package (tests/packaging/runtime/test_rope_kv_op_gpu.py: a kernel hit,
#       eager, the torch op, CUDA-graph capture), ~2-4 minutes of nvcc here;
#   (b) the sweep bench/manifests/sweep-rope-kv-h100.toml built from an empty database:
#       Llama-3.1-8B qkv 6144 x 4096 (heads 32/8/128) at M = 1 and 16, rmsnorm_rope_kv and
#       rmsnorm on 8 sm90direct tiles near the e2e wheel's M = 1 design, each with its 3 PDL
#       variants (128 candidates: correctness suite, timing beside torch's unfused
#       sequence, memcheck of what ships), a pure wheel;
#   (c) the table of (b) (ci/rope_kv_summary.py) and the SASS counts of its cubins.
#
#   bash ci/gpu_rope_kv.sh        (nothing to carry; TESTS=0: skip (a); BUILD=0: skip (b), (c))
#
# (a) and (b) are cut at 330 s and 230 s (TEST_TIMEOUT, BUILD_TIMEOUT) so that one call
# stays within a 600 s command; if either is cut, run them as two calls (BUILD=0, then
# TESTS=0 with longer timeouts).
#
# Under $OUT: gpu.txt, rope-kv-tests.txt, sweep-rope-kv-h100.measurements.jsonl.gz,
# build.txt, rope-kv-summary.txt, sass.txt, dist/ (the wheel). Commit afterwards: the
# database as bench/results/h100-sweep-rope-kv.measurements.jsonl.gz and the summary as
# bench/results/h100-rope-kv-summary.txt (read them first).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
SWEEP=${SWEEP:-bench/manifests/sweep-rope-kv-h100.toml}
STEM=$(basename "$SWEEP" .toml)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.limit \
  --format=csv | tee "$OUT/gpu.txt"
rc=0
if [ "${TESTS:-1}" = 1 ]; then
  step "GPU tests: test_rope_kv_gpu.py, test_rope_kv_op_gpu.py"
  timeout "${TEST_TIMEOUT:-330}" $PY -m pytest -m gpu tests/verify/test_rope_kv_gpu.py \
    tests/packaging/runtime/test_rope_kv_op_gpu.py -q -p no:cacheprovider \
    > "$OUT/rope-kv-tests.txt" 2>&1 || rc=$?
  tail -15 "$OUT/rope-kv-tests.txt"
fi
if [ "${BUILD:-1}" = 1 ]; then
  step "cudal2-build $SWEEP"
  DB="$OUT/$STEM.measurements.jsonl"
  /usr/bin/time -f "build wall time %e s" timeout "${BUILD_TIMEOUT:-230}" cudal2-build "$SWEEP" \
    --measurements "$DB" --out "$OUT/dist" --no-native 2>&1 | tee "$OUT/build.txt" \
    | noprogress | tail -30 || rc=$?
  step "summary"
  $PY ci/rope_kv_summary.py "$DB" 2>&1 | tee "$OUT/rope-kv-summary.txt" | tail -30 || rc=$?
  step "SASS of every compiled kernel"
  mapfile -t cubins < <(ls "$CUDAL2_CACHE"/*/*/kernel.cubin 2>/dev/null)
  if [ ${#cubins[@]} -gt 0 ]; then
    sass_table "${cubins[@]}" > "$OUT/sass.txt"
    sass_summary "$OUT/sass.txt"
  fi
fi
echo "exit $rc"
exit "$rc"
