"""Benchmark one GPU: every vendor baseline (and optionally a cudal2 wheel's dispatch)
on a list of shapes, each timed with the project's one timing function.

Baselines per shape (fp16/bf16 in, fp32 accumulate, C = A · op(W)):
- ``torch``: torch.matmul on the target's layout;
- ``cublas_tn`` / ``cublas_nn``: cublasGemmEx with W stored [N,K] / [K,N];
- ``cublaslt_heuristic``: cuBLASLt's top-1 heuristic algorithm;
- ``cublaslt_autotune``: every heuristic candidate (up to 100) timed once, the fastest
  then timed again with the others (a selection, not a minimum of noisy medians).
``best_vendor`` is the fastest of these. ``cudal2`` is what the wheel's dispatch runs:
its kernel, the cuBLASLt algorithm its build autotuned (run with the runtime's own
cuBLASLt code), or the fallback (torch.matmul), whose time is then torch's.

Any median under the physical floor is rejected as a measurement error, and the
winner and the cudal2 kernel are re-timed with full device synchronisation around the
call to cross-check the events.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cudal2 import __version__
from cudal2.hardware import datasheet, floor_us
from cudal2.records import GpuInfo, Target
from cudal2.verify.spread import nvmath_available
from cudal2.verify.timing import (
    Timing,
    TimingConfig,
    hold,
    operand_sets,
    time_interleaved,
    time_with_sync,
)
from cudal2.verify.vendor import (
    AUTOTUNE_LIMIT,
    LT_WORKSPACE_BYTES,
    Cublas,
    LtProblem,
    Problem,
    autotune,
    lt_handle,
)

VENDORS = ("torch", "cublas_tn", "cublas_nn", "cublaslt_heuristic", "cublaslt_autotune")
SYNC_DISAGREEMENT = 0.5  # flag when events claim < half of the synchronised time (less overhead)


def measure_ceilings() -> dict[str, float]:
    """Achieved peak (a large cuBLAS GEMM) and bandwidth (a device copy, read + write)."""
    import torch

    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    c = torch.empty_like(a)
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    cfg = TimingConfig(reps=10, min_replay_us=0)
    t = time_interleaved(
        {"gemm": lambda j: torch.matmul(a, b, out=c), "copy": lambda j: dst.copy_(src)},
        1,
        cfg,
        est_us=1000.0,
    )
    return {
        "peak_tflops": round(2 * n**3 / (t["gemm"].median_us * 1e-6) / 1e12, 1),
        "copy_tbps": round(2 * src.numel() / (t["copy"].median_us * 1e-6) / 1e12, 3),
    }


@dataclass
class Operands:
    a: list  # [M,K] per set
    w_tn: list  # [N,K] per set
    w_nn: list  # [K,N] per set (the same values, transposed)
    c: list  # [M,N] per set


def make_operands(t: Target, nsets: int, seed: int) -> Operands:
    import torch

    from cudal2.verify.correctness import torch_dtype

    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    dt_ = torch_dtype(t.dtype)
    ops = Operands([], [], [], [])
    for _ in range(nsets):
        # Never zeros: values like real data (zeros run faster and hide unwritten output).
        ops.a.append((torch.rand(t.m, t.k, generator=gen, device="cuda") * 2 - 1).to(dt_))
        w = (torch.rand(t.n, t.k, generator=gen, device="cuda") * 2 - 1).to(dt_)
        ops.w_tn.append(w)
        ops.w_nn.append(w.t().contiguous())
        ops.c.append(torch.empty(t.m, t.n, dtype=dt_, device="cuda"))
    return ops


def below_floor(timings: dict[str, Timing], floor: float) -> list[str]:
    """A median under the physical floor is a measurement error (work that escaped the
    timed stream, a skipped computation, a broken timer), never a fast kernel."""
    return [
        f"{name}: median {tm.median_us:.3f} us is below the physical floor {floor:.3f} us"
        for name, tm in timings.items()
        if tm.median_us < floor
    ]


def settle(fn: Callable[[int], object], nsets: int, ms: float) -> None:
    """``fn`` called on the operand sets in turn, back to back, for ``ms`` of host time
    (``verify.timing.hold``, 8 calls a step, so the host never runs far ahead of the
    GPU): a prefill GEMM's GPU steps its clock down into the power limit within the
    first tens of milliseconds of sustained work, so a shape timed at once mixes two
    clock states in its samples, and which one most of them see depends on the shape
    before it (docs/measuring.md, "The declared timing state of prefill")."""
    calls = itertools.count()

    def eight() -> None:
        for _ in range(8):
            fn(next(calls) % nsets)

    hold(eight, ms)


class Bench:
    """Holds the library handles and workspace for a run; ``shape`` measures one."""

    def __init__(
        self,
        gpu: GpuInfo,
        mode: str,
        reps: int = 30,
        seed: int = 0,
        kernels=None,
        settle_ms: int = 0,
    ):
        import torch

        self.gpu, self.mode, self.reps, self.seed = gpu, mode, reps, seed
        self.settle_ms = settle_ms  # ``settle``: before each shape's autotuning
        self.kernels = kernels  # a WheelKernels, or None
        self._ws = torch.empty(LT_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        self._cublas_ws = torch.empty(LT_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        self.cublas = Cublas(self._cublas_ws.data_ptr(), self._cublas_ws.numel())
        self.lt = lt_handle()
        self.tiny = torch.empty(1, device="cuda")

    def _stream(self) -> int:
        import torch

        return torch.cuda.current_stream().cuda_stream

    def shape(self, t: Target) -> dict[str, Any]:
        import torch

        # Sized by what one call reads (A, one W, C): each callable's rotation exceeds L2.
        nsets = operand_sets(t.min_bytes)
        ops = make_operands(t, nsets, self.seed)
        floor = floor_us(t, self.gpu.name)
        est = max(floor, 2.0)
        cfg = TimingConfig(reps=self.reps, mode=self.mode, seed=self.seed)
        w_t = [w.t() for w in ops.w_tn] if t.layout == "tn" else ops.w_nn
        p_tn = Problem(t.dtype, "tn", t.m, t.n, t.k)
        p_nn = Problem(t.dtype, "nn", t.m, t.n, t.k)
        lt = LtProblem(
            self.lt,
            Problem(t.dtype, t.layout, t.m, t.n, t.k),
            self._ws.data_ptr(),
            self._ws.numel(),
        )
        w_own = ops.w_tn if t.layout == "tn" else ops.w_nn
        count = lt.heuristics(AUTOTUNE_LIMIT)

        def lt_algo(i: int) -> Callable[[int], None]:
            return lambda j: lt.run(
                i, ops.a[j].data_ptr(), w_own[j].data_ptr(), ops.c[j].data_ptr(), self._stream()
            )

        def cublas(p: Problem, w: list) -> Callable[[int], None]:
            return lambda j: self.cublas.gemm(
                p, ops.a[j].data_ptr(), w[j].data_ptr(), ops.c[j].data_ptr(), self._stream()
            )

        if self.settle_ms:  # into the clock state of a sustained run (``settle``)
            settle(lambda j: torch.matmul(ops.a[j], w_t[j], out=ops.c[j]), nsets, self.settle_ms)
        # Autotune: time every heuristic candidate once (fewer reps), keep the fastest.
        order, tuned = autotune(lt, lt_algo, nsets, max(5, self.reps // 3), self.seed, est)
        best_algo = order[0]

        fns: dict[str, Callable[[int], object]] = {
            "torch": lambda j: torch.matmul(ops.a[j], w_t[j], out=ops.c[j]),
            "cublas_tn": cublas(p_tn, ops.w_tn),
            "cublas_nn": cublas(p_nn, ops.w_nn),
            "cublaslt_heuristic": lt_algo(0),
            "cublaslt_autotune": lt_algo(best_algo),
        }
        dispatch = None
        if self.kernels is not None:
            dispatch = self.kernels.describe(t)
            if dispatch["kind"] == "cublaslt" and not nvmath_available():
                # The wheel's runtime falls back to torch without nvmath: time that.
                dispatch = {"kind": "fallback", "reason": "cublaslt_missing"}
            if dispatch["kind"] != "fallback":
                fns["cudal2"] = self.kernels.launcher(t, ops.a, w_own, ops.c)
        timings = time_interleaved(fns, nsets, cfg, est)
        rec = self._record(t, timings, floor, nsets, count, best_algo, tuned, dispatch)
        # Cross-check the winner (and our kernel) with synchronised host timing.
        checks = {}
        for name in {rec["best_vendor"]["name"], *(["cudal2"] if "cudal2" in fns else [])}:
            checks[name] = self._sync_check(fns[name], timings[name])
        rec["sync_check"] = checks
        torch.cuda.empty_cache()  # the next shape's operand sets may be larger
        return rec

    def _sync_check(self, fn: Callable[[int], object], timing: Timing) -> dict[str, Any]:
        """One call, captured in a graph, replayed between full synchronisations, less
        the same for a trivial graph: graph launch costs the same host time whatever
        the call, so Python-side differences between libraries cancel out."""
        import torch

        graphs = []
        for work in (lambda: self.tiny.zero_(), lambda: fn(0)):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                work()
            graphs.append(g)
        overhead = time_with_sync(graphs[0].replay)
        sync_us = time_with_sync(graphs[1].replay)
        agree = timing.median_us >= SYNC_DISAGREEMENT * max(sync_us - overhead, 0.0)
        return {"sync_us": round(sync_us, 3), "overhead_us": round(overhead, 3), "agrees": agree}

    def _record(
        self, t, timings, floor, nsets, count, best_algo, tuned, dispatch
    ) -> dict[str, Any]:
        errors = below_floor(timings, floor)
        valid = {n: tm for n, tm in timings.items() if tm.median_us >= floor}
        vendors = {n: valid[n] for n in VENDORS if n in valid}
        best = min(vendors, key=lambda n: vendors[n].median_us) if vendors else None
        if dispatch is None or dispatch["kind"] == "fallback":
            own = valid.get("torch")  # the fallback is torch.matmul
        else:
            own = valid.get("cudal2")
        return {
            "tool_version": __version__,
            "measured_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "gpu": self.gpu.as_json(),
            "mode": self.mode,
            "target": t.as_json(),
            "floor_us": round(floor, 4),
            "datasheet": {
                "flops": datasheet(self.gpu.name).flops,
                "bytes_per_s": datasheet(self.gpu.name).bandwidth,
            },
            "timing": {
                "sets": nsets,
                "reps": self.reps,
                **({"settle_ms": self.settle_ms} if self.settle_ms else {}),
            },
            "baselines": {n: timings[n].as_json() for n in VENDORS if n in timings},
            "cublaslt_autotune": {
                "algorithms": count,
                "best_index": best_algo,
                "candidates_us": [round(tuned[f"lt{i}"].median_us, 4) for i in range(count)],
            },
            "best_vendor": {"name": best, "median_us": round(vendors[best].median_us, 4)}
            if best
            else None,
            "cudal2": {
                "dispatch": dispatch or {"kind": "fallback", "reason": "no wheel given"},
                "median_us": round(own.median_us, 4) if own else None,
                "timing": timings["cudal2"].as_json() if "cudal2" in timings else None,
                "floor_fraction": round(floor / own.median_us, 4) if own else None,
            },
            "errors": errors,
        }
