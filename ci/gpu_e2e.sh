#!/usr/bin/env bash
# Issue 6 on a GPU machine: the torch op's GPU tests (kernels through the op, CUDA-graph
# capture, torch.compile), the host-overhead figure, and the end-to-end Llama benchmark,
# with a wheel built on a CPU machine for that model (cudal2-build
# manifests/llama-3.1-8b-hf-h100.toml --no-measure). Under $OUT: gpu.txt,
# gpu-tests.txt, host-overhead.json, llama-e2e.json.
#
#   WHEEL=.cache/e2e/cudal2_kernels_llama_3_1_8b_hf_h100-0.1.0-py3-none-any.whl \
#     LAYERS=32 bash ci/gpu_e2e.sh        (TESTS=0: skip the GPU tests)
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
$PY -m pip install -q --no-deps --force-reinstall "$WHEEL" 2>&1 | grep -v "WARNING: Running pip as" || true
PKG=$(python3 -c "import sys, zipfile; print(next(n.split('/')[0] for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.endswith('/__init__.py')))" "$WHEEL")

if [ "${TESTS:-1}" = 1 ]; then
  step "gpu tests: the torch op, CuPy arrays, graphs, compile"
  $PY -m pytest -m gpu tests/packaging/runtime/test_ops_gpu.py tests/packaging/runtime/test_arrays_gpu.py \
    tests/packaging/runtime/test_api_gpu.py -q -p no:cacheprovider > "$OUT/gpu-tests.txt" 2>&1 || true
  tail -5 "$OUT/gpu-tests.txt"
fi

step "host overhead"
$PY bench/experiments/host_overhead.py --package "$PKG" --out "$OUT/host-overhead.json" | tail -30

step "Llama end to end (${LAYERS:-32} layers)"
$PY bench/experiments/llama_e2e.py --package "$PKG" --layers "${LAYERS:-32}" --out "$OUT/llama-e2e.json"
