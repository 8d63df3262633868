"""The vendor spread: how far each vendor baseline lands from the fp32 reference on the
same inputs. A candidate's deviation is bounded by it (``correctness.bound``).

The baselines are the ones the bench times (``cudal2/bench/bench.py``): torch.matmul,
cuBLAS ``gemm_ex`` with W stored [N,K] (TN) and [K,N] (NN), and every cuBLASLt
heuristic candidate (up to ``AUTOTUNE_LIMIT``): the first is the heuristic baseline,
and the autotuned one is whichever of them times fastest, so all of them count.

Every candidate of a target draws the same inputs (each trial from its own generator,
``correctness.derived_seed``): the errors are computed once per (target, inputs) and
cached here by a fingerprint of the inputs. A measuring worker keeps them with the
trial itself (``cudal2.verify.inputs.InputCache``), so it asks here once per trial.
"""

from __future__ import annotations

from collections.abc import Mapping

from cudal2.records import Target
from cudal2.verify.correctness import max_abs_error, torch_error
from cudal2.verify.vendor import (
    AUTOTUNE_LIMIT,
    LT_WORKSPACE_BYTES,
    Cublas,
    LtProblem,
    Problem,
    lt_handle,
)


def nvmath_available() -> bool:
    try:
        import nvmath.bindings.cublasLt  # noqa: F401
    except ImportError:
        return False
    return True


class VendorSpread:
    """Callable as ``correctness.check``'s ``vendor_errors``."""

    def __init__(self, lt_limit: int = AUTOTUNE_LIMIT, cache_size: int = 64) -> None:
        self.lt_limit = lt_limit
        self._cache: dict[tuple, dict[str, float]] = {}
        self._cache_size = cache_size
        self._lt: dict[str, LtProblem] = {}
        # The handles and their workspaces are made at first use (a measuring worker
        # starts without them: its first job makes them, a worker restarted after a
        # crash that never checks a kernel never does).
        self._handles: tuple | None = None

    def _made(self) -> tuple:
        """(cuBLAS, cuBLASLt handle, cuBLASLt workspace, cuBLAS workspace), made once."""
        if self._handles is None:
            import torch

            ws = torch.empty(LT_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
            cublas_ws = torch.empty(LT_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
            cublas = Cublas(cublas_ws.data_ptr(), cublas_ws.numel())
            self._handles = (cublas, lt_handle(), ws, cublas_ws)
        return self._handles

    @property
    def cublas(self) -> Cublas:
        return self._made()[0]

    @property
    def lt(self) -> int:
        return self._made()[1]

    @property
    def _ws(self):
        return self._made()[2]

    def problem(self, t: Target) -> LtProblem:
        """``t``'s cuBLASLt problem with its heuristic candidates (made once per target;
        the vendor job of the build autotunes the same list)."""
        lt = self._lt.get(t.key)
        if lt is None:
            lt = LtProblem(
                self.lt,
                Problem(t.dtype, t.layout, t.m, t.n, t.k),
                self._ws.data_ptr(),
                self._ws.numel(),
            )
            lt.heuristics(self.lt_limit)
            self._lt[t.key] = lt
        return lt

    @staticmethod
    def _fingerprint(t: Target, a, b) -> tuple:
        return (t.key, float(a.double().sum()), float(b.double().sum()), float(a[-1].sum()))

    def __call__(self, t: Target, a, b, ref) -> Mapping[str, float]:
        key = self._fingerprint(t, a, b)
        if key not in self._cache:
            if len(self._cache) >= self._cache_size:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = self._errors(t, a, b, ref)
        return self._cache[key]

    def _errors(self, t: Target, a, b, ref) -> dict[str, float]:
        import torch

        errs = dict(torch_error(t, a, b, ref))
        stream = torch.cuda.current_stream().cuda_stream
        c = torch.empty((t.m, t.n), dtype=a.dtype, device="cuda")
        w = {t.layout: b, ("nn" if t.layout == "tn" else "tn"): b.t().contiguous()}
        for lay in ("tn", "nn"):
            p = Problem(t.dtype, lay, t.m, t.n, t.k)
            c.fill_(float("nan"))
            self.cublas.gemm(p, a.data_ptr(), w[lay].data_ptr(), c.data_ptr(), stream)
            errs[f"cublas_{lay}"] = max_abs_error(c, ref)
        lt = self.problem(t)
        for i in range(lt.count):
            c.fill_(float("nan"))
            lt.run(i, a.data_ptr(), b.data_ptr(), c.data_ptr(), stream)
            errs[f"cublaslt_{i}"] = max_abs_error(c, ref)
        return errs
