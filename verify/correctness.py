"""Correctness of one kernel on one target: fp32 reference, poisoned output, exact test.

- random trials: fresh uniform(-1, 1) inputs each trial; the output is filled with
  NaN before the run and every element must be written; the error must stay within
  twice the worst deviation of the vendor baselines on the same inputs (the vendor
  spread, as in CUDA-L2: torch.matmul, cuBLAS TN and NN, every cuBLASLt heuristic
  candidate; ``cudal2.verify.spread``) and never below twice the output rounding.
- exact trial: {0,1} inputs whose every dot product is an integer <= 2048 (fp16) or
  256 (bf16), hence exactly representable: the output must equal the reference bit
  for bit. Each row of A has at most that many ones, so this holds for every K.
- fused epilogues (``Target.epilogue``): each trial also draws the epilogue's operands
  (bias [N], residual [M, N]: uniform(-1, 1), or {0,1} in the exact trial, whose dot
  products are then kept 2 below the exact limit), ``run(a, b, c, epi)`` gets them,
  the reference is the fp32 fused op (A B^T in fp32, + bias, + residual, in that
  order) and the bound is torch's unfused op's deviation from it (the vendor GEMM in
  the working dtype, then torch's add: what a user runs without cudal2), ``bound``'s
  rule; the other checks are a plain GEMM's.
- gated activation and RMSNorm row-scale epilogues (``EPILOGUE_ACTIVATION``,
  ``ROW_SCALED``): a gated one's random B is scaled by a power of two near 1/sqrt(K)
  (``gated_b_scale``); the output is C [M, out_n] (N/2 for a gated one), NaN-filled and
  every element checked like a plain GEMM's; the reference is the fp32 fused op of
  the spec (rs[m] = rsqrt(sum_k A[m,k]^2 / K + EPS) from A's 16-bit values, rs * acc,
  + bias, then act(acc[:, 2j]) * acc[:, 2j+1] over the pair interleave), B taken as
  the already folded / packed weight; the yardstick is torch's unfused op (the norm
  in the working dtype, the vendor GEMM, + bias, the activation in the working
  dtype). The kernel gets ``EPS`` = 1e-5 (``launch.dense_epilogue``). The exact
  {0,1} trial cannot be exact after rsqrt or exp: for these epilogues it is compared
  with its fp32 reference under the random trials' rule (``bound`` of torch's unfused
  op's deviation on the same {0,1} inputs), and its number of ones per row is kept
  small enough that the gated product stays finite in fp16 (``exact_ones``).
- RoPE and the KV-cache write (``ROPE_KV``, ``verify/rope_kv.py``): each trial also
  draws cos, sin, the caches (a random pattern, the slots to be written NaN) and the
  positions; the kernel gets copies of the caches; what it wrote is read back as [M, N]
  (C, then the k and v slots) and checked against the fp32 reference of the whole
  epilogue (the row scale, + bias, RoPE) like any output, every other cache element
  must be unchanged bit for bit, and the yardstick is torch's unfused sequence
  (RMSNorm, F.linear, transformers' RoPE, ``index_copy_`` into copies of the caches).
- repeats: the first random trial's inputs run ``repeats`` more times, each into a
  fresh NaN-filled output, which must equal the first output bit for bit. Every
  family reduces in a fixed order (no atomics), so a difference is a race: an
  unordered read of a buffer being refilled can still land inside the error bound
  (two ping-pong schedules did, on the H100), but rarely the same way twice.
- inputs: trial i's operands (and epilogue operands) come from a generator of their
  own, seeded by (seed, target, i) (``derived_seed``), so they are the same for every
  candidate of a target whatever was drawn before; the fp32 reference is computed from
  them before the kernel runs. A measuring worker therefore keeps them, the reference
  and the vendor errors per target (``cudal2.verify.inputs.InputCache``) instead of
  recomputing them for each candidate. Every input is read-only: after every run A, B,
  the bias and the residual must be unchanged (a checksum taken when they were drawn),
  or the trial fails (a kernel whose epilogue writes R where R is not C: before inputs
  were kept, its repeats failed instead). The residual the kernel gets is a copy made
  for the trial, C is fresh and NaN-filled. So a kept trial and a freshly drawn one
  give the same verdict, and no kernel can leave its writes to the next.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from cudal2.records import EPILOGUE_ACTIVATION, EPILOGUE_OPERANDS, ROPE_KV, ROW_SCALED, Target
from cudal2.verify import rope_kv

# Where operands are made: the GPU (a CPU test of the suite's logic sets "cpu").
DEVICE = "cuda"
EXACT_LIMIT = {"fp16": 2048, "bf16": 256}
# Unit round-off of the output type: the rounding of a correct fp32 result.
OUT_EPS = {"fp16": 2.0**-11, "bf16": 2.0**-8}
# The RMSNorm epsilon every row-scaled epilogue is verified with (Llama's 1e-5): the
# kernel gets it through ``launch.dense_epilogue``, the reference and the yardstick
# here.
EPS = 1e-5
# The largest |value| whose square (a gated product act(g) * u with g ~ u) stays
# finite in fp16 with room to spare: 181^2 = 32761 < 65504.
GATED_EXACT_MAX = 181


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


@dataclass
class Trial:
    """One trial's inputs: A, B, the epilogue's operands, the fp32 reference computed
    from them, a checksum of each (``checksum``, taken when drawn), and the vendor
    errors on them once asked (by yardstick: ``errors``)."""

    kind: str
    a: Any
    b: Any
    epi: dict[str, Any]
    ref: Any
    sums: dict[str, int]
    errs: dict[object, Mapping[str, float]] = field(default_factory=dict)

    def tensors(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, **self.epi, "ref": self.ref}

    @property
    def nbytes(self) -> int:
        return sum(x.numel() * x.element_size() for x in self.tensors().values())

    def changed(self, names: tuple[str, ...] | None = None) -> list[str]:
        """The tensors (all, or ``names`` of them) whose checksum differs from the
        one taken when they were drawn."""
        have = self.tensors()
        names = tuple(n for n in names or tuple(have) if n in have)
        sums = checksums([have[n] for n in names])
        return [n for n, s in zip(names, sums, strict=True) if s != self.sums[n]]

    def errors(self, key: object, compute: Callable[..., Mapping[str, float]], *args):
        """The vendor errors on these inputs by yardstick ``key``: ``compute(*args)``,
        once."""
        if key not in self.errs:
            self.errs[key] = compute(*args)
        return self.errs[key]

    def for_call(self) -> dict[str, Any]:
        """The epilogue operands a run gets: the bias (and RoPE's operands) themselves
        and a copy of the residual and of the caches. The bias and the residual are
        read-only, checked after each run; the copy keeps a kernel that writes its
        residual from changing the kept one; the caches are written (some slots)."""
        return {n: (x.clone() if n in COPIED else x) for n, x in self.epi.items()}


class Inputs(Protocol):
    """Where ``check`` gets each trial's inputs: drawn afresh (``FRESH``) or kept by a
    measuring worker (``cudal2.verify.inputs.InputCache``)."""

    def trial(self, t: Target, seed: int, index: int, kind: str) -> Trial: ...

    def discard(self, t: Target, seed: int, index: int, kind: str) -> None: ...


class _Fresh:
    """Every trial drawn afresh; nothing kept."""

    def trial(self, t: Target, seed: int, index: int, kind: str) -> Trial:
        return draw(t, seed, index, kind)

    def discard(self, t: Target, seed: int, index: int, kind: str) -> None:
        pass


FRESH: Inputs = _Fresh()


def derived_seed(seed: int, t: Target, label: str) -> int:
    """A 63-bit seed of its own for (seed, target, label): one generator per trial
    (label ``trial0``, ...), per timing operand pool and per pair check, so no draw
    depends on what was drawn before it."""
    digest = hashlib.sha256(f"{seed}|{t.key}|{label}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def generator(seed: int, t: Target, label: str):
    """A torch generator on ``DEVICE`` seeded with ``derived_seed(seed, t, label)``."""
    import torch

    gen = torch.Generator(device=DEVICE)
    gen.manual_seed(derived_seed(seed, t, label))
    return gen


def checksums(xs: list) -> list[int]:
    """Each tensor's bits read as integers (16- or 32-bit) and summed in int64: any
    write into one changes its sum unless it cancels exactly. One device sync for all."""
    import torch

    if not xs:
        return []
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}
    sums = [x.view(ints[x.element_size()]).sum(dtype=torch.int64) for x in xs]
    return [int(v) for v in torch.stack(sums).tolist()]


def checksum(x) -> int:
    """``checksums`` of one tensor."""
    return checksums([x])[0]


def draw(t: Target, seed: int, index: int, kind: str) -> Trial:
    """Trial ``index``'s inputs (``kind``: random or exact) from their own generator,
    the fp32 reference and the checksums."""
    gen = generator(seed, t, f"trial{index}")
    a, b = operands(t, kind, gen)
    epi = epilogue_operands(t, kind, gen, b) if t.epilogue != "none" else {}
    ref = reference(t, a, b, epi)
    named = {"a": a, "b": b, **epi, "ref": ref}
    sums = dict(zip(named, checksums(list(named.values())), strict=True))
    return Trial(kind, a, b, epi, ref, sums)


def torch_dtype(dtype: str):
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]


def operands(t: Target, kind: str, gen):
    """A [M,K] and B ([N,K] for tn, [K,N] for nn) on the GPU, fresh from ``gen``."""
    import torch

    dt = torch_dtype(t.dtype)
    b_shape = (t.n, t.k) if t.layout == "tn" else (t.k, t.n)
    if kind == "random":
        a = torch.rand((t.m, t.k), generator=gen, device=DEVICE) * 2 - 1
        b = torch.rand(b_shape, generator=gen, device=DEVICE) * 2 - 1
        return a.to(dt), (b * gated_b_scale(t)).to(dt)
    limit = exact_ones(t)
    order = torch.rand((t.m, t.k), generator=gen, device=DEVICE).argsort(dim=1)[:, :limit]
    a = torch.zeros((t.m, t.k), device=DEVICE).scatter_(1, order, 1.0)
    b = (torch.rand(b_shape, generator=gen, device=DEVICE) < 0.5).float()
    return a.to(dt), b.to(dt)


def gated_b_scale(t: Target) -> float:
    """The power of two a gated epilogue's random B is scaled by (1 otherwise): about
    1/sqrt(K), so the dot products stay near unit size as in a model (weights ~
    1/sqrt(K)) and the activation is exercised where it bends (unscaled, |g| is tens,
    where silu(g) is g or 0), and the product of two of them stays far from fp16's
    range (unscaled, rmsnorm_silu at 64 x 7168 x 8192 reaches 25,829, within 3x of
    65,504); a power of two, so the scaling itself is exact."""
    if t.epilogue not in EPILOGUE_ACTIVATION:
        return 1.0
    return 2.0 ** -math.floor(math.log2(math.sqrt(t.k)))


def exact_ones(t: Target) -> int:
    """The ones per row of A in the exact {0,1} trial. A plain GEMM: the exact limit
    (every dot product an exactly representable integer); an adding epilogue: 2 below
    it (+ a {0,1} bias and residual stays exact). A gated one: few enough that the
    product act(g) * u of two dot products stays finite in fp16: g, u <= ones, and
    with the row scale rs = sqrt(K / ones) (every row has that many ones), rs * g <=
    sqrt(K * ones); both kept <= ``GATED_EXACT_MAX`` (at least one one per row)."""
    limit = min(t.k, EXACT_LIMIT[t.dtype] - (2 if t.epilogue != "none" else 0))
    if t.epilogue in EPILOGUE_ACTIVATION:
        cap = GATED_EXACT_MAX**2 // t.k if t.epilogue in ROW_SCALED else GATED_EXACT_MAX
        limit = max(1, min(limit, cap))
    return limit


def epilogue_operands(t: Target, kind: str, gen, b=None) -> dict:
    """The fused epilogue's operands on the GPU, fresh from ``gen`` (none for a plain
    target): ``bias`` [N] and ``residual`` [M, N] (contiguous: ldr = N), uniform(-1, 1)
    for a random trial, {0,1} for the exact one; a ROPE_KV epilogue's (``rope_kv.operands``:
    they include the natural-order weight of ``b``, the drawn B)."""
    import torch

    shapes = {"bias": (t.n,), "residual": (t.m, t.n)}
    out = {}
    for name in EPILOGUE_OPERANDS[t.epilogue]:
        u = torch.rand(shapes[name], generator=gen, device=DEVICE)
        out[name] = (u * 2 - 1 if kind == "random" else (u < 0.5).float()).to(torch_dtype(t.dtype))
    if t.epilogue in ROPE_KV:
        if b is None:
            raise ValueError(f"{t.label}: a rope_kv epilogue's operands need the drawn B")
        dt = torch_dtype(t.dtype)
        out.update(rope_kv.operands(t, gen, dt, DEVICE, b, out.get("bias")))
    return out


def reference(t: Target, a, b, epi=None):
    """The one reference: fp32 product of the upcast operands, TF32 off; for a fused
    epilogue, the fused op in fp32 before any rounding: the row scale (row-scaled
    epilogues), its operands added (bias, then residual), then the gated activation
    over the pair interleave (gated epilogues: [M, N/2])."""
    import torch

    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        bb = b.float().t() if t.layout == "tn" else b.float()
        ref = a.float() @ bb
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    if t.epilogue in ROW_SCALED:
        # sum_k h^2 / K in fp32 from A's 16-bit values, then rsqrt(. + eps) per row
        ref = ref * torch.rsqrt(a.float().pow(2).sum(dim=1, keepdim=True) / t.k + EPS)
    for name in ("bias", "residual"):
        if epi and name in epi:
            ref = ref + epi[name].float()
    if t.epilogue in ROPE_KV:
        ref = rope_kv.reference(t, ref, epi)
    if t.epilogue in EPILOGUE_ACTIVATION:
        ref = gated(ref, EPILOGUE_ACTIVATION[t.epilogue])
    return ref


def gated(y, act: str, out=None):
    """act(y[..., 2j]) * y[..., 2j+1]: the gated activation over the pair interleave
    of a packed gate_up product (gate row j at 2j, up row j at 2j+1), in y's dtype."""
    g, u = y.unflatten(-1, (-1, 2)).unbind(-1)
    return act_mul(g, u, act, out)


