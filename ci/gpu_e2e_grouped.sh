#!/usr/bin/env bash
# Issue 21: grouped decode end to end (bench/experiments/llama_kv_e2e.py --part grouped):
# Llama-3.1-8B (32 layers, random fp16 weights, static cache, 1,024-token context) under
# torch.compile(mode="reduce-overhead"), three models interleaved: unpatched, patched with
# rope_kv, and the same patched with grouped_decode on (a decode step's attention over the
# grouped KV heads in place). The wheel is packaged here (--no-measure, with the native
# launcher against this machine's torch) from the committed H100 databases of the layer,
# e2e and rope-kv sweeps for bench/manifests/llama-e2e-grouped-h100.toml (M 1, 16, 64),
# into .e2e-job/grouped/ (kept on a warm machine: the next call reuses it). Carry
# .cache/artifacts to skip nvcc (compile here first: the same build with --no-native).
#
#   bash ci/gpu_e2e_grouped.sh                                  # check + grouped at 1, 16
#   SEED=bench/results/<earlier>.json PARTS=grouped BATCHES=64 bash ci/gpu_e2e_grouped.sh
#        (SEED: an earlier run's JSON, merged into: the batches run now are added)
#   GROUPED_VARIANT=sdpa BATCHES=1,4,16,64 bash ci/gpu_e2e_grouped.sh
#        (the grouped twin: patch_model(grouped_decode="sdpa"); default "math")
#
# Under $OUT: gpu.txt, wheel-build.txt, llama-kv-e2e-rope.json, llama-kv-e2e.txt.
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
package_wheel .e2e-job/grouped bench/manifests/llama-e2e-grouped-h100.toml \
  bench/manifests/layer-epilogues-h100.measurements.jsonl.gz \
  bench/manifests/llama-e2e-h100.measurements.jsonl.gz \
  bench/results/h100-sweep-rope-kv.measurements.jsonl.gz
if [ -n "${SEED:-}" ]; then cp "$SEED" "$OUT/llama-kv-e2e-rope.json"; export KEEP=1; fi
WHEEL=$WHEEL ROPE_KV=1 PARTS="${PARTS:-check grouped}" BATCHES="${BATCHES:-1,16}" \
  PART_TIMEOUT="${PART_TIMEOUT:-480}" bash ci/gpu_e2e_kv.sh
