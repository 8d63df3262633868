#!/usr/bin/env bash
# Issue 23, the measuring worker's job time: torch's graph kept per target, targets
# prepared while the worker waits for cubins, the worker's own seconds per job
# (verify/worker.py, verify/inputs.py; docs/measuring.md). On one GPU:
#   1. the worker's GPU tests (kept graph against one captured in the job, a kept graph
#      replayed after other tensors came and went, eviction; the batch with and without
#      the cache; the timing and adversarial tests, which run through the same code);
#   2. the llama build's stage table from an empty database and cache
#      (ci/gpu_build_stages.sh, NAME=after-worker, no job profile);
#   3. ci/job_profile.py on the database it made, twice: as the worker runs today, and
#      with each target prepared before its jobs (--prepare).
#
#   bash ci/gpu_worker_keep.sh
#
# Under $OUT: worker-gpu-tests.txt; after-worker-build.log, after-worker-wall.txt,
# after-worker-stages.json, after-worker.measurements.jsonl.gz (ci/gpu_build_stages.sh);
# job-phases-kept.json, job-phases-prepared.json (+ their -summary.txt).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
rc=0
step "worker GPU tests"
$PY -m pytest -m gpu -q -s -p no:cacheprovider tests/verify/test_inputs_gpu.py \
  tests/verify/test_timing_gpu.py tests/verify/test_adversarial_gpu.py \
  > "$OUT/worker-gpu-tests.txt" 2>&1 || rc=$?
grep -E "timing_capture|passed|failed|Error" "$OUT/worker-gpu-tests.txt" | tail -12

NAME=after-worker PROFILE=0 bash "$(dirname "$0")/gpu_build_stages.sh" || rc=$?
db=$OUT/after-worker.measurements.jsonl
[ -f "$db" ] || db=$db.gz
for how in kept prepared; do
  step "job profile ($how)"
  args=()
  [ "$how" = prepared ] && args=(--prepare)
  mkdir -p "$OUT/profile-$how"
  timeout "${PROFILE_TIMEOUT:-150}" $PY ci/job_profile.py "$db" --targets 6 --per-target 5 \
    --out "$OUT/profile-$how" "${args[@]}" 2>&1 | tail -12 | tee "$OUT/job-phases-$how-summary.txt"
  mv "$OUT/profile-$how/job-phases.json" "$OUT/job-phases-$how.json" 2>/dev/null || rc=1
  rm -rf "$OUT/profile-$how"
done
exit "$rc"
