"""Issue 20's GPU measurement of fused epilogues (sm90tma), in two halves.

``prepare`` (CPU machine, nvcc): picks the designs, compiles them and writes a job
folder (``job.json`` and ``cubins/``) that ``ci/gpu_epilogue.sh`` carries to the GPU.
For M in {1, 16, 64} and the Llama-3.1-8B decode shapes (N, K) 4096 x 4096 (o_proj)
and 4096 x 14336 (down_proj), fp16 tn: two sm90tma designs (the fastest the
llm-public database recorded for that M and shape, else for the nearest recorded M;
and a fixed swapped split-K decode design), each plain on the plain target and with
each epilogue (bias, residual, bias_residual) on that epilogue's target.

``run`` (GPU machine, no nvcc needed): every job through the measuring worker
(``LocalRunner``): the correctness suite (for an epilogue target: the fp32 fused
reference, bounded by torch's unfused op), then the offline timing beside torch (for
an epilogue target, torch's unfused op: the vendor GEMM then the add). Writes
``epilogue-timing.json`` (per epilogue target: the fused kernel's time, torch's
unfused op's, the same design's plain GEMM's) and the records
(``epilogue.measurements.jsonl``) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

from cudal2.database import MeasurementDB
from cudal2.generator import design_name
from cudal2.generator.compile import ArtifactCache, build_all, checked_cubin_path
from cudal2.generator.families import sm90_tma
from cudal2.generator.families.base import epilogue, with_epilogue
from cudal2.records import EPILOGUES, BuildResult, Job, KernelDesign, Target, TimingConfig

ROOT = Path(__file__).resolve().parent.parent
DATABASE = ROOT / "manifests" / "llm-public-h100.measurements.jsonl"
FUSED = [e for e in EPILOGUES if e != "none"]
SHAPES = [(4096, 4096), (4096, 14336)]  # o_proj, down_proj of Llama-3.1-8B (N, K)
MS = [1, 16, 64]
TIMING = TimingConfig(reps=20)


def _recorded() -> dict[tuple[int, int, int], KernelDesign]:
    """(m, n, k) -> the fastest correct fp16 tn offline sm90tma kernel recorded."""
    best: dict[tuple[int, int, int], tuple[float, KernelDesign]] = {}
    for m in MeasurementDB(DATABASE).load(warn=False).measurements:
        t, d = m.target, m.design
        if d is None or d.family != "sm90tma" or m.status != "ok" or m.median_us is None:
            continue
        if (t.dtype, t.layout, m.mode, t.epilogue) != ("fp16", "tn", "offline", "none"):
            continue
        key = (t.m, t.n, t.k)
        if key not in best or m.median_us < best[key][0]:
            best[key] = (m.median_us, d)
    return {k: d for k, (_, d) in best.items()}


def designs_for(m: int, n: int, k: int, recorded: dict) -> list[KernelDesign]:
    """The recorded best sm90tma design (nearest recorded M of the shape) and a fixed
    swapped split-K one, plain."""
    ms = sorted(mm for mm, nn, kk in recorded if (nn, kk) == (n, k))
    out = []
    if ms:
        near = min(ms, key=lambda mm: (abs(mm - m), mm))
        out.append(recorded[(near, n, k)])
    wgmma_n = 8 if m == 1 else min(64, max(16, m))
    fixed = sm90_tma.design("fp16", 1, 1, True, wgmma_n, 8, 4)
    if fixed not in out:
        out.append(fixed)
    return out


def plan() -> list[tuple[Target, KernelDesign]]:
    """(target, design) of every job: per M and shape, each design plain and with
    each epilogue."""
    recorded = _recorded()
    out = []
    for m in MS:
        for n, k in SHAPES:
            for d in designs_for(m, n, k, recorded):
                out.append((Target("sm_90a", "fp16", "tn", m, n, k), d))
                out += [
                    (Target("sm_90a", "fp16", "tn", m, n, k, epilogue=e), with_epilogue(d, e))
                    for e in FUSED
                ]
    return out


def prepare(job_dir: Path, jobs: int) -> None:
    from cudal2.pipeline.results import kernel_job

    entries = plan()
    cache = ArtifactCache(job_dir / "cache")
    builds = build_all([d for _, d in entries], cache, jobs=jobs)
    bad = [b for b in builds.values() if not b.ok or b.spill_bytes]
    if bad:
        sys.exit(f"{len(bad)} designs did not compile cleanly, e.g. {bad[0].symbol}: "
                 f"{bad[0].error[:400] or f'{bad[0].spill_bytes} bytes spilled'}")  # fmt: skip
    cubins = job_dir / "cubins"
    cubins.mkdir(parents=True, exist_ok=True)
    rows = []
    for t, d in entries:
        b = builds[d.key]
        dst = cubins / f"{b.artifact_key}.cubin"
        if not dst.exists():
            shutil.copyfile(checked_cubin_path(d, cache, b.artifact_key), dst)
        job = kernel_job(t, d, b, TIMING, str(dst.relative_to(job_dir)))
        rows.append({"job": job.as_json(), "build": b.as_json()})
    shutil.rmtree(job_dir / "cache")
    (job_dir / "job.json").write_text(json.dumps({"jobs": rows}, indent=1) + "\n")
    print(f"{len(rows)} jobs ({len(builds)} cubins) in {job_dir}")


def summarize(rows: list[dict]) -> dict:
    """Per epilogue target: the fastest correct fused kernel against torch's unfused op
    and against the same design's plain GEMM (what the epilogue costs the kernel)."""
    plain = {(r["m"], r["n"], r["k"], r["tile"]): r for r in rows if r["epilogue"] == "none"}
    best: dict[tuple, dict] = {}
    for r in rows:
        if r["epilogue"] == "none" or r["status"] != "ok":
            continue
        key = (r["m"], r["n"], r["k"], r["epilogue"])
        if key not in best or r["median_us"] < best[key]["median_us"]:
            best[key] = r
    out = []
    for (m, n, k, e), r in sorted(best.items()):
        p = plain.get((m, n, k, r["tile"]), {})
        out.append({
            "m": m, "n": n, "k": k, "epilogue": e, "kernel": r["kernel"],
            "fused_us": r["median_us"], "unfused_torch_us": r["torch_us"],
            "unfused_over_fused": round(r["torch_us"] / r["median_us"], 4),
            "plain_kernel_us": p.get("median_us"),
            "plain_torch_us": p.get("torch_us"),
            "max_abs_err": r["max_abs_err"], "bound_from": r["bound_from"],
        })  # fmt: skip
    ratios = [s["unfused_over_fused"] for s in out]
    return {
        "geomean_unfused_over_fused": statistics.geometric_mean(ratios) if ratios else None,
        "rows": out,
    }


