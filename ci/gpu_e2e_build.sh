#!/usr/bin/env bash
# Issue 21's end-to-end wheel on the H100: bench/manifests/llama-e2e-h100.toml (what
# patch_model runs for Llama-3.1-8B at decode 1/16/64 and the 2,048-token prefill and for
# Qwen2-7B at 1, epilogues = "auto", LM heads with the final norm folded), built on top of
# the layer wheel's recorded database (it covers the Llama decode targets at M 1, 16, 64;
# the prefill, the LM heads' rmsnorm and Qwen2-7B's are searched here), then the wheel is
# ready for ci/gpu_e2e_kv.sh:
#
#   bash ci/gpu_e2e_build.sh                                  # build
#   DB=.e2e-job/llama-e2e-h100.measurements.jsonl.gz bash ci/gpu_e2e_build.sh
#        (carry .e2e-job: a build cut short by BUILD_TIMEOUT resumes from its database)
#   WHEEL=.e2e-job/<wheel> bash ci/gpu_e2e_kv.sh             # the end to end (carry .e2e-job)
#
# Under $OUT: e2e-build.txt (the build log), llama-e2e-h100.measurements.jsonl.gz (the
# database), the wheel.
source "$(dirname "$0")/gpu_env.sh"
db=$OUT/llama-e2e-h100.measurements.jsonl
if [ -n "${DB:-}" ]; then
  gunzip -c "$DB" > "$db"
else
  gunzip -c bench/manifests/layer-epilogues-h100.measurements.jsonl.gz > "$db"
fi
step "build bench/manifests/llama-e2e-h100.toml ($(wc -l < "$db") records to start from)"
timeout "${BUILD_TIMEOUT:-540}" cudal2-build bench/manifests/llama-e2e-h100.toml \
  --measurements "$db" --out "$OUT/dist" --jobs "$(nproc)" 2>&1 | noprogress > "$OUT/e2e-build.txt"
rc=${PIPESTATUS[0]}
tail -14 "$OUT/e2e-build.txt"
echo "build exit $rc; records now $(wc -l < "$db")"
gzip -f "$db"
mv "$OUT"/dist/*.whl "$OUT/" 2>/dev/null; rm -rf "$OUT/dist"
exit "$rc"
