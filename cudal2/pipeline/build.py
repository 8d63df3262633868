"""The build pipeline: manifest -> proposals -> cubins -> measurements -> selection -> wheel.

Measuring goes through a runner (``cudal2.verify.runner.Runner``): worker processes
on the local GPU, or, on a machine without one, a replay of the build's own database.
It is one loop either way: propose, compile (or, for a runner that needs no cubins,
render for the artifact keys), measure what has no record, profile, observe; then
autotune cuBLASLt, select, memcheck the winners (``pipeline.gate``: no kernel ships
without a clean compute-sanitizer check on record), and package.

Each stage resumes from what is on disk: compiled kernels come from the artifact
cache, measurements from the append-only database (reused per GPU model, target,
artifact, toolchain and timing mode), so a killed build re-run repeats no finished work.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from cudal2.database import Contents, DatabaseError, MeasurementDB, latest
from cudal2.generator.compile import (
    BASE_FLAGS,
    ArtifactCache,
    arch_flags,
    artifact_key_of,
    build_all,
    checked_cubin,
    checked_cubin_path,
    nvcc_version,
)
from cudal2.generator.render import IllegalDesignError, symbol
from cudal2.generator.space import launch_recipe
from cudal2.hardware import datasheet
from cudal2.manifest import Manifest
from cudal2.packaging.native_build import NativeBuild, build_native
from cudal2.packaging.runtime.table import DispatchTable
from cudal2.packaging.wheel import package_name, write_wheel
from cudal2.pipeline.compiling import Proposed, RoundStream
from cudal2.pipeline.dispatch import build_table
from cudal2.pipeline.gate import SanitizerGate, ledger_of, shipped_kernels
from cudal2.pipeline.profiling import lagged_history, profile_round, unprofiled
from cudal2.pipeline.progress import progress
from cudal2.pipeline.results import (
    compile_failure,
    kernel_job,
    measurement_from,
    vendor_measurement,
    vendor_toolchain,
)
from cudal2.pipeline.runners import make_runner
from cudal2.pipeline.runoff import Outcome, run_off
from cudal2.pipeline.select import Selection
from cudal2.pipeline.stages import StageClock, StageTimes
from cudal2.policy import Proposer, make_proposer
from cudal2.records import (
    BuildResult,
    GpuInfo,
    Job,
    JobKind,
    JobResult,
    KernelDesign,
    Measurement,
    SanitizerCheck,
    Status,
    Target,
    TimingConfig,
)
from cudal2.verdicts import SanitizerLedger
from cudal2.verify.gpu import gpu_models, gpu_names
from cudal2.verify.profile import quantities

if TYPE_CHECKING:
    from cudal2.verify.runner import Runner


# The log line carrying the build's stage table as JSON (``StageTimes.as_json``), one line
# for a script to cut out of a time-stamped log.
STAGES_LINE = "build stages as JSON: "


class BuildError(RuntimeError):
    """The build cannot go on; the message says why and what to do."""


class NoRecordsError(BuildError):
    """No GPU here and no recorded measurement of any of the manifest's targets (a new
    shape): the CLI's distinct exit status 3, so a CI can route the build to a GPU."""


@dataclass
class BuildReport:
    wheel: Path
    table: DispatchTable
    selections: list[Selection]
    missing: list[Target]
    measured: int = 0
    reused: int = 0
    compiled: int = 0
    unmeasured: int = 0  # jobs the runner had no answer for (a replay without a record)
    failures: dict[str, int] = field(default_factory=dict)
    waiting: int = 0  # selected kernels without a clean sanitizer check (not shipped)
    skipped: int = 0  # database lines not believed (unreadable, malformed, lying)
    quarantined: list[Path] = field(default_factory=list)  # broken cache entries moved aside
    native: NativeBuild | None = None  # the native launcher shipped (None: a pure wheel)
    stages: StageTimes | None = None  # where the build's seconds went (``pipeline.stages``)


def shippable() -> Callable[[Measurement], bool]:
    """Whether a kernel measurement's artifact can be built here: its design renders
    and compiles to the measured artifact key (source, nvcc version, flags). Whether
    it may ship after compute-sanitizer is the gate's (``pipeline.gate``)."""
    key_cache: dict[str, str] = {}

    def usable(x: Measurement) -> bool:
        if x.design is None:
            return False
        if x.design_key not in key_cache:
            try:
                key_cache[x.design_key] = artifact_key_of(x.design)
            except IllegalDesignError:  # recorded under older legality rules
                key_cache[x.design_key] = ""
        return key_cache[x.design_key] == x.artifact_key

    return usable


def table_from_measurements(
    history: Sequence[Measurement],
    mode: str,
    cache: ArtifactCache,
    name: str,
    checks: Sequence[SanitizerCheck] = (),
    targets: Iterable[Target] | None = None,
) -> tuple[DispatchTable, dict[str, bytes]]:
    """The dispatch table a build without a GPU would make from these measurements and
    sanitizer ``checks`` (a database's ``Contents``), for ``targets`` (None: every
    target they hold; winners compiled into ``cache``): what ``cudal2-bench --kernels``
    runs from a database or a manifest."""
    history = believable(latest(history))
    targets = sorted(set(targets) if targets is not None else {x.target for x in history})
    gate = SanitizerGate(None, ledger_of(checks, history))
    selections, _ = gate.select(targets, history, mode, shippable())
    winners = [s.winner.design for s in selections if s.winner and s.winner.design]
    build_all(winners, cache)
    return build_table(
        name=name,
        version="0",
        package=package_name(name),
        manifest_sha256="",
        selections=selections,
        cubin_of=shipped_cubins(selections, cache),
    )


