"""The PDL pair check: a PDL candidate run as the second kernel of a pair whose first
kernel writes the candidate's A while the candidate may already be running.

A PDL design may start before the kernel ahead of it on the stream has finished; it
is correct only if it waits (``griddepcontrol.wait``) before it reads A and before it
writes C. The correctness suite cannot see a kernel that does not: launched after
torch's kernels, which never trigger their dependents early, a PDL kernel starts only
when they are done. Here the first kernel is a producer that triggers its dependents
at entry, waits at a gate until the host has launched the candidate (a flag in pinned
host memory: a launch from Python takes 30-130 us, longer than any fixed head start
measured on the H100), spins ``SPIN_NS`` (the candidate's CTAs become resident
meanwhile), then counts the elements of C that changed while it ran (a write of C before the wait:
the WAR hazard) and only then writes A, poisoned with NaN until that moment (a read of
A before the wait: the RAW hazard, seen as NaN or a wrong value in C). The
candidate, launched right after it with the PDL attribute, must give bit for bit the
output of a plain run on the same operands (every family reduces in a fixed order).

A fused epilogue's operands (bias, residual) are activations too: the producer writes
them with A, poisoned until then (one buffer, A then each operand, each starting on a
16-byte boundary), so an epilogue that reads them before the wait fails the same way.
The gated and row-scaled epilogues read no operand but A (``rmsnorm_bias`` also the
bias): a row scale computed from A before the wait reads the poison too. Their C is
[M, out_n] (N/2 for a gated one).

The producer is a fixed PTX string JIT-compiled by the driver (``cuModuleLoadData``):
nothing on the measuring side runs nvcc. Its outcome is recorded in the measurement's
metrics (``PAIR_METRIC``: 1 passed, 0 failed); a failure is status ``incorrect`` with
the reason in ``error``, like every other correctness failure, so the candidate
stays rejected.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from cudal2.packaging.runtime import driver
from cudal2.records import JobResult, Target

PAIR_METRIC = "pdl_pair_check"
SPIN_NS = 40_000  # after the gate: the candidate's CTAs become resident (a few us)
GATE_TIMEOUT_NS = 200_000_000  # a gate the host never opens costs 0.2 s, not a hang
ROUNDS = 3  # pairs per candidate: whether an early read lands in the window varies
PRODUCER_CTAS = 8  # few, small CTAs: most SMs stay free for the candidate's
PRODUCER_THREADS = 256
POISON = 0x7FFF  # NaN in fp16 and in bf16: A until the producer writes it
SENTINEL = 0x7FFF  # C before the candidate writes it; the producer counts changes
SYMBOL = "cudal2_pdl_producer"

# producer(src, dst, n_a, c, n_c, sentinel, flag, spin_ns, gate, late):
# launch_dependents at entry; wait until *gate (host memory, read through UVA) is
# nonzero, or GATE_TIMEOUT_NS (then late += 1 per thread); spin spin_ns on
# %globaltimer; flag += elements of c[0, n_c) != sentinel; then dst[0, n_a) =
# src[0, n_a) (2-byte elements, grid-stride loops).
PRODUCER_PTX = r"""
.version 8.0
.target sm_90
.address_size 64

