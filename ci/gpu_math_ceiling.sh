#!/usr/bin/env bash
# Issue 22's power-bound ceiling on the H100, one call: the most fp16 tensor-core work any
# kernel sustains under this GPU's power limit (a kernel that only issues wgmma on
# operands in shared memory, bench/experiments/math_ceiling.cu) beside torch.matmul on
# the prefill shapes (llm-public M >= 1024 and 8192^3), 3 sustained runs of >= 2 s each
# per shape and callable, with power, SM clock and temperature sampled:
#
#   bash ci/gpu_math_ceiling.sh                       (nothing to carry)
#
# Time: 17 shapes x 2 callables x 3 runs x 2 s = 204 s of runs, plus the variants (8 s),
# the setup and the per-shape operands: about 4-4.5 minutes (SECONDS_PER_RUN=1.5: about
# 3.5). SECONDS_PER_RUN (default 2), REPS (default 3), RUN_TIMEOUT (default 300 s),
# TESTS=1 first runs the sustained timing's GPU test (tests/verify/test_timing_gpu.py).
# FEED=1: the feed ceiling instead (math_ceiling.py --feed --no-variants: per shape torch,
# the math kernel, the feed kernel and its GEMM twin; 17 shapes x 4 callables x REPS x
# SECONDS_PER_RUN: at REPS=2 SECONDS_PER_RUN=1.5 about 5 minutes), written to
# feed-ceiling.json: commit it as bench/results/h100-feed-ceiling.json. FEED_KERNELS
# (default feed,gemm): which feed kernels (feed, gemm, feedpair, gemmpair, feedpaced,
# feedtall, feedsk, feedsplit, feedtallsk, feed80, feed160, feed192, feed224), each first
# launched once on 4096^3 (feed-smoke.json: µs a launch, the twins' checks and the feed
# kernels' counts of k tiles), stopping there if one fails or hangs. SHAPES_FILE: a shapes file in
# place of bench/shapes/llm-public-prefill.toml (bench/experiments/prefill-tall.toml,
# bench/experiments/prefill-partial.toml).
# Under $OUT: gpu.txt, sass.txt (the kernel's HGMMA and local-memory counts),
# math-ceiling.json (the results, rewritten after every shape: a run cut short keeps
# what it measured), math-ceiling-run.txt (the log), gpu-tests.txt (TESTS=1). Commit
# math-ceiling.json as bench/results/h100-math-ceiling.json.
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.limit,enforced.power.limit --format=csv | tee "$OUT/gpu.txt"
step "compile bench/experiments/math_ceiling.cu"
CUBIN="$OUT/math_ceiling.cubin"
nvcc -cubin -arch=sm_90a -O3 -o "$CUBIN" bench/experiments/math_ceiling.cu
sass=$(cuobjdump -sass "$CUBIN")
# Every kernel the experiment launches: the math kernels of its variants, the feed kernels.
syms=$($PY -c 'import sys; sys.path.insert(0, "bench/experiments"); import math_ceiling as m
print(*dict.fromkeys(v[0] for v in m.VARIANTS.values()), *map(m.feed_symbol, m.FEED))')
for sym in $syms; do
  body=$(awk -v s="$sym" '/Function :/ {on = ($3 == s)} on' <<<"$sass")
  printf "%-14s HGMMA %3d %s LDL/STL %d\n" "$sym" "$(grep -c ' HGMMA' <<<"$body")" \
    "$(grep -oE 'HGMMA\.[0-9x]+' <<<"$body" | sort -u | paste -sd' ')" \
    "$(grep -cE ' (LDL|STL)' <<<"$body" || true)"
done | tee "$OUT/sass.txt"
if [ "${TESTS:-0}" = 1 ]; then
  step "gpu test of the sustained timing (verify.timing.time_sustained)"
  timeout 120 $PY -m pytest -m gpu tests/verify/test_timing_gpu.py -q -p no:cacheprovider \
    -k sustained 2>&1 | tail -3 | tee "$OUT/gpu-tests.txt"
fi
name=math-ceiling extra=()
if [ "${FEED:-0}" = 1 ]; then
  name=feed-ceiling extra=(--feed "${FEED_KERNELS:-feed,gemm}" --no-variants)
  step "feed kernels once (a barrier that never completes hangs: 120 s at most)"
  timeout 120 $PY bench/experiments/math_ceiling.py --cubin "$CUBIN" "${extra[@]}" --smoke \
    --out "$OUT/feed-smoke.json"
fi
step "$name"
rc=0
timeout "${RUN_TIMEOUT:-300}" $PY bench/experiments/math_ceiling.py --cubin "$CUBIN" \
  --seconds "${SECONDS_PER_RUN:-2}" --reps "${REPS:-3}" --out "$OUT/$name.json" "${extra[@]}" \
  ${SHAPES_FILE:+--shapes "$SHAPES_FILE"} \
  2>&1 | tee "$OUT/$name-run.txt" || rc=$?
rm -f "$CUBIN"
echo "exit $rc"
exit "$rc"
