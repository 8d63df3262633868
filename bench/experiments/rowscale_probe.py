"""Why a row-scaled sm90tma kernel is slower than its plain tile at M = 64 (issue 20).

Runs, for one target and one tile, the plain design and its ``rmsnorm`` and ``silu``
epilogues: a CUDA-event timing of back-to-back launches (L2 warm: a probe, not a
measurement of record) and, under ``ncu`` (``--ncu``), one launch each to profile.

    python bench/experiments/rowscale_probe.py [--m 64] [--n 6144] [--k 4096] [--ncu]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from cudal2.generator.cache import ArtifactCache
from cudal2.generator.compile import build
from cudal2.generator.families import sm90_tma
from cudal2.generator.families.base import with_epilogue
from cudal2.generator.space import design_name, launch_recipe
from cudal2.packaging.runtime import driver
from cudal2.records import Target
from cudal2.verify.launch import dense_epilogue, launch_dense


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=64)
    ap.add_argument("--n", type=int, default=6144)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--tile", default="1,1,1,64,8,2", help="wgs,mp,swap,n,stages,split")
    ap.add_argument("--epilogues", default="none,rmsnorm,silu")
    ap.add_argument("--ncu", action="store_true", help="one launch each (under ncu)")
    a = ap.parse_args()
    wgs, mp, swap, n, st, sk = (int(x) for x in a.tile.split(","))
    cache = ArtifactCache(Path(tempfile.mkdtemp()))
    x = torch.randn(a.m, a.k, dtype=torch.float16, device="cuda")
    w = torch.randn(a.n, a.k, dtype=torch.float16, device="cuda") / 64
    for epi in a.epilogues.split(","):
        d = with_epilogue(sm90_tma.design("fp16", wgs, mp, bool(swap), n, st, sk), epi)
        b = build(d, cache)
        assert b.ok, b.error[-2000:]
        recipe = launch_recipe(d)
        kernel = driver.Kernel(cache.cubin(b.artifact_key), b.symbol, recipe["smem_bytes"])
        t = Target("sm_90a", "fp16", "tn", a.m, a.n, a.k, epilogue=epi)
        c = torch.empty(a.m, t.out_n, dtype=torch.float16, device="cuda")
        stream = torch.cuda.current_stream().cuda_stream

        def run(kernel=kernel, recipe=recipe, t=t, c=c, stream=stream) -> None:
            launch_dense(kernel, recipe, t, x.data_ptr(), w.data_ptr(), c.data_ptr(), stream,
                         epilogue=dense_epilogue(t))  # fmt: skip

        if a.ncu:
            run()
            torch.cuda.synchronize()
            continue
        for _ in range(20):
            run()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(200):
            run()
        e1.record()
        torch.cuda.synchronize()
        print(f"{design_name(d)}: {e0.elapsed_time(e1) / 200 * 1000:.2f} us/launch "
              f"(smem {recipe['smem_bytes']}, regs {b.registers})")  # fmt: skip


if __name__ == "__main__":
    main()