def act_mul(g, u, act: str, out=None):
    """act(g) * u in g's dtype, torch's kernels."""
    import torch
    import torch.nn.functional as F

    if act == "silu":
        return torch.mul(F.silu(g), u, out=out)
    if act == "gelu_tanh":
        return torch.mul(F.gelu(g, approximate="tanh"), u, out=out)
    raise ValueError(f"unknown gated activation {act!r}")


def rmsnorm(a, eps: float = EPS):
    """torch's RMSNorm without a weight (it is folded into B), in A's dtype: the fp32
    row scale, one rounding, by ``F.rms_norm`` (one kernel on CUDA); what the runtime's
    unfused fallback runs (``fused.rms_normed``), the fastest way torch offers."""
    import torch.nn.functional as F

    return F.rms_norm(a, (a.shape[-1],), eps=eps)


def vendor(t: Target, a, b, out=None, epi=None):
    """torch on the same operands: the baseline, and the error yardstick. A plain
    target: torch.matmul (cuBLAS). A fused epilogue: what a user runs without cudal2,
    in the working dtype, each step rounded: torch's RMSNorm of A (row-scaled
    epilogues), the vendor GEMM (torch.addmm with the bias, torch.matmul without),
    torch's in-place add of the residual, the gated activation (gated epilogues: into
    ``out`` [M, N/2]). A gated ``tn`` one runs what an unpacked MLP runs: one GEMM over
    the gate rows of B and one over the up rows (``b[0::2]``, ``b[1::2]``: views, no
    copy; cuBLAS takes the row stride 2K), then the activation on their contiguous
    outputs; one GEMM and the activation over its strided halves cost 26% more than the
    GEMM alone on an H200 at 2048x28672x4096 (docs/kernels.md, "The gated baseline")."""
    import torch

    bb = b.t() if t.layout == "tn" else b
    if t.epilogue in ROW_SCALED:
        a = rmsnorm(a)
    if t.epilogue in ROPE_KV:  # transformers' sequence (verify/rope_kv.py)
        return rope_kv.vendor(t, a, epi, out)
    gate = EPILOGUE_ACTIVATION.get(t.epilogue)
    if gate and t.layout == "tn" and not epi:  # the gated epilogues take no bias or residual
        return act_mul(torch.matmul(a, b[0::2].t()), torch.matmul(a, b[1::2].t()), gate, out)
    y = None if gate else out  # a gated product needs its own [M, N] buffer
    if epi and "bias" in epi:
        y = torch.addmm(epi["bias"], a, bb, out=y)
    else:
        y = torch.matmul(a, bb, out=y)
    if epi and "residual" in epi:
        y.add_(epi["residual"])
    if gate:
        return gated(y, gate, out=out)
    return y


