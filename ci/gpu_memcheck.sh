#!/usr/bin/env bash
# On the H100: compute-sanitizer memcheck of every kernel the committed manifests'
# CPU-built tables ship (default, llm-public-h100, grid-sample-h100,
# llama-3.1-8b-hf-h100: every kernel entry, and llama-3.1-8b-hf-h100's eager
# alternatives, which ship kernels too; memcheck.json counts them), the checks appended
# to copies of their committed databases. No kernel ships without a clean check on
# record (docs/measuring.md), and the committed databases hold these checks (the latest
# runs' summaries: bench/results/h100-memcheck-*.json).
#
#   bash ci/gpu_memcheck.sh            (PARALLEL=4 memchecks at a time, TIMEOUT=180 s each;
#                                     CUDAL2_CACHE=DIR: compiled kernels carried along)
#
# Under $OUT: gpu.txt, memcheck-tests.txt (the adversarial control: memcheck passes the
# honest fixture and catches the out-of-bounds one on this machine), memcheck.txt (the
# log), memcheck.json (per manifest: kernel entries before the rule and now, checked,
# failed, waiting, unchanged) and the four databases, gzipped. Each is the committed
# file (gunzipped where it ships as .gz) with only check lines appended (checked below);
# to commit them:
#   gunzip -c <files>/default.measurements.jsonl.gz > manifests/default.measurements.jsonl
# (and the same for the other plain ones; llm-public-h100's: cp -f, it ships gzipped), then
# the CPU tables are those of before the rule. A manifest's [build] reuse databases are
# read beside its own; the checks go into its own.
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
STEMS=(default llm-public-h100 grid-sample-h100 llama-3.1-8b-hf-h100)

step "environment"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
compute-sanitizer --version 2>/dev/null | tail -1 || echo "compute-sanitizer: $($PY -c 'from cudal2.verify.sanitizer import find_sanitizer; print(find_sanitizer())')"

step "control (beside the checks): memcheck catches an out-of-bounds write here, and passes the honest kernel"
timeout 240 $PY -m pytest -m gpu tests/verify/test_adversarial_gpu.py -q -p no:cacheprovider \
  -k "out_of_bounds_write_fails_memcheck" > "$OUT/memcheck-tests.txt" 2>&1 &
control=$!

step "memcheck of the kernels the committed tables ship"
args=()
for stem in "${STEMS[@]}"; do
  zcat -f "$(committed_db "$stem")" > "$OUT/$stem.measurements.jsonl"
  args+=(--db "manifests/$stem.toml" "$OUT/$stem.measurements.jsonl")
done
set +e  # the summary lines (stdout) and the log (stderr, less JSON and progress bars)
/usr/bin/time -f "memcheck wall time %e s" $PY -m cudal2.pipeline.memcheck "${args[@]}" \
  --parallel "${PARALLEL:-4}" --timeout "${TIMEOUT:-180}" --json "$OUT/memcheck.json" \
  2>&1 | tee "$OUT/memcheck.txt" | noprogress | grep -v '^ \|^{\|^}'
rc=${PIPESTATUS[0]}
set -e
rm -f "$OUT"/*.measurements.jsonl.lock

step "the copies are the committed files with check lines appended, nothing else"
for stem in "${STEMS[@]}"; do
  committed=$(committed_db "$stem")
  copy="$OUT/$stem.measurements.jsonl"
  size=$(zcat -f "$committed" | wc -c)
  if zcat -f "$committed" | cmp -s -n "$size" - "$copy" && \
     tail -c +"$((size + 1))" "$copy" | $PY -c '
import json, sys
lines = [json.loads(x) for x in sys.stdin if x.strip()]
assert all(x.get("record") == "sanitizer_check" for x in lines), "a line that is no check"
events = [x["event"] for x in lines]
print(sys.argv[1] + ":", len(lines), "check lines appended:", events.count("clean"), "clean,",
      events.count("failed"), "failed,", events.count("started"), "started")' "$stem"
  then :; else
    echo "ERROR: $copy is not $committed plus check lines"; rc=1
  fi
done
step "the control"
control_rc=0
wait "$control" || control_rc=$?
tail -3 "$OUT/memcheck-tests.txt"
[ "$control_rc" = 0 ] || { echo "ERROR: the memcheck control failed (see memcheck-tests.txt)"; rc=1; }
exit $rc
