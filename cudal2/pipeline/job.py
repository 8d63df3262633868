"""A measuring job: one round of a build, exported by a CPU machine with nvcc
(``cudal2-build --export-job DIR``, ``pipeline.split``) and measured on a GPU machine
that has the ``cudal2`` wheel and no nvcc (``cudal2-build --measure-job DIR``).

The job is a folder, written atomically (built beside it, then renamed into place)::

    DIR/job.json                 what to run: the jobs, their builds, the round, the GPU
    DIR/cubins/<artifact>.cubin  every cubin a job names, by its artifact key

``job.json`` names each cubin's sha256; measuring checks every cubin against it before
the first job runs (issue 17's rule: no bytes nobody checked reach the GPU) and
refuses a job that is malformed, of another format version, or exported for another
GPU model (its reuse keys would never match). Measuring appends to the database what a
one-machine build appends in the same round: the compile failures the export found,
each measured candidate, the round's Nsight Compute feedback, cuBLASLt autotuning of
the targets that have none, and the sanitizer verdicts the job asks for; after a
build's last round also those of each target's fastest new kernel that beats torch
(the likely winner, which the export would otherwise send back for a check: one round
trip saved; the CPU's selection still decides, and exports any check still missing).
Nothing here
imports the generator's compiler: a GPU runner needs no nvcc.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from cudal2 import __version__
from cudal2.database import MeasurementDB, latest
from cudal2.pipeline.profiling import profile_round
from cudal2.pipeline.progress import progress
from cudal2.pipeline.results import (
    measurement_from,
    now,
    vendor_measurement,
    vendor_toolchain,
)
from cudal2.records import (
    BuildResult,
    CheckEvent,
    CheckKey,
    GpuInfo,
    Job,
    JobKind,
    Measurement,
    SanitizerCheck,
    Status,
    Target,
    TimingConfig,
)
from cudal2.verdicts import SanitizerLedger
from cudal2.verify.sanitizer import find_sanitizer

if TYPE_CHECKING:
    from cudal2.verify.runner import Runner

FORMAT = "cudal2-measure-job"
FORMAT_VERSION = 1
JOB_FILE = "job.json"
CUBINS = "cubins"
MAX_JOB_BYTES = 64 * 1024 * 1024  # job.json: far above any manifest's round, bounded


class JobBundleError(ValueError):
    """A job folder that cannot be measured: the message names the file and the fault."""


@dataclass(frozen=True)
class KernelJob:
    """One candidate to measure: the job (its ``cubin`` relative to the job folder), the
    build it came from, and the cubin's sha256."""

    job: Job
    build: BuildResult
    cubin_sha256: str

    def as_json(self) -> dict[str, Any]:
        return {
            "job": self.job.as_json(),
            "build": self.build.as_json(),
            "cubin_sha256": self.cubin_sha256,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> KernelJob:
        return cls(Job.from_json(d["job"]), BuildResult.from_json(d["build"]), d["cubin_sha256"])


@dataclass(frozen=True)
class MeasureJob:
    """What ``job.json`` holds. ``phase``: ``round R/N`` or ``memcheck``. ``gpu``: the GPU
    model the job was exported for (its reuse keys). ``records``: compile failures found
    by the export, appended as this GPU's records (a one-machine build records them too).
    ``checks``: sanitizer jobs of would-be winners (phase ``memcheck``)."""

    manifest: str
    manifest_version: str
    manifest_sha256: str
    phase: str
    gpu: str
    arch: str
    proposer: str
    timing: TimingConfig
    profile_top: int
    budget_s: float
    measure: tuple[KernelJob, ...] = ()
    checks: tuple[KernelJob, ...] = ()
    autotune: tuple[Target, ...] = ()
    records: tuple[Measurement, ...] = ()
    final_round: bool = False
    exported_by: str = __version__
    profile_metrics: tuple[str, ...] = ()  # the Nsight Compute quantities (empty: all)

    @property
    def empty(self) -> bool:
        return not (self.measure or self.checks)

    def as_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "exported_by": self.exported_by,
            "manifest": {
                "name": self.manifest,
                "version": self.manifest_version,
                "sha256": self.manifest_sha256,
            },
            "phase": self.phase,
            "gpu": self.gpu,
            "arch": self.arch,
            "proposer": self.proposer,
            "timing": self.timing.as_json(),
            "profile_top": self.profile_top,
            "profile_metrics": list(self.profile_metrics),
            "budget_s": self.budget_s,
            "measure": [k.as_json() for k in self.measure],
            "checks": [k.as_json() for k in self.checks],
            "autotune": [t.as_json() for t in self.autotune],
            "records": [m.as_json() for m in self.records],
            "final_round": self.final_round,
        }

    @classmethod
    def from_json(cls, d: Any, where: str) -> MeasureJob:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise JobBundleError(f"{where}: not a cudal2 measuring job (no format {FORMAT!r})")
        if d.get("format_version") != FORMAT_VERSION:
            raise JobBundleError(
                f"{where}: format_version {d.get('format_version')!r}, this cudal2 "
                f"({__version__}) reads {FORMAT_VERSION}: export the job with the same "
                "cudal2 version that measures it"
            )
        try:
            man = d["manifest"]
            return cls(
                manifest=str(man["name"]),
                manifest_version=str(man["version"]),
                manifest_sha256=str(man["sha256"]),
                phase=str(d["phase"]),
                gpu=str(d["gpu"]),
                arch=str(d["arch"]),
                proposer=str(d["proposer"]),
                timing=TimingConfig.from_json(d["timing"]),
                profile_top=int(d["profile_top"]),
                profile_metrics=tuple(str(q) for q in d.get("profile_metrics") or ()),
                budget_s=float(d["budget_s"]),
                measure=tuple(KernelJob.from_json(k) for k in d["measure"]),
                checks=tuple(KernelJob.from_json(k) for k in d["checks"]),
                autotune=tuple(Target.from_json(t) for t in d["autotune"]),
                records=tuple(Measurement.from_json(m) for m in d["records"]),
                final_round=bool(d["final_round"]),
                exported_by=str(d.get("exported_by", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise JobBundleError(f"{where}: malformed job ({type(e).__name__}: {e})") from None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cubin_name(artifact_key: str) -> str:
    return f"{CUBINS}/{artifact_key}.cubin"


def write_job(job: MeasureJob, cubins: dict[str, Path], out: Path) -> Path:
    """Write ``job`` and the cubins it names (``cubins``: artifact key -> a checked cubin
    in the artifact cache) to folder ``out``, atomically: built in a sibling folder and
    renamed into place, so a killed export leaves the old job or the new one, whole.
    A previous job in ``out`` is replaced."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    old = out.with_name(f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        (tmp / CUBINS).mkdir(parents=True)
        for key, src in sorted(cubins.items()):
            shutil.copyfile(src, tmp / cubin_name(key))
        for k in (*job.measure, *job.checks):
            got = sha256_file(tmp / k.job.cubin)
            if got != k.cubin_sha256:  # the cache changed under the export: write nothing
                raise JobBundleError(
                    f"{k.job.cubin}: sha256 {got} while copying, not {k.cubin_sha256}"
                )
        text = json.dumps(job.as_json(), sort_keys=True, indent=1) + "\n"
        with open(tmp / JOB_FILE, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if out.exists():
            if not (out / JOB_FILE).is_file():
                raise JobBundleError(f"{out} exists and is not a measuring job: not replaced")
            os.rename(out, old)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return out


def read_job(folder: Path) -> MeasureJob:
    """The job in ``folder``, every cubin it names checked against its sha256.
    Raises ``JobBundleError`` naming what is wrong."""
    folder = Path(folder)
    path = folder / JOB_FILE
    if not path.is_file():
        raise JobBundleError(f"{folder}: no {JOB_FILE} (export one with cudal2-build --export-job)")
    if path.stat().st_size > MAX_JOB_BYTES:
        raise JobBundleError(f"{path}: larger than {MAX_JOB_BYTES} bytes")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise JobBundleError(f"{path}: not JSON ({e})") from None
    job = MeasureJob.from_json(data, str(path))
    root = folder.resolve()
    for k in (*job.measure, *job.checks):
        rel = k.job.cubin
        if rel != cubin_name(k.job.artifact_key):  # no path outside the folder, no aliasing
            raise JobBundleError(f"{path}: cubin {rel!r} is not {cubin_name(k.job.artifact_key)}")
        cubin = root / rel
        if not cubin.is_file():
            raise JobBundleError(f"{cubin}: missing (the job folder is incomplete)")
        got = sha256_file(cubin)
        if got != k.cubin_sha256:
            raise JobBundleError(
                f"{cubin}: sha256 {got}, the job recorded {k.cubin_sha256}: corrupt or "
                "tampered with; export the job again"
            )
    return job


@dataclass
class MeasureReport:
    phase: str
    measured: int = 0
    reused: int = 0
    autotuned: int = 0
    checked: int = 0
    failed_checks: int = 0
    unmeasured: int = 0
    failures: dict[str, int] = field(default_factory=dict)


class JobMeasurer:
    """Measures a job folder into a database on ``runner``'s GPU. Jobs whose reuse key
    already has a record are not run again (a killed measuring resumes)."""

    def __init__(self, folder: Path, db_path: Path, runner: Runner, log: TextIO | None = None):
        self.folder = Path(folder).resolve()
        self.job = read_job(self.folder)
        self.db = MeasurementDB(db_path)
        self.runner = runner
        self.log = log if log is not None else sys.stderr

    def say(self, msg: str) -> None:
        print(msg, file=self.log, flush=True)

    def _cubin(self, rel: str) -> str:
        return str(self.folder / rel)

    def run(self) -> MeasureReport:
        job = self.job
        report = MeasureReport(job.phase)
        history = latest(self.db.load().measurements)
        with self.runner as runner:
            gpu = runner.start()
            if gpu.name != job.gpu:
                raise JobBundleError(
                    f"{self.folder}: exported for {job.gpu}, this GPU is {gpu.name}: its "
                    f"records would answer nothing of the build; export with --gpu {gpu.name!r}"
                )
            self.say(
                f"measuring job {self.folder} ({job.manifest}, {job.phase}) with "
                f"{runner.name}: {gpu.name} ({gpu.arch}, driver {gpu.driver})"
            )
            done = {x.reuse_key for x in history}
            fresh = [dataclasses.replace(r, gpu=gpu) for r in job.records]
            self.db.append([r for r in fresh if r.reuse_key not in done])
            round_ms = [x for x in history if x.reuse_key in _keys(job.measure, gpu.name)]
            report.reused = len(round_ms)
            round_ms += fresh
            todo = [k for k in job.measure if k.job.reuse_key(gpu.name) not in done]
            prepare = getattr(runner, "prepare", None)  # a hint: the workers ready targets
            if prepare is not None:
                prepare(list(dict.fromkeys(k.job.target for k in todo)), job.timing)
            builds = {k.job.artifact_key: k.build for k in todo}
            jobs = [dataclasses.replace(k.job, cubin=self._cubin(k.job.cubin)) for k in todo]
            started = time.monotonic()
            for res in self._answers(runner, jobs, f"{job.phase}: measure", "candidate", started):
                if not res.recorded:
                    report.unmeasured += 1
                    continue
                rec = measurement_from(res, builds[res.job.artifact_key], gpu, job.proposer)
                self.db.append([rec])
                round_ms.append(rec)
                report.measured += 1
                if rec.status != Status.OK:
                    report.failures[rec.status] = report.failures.get(rec.status, 0) + 1
            by_key = {k.job.artifact_key: k.job.cubin for k in job.measure}
            profile_round(
                runner,
                gpu,
                round_ms,
                job.profile_top,
                lambda x: self._cubin(by_key[x.artifact_key]),
                self.db.append,
                self.say,
                job.profile_metrics,
            )
            report.autotuned = self._autotune(runner, gpu, history, started)
            checks = list(self.job.checks)
            if self.job.final_round:  # save the CPU a round trip (module doc)
                contents = self.db.load(warn=False)
                checks += self._likely_winners(contents, gpu)
            report.checked, report.failed_checks = self._memcheck(runner, gpu, checks)
        return report

    def _likely_winners(self, contents: Any, gpu: GpuInfo) -> list[KernelJob]:
        """After a build's last round: per target, the fastest correct kernel of this job
        on record that beats torch and has no clean check: the would-be winner the export
        would otherwise send back for a check (the CPU's selection still decides)."""
        ledger = SanitizerLedger(contents.checks)
        mine = {k.job.reuse_key(gpu.name): k for k in self.job.measure}
        best: dict[Target, tuple[float, KernelJob]] = {}
        for x in latest(contents.measurements):
            k = mine.get(x.reuse_key)
            if k is None or x.status != Status.OK or not x.median_us:
                continue
            torch = x.baselines_us.get("torch")
            if torch is not None and x.median_us >= torch:
                continue
            if ledger.clear(CheckKey(gpu.name, x.toolchain, x.artifact_key, x.target.key)):
                continue
            if x.target not in best or x.median_us < best[x.target][0]:
                best[x.target] = (x.median_us, k)
        have = {(k.job.artifact_key, k.job.target) for k in self.job.checks}
        return [
            dataclasses.replace(k, job=dataclasses.replace(k.job, kind=JobKind.SANITIZE))
            for _, k in best.values()
            if (k.job.artifact_key, k.job.target) not in have
        ]

    def _answers(self, runner: Runner, jobs: Sequence[Job], desc: str, unit: str, started: float):
        """The runner's answers until the job's GPU-time budget is spent (as a build)."""
        bar = progress(len(jobs), desc, unit, self.log)
        answers = iter(runner.run(jobs))
        try:
            while bar.n < len(jobs):
                if time.monotonic() - started > self.job.budget_s:
                    self.say(
                        f"GPU-time budget of {self.job.budget_s:.0f} s spent: "
                        f"{len(jobs) - bar.n} {unit}s left (measure the job again to continue)"
                    )
                    return
                res = next(answers, None)
                if res is None:
                    return
                bar.update(1)
                yield res
        finally:
            bar.close()

    def _autotune(
        self, runner: Runner, gpu: GpuInfo, history: Iterable[Measurement], started: float
    ) -> int:
        version = runner.cublaslt_version
        if not self.job.autotune:
            return 0
        if version is None:
            self.say(f"cuBLASLt is not autotuned: {runner.name} cannot (pip install nvmath-python)")
            return 0
        timing = self.job.timing
        done = {x.tuning_key for x in history if x.is_vendor}
        jobs = [
            j
            for t in self.job.autotune
            if (j := Job(JobKind.AUTOTUNE, t, timing, vendor_toolchain(version))).reuse_key(
                gpu.name
            )
            not in done
        ]
        n = 0
        for res in self._answers(runner, jobs, f"cuBLASLt {version} autotune", "target", started):
            if not res.recorded:
                continue
            if not res.vendor:
                self.say(f"cuBLASLt autotuning of {res.job.target.label} failed: {res.error}")
                continue
            self.db.append([vendor_measurement(res, gpu)])
            n += 1
        return n

    def _memcheck(
        self, runner: Runner, gpu: GpuInfo, checks: Sequence[KernelJob]
    ) -> tuple[int, int]:
        """Sanitizer checks, each announced (a ``started`` line) before it runs and its
        verdict appended after, under the database's check lock."""
        if not checks:
            return 0, 0
        if runner.needs_cubins and find_sanitizer() is None:  # a GPU without the tool
            self.say(
                f"compute-sanitizer not found: {len(checks)} sanitizer checks not run (their "
                "kernels wait; the next export asks for them again)"
            )
            return 0, 0
        jobs = [dataclasses.replace(k.job, cubin=self._cubin(k.job.cubin)) for k in checks]
        checked = failed = 0
        with self.db.locked():
            at = now()
            starts = {
                CheckKey(gpu.name, j.toolchain, j.artifact_key, j.target.key): SanitizerCheck(
                    uuid.uuid4().hex,
                    CheckEvent.STARTED,
                    gpu.name,
                    j.toolchain,
                    j.artifact_key,
                    j.target,
                    at,
                    __version__,
                )
                for j in jobs
            }
            self.db.append_checks(starts.values())
            self.say(f"compute-sanitizer memcheck of {len(jobs)} would-be winners")
            for res in runner.run(jobs):
                if not res.recorded:
                    continue
                j = res.job
                key = CheckKey(gpu.name, j.toolchain, j.artifact_key, j.target.key)
                verdict = starts[key].verdict(res.status == Status.OK, now(), res.error)
                self.db.append_checks([verdict])
                checked += 1
                failed += verdict.event == CheckEvent.FAILED
        return checked, failed


def _keys(ks: Iterable[KernelJob], gpu: str) -> set:
    return {k.job.reuse_key(gpu) for k in ks}
