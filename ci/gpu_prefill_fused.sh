#!/usr/bin/env bash
# Issue 22's fused prefill end to end, one call: bench/manifests/llama-prefill-fused-h100.toml
# (what patch_model runs for a fused Llama-3.1-8B at the 2,048-token prefill: qkv plain
# after torch's RMSNorm, o and down with the residual, gate_up with the gated SiLU after
# torch's RMSNorm; api.NORMED_TWINS) built from an empty database into a wheel, then
# bench/experiments/llama_kv_e2e.py's check and prefill parts with it: the unpatched model
# against patch_model's, the report's path per M, one patched prefill's hits and fallbacks:
#
#   bash ci/gpu_prefill_fused.sh                            (carry .whl: nvmath-python)
#
# SEED_DB: a database to start from (a build cut short resumes). BUILD_TIMEOUT (240 s),
# PART_TIMEOUT (240 s), LAYERS (32), REPS (10). TESTS: a pytest -k expression of gpu tests
# to run first (TESTS=rtma: R by TMA's, about 40 kernels compiled and checked), their
# log in gpu-tests.txt. Under $OUT: gpu.txt, build.txt,
# llama-prefill-fused-h100.measurements.jsonl, the wheel, llama-prefill-fused.json,
# llama-prefill-fused.txt (the log).
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.limit --format=csv | tee "$OUT/gpu.txt"
if [ -n "${TESTS:-}" ]; then
  step "gpu tests -k '$TESTS'"
  timeout "${TEST_TIMEOUT:-300}" $PY -m pytest -m gpu tests -q -p no:cacheprovider -k "$TESTS" \
    > "$OUT/gpu-tests.txt" 2>&1 || true
  tail -3 "$OUT/gpu-tests.txt"
fi
MANIFEST=bench/manifests/llama-prefill-fused-h100.toml
DB="$OUT/$(basename "$MANIFEST" .toml).measurements.jsonl"
# shellcheck disable=SC2086
[ -n "${SEED_DB:-}" ] && zcat -f $SEED_DB > "$DB"
step "cudal2-build $MANIFEST"
rc=0
timeout "${BUILD_TIMEOUT:-240}" cudal2-build "$MANIFEST" --measurements "$DB" --out "$OUT/dist" \
  2>&1 | tee "$OUT/build.txt" | noprogress | tail -20 || rc=$?
WHEEL=$(ls "$OUT"/dist/*.whl 2>/dev/null | head -1 || true)
[ -n "$WHEEL" ] || { echo "no wheel (build exit $rc)"; exit 1; }
mv "$WHEEL" "$OUT/" && rm -rf "$OUT/dist" && WHEEL="$OUT/$(basename "$WHEEL")"
$PY -m pip install -q --no-deps --force-reinstall "$WHEEL" 2>&1 | grep -v "WARNING: Running pip as" || true
PKG=$(python3 -c "import sys, zipfile; print(next(n.split('/')[0] for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.endswith('/__init__.py')))" "$WHEEL")
step "llama_kv_e2e --part check --part prefill (${LAYERS:-32} layers)"
timeout "${PART_TIMEOUT:-240}" $PY bench/experiments/llama_kv_e2e.py --package "$PKG" \
  --out "$OUT/llama-prefill-fused.json" --part check --part prefill --batches 1 \
  --layers "${LAYERS:-32}" --reps "${REPS:-10}" 2>&1 | tee "$OUT/llama-prefill-fused.txt" \
  | grep -v Warning | tail -12 || rc=$?
echo "exit $rc"
exit "$rc"
