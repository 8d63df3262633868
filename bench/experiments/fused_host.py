"""Host time per call of the fused ops (``linear_residual``, ``linear_gated``,
``linear_rmsnorm``: ABI gemm_v3 kernels) on each launch path, with the GPU out of the
picture: the GPU is held busy (``torch.cuda._sleep``) long enough that ``--calls`` calls
back to back only queue, and the host's time per call is measured. Paths: ``native``
(the package's Api method, handing the call to the op's native CUDA kernel), ``op``
(``torch.ops.<ns>.<op>`` itself, native), ``python`` (the Api method with
``CUDAL2_NATIVE=0``: the Python launch path) and ``torch`` (torch's unfused ops, what a
model runs without the package). Every fused entry of the package's table (dtype, N, K,
epilogue) at each ``--tokens`` M it serves; paths interleaved in random order per
repetition, medians and the paired python / native ratio.

    python bench/experiments/fused_host.py --package PKG --out fused-host.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import statistics
import time
from pathlib import Path

EPS = 1e-5


def _calls(pkg, ops, fused, epilogue: str, x, w, b, r) -> dict:
    """The call of each path for ``epilogue`` (None: the path cannot serve it)."""
    import torch.nn.functional as F

    if epilogue in ("residual", "bias_residual"):
        bias = b if epilogue == "bias_residual" else None
        return {
            "native": lambda: pkg.linear_residual(x, w, r, bias),
            "op": lambda: ops.linear_residual(x, w, r, bias),
            "torch": lambda: F.linear(x, w, bias) + r,
        }
    if epilogue in ("silu", "gelu_tanh", "rmsnorm_silu", "rmsnorm_gelu_tanh"):
        act = epilogue.removeprefix("rmsnorm_")
        eps = EPS if epilogue.startswith("rmsnorm_") else None
        return {
            "native": lambda: pkg.linear_gated(x, w, act, eps),
            "op": lambda: ops.linear_gated(x, w, act, eps),
            "torch": lambda: fused.unfused_gated(x, w, act, eps),
        }
    if epilogue in ("rmsnorm", "rmsnorm_bias"):
        bias = b if epilogue == "rmsnorm_bias" else None
        return {
            "native": lambda: pkg.linear_rmsnorm(x, w, EPS, bias),
            "op": lambda: ops.linear_rmsnorm(x, w, EPS, bias),
            "torch": lambda: fused.unfused_rmsnorm(x, w, EPS, bias),
        }
    return {}  # "bias": linear's own path (Python only), not a fused op


def _served(pkg, call) -> str:
    """What served one call: the entry hit or the fallback reason."""
    pkg.stats.reset()
    call()
    s = pkg.stats.as_dict()
    hits, falls = s["hits"], s["fallbacks"]
    return f"hit {next(iter(hits))}" if hits else f"fallback {next(iter(falls), '?')}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--package", required=True)
    ap.add_argument("--tokens", default="1,16,64")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch

    pkg = importlib.import_module(args.package)
    fused = importlib.import_module(f"{args.package}._runtime.fused")
    ops = getattr(torch.ops, pkg.NAMESPACE)
    pkg.warmup()
    rng = random.Random(0)
    out: dict = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "launcher": pkg._api.launcher,
        "native_reason": pkg._api.native_reason,
        "calls": args.calls,
        "reps": args.reps,
        "ops": [],
    }
    targets = sorted(
        {(e.dtype, e.n, e.k, e.epilogue) for e in pkg._api.table.entries if e.epilogue != "none"}
    )
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16}
    with torch.inference_mode():
        for dtype, n, k, epilogue in targets:
            for m in [int(t) for t in args.tokens.split(",")]:
                t = dtypes[dtype]
                x = torch.randn(m, k, device="cuda", dtype=t)
                w = torch.randn(n, k, device="cuda", dtype=t) * k**-0.5
                b, r = (
                    torch.randn(n, device="cuda", dtype=t),
                    torch.randn(m, n, device="cuda", dtype=t),
                )
                calls = _calls(pkg, ops, fused, epilogue, x, w, b, r)
                if not calls:
                    continue
                paths = {**calls, "python": calls["native"]}
                env = {p: ("0" if p == "python" else None) for p in paths}
                served = {}
                for p, call in paths.items():
                    _set_native(env[p])
                    call()  # warm: the plan, the allocator
                    served[p] = _served(pkg, call) if p != "torch" else "torch"
                times: dict[str, list[float]] = {p: [] for p in paths}
                for _ in range(args.reps):
                    for p in rng.sample(list(paths), len(paths)):
                        _set_native(env[p])
                        call = paths[p]
                        torch.cuda.synchronize()
                        torch.cuda._sleep(100_000_000)  # the calls below only queue
                        t0 = time.perf_counter()
                        for _ in range(args.calls):
                            call()
                        times[p].append((time.perf_counter() - t0) / args.calls * 1e6)
                        torch.cuda.synchronize()
                _set_native(None)
                ratio = [py / nat for py, nat in zip(times["python"], times["native"], strict=True)]
                row = {
                    "dtype": dtype,
                    "n": n,
                    "k": k,
                    "m": m,
                    "epilogue": epilogue,
                    "served": served,
                    "host_us": {p: round(statistics.median(v), 2) for p, v in times.items()},
                    "paired_python_over_native": round(statistics.median(ratio), 3),
                }
                out["ops"].append(row)
                print(json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


def _set_native(value: str | None) -> None:
    """``CUDAL2_NATIVE`` as a path needs it (both launch paths read it on every call)."""
    if value is None:
        os.environ.pop("CUDAL2_NATIVE", None)
    else:
        os.environ["CUDAL2_NATIVE"] = value


if __name__ == "__main__":
    raise SystemExit(main())
