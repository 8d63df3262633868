"""Issue 20's GPU measurement of fused epilogues (sm90tma), in two halves.

``prepare`` (CPU machine, nvcc): picks the designs, compiles them and writes a job
folder (``job.json`` and ``cubins/``) that ``ci/gpu_epilogue.sh`` carries to the GPU.
Two sets (``--set``), each for M in {1, 16, 64}:

- ``added`` (the default; folder ``.epilogue-job``): the Llama-3.1-8B decode shapes
  (N, K) 4096 x 4096 (o_proj) and 4096 x 14336 (down_proj), fp16 tn: two sm90tma
  designs (the fastest the llm-public database recorded for that M and shape, else
  for the nearest recorded M; and a fixed swapped split-K decode design), each plain
  on the plain target and with each adding epilogue (bias, residual, bias_residual)
  on that epilogue's target.
- ``gated`` (folder ``.epilogue-gated-job``): Llama-3.1-8B's qkv 6144 x 4096 with the
  input norm folded (``rmsnorm``) and gate_up 28672 x 4096 with the post-attention
  norm folded and the SiLU gate (``rmsnorm_silu``), fp16 and bf16 tn: three one-tile
  sm90tma designs (persistent = 0, the only kernel that renders these epilogues: the
  recorded fastest where it is one, and fixed swapped split-K 2 and 4 decode designs),
  each plain and with the shape's epilogue.

``run`` (GPU machine, no nvcc needed): every job through the measuring worker
(``LocalRunner``): the correctness suite (for an epilogue target: the fp32 fused
reference, bounded by torch's unfused op), then the offline timing beside torch (for
an epilogue target, torch's unfused op: the vendor GEMM then the add). Writes
``epilogue-timing.json`` (per epilogue target: the fused kernel's time, torch's
unfused op's, the same design's plain GEMM's) and the records
(``epilogue.measurements.jsonl``) under ``--out`` (``epilogue-gated-timing.json`` and
``epilogue-gated.measurements.jsonl`` for the gated set). For the gated set torch's
unfused op is its RMSNorm in the working dtype, the vendor GEMM, then the SiLU and the
multiply (``verify.correctness.vendor``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

from cudal2.database import MeasurementDB
from cudal2.generator import design_name, legality
from cudal2.generator.compile import ArtifactCache, build_all, checked_cubin_path
from cudal2.generator.families import sm90_tma
from cudal2.generator.families.base import epilogue, with_epilogue
from cudal2.records import BuildResult, Job, KernelDesign, Target, TimingConfig

ROOT = Path(__file__).resolve().parent.parent
DATABASE = ROOT / "manifests" / "llm-public-h100.measurements.jsonl.gz"
ADDED = ["bias", "residual", "bias_residual"]
SHAPES = [(4096, 4096), (4096, 14336)]  # o_proj, down_proj of Llama-3.1-8B (N, K)
# Llama-3.1-8B's qkv with the input norm folded, gate_up with the post-attention norm
# folded and the SiLU gate (packed gate and up rows): (N, K, epilogue)
GATED = [(6144, 4096, "rmsnorm"), (28672, 4096, "rmsnorm_silu")]
MS = [1, 16, 64]
TIMING = TimingConfig(reps=20)
# set -> (the default job folder, the name the results files start with)
SETS = {"added": (".epilogue-job", "epilogue"), "gated": (".epilogue-gated-job", "epilogue-gated")}


def _recorded(dtype: str = "fp16") -> dict[tuple[int, int, int], KernelDesign]:
    """(m, n, k) -> the fastest correct ``dtype`` tn offline sm90tma kernel recorded."""
    best: dict[tuple[int, int, int], tuple[float, KernelDesign]] = {}
    for m in MeasurementDB(DATABASE).load(warn=False).measurements:
        t, d = m.target, m.design
        if d is None or d.family != "sm90tma" or m.status != "ok" or m.median_us is None:
            continue
        if (t.dtype, t.layout, m.mode, t.epilogue) != (dtype, "tn", "offline", "none"):
            continue
        key = (t.m, t.n, t.k)
        if key not in best or m.median_us < best[key][0]:
            best[key] = (m.median_us, d)
    return {k: d for k, (_, d) in best.items()}


def _nearest(m: int, n: int, k: int, recorded: dict) -> KernelDesign | None:
    """The recorded design of the shape at the nearest recorded M (None: none)."""
    ms = sorted(mm for mm, nn, kk in recorded if (nn, kk) == (n, k))
    if not ms:
        return None
    return recorded[(min(ms, key=lambda mm: (abs(mm - m), mm)), n, k)]


def _wgmma_n(m: int) -> int:
    return 8 if m == 1 else min(64, max(16, m))


def designs_for(m: int, n: int, k: int, recorded: dict) -> list[KernelDesign]:
    """The recorded best sm90tma design (nearest recorded M of the shape) and a fixed
    swapped split-K one, plain."""
    near = _nearest(m, n, k, recorded)
    out = [near] if near is not None else []
    fixed = sm90_tma.design("fp16", 1, 1, True, _wgmma_n(m), 8, 4)
    if fixed not in out:
        out.append(fixed)
    return out


def gated_designs_for(
    dtype: str, m: int, n: int, k: int, name: str, recorded: dict
) -> list[KernelDesign]:
    """Plain one-tile designs that render ``name``: the recorded best (nearest recorded
    M) where it is one, and fixed swapped split-K 2 and 4 decode designs."""
    near = _nearest(m, n, k, recorded)
    fixed = [sm90_tma.design(dtype, 1, 1, True, _wgmma_n(m), 8, split) for split in (2, 4)]
    out: list[KernelDesign] = []
    for d in ([near] if near is not None else []) + fixed:
        if d not in out and not legality(with_epilogue(d, name)):
            out.append(d)
    return out


def plan(which: str = "added") -> list[tuple[Target, KernelDesign]]:
    """(target, design) of every job of a set (``SETS``): per M, shape (and dtype),
    each design plain and with each epilogue of the set."""
    out = []
    if which == "gated":
        for dtype in ("fp16", "bf16"):
            recorded = _recorded(dtype)
            for m in MS:
                for n, k, name in GATED:
                    for d in gated_designs_for(dtype, m, n, k, name, recorded):
                        out.append((Target("sm_90a", dtype, "tn", m, n, k), d))
                        t = Target("sm_90a", dtype, "tn", m, n, k, epilogue=name)
                        out.append((t, with_epilogue(d, name)))
        return out
    if which != "added":
        raise ValueError(f"unknown set {which!r} (known: {', '.join(SETS)})")
    recorded = _recorded()
    for m in MS:
        for n, k in SHAPES:
            for d in designs_for(m, n, k, recorded):
                out.append((Target("sm_90a", "fp16", "tn", m, n, k), d))
                out += [
                    (Target("sm_90a", "fp16", "tn", m, n, k, epilogue=e), with_epilogue(d, e))
                    for e in ADDED
                ]
    return out


def prepare(job_dir: Path, jobs: int, which: str = "added") -> None:
    from cudal2.pipeline.results import kernel_job

    entries = plan(which)
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
    text = json.dumps({"set": which, "jobs": rows}, indent=1) + "\n"
    (job_dir / "job.json").write_text(text)
    print(f"{len(rows)} jobs ({len(builds)} cubins) in {job_dir}")


def summarize(rows: list[dict]) -> dict:
    """Per epilogue target: the fastest correct fused kernel against torch's unfused op
    and against the same design's plain GEMM (what the epilogue costs the kernel)."""

    def dt(r: dict) -> str:
        return r.get("dtype", "fp16")  # rows of the added set before it had two dtypes

    plain = {(dt(r), r["m"], r["n"], r["k"], r["tile"]): r for r in rows if r["epilogue"] == "none"}
    best: dict[tuple, dict] = {}
    for r in rows:
        if r["epilogue"] == "none" or r["status"] != "ok":
            continue
        key = (dt(r), r["m"], r["n"], r["k"], r["epilogue"])
        if key not in best or r["median_us"] < best[key]["median_us"]:
            best[key] = r
    out = []
    for (dtype, m, n, k, e), r in sorted(best.items()):
        p = plain.get((dtype, m, n, k, r["tile"]), {})
        out.append({
            "dtype": dtype, "m": m, "n": n, "k": k, "epilogue": e, "kernel": r["kernel"],
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

    spec = json.loads((job_dir / "job.json").read_text())
    rows, stem = spec["jobs"], SETS[spec.get("set", "added")][1]
    jobs, builds = [], {}
    for r in rows:
        j = Job.from_json(r["job"])
        j = Job.from_json({**j.as_json(), "cubin": str(job_dir / j.cubin)})
        jobs.append(j)
        builds[j.artifact_key] = BuildResult.from_json(r["build"])
    out.mkdir(parents=True, exist_ok=True)
    db = MeasurementDB(out / f"{stem}.measurements.jsonl")
    results = []
    with LocalRunner(job_timeout_s=timeout_s) as runner:
        gpu = runner.start()
        for n, (job, res) in enumerate(zip(jobs, runner.run(jobs), strict=True), 1):
            m = measurement_from(res, builds[job.artifact_key], gpu, "ci/epilogue_job.py")
            db.append([m])
            d, t = job.design, job.target
            plain_name = design_name(with_epilogue(d, "none"))
            row = {
                "dtype": t.dtype, "m": t.m, "n": t.n, "k": t.k, "epilogue": t.epilogue,
                "kernel": design_name(d),
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
    (out / f"{stem}-timing.json").write_text(json.dumps(report, indent=1) + "\n")
    failed = [r for r in results if r["status"] != "ok"]
    print(f"{len(results) - len(failed)}/{len(results)} jobs ok; geomean torch unfused / "
          f"fused {report['geomean_unfused_over_fused']}")  # fmt: skip
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="CPU: compile the designs into a job folder")
    p.add_argument("--set", choices=sorted(SETS), default="added", help="which epilogues")
    p.add_argument("--job", type=Path, help="the job folder (default: the set's, SETS)")
    p.add_argument("--jobs", type=int, default=2, help="parallel nvcc processes")
    r = sub.add_parser("run", help="GPU: correctness and offline timing of the job")
    r.add_argument("--job", type=Path, default=ROOT / ".epilogue-job", help="the job folder")
    r.add_argument("--out", type=Path, required=True, help="where the results go")
    r.add_argument("--timeout", type=float, default=60.0, help="seconds per job")
    args = ap.parse_args()
    if args.cmd == "prepare":
        prepare(args.job or ROOT / SETS[args.set][0], args.jobs, args.set)
        return 0
    return run(args.job, args.out, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