def max_abs_error(out, ref) -> float:
    return float((out.float() - ref).abs().max()) if ref.numel() else 0.0


def torch_error(t: Target, a, b, ref) -> dict[str, float]:
    """The vendor spread when no other library is at hand: torch.matmul's error alone."""
    return {"torch": max_abs_error(vendor(t, a, b), ref)}


def unfused_error(t: Target, a, b, epi, ref) -> dict[str, float]:
    """A fused epilogue's yardstick: the deviation of torch's unfused op (the vendor
    GEMM, then torch's add, each rounded to the working dtype) from the fp32 fused
    reference, named ``torch+<epilogue>`` (a ROPE_KV one's: C and the cache slots it
    wrote into copies of the caches, as [M, N])."""
    if t.epilogue in ROPE_KV:
        out = rope_kv.vendor_output(t, rmsnorm(a), epi)
        return {f"torch+{t.epilogue}": max_abs_error(out, ref)}
    return {f"torch+{t.epilogue}": max_abs_error(vendor(t, a, b, epi=epi), ref)}


def bound(vendor_errors: Mapping[str, float], scale: float, dtype: str) -> float:
    """The deviation a candidate may have: twice the worst vendor baseline's (the
    spread of correct implementations on these inputs), and at least twice the
    rounding of the output type at the result's scale. A baseline whose error is not
    finite (it failed to write its output) is left out rather than widening it."""
    worst = max((e for e in vendor_errors.values() if math.isfinite(e)), default=0.0)
    return max(2.0 * worst, 2.0 * OUT_EPS[dtype] * scale)


