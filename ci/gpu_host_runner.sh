#!/usr/bin/env bash
# Issue 23's host runner on the lent GPU machine: manifests/llama-3.1-8b-h100.toml built
# from an EMPTY database and an EMPTY artifact cache (nothing reused, every kernel
# compiled), all cores compiling, measured through the host runner (a worker process per
# visible GPU, verify/host.py), then the database checked: every job measured once.
#
#   bash ci/gpu_host_runner.sh                 # the host runner (~4-5 min on one H100)
#   RUNNER=local bash ci/gpu_host_runner.sh    # today's local runner: the "before" build
#   KILL=1 bash ci/gpu_host_runner.sh          # one measuring worker killed (kill -9) once,
#                                              # KILL_AFTER=30 s into the build; it must finish
#                                              # with every job recorded once
#
# Under $OUT (4 files): host-runner-<runner>[-kill].txt (the build log, raw: its progress
# lines carry elapsed seconds), the database (.measurements.jsonl.gz), the wheel, and
# host-runner-<runner>[-kill].json (wall time, the kill, the database check).
source "$(dirname "$0")/gpu_env.sh"
runner=${RUNNER:-host}
name=host-runner-$runner
[ "${KILL:-0}" = 1 ] && name=$name-kill
db=$OUT/$name.measurements.jsonl
log=$OUT/$name.txt
rm -f "$db" "$log"
# An empty artifact cache of its own: every kernel compiled in this build, as on a fresh host.
export CUDAL2_CACHE=$(mktemp -d /tmp/cudal2-cache-XXXX)
step "build manifests/llama-3.1-8b-h100.toml --runner $runner from an empty database and cache ($(nproc) cores, $(nvidia-smi -L | wc -l) GPUs)"
start=$(date +%s.%N)
timeout "${BUILD_TIMEOUT:-480}" cudal2-build manifests/llama-3.1-8b-h100.toml --runner "$runner" \
  --measurements "$db" --out "$OUT/dist" --jobs "$(nproc)" > "$log" 2>&1 &
bpid=$!
killed=""
if [ "${KILL:-0}" = 1 ]; then
  # timeout's child is the build's Python; its spawned children (spawn_main) are the
  # measuring workers. One is killed, once: its job is answered "worker died", a fresh
  # worker takes the next one.
  sleep "${KILL_AFTER:-30}"
  py=$(pgrep -P "$bpid" | head -1)
  victim=$(pgrep -P "$py" -f spawn_main | head -1)
  if [ -n "$victim" ]; then
    echo "kill -9 $victim (measuring worker of build $py) at $(date -u +%H:%M:%S)"
    kill -9 "$victim" && killed=$victim
  else
    echo "no measuring worker found to kill (build $py): children $(pgrep -P "$py" | tr '\n' ' ')"
  fi
fi
wait "$bpid"
rc=$?
wall=$(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $start}")
grep -v '/s\]\|s/[a-z]*\]' "$log" | tail -12
echo "build exit $rc; wall ${wall} s; records $(cat "$db" 2>/dev/null | wc -l)"
# The database check (ci/host_runner_check.py): every job measured once, every target's
# proposals present.
$PY ci/host_runner_check.py "$db" manifests/llama-3.1-8b-h100.toml --exit "$rc" --wall "$wall" \
  --runner "$runner" --killed "$killed" > "$OUT/$name.json"
check=$?
cat "$OUT/$name.json"
[ -f "$db" ] && gzip -f "$db"
mv "$OUT"/dist/*.whl "$OUT/" 2>/dev/null; rm -rf "$OUT/dist" "$CUDAL2_CACHE"
[ "$rc" = 0 ] && exit "$check"
exit "$rc"
