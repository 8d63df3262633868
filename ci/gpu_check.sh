#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: the gpu-marked tests, then an end-to-end
# `cudal2-build` of a manifest, the wheel installed, and its matmul/linear checked
# against an fp32 reference on every table shape plus random off-table shapes.
# Everything worth keeping lands under $OUT (default ./out).
#
#   bash ci/gpu_check.sh [MANIFEST]          (default: manifests/default.toml)
#
# Where there is no package index (the lent GPU machine), missing wheels come from
# .whl/ (see docs/gpu.md).
set -euo pipefail
MANIFEST=${1:-manifests/default.toml}
source "$(dirname "$0")/gpu_env.sh"
STEM=$(basename "$MANIFEST" .toml)

step "environment"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
nvcc --version | tail -1
$PY -m pip list 2>/dev/null | grep -iE "^(torch|cuda-python|cuda-bindings|jinja2|wheel|tqdm|transformers|pytest) " || true

step "installed"
$PY -c "import cudal2, cudal2.packaging.runtime.driver, nvmath; print('cudal2', cudal2.__version__, 'nvmath', nvmath.__version__)"

step "gpu tests"
tests_rc=0
$PY -m pytest -m gpu tests -q -p no:cacheprovider > "$OUT/gpu-tests.txt" 2>&1 || tests_rc=$?
tail -15 "$OUT/gpu-tests.txt"

step "cudal2-build $MANIFEST"
DB="$OUT/$STEM.measurements.jsonl"
[ -f "manifests/$STEM.measurements.jsonl" ] && cp "manifests/$STEM.measurements.jsonl" "$DB"
/usr/bin/time -f "build wall time %e s" cudal2-build "$MANIFEST" --measurements "$DB" --out "$OUT/dist" 2>&1 \
  | tee "$OUT/build.txt" | grep -v "it/s\]\|s/it\]" | tail -60

step "Nsight Compute metrics of three recorded kernels (the CPU tests' fixture)"
$PY ci/record_ncu.py "$OUT/ncu" 2>&1 | tail -30 || echo "NOTE: profiling failed"

step "SASS of every compiled kernel (tensor-core instructions, local-memory spills)"
mapfile -t cubins < <(ls "$CUDAL2_CACHE"/*/*/kernel.cubin)
sass_table "${cubins[@]}" > "$OUT/sass.txt"
sass_summary "$OUT/sass.txt"

step "install the wheel and check it"
WHEEL=$(ls "$OUT"/dist/*.whl | head -1)
check_wheel "$WHEEL"
exit $tests_rc