def believable(history: Sequence[Measurement]) -> list[Measurement]:
    """The measurements whose GPU model has a datasheet (``cudal2.hardware``): only
    their times could be checked against the physical floor when they were read, so
    only they are selected from (another model's targets fall back)."""
    known: dict[str, bool] = {}
    for x in history:
        if x.gpu.name not in known:
            try:
                datasheet(x.gpu.name)
                known[x.gpu.name] = True
            except ValueError:
                known[x.gpu.name] = False
    return [x for x in history if known[x.gpu.name]]


def shipped_cubins(selections: Sequence[Selection], cache: ArtifactCache) -> Callable[[str], bytes]:
    """``build_table``'s ``cubin_of``: a winner's cubin by its measured artifact key, its
    bytes checked against the sha256 its compile recorded (a broken cache entry is
    quarantined and compiled again), so the wheel never gets bytes nobody checked."""
    designs = {w.artifact_key: w.design for w in shipped_kernels(selections) if w.design}
    return lambda key: checked_cubin(designs[key], cache, key)


def rendered(design: KernelDesign) -> BuildResult:
    """What compiling ``design`` here would be known by, without compiling it: its
    artifact key (rendered source, nvcc version, flags) and symbol. For a runner that
    needs no cubins (a replay), which answers by artifact key."""
    return BuildResult(
        design_key=design.key,
        artifact_key=artifact_key_of(design),
        ok=True,
        symbol=symbol(design),
        nvcc_version=nvcc_version(),
        flags=BASE_FLAGS + arch_flags(design.arch),
    )


