#!/usr/bin/env bash
# Several GPU scripts in one device call, each with an OUT of its own under a folder that
# does not travel back, so that the call's limit of 8 files (docs/gpu.md, "What comes
# back") keeps what matters: after each step, its databases (gzipped) and JSON results
# are copied into $OUT as files of their own, named <step>-<file>, and the rest of it
# (logs, SASS counts; not wheels) goes into one <step>-logs.tgz. A step that fails does
# not stop the next; the exit status is the first failing step's.
#
#   bash ci/gpu_steps.sh \
#     'fused: TESTS=rtma SEED_DB= bash ci/gpu_prefill_fused.sh' \
#     'tenth: SWEEP=bench/manifests/sweep-tma-v5-tenth-h100.toml BENCH=0 bash ci/gpu_prefill.sh'
#
# Each argument is "<step>: <command>" (the step a name of letters, digits, - and _).
# Three files a step at most come back when it writes one database and one JSON: keep a
# call to two steps (or three without JSON) to stay within the 8.
set -uo pipefail
OUT=${OUT:?OUT is the folder that comes back}
WORK=${STEPS_DIR:-/tmp/o}
for arg in "$@"; do  # every step well formed before any runs
  name=${arg%%:*}
  if ! [[ "$name" =~ ^[A-Za-z0-9_-]+$ ]] || [ "$name" = "$arg" ]; then
    echo "ci/gpu_steps.sh: '$arg' is not '<step>: <command>' (a step of letters, digits, - and _)" >&2
    exit 2
  fi
done
status=0
for arg in "$@"; do
  name=${arg%%:*}
  cmd=${arg#*:}
  dir="$WORK/$name"
  rm -rf "$dir" && mkdir -p "$dir"
  echo "=== step $name:$cmd"
  start=$(date +%s)
  OUT="$dir" bash -c "$cmd"
  rc=$?
  echo "=== step $name: exit $rc after $(( $(date +%s) - start )) s"
  [ "$rc" = 0 ] || [ "$status" != 0 ] || status=$rc
  find "$dir" -name '*.jsonl' -type f -exec gzip -f {} +
  find "$dir" -type f \( -name '*.jsonl.gz' -o -name '*.json' \) | while read -r f; do
    cp "$f" "$OUT/$name-$(basename "$f")"
  done
  (cd "$dir" && find . -type f ! -name '*.jsonl.gz' ! -name '*.json' ! -name '*.whl' -print0 \
    | tar czf "$OUT/$name-logs.tgz" --null -T -)
done
echo "=== back under \$OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
exit "$status"
