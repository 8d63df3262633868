"""Under ncu: a sweep database's fastest stream-K kernel of one target and its
data-parallel twin (the same design, ``streamk`` = 0: the same tile, ring and walk on a
CTA per SM), each launched in an NVTX range of its role ("sk", "dp"), for Nsight
Compute's memory sections side by side (issue 22: why stream-K lost, docs/kernels.md
"sm90tma v5 stream-K").

    ncu --nvtx --nvtx-include "sk/" --nvtx-include "dp/" --section MemoryWorkloadAnalysis \\
        python bench/experiments/ncu_streamk.py --db DB.jsonl.gz --shape 1024 4096 14336

(``ci/gpu_ncu_streamk.sh`` runs it so.) Operands uniform(-1, 1), fp16 tn.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from power_own import launch_in_ranges, own_kernel  # noqa: E402


def fastest_streamk(path: Path, shape: tuple[int, int, int]) -> dict:
    """The fastest timed fp16 stream-K record of ``shape`` in the database (its design)."""
    best = None
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
        for line in f:
            r = json.loads(line)
            t, d = r.get("target", {}), r.get("design") or {}
            if r.get("status") != "ok" or (t.get("m"), t.get("n"), t.get("k")) != shape:
                continue
            if t.get("dtype") != "fp16" or not d.get("knobs", {}).get("streamk"):
                continue
            if best is None or r["median_us"] < best["median_us"]:
                best = r
    if best is None:
        raise LookupError(f"{path}: no timed fp16 stream-K record at {shape}")
    return best["design"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--shape", nargs=3, type=int, default=[1024, 4096, 14336])
    ap.add_argument("--launches", type=int, default=1)
    args = ap.parse_args(argv)
    m, n, k = args.shape
    try:  # before torch: a database without the shape is a usage error
        found = fastest_streamk(args.db, (m, n, k))
    except (LookupError, OSError) as exc:
        print(f"ncu_streamk.py: {exc}", file=sys.stderr)
        return 2

    import torch

    from cudal2.generator.compile import ArtifactCache
    from cudal2.generator.families import sm90_tma
    from cudal2.records import KernelDesign, Target
    from cudal2.verify.launch import launch_dense

    design = KernelDesign.from_json(found)
    twin = sm90_tma.with_knobs(design, streamk=0)
    cache = ArtifactCache(Path(os.environ.get("CUDAL2_CACHE", ".cache/artifacts")))
    t = Target("sm_90a", "fp16", "tn", m, n, k)
    a = torch.rand(m, k, device="cuda").mul_(2).sub_(1).half()
    w = torch.rand(n, k, device="cuda").mul_(2).sub_(1).half()
    c = torch.empty(m, n, device="cuda", dtype=torch.half)
    stream = torch.cuda.current_stream().cuda_stream
    runs = {}
    for role, d in (("sk", design), ("dp", twin)):
        name, kernel, recipe = own_kernel(d.as_json(), cache)
        print(f"{role}: {name}")
        runs[role] = lambda kernel=kernel, recipe=recipe: launch_dense(
            kernel, recipe, t, a.data_ptr(), w.data_ptr(), c.data_ptr(), stream
        )
    launch_in_ranges(runs, args.launches)
    return 0


if __name__ == "__main__":
    sys.exit(main())
