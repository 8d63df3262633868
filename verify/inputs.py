"""What every candidate of a target shares, kept by a measuring worker: each
correctness trial's inputs, fp32 reference and vendor errors, the operand sets the
timing rotates through, and torch's graph over them.

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
- torch's baseline graph (``baseline``) reads the kept timing sets and writes outputs
  of its own, never the candidate's: it is kept with the sets it reads (dropped when
  they are), so no job ever frees what the graph's baked-in addresses point at;
- the bound is by bytes on the device (``MAX_BYTES``, or a quarter of the GPU's free
  memory at the worker's start: ``bound_bytes``), least recently used first out; an
  entry larger than the whole bound is used once and not kept. What a worker prepares
  ahead of a target's first job (``without_eviction``) goes only into free room.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from cudal2.records import Target, TimingConfig
from cudal2.verify import correctness
from cudal2.verify.timing import Captured

# The least device memory a worker may keep (its bound where the free memory is unknown):
# a 4096x28672x4096 target's three trials (A 32 MB, B 235 MB, the fp32 reference 470 MB
# each) and its two timing sets come to 2.7 GB.
MAX_BYTES = 4 << 30
# The share of the GPU's free memory a worker keeps at most (``bound_bytes``).
FREE_SHARE = 0.25


def bound_bytes(free_bytes: int | None) -> int:
    """The worker's bound: a quarter of the GPU's free memory at its start, at least
    ``MAX_BYTES`` (None, unknown: ``MAX_BYTES``). A quarter leaves the rest to what runs
    beside the cache: a job's own outputs and graphs, the L2 flush buffer, cuBLAS(Lt)
    workspaces, and the sanitizer's and Nsight Compute's child processes on the same
    GPU (on an 80 GB H100: ~20 GB, the 24 targets of the Llama-3.1-8B manifest)."""
    if not free_bytes:
        return MAX_BYTES
    return max(MAX_BYTES, int(free_bytes * FREE_SHARE))


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
        """The epilogue operands one job times with: each residual and KV cache copied
        (an in-place epilogue writes the one, a rope_kv epilogue the others), the rest
        shared (read-only)."""
        copied = correctness.COPIED
        return [{n: (x.clone() if n in copied else x) for n, x in e.items()} for e in self.epis]


def draw_timing(t: Target, seed: int, nsets: int) -> TimingSets:
    """``nsets`` random operand sets of ``t`` from the timing pool's own generator."""
    gen = correctness.generator(seed, t, "timing")
    sets, epis = [], []
    for _ in range(nsets):
        a, b = correctness.operands(t, "random", gen)
        sets.append((a, b))
        epis.append(correctness.epilogue_operands(t, "random", gen, b))
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

    def baseline(
        self,
        t: Target,
        cfg: TimingConfig,
        nsets: int,
        calls: int,
        capture: Callable[[TimingSets], Captured],
        name: str = "torch",
    ) -> Captured:
        """torch's graph over the timing sets of ``(t, cfg.seed, nsets)``: ``capture(sets)``
        (which makes the outputs it writes, its own, and keeps them in the graph's
        ``keep`` with the sets). ``name``: which baseline (a target may time several)."""
        return capture(self.timing(t, cfg.seed, nsets))


class InputCache(Fresh):
    """Trials and timing pools kept per (target, seed, ...), least recently used out
    first once ``max_bytes`` would be exceeded. One per worker process (its tensors
    live on that worker's GPU)."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._kept: OrderedDict[tuple, tuple[Any, int]] = OrderedDict()  # key -> (entry, bytes)
        self.bytes = 0
        self.hits = self.misses = self.redrawn = 0
        self._evict = True
        self.full = False  # an entry did not fit without evicting (``without_eviction``)

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

    def baseline(
        self,
        t: Target,
        cfg: TimingConfig,
        nsets: int,
        calls: int,
        capture: Callable[[TimingSets], Captured],
        name: str = "torch",
    ) -> Captured:
        """Kept per (baseline name, target, timing config, sets, launches): each job of
        the target captures only its candidate's graph. Counted as the graph's own bytes
        (``Captured.nbytes``: its outputs and its private memory pool); dropped with
        the timing sets it reads (``_drop``), and never kept once they are gone."""
        sets = self.timing(t, cfg.seed, nsets)
        key = ("graph", t.key, cfg.seed, nsets, calls, cfg, name)
        got = self._get(key)
        if got is None:
            got = capture(sets)
            self._keep(key, got, got.nbytes, needs=("timing", t.key, cfg.seed, nsets))
        return got

    @contextmanager
    def without_eviction(self) -> Iterator[None]:
        """Within: an entry is kept only where it fits beside what is kept (else used
        once, and ``full`` set): what is prepared ahead of a job never pushes out what a
        job already uses."""
        self._evict, self.full = False, False
        try:
            yield
        finally:
            self._evict = True

    def drop_target(self, t: Target) -> None:
        """Everything kept for ``t`` (its trials, timing sets and graphs)."""
        for key in [k for k in self._kept if k[1] == t.key]:
            self._drop(key)

    def stats(self) -> dict[str, int]:
        return {
            "entries": len(self._kept),
            "bytes": self.bytes,
            "hits": self.hits,
            "misses": self.misses,
            "redrawn": self.redrawn,
        }

    def _kept_bytes(self) -> int:
        """The bytes of the entries kept, summed afresh (``bytes`` keeps the count)."""
        return sum(n for _, n in self._kept.values())

    def _get(self, key: tuple) -> Any:
        kept = self._kept.get(key)
        if kept is None:
            self.misses += 1
            return None
        self.hits += 1
        self._kept.move_to_end(key)
        return kept[0]

    def _keep(self, key: tuple, entry: Any, nbytes: int, needs: tuple | None = None) -> None:
        """Keep ``entry``; ``needs``: the key of an entry it reads (kept only with it)."""
        if nbytes > self.max_bytes or (not self._evict and self.bytes + nbytes > self.max_bytes):
            self.full = self.full or not self._evict
            return  # used once, not kept
        while self._kept and self.bytes + nbytes > self.max_bytes:
            self._drop(next(iter(self._kept)))
        if needs is not None and needs not in self._kept:
            return  # what it reads was pushed out to make room: it would hold it uncounted
        self._kept[key] = (entry, nbytes)
        self.bytes += nbytes

    def _drop(self, key: tuple) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            self.bytes -= kept[1]
        if key[0] == "timing":  # the graphs reading these sets go with them
            for k in [k for k in self._kept if k[0] == "graph" and k[1:4] == key[1:4]]:
                self._drop(k)
