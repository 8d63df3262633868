#!/usr/bin/env bash
# Issue 19 on the GPU machine: the native launcher built on the CPU machine (torch 2.13
# headers, stable ABI 2.11) run under this machine's torch. A wheel built on the CPU
# machine with its _native/ files is carried in:
#
#   cudal2-build manifests/llama-3.1-8b-hf-h100.toml --out .native-smoke/dist   # CPU
#   WHEEL=.native-smoke/dist/cudal2_kernels_llama_3_1_8b_hf_h100-0.1.0-*.whl \
#     bash ci/gpu_native.sh           (carry .native-smoke and .whl; STEPS to choose)
#
# STEPS (default "tests host e2e"): tests = the runtime's GPU tests (TEST_PATHS, default
# tests/packaging/runtime) on the native path,
# then again with CUDAL2_NATIVE=0 (the Python path); host = host_overhead.py; e2e =
# llama_e2e.py (LAYERS, default 32); trace = eager_trace.py at 16 and 64 decode tokens
# (not in the default); eager = eager_host.py (a forward's host time with the GPU held
# busy, and each linear shape's, at 1/16/64/256 tokens; not in the default); fused =
# fused_host.py (host time per call of the fused ops, linear_residual / linear_gated /
# linear_rmsnorm, native against Python against torch's unfused ops, for every fused
# entry of the wheel's table at 1/16/64 tokens; not in the default: a wheel with fused
# entries, e.g. built from bench/manifests/layer-epilogues-h100.toml). Under $OUT:
# gpu.txt, gpu-tests-native.txt, gpu-tests-python.txt, host-overhead.json,
# llama-e2e.json, trace-16.json, trace-64.json, eager-host.json, fused-host.json.
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
STEPS=${STEPS:-tests host e2e}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch, platform; print('torch', torch.__version__, '| glibc', platform.libc_ver()[1])" | tee -a "$OUT/gpu.txt"
$PY -m pip install -q --no-deps --force-reinstall "$WHEEL" 2>&1 | grep -v "WARNING: Running pip as" || true
PKG=$(python3 -c "import sys, zipfile; print(next(n.split('/')[0] for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.endswith('/__init__.py')))" "$WHEEL")
# The tests' packages carry the CPU machine's build of the launcher, not one made here.
export CUDAL2_TEST_NATIVE=$PWD/.native-test
rm -rf "$CUDAL2_TEST_NATIVE" && mkdir -p "$CUDAL2_TEST_NATIVE"
$PY - "$WHEEL" "$PKG" "$CUDAL2_TEST_NATIVE" <<'PYEOF'
import pathlib, sys, zipfile
whl, pkg, out = sys.argv[1:4]
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith(f"{pkg}/_native/"):
            (pathlib.Path(out) / name.rsplit("/", 1)[1]).write_bytes(z.read(name))
PYEOF
ls -la "$CUDAL2_TEST_NATIVE" | tee -a "$OUT/gpu.txt"
$PY -c "import $PKG as k; print('launcher:', k._api.launcher, k._api.native_reason or '')" | tee -a "$OUT/gpu.txt"

if [[ " $STEPS " == *" tests "* ]]; then
  for path in native python; do
    step "runtime GPU tests, $path path"
    # shellcheck disable=SC2086
    env $([ $path = python ] && echo CUDAL2_NATIVE=0) $PY -m pytest -m gpu ${TEST_PATHS:-tests/packaging/runtime} -q \
      -p no:cacheprovider > "$OUT/gpu-tests-$path.txt" 2>&1 || true
    tail -5 "$OUT/gpu-tests-$path.txt"
  done
fi
if [[ " $STEPS " == *" host "* ]]; then
  step "host overhead, both paths in one process"
  $PY bench/experiments/host_overhead.py --package "$PKG" --out "$OUT/host-overhead.json" | tail -40
fi
if [[ " $STEPS " == *" e2e "* ]]; then
  step "Llama end to end (${LAYERS:-32} layers), native, Python and unpatched in one process"
  $PY bench/experiments/llama_e2e.py --package "$PKG" --layers "${LAYERS:-32}" --out "$OUT/llama-e2e.json" \
    ${E2E_ARGS:-}
fi
if [[ " $STEPS " == *" trace "* ]]; then
  for tokens in 16 64; do
    step "eager forward traced, $tokens decode tokens, patched and unpatched"
    $PY bench/experiments/eager_trace.py --package "$PKG" --layers "${LAYERS:-32}" \
      --tokens "$tokens" --out "$OUT/trace-$tokens.json"
  done
fi
if [[ " $STEPS " == *" eager "* ]]; then
  step "eager forward's host time, patched and unpatched, GPU held busy"
  $PY bench/experiments/eager_host.py --package "$PKG" --layers "${LAYERS:-32}" \
    --out "$OUT/eager-host.json"
fi
if [[ " $STEPS " == *" fused "* ]]; then
  step "fused ops' host time per call: native, Python, torch's unfused ops, GPU held busy"
  $PY bench/experiments/fused_host.py --package "$PKG" --out "$OUT/fused-host.json" | tail -40
fi
