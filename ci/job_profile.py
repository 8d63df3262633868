"""Where a measuring job's seconds go, on the GPU: the build's measure jobs run in this
process (as the worker runs them), each phase timed, and cProfile's top functions.

    python ci/job_profile.py DB.jsonl[.gz] --targets 6 --per-target 6 --out OUT_DIR \
        [--no-cache] [--prepare]

DB: a database of a build on this GPU (its kernel records name the designs to
re-run; the artifact cache ``CUDAL2_CACHE`` compiles what is missing). Writes
``job-phases.json`` (per job: its seconds by phase) and ``job-profile.txt`` (cProfile).
The jobs run through one ``InputCache``, as the worker runs them (``--no-cache``: every
trial and timing set drawn afresh, as before the worker kept them). Each row also has
the worker's own account of the job (``job_s``, ``worker_phases_s``: ``JobResult``'s).
``--prepare``: each target readied first (``worker.prepare``, as the worker does while
it waits for cubins; its seconds in the target's first row as ``prepare_s``).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time
from collections import defaultdict
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("db", type=Path)
    ap.add_argument("--targets", type=int, default=6)
    ap.add_argument("--per-target", type=int, default=6)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--no-cache", action="store_true", help="draw every job's inputs afresh")
    ap.add_argument("--prepare", action="store_true", help="ready each target before its jobs")
    args = ap.parse_args()

    import torch

    from cudal2.database import MeasurementDB
    from cudal2.generator.compile import ArtifactCache, build_all, checked_cubin_path
    from cudal2.packaging.runtime import driver
    from cudal2.pipeline.results import kernel_job
    from cudal2.records import Status, TimingConfig
    from cudal2.verify import correctness, pdl_pair, worker
    from cudal2.verify.gpu import current_gpu
    from cudal2.verify.inputs import InputCache
    from cudal2.verify.spread import VendorSpread, nvmath_available

    os.environ.setdefault("CUDA_MODULE_LOADING", "LAZY")
    torch.cuda.set_device(0)
    torch.cuda.init()
    driver.ensure_context(0)
    gpu = current_gpu(0)
    errors = VendorSpread() if nvmath_available() else correctness.torch_error

    ms = [
        x for x in MeasurementDB(args.db).read() if x.design is not None and x.status == Status.OK
    ]
    by_target: dict = defaultdict(list)
    for x in ms:
        if len(by_target[x.target]) < args.per_target:
            by_target[x.target].append(x)
    targets = sorted(by_target, key=lambda t: (t.m, t.n, t.k))
    # every M the build has, spread: the first and last targets and between
    pick = [
        targets[round(i * (len(targets) - 1) / max(args.targets - 1, 1))]
        for i in range(args.targets)
    ]
    cache = ArtifactCache(Path(os.environ["CUDAL2_CACHE"]))
    chosen = [x for t in dict.fromkeys(pick) for x in by_target[t]]
    builds = build_all([x.design for x in chosen], cache)

    phases: dict[str, float] = defaultdict(float)

    def timed(name, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                torch.cuda.synchronize()
                phases[name] += time.perf_counter() - t0

        return wrapper

    worker.correctness.check = timed("correctness", correctness.check)
    worker.pdl_pair.check = timed("pdl_pair", pdl_pair.check)
    worker.time_interleaved = timed("timing", worker.time_interleaved)
    worker.driver.Kernel = timed("module_load", driver.Kernel)
    correctness.operands = timed("operands", correctness.operands)
    correctness.epilogue_operands = timed("epilogue_operands", correctness.epilogue_operands)
    correctness.reference = timed("reference", correctness.reference)
    errors = timed("vendor_errors", errors)
    inputs = None if args.no_cache else InputCache()

    rows = []
    prepared: set = set()
    prof = cProfile.Profile()
    for x in chosen:
        b = builds[x.design.key]
        job = kernel_job(
            x.target,
            x.design,
            b,
            TimingConfig(mode=x.mode),
            str(checked_cubin_path(x.design, cache, b.artifact_key)),
        )
        prepare_s = None
        if args.prepare and inputs is not None and x.target not in prepared:
            prepared.add(x.target)
            t0 = time.perf_counter()
            worker.prepare(x.target, job.timing, gpu.name, errors, inputs)
            torch.cuda.synchronize()
            prepare_s = round(time.perf_counter() - t0, 4)
        phases.clear()
        t0 = time.perf_counter()
        prof.enable()
        res = worker.run_job(job, 0, gpu.name, errors, inputs)
        prof.disable()
        total = time.perf_counter() - t0
        row = {
            "target": x.target.label,
            "family": x.design.family,
            "status": str(res.status),
            "total_s": round(total, 4),
            "phases_s": {k: round(v, 4) for k, v in phases.items()},
            "samples": len(res.samples_us),
            "median_us": round(sorted(res.samples_us)[len(res.samples_us) // 2], 3)
            if res.samples_us
            else None,
            "job_s": res.job_s,
            "worker_phases_s": res.phases_s,
            **({"prepare_s": prepare_s} if prepare_s is not None else {}),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "job-phases.json").write_text(json.dumps({"gpu": gpu.name, "jobs": rows}, indent=1))
    with open(args.out / "job-profile.txt", "w") as f:
        pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(60)
        pstats.Stats(prof, stream=f).sort_stats("tottime").print_stats(30)
    tot = sum(r["total_s"] for r in rows)
    agg: dict[str, float] = defaultdict(float)
    for r in rows:
        for k, v in r["phases_s"].items():
            agg[k] += v
    cached = "no cache" if inputs is None else f"cache {inputs.stats()}"
    print(f"{len(rows)} jobs, {tot:.2f} s, {tot / max(len(rows), 1):.3f} s per job ({cached})")
    for k, v in sorted(agg.items(), key=lambda kv: -kv[1]):
        print(f"  {k:20s} {v:7.2f} s  {100 * v / tot:5.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