class Build:
    """One build of a manifest. ``runner``: where jobs are measured (default: worker
    processes on CUDA device ``device`` where there is a GPU and ``measure``, else a
    replay of the build's own database). ``proposer``: the search strategy (default:
    the manifest's, made for the measuring GPU)."""

    def __init__(
        self,
        manifest: Manifest,
        db_path: Path,
        cache: ArtifactCache,
        out_dir: Path,
        *,
        remeasure: bool = False,
        measure: bool = True,
        jobs: int | None = None,
        device: int = 0,
        runner: Runner | None = None,
        proposer: Proposer | None = None,
        native: bool = True,
        log: TextIO | None = None,  # None: sys.stderr as it is when the build is made
        clock: StageClock | None = None,  # where the stages' seconds are counted
        stages_json: Path | None = None,  # where the stage table is written as JSON
    ):
        self.manifest = manifest
        self.db = MeasurementDB(db_path, manifest.reuse)  # and the databases it reuses
        self.cache = cache
        self.out_dir = out_dir
        self.remeasure = remeasure
        self.measure = measure
        self.jobs = jobs
        self.device = device
        self.runner = runner
        self.proposer = proposer
        self.native = native  # build the native launcher into the wheel (where it can be)
        # sys.stderr as it is now, not at import (a test's capture, a redirected CLI)
        self.log = log if log is not None else sys.stderr
        self.counts = Counter(measured=0, reused=0, compiled=0, unmeasured=0, appended=0)
        self.failures: dict[str, int] = {}
        self.gate = SanitizerGate(self.db, SanitizerLedger(), self.say)
        self.skipped = 0
        self._live = True  # the runner runs jobs now (not a replay of this database)
        self.proposer_name = ""  # the measuring loop's proposer, as its records name it
        # The wall counts from here: a CLI's imports are before it (docs/measuring.md).
        self.clock = clock if clock is not None else StageClock()
        self.stages_json = stages_json
        self._spent = False  # the GPU-time budget ran out
        self.runoffs: list[Outcome] = []  # what this build's run-offs found (``_run_off``)

    def say(self, msg: str) -> None:
        print(msg, file=self.log, flush=True)

    def _append(self, records: Iterable[Measurement]) -> None:
        records = list(records)
        if not self._live:
            # A replay of this very database answers from its records: writing its answers
            # back would only copy them (and a shipped ``.jsonl.gz`` cannot be appended to).
            return
        self.db.append(records)  # at once: a killed build keeps what it measured
        self.counts["appended"] += len(records)

    def _failed(self, status: str) -> None:
        self.failures[status] = self.failures.get(status, 0) + 1

    def _cubin(self, runner: Runner, design: KernelDesign | None, artifact_key: str) -> str:
        """Where a job's cubin lies: checked against the sha256 its compile recorded
        (a broken entry is quarantined and compiled again) just before the job is made."""
        if not runner.needs_cubins:
            return ""
        assert design is not None
        return str(checked_cubin_path(design, self.cache, artifact_key))

    def _answers(
        self,
        answers: Iterator[JobResult],
        bar: Any,
        unit: str,
        started: float,
        unrecorded: list[Job] | None = None,
        between: Callable[[], None] | None = None,
    ) -> Iterable[JobResult]:
        """The runner's ``answers`` until the GPU-time budget is spent (checked before
        each job starts: the runner runs the next job only when asked for it), each
        counted on ``bar``. Jobs it has no answer for go to ``unrecorded``. ``between``:
        called before each answer is awaited, and after the last."""
        budget = self.manifest.search.gpu_budget_s
        while True:
            if between is not None:
                between()
            if time.monotonic() - started > budget:
                left = bar.total - bar.n
                self.say(
                    f"GPU-time budget of {budget:.0f} s spent: {left} {unit}s left "
                    "unmeasured (re-run to continue)"
                )
                self._spent = True
                return
            res = next(answers, None)
            if res is None:
                if between is not None:
                    between()
                return
            with self.clock.stage("record"):
                bar.update(1)
            if not res.recorded:  # unmeasured: no failure, no time, no record
                self.counts["unmeasured"] += 1
                if unrecorded is not None:
                    unrecorded.append(res.job)
                continue
            yield res

    def _timing(self) -> TimingConfig:
        """How this build's jobs time (the manifest's mode and seed)."""
        return TimingConfig(mode=self.manifest.timing_mode, seed=self.manifest.search.seed)

    def _run(self, runner: Runner, jobs: Iterable[Job], stage: str) -> Iterator[JobResult]:
        """The runner's answers to ``jobs``, the wait for each counted as ``stage``."""
        return self.clock.timed(runner.run(jobs), stage)

    # -- the runner's start, in the background -------------------------------------------
    def _start(self, runner: Runner) -> tuple[Future[GpuInfo], tuple[str, str] | None]:
        """``runner.start()`` in a thread of its own (worker spawn, CUDA init), and the
        GPU model (name, arch) it will report where nvidia-smi can say so before it
        returns (a runner on this host's GPU), so the proposer loads and the first round
        is proposed and compiled meanwhile; None: wait for the start."""

        def start() -> GpuInfo:
            with self.clock.stage("runner start"):
                gpu = runner.start()
            # While the first cubins compile, the workers may ready the targets (their
            # trials, references, timing sets, torch's graph): a hint, never a wait.
            prepare = getattr(runner, "prepare", None)
            if prepare is not None:
                prepare([t for t in self.manifest.targets if t.arch == gpu.arch], self._timing())
            return gpu

        pool = ThreadPoolExecutor(1, thread_name_prefix="runner-start")
        started = pool.submit(start)
        pool.shutdown(wait=False)
        return started, self._expected_gpu(runner)

    def _expected_gpu(self, runner: Runner) -> tuple[str, str] | None:
        """The (name, arch) nvidia-smi gives for the GPU ``runner.start()`` will return,
        before it starts: a ``LocalRunner``'s ``device``, or the first of a
        ``HostRunner``'s ``devices`` (its start returns the first GPU's model; another
        model there is refused, or recorded as the first's). None where that cannot be
        said (a replay, a Ray cluster, GPU UUIDs or MIG instances): wait for the start."""

        def _ordinal(x: object) -> bool:
            return isinstance(x, int) and not isinstance(x, bool) and x >= 0

        if not runner.needs_cubins:  # a replay: its start is instant
            return None
        device = getattr(runner, "device", None)  # one GPU of this host (LocalRunner)
        if not _ordinal(device):
            devices = getattr(runner, "devices", None)  # several (HostRunner)
            if not (isinstance(devices, Sequence) and devices and _ordinal(devices[0])):
                return None  # not GPUs of this host (a cluster): ask the runner
            device = devices[0]
        assert isinstance(device, int)
        models = gpu_models()
        # nvidia-smi numbers every GPU of the host; CUDA only the visible ones.
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            ids = [v.strip() for v in visible.split(",") if v.strip()]
            if device >= len(ids) or not ids[device].isdigit():
                return None  # GPU UUIDs or MIG instances: ask the runner
            device = int(ids[device])
        return models[device] if 0 <= device < len(models) else None

    def _started(
        self, runner: Runner, started: Future[GpuInfo], expected: tuple[str, str] | None
    ) -> GpuInfo:
        """The runner's GPU once it has started; a GPU other than the one proposed for
        is a ``BuildError`` (the proposals were made for the wrong model)."""
        with self.clock.stage("wait for runner"):
            gpu = started.result()
        if expected is not None and (gpu.name, gpu.arch) != expected:
            # the setting that chose the GPU: a host runner's devices, a local one's --device
            choose = "[runner] devices" if hasattr(runner, "devices") else "--device"
            raise BuildError(
                f"{runner.name} measures on {gpu.name} ({gpu.arch}), but nvidia-smi named "
                f"{expected[0]} ({expected[1]}) for it, which the proposals were made for: "
                f"set CUDA_VISIBLE_DEVICES to plain GPU indices, or choose the GPU with {choose}"
            )
        return gpu

    # -- measuring (through the runner) ------------------------------------------------
    def _measure(
        self,
        runner: Runner,
        started_gpu: Future[GpuInfo],
        expected: tuple[str, str] | None,
        history: list[Measurement],
    ) -> GpuInfo:
        """The measuring loop; returns the runner's GPU (started by ``_start``)."""
        m = self.manifest
        timing = self._timing()
        gpu: GpuInfo | None = None

        def ready() -> GpuInfo:
            nonlocal gpu
            if gpu is None:
                gpu = self._started(runner, started_gpu, expected)
                self.say(
                    f"measuring with {runner.name}: {gpu.name} ({gpu.arch}, driver "
                    f"{gpu.driver}, {gpu.sm_count} SMs)"
                )
            return gpu

        # The GPU model the proposals are for: nvidia-smi's answer while the runner
        # starts, else the runner's once started.
        name, arch = expected if expected is not None else (ready().name, ready().arch)
        # Proposals come from what the runner can answer (a replay: the recorded designs;
        # the GPU: the legal space), so a replayed build searches its records.
        proposer = self.proposer or make_proposer(
            m.search.proposer,
            m.search.seed,
            m.search.families,
            gpu=name,
            updates=m.search.policy_updates,
            space=runner.designs,
            pdl=m.search.pdl,
            room=m.search.room,
            knobs=m.search.knobs,
            trial=m.search.trial,
        )
        self.proposer_name = proposer.name
        describe = getattr(proposer, "describe", None)
        self.say(f"proposer: {describe() if describe else proposer.name}")
        targets = [t for t in m.targets if t.arch == arch]
        load = getattr(proposer, "load", None)
        if load is not None:
            with self.clock.stage("proposer load"):
                load(targets)
        skipped = len(m.targets) - len(targets)
        if skipped:
            self.say(f"{skipped} targets are for other archs than {arch}: not measured here")
        # A job whose reuse key has a record is not run again: the record stands for it.
        prior = {} if self.remeasure else {x.reuse_key: x for x in history}
        # Each round's records (in proposal order), and as profiled (None while its ncu
        # run goes on in the background): what later rounds' proposals read of them is
        # fixed by ``search.profile_lag`` (``pipeline.profiling.lagged_history``).
        measured: list[list[Measurement]] = []
        profiled: list[list[Measurement] | None] = []
        lag = m.search.profile_lag
        # The ncu run of the round before, in the background (lag 1): (round, its answer)
        pending: tuple[int, Future[list[Measurement]]] | None = None

        def profiles_in() -> None:
            """Wait for the background ncu run: the GPU must not measure beside it."""
            nonlocal pending
            if pending is not None:
                j, done = pending
                pending = None
                with self.clock.stage("wait for profile"):
                    profiled[j] = done.result()

        # Designs the runner had no answer for, per target: proposed again, they would
        # crowd out new ones (a deterministic proposer would propose them every round).
        unanswered: dict[Target, set[str]] = {}
        # A fused-epilogue target's proposer also sees its plain GEMM's records (the
        # database's and this build's): the fastest of them, fused, open its rounds
        # (policy.fused).
        plain_records: dict[Target, list[Measurement]] = {}
        for x in history:
            plain_records.setdefault(x.target, []).append(x)
        budget_from: float | None = None
        try:
            for rnd in range(m.search.rounds):
                label = f"round {rnd + 1}/{m.search.rounds}"
                # fixed before the round's proposing starts: never what ncu adds meanwhile
                this_build = lagged_history(measured, profiled, lag)

                def propose(t: Target, seen: list[Measurement] = this_build) -> list[KernelDesign]:
                    # in the stream's thread: reads only what earlier rounds left
                    with self.clock.stage("propose"):
                        return _propose(
                            proposer,
                            t,
                            (plain_records.get(t.plain, []) if t.epilogue != "none" else []) + seen,
                            m.search.candidates,
                            unanswered.get(t, set()),
                        )

                stream = self._stream(runner, targets, propose, label)
                try:
                    gpu = ready()
                    profiles_in()  # proposing and compiling go on meanwhile
                    if budget_from is None:  # the budget is the GPU's time: from its start
                        budget_from = time.monotonic()
                    proposals, round_ms = self._measure_round(
                        runner,
                        gpu,
                        proposer.name,
                        len(targets),
                        stream,
                        timing,
                        prior,
                        label,
                        budget_from,
                        unanswered,
                    )
                finally:
                    stream.close()  # proposing stops; a compile still running is waited for
                # Every round's results in one order, whichever job finished first: the
                # proposer's update is deterministic only for the same results in the same
                # order.
                round_ms = in_proposal_order(round_ms, proposals)
                measured.append(round_ms)
                profiled.append(round_ms)
                if m.search.profile_top > 0 and m.search.profiled(rnd):
                    if lag:  # beside the policy update and the next round's proposing
                        pending = (rnd, self._profile_later(runner, gpu, round_ms))
                        profiled[rnd] = None
                    else:
                        with self.clock.stage("profile"):
                            profiled[rnd] = self._profile(
                                runner, gpu, round_ms, m.search.profile_top
                            )
                elif m.search.profile_top > 0:
                    self.say(f"{label}: not profiled ({self._unread(rnd)})")
                # The update reads the round as the next round's proposals will.
                with self.clock.stage("policy update"):
                    read = profiled[rnd] if not lag else [unprofiled(x) for x in round_ms]
                    assert read is not None
                    learned = proposer.observe(read)
                if learned:
                    self.say(learned)
            profiles_in()  # before cuBLASLt autotuning takes the GPU
        finally:
            if pending is not None:  # the build failed first: no ncu run left running
                with self.clock.stage("wait for profile"):
                    pending[1].exception()
        gpu = ready()
        if m.search.cublaslt:
            # cuBLASLt autotunes plain GEMMs only: a fused epilogue's baseline is torch's
            # unfused op, measured beside every candidate.
            plain = [t for t in targets if t.epilogue == "none"]
            started = budget_from if budget_from is not None else time.monotonic()
            self._autotune_vendor(runner, gpu, plain, history, timing, started)
        return gpu

    def _measure_round(
        self,
        runner: Runner,
        gpu: GpuInfo,
        proposer_name: str,
        targets: int,
        stream: RoundStream,
        timing: TimingConfig,
        prior: dict[tuple, Measurement],
        label: str,
        started: float,
        unanswered: dict[Target, set[str]],
    ) -> tuple[dict[Target, list[KernelDesign]], list[Measurement]]:
        """One round measured: each candidate's job handed to the runner as soon as its
        cubin is compiled (``stream``: each target's proposals, then builds as they
        finish), its answer recorded at once. Returns the round's proposals (by target,
        in manifest order) and its records (measured, reused, compile failures) in the
        order they came."""
        proposals: dict[Target, list[KernelDesign]] = {}
        uses: dict[str, list[tuple[Target, KernelDesign]]] = {}
        made: set[tuple[Target, str]] = set()
        built: dict[str, BuildResult] = {}
        # Records made while the runner pulls jobs (perhaps from a thread of its own):
        # the pipeline, the database's one writer, records them between answers.
        settled: deque[tuple[Measurement, bool]] = deque()

        def jobs() -> Iterator[Job]:
            for b in self.clock.timed(stream, "wait for cubins"):
                if isinstance(b, Proposed):
                    proposals[b.target] = list(b.designs)
                    for d in b.designs:
                        uses.setdefault(d.key, []).append((b.target, d))
                    if len(proposals) == targets:  # all proposed: the bar's exact total
                        bar.total = sum(len(ds) for ds in proposals.values())
                    continue
                built[b.design_key] = b
                for t, d in uses.get(b.design_key, []):
                    if (t, d.key) in made:  # a design built once, proposed again since
                        continue
                    made.add((t, d.key))
                    job = kernel_job(t, d, b, timing, "")
                    old = prior.get(job.reuse_key(gpu.name))
                    if old is not None:
                        settled.append((old, False))
                    elif not b.ok:
                        settled.append((compile_failure(job, b, gpu, proposer_name), True))
                    else:  # to be measured: its cubin, checked
                        cubin = self._cubin(runner, d, b.artifact_key)
                        yield dataclasses.replace(job, cubin=cubin)

        round_ms: list[Measurement] = []

        def settle() -> None:
            if not settled:
                return
            with self.clock.stage("record"):
                while settled:
                    rec, new = settled.popleft()
                    bar.update(1)
                    round_ms.append(rec)
                    if new:
                        self._append([rec])
                    else:
                        self.counts["reused"] += 1

        # every target's full round until all are proposed (fewer where a space ran out)
        bar = progress(targets * self.manifest.search.candidates, f"{label}: measure",
                       "candidate", self.log)  # fmt: skip
        unrecorded: list[Job] = []
        todo = jobs()
        answers = self._run(runner, todo, "measure")
        try:
            for res in self._answers(answers, bar, "candidate", started, unrecorded, settle):
                assert res.job.design is not None
                self.clock.measured(res.job_s)  # the measure stage's split (``stages``)
                with self.clock.stage("record"):
                    rec = measurement_from(res, built[res.job.design.key], gpu, proposer_name)
                    self._append([rec])
                    round_ms.append(rec)
                    self.counts["measured"] += 1
                    if rec.status != Status.OK:
                        self._failed(rec.status)
            if not self._spent:
                # A runner that stopped asking for jobs (or was given none: every
                # candidate reused or failed to compile) has left the rest of the stream:
                # the records it makes still count; its jobs were never run.
                for job in todo:
                    unrecorded.append(job)
                    self.counts["unmeasured"] += 1
                settle()
        finally:
            answers.close()
            todo.close()
            bar.close()
        for job in unrecorded:
            if job.design is not None:
                unanswered.setdefault(job.target, set()).add(job.design.key)
        return proposals, round_ms

    def _stream(
        self,
        runner: Runner,
        targets: Sequence[Target],
        propose: Callable[[Target], list[KernelDesign]],
        label: str,
    ) -> RoundStream:
        """A round's proposals and builds as they come (``pipeline.compiling``): the
        targets proposed for in order, each design compiled as soon as it is proposed
        (on every core: ``--jobs`` compiles at a time), in the background from now on.
        The compile stage's seconds are those with any compile running. A runner that
        needs no cubins (the replay) has each design rendered, one at a time: its jobs
        come in proposal order, on every run alike."""
        cores = (self.jobs or os.cpu_count() or 1) if runner.needs_cubins else 1
        bar = progress(len(targets), f"{label}: propose + compile", "target", self.log)

        def compile_one(designs: list[KernelDesign], on_done: Callable[[BuildResult], None]):
            with self.clock.shared("compile"):
                self._compile_designs(runner, designs, f"{label}: compile", on_done)

        return RoundStream(
            targets,
            propose,
            compile_one,
            workers=cores,
            bar=bar,
            on_end=lambda n: self.counts.update(compiled=n),
        )

    def _compile_designs(
        self,
        runner: Runner,
        designs: list[KernelDesign],
        desc: str,
        on_done: Callable[[BuildResult], None],
    ) -> None:
        """Each design's build, handed to ``on_done`` as it finishes: compiled on all
        cores (``runner.compile`` where the runner has one, else ``build_all``) where
        the runner needs cubins, else only rendered (for the artifact keys)."""
        if not runner.needs_cubins:
            for d in designs:
                on_done(rendered(d))
            return
        compile_all = getattr(runner, "compile", None) or build_all
        compile_all(designs, self.cache, jobs=self.jobs, on_done=on_done)

    def _autotune_vendor(
        self,
        runner: Runner,
        gpu: GpuInfo,
        targets: Sequence[Target],
        history: Sequence[Measurement],
        timing: TimingConfig,
        started: float,
    ) -> None:
        """cuBLASLt autotuning of every target without a record of this GPU model,
        cuBLASLt version and timing mode: its fastest correct algorithm becomes a
        candidate of the selection like any kernel."""
        version = runner.cublaslt_version
        if version is None:
            self.say(
                f"cuBLASLt is not autotuned: {runner.name} cannot (a GPU worker needs "
                "nvmath-python: pip install nvmath-python; or set search.cublaslt = false)"
            )
            return
        jobs = [Job(JobKind.AUTOTUNE, t, timing, vendor_toolchain(version)) for t in targets]
        done = set() if self.remeasure else {x.tuning_key for x in history if x.is_vendor}
        todo = [j for j in jobs if j.reuse_key(gpu.name) not in done]
        self.counts["reused"] += len(jobs) - len(todo)
        bar = progress(len(todo), f"cuBLASLt {version} autotune", "target", self.log)
        answers = self._run(runner, todo, "autotune")
        try:
            self._vendor_records(self._answers(answers, bar, "target", started), gpu)
        finally:
            answers.close()
            bar.close()

    def _vendor_records(self, answers: Iterable[JobResult], gpu: GpuInfo) -> None:
        for res in answers:
            if not res.vendor:  # the job failed before any algorithm was tried
                self._failed("cublaslt")
                self.say(f"cuBLASLt autotuning of {res.job.target.label} failed: {res.error}")
                continue
            rec = vendor_measurement(res, gpu)
            self._append([rec])
            self.counts["measured"] += 1
            if rec.status != Status.OK:
                self._failed(rec.status)

    def _profile(
        self, runner: Runner, gpu: GpuInfo, ms: list[Measurement], top: int
    ) -> list[Measurement]:
        """The round's Nsight Compute feedback (``pipeline.profiling.profile_round``):
        the quantities of the manifest's ``search.profile_metrics``."""
        return profile_round(
            runner,
            gpu,
            ms,
            top,
            lambda x: self._cubin(runner, x.design, x.artifact_key),
            self._append,
            self.say,
            quantities(self.manifest.search.profile_metrics),
        )

    def _profile_later(
        self, runner: Runner, gpu: GpuInfo, ms: list[Measurement]
    ) -> Future[list[Measurement]]:
        """``_profile`` in a thread of its own (``search.profile_lag`` 1), its seconds the
        "profile" stage's; the caller waits for it before the GPU measures again."""

        def run() -> list[Measurement]:
            with self.clock.stage("profile"):
                return self._profile(runner, gpu, ms, self.manifest.search.profile_top)

        self.clock.background("profile")  # the table says so
        pool = ThreadPoolExecutor(1, thread_name_prefix="profile")
        done = pool.submit(run)
        pool.shutdown(wait=False)
        return done

    def _unread(self, rnd: int) -> str:
        """Why round ``rnd`` is not profiled: no proposal would read its profiles."""
        s = self.manifest.search
        if rnd == s.rounds - 1:
            why = "the last round: nothing is proposed after it"
        else:
            why = (
                f"with search.profile_lag = {s.profile_lag}, round {rnd + 2 + s.profile_lag} "
                "would be the first to read its profiles, and there is none"
            )
        return f"{why}; search.profile_last_round = true profiles it"

    def _cubins(self, runner: Runner, ms: Sequence[Measurement]) -> dict[str, str]:
        """Each measured kernel's cubin path for ``runner`` (compiled first where it
        needs cubins: a winner recorded by an earlier build may not be in the cache)."""
        if runner.needs_cubins:
            build_all([m.design for m in ms if m.design], self.cache)
        return {m.artifact_key: self._cubin(runner, m.design, m.artifact_key) for m in ms}

    def _compile(self, designs: Sequence[KernelDesign], desc: str) -> dict[str, BuildResult]:
        unique = {d.key: d for d in designs}
        bar = progress(len(unique), desc, "kernel", self.log)
        results = build_all(unique.values(), self.cache, self.jobs, on_done=lambda r: bar.update(1))
        bar.close()
        self.counts["compiled"] += len(results)
        return results

    def _default_runner(self, records: list[Measurement]) -> Runner:
        """The manifest's runner (``[runner]``, ``pipeline.runners``: worker processes on
        the local GPU by default, or on every GPU of the host) where there is a GPU, or
        a Ray cluster's, which needs none here; else (or with ``measure`` off) a replay
        of this build's database, so a build without a GPU runs the same loop."""
        settings = self.manifest.runner
        if self.measure and (settings.kind == "ray" or gpu_names()):
            if self.db.path.suffix == ".gz":  # refused now, not at its first append
                raise DatabaseError(
                    f"{self.db.path}: a gzipped database is read-only and this build "
                    f"measures (a GPU is here): measure into a plain copy (zcat "
                    f"{self.db.path} > {self.db.path.stem}; --measurements "
                    f"{self.db.path.stem}), or package what it holds with --no-measure"
                )
            return make_runner(settings, self.device, self.say)
        from cudal2.verify.replay import ReplayRunner

        targets = set(self.manifest.targets)
        relevant = [x for x in records if x.target in targets]
        if not relevant:
            raise NoRecordsError(
                f"no GPU here and no recorded measurements for this manifest's targets in "
                f"{self.db.path}: run cudal2-build on a machine with an NVIDIA GPU, or pass "
                f"--measurements FILE recorded on one, or split the build (docs/ci.md)"
            )
        also = f" and {len(self.db.reuse)} reused databases" if self.db.reuse else ""
        self.say(
            f"no GPU here: replaying {len(relevant)} recorded measurements in {self.db.path}{also}"
        )
        self._live = False  # it can answer nothing the database does not hold
        if self.remeasure:  # replaying the database into itself would only copy records
            self.say("--remeasure needs a GPU: ignored")
            self.remeasure = False
        # The GPU model with the most records of the manifest's targets stands for the
        # measuring GPU; the selection below still reads every model's records.
        counts = Counter(x.gpu.name for x in relevant)
        gpu = min(counts, key=lambda g: (-counts[g], g))
        return ReplayRunner(records, gpu, name=str(self.db.path))

    # -- selection and packaging (any machine) --------------------------------------
    def _load(self) -> Contents:
        contents = self.db.load()
        self.skipped = len(contents.skipped)
        if contents.skipped:
            self.say(
                f"{len(contents.skipped)} unreadable records skipped in {self.db.path} "
                "(each named in a warning above)"
            )
        self.gate = SanitizerGate(self.db, SanitizerLedger(contents.checks), self.say)
        return contents

    def _select(
        self, runner: Runner | None, gpu: GpuInfo, history: Sequence[Measurement], recheck: bool
    ) -> tuple[list[Selection], list[Target]]:
        """The selection through the sanitizer gate; would-be winners are checked on
        ``runner`` (None: nowhere, they wait)."""
        believed = believable(history)
        unknown = sorted({x.gpu.name for x in history} - {x.gpu.name for x in believed})
        if unknown:
            self.say(
                f"no datasheet for {', '.join(unknown)} in cudal2/hardware.py: their times "
                "cannot be checked against the physical floor, so nothing measured on them "
                "is selected (their targets fall back)"
            )
        return self.gate.select(
            self.manifest.targets,
            believed,
            self.manifest.timing_mode,
            shippable(),
            runner=runner,
            gpu=gpu,
            cubins=None if runner is None else lambda ms: self._cubins(runner, ms),
            recheck=recheck,
            host_saving_us=self.manifest.eager_host_saving_us,
        )

    def measure_and_select(self) -> tuple[list[Selection], list[Target]]:
        """Everything up to the table: the measuring loop through the runner, then the
        selection, its winners memchecked (reselecting past a failure). Returns the
        selections and the targets without a timed measurement."""
        with self.clock.stage("start-up"):
            contents = self._load()
            history = latest(contents.measurements)
            runner = self.runner or self._default_runner(list(contents.measurements))
        with runner:
            started, expected = self._start(runner)
            try:
                gpu = self._measure(runner, started, expected, history)
            finally:
                if not started.done():  # the build failed first: no start left running
                    with self.clock.stage("wait for runner"):
                        started.exception()
            with self.clock.stage("select"):
                if self.counts["appended"]:
                    history = latest(self.db.load(warn=False).measurements)
            if self._live and self.manifest.search.cublaslt:
                with self.clock.stage("measure"):  # the run-offs measure
                    history = self._run_off(runner, gpu, history)
            with self.clock.stage("select"):
                checker = _Memchecking(runner, self.clock) if self._live else None
                selections, missing = self._select(checker, gpu, history, recheck=self.remeasure)
        with self.clock.stage("select"):
            self._stale(history)
        return selections, missing

    def _stale(self, history: Sequence[Measurement]) -> None:
        usable = shippable()
        targets = set(self.manifest.targets)  # once, not once per history record
        stale = {
            x.design_key
            for x in history
            if x.status == Status.OK
            and not x.is_vendor
            and x.target in targets
            # failed memcheck: not shipped, and not stale
            and not self.gate.ledger.vetoed(x.artifact_key)
            and not usable(x)
        }
        if stale:
            self.say(
                f"{len(stale)} measured designs no longer build to the measured artifact "
                "(template or nvcc changed): not shipped; re-measure on a GPU"
            )

    def _run_off(
        self, runner: Runner, gpu: GpuInfo, history: list[Measurement]
    ) -> list[Measurement]:
        """The run-offs of the contested targets (``pipeline.runoff``) on ``runner``;
        returns the history with their records. Kernels the gate has vetoed run no
        run-off (they cannot ship)."""
        usable = shippable()

        def contender(x: Measurement) -> bool:
            return usable(x) and not self.gate.ledger.vetoed(x.artifact_key)

        before = self.counts["appended"]
        _, self.runoffs = run_off(
            runner,
            gpu,
            believable(history),
            self.manifest.targets,
            self.manifest.timing_mode,
            contender,
            self._timing(),
            lambda ms: self._cubins(runner, ms),
            self._append,
            self.say,
        )
        if self.counts["appended"] == before:
            return history
        return latest(self.db.load(warn=False).measurements)

    def runoff(self, runner: Runner, recheck: bool = False) -> tuple[list[Selection], list[Target]]:
        """No measuring but the run-offs: the contested targets of the database run
        off on ``runner`` (a GPU; started here, closed by the caller), then the
        selection through the gate, its would-be winners memchecked there."""
        history = latest(self._load().measurements)
        gpu = runner.start()
        history = self._run_off(runner, gpu, history)
        return self._select(runner, gpu, history, recheck=recheck)

    def memcheck(
        self, runner: Runner, recheck: bool = False
    ) -> tuple[list[Selection], list[Target]]:
        """No measuring: the selection a build would make from the database, its
        would-be winners memchecked on ``runner`` (a GPU; started here, closed by the
        caller) and the verdicts recorded (``cudal2.pipeline.memcheck``)."""
        history = latest(self._load().measurements)
        gpu = runner.start()
        return self._select(runner, gpu, history, recheck=recheck)

    def _native(self) -> NativeBuild | None:
        """The native launcher the wheel ships (built once per build, from the cache
        where it can be), or None for a pure wheel (``--no-native``, or it cannot be
        built here: the log line says why)."""
        if not self.native:
            self.say("native launcher: not built (--no-native); the wheel is pure Python")
            return None
        built = build_native(self.cache, log=self.say)
        return built if isinstance(built, NativeBuild) else None

    def run(self) -> BuildReport:
        """The whole build: measure, select, compile the winners, write the wheel."""
        selections, missing = self.measure_and_select()
        with self.clock.stage("package"):
            winners = [w.design for w in shipped_kernels(selections) if w.design]
            self._compile(winners, "compile winners")
            m = self.manifest
            table, cubins = build_table(
                name=m.name,
                version=m.version,
                package=m.package,
                manifest_sha256=m.sha256,
                selections=selections,
                cubin_of=shipped_cubins(selections, self.cache),
            )
            # Once per build, whatever measured it (a GPU, a replay, --no-measure packaging
            # of a split build): what the wheel ships beside the cubins.
            native = self._native()
            wheel = write_wheel(table, cubins, self.out_dir, native)
        stages = self.clock.times(len(self.manifest.targets))
        self.say(f"where the build's seconds went (busy seconds per stage):\n{stages.table()}")
        self.say(STAGES_LINE + json.dumps(stages.as_json(), separators=(",", ":")))
        if self.stages_json is not None:
            stages.write(self.stages_json)
        return BuildReport(
            wheel=wheel,
            table=table,
            selections=selections,
            missing=missing,
            measured=self.counts["measured"],
            reused=self.counts["reused"],
            compiled=self.counts["compiled"],
            unmeasured=self.counts["unmeasured"],
            failures=self.failures,
            waiting=len(self.gate.waiting),
            skipped=self.skipped,
            quarantined=list(self.cache.quarantined),
            native=native,
            stages=stages,
        )


