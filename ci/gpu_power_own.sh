#!/usr/bin/env bash
# Issue 22, why the own prefill kernels trail cuBLASLt, one call: per prefill shape the
# fastest own kernel of the sweeps' databases, cuBLASLt's autotuned algorithm and
# torch.matmul, 3 sustained runs of >= 1.5 s each, interleaved, with the SM clock and
# power sampled (bench/experiments/power_own.py):
#
#   bash ci/gpu_power_own.sh                       (carry .whl: nvmath-python)
#
# DBS (default: the H200 v5 overlap and halves sweeps, fp16), SECONDS_PER_RUN (1.5),
# REPS (3), RUN_TIMEOUT (480 s), SHAPES (default bench/shapes/llm-public-prefill.toml;
# bench/experiments/prefill-squares.toml: 8192^3 and 4096^3 only). Under $OUT: gpu.txt,
# power-own.json (rewritten after every shape), power-own-run.txt (the log). Commit
# power-own.json as bench/results/h200-power-own.json.
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.limit,enforced.power.limit --format=csv | tee "$OUT/gpu.txt"
DBS=${DBS:-bench/results/h200-sweep-tma-v5-overlap.measurements.jsonl.gz bench/results/h200-sweep-tma-v5-halves.measurements.jsonl.gz}
step "own kernels, cuBLASLt and torch, sustained"
# shellcheck disable=SC2086
timeout "${RUN_TIMEOUT:-480}" $PY bench/experiments/power_own.py --db $DBS \
  --seconds "${SECONDS_PER_RUN:-1.5}" --reps "${REPS:-3}" --out "$OUT/power-own.json" \
  --shapes "${SHAPES:-bench/shapes/llm-public-prefill.toml}" \
  2>&1 | tee "$OUT/power-own-run.txt" | tail -25
