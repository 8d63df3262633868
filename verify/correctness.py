"""Correctness of one kernel on one target: fp32 reference, poisoned output, exact test.

- random trials: fresh uniform(-1, 1) inputs each trial; the output is filled with
  NaN before the run and every element must be written; the error must stay within
  twice the worst deviation of the vendor baselines on the same inputs (the vendor
  spread, as in CUDA-L2: torch.matmul, cuBLAS TN and NN, every cuBLASLt heuristic
  candidate; ``cudal2.verify.spread``) and never below twice the output rounding.
- exact trial: {0,1} inputs whose every dot product is an integer <= 2048 (fp16) or
  256 (bf16), hence exactly representable: the output must equal the reference bit
  for bit. Each row of A has at most that many ones, so this holds for every K.
- repeats: the first random trial's inputs run ``repeats`` more times, each into a
  fresh NaN-filled output, which must equal the first output bit for bit. Every
  family reduces in a fixed order (no atomics), so a difference is a race: an
  unordered read of a buffer being refilled can still land inside the error bound
  (two ping-pong schedules did, on the H100), but rarely the same way twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cudal2.records import Target

EXACT_LIMIT = {"fp16": 2048, "bf16": 256}
# Unit round-off of the output type: the rounding of a correct fp32 result.
OUT_EPS = {"fp16": 2.0**-11, "bf16": 2.0**-8}


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    error: str
    max_abs_err: float
    max_rel_err: float
    # The worst vendor baseline's max |error| over the random trials, and which ones
    # were compared.
    vendor_max_abs_err: float = 0.0
    vendors: tuple[str, ...] = field(default=())


def torch_dtype(dtype: str):
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]


def operands(t: Target, kind: str, gen):
    """A [M,K] and B ([N,K] for tn, [K,N] for nn) on the GPU, fresh from ``gen``."""
    import torch

    dt = torch_dtype(t.dtype)
    b_shape = (t.n, t.k) if t.layout == "tn" else (t.k, t.n)
    if kind == "random":
        a = torch.rand((t.m, t.k), generator=gen, device="cuda") * 2 - 1
        b = torch.rand(b_shape, generator=gen, device="cuda") * 2 - 1
        return a.to(dt), b.to(dt)
    limit = min(t.k, EXACT_LIMIT[t.dtype])
    order = torch.rand((t.m, t.k), generator=gen, device="cuda").argsort(dim=1)[:, :limit]
    a = torch.zeros((t.m, t.k), device="cuda").scatter_(1, order, 1.0)
    b = (torch.rand(b_shape, generator=gen, device="cuda") < 0.5).float()
    return a.to(dt), b.to(dt)


def reference(t: Target, a, b):
    """The one reference: fp32 product of the upcast operands, TF32 off."""
    import torch

    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        bb = b.float().t() if t.layout == "tn" else b.float()
        return a.float() @ bb
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def vendor(t: Target, a, b, out=None):
    """torch.matmul on the same operands (cuBLAS): the baseline, and the error yardstick."""
    import torch

    bb = b.t() if t.layout == "tn" else b
    return torch.matmul(a, bb, out=out)


def max_abs_error(out, ref) -> float:
    return float((out.float() - ref).abs().max()) if ref.numel() else 0.0


def torch_error(t: Target, a, b, ref) -> dict[str, float]:
    """The vendor spread when no other library is at hand: torch.matmul's error alone."""
    return {"torch": max_abs_error(vendor(t, a, b), ref)}


def bound(vendor_errors: Mapping[str, float], scale: float, dtype: str) -> float:
    """The deviation a candidate may have: twice the worst vendor baseline's (the
    spread of correct implementations on these inputs), and at least twice the
    rounding of the output type at the result's scale. A baseline whose error is not
    finite (it failed to write its output) is left out rather than widening it."""
    worst = max((e for e in vendor_errors.values() if math.isfinite(e)), default=0.0)
    return max(2.0 * worst, 2.0 * OUT_EPS[dtype] * scale)


VendorErrors = Callable[[Target, object, object, object], Mapping[str, float]]


def check(
    t: Target,
    run: Callable,
    gen,
    random_trials: int = 2,
    vendor_errors: VendorErrors = torch_error,
    repeats: int = 2,
) -> CheckResult:
    """``run(a, b, c)`` launches the kernel writing c; returns after queueing it.
    ``vendor_errors(t, a, b, ref)`` gives each vendor baseline's max |error|."""
    import torch

    worst_abs = worst_rel = worst_vendor = 0.0
    names: tuple[str, ...] = ()
    for trial in range(random_trials + 1):
        kind = "random" if trial < random_trials else "exact"
        a, b = operands(t, kind, gen)
        c = torch.full((t.m, t.n), float("nan"), dtype=a.dtype, device="cuda")
        run(a, b, c)
        torch.cuda.synchronize()
        ref = reference(t, a, b)
        unwritten = int(torch.isnan(c).sum())
        if unwritten:
            return CheckResult(
                False,
                f"{kind} trial: {unwritten} output elements not written (or NaN)",
                float("inf"),
                float("inf"),
            )
        err = (c.float() - ref).abs()
        max_abs = float(err.max()) if err.numel() else 0.0
        scale = float(ref.abs().max()) if ref.numel() else 0.0
        worst_abs = max(worst_abs, max_abs)
        worst_rel = max(worst_rel, max_abs / scale if scale else max_abs)
        if kind == "exact":
            if max_abs != 0.0:
                return CheckResult(
                    False,
                    f"exact {{0,1}} trial: max |error| {max_abs} != 0",
                    worst_abs,
                    worst_rel,
                    worst_vendor,
                    names,
                )
            continue
        errs = vendor_errors(t, a, b, ref)
        names = tuple(sorted(errs))
        worst_name = max(errs, key=lambda n: errs[n] if math.isfinite(errs[n]) else -1.0)
        worst_vendor = max(worst_vendor, errs[worst_name])
        limit = bound(errs, scale, t.dtype)
        if max_abs > limit:
            return CheckResult(
                False,
                f"random trial {trial}: max |error| {max_abs:.3g} > bound {limit:.3g} "
                f"(worst of {len(errs)} vendor baselines: {worst_name} {errs[worst_name]:.3g}; "
                f"max |ref| {scale:.3g})",
                worst_abs,
                worst_rel,
                worst_vendor,
                names,
            )
        for r in range(repeats if trial == 0 else 0):
            again = torch.full_like(c, float("nan"))
            run(a, b, again)
            torch.cuda.synchronize()
            differ = int((again.view(torch.int16) != c.view(torch.int16)).sum())
            if differ:
                return CheckResult(
                    False,
                    f"repeat {r + 1}: {differ} of {c.numel()} output elements differ bit for "
                    "bit from the first run on the same inputs (a race)",
                    worst_abs,
                    worst_rel,
                    worst_vendor,
                    names,
                )
    return CheckResult(True, "", worst_abs, worst_rel, worst_vendor, names)
