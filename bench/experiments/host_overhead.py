"""Host cost per call of the wheel's launch paths, against the raw driver launch.

For a small covered shape (the wheel's smallest kernel entry at M = 1), each path is
called ``--calls`` times back to back while the GPU is held busy by a spin kernel, so
launches only queue and the host's time per call is what is measured (the launch
queue holds far more than ``--calls`` launches). Paths, from the bottom up:

- ``raw_cuLaunchKernel``: ``cuda.bindings.driver.cuLaunchKernel`` of the entry's
  CUfunction with arguments prepared once (the floor for a Python launch);
- ``raw_cuLaunchKernelEx_native``: the native launcher's own launch of the same plan
  from C, 200 to a call (``cudal2_native_launch_loop``: the floor for the native path);
- ``runtime_launch_gemm``: the runtime's ``driver.launch_gemm`` (grid from the recipe
  per call, on a ``GemmArgs`` block made once);
- ``api_linear``: ``Api.linear`` (``k.linear``): on CUDA tensors in inference it hands
  the call to the op when the native launcher serves (``_native``), else the Python
  checks, dispatch by shape, output allocation and launch (``_python``);
- ``op_linear``: ``torch.ops.<ns>.linear``: the torch dispatcher, then the native CUDA
  kernel (``_native``) or, with ``CUDAL2_NATIVE=0``, the Python kernel (``_python``);
- ``patched_module``: an ``nn.Linear`` routed by ``patch_linear``, patched with the
  native path on (``_native``) or off (``_python``, today's Python forward);
- ``cupy_linear``: ``k.linear`` on CuPy arrays (the Python launcher: the native one
  serves the torch op), where CuPy is installed;
- ``unpatched_module``: the same ``nn.Linear`` unpatched (cuBLAS), and ``F_linear``:
  ``torch.nn.functional.linear`` (cuBLAS), for reference.

The ``_python`` paths run with ``CUDAL2_NATIVE=0`` set around their batches, so both
launch paths are measured in one process, interleaved batch by batch.

Per path: the median over ``--reps`` batches of (batch host time / calls).

    python bench/experiments/host_overhead.py --package PKG \\
        --out bench/results/h100-host-overhead.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import random
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

NATIVE_ENV = "CUDAL2_NATIVE"
NATIVE_FLOOR = "raw_cuLaunchKernelEx_native"


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

    def linear() -> Any:
        lin = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.float16).eval()
        with torch.no_grad():
            lin.weight.copy_(w)
        return lin

    plain, lin, lin_py = linear(), linear(), linear()
    patch = pkg.patch_linear(lin)
    assert patch.names == [""], patch.names
    os.environ[NATIVE_ENV] = "0"  # patched now: today's Python forward
    patch_py = pkg.patch_linear(lin_py)
    del os.environ[NATIVE_ENV]
    native = api.launcher == "native"
    print(f"launcher: {api.launcher} ({api.native_reason or 'native kernels registered'})")
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

    opd = op.default
    paths = {
        "raw_cuLaunchKernel": raw,
        "runtime_launch_gemm": launch_gemm,
        "api_linear_python": lambda: api.linear(x, w),
        "op_linear_python": lambda: opd(x, w),
        "patched_module_python": lambda: lin_py(x),
        "unpatched_module": lambda: plain(x),
        "F_linear": lambda: F.linear(x, w),
    }
    try:  # CuPy arrays keep the Python launcher (the native one is the torch op's)
        import cupy

        x_cp, w_cp = cupy.from_dlpack(x), cupy.from_dlpack(w)
        paths["cupy_linear"] = lambda: api.linear(x_cp, w_cp)
    except ImportError:
        pass
    python_paths = {name for name in paths if name.endswith("_python")}
    if native:
        paths |= {
            "api_linear_native": lambda: api.linear(x, w),
            "op_linear_native": lambda: opd(x, w),
            "patched_module_native": lambda: lin(x),
        }
    per_call: dict[str, list[float]] = {name: [] for name in paths}
    rng = random.Random(0)
    with torch.no_grad():
        for name, f in paths.items():  # warm-up, and each path checked to run its path
            with _env(name in python_paths):
                api.stats.reset()
                for _ in range(20):
                    f()
                if name.startswith(("api", "op", "patched", "cupy")):
                    assert api.stats.hits and not api.stats.fallbacks, (name, api.stats)
        torch.cuda.synchronize()
        for _ in range(args.reps):
            order = list(paths)
            rng.shuffle(order)  # interleaved in random order, batch by batch
            for name in order:
                f = paths[name]
                with _env(name in python_paths):
                    torch.cuda._sleep(50_000_000)  # ~25 ms of spinning: launches only queue
                    t0 = time.perf_counter_ns()
                    for _ in range(args.calls):
                        f()
                    t1 = time.perf_counter_ns()
                torch.cuda.synchronize()
                per_call[name].append((t1 - t0) / args.calls / 1000.0)
    if native:  # the native path's floor: the same launches from C, one call per batch
        lib, slot = api.native.lib, api.native.slot
        pid = api.native._ids[(str(e.key), 0, None)]
        per_call[NATIVE_FLOOR] = []
        loop = (slot, pid, x.data_ptr(), w.data_ptr(), c.data_ptr(), 1, n, k, k, k, stream)
        assert lib.cudal2_native_launch_loop(*loop, 1) == 0
        for _ in range(args.reps):
            torch.cuda._sleep(50_000_000)
            t0 = time.perf_counter_ns()
            assert lib.cudal2_native_launch_loop(*loop, args.calls) == 0
            t1 = time.perf_counter_ns()
            torch.cuda.synchronize()
            per_call[NATIVE_FLOOR].append((t1 - t0) / args.calls / 1000.0)
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
        "launcher": api.launcher,
        "native_reason": api.native_reason,
        "host_us_per_call": med,
        "above_raw_launch_us": {name: round(v - base, 2) for name, v in med.items()},
        # each path above its own floor: the C launch for the native paths
        "above_floor_us": {
            name: round(v - (med[NATIVE_FLOOR] if name.endswith("_native") else base), 2)
            for name, v in med.items()
        },
        "ratios": _ratios(med),
        "p20_p80_us": {
            name: [round(sorted(v)[len(v) // 5], 2), round(sorted(v)[(4 * len(v)) // 5], 2)]
            for name, v in per_call.items()
        },
    }
    patch.restore()
    patch_py.restore()
    print(json.dumps(res, indent=1))
    Path(args.out).write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    return 0


@contextlib.contextmanager
def _env(python_path: bool) -> Iterator[None]:
    """``CUDAL2_NATIVE=0`` inside (a ``_python`` path), unset otherwise."""
    if python_path:
        os.environ[NATIVE_ENV] = "0"
    try:
        yield
    finally:
        os.environ.pop(NATIVE_ENV, None)


def _ratios(med: dict[str, float]) -> dict[str, float]:
    """The issue's targets: patched / unpatched module, op / F.linear, per path."""
    out = {}
    for path in ("native", "python"):
        if f"patched_module_{path}" in med:
            out[f"patched_vs_unpatched_{path}"] = round(
                med[f"patched_module_{path}"] / med["unpatched_module"], 3
            )
            out[f"op_vs_F_linear_{path}"] = round(med[f"op_linear_{path}"] / med["F_linear"], 3)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