def _propose(
    proposer: Proposer, t: Target, history: Sequence[Measurement], n: int, skip: set[str]
) -> list[KernelDesign]:
    """``n`` proposals for ``t`` that are not in ``skip`` (asked for that many more), less
    those the runtime could never dispatch ``t`` to (``servable``): fewer candidates for
    such a target, none compiled and measured for nothing."""
    if not skip:
        return [d for d in proposer.propose(t, history, n) if servable(d, t)]
    ds = proposer.propose(t, history, n + len(skip))
    return [d for d in ds if d.key not in skip and servable(d, t)][:n]


def servable(d: KernelDesign, t: Target) -> bool:
    """Whether the runtime may dispatch ``t`` to ``d``: the recipe's ``align`` multiples
    of N and K (fixed per entry; M is the entry's range, checked at each call) divide the
    target's. The TMA store asks N % 8 == 0 (its map of C cannot address the rest: the
    launch is refused, and the runtime falls back there)."""
    align = launch_recipe(d).get("align") or {}
    return all(getattr(t, dim) % int(v) == 0 for dim, v in align.items() if dim in ("n", "k"))


def in_proposal_order(
    ms: Sequence[Measurement], proposals: dict[Target, list[KernelDesign]]
) -> list[Measurement]:
    """A round's records by target (in manifest order: ``proposals``' order) and then
    candidate (in proposal order), whichever was answered first."""
    rank = {
        (t, d.key): (i, j) for i, (t, ds) in enumerate(proposals.items()) for j, d in enumerate(ds)
    }
    last = (len(rank), 0)  # not proposed this round (none should be): after, stably
    return sorted(ms, key=lambda x: rank.get((x.target, x.design_key), last))


class _Memchecking:
    """``runner`` for the sanitizer gate: the wait for each answer counted as the
    "memcheck" stage (the gate runs only sanitizer jobs on it)."""

    def __init__(self, runner: Runner, clock: StageClock):
        self._runner = runner
        self._clock = clock

    def run(self, jobs: Iterable[Job]) -> Iterator[JobResult]:
        return self._clock.timed(self._runner.run(jobs), "memcheck")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)
