"""The parent side of a measuring worker (``verify/pool.py``): each answer carries the
job's seconds (``JobResult.job_s``), which the build's stage table splits the measure
stage by. Stand-in workers (``host_workers``) answer from the recorded H100 database."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

from cudal2.database import MeasurementDB
from cudal2.pipeline.results import job_for
from cudal2.records import JobKind, JobResult, Status
from cudal2.verify.pool import WorkerPool

sys.path.insert(0, str(Path(__file__).parent))
import host_workers  # noqa: E402

DB = str(Path(__file__).resolve().parents[2] / "manifests" / "default.measurements.jsonl")


def _jobs(n: int):
    kernels = [m for m in MeasurementDB(DB).read() if m.design is not None]
    return [job_for(JobKind.MEASURE, m, "") for m in kernels[:n]]


def _pool(timeout_s: float = 60.0, **faults) -> WorkerPool:
    worker = functools.partial(host_workers.replay_worker, db=DB, faults=faults)
    return WorkerPool(0, timeout_s, worker)


def test_an_answer_carries_the_round_trip_where_the_worker_reports_no_job_seconds():
    job, hung = _jobs(2)
    with _pool(delay_s=0.3) as pool:
        res = pool.run(job)
    assert res.status is not None and res.recorded
    assert 0.3 <= res.job_s < 30  # the worker's 0.3 s, the pipe and the JSON
    assert JobResult.from_json(res.as_json()).job_s == res.job_s
    with _pool(timeout_s=1.0, hang=[hung.design.key]) as pool:
        timed_out = pool.run(hung)
    assert timed_out.status == Status.TIMEOUT and 1.0 <= timed_out.job_s < 30


def test_the_worker_s_own_job_seconds_stand():
    (job,) = _jobs(1)
    with _pool(delay_s=0.3, job_s=0.05) as pool:
        assert pool.run(job).job_s == 0.05


def test_an_answer_without_job_seconds_reads_as_none_and_writes_none():
    (job,) = _jobs(1)
    res = JobResult(job, Status.OK)
    assert "job_s" not in res.as_json() and JobResult.from_json(res.as_json()).job_s is None
