"""A round's builds as they finish, compiled in the background: the pipeline hands each
candidate's job to the runner as soon as its cubin is ready, so the GPU measures the
first kernels of a round while nvcc still compiles the rest (``pipeline.build``)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any

from cudal2.records import BuildResult


class CompileStream:
    """A round's builds as they finish: ``work(on_done)`` compiles in a thread of its
    own, calling ``on_done`` with each build; iterating takes them as they come (an
    error of the compile raised here). ``close()`` waits for the compile."""

    def __init__(
        self,
        work: Callable[[Callable[[BuildResult], None]], int] | None,
        bar: Any,
        on_end: Callable[[int], None] | None = None,
    ):
        self._done: queue.SimpleQueue[BuildResult | BaseException | None] = queue.SimpleQueue()
        self._bar = bar
        self._over = False
        self._on_end = on_end  # with the number compiled, once the compile is done
        self._thread: threading.Thread | None = None
        if work is not None:
            self._thread = threading.Thread(target=self._work, args=(work,), name="compile")
            self._thread.daemon = True
            self._thread.start()

    @classmethod
    def done(cls, builds: Iterable[BuildResult]) -> CompileStream:
        """Builds known already (rendered, not compiled)."""
        out = cls(None, None)
        for b in builds:
            out._done.put(b)
        out._done.put(None)
        return out

    def _work(self, work: Callable[[Callable[[BuildResult], None]], int]) -> None:
        def finished(res: BuildResult) -> None:
            self._bar.update(1)
            self._done.put(res)

        try:
            compiled = work(finished)
            if self._on_end is not None:
                self._on_end(compiled)
            self._done.put(None)
        except BaseException as e:  # raised again in the thread that takes the builds
            self._done.put(e)

    def __iter__(self) -> CompileStream:
        return self

    def __next__(self) -> BuildResult:
        if self._over:
            raise StopIteration
        item = self._done.get()
        if item is None or isinstance(item, BaseException):
            self._over = True
            if item is None:
                raise StopIteration
            raise item
        return item

    def close(self) -> None:
        """Wait for the compile (a build stopped early: the running compiles end)."""
        if self._thread is not None:
            self._thread.join()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
