#!/usr/bin/env bash
# On the H100, one call: llm-public wheels benched round-robin on the prefill shapes, each
# beside every vendor in one process (cudal2-bench, fp16 and bf16, offline and server),
# ROUNDS times in the order A B [C ...] A B ...: what a selection change gains, beyond
# the drift between runs (issue 22's run-offs: docs/kernels.md).
#
#   WHEELS="dist/A/<wheel> dist/B/<wheel>" bash ci/gpu_wheel_ab.sh   (carry .whl and dist)
#   LINES_A=7337 bash ci/gpu_wheel_ab.sh                              (carry .whl)
#
# WHEELS: wheels packaged elsewhere (cudal2-build MANIFEST --no-measure), labelled A, B,
# ... in order; an entry ending in .toml is a manifest whose wheel is packaged here from
# the database beside it (<stem>.measurements.jsonl), else from STEM's committed database
# (e.g. the manifest and database as they were before a change, kept in dist/).
# MEMCHECK=1: first the would-be winners of STEM's committed database memchecked (python
# -m cudal2.pipeline.memcheck on a copy, returned gzipped with its check lines: commit
# it), and the wheel packaged from that copy benched last. Else two packaged here: A from
# the committed database of STEM (default llm-public-h100) cut to its first LINES_A lines
# (the database before lines appended to it, e.g. the run-offs), B from the whole of it. ROUNDS (default 2). SHAPES (default
# bench/shapes/llm-public-prefill.toml): the bench's shapes file, e.g.
# bench/shapes/cuda-l2-grid-sample.toml with STEM=grid-sample-h100. MODE (default both):
# offline or server only. SETTLE_MS (default 0): the bench's --settle-ms, each shape timed
# in the clock state a sustained run holds (docs/measuring.md). Under $OUT: gpu.txt,
# prefill-<label>-<round>.jsonl (bench rows), ab-summary.txt (`cudal2-bench summarize
# --m-min 1024 --json` per file, dtype and mode).
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
STEM=${STEM:-llm-public-h100}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.limit --format=csv | tee "$OUT/gpu.txt"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
if [ -n "${WHEELS:-}" ]; then
  read -r -a wheels <<<"$WHEELS"
  for i in "${!wheels[@]}"; do  # a manifest: its wheel packaged here (module doc)
    if [ "${wheels[$i]%.toml}" != "${wheels[$i]}" ]; then
      db="${wheels[$i]%.toml}.measurements.jsonl"
      [ -f "$db" ] || db=$(committed_db "$STEM")
      package_wheel "$scratch/w$i" "${wheels[$i]}" "$db"
      wheels[$i]=$WHEEL
    fi
  done
else
  LINES_A=${LINES_A:?WHEELS="<wheels>" or LINES_A=<lines of the committed database for wheel A>}
  db=$(committed_db "$STEM")
  zcat -f "$db" | awk -v n="$LINES_A" "NR <= n" | gzip > "$scratch/a.jsonl.gz"  # (head: SIGPIPE)
  package_wheel "$scratch/a" "manifests/$STEM.toml" "$scratch/a.jsonl.gz"
  wheels=("$WHEEL")
  package_wheel "$scratch/b" "manifests/$STEM.toml" "$db"
  wheels+=("$WHEEL")
fi
if [ "${MEMCHECK:-0}" = 1 ]; then  # the would-be winners checked, and that wheel benched last
  db=$(committed_db "$STEM")
  copy="$OUT/$STEM.measurements.jsonl"
  zcat -f "$db" > "$copy"
  step "memcheck of the would-be winners of $STEM (checks appended to a copy)"
  timeout 240 $PY -m cudal2.pipeline.memcheck --db "manifests/$STEM.toml" "$copy" \
    --json "$OUT/memcheck.json" 2>&1 | noprogress | grep -v '^ \|^{\|^}' | tail -5 \
    || echo "memcheck: exit $? (1: some would-be winner could not be checked)"
  rm -f "$copy.lock"
  gzip -c "$copy" > "$scratch/checked.jsonl.gz"
  package_wheel "$scratch/checked" "manifests/$STEM.toml" "$scratch/checked.jsonl.gz"
  wheels+=("$WHEEL")
fi
labels=(A B C D E F)
rc=0
for round in $(seq "${ROUNDS:-2}"); do
  for i in "${!wheels[@]}"; do
    w=${labels[$i]}
    step "round $round: wheel $w (${wheels[$i]})"
    timeout 240 cudal2-bench "${SHAPES:-bench/shapes/llm-public-prefill.toml}" --kernels "${wheels[$i]}" \
      --mode "${MODE:-both}" --settle-ms "${SETTLE_MS:-0}" --dtype fp16 bf16 \
      --out "$OUT/prefill-$w-$round.jsonl" 2>&1 | noprogress | tail -2 || rc=$?
    for dtype in fp16 bf16; do
      for mode in $([ "${MODE:-both}" = both ] && echo offline server || echo "$MODE"); do
        echo "$w $round $dtype $mode $(cudal2-bench summarize "$OUT/prefill-$w-$round.jsonl" \
          --m-min 1024 --mode "$mode" --dtype "$dtype" --json | tr -d '\n ')" | tee -a "$OUT/ab-summary.txt"
      done
    done
  done
done
echo "exit $rc"
exit "$rc"
