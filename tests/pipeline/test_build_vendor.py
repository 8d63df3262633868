"""The build's cuBLASLt autotuning step (``Build._autotune_vendor``) through a runner
replaying the recorded H100 database: which targets it asks to autotune, and the
records it makes of the answers."""

from __future__ import annotations

import io
import time

from cudal2.database import MeasurementDB
from cudal2.generator.compile import ArtifactCache
from cudal2.manifest import default_manifest_path, load_manifest
from cudal2.pipeline.build import Build
from cudal2.pipeline.results import vendor_measurement, vendor_toolchain
from cudal2.records import Job, JobKind, TimingConfig
from cudal2.verify.replay import ReplayRunner


class Spy(ReplayRunner):
    """The replay runner, remembering the jobs it was given."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.jobs = []

    def run(self, jobs):
        # ``jobs`` may be a stream filled as cubins compile: record each as it is taken
        return super().run(self._taken(jobs))

    def _taken(self, jobs):
        for job in jobs:
            self.jobs.append(job)
            yield job


def _build(tmp_path, log):
    m = load_manifest(default_manifest_path())
    return Build(m, tmp_path / "db.jsonl", ArtifactCache(tmp_path / "c"), tmp_path, log=log)


def test_only_targets_without_a_record_of_this_version_are_autotuned(
    tmp_path, recorded_measurements
):
    vendor = [m for m in recorded_measurements if m.is_vendor]
    assert vendor, "the recorded database has cuBLASLt records"
    version = vendor[0].vendor["version"]
    b = _build(tmp_path, io.StringIO())
    targets = sorted({m.target for m in vendor})
    history = [m for m in vendor if m.target != targets[0]]  # one target never tuned
    runner = Spy(vendor)
    assert runner.cublaslt_version == version
    gpu = runner.start()
    b._autotune_vendor(runner, gpu, targets, history, TimingConfig(), time.monotonic())
    assert [j.target for j in runner.jobs] == [targets[0]]
    (rec,) = MeasurementDB(tmp_path / "db.jsonl").read()
    old = next(m for m in vendor if m.target == targets[0])
    assert rec.reuse_key == old.reuse_key  # same algorithm, version, GPU and mode
    assert rec.toolchain == vendor_toolchain(version) and rec.design is None
    assert rec.median_us == old.median_us and rec.metrics["workspace_bytes"] >= 0
    # Another cuBLASLt version: every target is asked for again; the replay has no
    # record of that version, so nothing is measured and nothing written.
    runner = Spy(vendor, cublaslt_version=version + 1)
    b._autotune_vendor(runner, gpu, targets, history, TimingConfig(), time.monotonic())
    assert len(runner.jobs) == len(targets)
    assert len(MeasurementDB(tmp_path / "db.jsonl").read()) == 1
    assert b.counts["unmeasured"] == len(targets) and not b.failures


def test_a_runner_that_cannot_autotune_says_so_and_tunes_nothing(tmp_path, recorded_measurements):
    log = io.StringIO()
    b = _build(tmp_path, log)
    runner = Spy(recorded_measurements, cublaslt_version=None)
    gpu = runner.start()
    b._autotune_vendor(runner, gpu, b.manifest.targets, [], TimingConfig(), time.monotonic())
    assert runner.jobs == [] and "nvmath-python" in log.getvalue()


def test_vendor_records_round_trip_through_the_database(tmp_path, recorded_measurements):
    rec = next(m for m in recorded_measurements if m.is_vendor)
    db = MeasurementDB(tmp_path / "db.jsonl")
    db.append([rec])
    assert db.read() == [rec]
    job = Job(JobKind.AUTOTUNE, rec.target, TimingConfig(mode=rec.mode), rec.toolchain)
    again = vendor_measurement(ReplayRunner([rec]).answer(job), rec.gpu)
    assert again.design_key == rec.design_key and again.vendor == rec.vendor
    assert again.reuse_key == rec.reuse_key and again.metrics == rec.metrics


def test_a_record_names_the_gpu_that_answered_not_the_runners_first(recorded_measurements):
    """A runner over several GPUs tags each answer with its GPU: the record carries that
    GPU (model, index, host), whichever GPU the runner's ``start`` named."""
    import dataclasses

    from cudal2.pipeline.results import measurement_from
    from cudal2.records import BuildResult

    rec = next(m for m in recorded_measurements if m.is_vendor)
    job = Job(JobKind.AUTOTUNE, rec.target, TimingConfig(mode=rec.mode), rec.toolchain)
    second = dataclasses.replace(rec.gpu, index=1, host="node-2")
    answer = dataclasses.replace(ReplayRunner([rec]).answer(job), gpu=second)
    assert vendor_measurement(answer, rec.gpu).gpu == second
    kernel = next(m for m in recorded_measurements if m.design is not None and m.status == "ok")
    built = BuildResult(kernel.design_key, kernel.artifact_key, False, "k")  # no recipe metrics
    timing = TimingConfig(mode=kernel.mode)
    kjob = ReplayRunner([kernel]).answer(
        Job(
            JobKind.MEASURE,
            kernel.target,
            timing,
            kernel.toolchain,
            kernel.design,
            kernel.artifact_key,
            "k",
        )
    )
    assert kjob.recorded
    assert (
        measurement_from(dataclasses.replace(kjob, gpu=second), built, rec.gpu, "x").gpu == second
    )
    assert measurement_from(kjob, built, kernel.gpu, "x").gpu == kernel.gpu
