"""The one timing function of the project: CUDA events, L2 flushed, warmed up, median.

Candidates and baselines are interleaved in a fresh random order every repetition,
in the same process, so clock and thermal drift hit them alike. ``offline`` runs
them back to back; ``server`` inserts a random idle gap (GPU drained, then the host
sleeps) before each timed call, as at inference, and the gap is not counted.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

MODES = ("offline", "server")


@dataclass(frozen=True)
class TimingConfig:
    warmup: int = 5
    reps: int = 30
    mode: str = "offline"
    flush_bytes: int = 256 * 1024 * 1024  # > 5x the H100's 50 MB L2
    server_gap_s: tuple[float, float] = (50e-6, 500e-6)
    seed: int = 0


@dataclass(frozen=True)
class Timing:
    samples_us: tuple[float, ...]

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


def time_interleaved(
    fns: Mapping[str, Callable[[], object]], cfg: TimingConfig
) -> dict[str, Timing]:
    """Time each callable (which launches GPU work on the current stream).

    Every timed call is preceded by an L2 flush (a write over ``flush_bytes``) outside
    the events. Events of all repetitions are read after one final synchronise, so the
    host never stalls the queue between calls in ``offline`` mode.
    """
    import torch

    if cfg.mode not in MODES:
        raise ValueError(f"timing mode {cfg.mode!r} not in {MODES}")
    flush = torch.empty(cfg.flush_bytes // 4, dtype=torch.int32, device="cuda")
    rng = random.Random(cfg.seed)
    names = list(fns)
    for _ in range(cfg.warmup):
        for name in names:
            fns[name]()
    torch.cuda.synchronize()
    events: dict[str, list[tuple[torch.cuda.Event, torch.cuda.Event]]] = {n: [] for n in names}
    for _ in range(cfg.reps):
        rng.shuffle(names)
        for name in names:
            flush.zero_()
            if cfg.mode == "server":
                torch.cuda.synchronize()
                time.sleep(rng.uniform(*cfg.server_gap_s))
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fns[name]()
            end.record()
            events[name].append((start, end))
    torch.cuda.synchronize()
    return {
        name: Timing(tuple(s.elapsed_time(e) * 1000.0 for s, e in pairs))
        for name, pairs in events.items()
    }
