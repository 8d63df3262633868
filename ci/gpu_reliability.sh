#!/usr/bin/env bash
# On the H100, issue 17's GPU half in one call, most needed first (a call cut short
# still returns what is done):
#   1. ci/gpu_memcheck.sh: the committed tables' kernels memchecked, the verdicts
#      appended to copies of the databases ($OUT/*.measurements.jsonl.gz);
#   2. the default wheel built (no measuring) from the checked database, and
#      ci/gpu_table_check.py on it: tampered tables answer through the fallback, bit-exact
#      ($OUT/table-check.json, table-check.txt);
#   3. the runtime's GPU tests (the op registered as CompositeExplicitAutograd, the
#      arrays API): $OUT/runtime-gpu.txt.
#
#   CUDAL2_CACHE=.memcache PARALLEL=8 bash ci/gpu_reliability.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
rc=0
timeout "${MEMCHECK_TIMEOUT:-330}" bash ci/gpu_memcheck.sh > "$OUT/memcheck-run.txt" 2>&1 || rc=$?
tail -25 "$OUT/memcheck-run.txt"
source ci/gpu_env.sh
step "the default wheel from the checked database"
work=$(mktemp -d)
gunzip -c "$OUT/default.measurements.jsonl.gz" > "$work/default.jsonl"
cudal2-build manifests/default.toml --measurements "$work/default.jsonl" \
  --no-measure --out "$work/dist" 2>&1 | noprogress | tail -4 | tee "$OUT/default-build.txt"
step "tampered tables answer through the fallback on CUDA"
$PY ci/gpu_table_check.py "$work"/dist/*.whl --json "$OUT/table-check.json" \
  > "$OUT/table-check.txt" 2>&1 || rc=1
tail -4 "$OUT/table-check.txt"
step "the runtime's GPU tests"
timeout 200 $PY -m pytest -m gpu -q -p no:cacheprovider tests/packaging/runtime \
  > "$OUT/runtime-gpu.txt" 2>&1 || rc=1
tail -3 "$OUT/runtime-gpu.txt"
rm -rf "$work"
exit $rc
