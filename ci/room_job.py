"""Issue 20 item 3 on the GPU: designs that leave room, timed against the same tiles
without room, in two halves (the pattern of ``ci/pdl_job.py``).

``prepare`` (CPU machine, nvcc): per llm-public decode target (M <= 256, fp16 tn, the
targets of ``bench/manifests/llm-public-pdl-h100.toml``), two tiles from the recorded
H100 databases (llm-public's and its PDL build's): the incumbent (the fastest correct
plain kernel: what ships unless beaten) and the fastest recorded tile that has room
variants (``generator.space.room_variants``; the same tile where the incumbent has
them). Each tile is measured plain, with each PDL trigger, and each legal room with each
trigger. Compiles them and writes a job folder (``job.json`` and ``cubins/``) that
``ci/gpu_room.sh`` carries to the GPU.

``run`` (GPU machine, no nvcc): every job through the measuring worker
(``LocalRunner``): the correctness suite, the PDL pair check of every PDL design, then
the offline timing (a CUDA graph of back-to-back calls: the successor is the same
kernel, so a room design's next call can become resident beside it) beside torch.
Writes the records (``room.measurements.jsonl``: the policy's retrain corpus) and
``room-timing.json``: per target and tile, the best PDL time without room, the best with
each room, and room's speedup over PDL alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from cudal2.database import MeasurementDB
from cudal2.generator import design_name
from cudal2.generator.compile import ArtifactCache, build_all, checked_cubin_path
from cudal2.generator.families.base import pdl_trigger, room, with_pdl, with_room
from cudal2.generator.space import pdl_variants, room_variants
from cudal2.manifest import load_manifest
from cudal2.records import BuildResult, Job, KernelDesign, Target, TimingConfig

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "bench" / "manifests" / "llm-public-pdl-h100.toml"
DATABASES = (
    ROOT / "manifests" / "llm-public-h100.measurements.jsonl.gz",
    ROOT / "bench" / "results" / "h100-llm-public-pdl.measurements.jsonl.gz",
)
DTYPE = "fp16"
TIMING = TimingConfig(reps=20)


def targets() -> list[Target]:
    """The fp16 decode targets (M <= 256) of the llm-public PDL manifest."""
    return [t for t in load_manifest(MANIFEST).targets if t.dtype == DTYPE and t.m <= 256]


def _fastest_plain(wanted: set[Target]) -> dict[Target, list[tuple[float, KernelDesign]]]:
    """Per target, its correct plain offline kernels (no PDL, no room), fastest first."""
    by: dict[Target, dict[str, tuple[float, KernelDesign]]] = defaultdict(dict)
    for path in DATABASES:
        for m in MeasurementDB(path).load(warn=False).measurements:
            d = m.design
            if m.target not in wanted or d is None or m.mode != "offline":
                continue
            if m.status != "ok" or m.median_us is None:
                continue
            if pdl_trigger(d) != "none" or room(d) != "none":
                continue
            have = by[m.target].get(d.key)
            if have is None or m.median_us < have[0]:
                by[m.target][d.key] = (m.median_us, d)
    return {t: sorted(v.values(), key=lambda x: (x[0], x[1].key)) for t, v in by.items()}


def tiles(t: Target, ranked: list[tuple[float, KernelDesign]]) -> list[tuple[str, KernelDesign]]:
    """The target's incumbent, and its fastest recorded tile with room variants (once,
    where they are the same), by role."""
    out = [("incumbent", ranked[0][1])] if ranked else []
    roomy = next((d for _, d in ranked if room_variants(d)), None)
    if roomy is not None and (not out or roomy != out[0][1]):
        out.append(("roomy", roomy))
    return out


def plan() -> list[tuple[str, Target, KernelDesign]]:
    """(role, target, design) of every job: each tile plain, with each trigger, and each
    legal room with each trigger."""
    wanted = targets()
    ranked = _fastest_plain(set(wanted))
    out = []
    for t in wanted:
        for role, tile in tiles(t, ranked.get(t, [])):
            designs = [tile, *pdl_variants(tile)]
            designs += [p for r in room_variants(tile) for p in pdl_variants(r)]
            out += [(role, t, d) for d in designs]
    return out


def prepare(job_dir: Path, jobs: int) -> None:
    from cudal2.pipeline.results import kernel_job

    entries = plan()
    cache = ArtifactCache(job_dir / "cache")
    builds = build_all([d for _, _, d in entries], cache, jobs=jobs)
    bad = [b for b in builds.values() if not b.ok]
    if bad:
        sys.exit(f"{len(bad)} designs did not compile, e.g. {bad[0].symbol}: {bad[0].error[:400]}")
    # The rules keep a room design's register model within the launch bound's cap: a room
    # design that spills more than its twin without room is a rule to fix. (Some tiles
    # spill anyway, at 255 registers, plain: bm 64 with stages 3 and the like, as the
    # plain space's do; their room twins spill exactly as much.)
    by_key = {d.key: d for _, _, d in entries}
    worse = [
        b
        for key, b in builds.items()
        if room(by_key[key]) != "none"
        and (b.spill_bytes or 0) > (builds[with_room(by_key[key], "none").key].spill_bytes or 0)
    ]
    if worse:
        sys.exit(f"{len(worse)} room designs spill more than their tiles without room, e.g. "
                 f"{worse[0].symbol}: {worse[0].spill_bytes} B")  # fmt: skip
    spilling = sorted(b.symbol for b in builds.values() if b.spill_bytes)
    print(f"{len(spilling)} designs spill, each no more than its twin without room"
          + (f" (e.g. {spilling[0]})" if spilling else ""))  # fmt: skip
    cubins = job_dir / "cubins"
    cubins.mkdir(parents=True, exist_ok=True)
    rows = []
    for role, t, d in entries:
        b = builds[d.key]
        dst = cubins / f"{b.artifact_key}.cubin"
        if not dst.exists():
            shutil.copyfile(checked_cubin_path(d, cache, b.artifact_key), dst)
        job = kernel_job(t, d, b, TIMING, str(dst.relative_to(job_dir)))
        rows.append({"role": role, "job": job.as_json(), "build": b.as_json()})
    shutil.rmtree(job_dir / "cache")
    (job_dir / "job.json").write_text(json.dumps({"jobs": rows}, indent=1) + "\n")
    n_targets = len({json.dumps(r["job"]["target"], sort_keys=True) for r in rows})
    n_room = sum(1 for _, _, d in entries if room(d) != "none")
    print(f"{len(rows)} jobs ({n_room} room designs, {len(builds)} cubins) over {n_targets} "
          f"targets in {job_dir}")  # fmt: skip


def summarize(rows: list[dict]) -> dict:
    """Per (target, role): the plain time, the best PDL time without room, the best with
    each room, and the speedups; geomeans over the tiles that have both."""
    by = defaultdict(list)
    for r in rows:
        by[(r["target"], r["role"])].append(r)
    out, gains = [], []
    for (label, role), rs in sorted(by.items()):
        ok = [r for r in rs if r["status"] == "ok" and r["median_us"]]
        plain = [r["median_us"] for r in ok if r["trigger"] == "none"]
        pdl = [r for r in ok if r["trigger"] != "none" and r["room"] == "none"]
        best_pdl = min(pdl, key=lambda r: r["median_us"], default=None)
        entry = {
            "target": label, "role": role, "tile": rs[0]["tile"],
            "plain_us": plain[0] if plain else None,
            "pdl_us": best_pdl["median_us"] if best_pdl else None,
            "pdl_trigger": best_pdl["trigger"] if best_pdl else None,
        }  # fmt: skip
        for name in ("half", "quarter"):
            roomy = [r for r in ok if r["room"] == name]
            best = min(roomy, key=lambda r: r["median_us"], default=None)
            entry[f"{name}_us"] = best["median_us"] if best else None
            entry[f"{name}_trigger"] = best["trigger"] if best else None
        rooms = [entry[f"{n}_us"] for n in ("half", "quarter") if entry[f"{n}_us"]]
        if rooms and entry["pdl_us"]:
            entry["pdl_over_room"] = round(entry["pdl_us"] / min(rooms), 4)
            gains.append(entry["pdl_over_room"])
        failed = [r for r in rs if r["status"] != "ok"]
        entry["failed"] = [f"{r['kernel']}: {r['status']} {r['error'][:120]}" for r in failed]
        out.append(entry)
    return {
        "geomean_pdl_over_room": statistics.geometric_mean(gains) if gains else None,
        "tiles_with_room": len(gains),
        "rows": out,
    }


def _write_report(out: Path, gpu: str, rows: list[dict]) -> dict:
    """``room-timing.json`` under ``out`` (written whole, then renamed into place)."""
    report = {"gpu": gpu, **summarize(rows), "jobs": rows}
    tmp = out / "room-timing.json.tmp"
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    tmp.replace(out / "room-timing.json")
    return report


def run(job_dir: Path, out: Path, timeout_s: float) -> int:
    from cudal2.pipeline.results import measurement_from
    from cudal2.verify.local import LocalRunner
    from cudal2.verify.pdl_pair import PAIR_METRIC

    spec = json.loads((job_dir / "job.json").read_text())["jobs"]
    jobs, builds, roles = [], {}, []
    for r in spec:
        j = Job.from_json(r["job"])
        jobs.append(Job.from_json({**j.as_json(), "cubin": str(job_dir / j.cubin)}))
        builds[j.artifact_key] = BuildResult.from_json(r["build"])
        roles.append(r["role"])
    out.mkdir(parents=True, exist_ok=True)
    db = MeasurementDB(out / "room.measurements.jsonl")
    rows = []
    with LocalRunner(job_timeout_s=timeout_s) as runner:
        gpu = runner.start()
        for n, (job, res) in enumerate(zip(jobs, runner.run(jobs), strict=True), 1):
            m = measurement_from(res, builds[job.artifact_key], gpu, "ci/room_job.py")
            db.append([m])
            d, t = job.design, job.target
            row = {
                "target": t.label, "role": roles[n - 1], "kernel": design_name(d),
                "tile": design_name(with_pdl(d, "none")).removesuffix("_room_half")
                .removesuffix("_room_quarter"),
                "trigger": pdl_trigger(d), "room": room(d), "status": m.status.value,
                "error": m.error[:300], "pair_check": m.metrics.get(PAIR_METRIC),
                "median_us": m.median_us, "torch_us": m.baselines_us.get("torch"),
            }  # fmt: skip
            rows.append(row)
            if n % 25 == 0:  # a run cut short by its timeout keeps a summary of what it timed
                _write_report(out, gpu.name, rows)
            print(f"[{n}/{len(jobs)}] {row['status']:9} {row['room']:7} {row['trigger']:15} "
                  f"{t.label:28} {row['median_us']} {row['kernel']}", flush=True)  # fmt: skip
    report = _write_report(out, gpu.name, rows)
    failed = [r for r in rows if r["status"] != "ok"]
    print(f"{len(rows) - len(failed)}/{len(rows)} ok; {report['tiles_with_room']} tiles with "
          f"room, geomean best PDL without room / best with room "
          f"{report['geomean_pdl_over_room']}")  # fmt: skip
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="CPU: compile the designs into a job folder")
    p.add_argument("--job", type=Path, default=ROOT / ".room-job", help="the job folder")
    p.add_argument("--jobs", type=int, default=2, help="parallel nvcc processes")
    p.add_argument("--plan", action="store_true", help="print the plan only (no nvcc)")
    r = sub.add_parser("run", help="GPU: checks, pair checks and offline timing of the job")
    r.add_argument("--job", type=Path, default=ROOT / ".room-job", help="the job folder")
    r.add_argument("--out", type=Path, required=True, help="where the results go")
    r.add_argument("--timeout", type=float, default=60.0, help="seconds per job")
    args = ap.parse_args()
    if args.cmd == "prepare":
        if args.plan:
            entries = plan()
            for role, t, d in entries:
                print(f"{role:9} {t.label:28} {design_name(d)}")
            n_room = sum(1 for _, _, d in entries if room(d) != "none")
            print(f"{len(entries)} jobs, {n_room} room designs")
            return 0
        prepare(args.job, args.jobs)
        return 0
    return run(args.job, args.out, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