VendorErrors = Callable[[Target, object, object, object], Mapping[str, float]]


# The trial's own tensors a kernel gets (read-only; the residual it gets is a copy).
READ_ONLY = ("a", "b", "bias", *rope_kv.READ_ONLY)
# The epilogue operands a run gets a copy of: the residual (an in-place epilogue writes
# it) and the caches (written).
COPIED = ("residual", *rope_kv.CACHES)


def check(
    t: Target,
    run: Callable,
    seed: int,
    random_trials: int = 2,
    vendor_errors: VendorErrors = torch_error,
    repeats: int = 2,
    inputs: Inputs = FRESH,
) -> CheckResult:
    """``run(a, b, c)`` launches the kernel writing c (``run(a, b, c, epi)`` for a fused
    epilogue, ``epi`` its operands by name); returns after queueing it.
    ``vendor_errors(t, a, b, ref)`` gives each vendor baseline's max |error| (for a
    fused epilogue, torch's unfused op's is the yardstick instead: ``unfused_error``).
    Trial i's inputs come from ``inputs`` (drawn from their own generator seeded by
    (``seed``, t, i): ``draw``); the verdict is the same whether they were kept or not."""
    import torch

    if isinstance(seed, bool) or not isinstance(seed, int):
        # (a generator here would seed the trials by its repr: different every run)
        raise TypeError(f"check: seed must be an int (the job's seed), not {type(seed).__name__}")
    # rsqrt or exp in the epilogue: the {0,1} trial is bounded, not exact
    inexact = t.epilogue in ROW_SCALED or t.epilogue in EPILOGUE_ACTIVATION
    worst_abs = worst_rel = worst_vendor = 0.0
    names: tuple[str, ...] = ()
    for trial in range(random_trials + 1):
        kind = "random" if trial < random_trials else "exact"
        got = inputs.trial(t, seed, trial, kind)
        a, b, ref = got.a, got.b, got.ref
        epi = got.for_call()

        c = torch.full((t.m, t.out_n), float("nan"), dtype=a.dtype, device=DEVICE)
        _call(run, a, b, c, epi)
        _synchronize()
        if bad := _wrote(got, epi, inputs, t, seed, trial):
            return CheckResult(False, f"{kind} trial {trial}: {bad}", *_INF, worst_vendor, names)
        c, bad = _output(t, c, epi, got)
        if bad:
            return CheckResult(False, f"{kind} trial {trial}: {bad}", *_INF, worst_vendor, names)
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
        if kind == "exact" and not inexact:
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
        errs = _yardstick(t, got, vendor_errors)
        names = tuple(sorted(errs))
        worst_name = max(errs, key=lambda n: errs[n] if math.isfinite(errs[n]) else -1.0)
        worst_vendor = max(worst_vendor, errs[worst_name])
        limit = bound(errs, scale, t.dtype)
        if max_abs > limit:
            return CheckResult(
                False,
                f"{'exact {0,1}' if kind == 'exact' else 'random'} trial "
                f"{trial}: max |error| {max_abs:.3g} > bound {limit:.3g} "
                f"(worst of {len(errs)} vendor baselines: {worst_name} {errs[worst_name]:.3g}; "
                f"max |ref| {scale:.3g})",
                worst_abs,
                worst_rel,
                worst_vendor,
                names,
            )
        for r in range(repeats if trial == 0 else 0):
            again = torch.full((t.m, t.out_n), float("nan"), dtype=a.dtype, device=DEVICE)
            epi = got.for_call()  # fresh copies of what a run writes
            _call(run, a, b, again, epi)
            _synchronize()
            if bad := _wrote(got, epi, inputs, t, seed, trial):
                return CheckResult(False, f"repeat {r + 1}: {bad}", *_INF, worst_vendor, names)
            again, bad = _output(t, again, epi, got)
            if bad:
                return CheckResult(False, f"repeat {r + 1}: {bad}", *_INF, worst_vendor, names)
            differ = int((_bits(again) != _bits(c)).sum())
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


