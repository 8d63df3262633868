"""The ``cudal2-bench`` run: ceilings once, then every shape x dtype x layout x mode,
appended to the results file as each is taken (a re-run skips what is there)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm import tqdm

from cudal2.database import append_lines
from cudal2.records import Target


def run(
    shapes,
    out: Path,
    modes,
    dtypes,
    layouts,
    reps: int,
    kernels_path: str | None,
    settle_ms: int = 0,
) -> int:
    import torch

    from cudal2.bench.bench import Bench, measure_ceilings
    from cudal2.bench.report import read_results
    from cudal2.verify.gpu import current_gpu

    if not torch.cuda.is_available():
        print(
            "cudal2-bench: error: no CUDA GPU here; benchmarks run on a GPU machine",
            file=sys.stderr,
        )
        return 1
    gpu = current_gpu()
    kernels = {}
    if kernels_path:
        from cudal2.bench.kernels import WheelKernels
        from cudal2.manifest import ManifestError

        # A database's table depends on the mode its measurements were taken in.
        try:
            kernels = {mode: WheelKernels.open(kernels_path, gpu, mode) for mode in modes}
        except (OSError, ValueError, ManifestError) as e:  # a bad wheel, database or manifest
            print(f"cudal2-bench: error: --kernels {kernels_path}: {e}", file=sys.stderr)
            return 2
    done = set()
    if out.exists():
        for r in read_results(out):
            t = r["target"]
            done.add((r["gpu"]["name"], r["mode"], t["dtype"], t["layout"], t["m"], t["n"], t["k"]))
    todo = [
        (mode, Target(gpu.arch, dt, lay, m, n, k))
        for mode in modes
        for dt in dtypes
        for lay in layouts
        for (m, n, k) in shapes
        if (gpu.name, mode, dt, lay, m, n, k) not in done
    ]
    print(
        f"{gpu.name} ({gpu.arch}, driver {gpu.driver}): {len(todo)} to measure, "
        f"{len(done)} already in {out}"
    )
    if not todo:
        return 0
    ceilings = measure_ceilings()
    print(
        f"ceilings: {ceilings['peak_tflops']} TFLOP/s (8192^3 fp16 cuBLAS), "
        f"{ceilings['copy_tbps']} TB/s (device copy)"
    )
    benches = {
        mode: Bench(gpu, mode, reps, kernels=kernels.get(mode), settle_ms=settle_ms)
        for mode in modes
    }
    for mode, t in tqdm(todo, desc="shapes", unit="shape"):
        rec = benches[mode].shape(t)
        rec["ceilings"] = ceilings
        append_lines(out, [json.dumps(rec, sort_keys=True, separators=(",", ":"))])
    return 0
