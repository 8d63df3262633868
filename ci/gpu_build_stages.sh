#!/usr/bin/env bash
# Issue 23's baseline: where a build's seconds go on the one H100. A build of
# manifests/llama-3.1-8b-h100.toml (24 targets, the policy, 4 rounds of 8, ncu on each
# round's best, cuBLASLt autotuning) from an EMPTY database and an EMPTY artifact cache,
# its log time-stamped line by line (seconds since the start); then ci/job_profile.py on
# the database it made (the measure jobs re-run in one process, each phase timed).
#
#   NAME=before bash ci/gpu_build_stages.sh          # today's build
#   NAME=after ARGS="--runner host" bash ci/gpu_build_stages.sh
#   NAME=after3 ARGS="--runner host" PROFILE=0 bash ci/gpu_build_stages.sh   # third slice
#   NAME=after8 ARGS="--runner host" PROFILE=0 PASSES=0 bash ci/gpu_build_stages.sh
#                      # search.profile_lag = 1 (the default: ncu beside the next round's
#                      # proposing and compiling); "--runner host --profile-lag 0": as before
#   PROFILE=0 ...                                    # no job profile
#
# Under $OUT: $NAME-build.log, $NAME.measurements.jsonl.gz, $NAME-wall.txt, the wheel,
# $NAME-stages.json (the build's stage table, where the build writes one: since the
# third slice with the "record" stage and "measure_split", the measure stage's seconds
# in the jobs and outside them), $NAME-ncu.txt (each Nsight Compute call's line: its
# runs' seconds, ncu's replay passes per kernel, the child's phases),
# $NAME-profile-metrics.txt (which ncu_* keys the build's records carry, how many each),
# ncu-passes.json / ncu-passes.txt (ci/ncu_passes.py; PASSES=0: not run),
# job-phases.json / job-profile.txt / job-profile-summary.txt.
source "$(dirname "$0")/gpu_env.sh"
NAME=${NAME:-before}
MANIFEST=${MANIFEST:-manifests/llama-3.1-8b-h100.toml}
export CUDAL2_CACHE=$(mktemp -d /tmp/cudal2-cache.XXXXXX)
db=$OUT/$NAME.measurements.jsonl
: > "$db"
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee "$OUT/$NAME-gpu.txt"
step "build $MANIFEST from an empty database and cache ($NAME ${ARGS:-})"
t0=$(date +%s.%N)
timeout "${BUILD_TIMEOUT:-480}" cudal2-build "$MANIFEST" --measurements "$db" --out "$OUT/dist" \
  --jobs "$(nproc)" ${ARGS:-} 2>&1 \
  | $PY -u -c "import sys,time; t0=time.monotonic(); [print(f'{time.monotonic()-t0:8.1f} {l}', end='', flush=True) for l in sys.stdin]" \
  > "$OUT/$NAME-build.log"
rc=${PIPESTATUS[0]}
t1=$(date +%s.%N)
echo "build exit $rc, wall $(python3 -c "print(round($t1-$t0,1))") s, records $(wc -l < "$db")" | tee "$OUT/$NAME-wall.txt"
grep -v "^ *[0-9.]* H100\|NVIDIA H100 80GB HBM3 *|" "$OUT/$NAME-build.log" | tail -25
mv "$OUT"/dist/*.whl "$OUT/" 2>/dev/null; rm -rf "$OUT/dist"
# The build's own stage table (cudal2/pipeline/stages.py), cut out of its JSON log line
# (a build from before the table has none: no file).
grep -o '{"stages_s".*' "$OUT/$NAME-build.log" | tail -1 > "$OUT/$NAME-stages.json" || true
[ -s "$OUT/$NAME-stages.json" ] || rm -f "$OUT/$NAME-stages.json"
# Nsight Compute: each call's line (seconds, passes per kernel), and what was recorded
grep -E '^ *[0-9.]+ (ncu: |round [0-9]+/[0-9]+: not profiled|profiling [0-9]+ candidates)' \
  "$OUT/$NAME-build.log" > "$OUT/$NAME-ncu.txt" || true
$PY - "$db" > "$OUT/$NAME-profile-metrics.txt" <<'PYEOF' || true
import collections, json, sys
keys = collections.Counter()
for line in open(sys.argv[1]):
    rec = json.loads(line)
    keys.update(k for k in (rec.get("metrics") or {}) if k.startswith("ncu_"))
print(json.dumps(dict(sorted(keys.items())), indent=1))
PYEOF
cat "$OUT/$NAME-ncu.txt" "$OUT/$NAME-profile-metrics.txt" 2>/dev/null | tail -12
# What each set of Nsight Compute quantities costs in replay passes (ci/ncu_passes.py:
# the search's set, each of its quantities alone, all seven), after the build: its wall
# is not the build's. PASSES=0 skips it.
if [ "${PASSES:-1}" = 1 ]; then
  step "ncu passes per quantity set"
  timeout "${PASSES_TIMEOUT:-300}" $PY ci/ncu_passes.py "$OUT" 2>&1 | tail -8 | tee "$OUT/ncu-passes.txt"
fi
if [ "${PROFILE:-1}" = 1 ]; then
  step "job profile"
  timeout "${PROFILE_TIMEOUT:-150}" $PY ci/job_profile.py "$db" --targets 6 --per-target 5 --out "$OUT" \
    2>&1 | tail -12 | tee "$OUT/job-profile-summary.txt"
fi
exit "$rc"