_INF = (float("inf"), float("inf"))


def _yardstick(t: Target, got: Trial, vendor_errors: VendorErrors) -> Mapping[str, float]:
    """The vendor errors a trial's bound comes from (asked once per trial and yardstick)."""
    if t.epilogue != "none":
        return got.errors("unfused", unfused_error, t, got.a, got.b, got.epi, got.ref)
    return got.errors(vendor_errors, vendor_errors, t, got.a, got.b, got.ref)


def prepare(
    t: Target,
    seed: int,
    random_trials: int = 2,
    vendor_errors: VendorErrors = torch_error,
    inputs: Inputs = FRESH,
) -> None:
    """What ``check`` of ``t`` asks ``inputs`` for, asked ahead of any candidate: each
    trial (inputs and reference) and the vendor errors on each trial whose bound
    needs them, so that a keeping ``inputs`` has them when the first candidate comes."""
    inexact = t.epilogue in ROW_SCALED or t.epilogue in EPILOGUE_ACTIVATION
    for trial in range(random_trials + 1):
        kind = "random" if trial < random_trials else "exact"
        got = inputs.trial(t, seed, trial, kind)
        if kind == "random" or inexact:
            _yardstick(t, got, vendor_errors)
    _synchronize()


def _wrote(got: Trial, epi: Mapping, inputs: Inputs, t: Target, seed: int, index: int) -> str:
    """After a run: why the trial fails if the kernel wrote into its inputs ("" if it
    did not). A, B and the bias are the trial's own (kept ones are dropped: the next
    candidate gets them drawn afresh); the residual it got is a copy (an epilogue
    writes C, never R, when they differ)."""
    bad = got.changed(READ_ONLY)
    if bad:
        inputs.discard(t, seed, index, got.kind)
    if "residual" in epi and checksum(epi["residual"]) != got.sums["residual"]:
        bad.append("residual")
    if not bad:
        return ""
    return f"the kernel wrote into its input(s) {', '.join(bad)}"


def _bits(x):
    """A 16- or 32-bit tensor's bit patterns (compared bit for bit)."""
    import torch

    return x.view(torch.int16 if x.element_size() == 2 else torch.int32)


def _output(t: Target, c, epi: Mapping, got: Trial) -> tuple[Any, str]:
    """What a run wrote, as the reference's shape: C itself, or for a ROPE_KV epilogue C
    then the cache slots ([M, N] in fp32), and why it fails if it wrote a cache element
    outside its slots ("" if not)."""
    if t.epilogue in ROPE_KV:
        return rope_kv.written(t, c, dict(epi), got.epi)
    return c, ""


def _call(run: Callable, a, b, c, epi: Mapping) -> None:
    """``run(a, b, c)``, or ``run(a, b, c, epi)`` when there are epilogue operands (a
    plain target's ``run`` keeps its three parameters)."""
    if epi:
        run(a, b, c, epi)
    else:
        run(a, b, c)


def _synchronize() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()