def run(job_dir: Path, out: Path, timeout_s: float) -> int:
    from cudal2.pipeline.results import measurement_from
    from cudal2.verify.local import LocalRunner

    rows = json.loads((job_dir / "job.json").read_text())["jobs"]
    jobs, builds = [], {}
    for r in rows:
        j = Job.from_json(r["job"])
        j = Job.from_json({**j.as_json(), "cubin": str(job_dir / j.cubin)})
        jobs.append(j)
        builds[j.artifact_key] = BuildResult.from_json(r["build"])
    out.mkdir(parents=True, exist_ok=True)
    db = MeasurementDB(out / "epilogue.measurements.jsonl")
    results = []
    with LocalRunner(job_timeout_s=timeout_s) as runner:
        gpu = runner.start()
        for n, (job, res) in enumerate(zip(jobs, runner.run(jobs), strict=True), 1):
            m = measurement_from(res, builds[job.artifact_key], gpu, "ci/epilogue_job.py")
            db.append([m])
            d, t = job.design, job.target
            plain_name = design_name(with_epilogue(d, "none"))
            row = {
                "m": t.m, "n": t.n, "k": t.k, "epilogue": t.epilogue, "kernel": design_name(d),
                "tile": plain_name, "status": m.status.value, "error": m.error[:300],
                "median_us": m.median_us, "torch_us": m.baselines_us.get("torch"),
                "max_abs_err": m.max_abs_err,
                "bound_from": m.metrics.get("vendor_max_abs_err"),
            }  # fmt: skip
            assert epilogue(d) == t.epilogue
            results.append(row)
            print(f"[{n}/{len(jobs)}] {row['status']:9} {t.label:34} {row['median_us']} "
                  f"torch {row['torch_us']} {design_name(d)}", flush=True)  # fmt: skip
    report = {"gpu": gpu.name, **summarize(results), "jobs": results}
    (out / "epilogue-timing.json").write_text(json.dumps(report, indent=1) + "\n")
    failed = [r for r in results if r["status"] != "ok"]
    print(f"{len(results) - len(failed)}/{len(results)} jobs ok; geomean torch unfused / "
          f"fused {report['geomean_unfused_over_fused']}")  # fmt: skip
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="CPU: compile the designs into a job folder")
    p.add_argument("--job", type=Path, default=ROOT / ".epilogue-job", help="the job folder")
    p.add_argument("--jobs", type=int, default=2, help="parallel nvcc processes")
    r = sub.add_parser("run", help="GPU: correctness and offline timing of the job")
    r.add_argument("--job", type=Path, default=ROOT / ".epilogue-job", help="the job folder")
    r.add_argument("--out", type=Path, required=True, help="where the results go")
    r.add_argument("--timeout", type=float, default=60.0, help="seconds per job")
    args = ap.parse_args()
    if args.cmd == "prepare":
        prepare(args.job, args.jobs)
        return 0
    return run(args.job, args.out, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
