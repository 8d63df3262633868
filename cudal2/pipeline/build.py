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
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from cudal2.database import Contents, MeasurementDB, latest
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
from cudal2.hardware import datasheet
from cudal2.manifest import Manifest
from cudal2.packaging.native_build import NativeBuild, build_native
from cudal2.packaging.runtime.table import DispatchTable
from cudal2.packaging.wheel import package_name, write_wheel
from cudal2.pipeline.dispatch import build_table
from cudal2.pipeline.gate import SanitizerGate, ledger_of, shipped_kernels
from cudal2.pipeline.profiling import profile_round
from cudal2.pipeline.progress import progress
from cudal2.pipeline.results import (
    compile_failure,
    kernel_job,
    measurement_from,
    vendor_measurement,
    vendor_toolchain,
)
from cudal2.pipeline.runners import make_runner
from cudal2.pipeline.select import Selection
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
from cudal2.verify.gpu import gpu_names

if TYPE_CHECKING:
    from cudal2.verify.runner import Runner


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
) -> tuple[DispatchTable, dict[str, bytes]]:
    """The dispatch table a build without a GPU would make from these measurements and
    sanitizer ``checks`` (a database's ``Contents``), for every target they hold
    (winners compiled into ``cache``): what ``cudal2-bench --kernels DB`` runs."""
    history = believable(latest(history))
    targets = sorted({x.target for x in history})
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
    ):
        self.manifest = manifest
        self.db = MeasurementDB(db_path)
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
        runner: Runner,
        jobs: Sequence[Job],
        desc: str,
        unit: str,
        started: float,
        unrecorded: list[Job] | None = None,
    ) -> Iterable[JobResult]:
        """The runner's answers to ``jobs`` until the GPU-time budget is spent (checked
        before each job starts: the runner runs the next job only when asked for it).
        Jobs it has no answer for go to ``unrecorded``."""
        budget = self.manifest.search.gpu_budget_s
        bar = progress(len(jobs), desc, unit, self.log)
        answers = iter(runner.run(jobs))
        try:
            while bar.n < len(jobs):
                if time.monotonic() - started > budget:
                    self.say(
                        f"GPU-time budget of {budget:.0f} s spent: {len(jobs) - bar.n} "
                        f"{unit}s left unmeasured (re-run to continue)"
                    )
                    return
                res = next(answers, None)
                if res is None:
                    return
                bar.update(1)
                if not res.recorded:  # unmeasured: no failure, no time, no record
                    self.counts["unmeasured"] += 1
                    if unrecorded is not None:
                        unrecorded.append(res.job)
                    continue
                yield res
        finally:
            bar.close()

    # -- measuring (through the runner) ------------------------------------------------
    def _measure(self, runner: Runner, gpu: GpuInfo, history: list[Measurement]) -> None:
        m = self.manifest
        timing = TimingConfig(mode=m.timing_mode, seed=m.search.seed)
        self.say(
            f"measuring with {runner.name}: {gpu.name} ({gpu.arch}, driver {gpu.driver}, "
            f"{gpu.sm_count} SMs)"
        )
        # Proposals come from what the runner can answer (a replay: the recorded designs;
        # the GPU: the legal space), so a replayed build searches its records.
        proposer = self.proposer or make_proposer(
            m.search.proposer,
            m.search.seed,
            m.search.families,
            gpu=gpu.name,
            updates=m.search.policy_updates,
            space=runner.designs,
            pdl=m.search.pdl,
            room=m.search.room,
        )
        self.proposer_name = proposer.name
        describe = getattr(proposer, "describe", None)
        self.say(f"proposer: {describe() if describe else proposer.name}")
        targets = [t for t in m.targets if t.arch == gpu.arch]
        skipped = len(m.targets) - len(targets)
        if skipped:
            self.say(f"{skipped} targets are for other archs than {gpu.arch}: not measured here")
        # A job whose reuse key has a record is not run again: the record stands for it.
        prior = {} if self.remeasure else {x.reuse_key: x for x in history}
        this_build: list[Measurement] = []
        # Designs the runner had no answer for, per target: proposed again, they would
        # crowd out new ones (a deterministic proposer would propose them every round).
        unanswered: dict[Target, set[str]] = {}
        # A fused-epilogue target's proposer also sees its plain GEMM's records (the
        # database's and this build's): the fastest of them, fused, open its rounds
        # (policy.fused).
        plain_records: dict[Target, list[Measurement]] = {}
        for x in history:
            plain_records.setdefault(x.target, []).append(x)
        started = time.monotonic()
        for rnd in range(m.search.rounds):
            label = f"round {rnd + 1}/{m.search.rounds}"
            proposals = {
                t: _propose(
                    proposer,
                    t,
                    (plain_records.get(t.plain, []) if t.epilogue != "none" else []) + this_build,
                    m.search.candidates,
                    unanswered.get(t, set()),
                )
                for t in targets
            }
            designs = [d for ds in proposals.values() for d in ds]
            builds = self._builds(runner, designs, f"{label}: compile")
            jobs: list[Job] = []
            round_ms: list[Measurement] = []
            for t, ds in proposals.items():
                for d in ds:
                    b = builds[d.key]
                    job = kernel_job(t, d, b, timing, "")
                    old = prior.get(job.reuse_key(gpu.name))
                    if old is not None:
                        round_ms.append(old)
                        self.counts["reused"] += 1
                    elif not b.ok:
                        rec = compile_failure(job, b, gpu, proposer.name)
                        self._append([rec])
                        round_ms.append(rec)
                    else:  # to be measured: its cubin, checked
                        cubin = self._cubin(runner, d, b.artifact_key)
                        jobs.append(dataclasses.replace(job, cubin=cubin))
            unrecorded: list[Job] = []
            desc = f"{label}: measure"
            for res in self._answers(runner, jobs, desc, "candidate", started, unrecorded):
                assert res.job.design is not None
                rec = measurement_from(res, builds[res.job.design.key], gpu, proposer.name)
                self._append([rec])
                round_ms.append(rec)
                self.counts["measured"] += 1
                if rec.status != Status.OK:
                    self._failed(rec.status)
            for job in unrecorded:
                if job.design is not None:
                    unanswered.setdefault(job.target, set()).add(job.design.key)
            round_ms = self._profile(runner, gpu, round_ms, m.search.profile_top)
            this_build.extend(round_ms)
            learned = proposer.observe(round_ms)
            if learned:
                self.say(learned)
        if m.search.cublaslt:
            # cuBLASLt autotunes plain GEMMs only: a fused epilogue's baseline is torch's
            # unfused op, measured beside every candidate.
            plain = [t for t in targets if t.epilogue == "none"]
            self._autotune_vendor(runner, gpu, plain, history, timing, started)

    def _builds(
        self, runner: Runner, designs: Sequence[KernelDesign], desc: str
    ) -> dict[str, BuildResult]:
        """Each design's build: compiled where the runner needs cubins, else rendered."""
        if runner.needs_cubins:
            return self._compile(designs, desc)
        return {d.key: rendered(d) for d in designs}

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
        desc = f"cuBLASLt {version} autotune"
        for res in self._answers(runner, todo, desc, "target", started):
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
        """The round's Nsight Compute feedback (``pipeline.profiling.profile_round``)."""
        return profile_round(
            runner,
            gpu,
            ms,
            top,
            lambda x: self._cubin(runner, x.design, x.artifact_key),
            self._append,
            self.say,
        )

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
        self.say(f"no GPU here: replaying {len(relevant)} recorded measurements in {self.db.path}")
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
        contents = self._load()
        history = latest(contents.measurements)
        runner = self.runner or self._default_runner(list(contents.measurements))
        with runner:
            gpu = runner.start()
            self._measure(runner, gpu, history)
            if self.counts["appended"]:
                history = latest(self.db.load(warn=False).measurements)
            checker = runner if self._live else None
            selections, missing = self._select(checker, gpu, history, recheck=self.remeasure)
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
        return selections, missing

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
        )


def _propose(
    proposer: Proposer, t: Target, history: Sequence[Measurement], n: int, skip: set[str]
) -> list[KernelDesign]:
    """``n`` proposals for ``t`` that are not in ``skip`` (asked for that many more)."""
    if not skip:
        return proposer.propose(t, history, n)
    return [d for d in proposer.propose(t, history, n + len(skip)) if d.key not in skip][:n]
