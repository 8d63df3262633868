"""The replay runner answers each kind of job from the recorded H100 database
(manifests/default.measurements.jsonl), and "not recorded" where it has no record."""

from __future__ import annotations

import dataclasses

import pytest

from cudal2.database import latest
from cudal2.pipeline.results import job_for, vendor_toolchain
from cudal2.records import Job, JobKind, Status, TimingConfig
from cudal2.verify.replay import ReplayRunner


@pytest.fixture(scope="module")
def kernel(recorded_measurements):
    return next(m for m in latest(recorded_measurements) if m.design and m.status == "ok")


def test_a_measure_job_gets_the_record_of_its_reuse_key(recorded_measurements, kernel):
    runner = ReplayRunner(recorded_measurements)
    gpu = runner.start()
    assert gpu == kernel.gpu and not runner.needs_cubins
    job = dataclasses.replace(job_for(JobKind.PROFILE, kernel, ""), kind=JobKind.MEASURE)
    assert job.reuse_key(gpu.name) == kernel.reuse_key  # one definition of the key
    (res,) = runner.run([job])
    assert res.job == job and res.recorded
    fields = ("status", "error", "max_abs_err", "max_rel_err", "samples_us", "metrics")
    assert all(getattr(res, f) == getattr(kernel, f) for f in fields)
    assert res.baseline_samples_us == kernel.baseline_samples_us


@pytest.mark.parametrize(
    "kind, change",
    [
        ("measure", {"artifact_key": "0" * 64}),  # another artifact
        ("measure", {"toolchain": "nvcc 99; timing v9"}),  # another toolchain
        ("measure", {"timing": TimingConfig(mode="server")}),  # another timing mode
        ("profile", {}),  # the default build profiled only its fastest candidates
        ("sanitizer", {}),  # passes are not recorded: unchecked, not failed
    ],
)
def test_a_job_without_a_record_is_not_recorded(recorded_measurements, kernel, kind, change):
    unprofiled = [
        m for m in latest(recorded_measurements) if m.design and not m.metrics.get("ncu_sm_pct")
    ]
    m = kernel if change else unprofiled[0]
    job = dataclasses.replace(job_for(JobKind.MEASURE, m, ""), kind=JobKind(kind), **change)
    res = ReplayRunner(recorded_measurements).answer(job)
    assert not res.recorded and res.status is None and res.samples_us == ()


def test_a_profile_job_gets_the_recorded_counters(recorded_measurements):
    profiled = next(m for m in latest(recorded_measurements) if "ncu_sm_pct" in m.metrics)
    res = ReplayRunner(recorded_measurements).answer(job_for(JobKind.PROFILE, profiled, ""))
    assert res.status == Status.OK and res.metrics
    assert res.metrics == {k: v for k, v in profiled.metrics.items() if k.startswith("ncu_")}


def test_a_recorded_sanitizer_failure_answers_memcheck_not_the_timing(
    recorded_measurements, kernel
):
    failed = dataclasses.replace(
        kernel, status="sanitizer", error="memcheck exited 86", median_us=None
    )
    runner = ReplayRunner([*recorded_measurements, failed])
    job = job_for(JobKind.SANITIZE, kernel, "")
    assert runner.answer(job).status == Status.SANITIZER
    assert runner.answer(job).error == "memcheck exited 86"
    timed = runner.answer(dataclasses.replace(job, kind=JobKind.MEASURE))
    assert timed.status == Status.OK and timed.samples_us == kernel.samples_us


def test_autotuning_is_answered_for_the_recorded_version_only(recorded_measurements):
    vendor = next(m for m in recorded_measurements if m.is_vendor)
    version = vendor.vendor["version"]
    runner = ReplayRunner(recorded_measurements)
    assert runner.cublaslt_version == version
    job = Job(JobKind.AUTOTUNE, vendor.target, TimingConfig(), vendor_toolchain(version))
    assert job.reuse_key(vendor.gpu.name) == vendor.tuning_key
    res = runner.answer(job)
    assert res.vendor == vendor.vendor and res.samples_us == vendor.samples_us
    other = dataclasses.replace(job, toolchain=vendor_toolchain(version + 1))
    assert not runner.answer(other).recorded


def test_another_gpu_model_has_nothing_to_replay(recorded_measurements):
    with pytest.raises(ValueError, match="no measurements recorded on NVIDIA B200"):
        ReplayRunner(recorded_measurements, gpu="NVIDIA B200")
    with pytest.raises(ValueError, match="nothing to replay"):
        ReplayRunner([])


def test_a_run_off_is_answered_only_by_a_record_of_that_run_off(recorded_measurements, kernel):
    """A rival's time is what a replay cannot make up: a run-off job of a key whose
    record timed no such rival is not recorded; the record of that run-off answers it
    with the rival's samples."""
    from cudal2.pipeline.runoff import runoff_job

    vendor = next(m for m in recorded_measurements if m.is_vendor and m.target == kernel.target)
    job = runoff_job(kernel, vendor, "", TimingConfig(mode=kernel.mode))
    (res,) = ReplayRunner(recorded_measurements).run([job])
    assert not res.recorded and "run-off" in res.error
    samples = vendor.samples_us[: len(kernel.samples_us)]
    ran = dataclasses.replace(
        kernel,
        baselines_us={**kernel.baselines_us, vendor.design_key: vendor.median_us},
        baseline_samples_us={**kernel.baseline_samples_us, vendor.design_key: samples},
    )
    (res,) = ReplayRunner([*recorded_measurements, ran]).run([job])
    assert res.recorded and res.baseline_samples_us[vendor.design_key] == samples
