#!/usr/bin/env bash
# Issue 20, part 3 on the GPU: a real build searched with programmatic dependent launch
# (bench/manifests/pdl-decode-h100.toml: [search] pdl = true, the policy, 2 rounds of 16),
# measured on top of the recorded database of manifests/llama-3.1-8b-hf-h100.toml (its
# plain designs are reused, not measured again). Compiles here (this machine has nvcc).
#
#   bash ci/gpu_pdl_build.sh          (carry .whl)
#
# Under $OUT (4 files): pdl-build.txt (the build's log without progress lines),
# pdl-decode-h100.measurements.jsonl.gz (the database: the reused records and the new
# ones), dispatch.json (the built wheel's table), the wheel. About 4-6 minutes.
source "$(dirname "$0")/gpu_env.sh"
DB=$OUT/pdl-decode-h100.measurements.jsonl
cp manifests/llama-3.1-8b-hf-h100.measurements.jsonl "$DB"
step "build bench/manifests/pdl-decode-h100.toml ($(wc -l < "$DB") records to start from)"
timeout "${BUILD_TIMEOUT:-500}" cudal2-build bench/manifests/pdl-decode-h100.toml \
  --measurements "$DB" --out "$OUT/dist" --jobs "$(nproc)" 2>&1 | noprogress > "$OUT/pdl-build.txt"
rc=${PIPESTATUS[0]}
tail -40 "$OUT/pdl-build.txt"
echo "build exit $rc; records now $(wc -l < "$DB")"
whl=$(ls "$OUT"/dist/*.whl 2>/dev/null | head -1)
if [ -n "$whl" ]; then
  mv "$whl" "$OUT/"
  $PY - "$OUT/$(basename "$whl")" "$OUT/dispatch.json" <<'PYEOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if n.endswith("/dispatch.json"))
    open(sys.argv[2], "wb").write(z.read(name))
PYEOF
fi
rm -rf "$OUT/dist"
exit "$rc"
