"""Which kernels the vendor runs at the prefill shapes: torch.matmul's cuBLAS kernel per
shape (fp16 and bf16, tn as cudal2-bench calls it), by name and device time, from the
torch profiler. cuBLAS's sm90 kernel names spell the schedule the build's records do not
(the tile, the cluster, the warpgroups, "pingpong" or "coop"/"warpspecialized"), which
says what an own kernel is compared against (issue 22, docs/kernels.md).

    python bench/experiments/vendor_kernels.py --out FILE
        [--shapes bench/shapes/llm-public-prefill.toml] [--dtypes fp16 bf16] [--iters 5]

The results file (JSON: the GPU, torch's version, and per shape and dtype every kernel
the profiled calls launched, with its count and mean device microseconds) is written
atomically once, at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

from cudal2.shapes import load_shapes

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def kernels_of(m: int, n: int, k: int, dtype: torch.dtype, iters: int) -> list[dict]:
    """The kernels ``iters`` calls of A[M,K] @ W[N,K]^T launch (after a warm-up), by
    name: count and mean device microseconds."""
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    w = torch.randn(n, k, device="cuda", dtype=dtype)
    for _ in range(3):
        torch.matmul(a, w.t())
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(iters):
            torch.matmul(a, w.t())
        torch.cuda.synchronize()
    times: dict[str, list[float]] = defaultdict(list)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            times[ev.name].append(ev.device_time)
    return [
        {"name": name, "count": len(ts), "mean_us": round(sum(ts) / len(ts), 2)}
        for name, ts in sorted(times.items(), key=lambda kv: -sum(kv[1]))
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", type=Path, default=Path("bench/shapes/llm-public-prefill.toml"))
    ap.add_argument("--dtypes", nargs="+", default=["fp16", "bf16"], choices=sorted(DTYPES))
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args(argv)
    props = torch.cuda.get_device_properties(0)
    rows = []
    for m, n, k in load_shapes(args.shapes):
        for dt in args.dtypes:
            ks = kernels_of(m, n, k, DTYPES[dt], args.iters)
            rows.append({"m": m, "n": n, "k": k, "dtype": dt, "kernels": ks})
            print(f"{m}x{n}x{k} {dt}: " + "; ".join(f"{x['name']} {x['mean_us']} us" for x in ks))
    doc = {"gpu": props.name, "torch": torch.__version__, "shapes": rows}
    fd, tmp = tempfile.mkstemp(dir=args.out.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
