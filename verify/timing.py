"""The one timing function of the project: CUDA events around CUDA-graph replays.

Every timed callable takes an operand-set index ``j`` and launches one call on the
current stream using set ``j``. Candidates and baselines are interleaved in a fresh
random order every repetition, in the same process, so clock and thermal drift hit
them alike.

- ``offline`` (back to back, as a benchmark): each callable is captured into a CUDA
  graph of ``calls`` launches cycling through the operand sets. The sets together
  are larger than several L2s, so every call reads its operands from HBM, and the
  graph has enough calls to run well past launch overheads, which therefore do not
  count. A sample is one replay's time divided by ``calls``.
- ``server`` (as at inference): before each sample, L2 is flushed, the GPU drained,
  and the host sleeps a random gap. A short spin kernel then keeps the GPU busy while
  the host queues the timed call, so the host's submission latency is not counted.
  Each sample is one call; the idle gap is not counted.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# A job's timing settings travel with it to the worker: the record lives with the jobs.
from cudal2.records import TimingConfig

MODES = ("offline", "server")
# Recorded with every measurement: results taken by another method are not reused.
TIMING_METHOD = (
    "timing v2: graph replay over operand sets > 3x L2 (offline); flush+gap+spin (server)"
)
L2_FLUSH_BYTES = 256 * 1024 * 1024  # > 5x the H100's 50 MB L2 (and the H200's 60 MB)


@dataclass(frozen=True)
class Timing:
    samples_us: tuple[float, ...]
    calls: int = 1  # calls per sample (a graph replay's length)

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples_us)

    def quantile(self, q: float) -> float:
        s = sorted(self.samples_us)
        return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]

    @property
    def spread(self) -> float:
        """Relative p20-p80 width: the noise a difference must exceed to count."""
        return (self.quantile(0.8) - self.quantile(0.2)) / self.median_us

    def as_json(self) -> dict:
        return {
            "median_us": round(self.median_us, 4),
            "p20_us": round(self.quantile(0.2), 4),
            "p80_us": round(self.quantile(0.8), 4),
            "calls": self.calls,
            "samples_us": [round(x, 4) for x in self.samples_us],
        }


def paired_spread(candidate: Sequence[float], baseline: Sequence[float]) -> float | None:
    """Relative p20-p80 width of the per-repetition speedup baseline/candidate.

    ``time_interleaved`` takes sample i of every callable in repetition i, moments
    apart, so both saw the same clocks: over a run the H100's clocks step down as it
    heats (a large GEMM's samples drift by 20%), which widens each callable's own
    spread but cancels in the ratio. None when the samples are not paired (lengths
    differ, or fewer than 5)."""
    if len(candidate) != len(baseline) or len(candidate) < 5:
        return None
    return Timing(tuple(b / c for b, c in zip(baseline, candidate, strict=True))).spread


def operand_sets(bytes_per_set: int, footprint: int = 3 * 50 * 1024 * 1024, cap: int = 4096) -> int:
    """How many operand sets to rotate through so that together they exceed L2 several
    times over (at least 2; at most ``cap``, where tiny shapes stop mattering)."""
    return max(2, min(cap, math.ceil(footprint / max(bytes_per_set, 1))))


@dataclass
class Captured:
    """A callable captured into a CUDA graph of ``calls`` launches cycling through
    ``nsets`` operand sets (``capture``), ready to be timed again by
    ``time_interleaved``. A graph bakes in the addresses it reads and writes: whoever
    keeps one keeps, alive beside it, every tensor those addresses belong to (``keep``).
    ``nbytes``: the device memory the graph holds of its own (the outputs made for it,
    and its private memory pool: the temporaries its calls allocate)."""

    graph: Any  # torch.cuda.CUDAGraph
    nsets: int
    calls: int
    keep: tuple = ()
    nbytes: int = 0


def replay_calls(nsets: int, cfg: TimingConfig, est_us: float = 10.0) -> int:
    """Launches per graph: offline, enough for a replay of ``cfg.min_replay_us`` (at
    least one per operand set, at most ``cfg.max_calls``); server, one."""
    if cfg.mode == "offline":
        return max(nsets, min(cfg.max_calls, math.ceil(cfg.min_replay_us / max(est_us, 0.5))))
    return 1


def capture(
    fn: Callable[[int], object],
    nsets: int,
    calls: int,
    keep: tuple = (),
    own_bytes: int = 0,
    stream: Any = None,
) -> Captured:
    """``fn`` warmed up outside any capture (module loads, handle creation, autotuning
    caches), then captured: ``calls`` launches, set ``i % nsets`` for launch ``i``.
    ``keep`` / ``own_bytes``: what the graph uses that the caller made for it (kept
    alive with it), and its bytes; the graph's pool is added to ``nbytes``."""
    import torch

    for j in range(min(nsets, 2)):
        fn(j)
    torch.cuda.synchronize()
    # (torch.cuda.graph empties the allocator's cache on entry too: the growth of
    # reserved memory across the capture is the graph's private pool)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream if stream is not None else torch.cuda.Stream()):
        for i in range(calls):
            fn(i % nsets)
    pool = max(0, torch.cuda.memory_reserved() - before)
    return Captured(g, nsets, calls, keep, own_bytes + pool)


def hold(step: Callable[[], object], ms: float) -> None:
    """``step`` run back to back, synchronised after each, until ``ms`` of host time have
    passed (none at 0): the sustained work that takes a large GEMM's clock down into the
    power limit before it is timed (docs/measuring.md, "The declared timing state of
    prefill"). ``time_interleaved``'s ``cfg.settle_ms`` and ``cudal2-bench --settle-ms``
    both settle through it."""
    import torch

    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        step()
        torch.cuda.synchronize()


def time_interleaved(
    fns: Mapping[str, Callable[[int], object] | Captured],
    nsets: int,
    cfg: TimingConfig,
    est_us: float = 10.0,
    phases: dict[str, float] | None = None,
    stop: Callable[[Mapping[str, Sequence[float]]], bool] | None = None,
    stop_after: int = 5,
) -> dict[str, Timing]:
    """Time each callable (see the module doc). ``est_us`` sizes the offline graphs.

    ``stop``: asked once, after the first ``stop_after`` repetitions (their samples by
    name, µs per call, in repetition order); True ends the timing there, so each
    callable has those ``stop_after`` samples, taken exactly as the rest would have been
    (the worker stops a candidate that is clearly slower than torch: verify/worker.py).

    A value may be a graph ``capture`` made earlier for the same ``nsets`` and launch
    count (a baseline's, kept by the worker across the jobs of a target): it is not
    captured again, and is replayed, warmed up and interleaved exactly as the others.
    ``phases``: where the seconds of the warm-ups and captures (``timing_capture``)
    and of the replays (``timing_replay``) are added.

    ``cfg.settle_ms``: after the warm-up, every callable is replayed, interleaved, for at
    least that long before the first sample. A large GEMM's clock falls to the power
    limit's within tens of milliseconds of sustained work, and a job of 30 repetitions
    lasts about as long, so without it the first repetitions may run faster than the rest
    and a callable's median depend on which state most of them saw (docs/measuring.md,
    "The declared timing state of prefill")."""
    import torch

    if cfg.mode not in MODES:
        raise ValueError(f"timing mode {cfg.mode!r} not in {MODES}")
    rng = random.Random(cfg.seed)
    names = list(fns)
    calls = replay_calls(nsets, cfg, est_us)
    t0 = time.perf_counter()
    stream = torch.cuda.Stream()
    graphs: dict[str, Any] = {}
    for name in names:
        fn = fns[name]
        if isinstance(fn, Captured):
            if (fn.nsets, fn.calls) != (nsets, calls):
                raise ValueError(
                    f"{name}: a graph of {fn.calls} calls over {fn.nsets} sets, timed as "
                    f"{calls} calls over {nsets}"
                )
            graphs[name] = fn.graph
        else:
            graphs[name] = capture(fn, nsets, calls, stream=stream).graph
    t1 = time.perf_counter()
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    for _ in range(cfg.warmup):
        for name in names:
            graphs[name].replay()
    torch.cuda.synchronize()
    hold(lambda: [graphs[name].replay() for name in names], cfg.settle_ms)
    events: dict[str, list] = {n: [] for n in names}

    def samples(pairs: list) -> tuple[float, ...]:
        return tuple(s.elapsed_time(e) * 1000.0 / calls for s, e in pairs)

    for rep in range(cfg.reps):
        if stop is not None and rep == stop_after:
            torch.cuda.synchronize()
            if stop({name: samples(pairs) for name, pairs in events.items()}):
                break
        rng.shuffle(names)
        for name in names:
            if cfg.mode == "server":
                flush.zero_()
                torch.cuda.synchronize()
                time.sleep(rng.uniform(*cfg.server_gap_s))
                torch.cuda._sleep(20_000)  # ~10 us spin: the host queues the call meanwhile
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[name].replay()
            end.record()
            events[name].append((start, end))
    torch.cuda.synchronize()
    if phases is not None:
        phases["timing_capture"] = phases.get("timing_capture", 0.0) + t1 - t0
        phases["timing_replay"] = phases.get("timing_replay", 0.0) + time.perf_counter() - t1
    return {name: Timing(samples(pairs), calls) for name, pairs in events.items()}


def time_with_sync(fn: Callable[[], object], reps: int = 20) -> float:
    """Median host wall time of one call between two full device synchronisations, in
    µs. It includes launch overhead; it exists to cross-check event timings, since work
    that escapes the timed stream (another stream, a host thread) shows up here only."""
    import torch

    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(out)


def time_eager(fns: Mapping[str, Callable[[], object]], cfg: TimingConfig) -> dict[str, Timing]:
    """Time each callable as eager code runs, host launches included: per sample, L2
    is flushed and the GPU drained, then CUDA events bracket one call queued from the
    host, so a call whose host work outlasts its GPU work shows that host time. The
    callables are interleaved in a fresh random order every repetition, after
    ``cfg.warmup`` untimed calls each. (For graph replays, use ``time_interleaved``.)"""
    import torch

    rng = random.Random(cfg.seed)
    names = list(fns)
    for _ in range(cfg.warmup):
        for name in names:
            fns[name]()
    torch.cuda.synchronize()
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    samples: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(cfg.reps):
        rng.shuffle(names)
        for name in names:
            flush.zero_()
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fns[name]()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) * 1000.0)
    return {name: Timing(tuple(s)) for name, s in samples.items()}


