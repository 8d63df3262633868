"""The runners take a round's jobs one at a time (``Runner.run`` may be given a stream
the pipeline fills as cubins compile): each job is answered before the next is taken,
and ``jobs`` is iterated once. The local runner's worker pool is a stand-in here (no
GPU); its sanitizer and profile jobs still run together, once the stream ends. And the
GPU models nvidia-smi names, which the build proposes for while the runner starts."""

from __future__ import annotations

import pytest

from cudal2.pipeline.results import job_for
from cudal2.records import JobKind, JobResult, Status
from cudal2.verify import gpu, local
from cudal2.verify.local import LocalRunner
from cudal2.verify.replay import ReplayRunner


def _jobs(recorded, kinds):
    kernels = [m for m in recorded if m.design is not None and m.status == Status.OK]
    return [job_for(kind, m, "") for kind, m in zip(kinds, kernels[: len(kinds)], strict=True)]


def _stream(jobs, log):
    for i, job in enumerate(jobs):
        log.append(("taken", i))
        yield job


class Pool:
    def __init__(self, log):
        self.log = log

    def run(self, job):
        self.log.append(("ran", job.kind.value))
        return JobResult(job, Status.OK)


def test_the_local_runner_answers_each_job_before_taking_the_next(
    recorded_measurements, monkeypatch
):
    kinds = [JobKind.MEASURE, JobKind.SANITIZE, JobKind.MEASURE, JobKind.PROFILE]
    jobs = _jobs(recorded_measurements, kinds)
    log: list = []
    profiled: list = []
    runner = LocalRunner()
    runner.pool = Pool(log)

    def checks(js):
        log.append("checks")
        return (JobResult(j, Status.OK) for j in js)

    def profile(js, device):
        profiled.extend(js)
        return (JobResult(j, Status.OK) for j in js)

    monkeypatch.setattr(runner, "_memcheck", checks)
    monkeypatch.setattr(local, "profile_jobs", profile)
    answers = runner.run(_stream(jobs, log))
    assert next(answers).job == jobs[0]
    assert log == [("taken", 0), ("ran", "measure")]  # not a job more taken
    rest = list(answers)
    assert [r.job for r in rest] == [jobs[2], jobs[1], jobs[3]]
    assert log[2:] == [("taken", 1), ("taken", 2), ("ran", "measure"), ("taken", 3), "checks"]
    assert profiled == [jobs[3]]


def test_the_replay_runner_answers_each_job_before_taking_the_next(recorded_measurements):
    jobs = _jobs(recorded_measurements, [JobKind.MEASURE] * 3)
    log: list = []
    runner = ReplayRunner(recorded_measurements)
    answers = runner.run(_stream(jobs, log))
    first = next(answers)
    assert first.job == jobs[0] and first.recorded
    assert log == [("taken", 0)]
    assert [r.job for r in answers] == jobs[1:]
    assert log == [("taken", i) for i in range(3)]


@pytest.mark.parametrize(
    ("rows", "want"),
    [
        (["NVIDIA H100 80GB HBM3, 9.0, Disabled"], [("NVIDIA H100 80GB HBM3", "sm_90a")]),
        (
            ["NVIDIA H100 80GB HBM3, 9.0, [N/A]", "NVIDIA H200, 9.0, Disabled"],
            [("NVIDIA H100 80GB HBM3", "sm_90a"), ("NVIDIA H200", "sm_90a")],
        ),  # fmt: skip
        (["NVIDIA L4, 8.9, [N/A]"], [("NVIDIA L4", "sm_89")]),
        (["NVIDIA H100 80GB HBM3, 9.0, Enabled"], []),  # MIG: CUDA names instances otherwise
        (["NVIDIA H100 80GB HBM3, [N/A], Disabled"], []),  # a driver that cannot say
        (["NVIDIA H100 80GB HBM3"], []),  # an old nvidia-smi's short row
        ([], []),  # no nvidia-smi, or no GPU
    ],
)
def test_the_gpu_models_nvidia_smi_names_before_cuda_starts(monkeypatch, rows, want):
    """What the build proposes for while its runner starts (``verify.gpu.gpu_models``);
    anything it cannot be sure of is [] (the build then waits for the runner's answer)."""
    monkeypatch.setattr(gpu, "_smi", lambda query: rows)
    assert gpu.gpu_models() == want
