#!/usr/bin/env bash
# Issue 23, before and after on one machine: ci/gpu_build_stages.sh (the llama manifest
# from an empty database and cache, its stage table) with the code before a change and
# with it, alternated on the same GPU, so both see the same host and the same warm-up.
# The code before is this tree with PATCH (a diff of the change, made in a clone with
# git) taken back out, in place, for each "before" build, and put back after it:
#
#   git diff <before> <after> -- cudal2/pipeline policy/learned.py > ab.patch   # in the tree
#   PATCH=ab.patch ORDER="before after after before" bash ci/gpu_build_ab.sh
#
# (the patch is an untracked file of the tree, so it travels to the GPU machine; it is
# not committed). Each build's files are gpu_build_stages.sh's, named <side>-<i> (e.g.
# before-1, after-2), all in $OUT/ab.tgz; ARGS as there (default "--runner host").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
PATCH=${PATCH:?PATCH=a diff of the change (git diff BEFORE AFTER -- paths) is required}
patch -p1 --dry-run -R -s < "$PATCH" || { echo "$PATCH does not come out of this tree"; exit 2; }
restore() { patch -p1 -s < "$PATCH"; }
i=0
rc=0
for side in ${ORDER:-before after before after}; do
  i=$((i + 1))
  if [ "$side" = before ]; then patch -p1 -R -s < "$PATCH" || exit 2; trap restore EXIT; fi
  NAME="$side-$i" ARGS="${ARGS:---runner host}" PROFILE=0 PASSES=0 bash ci/gpu_build_stages.sh \
    > "$OUT/$side-$i-script.txt" 2>&1 || rc=$?
  if [ "$side" = before ]; then restore; trap - EXIT; fi
  tail -1 "$OUT/$side-$i-wall.txt"
done
# A call gives back only so many files (the first A/B call lost all but one build's):
# everything under $OUT in one archive, ab.tgz, the wheels and lock files left out.
(cd "$OUT" && find . -maxdepth 1 -type f ! -name ab.tgz ! -name .ab-list ! -name '*.whl' ! -name '*.lock' \
  -printf '%P\n' | sort > .ab-list && tar czf ab.tgz -T .ab-list && xargs rm -f < .ab-list \
  && rm -f .ab-list ./*.whl ./*.lock)
exit "$rc"
