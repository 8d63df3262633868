#!/usr/bin/env bash
# Issue 20's layer benchmark (docs/inference.md, "The layer benchmark"): one whole
# decoder layer of Llama-3.1-8B and of Llama-3.1-70B's tensor-parallel-8 shard, in decode
# (M = 1, 16, 64 sequences, fp16 and bf16, attention over a 1,024-token KV cache), as CUDA
# graphs of back-to-back layers: the vendor layer against the same layer through a cudal2
# wheel built on the CPU machine and carried in (llm-public-h100 covers both models'
# GEMMs, fp16 and bf16):
#
#   cudal2-build manifests/llm-public-h100.toml --out .layer/dist              # CPU
#   WHEEL=.layer/dist/llm_public_h100-0.1.0-*.whl bash ci/gpu_layer.sh   (carry .layer, .whl)
#
# Under $OUT (4 files): gpu.txt (GPU, clocks, torch, the package's launcher and fused ops),
# layer.json (the results: commit as bench/results/h100-layer.json, then add the
# layer-bench block to docs/inference.md and run cudal2-bench report), layer.md (the
# table), layer-run.txt (the log). layer.json is rewritten after every case, so a run cut
# short by RUN_TIMEOUT (default 330 s) keeps the cases it finished. REPS (default 100) sets
# the timed repetitions (a replay is ~0.5 ms: timing is seconds; the 12 cases' time goes to
# torch.compile and setup). On the H100 the 12 cases take about 1 minute (2026-11-24).
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
[ -n "${WHEEL:-}" ] && [ -f "$WHEEL" ] || { echo "WHEEL=path/to/the/carried.whl is required" >&2; exit 2; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
$PY -m pip install -q --no-deps --force-reinstall "$WHEEL" 2>&1 | grep -v "WARNING: Running pip as" || true
PKG=$(python3 -c "import sys, zipfile; print(next(n.split('/')[0] for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.endswith('/__init__.py')))" "$WHEEL")
$PY - "$PKG" <<'PYEOF' | tee -a "$OUT/gpu.txt"
import importlib, sys, torch
from cudal2.bench.layer import fusions
pkg = importlib.import_module(sys.argv[1])
print("torch", torch.__version__, "| cuda", torch.version.cuda, "| package", pkg.__name__,
      pkg.__version__, "| launcher", pkg._api.launcher, pkg._api.native_reason or "")
print("fused ops:", fusions(pkg))
PYEOF

step "layer benchmark: 2 models x fp16, bf16 x M 1, 16, 64 (one line per case)"
set +e
timeout "${RUN_TIMEOUT:-330}" $PY -m cudal2.cli.bench layer --package "$PKG" \
  --m 1 16 64 --dtype fp16 bf16 --reps "${REPS:-100}" \
  --out "$OUT/layer.json" --markdown "$OUT/layer.md" 2>&1 | tee "$OUT/layer-run.txt"
rc=${PIPESTATUS[0]}
set -e
exit "$rc"
