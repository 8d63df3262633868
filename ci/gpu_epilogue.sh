#!/usr/bin/env bash
# Issue 20's GPU half for fused epilogues (docs/kernels.md, "Fused epilogues"). Compile
# on the CPU machine first and carry the job folder (git-ignored), so that this machine
# spends its minutes measuring:
#
#   python ci/epilogue_job.py prepare         # CPU, nvcc: .epilogue-job/ (job.json, cubins/)
#   bash ci/gpu_epilogue.sh                   # here (carry .epilogue-job, and .whl if present)
#
#   python ci/epilogue_job.py prepare --set gated         # .epilogue-gated-job/
#   JOB=.epilogue-gated-job bash ci/gpu_epilogue.sh       # (carry .epilogue-gated-job)
#
# (a) the adversarial gemm_v3 fixtures (tests/verify/fixtures/adversarial.cu):
#     fx_pdl_residual_honest passes the pair check, fx_pdl_residual_early_read (reads
#     the residual before griddepcontrol.wait) is rejected;
# (b) the job: M 1, 16, 64 on Llama-3.1-8B's o_proj (4096x4096) and down_proj
#     (4096x14336), fp16 tn, two sm90tma designs each plain and with bias, residual,
#     bias_residual: the correctness suite (fp32 fused reference) and the offline timing
#     beside torch's unfused op.
#     The gated set (JOB=.epilogue-gated-job): M 1, 16, 64 on Llama-3.1-8B's qkv
#     (6144x4096, rmsnorm) and gate_up (28672x4096, rmsnorm_silu), fp16 and bf16, three
#     one-tile sm90tma designs each plain and fused, beside torch's RMSNorm + GEMM +
#     SiLU·mul; its adversarial tests are those of the gated and row-scaled epilogues
#     where the fixtures have them (-k "rmsnorm or gated or silu").
# With EPILOGUE_TESTS=1, first the GPU tests of the slice (kernels on residue shapes,
# in place, PDL pair check; linear_residual eager, graph, compile): several minutes of
# nvcc on this machine.
# Under $OUT (at most 5 files): epilogue-tests.txt, epilogue-run.txt (the log),
# epilogue-timing.json, epilogue.measurements.jsonl (the gated set: epilogue-gated-*). Nothing is committed from here:
# the figures go to bench/results/ by hand, after reading them. About 3 minutes.
source "$(dirname "$0")/gpu_env.sh"
JOB=${JOB:-.epilogue-job}
[ -f "$JOB/job.json" ] || { echo "no $JOB/job.json: run python ci/epilogue_job.py prepare on the CPU machine and carry $JOB" >&2; exit 2; }

SET=$($PY -c "import json, sys; print(json.load(open(sys.argv[1])).get('set', 'added'))" "$JOB/job.json")
TESTS=(tests/verify/test_adversarial_gpu.py -k "residual")
[ "$SET" = gated ] && TESTS=(tests/verify/test_adversarial_gpu.py tests/verify/test_epilogue_gpu.py -k "rmsnorm or gated or silu")
if [ "${EPILOGUE_TESTS:-0}" = 1 ]; then
  TESTS=(tests/verify/test_adversarial_gpu.py tests/verify/test_epilogue_gpu.py
         tests/packaging/runtime/test_linear_residual_gpu.py -k "residual or epilogue or fused")
fi
step "GPU tests (${TESTS[*]})"
timeout "${TEST_TIMEOUT:-900}" $PY -m pytest -q -m gpu "${TESTS[@]}" -p no:cacheprovider 2>&1 \
  | tail -25 | tee "$OUT/epilogue-tests.txt"
tests=${PIPESTATUS[0]}

step "correctness and timing, set $SET ($($PY -c "import json, sys; print(len(json.load(open(sys.argv[1]))['jobs']))" "$JOB/job.json") jobs)"
timeout "${RUN_TIMEOUT:-300}" $PY ci/epilogue_job.py run --job "$JOB" --out "$OUT" 2>&1 \
  | noprogress > "$OUT/epilogue-run.txt"
run=${PIPESTATUS[0]}
tail -3 "$OUT/epilogue-run.txt"
echo "tests: exit $tests; job: exit $run"
[ "$tests" -eq 0 ] && [ "$run" -eq 0 ]
