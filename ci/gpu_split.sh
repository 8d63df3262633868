#!/usr/bin/env bash
# Issue 18's split build, the GPU half: a measuring job exported on a CPU machine
# (cudal2-build --export-job, docs/ci.md) measured here by a cudal2 install that has no
# nvcc. The job folder is carried in (git-ignored):
#
#   cudal2-build bench/manifests/split-demo-h100.toml --gpu "NVIDIA H100 80GB HBM3" \
#     --export-job .split-job/split-demo          # on the CPU machine, with nvcc
#   JOB=.split-job/split-demo bash ci/gpu_split.sh   # here (carry .split-job and .whl)
#
# Under $OUT (3 files): split-env.txt (nvcc not found on PATH, the GPU, the job's
# sha256), split-measure.txt (the measuring log), split.measurements.jsonl.gz (the
# database to package from on the CPU machine: cudal2-build --no-measure).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
JOB=${JOB:-.split-job/split-demo}
PY=$(command -v "${PYTHON:-python3}")  # resolved before PATH loses any folder
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

# No nvcc: every PATH folder that holds one is dropped, and the proof is that the
# shell cannot find it (compute-sanitizer is still found by its absolute path).
PATH=$(tr ':' '\n' <<<"$PATH" | while read -r d; do [ -n "$d" ] && [ ! -x "$d/nvcc" ] && echo "$d"; done | paste -sd: -)
export PATH
if command -v nvcc; then echo "nvcc is still on PATH: not the test" >&2; exit 1; fi

# cudal2 from this tree, no package index (nvmath-python, for cuBLASLt, from .whl/).
$PY -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v "WARNING: Running pip as" || true
if [ -d .whl ] && ! $PY -c "import nvmath" 2>/dev/null; then
  $PY -m pip install -q --no-index --find-links .whl --no-deps nvmath-python 2>&1 | grep -v "WARNING: Running pip as" || true
fi

{
  echo "command -v nvcc: exit $(command -v nvcc >/dev/null; echo $?) (not found)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  $PY -c "import cudal2, shutil; print('cudal2', cudal2.__version__, '| nvcc:', shutil.which('nvcc'))"
  sha256sum "$JOB/job.json"
  echo "cubins: $(ls "$JOB/cubins" | wc -l), $(du -sh "$JOB" | cut -f1)"
} 2>&1 | tee "$OUT/split-env.txt"

db="$OUT/split.measurements.jsonl"
rm -f "$db" "$db.gz"
start=$(date +%s)
timeout "${MEASURE_TIMEOUT:-100}" $PY -m cudal2.cli.build --measure-job "$JOB" --measurements "$db" \
  > "$OUT/split-measure.txt" 2>&1
rc=$?
echo "exit $rc, $(( $(date +%s) - start )) s wall; records: $(cat "$db" 2>/dev/null | wc -l)" >> "$OUT/split-measure.txt"
tail -8 "$OUT/split-measure.txt"
[ -f "$db" ] && gzip -f "$db"
exit $rc
