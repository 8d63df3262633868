#!/usr/bin/env bash
# Issue 21 on the H100: end to end with a KV cache (bench/experiments/llama_kv_e2e.py):
# Llama-3.1-8B dimensions (32 layers, random fp16 weights), transformers' static cache
# over a 1,024-token context, decode tokens/s at batch 1, 16, 64 under
# torch.compile(mode="reduce-overhead") and eagerly, the unpatched model against
# patch_model; prefill at 2,048 tokens; Qwen2-7B (qkv bias) at batch 1; the logits
# against fp32; the memory the patch adds; the path (fused / original / fused_fallback)
# each layer and the LM head took at each M. The wheel: built from
# bench/manifests/llama-e2e-h100.toml (ci/gpu_e2e_build.sh; carry its folder), which covers
# every M the run makes (the layer wheel of ci/gpu_layer_build.sh covers decode only):
#
#   WHEEL=.e2e-job/<the wheel ci/gpu_e2e_build.sh wrote> bash ci/gpu_e2e_kv.sh
#
# Each part runs in its own process under PART_TIMEOUT (default 420 s) and merges its
# results into $OUT/llama-kv-e2e.json (a part cut short loses only itself). The compiles
# (one per model and decode batch, ~1 minute each, not yet measured on the H100) dominate:
# if the whole does not fit one 10-minute command, split it, e.g.
#   PARTS="check eager prefill graph" BATCHES=1,16 bash ci/gpu_e2e_kv.sh
#   PARTS="graph qwen2" BATCHES=64 KEEP=1 bash ci/gpu_e2e_kv.sh   (KEEP=1: add to the JSON)
# ROPE_KV=1: the patched models are patch_model(rope_kv=True)'s (RoPE and the cache write
# in the qkv kernel; a wheel of bench/manifests/llama-e2e-rope-h100.toml), the results in
# $OUT/llama-kv-e2e-rope.json.
# Inductor's cache lives in .cache/inductor (kept on a warm machine: a rerun compiles from
# it). Under $OUT: gpu.txt, llama-kv-e2e.json, llama-kv-e2e.txt (the log).
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
[ -n "${WHEEL:-}" ] && [ -f "$WHEEL" ] || { echo "WHEEL=path/to/the/carried.whl is required" >&2; exit 2; }
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$PWD/.cache/inductor}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
$PY -m pip install -q --no-deps --force-reinstall "$WHEEL" 2>&1 | grep -v "WARNING: Running pip as" || true
PKG=$(python3 -c "import sys, zipfile; print(next(n.split('/')[0] for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.endswith('/__init__.py')))" "$WHEEL")
$PY -c "import torch, transformers, $PKG as p; print('torch', torch.__version__, '| transformers', transformers.__version__, '| package', p.__name__, p.__version__, '| launcher', p._api.launcher, p._api.native_reason or '')" | tee -a "$OUT/gpu.txt"
json=$OUT/llama-kv-e2e.json
ROPE=()
if [ "${ROPE_KV:-0}" = 1 ]; then json=$OUT/llama-kv-e2e-rope.json; ROPE=(--rope-kv); fi
# GROUPED=1: the patched models as patch_model's default, grouped_decode on (a decode
# step's attention over the grouped KV heads in place, not transformers' per-head copy of
# the cache); without it they pass grouped_decode=False (the GEMMs' share alone)
if [ "${GROUPED:-0}" = 1 ]; then json=${json%.json}-grouped.json; ROPE+=(--grouped-decode); fi
# GROUPED_VARIANT=sdpa: the grouped models' attention as one SDPA call (default math)
ROPE+=(--grouped-variant "${GROUPED_VARIANT:-math}")
[ "${KEEP:-0}" = 1 ] || rm -f "$json"
rc=0
for part in ${PARTS:-check eager prefill graph qwen2}; do
  step "llama_kv_e2e --part $part (batches ${BATCHES:-1,16,64})"
  set +e
  timeout "${PART_TIMEOUT:-420}" $PY bench/experiments/llama_kv_e2e.py --package "$PKG" \
    --out "$json" --part "$part" --batches "${BATCHES:-1,16,64}" --layers "${LAYERS:-32}" \
    "${ROPE[@]}" 2>&1 | tee -a "$OUT/llama-kv-e2e.txt"
  st=${PIPESTATUS[0]}
  set -e
  [ "$st" = 0 ] || { echo "part $part: exit $st (124: PART_TIMEOUT)"; rc=$st; }
done
echo "exit $rc"
exit "$rc"
