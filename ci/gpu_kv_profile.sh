#!/usr/bin/env bash
# Issue 21's ceiling on the H100: where a compiled Llama-3.1-8B decode step's time goes,
# unpatched and patched (bench/experiments/kv_decode_profile.py), with the e2e wheel
# (ci/gpu_e2e_build.sh) carried in:
#
#   WHEEL=.e2e-job/<the wheel>.whl bash ci/gpu_kv_profile.sh      (carry .e2e-job)
#
# Under $OUT: gpu.txt, kv-decode-profile.json (commit as
# bench/results/h100-kv-decode-profile.json), kv-decode-profile.txt (the log).
# BATCHES (default 1,16,64), STEPS (default 8).
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
[ -n "${WHEEL:-}" ] && [ -f "$WHEEL" ] || { echo "WHEEL=path/to/the/carried.whl is required" >&2; exit 2; }
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$PWD/.cache/inductor}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
$PY -m pip install -q --no-deps --force-reinstall "$WHEEL" 2>&1 | grep -v "WARNING: Running pip as" || true
PKG=$(python3 -c "import sys, zipfile; print(next(n.split('/')[0] for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.endswith('/__init__.py')))" "$WHEEL")
step "kv decode profile (batches ${BATCHES:-1,16,64})"
timeout "${RUN_TIMEOUT:-540}" $PY bench/experiments/kv_decode_profile.py --package "$PKG" \
  --out "$OUT/kv-decode-profile.json" --batches "${BATCHES:-1,16,64}" --steps "${STEPS:-8}" \
  $([ "${ROPE_KV:-0}" = 1 ] && echo --rope-kv) $([ "${GROUPED:-0}" = 1 ] && echo --grouped-decode) \
  2>&1 | tee "$OUT/kv-decode-profile.txt"
