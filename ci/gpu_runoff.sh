#!/usr/bin/env bash
# On the H100, one call: the run-offs of a committed manifest's database (issue 22's final
# head-to-head: where a kernel and a cuBLASLt algorithm are too close to order from their
# own runs, the kernel is timed again with the algorithm and torch interleaved in one
# process; cudal2.pipeline.runoff), the would-be winners memchecked through the build's
# gate, then the wheel packaged from the new database (--no-measure), checked against fp32
# (ci/check_wheel.py) and benched on the prefill shapes beside every vendor in one process
# (ci/gpu_prefill.sh with WHEEL):
#
#   bash ci/gpu_runoff.sh                                        (carry .whl: nvmath-python)
#
# STEM (default llm-public-h100): the manifest under manifests/. BENCH=0: no wheel, no
# bench. TESTS=1: first the worker's run-off GPU tests (tests/verify/test_runoff_gpu.py).
# DTYPES (default "fp16 bf16") and MODE (default offline) as ci/gpu_prefill.sh.
# Under $OUT: gpu.txt, gpu-tests.txt (TESTS=1), runoff.txt (the log), runoff.json (the
# summary: every run-off, the kernel's speed over the algorithm), $STEM.measurements.jsonl.gz
# (the committed database with the run-offs' records and check lines appended, nothing
# else: checked below; commit it over the committed file), then what ci/gpu_prefill.sh
# writes (wheel-check.*, prefill.jsonl, prefill-summary*.txt).
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
STEM=${STEM:-llm-public-h100}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.limit --format=csv | tee "$OUT/gpu.txt"
committed=$(committed_db "$STEM")
copy="$OUT/$STEM.measurements.jsonl"
zcat -f "$committed" > "$copy"
rc=0
if [ "${TESTS:-0}" = 1 ]; then
  step "gpu tests of the run-off job (the rival timed in the worker)"
  timeout 180 $PY -m pytest -m gpu tests/verify/test_runoff_gpu.py -q -p no:cacheprovider 2>&1 \
    | tail -15 | tee "$OUT/gpu-tests.txt" || rc=$?
fi

step "run-offs of $STEM, then the would-be winners memchecked"
timeout "${RUNOFF_TIMEOUT:-300}" $PY -m cudal2.pipeline.memcheck --runoff \
  --db "manifests/$STEM.toml" "$copy" --json "$OUT/runoff.json" 2>&1 \
  | tee "$OUT/runoff.txt" | noprogress | grep -v '^ \|^{\|^}' || rc=$?
rm -f "$copy.lock"

step "the copy is the committed file with measurement and check lines appended, nothing else"
size=$(zcat -f "$committed" | wc -c)
zcat -f "$committed" | cmp -s -n "$size" - "$copy" || { echo "ERROR: $copy does not begin with $committed"; exit 1; }
tail -c +"$((size + 1))" "$copy" | $PY -c '
import json, sys
lines = [json.loads(x) for x in sys.stdin if x.strip()]
checks = [x for x in lines if x.get("record") == "sanitizer_check"]
runoffs = [x for x in lines if "record" not in x]
assert len(checks) + len(runoffs) == len(lines), "a line that is neither check nor measurement"
rivals = [x for x in runoffs if any(k.startswith("cublaslt:") for k in x["baselines_us"])]
print(len(runoffs), "measurements appended,", len(rivals), "with their rival timed;",
      len(checks), "check lines")'

if [ "${BENCH:-1}" = 1 ] && [ "$rc" = 0 ]; then
  package_wheel "$OUT/job" "manifests/$STEM.toml" <(gzip -c "$copy")
  WHEEL=$WHEEL CHECK=1 DTYPES="${DTYPES:-fp16 bf16}" bash "$(dirname "$0")/gpu_prefill.sh" || rc=$?
  rm -rf "$OUT/job"
fi
echo "exit $rc"
exit "$rc"
