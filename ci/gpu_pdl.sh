#!/usr/bin/env bash
# Issue 20's GPU half: programmatic dependent launch checked and timed (docs/kernels.md,
# "Programmatic dependent launch"). Compile on the CPU machine first and carry the
# job folder (git-ignored), so that this machine spends its minutes measuring:
#
#   python ci/pdl_job.py prepare              # CPU, nvcc: .pdl-job/ (job.json, cubins/)
#   bash ci/gpu_pdl.sh                        # here (carry .pdl-job, and .whl if present)
#
# (a) the adversarial fixtures (tests/verify/fixtures/adversarial.cu): fx_pdl_honest
#     passes the pair check, fx_pdl_early_read and fx_pdl_early_write are rejected;
# (b) the pair sample (every kernel of every family, triggers in turn) and the timing set
#     (M 1, 16, 64 on 4096x4096, 14336x4096, 4096x14336 fp16: each target's recorded
#     best kernel plain and with each trigger), offline (a graph of back-to-back calls).
# Under $OUT (5 files): pdl-adversarial.txt, pdl-run.txt (the log), pdl-pair.json,
# pdl-timing.json, pdl.measurements.jsonl.gz. Nothing is committed from here: the
# figures go to bench/results/ by hand, after reading them. About 3-4 minutes.
source "$(dirname "$0")/gpu_env.sh"
JOB=${JOB:-.pdl-job}
[ -f "$JOB/job.json" ] || { echo "no $JOB/job.json: run python ci/pdl_job.py prepare on the CPU machine and carry $JOB" >&2; exit 2; }

step "adversarial fixtures (pytest -m gpu, the PDL cases)"
timeout 120 $PY -m pytest -q -m gpu tests/verify/test_adversarial_gpu.py -k "pdl or honest" \
  -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/pdl-adversarial.txt"
adv=${PIPESTATUS[0]}

step "pair sample and timing ($($PY -c "import json, sys; print(len(json.load(open(sys.argv[1]))['jobs']))" "$JOB/job.json") jobs)"
timeout "${RUN_TIMEOUT:-420}" $PY ci/pdl_job.py run --job "$JOB" --out "$OUT" 2>&1 \
  | noprogress > "$OUT/pdl-run.txt"
run=${PIPESTATUS[0]}
tail -3 "$OUT/pdl-run.txt"
echo "adversarial: exit $adv; pair sample and timing: exit $run"
[ "$adv" -eq 0 ] && [ "$run" -eq 0 ]
