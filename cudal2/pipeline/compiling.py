"""A round's proposals and builds as they come: the pipeline hands each candidate's job
to the runner as soon as its cubin is ready, so the GPU measures the first targets'
kernels while the proposer still proposes for the later targets and nvcc compiles
(``pipeline.build``).

Two threads behind the stream, and a pool of compile workers: one thread proposes for
each target in order and hands each target's proposals on at once; the other puts them
in the stream and starts the compile of each design not built or building yet on the
pool (at most ``workers`` at a time); each build is put as it finishes. A target's
proposals are always in the stream before any of their builds. Proposing within a round
reads only what earlier rounds measured, so proposing target by target in a thread of
its own proposes what proposing them all first did.

Until issue 23's fourth slice the proposals went on in chunks of ``2 x cores`` new
designs, each chunk compiled whole before the next: in a round after the first, whose
~30-45 new designs (of 192 candidates) made one chunk, nothing of the round was
measured until nearly every target had been proposed and that chunk compiled.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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
    build as it finishes (called with one design at a time, from up to ``workers``
    threads at once); ``bar``: counts the targets whose designs are all built;
    ``on_end``: called with the number of designs compiled. A design proposed for a
    second target is compiled once: its build is put again after that target's
    proposals (or, still building, put once when it finishes). ``close()`` stops
    proposing and compiling, and waits for the threads (running compiles end first)."""

    def __init__(
        self,
        targets: Sequence[Target],
        propose: Callable[[Target], Sequence[KernelDesign]],
        compile: Callable[[list[KernelDesign], Callable[[BuildResult], None]], None],
        workers: int,
        bar: Any = None,
        on_end: Callable[[int], None] | None = None,
    ):
        self._targets = list(targets)
        self._propose_one = propose
        self._compile = compile
        self._workers = max(1, workers)
        self._bar = bar
        self._on_end = on_end
        self._out: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._proposed: queue.SimpleQueue[Any] = queue.SimpleQueue()
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
            for target in self._targets:
                if self._stop.is_set():
                    break
                self._proposed.put(Proposed(target, tuple(self._propose_one(target))))
            self._proposed.put(_END)
        except BaseException as e:  # raised again in the thread that iterates
            self._proposed.put(e)

    def _compiling(self) -> None:
        lock = threading.Lock()
        built: dict[str, BuildResult] = {}
        building: set[str] = set()
        waiting: list[set[str]] = []  # per target handed on: its designs not built yet
        failed: list[BaseException] = []
        compiled = 0

        def count(key: str) -> None:  # under ``lock``: targets whose designs are all built
            done = 0
            for left in waiting:
                if key in left:
                    left.discard(key)
                    done += not left
            if done and self._bar is not None:
                self._bar.update(done)

        def done(b: BuildResult) -> None:
            with lock:
                built[b.design_key] = b
                building.discard(b.design_key)
                self._out.put(b)
                count(b.design_key)

        def run(d: KernelDesign) -> None:
            if self._stop.is_set():  # stopping: a compile not started is dropped
                with lock:
                    building.discard(d.key)
                return
            try:
                self._compile([d], done)
            except BaseException as e:
                with lock:
                    building.discard(d.key)
                failed.append(e)
                self._stop.set()
                self._proposed.put(e)  # wakes the compile thread, which raises it

        pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="nvcc")
        try:
            while (p := self._proposed.get()) is not _END:
                if isinstance(p, BaseException):
                    raise p
                if self._stop.is_set():
                    continue  # drain to the proposer's end
                fresh: list[KernelDesign] = []
                with lock:
                    self._out.put(p)
                    keys = list(dict.fromkeys(d.key for d in p.designs))  # in proposal order
                    for key in keys:
                        if key in built:  # built before: put again, after p
                            self._out.put(built[key])
                    left = {key for key in keys if key not in built}
                    waiting.append(left)
                    if not left and self._bar is not None:
                        self._bar.update(1)
                    for d in p.designs:
                        if d.key in left and d.key not in building:
                            building.add(d.key)
                            fresh.append(d)
                for d in fresh:
                    pool.submit(run, d)
                compiled += len(fresh)
            pool.shutdown(wait=True)
            if failed:
                raise failed[0]
            if self._on_end is not None:
                self._on_end(compiled)
            self._out.put(_END)
        except BaseException as e:
            self._stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
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
        """Stop proposing and compiling, and wait for the threads (a running compile
        ends first)."""
        self._stop.set()
        for t in self._threads:
            t.join()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
