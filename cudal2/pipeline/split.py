"""A build split across machines: compile on a CPU runner, measure on a GPU runner
without nvcc, package on a CPU runner (docs/ci.md).

A round's proposals depend on the GPU's answers to the rounds before it, so the split
goes one round at a time, the database carrying the answers: ``export_job`` runs the
build's own measuring loop over the database so far (every recorded job is answered
by its record, exactly as a one-machine build reuses it, and the proposer observes
the same rounds) and stops at the first round with jobs no record answers: those,
compiled, are the exported job (``pipeline.job``). Once every round is answered, it
exports the sanitizer checks of the would-be winners that have none (phase
``memcheck``; again after a failed check, for the next would-be winner). When nothing
is left, the database packages into the wheel a one-machine build would make
(``cudal2-build --no-measure --measurements DB``). cuBLASLt autotuning rides along with
the first job of a build (its version is the GPU's).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from cudal2.database import latest
from cudal2.generator.compile import ArtifactCache
from cudal2.hardware import REFERENCE_GPU, datasheet
from cudal2.manifest import Manifest
from cudal2.pipeline.build import Build, BuildError, believable, rendered, shippable
from cudal2.pipeline.gate import check_key
from cudal2.pipeline.job import (
    JOB_FILE,
    KernelJob,
    MeasureJob,
    cubin_name,
    sha256_file,
    write_job,
)
from cudal2.pipeline.results import job_for
from cudal2.policy.pdl import is_pdl, pdl_candidates
from cudal2.policy.room import is_room
from cudal2.records import (
    BuildResult,
    GpuInfo,
    Job,
    JobKind,
    JobResult,
    KernelDesign,
    Measurement,
    Target,
    TimingConfig,
)
from cudal2.verify.profile import quantities

# --dry-run's estimate of GPU time per measured candidate and per cuBLASLt autotuning,
# from the committed H100 builds' record timestamps: 1,024 candidates in 228 s
# (bench/results/h100-online-random.measurements.jsonl.gz), 864 in 169 s and 24
# autotunings in 4 s (h100-llama-policy-build): about 0.2 s each. Worker start-up and
# compute-sanitizer runs are not included.
SECONDS_PER_CANDIDATE = 0.25
SECONDS_PER_AUTOTUNE = 0.25


class _RoundReady(Exception):
    """Raised by the export runner at the first jobs no record answers."""


class ExportRunner:
    """The GPU's stand-in on the exporting machine: it answers nothing, and stops the
    loop at the first kernel jobs it is given (the round to export). ``space``: the
    designs the measuring GPU can answer per target (None: any, as a GPU)."""

    needs_cubins = True
    cublaslt_version = None  # autotuning is the job's (the GPU knows its version)

    def __init__(
        self,
        gpu: GpuInfo,
        space: Callable[[Target], Sequence[KernelDesign] | None] | None = None,
        needs_cubins: bool = True,
    ):
        self.gpu = gpu
        self.space = space
        self.needs_cubins = needs_cubins
        self.name = f"an export for {gpu.name}"
        self.jobs: list[Job] = []

    def start(self) -> GpuInfo:
        return self.gpu

    def designs(self, target: Target) -> Sequence[KernelDesign] | None:
        return None if self.space is None else self.space(target)

    def run(self, jobs: Iterable[Job]) -> Iterator[JobResult]:
        jobs = list(jobs)  # the whole round, to export it
        kernels = [j for j in jobs if j.kind == JobKind.MEASURE]
        if kernels:
            self.jobs = kernels
            raise _RoundReady
        for j in jobs:  # profiles: the GPU profiles its round itself
            yield JobResult.not_recorded(j, "exported")

    def close(self) -> None:
        pass

    def __enter__(self) -> ExportRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class _ExportBuild(Build):
    """The build's loop over the database, writing nothing: records it would append
    (compile failures) are kept for the job; cubins are compiled (``compile``) or only
    rendered (a dry run); no kernel is memchecked here."""

    def __init__(self, *args, compile: bool = True, **kw):
        super().__init__(*args, **kw)
        self.kept: list[Measurement] = []
        self.phase = ""
        self.builds: dict[str, BuildResult] = {}
        self.compile = compile

    def _append(self, records: Iterable[Measurement]) -> None:
        self.kept.extend(records)

    def _compile_designs(self, runner, designs, desc, on_done):  # type: ignore[no-untyped-def]
        self.phase = desc.split(":", 1)[0]
        if self.compile:
            builds = self._compile(designs, desc)
        else:
            builds = {d.key: rendered(d) for d in designs}
        self.builds.update(builds)
        for b in builds.values():
            on_done(b)


@dataclass
class ExportReport:
    job: MeasureJob
    folder: Path | None  # None: nothing to measure (or a dry run)
    targets: tuple[Target, ...]
    designs: int  # distinct designs of the job
    to_compile: int  # of them, not in the artifact cache before (a dry run; else all)
    records: int = 0  # the database's records of the manifest's targets


def export_gpu(
    manifest: Manifest, history: Sequence[Measurement], name: str | None, assume: bool = False
) -> GpuInfo:
    """The GPU model the job is for: ``name``, else the model with the most records of
    the manifest's targets in the database, else (``assume``: a dry run) the reference
    GPU of ``cudal2.hardware``. Raises ``BuildError`` without any."""
    arch = manifest.archs[0]
    mine = [x for x in history if x.target in set(manifest.targets)]
    if name is None:
        counts = Counter(x.gpu.name for x in mine)
        if not counts and assume:
            counts = Counter([REFERENCE_GPU])
        if not counts:
            raise BuildError(
                "the database holds no record of this manifest's targets, so the measuring "
                "GPU model is unknown: pass --gpu NAME (as torch.cuda.get_device_name() "
                "names it, e.g. 'NVIDIA H100 80GB HBM3')"
            )
        name = min(counts, key=lambda g: (-counts[g], g))
    known = [x.gpu for x in mine if x.gpu.name == name]
    if known:
        return known[-1]
    try:
        sheet = datasheet(name)
    except ValueError as e:
        raise BuildError(f"--gpu {name!r}: {e}") from None
    return GpuInfo(name=name, arch=arch, sm_count=sheet.sm_count, driver="", cuda_runtime="")


def export_job(
    manifest: Manifest,
    db_path: Path,
    cache: ArtifactCache,
    out: Path | None,
    *,
    gpu: str | None = None,
    space: Callable[[Target], Sequence[KernelDesign] | None] | None = None,
    jobs: int | None = None,
    log: TextIO | None = None,
) -> ExportReport:
    """Export the next job of ``manifest``'s build over database ``db_path`` into folder
    ``out`` (None: a dry run: nothing compiled or written, the job only described).
    The report's ``folder`` is None where nothing is left to measure."""
    compile_ = out is not None
    # autotuning is the job's: the loop must not look for cuBLASLt (see module doc)
    m = dataclasses.replace(manifest, search=dataclasses.replace(manifest.search, cublaslt=False))
    b = _ExportBuild(m, db_path, cache, Path("."), jobs=jobs, log=log, compile=compile_)
    contents = b._load()
    history = latest(contents.measurements)
    info = export_gpu(manifest, history, gpu, assume=not compile_)
    runner = ExportRunner(info, space, needs_cubins=compile_)
    b.runner = runner
    b._live = False  # no memcheck here, and nothing appended
    measure: list[Job] = []
    checks: list[Job] = []
    phase = "memcheck"
    try:
        b.measure_and_select()
    except _RoundReady:
        measure = runner.jobs
        phase = b.phase
    targets = tuple(t for t in manifest.targets if t.arch == info.arch)
    if not measure:  # every round answered: the would-be winners' checks
        believed = believable(latest(b.db.load(warn=False).measurements))
        for s in b.gate._unchecked(targets, believed, manifest.timing_mode, shippable()):
            w = s.winner
            if s.kind != "kernel" or w is None or w.gpu.name != info.name:
                continue
            if not b.gate.ledger.clear(check_key(w)):
                checks.append(job_for(JobKind.SANITIZE, w, ""))
    timing = TimingConfig(mode=manifest.timing_mode, seed=manifest.search.seed)
    tuned = {x.target for x in history if x.is_vendor and x.gpu.name == info.name}
    autotune = (
        # plain GEMMs only: a fused epilogue's baseline is torch's unfused op
        tuple(t for t in targets if t not in tuned and t.epilogue == "none")
        if manifest.search.cublaslt and (measure or checks)
        else ()
    )
    designs = {j.design.key: j.design for j in (*measure, *checks) if j.design is not None}
    keys = {j.artifact_key for j in (*measure, *checks)}
    before = sum(1 for k in keys if cache.get(k) is None) if not compile_ else None
    paths: dict[str, Path] = {}
    kernel_jobs: dict[str, list[KernelJob]] = {"measure": [], "checks": []}
    for kind, js in (("measure", measure), ("checks", checks)):
        for j in js:
            build = b.builds.get(j.design.key) if j.design else None
            if build is None:
                build = rendered(j.design) if j.design else None
            assert build is not None
            sha = ""
            if compile_:
                path = Path(b._cubin(runner, j.design, j.artifact_key))
                paths[j.artifact_key] = path
                sha = sha256_file(path)
            kj = KernelJob(dataclasses.replace(j, cubin=cubin_name(j.artifact_key)), build, sha)
            kernel_jobs[kind].append(kj)
    proposer = b.kept[0].proposer if b.kept else _proposer_name(b, manifest)
    last = phase == f"round {manifest.search.rounds}/{manifest.search.rounds}"
    # the round's profiles would feed no proposal (the last round; with search.profile_lag
    # 1 the one before it too): not asked for unless the manifest says so, as a
    # one-machine build (``SearchSettings.profiled``)
    rnd = _round_index(phase)
    top = manifest.search.profile_top if rnd is None or manifest.search.profiled(rnd) else 0
    job = MeasureJob(
        manifest=manifest.name,
        manifest_version=manifest.version,
        manifest_sha256=manifest.sha256,
        phase=phase if (measure or checks) else "done",
        gpu=info.name,
        arch=info.arch,
        proposer=proposer,
        timing=timing,
        profile_top=top,
        profile_metrics=quantities(manifest.search.profile_metrics),
        budget_s=manifest.search.gpu_budget_s,
        measure=tuple(kernel_jobs["measure"]),
        checks=tuple(kernel_jobs["checks"]),
        autotune=autotune,
        records=tuple(b.kept),
        final_round=last,
    )
    folder = None
    if compile_ and not job.empty:
        assert out is not None
        folder = write_job(job, paths, out)
    to_compile = len(keys) if before is None else before
    mine = set(manifest.targets)
    n = sum(1 for x in history if x.target in mine)
    return ExportReport(job, folder, targets, len(designs), to_compile, n)


