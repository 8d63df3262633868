#!/usr/bin/env bash
# Issue 20 item 3 on the H100: designs that leave room for the next kernel's CTAs
# (docs/kernels.md, "Designs that leave room"), measured against the same tiles without
# room. Compile on the CPU machine first and carry the job folder (git-ignored), so that
# this machine spends its minutes measuring:
#
#   python ci/room_job.py prepare                 # CPU, nvcc: .room-job/ (~370 designs)
#   bash ci/gpu_room.sh                           # here (carry .room-job, .whl)  < 9 min
#   STEPS=layer WHEEL=$OUT/<layer_room wheel> bash ci/gpu_room.sh    (carry the wheel)
#
# timing: the llm-public decode targets (M <= 256, fp16; bench/manifests/
#   llm-public-pdl-h100.toml): per target its incumbent tile and its fastest recorded tile
#   with room variants, each plain, with each PDL trigger, and with each legal room and
#   trigger (ci/room_job.py run; offline, a graph of back-to-back calls of one kernel).
# build: bench/manifests/layer-room-h100.toml on top of the layer's recorded database
#   (bench/manifests/layer-epilogues-h100.measurements.jsonl.gz): the layer's plain GEMMs
#   with the incumbents' room variants first; its wheel is the layer-with-room wheel.
# layer (a second call, ~4-5 min): the layer benchmark (ci/gpu_layer.sh) with that wheel,
#   the chain where room can pay; compare with bench/results/h100-layer.json.
#
# Under $OUT: room-run.txt (the timing log), room-timing.json (per target and tile: best
# PDL without room, best with each room, pdl_over_room), room.measurements.jsonl.gz and
# layer-room-h100.measurements.jsonl.gz (the records: with the committed corpus, the
# policy's retrain corpus, docs/policy.md), layer-room-build.txt, the wheel; with
# STEPS=layer, ci/gpu_layer.sh's files (layer.json, layer.md, layer-run.txt, gpu.txt).
# RUN_TIMEOUT (default 240 s) and BUILD_TIMEOUT (default 220 s) bound the two steps; a
# timing run cut short keeps its records and its summary of what it timed, and a build cut
# short resumes from its database (DB=.room-out/layer-room-h100.measurements.jsonl.gz).
source "$(dirname "$0")/gpu_env.sh"
STEPS=${STEPS:-timing build}
JOB=${JOB:-.room-job}
status=0
if [[ " $STEPS " == *" timing "* ]]; then
  [ -f "$JOB/job.json" ] || { echo "no $JOB/job.json: run python ci/room_job.py prepare on the CPU machine and carry $JOB" >&2; exit 2; }
  step "room timing ($($PY -c "import json, sys; print(len(json.load(open(sys.argv[1]))['jobs']))" "$JOB/job.json") jobs)"
  timeout "${RUN_TIMEOUT:-240}" $PY ci/room_job.py run --job "$JOB" --out "$OUT" 2>&1 \
    | noprogress > "$OUT/room-run.txt"
  rc=${PIPESTATUS[0]}
  tail -3 "$OUT/room-run.txt"
  echo "room timing: exit $rc"
  [ "$rc" -eq 0 ] || status=$rc
fi
if [[ " $STEPS " == *" build "* ]]; then
  db=$OUT/layer-room-h100.measurements.jsonl
  if [ -n "${DB:-}" ]; then
    gunzip -c "$DB" > "$db"
  else
    gunzip -c bench/manifests/layer-epilogues-h100.measurements.jsonl.gz > "$db"
  fi
  step "build bench/manifests/layer-room-h100.toml ($(wc -l < "$db") records to start from)"
  timeout "${BUILD_TIMEOUT:-220}" cudal2-build bench/manifests/layer-room-h100.toml \
    --measurements "$db" --out "$OUT/dist" --jobs "$(nproc)" 2>&1 | noprogress > "$OUT/layer-room-build.txt"
  rc=${PIPESTATUS[0]}
  grep -v "^H100\|^NVIDIA" "$OUT/layer-room-build.txt" | tail -12
  echo "build exit $rc; records now $(wc -l < "$db")"
  mv "$OUT"/dist/*.whl "$OUT/" 2>/dev/null; rm -rf "$OUT/dist"
  [ "$rc" -eq 0 ] || status=$rc
fi
if [[ " $STEPS " == *" layer "* ]]; then
  bash "$(dirname "$0")/gpu_layer.sh" || status=$?
fi
exit "$status"