.visible .entry cudal2_pdl_producer(
    .param .u64 p_src, .param .u64 p_dst, .param .u64 p_na,
    .param .u64 p_c, .param .u64 p_nc, .param .u32 p_sentinel,
    .param .u64 p_flag, .param .u64 p_spin, .param .u64 p_gate, .param .u64 p_late)
{
    .reg .pred %p<6>;
    .reg .b16 %h<2>;
    .reg .b32 %r<10>;
    .reg .b64 %rd<24>;

    griddepcontrol.launch_dependents;
    ld.param.u64 %rd1, [p_src];
    ld.param.u64 %rd2, [p_dst];
    ld.param.u64 %rd3, [p_na];
    ld.param.u64 %rd4, [p_c];
    ld.param.u64 %rd5, [p_nc];
    ld.param.u32 %r1, [p_sentinel];
    ld.param.u64 %rd6, [p_flag];
    ld.param.u64 %rd7, [p_spin];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    cvta.to.global.u64 %rd4, %rd4;
    cvta.to.global.u64 %rd6, %rd6;
    ld.param.u64 %rd17, [p_gate];
    ld.param.u64 %rd18, [p_late];
    cvta.to.global.u64 %rd18, %rd18;

    mov.u64 %rd8, %globaltimer;
GATE:
    ld.volatile.u32 %r7, [%rd17];
    setp.ne.u32 %p4, %r7, 0;
    @%p4 bra SPIN_START;
    mov.u64 %rd9, %globaltimer;
    sub.u64 %rd9, %rd9, %rd8;
    setp.lt.u64 %p5, %rd9, GATE_TIMEOUT_NS;
    @%p5 bra GATE;
    red.global.add.u32 [%rd18], 1;

SPIN_START:
    mov.u64 %rd8, %globaltimer;
SPIN:
    mov.u64 %rd9, %globaltimer;
    sub.u64 %rd9, %rd9, %rd8;
    setp.lt.u64 %p1, %rd9, %rd7;
    @%p1 bra SPIN;

    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mov.u32 %r5, %nctaid.x;
    mul.wide.u32 %rd10, %r2, %r3;
    cvt.u64.u32 %rd11, %r4;
    add.u64 %rd10, %rd10, %rd11;
    mul.wide.u32 %rd12, %r5, %r3;

    mov.u64 %rd13, %rd10;
CHECK:
    setp.ge.u64 %p2, %rd13, %rd5;
    @%p2 bra COPY_START;
    shl.b64 %rd14, %rd13, 1;
    add.u64 %rd15, %rd4, %rd14;
    ld.volatile.global.u16 %h1, [%rd15];
    cvt.u32.u16 %r6, %h1;
    setp.eq.u32 %p3, %r6, %r1;
    @%p3 bra CHECK_NEXT;
    red.global.add.u32 [%rd6], 1;
CHECK_NEXT:
    add.u64 %rd13, %rd13, %rd12;
    bra CHECK;

COPY_START:
    mov.u64 %rd13, %rd10;
COPY:
    setp.ge.u64 %p2, %rd13, %rd3;
    @%p2 bra DONE;
    shl.b64 %rd14, %rd13, 1;
    add.u64 %rd15, %rd1, %rd14;
    ld.global.u16 %h1, [%rd15];
    add.u64 %rd16, %rd2, %rd14;
    st.global.u16 [%rd16], %h1;
    add.u64 %rd13, %rd13, %rd12;
    bra COPY;
DONE:
    ret;
}
""".replace("GATE_TIMEOUT_NS", str(GATE_TIMEOUT_NS))
PRODUCER_TYPES = (
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_uint64,
    ctypes.c_void_p,
    ctypes.c_uint64,
    ctypes.c_uint32,
    ctypes.c_void_p,
    ctypes.c_uint64,
    ctypes.c_void_p,
    ctypes.c_void_p,
)

_producer: driver.Kernel | None = None


def producer() -> driver.Kernel:
    """The producer kernel (its PTX JIT-compiled by the driver at the first launch)."""
    global _producer
    if _producer is None:
        _producer = driver.Kernel(PRODUCER_PTX.encode() + b"\0", SYMBOL, 0)
    return _producer


@dataclass(frozen=True)
class PairVerdict:
    """The pair check's outcome: ``ok``, or why not (``error``)."""

    ok: bool
    error: str = ""


