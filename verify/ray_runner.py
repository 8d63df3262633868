"""``RayRunner``: the jobs of a build answered by one Ray actor per GPU of a cluster.

Ray (``pip install 'cudal2[ray]'``) is the distributed engine: it places one actor on
each GPU of the cluster (``num_gpus=1``; Ray sets the actor's ``CUDA_VISIBLE_DEVICES``),
and each actor wraps an ordinary runner of its own (default: ``LocalRunner`` on the one
GPU Ray gave it, so a hang or crash of a candidate costs only that job, as on one GPU).
Ray is imported only when a ``RayRunner`` starts, never at ``cudal2`` import time.

What travels (docs/runners.md, "A Ray cluster"):

- **jobs and answers**, in their JSON form (``Job.as_json`` / ``JobResult.as_json``);
  each answer comes back tagged with the GPU that gave it (``JobResult.gpu``: model,
  index on its node, node's host name);
- **cubins, by content key**: a job names a cubin on the driver's host (``Job.cubin``).
  The driver reads it once, checked against the sha256 its compile recorded in the
  artifact cache, and puts the bytes in Ray's object store once per artifact key; an
  actor fetches them the first time one of its jobs needs that artifact, checks the
  bytes' sha256 against the recorded one, and writes them (atomically) into a folder of
  its own keyed by artifact key. Bytes that do not match are that job's ``runtime``
  answer: nothing is launched.
- **compiles** (``RayRunner.compile``): one Ray task per design (``num_cpus=1``) renders
  and runs nvcc on whichever node has a free CPU and returns the build record, source
  and cubin; the driver writes them into its own artifact cache as ``build_all`` does.

The database still has one writer, the pipeline, on the driver: actors only answer.

Jobs stream in: ``run`` reads its jobs (the pipeline's stream, whose next job exists once
its cubin is compiled) in a thread of its own, one job for each idle actor (``_Reader``),
so measuring overlaps compiling and the stream is never drained ahead of the GPUs.

Failures: an actor that dies (``RayActorError``) or gives no answer within its deadline
(it is killed) loses only its one job in flight, which goes back to the queue for
another actor (a job that hung ``MAX_LOSSES`` actors is answered ``timeout`` instead: it
is what hangs them). Every job is answered exactly once; when every actor is lost, the
jobs left are answered ``runtime`` with the reason, never a hang.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from cudal2.generator.cache import ArtifactCache, CacheIntegrityError
from cudal2.records import (
    BuildResult,
    GpuInfo,
    Job,
    JobKind,
    JobResult,
    KernelDesign,
    Status,
    Target,
    sha256_hex,
)
from cudal2.verify.fleet import FleetError, check_cublaslt, check_fleet, recorded_as

START_TIMEOUT_S = 600.0  # every actor's inner runner started (a GPU worker: torch + CUDA)
CLOSE_TIMEOUT_S = 30.0  # the actors' runners closed (worker processes stopped)
GRACE_S = 120.0  # past the inner runner's own timeout: the actor itself is hung
MAX_LOSSES = 2  # actors a job may hang before it is answered rather than re-queued
# What a profile / sanitizer job may take in the default inner runner (ncu: 900 s,
# compute-sanitizer: 600 s); the actor's deadline is this or ``job_timeout_s``, plus grace.
SLOW_KIND_S = {JobKind.PROFILE: 900.0, JobKind.SANITIZE: 600.0}
POLL_S = 0.02  # how often the loop looks for a job read while answers are awaited
_KEY_RE = re.compile(r"[0-9A-Za-z][0-9A-Za-z_.-]{0,127}")


class RayUnavailableError(RuntimeError):
    """Ray is not installed (it is the optional extra ``cudal2[ray]``)."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailableError(
            "the Ray runner needs Ray: pip install 'cudal2[ray]' (or pip install 'ray>=2.9')"
        ) from None
    return ray


