#!/usr/bin/env bash
# Issue 22 end to end, one call: bench/manifests/llama-prefill-tma-h100.toml (the linear
# layers of a transformers Llama-3.1-8B at the 2,048-token prefill, searched over the
# sm90tma TMA-store designs beside cuBLASLt and torch) built from an empty database into
# a wheel, then bench/experiments/llama_e2e.py --tokens 2048 with that wheel: the
# unpatched model against the patched one (native launcher, and the Python launch path),
# eagerly, back to back and under CUDA graphs, the logits against fp32:
#
#   bash ci/gpu_prefill_e2e.sh                              (carry .whl: nvmath-python)
#
# LAYERS (default 32), REPS (20), BUILD_TIMEOUT (300 s), COMPILE=1 (also the
# torch.compile check; off by default: its compile of 32 layers takes minutes). Under
# $OUT: gpu.txt, build.txt, llama-prefill-tma-h100.measurements.jsonl.gz, the wheel,
# llama-e2e.json.
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.limit --format=csv | tee "$OUT/gpu.txt"
MANIFEST=bench/manifests/llama-prefill-tma-h100.toml
DB="$OUT/$(basename "$MANIFEST" .toml).measurements.jsonl"
step "cudal2-build $MANIFEST"
timeout "${BUILD_TIMEOUT:-300}" cudal2-build "$MANIFEST" --measurements "$DB" --out "$OUT/dist" \
  2>&1 | tee "$OUT/build.txt" | noprogress | tail -20
gzip -f "$DB"
WHEEL=$(ls "$OUT"/dist/*.whl | head -1)
mv "$WHEEL" "$OUT/" && rm -rf "$OUT/dist" && WHEEL="$OUT/$(basename "$WHEEL")"
$PY -m pip install -q --no-deps --force-reinstall "$WHEEL" 2>&1 | grep -v "WARNING: Running pip as" || true
PKG=$(python3 -c "import sys, zipfile; print(next(n.split('/')[0] for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.endswith('/__init__.py')))" "$WHEEL")
step "Llama end to end, 2,048-token prefill (${LAYERS:-32} layers)"
COMPILE=(--no-compile)
[ "${COMPILE:-0}" = 1 ] && COMPILE=()
$PY bench/experiments/llama_e2e.py --package "$PKG" --layers "${LAYERS:-32}" --reps "${REPS:-20}" \
  --tokens 2048 "${COMPILE[@]}" --out "$OUT/llama-e2e.json" | tail -30
