"""Host cost per call of the wheel's launch paths, against the raw driver launch.

For a small covered shape (the wheel's smallest kernel entry at M = 1), each path is
called ``--calls`` times back to back while the GPU is held busy by a spin kernel, so
launches only queue and the host's time per call is what is measured (the launch
queue holds far more than ``--calls`` launches). Paths, from the bottom up:

- ``raw_cuLaunchKernel``: ``cuda.bindings.driver.cuLaunchKernel`` of the entry's
  CUfunction with arguments prepared once (the floor for a Python launch);
- ``runtime_launch_gemm``: the runtime's ``driver.launch_gemm`` (grid from the recipe
  per call, on a ``GemmArgs`` block made once);
- ``api_linear``: ``Api.linear`` (checks, dispatch by shape, output allocation, launch);
- ``op_linear``: ``torch.ops.<ns>.linear`` (the torch dispatcher, then the above): the
  "op entry to launch return" figure;
- ``patched_module``: an ``nn.Linear`` routed by ``patch_linear`` (module call + op);
- ``F_linear``: ``torch.nn.functional.linear`` (cuBLAS), for reference.

Per path: the median over ``--reps`` batches of (batch host time / calls).

    python bench/experiments/host_overhead.py --package PKG \\
        --out bench/results/h100-host-overhead.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time
from pathlib import Path
from typing import Any


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--package", required=True)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    pkg = importlib.import_module(args.package)
    api = pkg._api
    runtime_driver = importlib.import_module(f"{args.package}._runtime.driver")
    runtime_abi = importlib.import_module(f"{args.package}._runtime.abi")
    entries = [e for e in api.table.entries if e.kind == "kernel" and e.m_measured == 1]
    e = min(entries, key=lambda e: e.n * e.k)
    n, k = e.n, e.k
    x = torch.randn(1, k, device="cuda", dtype=torch.float16)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k**0.5
    lin = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.float16).eval()
    with torch.no_grad():
        lin.weight.copy_(w)
    patch = pkg.patch_linear(lin)
    assert patch.names == [""], patch.names
    pkg.warmup()
    op = getattr(torch.ops, pkg.NAMESPACE).linear
    api.stats.reset()
    y = api.linear(x, w)
    assert sum(api.stats.hits.values()) == 1, api.stats  # the kernel path, not a fallback
    assert torch.allclose(y.float(), F.linear(x, w).float(), atol=1e-2, rtol=1e-2)

    plan = api._ready[(0, "fp16", "tn", 1, n, k)]
    kernel, recipe = plan.kernel, plan.recipe
    c = torch.empty(1, n, device="cuda", dtype=torch.float16)
    stream = torch.cuda.current_stream().cuda_stream
    drv = runtime_driver._driver()
    fn = kernel.function(0)
    grid = runtime_driver.gemm_grid(recipe, 1, n, 0)
    block = tuple(recipe["block"])
    params: tuple = (x.data_ptr(), w.data_ptr(), c.data_ptr(), 1, n, k, k, k, n)
    types = runtime_driver.GEMM_V1_TYPES
    if recipe.get("abi") == "gemm_v2":  # TMA kernels also take two tensor maps, by value
        boxes = recipe["tma"]
        params = (
            *params,
            runtime_driver.tensor_map(x.data_ptr(), 1, k, k, tuple(boxes["a"])),
            runtime_driver.tensor_map(w.data_ptr(), n, k, k, tuple(boxes["b"])),
        )
        types = runtime_driver.GEMM_V2_TYPES
    packed = (params, types)
    cu_stream = drv.CUstream(stream)

    def raw() -> Any:
        return drv.cuLaunchKernel(fn, *grid, *block, kernel.smem_bytes, cu_stream, packed, 0)

    assert int(raw()[0]) == 0, raw()  # CUDA_SUCCESS

    gemm = runtime_abi.GemmArgs(x.data_ptr(), w.data_ptr(), c.data_ptr(), 1, n, k, k, k, n)

    def launch_gemm() -> None:
        runtime_driver.launch_gemm(kernel, recipe, gemm, stream)

    paths = {
        "raw_cuLaunchKernel": raw,
        "runtime_launch_gemm": launch_gemm,
        "api_linear": lambda: api.linear(x, w),
        "op_linear": lambda: op(x, w),
        "patched_module": lambda: lin(x),
        "F_linear": lambda: F.linear(x, w),
    }
    per_call: dict[str, list[float]] = {name: [] for name in paths}
    with torch.no_grad():
        for f in paths.values():  # warm-up
            for _ in range(20):
                f()
        torch.cuda.synchronize()
        for _ in range(args.reps):
            for name, f in paths.items():
                torch.cuda._sleep(50_000_000)  # ~25 ms of spinning: launches only queue
                t0 = time.perf_counter_ns()
                for _ in range(args.calls):
                    f()
                t1 = time.perf_counter_ns()
                torch.cuda.synchronize()
                per_call[name].append((t1 - t0) / args.calls / 1000.0)
    med = {name: round(statistics.median(v), 2) for name, v in per_call.items()}
    base = med["raw_cuLaunchKernel"]
    res = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shape": [1, n, k],
        "entry": e.kernel,
        "abi": recipe.get("abi", "gemm_v1"),
        "calls_per_batch": args.calls,
        "batches": args.reps,
        "host_us_per_call": med,
        "above_raw_launch_us": {name: round(v - base, 2) for name, v in med.items()},
        "p20_p80_us": {
            name: [round(sorted(v)[len(v) // 5], 2), round(sorted(v)[(4 * len(v)) // 5], 2)]
            for name, v in per_call.items()
        },
    }
    patch.restore()
    print(json.dumps(res, indent=1))
    Path(args.out).write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
