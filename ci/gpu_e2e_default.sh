#!/usr/bin/env bash
# Issue 21's end to end with patch_model's defaults (grouped decode on, in its "math"
# form; rope_kv off): bench/experiments/llama_kv_e2e.py with --grouped-decode over the
# e2e wheel (bench/manifests/llama-e2e-h100.toml: Llama-3.1-8B at decode 1/16/64 and the
# 2,048-token prefill, Qwen2-7B at 1), packaged here (--no-measure, with the native
# launcher against this machine's torch) from the committed H100 databases of the layer
# and e2e builds into .e2e-job/default/ (kept on a warm machine). Carry .cache/artifacts to
# skip nvcc (compile here first: the same build with --no-native, CUDAL2_CACHE set to it).
#
#   PARTS="check graph" bash ci/gpu_e2e_default.sh                 # graphs at 1, 16, 64
#   SEED=bench/results/<that run>.json PARTS="eager prefill qwen2" bash ci/gpu_e2e_default.sh
#        (SEED: an earlier run's JSON, merged into)
#
# Under $OUT: gpu.txt, wheel-build.txt, llama-kv-e2e-grouped.json, llama-kv-e2e.txt.
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
package_wheel .e2e-job/default bench/manifests/llama-e2e-h100.toml \
  bench/manifests/layer-epilogues-h100.measurements.jsonl.gz \
  bench/manifests/llama-e2e-h100.measurements.jsonl.gz
if [ -n "${SEED:-}" ]; then cp "$SEED" "$OUT/llama-kv-e2e-grouped.json"; export KEEP=1; fi
WHEEL=$WHEEL GROUPED=1 PARTS="${PARTS:-check graph}" BATCHES="${BATCHES:-1,16,64}" \
  PART_TIMEOUT="${PART_TIMEOUT:-480}" bash ci/gpu_e2e_kv.sh
