#!/usr/bin/env bash
# Issue 20's layer benchmark with fused epilogues, on the H100: the wheel of
# bench/manifests/layer-epilogues-h100.toml built on top of the recorded llm-public
# database and its PDL records (so only the fused-epilogue targets are searched),
# then the layer benchmark (ci/gpu_layer.sh) with it.
#
#   bash ci/gpu_layer_build.sh                        # build (~8 min: measuring, memcheck)
#   DB=.layer-job/layer-epilogues-h100.measurements.jsonl.gz bash ci/gpu_layer_build.sh
#        (carry .layer-job: a build cut short by BUILD_TIMEOUT resumes from its database)
#   RECHECK=1 DB=... bash ci/gpu_layer_build.sh      # the would-be winners memchecked again
#   SPLITK_TESTS=1 bash ci/gpu_layer_build.sh         # sm90direct / sm90stream fused GPU tests first
#   WHEEL=.layer-job/<wheel> bash ci/gpu_layer.sh      # the layer benchmark (carry .layer-job)
#
# Under $OUT: layer-build.txt (the build log), layer-epilogues-h100.measurements.jsonl.gz
# (the database), the wheel, epilogue-tests.txt (with TESTS=1: the GPU tests of the
# gated and row-scaled epilogues first), epilogue-splitk-tests.txt (with SPLITK_TESTS=1:
# those of the sm90direct / sm90stream fused designs, ~5 min of nvcc and checks).
source "$(dirname "$0")/gpu_env.sh"
db=$OUT/layer-epilogues-h100.measurements.jsonl
if [ -n "${DB:-}" ]; then
  gunzip -c "$DB" > "$db"
else
  zcat manifests/llm-public-h100.measurements.jsonl.gz > "$db"
  gunzip -c bench/results/h100-llm-public-pdl.measurements.jsonl.gz >> "$db"
fi
if [ "${TESTS:-0}" = 1 ]; then
  step "GPU tests of the gated and row-scaled epilogues"
  timeout 300 $PY -m pytest -q -m gpu tests/verify/test_epilogue_gpu.py -k "gated or row_scaled" \
    -p no:cacheprovider 2>&1 | tail -8 | tee "$OUT/epilogue-tests.txt"
fi
if [ "${SPLITK_TESTS:-0}" = 1 ]; then
  # sm90direct / sm90stream fused designs (every epilogue, M 1-64, split 1 and 4, in
  # place, the PDL pair check, memcheck): the M = 1 seeds' families
  step "GPU tests of the sm90direct / sm90stream fused epilogues"
  timeout "${SPLITK_TEST_TIMEOUT:-540}" $PY -m pytest -q -m gpu tests/verify/test_epilogue_gpu.py \
    -k "splitk_family" -p no:cacheprovider 2>&1 | tail -8 | tee "$OUT/epilogue-splitk-tests.txt"
fi
if [ "${RECHECK:-0}" = 1 ]; then
  # Every would-be winner checked again, failures too: a clean check lifts a veto that a
  # harness fault recorded (the sanitizer's small target lost the epilogue before
  # verify/sanitizer.py kept it).
  step "memcheck --recheck of the would-be winners"
  timeout "${RECHECK_TIMEOUT:-300}" $PY -m cudal2.pipeline.memcheck --recheck --parallel 8 \
    --db bench/manifests/layer-epilogues-h100.toml "$db" --json "$OUT/memcheck.json" 2>&1 \
    | noprogress | tail -4
fi
step "build bench/manifests/layer-epilogues-h100.toml ($(wc -l < "$db") records to start from)"
timeout "${BUILD_TIMEOUT:-480}" cudal2-build bench/manifests/layer-epilogues-h100.toml \
  --measurements "$db" --out "$OUT/dist" --jobs "$(nproc)" 2>&1 | noprogress > "$OUT/layer-build.txt"
rc=${PIPESTATUS[0]}
tail -14 "$OUT/layer-build.txt"
echo "build exit $rc; records now $(wc -l < "$db")"
gzip -f "$db"
mv "$OUT"/dist/*.whl "$OUT/" 2>/dev/null; rm -rf "$OUT/dist"
exit "$rc"