@dataclasses.dataclass(frozen=True)
class LocalRunnerFactory:
    """The default inner runner of an actor: ``LocalRunner`` on device 0 (the GPU Ray
    gave the actor is the only one it sees). Picklable, so Ray can ship it."""

    job_timeout_s: float = 180.0

    def __call__(self) -> Any:
        from cudal2.verify.local import LocalRunner

        return LocalRunner(device=0, job_timeout_s=self.job_timeout_s)


class GpuActor:
    """One GPU of the cluster: an inner runner answering one job at a time, and the
    cubins shipped to it, checked, in a folder of its own. Ray runs it as an actor
    (``ray.remote(num_gpus=1)(GpuActor)``); its methods take and return JSON forms."""

    def __init__(self, factory: Callable[[], Any]):
        self.factory = factory
        self.runner: Any = None
        self.folder = Path(tempfile.mkdtemp(prefix="cudal2-ray-cubins-"))
        self.have: set[str] = set()  # artifact keys whose checked cubin is in ``folder``

    def hello(self) -> dict[str, Any]:
        """Starts the inner runner; its GPU, tagged with this node's host name and the
        GPU's index on it (Ray's id, not the 0 the inner runner sees)."""
        ray = _ray()
        self.runner = self.factory()
        gpu = self.runner.start()
        ids = ray.get_gpu_ids()
        index = int(ids[0]) if ids else gpu.index
        gpu = dataclasses.replace(gpu, index=index, host=socket.gethostname())
        return {
            "gpu": gpu.as_json(),
            "cublaslt_version": self.runner.cublaslt_version,
            "needs_cubins": bool(self.runner.needs_cubins),
            "name": self.runner.name,
        }

    def designs(self, target: dict[str, Any]) -> list[dict[str, Any]] | None:
        found = self.runner.designs(Target.from_json(target))
        return None if found is None else [d.as_json() for d in found]

    def run(self, job: dict[str, Any], cubin: dict[str, Any] | None) -> dict[str, Any]:
        """One job's answer. ``cubin``: the shipped cubin's key, sha256, size and object
        reference (in a list, so Ray does not fetch the bytes unless asked)."""
        j = Job.from_json(job)
        if cubin is not None:
            path, problem = self._cubin(cubin)
            if path is None:
                return JobResult(j, Status.RUNTIME, problem).as_json()
            j = dataclasses.replace(j, cubin=str(path))
        answers = list(self.runner.run([j]))
        if len(answers) != 1:
            why = f"the actor's runner gave {len(answers)} answers to one job"
            return JobResult(j, Status.RUNTIME, why).as_json()
        res = answers[0]
        return dataclasses.replace(res, job=Job.from_json(job)).as_json()  # the job as sent

    def _cubin(self, spec: dict[str, Any]) -> tuple[Path | None, str]:
        key, want, size = spec["key"], spec["sha256"], spec["size"]
        if not _KEY_RE.fullmatch(key):
            return None, f"artifact key {key!r} cannot name a file: not launched"
        path = self.folder / key[:2] / key / "kernel.cubin"
        if key in self.have:  # checked again before each use (a hash: microseconds)
            with contextlib.suppress(OSError):
                if sha256_hex(path.read_bytes()) == want:
                    return path, ""
            self.have.discard(key)  # gone or changed here: fetched again
        data = _ray().get(spec["ref"][0])
        got = sha256_hex(data)
        if got != want or len(data) != size:
            return None, (
                f"the cubin of artifact {key} arrived as {len(data)} bytes of sha256 {got}; "
                f"its compile recorded {size} bytes of sha256 {want}: not launched"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".kernel.cubin.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # a reader sees the whole cubin or none
        self.have.add(key)
        return path, ""

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _compile_task(design: dict[str, Any], expected: str) -> tuple[dict[str, Any], str, Any]:
    """A Ray task: one design compiled on this node, in a throw-away artifact cache.
    Returns its build record, source and cubin bytes (None for a failed compile), or
    (record, "", None) without compiling where this node's nvcc gives another artifact
    key than the driver's (``expected``): the driver then compiles it itself."""
    # The Ray runner's compiles run nvcc on the cluster's CPUs; its GPU actors run none
    # (the one import of the compiler in verify/, allowed by name in pyproject.toml).
    from cudal2.generator.compile import artifact_key_of, build
    from cudal2.generator.render import render

    d = KernelDesign.from_json(design)
    key = artifact_key_of(d)
    if key != expected:
        return BuildResult(d.key, key, False, "", "another nvcc").as_json(), "", None
    with tempfile.TemporaryDirectory(prefix="cudal2-ray-compile-") as tmp:
        cache = ArtifactCache(Path(tmp))
        res = build(d, cache)
        cubin = cache.cubin(res.artifact_key) if res.ok else None
    return res.as_json(), render(d), cubin


@dataclasses.dataclass
class _Actor:
    handle: Any
    gpu: GpuInfo  # as recorded: the fleet's model, this GPU's index and host
    alive: bool = True
    abandoned: Any = None  # a call whose caller stopped iterating: the actor is busy
    abandoned_until: float = 0.0  # its deadline: past it, the actor is hung
    sent_at: float = 0.0  # when it was last given a job (the idle longest go first)


@dataclasses.dataclass
class _Flight:
    actor: _Actor
    job: Job
    deadline: float
    losses: int  # actors this job has lost before


class RayRunner:
    """One Ray actor per GPU of a Ray cluster (see the module docstring).

    ``address``: None starts a local head on this host (or uses the Ray this process
    already joined); else the cluster to connect to (``"auto"``, ``"HOST:6379"``).
    ``interchangeable``: groups of GPU models whose answers may stand for one another
    (``check_fleet``); their answers are recorded as measured on the model ``start()``
    returns (the first GPU's name and architecture), each keeping its own index and
    host. ``job_timeout_s``: the inner runner's timeout per job; an actor that gives no
    answer ``GRACE_S`` past it (or past a profile / sanitizer run's) is hung: killed, its
    job re-queued. ``actor_runner``: a picklable zero-argument factory of each actor's
    inner runner (default: ``LocalRunner`` on the actor's GPU). ``log``: where progress
    lines go (a stream or a function of a line; default stderr).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        interchangeable: Sequence[Sequence[str]] = (),
        job_timeout_s: float = 180.0,
        actor_runner: Callable[[], Any] | None = None,
        log: TextIO | Callable[[str], None] | None = None,
        grace_s: float = GRACE_S,
    ):
        self.address = address
        self.interchangeable = tuple(tuple(g) for g in interchangeable)
        self.job_timeout_s = job_timeout_s
        self.grace_s = grace_s
        self.actor_runner = actor_runner or LocalRunnerFactory(job_timeout_s)
        self._log = log
        self.name = (
            f"Ray actors on the GPUs of {'a local Ray head' if address is None else address}"
        )
        self.needs_cubins = True  # until the actors say (a replay needs none)
        self._cublaslt: int | None = None
        self._gpu: GpuInfo | None = None
        self._actors: list[_Actor] = []
        self._owns_ray = False
        self._shipped: dict[str, dict[str, Any]] = {}  # artifact key -> what travels
        self._designs: dict[Target, Sequence[KernelDesign] | None] = {}
        self.losses: list[str] = []  # why each lost actor was lost, in order

    # -- the Runner protocol ----------------------------------------------------------
    @property
    def cublaslt_version(self) -> int | None:
        return self._cublaslt

    @property
    def actors(self) -> list[Any]:
        """The live actors' handles (a test kills one with ``ray.kill``)."""
        return [a.handle for a in self._actors if a.alive]

    def start(self) -> GpuInfo:
        if self._gpu is not None:
            return self._gpu
        ray = self._init()
        gpus = int(ray.available_resources().get("GPU", 0))
        if gpus < 1:
            raise FleetError(
                f"the Ray cluster ({self._where()}) has no free GPU: start its nodes with "
                "ray start --num-gpus=N (docs/runners.md)"
            )
        cls = ray.remote(num_gpus=1, num_cpus=1, max_restarts=0)(GpuActor)
        handles = [cls.remote(self.actor_runner) for _ in range(gpus)]
        calls = [h.hello.remote() for h in handles]
        ready, late = ray.wait(calls, num_returns=len(calls), timeout=START_TIMEOUT_S)
        hellos: list[tuple[Any, dict[str, Any]]] = []
        for h, call in zip(handles, calls, strict=True):
            try:
                if call in late:
                    raise TimeoutError(f"not started within {START_TIMEOUT_S:.0f} s")
                hellos.append((h, ray.get(call)))
            except Exception as exc:  # one GPU that cannot start is left out, named
                self._say(f"Ray: an actor could not start and is left out: {_why(exc)}")
                ray.kill(h)
        if not hellos:
            self.close()
            raise FleetError(f"no Ray actor could start its runner ({self._where()})")
        hellos.sort(key=lambda x: (x[1]["gpu"].get("host", ""), x[1]["gpu"].get("index") or 0))
        self._actors = [_Actor(h, GpuInfo.from_json(x["gpu"])) for h, x in hellos]
        try:
            first = check_fleet([a.gpu for a in self._actors], self.interchangeable)
        except FleetError:
            self.close()  # the actors go, and their GPUs back to Ray
            raise
        for a in self._actors:  # recorded as the fleet's model; its own index and host
            a.gpu = recorded_as(a.gpu, first)
        self.needs_cubins = any(x["needs_cubins"] for _, x in hellos)
        try:
            versions = {
                a.gpu.where: x["cublaslt_version"]
                for a, (_, x) in zip(self._actors, hellos, strict=True)
            }
            self._cublaslt = check_cublaslt(versions)
        except FleetError:
            self.close()
            raise
        self.name = f"{len(self._actors)} Ray actors ({hellos[0][1]['name']}) on {self._where()}"
        self._say(f"Ray: measuring on {', '.join(a.gpu.where for a in self._actors)}")
        self._gpu = first
        return first

    def designs(self, target: Target) -> Sequence[KernelDesign] | None:
        """What the actors' runners can answer for ``target`` (asked of one actor once)."""
        if target not in self._designs:
            ray = _ray()
            for a in self._actors:
                if not a.alive:
                    continue
                try:
                    found = ray.get(a.handle.designs.remote(target.as_json()))
                except ray.exceptions.RayActorError as exc:
                    self._lose(ray, a, f"actor on {a.gpu.where} died: {_why(exc)}")
                    continue
                self._designs[target] = (
                    None if found is None else [KernelDesign.from_json(d) for d in found]
                )
                break
            else:
                return None  # no actor left: run() answers every job "runtime"
        return self._designs[target]

    def run(self, jobs: Iterable[Job]) -> Iterator[JobResult]:
        """Answers as they come, one job in flight per actor. ``jobs`` may be a stream
        that blocks until its next job exists (the pipeline's, a cubin still compiling):
        a thread of its own reads it (``_Reader``), one job for each idle actor and no
        more, so jobs are measured while later ones compile, and the loop that takes
        answers, kills hung actors and re-queues a lost actor's job never waits on it.
        A re-queued job goes before any new one. An error raised by ``jobs`` is raised
        here. A caller that stops iterating starts nothing more (the reader stops
        too); the calls in flight then finish unheard."""
        ray = _ray()
        queue: deque[tuple[Job, int]] = deque()  # re-queued: (job, actors it hung)
        flying: dict[Any, _Flight] = {}
        feed = _Reader(jobs)
        wait = True  # for the reader's job in hand, so nothing reads the stream after us
        try:
            while True:
                self._reclaim(ray)
                for actor in self._idle(flying):
                    if queue:  # a lost actor's job, before any new one
                        job, losses = queue.popleft()
                        feed.served()
                    else:
                        nxt = feed.take()  # raises the stream's error, in its order
                        if nxt is None:
                            break
                        job, losses = nxt, 0
                    sent = self._send(ray, actor, job)
                    if isinstance(sent, JobResult):  # its cubin could not be read here
                        yield sent
                        continue
                    actor.sent_at = time.monotonic()
                    deadline = actor.sent_at + self._deadline(job)
                    flying[sent] = _Flight(actor, job, deadline, losses)
                if not any(a.alive for a in self._actors):  # then nothing is in flight
                    why = self.losses[-1] if self.losses else "none started"
                    left = [j for j, _ in queue]
                    queue.clear()
                    for job in itertools.chain(left, feed.rest()):
                        yield JobResult(job, Status.RUNTIME, f"every Ray actor was lost ({why})")
                    return
                idle = self._idle(flying)
                feed.ask(len(idle))  # one job read ahead per idle actor, no more
                if not flying:
                    if not queue and feed.over():
                        return
                    if idle:  # the stream's next job (a cubin compiling), its end or error
                        feed.wait(POLL_S)
                    else:  # live actors, all busy with calls a caller abandoned
                        self._wait_abandoned(ray)
                    continue
                now = time.monotonic()
                wait_s = max(0.0, min(f.deadline for f in flying.values()) - now)
                if idle and feed.reading():  # an idle actor waits for the stream: look again
                    wait_s = min(wait_s, POLL_S)
                ready, _ = ray.wait(list(flying), num_returns=1, timeout=wait_s)
                if not ready:  # a deadline passed (that actor is hung), or a job was read
                    for ref, f in list(flying.items()):
                        if f.deadline <= time.monotonic():
                            del flying[ref]
                            why = f"no answer within {self._deadline(f.job):.0f} s"
                            self._lose(ray, f.actor, why)
                            ans = self._requeue(f, queue, why, hung=True)
                            if ans is not None:
                                yield ans
                    continue
                for ref in ready:
                    f = flying.pop(ref)
                    try:
                        answer = JobResult.from_json(ray.get(ref))
                    except ray.exceptions.RayActorError as exc:
                        why = f"actor on {f.actor.gpu.where} died: {_why(exc)}"
                        self._lose(ray, f.actor, why)
                        ans = self._requeue(f, queue, why, hung=False)
                        if ans is not None:
                            yield ans
                        continue
                    except Exception as exc:  # the inner runner raised: this job's answer
                        answer = JobResult(f.job, Status.RUNTIME, f"Ray actor: {_why(exc)}")
                    yield dataclasses.replace(answer, job=f.job, gpu=f.actor.gpu)
        except BaseException as e:
            # Ctrl-C: no waiting on a stream that may block (the thread is a daemon).
            wait = not isinstance(e, KeyboardInterrupt)
            raise
        finally:
            feed.stop(wait)
            for ref, f in flying.items():  # finish unheard; the actor is busy until then
                f.actor.abandoned, f.actor.abandoned_until = ref, f.deadline

    def close(self) -> None:
        """Each idle actor closes its runner (its worker processes, its cubin folder),
        all at once, for at most ``CLOSE_TIMEOUT_S``; then every actor is killed (one
        still busy with an abandoned call at once), and a head this runner started is
        shut down (a cluster it connected to keeps running: only this driver leaves)."""
        if self._actors or self._owns_ray:
            with contextlib.suppress(Exception):
                ray = _ray()
                idle = [a for a in self._actors if a.alive and a.abandoned is None]
                with contextlib.suppress(Exception):
                    calls = [a.handle.close.remote() for a in idle]
                    ray.wait(calls, num_returns=len(calls), timeout=CLOSE_TIMEOUT_S)
                for a in self._actors:
                    with contextlib.suppress(Exception):
                        ray.kill(a.handle)
                self._actors = []
                if self._owns_ray:  # a head this runner started, or its connection
                    ray.shutdown()
                    self._owns_ray = False
        self._gpu = None
        self._shipped.clear()

    def __enter__(self) -> RayRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- compiling on the cluster's CPUs ----------------------------------------------
    def compile(
        self,
        designs: Iterable[KernelDesign],
        cache: ArtifactCache,
        jobs: int | None = None,
        on_done: Callable[[BuildResult], None] | None = None,
    ) -> dict[str, BuildResult]:
        """``generator.compile.build_all`` on the cluster: design key -> BuildResult,
        each design not in ``cache`` compiled by a Ray task (``num_cpus=1``, at most
        ``jobs`` at a time; None: as many as Ray schedules) and its entry written into
        ``cache`` here, as a local compile writes it (the cubin checked against the
        sha256 recorded for it). A design a node could not compile for this host (its
        nvcc makes another artifact key, or the task failed) is compiled here. A compile
        error is a result, never raised; on any exception the tasks are cancelled."""
        from cudal2.generator.compile import artifact_key_of, build  # see _compile_task

        ray = self._init()
        unique = {d.key: d for d in designs}
        results: dict[str, BuildResult] = {}

        def done(res: BuildResult) -> None:
            results[res.design_key] = res
            if on_done:
                on_done(res)

        todo: deque[tuple[KernelDesign, str]] = deque()
        for d in unique.values():
            key = artifact_key_of(d)
            hit = cache.get(key)
            if hit is not None:
                done(hit)
            else:
                todo.append((d, key))
        task = ray.remote(num_cpus=1, max_retries=1)(_compile_task)
        limit = max(1, jobs) if jobs else len(todo)
        flying: dict[Any, tuple[KernelDesign, str]] = {}
        try:
            while todo or flying:
                while todo and len(flying) < limit:
                    d, key = todo.popleft()
                    flying[task.remote(d.as_json(), key)] = (d, key)
                ready, _ = ray.wait(list(flying), num_returns=1)
                for ref in ready:
                    d, key = flying.pop(ref)
                    try:
                        record, source, cubin = ray.get(ref)
                        res = BuildResult.from_json(record)
                    except Exception as exc:
                        self._say(
                            f"Ray: compile task of {d.key} failed ({_why(exc)}): compiled here"
                        )
                        done(build(d, cache))
                        continue
                    if res.artifact_key != key:
                        self._say(
                            f"Ray: a node's nvcc differs from this host's: {d.key} compiled here"
                        )
                        done(build(d, cache))
                        continue
                    cache.put(res, source, cubin)  # checks the cubin against its record
                    done(cache.get(key) or build(d, cache))
        except BaseException:
            for ref in flying:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
            raise
        return results

    # -- internals --------------------------------------------------------------------
    def _init(self) -> Any:
        ray = _ray()
        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            if self.address is None:
                ray.init(include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=self.address, log_to_driver=False)
            self._owns_ray = True
        return ray

    def _where(self) -> str:
        return "a local Ray head" if self.address is None else f"the Ray cluster at {self.address}"

    def _say(self, msg: str) -> None:
        if callable(self._log):
            self._log(msg)
        else:
            print(msg, file=self._log or sys.stderr, flush=True)

    def _deadline(self, job: Job) -> float:
        return max(self.job_timeout_s, SLOW_KIND_S.get(job.kind, 0.0)) + self.grace_s

    def _idle(self, flying: dict[Any, _Flight]) -> list[_Actor]:
        """The actors free for a job, the one idle longest first: where the stream is
        slower than the GPUs, its jobs are spread over them rather than all given to
        the first (each GPU's records then say it worked, and a lost one costs less)."""
        busy = {id(f.actor) for f in flying.values()}
        free = [a for a in self._actors if a.alive and a.abandoned is None and id(a) not in busy]
        return sorted(free, key=lambda a: a.sent_at)

    def _reclaim(self, ray: Any) -> None:
        """Actors whose abandoned call has finished are free again (or found dead, or
        hung past its deadline: killed)."""
        for a in self._actors:
            if a.alive and a.abandoned is not None:
                ready, _ = ray.wait([a.abandoned], timeout=0)
                if not ready and time.monotonic() >= a.abandoned_until:
                    self._lose(ray, a, "no answer to an abandoned job by its deadline")
                    a.abandoned = None
                elif ready:
                    try:
                        ray.get(ready[0])
                    except ray.exceptions.RayActorError as exc:
                        self._lose(ray, a, f"actor on {a.gpu.where} died: {_why(exc)}")
                    except Exception:
                        pass  # an answer nobody asks for any more
                    a.abandoned = None

    def _wait_abandoned(self, ray: Any) -> None:
        """Until one abandoned call ends or reaches its deadline."""
        busy = [a for a in self._actors if a.alive and a.abandoned is not None]
        if busy:
            wait_s = max(0.0, min(a.abandoned_until for a in busy) - time.monotonic())
            ray.wait([a.abandoned for a in busy], num_returns=1, timeout=wait_s)

    def _send(self, ray: Any, actor: _Actor, job: Job) -> Any:
        """The call running ``job`` on ``actor``, or ``job``'s answer where its cubin
        cannot be shipped."""
        cubin = None
        if job.cubin:
            try:
                cubin = self._ship(ray, job)
            except (OSError, CacheIntegrityError) as exc:
                why = f"the cubin {job.cubin} cannot be shipped: {_why(exc)}"
                return JobResult(job, Status.RUNTIME, why)
        return actor.handle.run.remote(job.as_json(), cubin)

    def _ship(self, ray: Any, job: Job) -> dict[str, Any]:
        """The cubin of ``job`` as it travels: read and checked once per artifact key,
        put in the object store once."""
        key = job.artifact_key
        if key not in self._shipped:
            data, sha = _read_cubin(Path(job.cubin), key)
            ref = ray.put(self._in_flight(data))
            self._shipped[key] = {"key": key, "sha256": sha, "size": len(data), "ref": [ref]}
        return self._shipped[key]

    def _in_flight(self, data: bytes) -> bytes:
        """The bytes put in the object store (a test seam: a subclass corrupts them)."""
        return data

    def _lose(self, ray: Any, actor: _Actor, why: str) -> None:
        """Takes ``actor`` out of service for good, killed (it may be hung, or merely
        unreachable: either way its GPU goes back to Ray)."""
        if actor.alive:
            actor.alive = False
            self.losses.append(why)
            self._say(f"Ray: lost the actor on {actor.gpu.where}: {why}")
            with contextlib.suppress(Exception):
                ray.kill(actor.handle)

    def _requeue(
        self, flight: _Flight, queue: deque[tuple[Job, int]], why: str, hung: bool
    ) -> JobResult | None:
        """Back to the front of the queue for another actor, or its ``timeout`` answer
        where it has now hung ``MAX_LOSSES`` actors (it is what hangs them). A death
        never counts against the job: its actor was lost to something else (a node, a
        ``ray.kill``; a candidate's own crash kills only the inner runner's worker), and
        each death takes an actor out for good, so re-queueing after deaths ends."""
        n = flight.losses + hung
        if n >= MAX_LOSSES:
            return JobResult(flight.job, Status.TIMEOUT, f"hung {n} Ray actors; last: {why}")
        queue.appendleft((flight.job, n))
        return None


class _Reader:
    """One ``run``'s job stream, read by a thread of its own, on demand: ``ask(n)`` lets
    it hold ``n`` jobs read and not yet taken (one per idle actor), so it never reads
    further ahead than the actors can start (the pipeline's stream is not drained before
    the first job is sent, and a caller that stops leaves the rest unread). ``next()``
    of the stream may block (a cubin still compiling): only this thread waits on it.
    An error the stream raises is kept and raised to the runner's caller, after the
    jobs read before it."""

    def __init__(self, jobs: Iterable[Job]):
        self._source = iter(jobs)
        self._cond = threading.Condition()
        self._buffer: deque[Job] = deque()  # read, not yet taken
        self._want = 0  # jobs to hold read (buffered, or being read)
        self._reading = False  # the thread is inside the stream's next()
        self._exhausted = False
        self._error: BaseException | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._read, name="ray-job-reader", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and len(self._buffer) >= self._want:
                    self._cond.wait()
                if self._stopped:
                    return
                self._reading = True
            try:
                job = next(self._source)
            except StopIteration:
                job = None
            except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
                with self._cond:
                    self._reading, self._error, self._exhausted = False, e, True
                    self._cond.notify_all()
                return
            with self._cond:
                self._reading = False
                if job is None:
                    self._exhausted = True
                else:
                    self._buffer.append(job)
                self._cond.notify_all()
                if job is None:
                    return

    def ask(self, n: int) -> None:
        """Hold ``n`` jobs read ahead (the idle actors)."""
        with self._cond:
            self._want = n
            self._cond.notify_all()

    def take(self) -> Job | None:
        """The next job read, if one is (None: none yet, or the stream is over); the
        stream's error once the jobs read before it are taken."""
        with self._cond:
            if self._buffer:
                self._want = max(0, self._want - 1)
                return self._buffer.popleft()
            self._raise()
            return None

    def served(self) -> None:
        """An idle actor was given a re-queued job: one job fewer to read for it."""
        with self._cond:
            self._want = max(0, self._want - 1)

    def over(self) -> bool:
        """Every job read and taken (the stream's error raised here)."""
        with self._cond:
            self._raise()
            return self._exhausted and not self._buffer

    def reading(self) -> bool:
        """Jobs are asked for that have not arrived yet."""
        with self._cond:
            return not self._exhausted and len(self._buffer) < self._want

    def wait(self, timeout: float) -> None:
        """Until a job arrives, the stream ends or fails, or ``timeout`` s."""
        with self._cond:
            if not self._buffer and not self._exhausted:
                self._cond.wait(timeout)

    def rest(self) -> Iterator[Job]:
        """Every job not taken, the stream read to its end (no actor left to run them)."""
        while True:
            with self._cond:
                self._want = sys.maxsize
                self._cond.notify_all()
                while not self._buffer and not self._exhausted:
                    self._cond.wait()
                if not self._buffer:
                    self._raise()
                    return
                job = self._buffer.popleft()
            yield job

    def stop(self, wait: bool = True) -> None:
        """No more reading; the thread ends once a ``next()`` it is inside returns
        (``wait``: joined, so nothing reads the stream after the runner's ``run``)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if wait:
            self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def _read_cubin(path: Path, key: str) -> tuple[bytes, str]:
    """The bytes of a job's cubin and the sha256 its compile recorded: checked by the
    artifact cache where the cubin is an entry of one (``<cache>/<k[:2]>/<k>/kernel.cubin``,
    as every pipeline job's is); a cubin elsewhere (a hand-written fixture) travels with
    the sha256 of its bytes as read here."""
    entry = path.parent
    if path.name == "kernel.cubin" and entry.name == key and (entry / "build.json").exists():
        cache = ArtifactCache(entry.parent.parent)
        data = cache.cubin(key)  # raises CacheIntegrityError (and quarantines) if broken
        record = cache.get(key)
        assert record is not None
        return data, record.cubin_sha256
    data = path.read_bytes()
    return data, sha256_hex(data)


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}".strip()
