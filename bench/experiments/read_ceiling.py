"""A measured ceiling for decode GEMMs: how fast the GPU moves a shape's compulsory bytes.

    python bench/experiments/read_ceiling.py [--shapes bench/shapes/llm-public.toml]
        [--m-max 256] [--bench bench/results/h100-llm-public-cublaslt.jsonl] --out FILE

Per shape (fp16), in one process and with the project's one timing function (offline:
graph replay over operand sets larger than L2):
- ``read_*``: a kernel that reads W [N,K] and X [M,K] once and writes Y [M,N] once, with
  no arithmetic (read_ceiling.cu), in twelve launch configurations; ``read_best`` is the
  fastest median. No GEMM of the shape can be faster: it must move the same bytes.
- ``empty``: an empty kernel, the cost of a kernel boundary in a graph of launches.
- ``torch``: torch.matmul (tn), to tie this run to the bench file's vendor times.

The ceiling on any kernel's speedup over the best vendor is then
``best_vendor / read_best``, with the best vendor's time taken from the committed bench
file and scaled by the ratio of the two runs' torch times (clocks differ between runs).
One JSON line per shape goes to ``--out``; a table and the geomean go to stdout.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARGS_TYPES = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64)
UNROLLS = (4, 8, 16)
GRIDS = ((256, 8), (512, 4), (1024, 2), (512, 2))  # (threads per block, blocks per SM)


def compile_cubin(source: Path = HERE / "read_ceiling.cu") -> bytes:
    """``source`` (a .cu of this folder) compiled for sm_90a with nvcc; the cubin's bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{source.stem}.cubin"
        cmd = [
            "nvcc",
            "-cubin",
            "-arch=sm_90a",
            "-O3",
            "-o",
            str(out),
            str(source),
        ]
        subprocess.run(cmd, check=True)
        return out.read_bytes()


def vendor_times(bench: Path, m_max: int) -> dict:
    """(m, n, k) -> (best vendor µs, its name, torch µs) from a bench file, fp16 tn offline."""
    got = {}
    for line in bench.read_text().splitlines():
        r = json.loads(line)
        t = r["target"]
        if r["mode"] != "offline" or t["dtype"] != "fp16" or t["layout"] != "tn" or t["m"] > m_max:
            continue
        got[(t["m"], t["n"], t["k"])] = (
            r["best_vendor"]["median_us"],
            r["best_vendor"]["name"],
            r["baselines"]["torch"]["median_us"],
        )
    return got


def measure(m: int, n: int, k: int, cubin: bytes, sms: int) -> dict:
    import torch

    from cudal2.packaging.runtime import driver
    from cudal2.verify.timing import TimingConfig, operand_sets, time_interleaved

    read_bytes = (n * k + m * k) * 2
    write_bytes = m * n * 2
    nsets = operand_sets(read_bytes + write_bytes)
    # One buffer per set holds W then X (both read once); Y is separate. Sizes are
    # rounded up to 16 bytes: a shape's bytes differ from the GEMM's by < 16.
    n16, nout16 = -(-read_bytes // 16), -(-write_bytes // 16)
    src = [
        torch.randint(-(2**31), 2**31 - 1, (n16 * 4,), dtype=torch.int32, device="cuda")
        for _ in range(nsets)
    ]
    dst = [torch.empty(nout16 * 4, dtype=torch.int32, device="cuda") for _ in range(nsets)]
    a = [torch.randn(m, k, device="cuda", dtype=torch.float16) for _ in range(nsets)]
    w = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(nsets)]
    c = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(nsets)]

    def launcher(kernel, threads: int, blocks: int):
        def run(j: int) -> None:
            stream = torch.cuda.current_stream().cuda_stream
            args = (src[j].data_ptr(), n16, dst[j].data_ptr(), nout16)
            kernel.launch((blocks, 1, 1), (threads, 1, 1), stream, args, ARGS_TYPES)

        return run

    fns = {}
    for u in UNROLLS:
        kern = driver.Kernel(cubin, f"read_u{u}", 0)
        for threads, per_sm in GRIDS:
            fns[f"read_u{u}_t{threads}_b{per_sm}"] = launcher(kern, threads, per_sm * sms)
    fns["empty"] = launcher(driver.Kernel(cubin, "empty", 0), 32, 1)
    fns["torch"] = lambda j: torch.matmul(a[j], w[j].t(), out=c[j])
    est = read_bytes / 2.5e12 * 1e6
    timings = time_interleaved(fns, nsets, TimingConfig(reps=30), est_us=est)
    reads = {name: t for name, t in timings.items() if name.startswith("read_")}
    best = min(reads, key=lambda name: reads[name].median_us)
    return {
        "target": {"m": m, "n": n, "k": k, "dtype": "fp16", "layout": "tn"},
        "read_bytes": read_bytes,
        "write_bytes": write_bytes,
        "timings": {name: t.as_json() for name, t in timings.items()},
        "read_best": {"name": best, "median_us": round(reads[best].median_us, 4)},
        "read_tbps": round((read_bytes + write_bytes) / (reads[best].median_us * 1e-6) / 1e12, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="bench/shapes/llm-public.toml")
    ap.add_argument("--m-max", type=int, default=256)
    ap.add_argument("--bench", default="bench/results/h100-llm-public-cublaslt.jsonl")
    ap.add_argument("--cubin", help="a compiled read_ceiling.cu (default: compile with nvcc)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch

    from cudal2.packaging.runtime import driver
    from cudal2.shapes import load_shapes
    from cudal2.verify.gpu import current_gpu

    cubin = Path(args.cubin).read_bytes() if args.cubin else compile_cubin()
    vendor = vendor_times(Path(args.bench), args.m_max)
    shapes = [s for s in load_shapes(args.shapes) if s[0] <= args.m_max]
    gpu = current_gpu().as_json()
    sms = driver.sm_count(torch.cuda.current_device())
    ratios = []
    head = f"{'MxNxK':>14} {'read us':>8} {'TB/s':>6} {'empty':>6} {'torch':>8} {'vendor*':>8}"
    print(head + "  ceiling")
    with open(args.out, "w") as out:
        for m, n, k in shapes:
            rec = measure(m, n, k, cubin, sms)
            rec["gpu"] = gpu
            torch_us = rec["timings"]["torch"]["median_us"]
            line = (
                f"{m:>4}x{n}x{k:<6} {rec['read_best']['median_us']:8.2f} {rec['read_tbps']:6.3f}"
                f" {rec['timings']['empty']['median_us']:6.2f} {torch_us:8.2f}"
            )
            if (m, n, k) in vendor:
                bv, name, bench_torch = vendor[(m, n, k)]
                scaled = bv * torch_us / bench_torch  # the bench's best vendor at this run's clocks
                ceiling = scaled / rec["read_best"]["median_us"]
                rec["vendor"] = {
                    "bench": args.bench,
                    "name": name,
                    "median_us": bv,
                    "bench_torch_us": bench_torch,
                    "scaled_us": round(scaled, 4),
                }
                rec["ceiling_speedup"] = round(ceiling, 4)
                ratios.append(ceiling)
                line += f" {scaled:8.2f}  {ceiling:.3f}"
            print(line, flush=True)
            out.write(json.dumps(rec, sort_keys=True) + "\n")
    if ratios:
        g = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(
            f"{len(ratios)} shapes: geomean ceiling {g:.3f} x best vendor; "
            f"{sum(r >= 1.15 for r in ratios)} allow >= 1.15, "
            f"{sum(r > 1.0 for r in ratios)} allow > 1.0"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
