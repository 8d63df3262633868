# Sourced by the ci/gpu_*.sh scripts: the repository as working directory, $OUT, the
# artifact cache, and cudal2 + nvmath-python installed (from .whl/ where there is no
# package index, as on the lent GPU machine; see docs/gpu.md).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
# $OUT gives back files of up to 16 MiB (the llm-public database is larger): every
# database written there comes back gzipped when the script exits.
trap 'for f in "$OUT"/*.measurements.jsonl; do [ -f "$f" ] && gzip -f "$f"; done' EXIT
export PYTHONUNBUFFERED=1
export CUDAL2_CACHE=${CUDAL2_CACHE:-$PWD/.cache/artifacts}
PY=${PYTHON:-python3}
if [ -d .whl ]; then FIND=(--no-index --find-links .whl); else FIND=(); fi
(cd /tmp && $PY -c "import cudal2.generator") 2>/dev/null || $PY -m pip install -q "${FIND[@]}" --no-build-isolation -e . 2>&1 | grep -v "WARNING: Running pip as" || true
$PY -c "import nvmath" 2>/dev/null || $PY -m pip install -q "${FIND[@]}" --no-deps nvmath-python 2>&1 | grep -v "WARNING: Running pip as" || true
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
committed_db() {  # the committed database of manifest stem $1: plain, else gzipped
  local plain="manifests/$1.measurements.jsonl"
  [ -f "$plain" ] && echo "$plain" || echo "$plain.gz"
}
noprogress() { grep -v '/s\]\|s/[a-z]*\]' || true; }  # tqdm lines
quiet() { noprogress | grep -v '^H100\|^NVIDIA' || true; }  # nor per-target table rows
# package_wheel JOB MANIFEST DB.gz...: the manifest's wheel packaged into JOB/ (--no-measure,
# with the native launcher against this machine's torch) from the committed databases, once
# (a warm machine's JOB/ keeps it); WHEEL is then its path. The log: $OUT/wheel-build.txt.
package_wheel() {
  local job=$1 manifest=$2
  shift 2
  mkdir -p "$job"
  if ! ls "$job"/*.whl >/dev/null 2>&1; then
    step "package $manifest (--no-measure)"
    zcat -f "$@" > "$job/db.jsonl"
    cudal2-build "$manifest" --measurements "$job/db.jsonl" --no-measure --out "$job" 2>&1 \
      | noprogress > "$OUT/wheel-build.txt"
    tail -5 "$OUT/wheel-build.txt"
  fi
  WHEEL=$(ls "$job"/*.whl | head -1)
}
# SASS counts of one cubin: symbol, HMMA, HGMMA, local-memory loads/stores.
sass_counts() {
  local sass sym
  sass=$(cuobjdump -sass "$1")
  sym=$(grep -o 'hgemm_[a-z0-9_]*' <<<"$sass" | head -1)
  printf "%-80s %6d %6d %6d\n" "$sym" "$(grep -c ' HMMA' <<<"$sass")" \
    "$(grep -c ' HGMMA' <<<"$sass")" "$(grep -cE ' (LDL|STL)' <<<"$sass")"
}
export -f sass_counts
# sass_table CUBIN... > FILE: one row per cubin, then a one-line summary on stdout.
sass_table() {
  printf "%-80s %6s %6s %6s\n" kernel HMMA HGMMA LDL/STL
  printf "%s\n" "$@" | xargs -P "$(nproc)" -I{} bash -c 'sass_counts {}' | sort
}
sass_summary() {
  awk 'NR>1 {n++; if ($2>0) h++; if ($3>0) g++; if ($4>0) s++} END {printf "%d kernels: %d with HMMA, %d with HGMMA, %d with local-memory loads/stores\n", n, h, g, s}' "$1"
}
# ncu_setup: the GPU's state into $OUT/gpu.txt, and NCU the Nsight Compute found (exit 2
# where there is none).
ncu_setup() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.limit \
    --format=csv | tee "$OUT/gpu.txt"
  NCU=$($PY -c "from cudal2.verify.profile import find_ncu; print(find_ncu() or '')")
  [ -n "$NCU" ] || { echo "ncu not found"; exit 2; }
}
# check_wheel WHEEL: the wheel installed into a private folder (removed however the check
# ends) and its matmul/linear checked against an fp32 reference on every table shape plus
# random off-table shapes (ci/check_wheel.py), from an empty folder so that the checkout's
# cudal2 cannot stand in for the wheel: $OUT/wheel-check.{json,txt}.
check_wheel() {
  (
    SITE=$(mktemp -d "${TMPDIR:-/tmp}/cudal2-wheel.XXXXXX")
    trap 'rm -rf -- "$SITE"' EXIT
    $PY -m pip install -q "${FIND[@]}" --target "$SITE" --no-deps "$1"
    $PY -m pip install -q "${FIND[@]}" --dry-run "$1" >/dev/null 2>&1 \
      && echo "wheel requirements satisfied by this environment" \
      || echo "NOTE: wheel requirements not all installed here (installed with --no-deps)"
    REPO=$PWD WHEEL=$(realpath "$1") OUT=$(realpath "$OUT")
    cd "$(mktemp -d "$SITE/run.XXXXXX")"
    PYTHONPATH="$SITE" $PY "$REPO/ci/check_wheel.py" "$WHEEL" --json "$OUT/wheel-check.json" 2>&1 \
      | tee "$OUT/wheel-check.txt"
  )
}