def packed_offsets(numels: list[int]) -> tuple[list[int], int]:
    """Where each of the activations (A, then each epilogue operand) starts in the one
    buffer the producer copies, in elements, each on a 16-byte boundary (8 two-byte
    elements), and the buffer's size."""
    offsets, at = [], 0
    for n in numels:
        offsets.append(at)
        at += -(-n // 8) * 8
    return offsets, at


def _views(buf, shapes: list, offsets: list[int]) -> list:
    """The activations as views of ``buf`` (see ``packed_offsets``)."""
    out = []
    for shape, at in zip(shapes, offsets, strict=True):
        n = 1
        for d in shape:
            n *= d
        out.append(buf[at : at + n].view(shape))
    return out


# The epilogue operands the producer poisons and then writes (with A): those a kernel
# reads of the activation's dtype.
POISONED = ("bias", "residual", "cos", "sin")


def check(t: Target, run: Callable, gen, rounds: int = ROUNDS, device: int = 0) -> PairVerdict:
    """``run(a, b, c)`` launches the PDL candidate on the current stream (with the
    PDL attribute, as its recipe says); ``run(a, b, c, epi)`` for a fused epilogue. It
    runs after the producer, ``rounds`` times, and must give the plain run's output
    bit for bit with C untouched while the producer ran."""
    import torch

    from cudal2.verify import correctness

    a, b = correctness.operands(t, "random", gen)
    epi = correctness.epilogue_operands(t, "random", gen, b)
    # What the producer copies: A and the epilogue's activation operands, in one buffer
    # of A's dtype; a rope_kv epilogue's caches (written), positions (int64) and the
    # natural-order weight (torch's alone) are passed as they are
    kept = {n: x for n, x in epi.items() if n not in POISONED}
    epi = {n: x for n, x in epi.items() if n in POISONED}
    parts = [a, *epi.values()]
    shapes = [tuple(x.shape) for x in parts]
    offsets, total = packed_offsets([x.numel() for x in parts])
    src = torch.zeros(total, dtype=a.dtype, device="cuda")
    for view, x in zip(_views(src, shapes, offsets), parts, strict=True):
        view.copy_(x)
    a, *ops = _views(src, shapes, offsets)
    epi = {**dict(zip(epi, ops, strict=True)), **kept}
    want = torch.full((t.m, t.out_n), float("nan"), dtype=a.dtype, device="cuda")
    _run(run, a, b, want, epi)
    torch.cuda.synchronize()
    kernel = producer()
    gate = torch.zeros(1, dtype=torch.int32, pin_memory=True)  # the producer reads it (UVA)
    for r in range(rounds):
        dst = torch.empty_like(src)
        dst.view(torch.int16).fill_(POISON)
        a_in, *ops_in = _views(dst, shapes, offsets)
        epi_in = {**dict(zip([n for n in epi if n not in kept], ops_in, strict=True)), **kept}
        c = torch.empty((t.m, t.out_n), dtype=a.dtype, device="cuda")
        c.view(torch.int16).fill_(SENTINEL)
        flag = torch.zeros(2, dtype=torch.int32, device="cuda")  # changed C elements, late
        torch.cuda.synchronize()  # only the producer runs ahead of the candidate
        stream = torch.cuda.current_stream().cuda_stream
        args = (
            src.data_ptr(), dst.data_ptr(), src.numel(), c.data_ptr(), c.numel(), SENTINEL,
            flag.data_ptr(), SPIN_NS, gate.data_ptr(), flag.data_ptr() + 4,
        )  # fmt: skip
        gate[0] = 0
        try:
            kernel.launch(
                (PRODUCER_CTAS, 1, 1), (PRODUCER_THREADS, 1, 1), stream, args, PRODUCER_TYPES,
                device,
            )  # fmt: skip
            _run(run, a_in, b, c, epi_in)
        finally:
            gate[0] = 1  # the candidate is launched: the producer's head start begins
        torch.cuda.synchronize()
        changed, late = flag.tolist()
        if late:
            raise RuntimeError(
                f"PDL pair check: the producer's gate did not open within "
                f"{GATE_TIMEOUT_NS / 1e9:g} s ({late} threads gave up): the check cannot judge"
            )
        if changed:
            return PairVerdict(
                False,
                f"PDL pair check, round {r + 1}: {changed} output elements were written while "
                "the kernel before it still ran (a write of C before griddepcontrol.wait)",
            )
        differ = int((c.view(torch.int16) != want.view(torch.int16)).sum())
        if differ:
            nan = int(torch.isnan(c).sum())
            return PairVerdict(
                False,
                f"PDL pair check, round {r + 1}: {differ} of {c.numel()} output elements differ "
                f"from a plain run's ({nan} NaN): A was read before griddepcontrol.wait (the "
                "kernel before it writes A, NaN until then)"
                + (f", or an epilogue operand ({', '.join(epi)})" if epi else ""),
            )
    return PairVerdict(True)


def _run(run: Callable, a, b, c, epi: dict) -> None:
    """``run(a, b, c)``, with the epilogue's operands where there are some."""
    if epi:
        run(a, b, c, epi)
    else:
        run(a, b, c)


def recorded(checked: JobResult, verdict: PairVerdict) -> JobResult:
    """``checked`` (an answer that passed the correctness suite) with the pair check's
    outcome: its metric, and on failure the error (status stays ``incorrect``)."""
    metrics = {**checked.metrics, PAIR_METRIC: 1.0 if verdict.ok else 0.0}
    return dataclasses.replace(checked, metrics=metrics, error=verdict.error)
