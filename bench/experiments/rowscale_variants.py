"""Bisect the row scale's cost at M = 64 (issue 20): the ``rmsnorm`` design of one tile,
rendered, then edited into variants that drop one part of the row scale at a time,
compiled with nvcc and timed with CUDA events beside the plain tile (L2 warm: a probe).

    python bench/experiments/rowscale_variants.py [--m 64] [--tile 1,1,1,64,8,2]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import torch

from cudal2.generator.compile import BASE_FLAGS, arch_flags
from cudal2.generator.families import sm90_tma
from cudal2.generator.families.base import with_epilogue
from cudal2.generator.render import render, symbol
from cudal2.generator.space import launch_recipe
from cudal2.packaging.runtime import driver
from cudal2.records import Target
from cudal2.verify.launch import dense_epilogue, launch_dense

NO_HELPERS = [
    ("if (tid >= WGS * 128 + 32) {", "if (false) {"),
    ("4 * WGS + ROWSQ_WARPS", "4 * WGS"),
    ('"n"(128 * WGS + 32 * ROWSQ_WARPS)', '"n"(128 * WGS)'),
]
VARIANTS: dict[str, list[tuple[str, str]]] = {
    "rmsnorm": [],
    "no_loads": [
        (
            "u[i] = *reinterpret_cast<const uint4*>(sA + row * BK + (h & 7) * 8);",
            "u[i] = make_uint4(0, 0, 0, row);",
        )
    ],
    "no_helpers": NO_HELPERS,
    "no_helpers_no_rs": NO_HELPERS
    + [
        ("const float rs = rsqrtf(ss * inv_k + eps);", "const float rs = 1.f;"),
    ],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=64)
    ap.add_argument("--n", type=int, default=6144)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--tile", default="1,1,1,64,8,2", help="wgs,mp,swap,n,stages,split")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    wgs, mp, swap, n, st, sk = (int(x) for x in a.tile.split(","))
    work = Path(tempfile.mkdtemp())
    x = torch.randn(a.m, a.k, dtype=torch.float16, device="cuda")
    w = torch.randn(a.n, a.k, dtype=torch.float16, device="cuda") / 64
    stream = torch.cuda.current_stream().cuda_stream
    runs = {}
    plain = sm90_tma.design("fp16", wgs, mp, bool(swap), n, st, sk)
    for name, edits in [("plain", None), *VARIANTS.items()]:
        d = plain if edits is None else with_epilogue(plain, "rmsnorm")
        src = render(d)
        for old, new in edits or []:
            assert old in src, (name, old)
            src = src.replace(old, new)
        cu, cubin = work / f"{name}.cu", work / f"{name}.cubin"
        cu.write_text(src)
        cmd = ["nvcc", *BASE_FLAGS, *arch_flags("sm_90a"), "-o", str(cubin), str(cu)]
        subprocess.run(cmd, check=True, capture_output=True)
        recipe = launch_recipe(d)
        kernel = driver.Kernel(cubin.read_bytes(), symbol(d), recipe["smem_bytes"])
        t = Target(
            "sm_90a",
            "fp16",
            "tn",
            a.m,
            a.n,
            a.k,
            epilogue="rmsnorm" if edits is not None else "none",
        )
        c = torch.empty(a.m, a.n, dtype=torch.float16, device="cuda")
        ep = dense_epilogue(t)

        def run(kernel=kernel, recipe=recipe, t=t, c=c, ep=ep) -> None:
            launch_dense(kernel, recipe, t, x.data_ptr(), w.data_ptr(), c.data_ptr(), stream,
                         epilogue=ep)  # fmt: skip

        runs[name] = run
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(a.reps):  # interleaved
        for name, run in runs.items():
            for _ in range(10):
                run()
            e0.record()
            for _ in range(100):
                run()
            e1.record()
            torch.cuda.synchronize()
            times[name].append(e0.elapsed_time(e1) * 10)
    for name, ts in times.items():
        ts.sort()
        print(f"{a.tile} M={a.m} {name:18s} median {ts[len(ts) // 2]:.2f} us  (min {ts[0]:.2f})")


if __name__ == "__main__":
    main()
