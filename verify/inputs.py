"""What every candidate of a target shares, kept by a measuring worker: each
correctness trial's inputs, fp32 reference and vendor errors, and the operand sets
the timing rotates through.

They depend only on (target, seed, trial), never on the candidate: a trial draws
from a generator of its own (``correctness.derived_seed``), the timing pool from
another. A job of the next candidate of the same target therefore finds them here
instead of drawing operands, computing a reference matmul in fp32 and running every
vendor baseline again (on 4096x28672x4096: 0.09-0.18 s of a 0.16 s job, measured on
the H100 by ``ci/job_profile.py``).

What keeps a kept input from changing a verdict:

- the kernel writes only C, which is fresh per trial (NaN-filled) and per job (the
  timing outputs); A, B and the bias are read-only and checked after every run of
  the checks (``correctness.READ_ONLY``: a write fails the trial and drops the kept
  trial); the residual is copied for each trial and each job, since an in-place
  epilogue may write it;
- on every hit of a trial, each kept tensor's checksum (the reference's too) is
  compared with the one taken when it was drawn (a stray write from anywhere: the
  trial is drawn afresh). The timing sets are not summed on a hit (up to 4,096 small
  tensors): only a kernel that passed the checks, which saw it leave A, B and the bias
  alone, is ever timed, and values cannot change a verdict, only the time of a GEMM
  on them;
- the bound is by bytes on the device (``MAX_BYTES``), least recently used first out;
  an entry larger than the whole bound is used once and not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from cudal2.records import Target
from cudal2.verify import correctness

# The device memory kept: a 4096x28672x4096 target's three trials (A 32 MB, B 235 MB,
# the fp32 reference 470 MB each) and its two timing sets come to 2.7 GB.
MAX_BYTES = 4 << 30


@dataclass
class TimingSets:
    """The operand sets a target's timing rotates through (``operands`` and
    ``epilogue_operands`` of kind random, one per set)."""

    sets: list[tuple[Any, Any]]
    epis: list[dict[str, Any]]

    @property
    def nbytes(self) -> int:
        xs = [x for ab in self.sets for x in ab] + [x for e in self.epis for x in e.values()]
        return sum(x.numel() * x.element_size() for x in xs)

    def for_job(self) -> list[dict[str, Any]]:
        """The epilogue operands one job times with: each residual copied (an in-place
        epilogue writes it), the bias shared (read-only)."""
        return [{n: (x.clone() if n == "residual" else x) for n, x in e.items()} for e in self.epis]


def draw_timing(t: Target, seed: int, nsets: int) -> TimingSets:
    """``nsets`` random operand sets of ``t`` from the timing pool's own generator."""
    gen = correctness.generator(seed, t, "timing")
    sets, epis = [], []
    for _ in range(nsets):
        sets.append(correctness.operands(t, "random", gen))
        epis.append(correctness.epilogue_operands(t, "random", gen))
    return TimingSets(sets, epis)


class Fresh:
    """No keeping: every trial and every timing pool drawn afresh (as a worker without
    a cache, and the reference the cache is tested against)."""

    def trial(self, t: Target, seed: int, index: int, kind: str) -> correctness.Trial:
        return correctness.draw(t, seed, index, kind)

    def discard(self, t: Target, seed: int, index: int, kind: str) -> None:
        pass

    def timing(self, t: Target, seed: int, nsets: int) -> TimingSets:
        return draw_timing(t, seed, nsets)


class InputCache(Fresh):
    """Trials and timing pools kept per (target, seed, ...), least recently used out
    first once ``max_bytes`` would be exceeded. One per worker process (its tensors
    live on that worker's GPU)."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._kept: OrderedDict[tuple, tuple[Any, int]] = OrderedDict()  # key -> (entry, bytes)
        self.bytes = 0
        self.hits = self.misses = self.redrawn = 0

    def trial(self, t: Target, seed: int, index: int, kind: str) -> correctness.Trial:
        key = ("trial", t.key, seed, index, kind)
        got = self._get(key)
        if got is not None and got.changed():
            # written since it was drawn (by nothing the checks watch): never reuse it
            self.redrawn += 1
            self._drop(key)
            got = None
        if got is None:
            got = correctness.draw(t, seed, index, kind)
            self._keep(key, got, got.nbytes)
        return got

    def discard(self, t: Target, seed: int, index: int, kind: str) -> None:
        self._drop(("trial", t.key, seed, index, kind))

    def timing(self, t: Target, seed: int, nsets: int) -> TimingSets:
        key = ("timing", t.key, seed, nsets)
        got = self._get(key)
        if got is None:
            got = draw_timing(t, seed, nsets)
            self._keep(key, got, got.nbytes)
        return got

    def stats(self) -> dict[str, int]:
        return {
            "entries": len(self._kept),
            "bytes": self.bytes,
            "hits": self.hits,
            "misses": self.misses,
            "redrawn": self.redrawn,
        }

    def _get(self, key: tuple) -> Any:
        kept = self._kept.get(key)
        if kept is None:
            self.misses += 1
            return None
        self.hits += 1
        self._kept.move_to_end(key)
        return kept[0]

    def _keep(self, key: tuple, entry: Any, nbytes: int) -> None:
        if nbytes > self.max_bytes:
            return  # used once, not kept
        while self._kept and self.bytes + nbytes > self.max_bytes:
            self._drop(next(iter(self._kept)))
        self._kept[key] = (entry, nbytes)
        self.bytes += nbytes

    def _drop(self, key: tuple) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            self.bytes -= kept[1]
