"""Where a build's seconds go: a clock per stage, and the table the build log ends with.

Each stage's seconds are *busy* seconds: the time a thread of the build spent in it.
The build overlaps some of them (the runner starts while the proposer loads and the
first round compiles; a round compiles while its first cubins are measured), so the
busy seconds of all stages may sum to more than the wall. Within one thread the clock
is exclusive: a stage entered inside another (the measuring runner waiting for the
next cubin inside "measure") pauses the outer one, so no second is counted twice by
one thread.

"GPU-busy" is what the GPU did: measure + profile + autotune + memcheck, each the time
the build waited on the runner's next answer. The rest of the wall the GPU idled.

The measure stage is split by the answers' own job seconds (``JobResult.job_s``: what
the worker reports, else the round trip its pool saw): the seconds "in the worker's
jobs", and the rest of the wait, "outside them" (the runner waiting for the next cubin
in another thread, the pipe, the runner's own threads). What the pipeline does with
each answer (the record made and written, progress) is the "record" stage, beside it.

With ``search.profile_lag`` 1 a round's Nsight Compute run goes on beside the policy
update and the next round's proposing and compiling, so "profile" is a background
stage; the GPU measures nothing beside it, and the seconds the next round waited for it
(its cubins ready, ncu not done) are "wait for profile": the part of the profile not
hidden behind the CPU's work.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

_T = TypeVar("_T")

# Every stage a build reports, in the order of the table (and of a build).
STAGES: tuple[str, ...] = (
    "start-up",  # the database read, the runner made (the process's imports: before the clock)
    "runner start",  # worker spawn, CUDA / nvmath init (in the background)
    "wait for runner",  # the build needed the GPU before the runner had started
    "proposer load",  # the policy's weights, its corpus
    "propose",  # in the background: a round's first targets measured while later ones are
    "compile",  # nvcc on all cores (in the background while a round is measured)
    "wait for cubins",  # the runner had nothing to measure until the next cubin
    "measure",
    "record",  # the pipeline's own work on each answer: the record made, written, counted
    "profile",  # Nsight Compute on each round's best (search.profile_lag 1: in the background)
    "wait for profile",  # the next round's cubins waited for the background ncu run to end
    "policy update",  # the proposer's observe (the policy's weights updated)
    "autotune",  # cuBLASLt
    "select",
    "memcheck",  # compute-sanitizer on the would-be winners
    "package",  # winners compiled, the native launcher, the wheel
)
# The stages every build runs beside the others (``StageClock.background`` adds more).
OVERLAPPED: tuple[str, ...] = ("runner start", "propose", "compile")
# What the GPU did: every second of these the build waited on the GPU's answer.
GPU_STAGES: tuple[str, ...] = ("measure", "profile", "autotune", "memcheck")


@dataclass(frozen=True)
class MeasureSplit:
    """The measure stage's answers: how many carried their job seconds, and those
    seconds summed (what the workers spent on the jobs, as they or their pools saw it)."""

    jobs: int
    in_jobs_s: float

    def outside_s(self, measure_s: float) -> float:
        """The measure stage's seconds outside the jobs (none where the runner ran the
        next job while the pipeline recorded the last: the jobs then overlap "record")."""
        return max(0.0, measure_s - self.in_jobs_s)


@dataclass(frozen=True)
class StageTimes:
    """A build's busy seconds per stage (every name of ``STAGES``), its wall seconds,
    and the number of targets it built. Busy seconds of overlapping stages sum to more
    than the wall. ``split``: the measure stage's answers' job seconds (None: no answer
    carried them, as a replay's)."""

    stages: dict[str, float]
    wall_s: float
    targets: int
    overlapped: tuple[str, ...] = field(default=OVERLAPPED)
    split: MeasureSplit | None = None

    @property
    def gpu_busy_s(self) -> float:
        return sum(self.stages.get(s, 0.0) for s in GPU_STAGES)

    @property
    def gpu_idle_s(self) -> float:
        return max(0.0, self.wall_s - self.gpu_busy_s)

    @property
    def busy_s(self) -> float:
        return sum(self.stages.values())

    @property
    def targets_per_gpu_hour(self) -> float:
        return self.targets * 3600.0 / self.wall_s if self.wall_s > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "stages_s": {s: round(self.stages.get(s, 0.0), 3) for s in STAGES},
            "wall_s": round(self.wall_s, 3),
            "busy_s": round(self.busy_s, 3),
            "gpu_busy_s": round(self.gpu_busy_s, 3),
            "gpu_idle_s": round(self.gpu_idle_s, 3),
            "targets": self.targets,
            "targets_per_gpu_hour": round(self.targets_per_gpu_hour, 1),
            "gpu_stages": list(GPU_STAGES),
            "overlapped": list(self.overlapped),
            **({} if self.split is None else {"measure_split": self._split_json(self.split)}),
        }

    def _split_json(self, split: MeasureSplit) -> dict[str, Any]:
        measure = self.stages.get("measure", 0.0)
        return {
            "jobs": split.jobs,
            "in_jobs_s": round(split.in_jobs_s, 3),
            "outside_s": round(split.outside_s(measure), 3),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StageTimes:
        split = d.get("measure_split")
        return cls(
            {s: float(v) for s, v in d["stages_s"].items()},
            float(d["wall_s"]),
            int(d["targets"]),
            tuple(d.get("overlapped", ())),
            None if split is None else MeasureSplit(int(split["jobs"]), float(split["in_jobs_s"])),
        )

    def table(self) -> str:
        """The table the build log ends with (plain text, one stage a line)."""
        width = max(len(s) for s in STAGES)
        lines = [f"{'stage':<{width}}  {'busy s':>8}  {'of wall':>7}"]
        for s in STAGES:
            secs = self.stages.get(s, 0.0)
            share = secs / self.wall_s if self.wall_s > 0 else 0.0
            gpu = "  GPU" if s in GPU_STAGES else ""
            bg = "  (background)" if s in self.overlapped else ""
            lines.append(f"{s:<{width}}  {secs:8.1f}  {share:7.0%}{gpu}{bg}")
            if s == "measure" and self.split is not None:
                lines += self._split_lines(self.split, secs, width)
        lines += [
            f"{'busy, all stages':<{width}}  {self.busy_s:8.1f}",
            f"{'wall':<{width}}  {self.wall_s:8.1f}",
            f"{'GPU busy':<{width}}  {self.gpu_busy_s:8.1f}  {self._share(self.gpu_busy_s):7.0%}",
            f"{'GPU idle':<{width}}  {self.gpu_idle_s:8.1f}  {self._share(self.gpu_idle_s):7.0%}",
            f"{self.targets} targets: {self.targets_per_gpu_hour:.0f} targets per GPU-hour (wall)",
        ]
        if self.busy_s > self.wall_s:
            lines.append(
                "(stages overlap: the background stages ran beside the others, so busy "
                "seconds sum to more than the wall)"
            )
        return "\n".join(lines)

    def _share(self, secs: float) -> float:
        return secs / self.wall_s if self.wall_s > 0 else 0.0

    def _split_lines(self, split: MeasureSplit, measure: float, width: int) -> list[str]:
        each = f", {split.in_jobs_s / split.jobs * 1e3:.0f} ms each" if split.jobs else ""
        outside = split.outside_s(measure)
        return [
            f"{'  in the jobs':<{width}}  {split.in_jobs_s:8.1f}  "
            f"{self._share(split.in_jobs_s):7.0%}  ({split.jobs} jobs{each})",
            f"{'  outside them':<{width}}  {outside:8.1f}  {self._share(outside):7.0%}"
            "  (the next cubin, the pipe, the runner's threads)",
        ]

    def write(self, path: Path) -> None:
        """The JSON, written atomically (a temporary file, then renamed)."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.as_json(), indent=1) + "\n")
        os.replace(tmp, path)


class StageClock:
    """Busy seconds per stage, from any thread. ``clock``: a monotonic clock (a test
    passes a fake one). The wall counts from ``started`` (default: now)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, started: float | None = None):
        self.clock = clock
        self.started = clock() if started is None else started
        self._busy: dict[str, float] = {}
        self._jobs = 0  # the measure stage's answers that carried their job seconds
        self._job_s = 0.0
        self._lock = threading.Lock()
        self._local = threading.local()  # each thread's stack of [stage, resumed at]
        self._background: set[str] = set(OVERLAPPED)
        self._shared: dict[str, tuple[int, float]] = {}  # stage -> (threads inside, since)

    def _stack(self) -> list[list[Any]]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _add(self, name: str, secs: float) -> None:
        with self._lock:
            self._busy[name] = self._busy.get(name, 0.0) + secs

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Count the time inside as ``name``'s, pausing this thread's enclosing stage."""
        if name not in STAGES:
            raise ValueError(f"unknown build stage {name!r}: one of {', '.join(STAGES)}")
        stack = self._stack()
        now = self.clock()
        if stack:
            outer = stack[-1]
            self._add(outer[0], now - outer[1])
        stack.append([name, now])
        try:
            yield
        finally:
            now = self.clock()
            inner = stack.pop()
            self._add(inner[0], now - inner[1])
            if stack:
                stack[-1][1] = now  # the enclosing stage resumes

    @contextmanager
    def shared(self, name: str) -> Iterator[None]:
        """Count the time inside as ``name``'s, once however many threads are inside at
        the same time (the union of their spans): compiles running side by side on a
        pool are the compile stage's busy seconds, not their sum. No enclosing stage of
        the thread is paused (the pool's threads have none)."""
        if name not in STAGES:
            raise ValueError(f"unknown build stage {name!r}: one of {', '.join(STAGES)}")
        with self._lock:
            inside, since = self._shared.get(name, (0, self.clock()))
            self._shared[name] = (inside + 1, since)
        try:
            yield
        finally:
            with self._lock:
                inside, since = self._shared.pop(name)
                if inside > 1:
                    self._shared[name] = (inside - 1, since)
                else:
                    self._busy[name] = self._busy.get(name, 0.0) + self.clock() - since

    def background(self, name: str) -> None:
        """Say that stage ``name`` runs beside the others in this build (the table marks
        it so): ``profile`` with ``search.profile_lag`` 1."""
        if name not in STAGES:
            raise ValueError(f"unknown build stage {name!r}: one of {', '.join(STAGES)}")
        with self._lock:
            self._background.add(name)

    def timed(self, items: Iterable[_T], name: str) -> Iterator[_T]:
        """``items``, the wait for each next one counted as ``name``'s (a runner's
        answers: the time the GPU took)."""
        it = iter(items)
        try:
            while True:
                with self.stage(name):
                    try:
                        item = next(it)
                    except StopIteration:
                        return
                yield item
        finally:
            close = getattr(it, "close", None)
            if close is not None:  # a caller that stops early stops the runner's answers
                close()

    def measured(self, job_s: float | None) -> None:
        """One measure answer's job seconds (``JobResult.job_s``; None: it has none)."""
        if job_s is None:
            return
        with self._lock:
            self._jobs += 1
            self._job_s += job_s

    def times(self, targets: int) -> StageTimes:
        """The stages so far, the wall up to now."""
        with self._lock:
            busy = {s: self._busy.get(s, 0.0) for s in STAGES}
            split = MeasureSplit(self._jobs, self._job_s) if self._jobs else None
            overlapped = tuple(s for s in STAGES if s in self._background)
        return StageTimes(busy, self.clock() - self.started, targets, overlapped, split)
