"""A round's proposals and builds as they come: the pipeline hands each candidate's job
to the runner as soon as its cubin is ready, so the GPU measures the first targets'
kernels while the proposer still proposes for the later targets and nvcc compiles
(``pipeline.build``).

Two threads behind the stream: one proposes for each target in order, and hands the
proposals on in chunks of enough new designs to keep every core busy; the other
compiles each chunk (on all cores) and puts, in order, each target's proposals and then
each build as it finishes. Proposing within a round reads only what earlier rounds
measured, so proposing target by target in a thread of its own proposes what proposing
them all first did.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cudal2.records import BuildResult, KernelDesign, Target


@dataclass(frozen=True)
class Proposed:
    """A target's proposals of the round; in the stream before any of their builds."""

    target: Target
    designs: tuple[KernelDesign, ...]


_END = None


class RoundStream:
    """``Proposed`` and ``BuildResult`` items as they come (iterate it; an error of the
    proposer or the compile is raised here). ``propose(target)``: a target's proposals;
    ``compile(designs, on_done)``: builds ``designs``, calling ``on_done`` with each
    build as it finishes; ``chunk``: the new designs a compile is started with (fewer
    only at the end); ``bar``: counts the targets proposed and compiled; ``on_end``:
    called with the number of designs compiled. A design proposed for a second target
    is compiled once: its build is put again after that target's proposals. ``close()``
    stops proposing and waits for both threads."""

    def __init__(
        self,
        targets: Sequence[Target],
        propose: Callable[[Target], Sequence[KernelDesign]],
        compile: Callable[[list[KernelDesign], Callable[[BuildResult], None]], None],
        chunk: int,
        bar: Any = None,
        on_end: Callable[[int], None] | None = None,
    ):
        self._targets = list(targets)
        self._propose_one = propose
        self._compile = compile
        self._chunk = max(1, chunk)
        self._bar = bar
        self._on_end = on_end
        self._out: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._chunks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._over = False
        self._threads = [
            threading.Thread(target=self._proposing, name="propose", daemon=True),
            threading.Thread(target=self._compiling, name="compile", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _proposing(self) -> None:
        try:
            batch: list[Proposed] = []
            seen: set[str] = set()
            new = 0
            for target in self._targets:
                if self._stop.is_set():
                    break
                p = Proposed(target, tuple(self._propose_one(target)))
                batch.append(p)
                new += len({d.key for d in p.designs} - seen)
                seen.update(d.key for d in p.designs)
                if new >= self._chunk:
                    self._chunks.put(batch)
                    batch, new = [], 0
            if batch:
                self._chunks.put(batch)
            self._chunks.put(_END)
        except BaseException as e:  # raised again in the thread that iterates
            self._chunks.put(e)

    def _compiling(self) -> None:
        built: dict[str, BuildResult] = {}
        compiled = 0
        try:
            while (batch := self._chunks.get()) is not _END:
                if isinstance(batch, BaseException):
                    raise batch
                if self._stop.is_set():
                    continue  # drain to the proposer's end
                fresh: dict[str, KernelDesign] = {}
                again: list[str] = []
                for p in batch:
                    self._out.put(p)
                    for d in p.designs:
                        if d.key in built:
                            again.append(d.key)
                        else:
                            fresh.setdefault(d.key, d)
                for key in dict.fromkeys(again):
                    self._out.put(built[key])

                def done(b: BuildResult) -> None:
                    built[b.design_key] = b
                    self._out.put(b)

                if fresh:
                    self._compile(list(fresh.values()), done)
                    compiled += len(fresh)
                if self._bar is not None:
                    self._bar.update(len(batch))
            if self._on_end is not None:
                self._on_end(compiled)
            self._out.put(_END)
        except BaseException as e:
            self._stop.set()
            self._out.put(e)

    def __iter__(self) -> RoundStream:
        return self

    def __next__(self) -> Proposed | BuildResult:
        if self._over:
            raise StopIteration
        item = self._out.get()
        if item is _END or isinstance(item, BaseException):
            self._over = True
            if item is _END:
                raise StopIteration
            raise item
        return item

    def close(self) -> None:
        """Stop proposing, and wait for both threads (a running compile ends first)."""
        self._stop.set()
        for t in self._threads:
            t.join()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
