"""Under ncu: the fastest own kernel of a sweep's database and cuBLASLt's autotuned
algorithm on one prefill shape, each launched in an NVTX range of its name ("own",
"cublaslt"), for Nsight Compute's per-kernel sections side by side (issue 22: where the
own kernels' tensor pipe waits, docs/kernels.md).

    ncu --nvtx --nvtx-include "own/" --nvtx-include "cublaslt/" --section ... \\
        python bench/experiments/ncu_prefill_pair.py --db DB.jsonl.gz [...] [--shape M N K]

(``ci/gpu_ncu_prefill.sh`` runs it so.) The own kernel and the algorithm are picked as
``power_own.py`` picks them; operands uniform(-1, 1), fp16 tn. ``--feed CUBIN`` (a
compiled math_ceiling.cu) adds its kernels on the shape, in ranges "math" (the shape's
FLOPs on operands in shared memory), "feed" (those wgmma beside every operand load of
the shape's 128x256 tiles, never waiting on them), "gemm" (the feed kernel's GEMM
twin), "feedpair" and "gemmpair" (the same in 2-CTA clusters multicasting B),
"feedpaced" (feed held to a GEMM's pace), "feedtall" (the same on 256x176 tiles),
"feedsk" and "feedtallsk" (feed and feedtall with every SM an equal share of the last
wave's k tiles), or those ``--feed-kernels`` names; and torch.matmul ("torch").
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from power_own import best_records, launch_in_ranges, lt_algo, own_kernel  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", nargs="+", type=Path, required=True)
    ap.add_argument("--shape", nargs=3, type=int, default=[4096, 4096, 4096])
    ap.add_argument("--launches", type=int, default=2)
    ap.add_argument("--feed", type=Path, help="a compiled math_ceiling.cu: its kernels too")
    ap.add_argument("--feed-kernels", help="comma-separated: which of them (default: all)")
    args = ap.parse_args(argv)

    import torch

    from cudal2.generator.compile import ArtifactCache
    from cudal2.records import Target
    from cudal2.verify.launch import launch_dense
    from cudal2.verify.spread import VendorSpread

    m, n, k = args.shape
    recs = best_records(args.db)[(m, n, k)]
    t = Target(arch="sm_90a", dtype="fp16", layout="tn", m=m, n=n, k=k)
    a = torch.rand(m, k, device="cuda").mul_(2).sub_(1).half()
    w = torch.rand(n, k, device="cuda").mul_(2).sub_(1).half()
    c = torch.empty(m, n, device="cuda", dtype=torch.half)
    stream = torch.cuda.current_stream().cuda_stream
    cache = ArtifactCache(Path(os.environ.get("CUDAL2_CACHE", ".cache/artifacts")))
    own_name, kernel, recipe = own_kernel(recs["own"]["design"], cache)
    lt, i = lt_algo(VendorSpread(), t, recs["cublaslt"]["vendor"])
    if i is None:
        raise RuntimeError("cuBLASLt's heuristic list differs from the database's")
    runs = {
        "own": lambda: launch_dense(
            kernel, recipe, t, a.data_ptr(), w.data_ptr(), c.data_ptr(), stream
        ),
        "cublaslt": lambda: lt.run(i, a.data_ptr(), w.data_ptr(), c.data_ptr(), stream),
    }
    if args.feed:
        from math_ceiling import FEED, FeedKernel, MathKernel

        from cudal2.packaging.runtime import driver

        cubin = args.feed.read_bytes()
        sms = driver.sm_count(torch.cuda.current_device())
        mk, fk = MathKernel(cubin, sms), FeedKernel(cubin, sms)
        math_run = mk.launcher("math_n256", "sms", "random", mk.rounds_for(2.0 * m * n * k, "sms"))
        runs["math"] = lambda: math_run(0)
        names = args.feed_kernels.split(",") if args.feed_kernels else list(FEED)
        if bad := [x for x in names if x not in FEED]:
            raise SystemExit(
                f"--feed-kernels: unknown kernel {bad[0]!r} (known: {', '.join(FEED)})"
            )
        for name in (x for x in names if fk.fits(x, m, n, k)):
            run = fk.launcher(name, m, n, k, [a], [w], [c])
            runs[name] = lambda run=run: run(0)
        runs["torch"] = lambda: torch.matmul(a, w.t(), out=c)
    launch_in_ranges(runs, args.launches)
    print(f"own: {own_name}; cublaslt: {recs['cublaslt']['vendor']['name']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