def _round_index(phase: str) -> int | None:
    """Round ``R`` of a ``round R/N`` phase, counted from 0 (None: another phase)."""
    head, _, rest = phase.partition(" ")
    if head != "round":
        return None
    return int(rest.split("/", 1)[0]) - 1


def _proposer_name(b: _ExportBuild, manifest: Manifest) -> str:
    """The name measurements of this build carry (as ``Build._measure`` passes it)."""
    return b.proposer_name or manifest.search.proposer


def remove_job(folder: Path) -> None:
    """Remove a measured job folder (nothing left to measure: a stale job must not be
    measured again). Only a folder holding a job is removed."""
    folder = Path(folder)
    if (folder / JOB_FILE).is_file():
        gone = folder.with_name(f".{folder.name}.gone-{os.getpid()}")
        os.rename(folder, gone)  # atomically out of the way, then deleted
        shutil.rmtree(gone, ignore_errors=True)


def describe(manifest: Manifest, report: ExportReport, db: Path) -> dict[str, Any]:
    """``--dry-run``: the targets per arch/dtype/layout, the next job, and GPU time."""
    job = report.job
    groups = Counter(f"{t.arch}/{t.dtype}/{t.layout}" for t in manifest.targets)
    s = manifest.search
    per_round = len(report.targets) * s.candidates
    # With [search] pdl, a round's candidates include each tile's PDL variants (at most
    # this many per round: fewer where a proposer runs out of tiles).
    pdl_per_round = len(report.targets) * pdl_candidates(s.candidates) if s.pdl else 0
    gpu_next = len(job.measure) * SECONDS_PER_CANDIDATE + len(job.autotune) * (SECONDS_PER_AUTOTUNE)
    gpu_build = per_round * s.rounds * SECONDS_PER_CANDIDATE + (
        len(report.targets) * SECONDS_PER_AUTOTUNE if s.cublaslt else 0
    )
    return {
        "manifest": str(manifest.path),
        "package": manifest.package,
        "targets": len(manifest.targets),
        "groups": dict(sorted(groups.items())),
        "target_list": [
            {
                "arch": t.arch,
                "dtype": t.dtype,
                "layout": t.layout,
                "m": t.m,
                "n": t.n,
                "k": t.k,
                **({"epilogue": t.epilogue} if t.epilogue != "none" else {}),
            }
            for t in manifest.targets
        ],
        "database": str(db),
        "records": report.records,
        "gpu": job.gpu,
        "phase": job.phase,
        "candidates": len(job.measure),
        "pdl_candidates": sum(1 for kj in job.measure if is_pdl(kj.job.design)),
        "room_candidates": sum(1 for kj in job.measure if is_room(kj.job.design)),
        "checks": len(job.checks),
        "autotune": len(job.autotune),
        "cubins": report.designs,
        "cubins_to_compile": report.to_compile,
        "rounds": s.rounds,
        "per_round": per_round,
        "pdl": s.pdl,
        "pdl_per_round": pdl_per_round,
        "room": s.room,
        "profile_lag": s.profile_lag,
        "profile_top": job.profile_top,  # the next job's: 0 where no proposal reads them
        "budget_s": s.gpu_budget_s,
        "seconds_per_candidate": SECONDS_PER_CANDIDATE,
        "gpu_s_next": min(gpu_next, s.gpu_budget_s),
        "gpu_s_build": min(gpu_build, s.gpu_budget_s),
    }
