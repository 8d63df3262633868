#!/usr/bin/env bash
# The schema-2 artifact mapping of the committed databases, on a machine with many
# cores (the lent GPU machine: 16; no GPU is used). Needs, in .mig/: an install of the
# pre-migration commit's package (old-site/), its compile script (compile_old.py) and
# the cuobjdump/nvdisasm the CPU tests use (sassbin/, pip's nvidia-cuda-cuobjdump and
# -nvdisasm), so the SASS digests it records are the ones CI recomputes. Resumes from
# .cache/ when run again on the same machine. Writes $OUT/migration-schema2.json.gz.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvcc --version | tail -1
(cd /tmp && python3 -c "import cudal2.migrate") 2>/dev/null || python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v "WARNING: Running pip" || true
export PATH=$PWD/.mig/sassbin:$PATH
files=(manifests/*.measurements.jsonl bench/results/*.measurements.jsonl* policy/data/*corpus.jsonl.gz)
[ -f .cache/old-builds.json ] || PYTHONPATH=$PWD/.mig/old-site python3 .mig/compile_old.py . .cache/cache-old .cache/old-builds.json
python3 bench/experiments/migrate_schema2.py --jobs "$(nproc)" --old-builds .cache/old-builds.json \
  --old-cache .cache/cache-old --new-cache .cache/cache-new --out "$OUT/migration-schema2.json.gz" "${files[@]}"
