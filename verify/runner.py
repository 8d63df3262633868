"""Runners: where the pipeline's jobs are answered.

The pipeline measures through one small interface, ``Runner``: it hands over typed
``Job``s and gets typed ``JobResult``s back. What stands behind it is the runner's
business: worker processes on the local GPU (``LocalRunner``, ``verify/local.py``),
recorded measurements (``ReplayRunner``, ``verify/replay.py``), a worker process per GPU of
the host (``HostRunner``, ``verify/host.py``), a Ray actor per GPU of a cluster
(``verify/ray_runner.py``). The manifest's ``[runner]`` picks one
(``cudal2.pipeline.runners``). The database has one writer, the pipeline: a runner never
writes records.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from cudal2.records import GpuInfo, Job, JobResult, KernelDesign, Target


class Runner(Protocol):
    """Answers jobs on one GPU model.

    - ``start()`` readies the runner (starts its workers) and returns the GPU it
      measures on; called once, before any ``run``.
    - ``cublaslt_version``: the cuBLASLt version its ``cublaslt`` jobs autotune with
      (known after ``start``; None: it cannot autotune cuBLASLt).
    - ``needs_cubins``: whether kernel jobs must name compiled cubins (``Job.cubin``);
      where not (a replay), the pipeline renders designs for their artifact keys and
      runs no compiler.
    - ``designs(target)``: the designs it can answer for ``target`` (a replay: the
      recorded ones), which the proposers then search; None: any design.
    - ``run(jobs)``: one answer per job, in any order, each carrying its job. ``jobs``
      may be any iterable, consumed lazily: the pipeline hands a round's jobs over as
      their cubins finish compiling (a generator that blocks until the next is ready),
      so a runner takes each job when it can start it, never the whole list first, and
      iterates ``jobs`` once (it may be taken from another thread of the runner's, not
      from two at once). What a candidate does (a wrong result, a crash, a hang) is an
      answer, never an exception. The caller may stop iterating at any time: jobs not
      yet answered are then not run (or their answers dropped).
    - ``close()``: releases workers; a runner is also a context manager.
    - optional, ``prepare(targets, timing)``: a hint that jobs of ``targets`` timed with
      ``timing`` will come; a runner may ready what they share while it has nothing to
      run (``LocalRunner``, ``HostRunner``: the workers' trials, references, timing sets
      and torch's graph, ``verify/worker.py``). It returns at once, never delays or
      answers a job, and may be absent (``ReplayRunner`` has nothing to ready;
      ``RayRunner`` leaves it to each actor's first job of a target).
    """

    name: str
    needs_cubins: bool

    @property
    def cublaslt_version(self) -> int | None: ...

    def start(self) -> GpuInfo: ...

    def designs(self, target: Target) -> Sequence[KernelDesign] | None: ...

    def run(self, jobs: Iterable[Job]) -> Iterator[JobResult]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Runner: ...

    def __exit__(self, *exc: object) -> None: ...
