#!/usr/bin/env bash
# Where the layer benchmark's time goes (bench/experiments/layer_profile.py): per-kernel
# GPU time of the vendor and the cudal2 decoder layer under CUDA-graph replay, with the
# wheel carried in as for ci/gpu_layer.sh:
#
#   WHEEL=.layer-job/cudal2_kernels_...whl bash ci/gpu_layer_profile.sh   (carry .layer-job, .whl)
#
# Under $OUT: gpu.txt, layer-profile.json (commit as bench/results/h100-layer-profile.json),
# layer-profile.txt (the log). MODELS, DTYPES, MS override the cases.
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
[ -n "${WHEEL:-}" ] && [ -f "$WHEEL" ] || { echo "WHEEL=path/to/the/carried.whl is required" >&2; exit 2; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
$PY -m pip install -q --no-deps --force-reinstall "$WHEEL" 2>&1 | grep -v "WARNING: Running pip as" || true
PKG=$(python3 -c "import sys, zipfile; print(next(n.split('/')[0] for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.endswith('/__init__.py')))" "$WHEEL")
step "layer profile"
# shellcheck disable=SC2086
timeout "${RUN_TIMEOUT:-400}" $PY bench/experiments/layer_profile.py --package "$PKG" \
  --model ${MODELS:-llama-3.1-8b llama-3.1-70b-tp8} --dtype ${DTYPES:-fp16} --m ${MS:-1 16 64} \
  --out "$OUT/layer-profile.json" 2>&1 | tee "$OUT/layer-profile.txt"