@dataclass(frozen=True)
class SustainedRun:
    """One sustained run of ``time_sustained``: ``calls`` back-to-back calls that took
    ``seconds`` of GPU time (CUDA events), between host wall-clock times ``t0`` and
    ``t1`` (``time.time()``; the GPU ran nothing else meanwhile, so samples a monitor
    took in that window belong to this run)."""

    calls: int
    seconds: float
    t0: float
    t1: float

    @property
    def us_per_call(self) -> float:
        return self.seconds * 1e6 / self.calls

    def as_json(self) -> dict:
        return {
            "calls": self.calls,
            "seconds": round(self.seconds, 6),
            "us_per_call": round(self.us_per_call, 4),
            "t0": round(self.t0, 3),
            "t1": round(self.t1, 3),
        }


def time_sustained(
    fns: Mapping[str, Callable[[int], object]],
    nsets: int,
    seconds: float = 2.0,
    reps: int = 3,
    seed: int = 0,
    graph_s: float = 0.02,
) -> dict[str, list[SustainedRun]]:
    """Time each callable over long runs, as the power limit sees them: each callable is
    captured into a CUDA graph of calls cycling through the operand sets (about
    ``graph_s`` of work, sized by a timed replay), and one run replays its graph back to
    back for at least ``seconds``, bracketed by CUDA events. ``reps`` runs of each, in a
    fresh random order every repetition (as ``time_interleaved``). The host waits for
    each run before the next starts, so its wall-clock window is the run's (a power or
    clock monitor reads the window; ``time_interleaved`` queues every sample at once)."""
    import torch

    rng = random.Random(seed)
    names = list(fns)
    for name in names:
        for j in range(min(nsets, 2)):
            fns[name](j)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    graphs: dict[str, tuple[torch.cuda.CUDAGraph, int, int]] = {}
    for name in names:
        calls, took = nsets, 0.0
        while True:  # grow the graph until one replay lasts graph_s (a few tries)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                for i in range(calls):
                    fns[name](i % nsets)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            g.replay()  # warm
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            took = start.elapsed_time(end) / 1000.0
            if took >= graph_s / 2 or calls >= 65536:
                break
            calls = min(65536, math.ceil(calls * graph_s / max(took, 1e-6)))
        graphs[name] = (g, calls, max(1, math.ceil(seconds / took)))
    runs: dict[str, list[SustainedRun]] = {n: [] for n in names}
    for _ in range(reps):
        rng.shuffle(names)
        for name in names:
            g, calls, replays = graphs[name]
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            t0 = time.time()
            start.record()
            for _ in range(replays):
                g.replay()
            end.record()
            end.synchronize()
            t1 = time.time()
            gpu_s = start.elapsed_time(end) / 1000.0
            runs[name].append(SustainedRun(calls * replays, gpu_s, t0, t1))
    return runs
