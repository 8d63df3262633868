"""Targets prepared while the worker has no job (``WorkerPool.prepare``, the worker's
``serve`` loop), on CPU: real worker processes and pipes (``tests/verify/host_workers.py``:
jobs answered from the recorded H100 database, each target's preparation a sleep
logged in ``ran.log``). A prepare message gets no answer and never reorders a job;
a job waits at most for the one target being prepared when it came; a worker that
dies while preparing costs no job; a worker that dies on a job it ran is charged as
before.
"""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

import pytest

from cudal2.database import MeasurementDB
from cudal2.pipeline.results import job_for
from cudal2.records import Job, JobKind, Status, TimingConfig
from cudal2.verify.pool import WorkerPool
from cudal2.verify.replay import ReplayRunner

sys.path.insert(0, str(Path(__file__).parent))  # the workers are spawned by module name
import host_workers  # noqa: E402
from test_host import DB, runner  # noqa: E402

PREPARE_S = 0.4
TIMING = TimingConfig()


@pytest.fixture(scope="module")
def replay() -> ReplayRunner:
    return ReplayRunner(MeasurementDB(DB).read())


@pytest.fixture(scope="module")
def jobs() -> list[Job]:
    """Kernel jobs of 8 targets (one each)."""
    picked, seen = [], set()
    for m in MeasurementDB(DB).read():
        if m.design is not None and m.status == Status.OK and m.target not in seen:
            seen.add(m.target)
            picked.append(job_for(JobKind.MEASURE, m, ""))
    assert len(picked) >= 8
    return picked[:8]


def pool(tmp: Path, **faults) -> WorkerPool:
    faults["state"] = str(tmp)
    worker = functools.partial(host_workers.replay_worker, db=DB, faults=faults)
    return WorkerPool(0, 30.0, worker)


def events(tmp: Path) -> list[tuple[str, str]]:
    """(kind, key) of each job run and each target prepared, in order."""
    log = tmp / "ran.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [tuple(line.split(" ", 2)[1:]) for line in lines]


def wait_for(cond, timeout_s: float = 20.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def same(a, b) -> bool:
    return (a.job, a.status, a.samples_us, a.baseline_samples_us) == (
        b.job,
        b.status,
        b.samples_us,
        b.baseline_samples_us,
    )


def test_prepares_get_no_answer_and_never_reorder_or_hold_up_a_job(jobs, replay, tmp_path):
    targets = [j.target for j in jobs]
    with pool(tmp_path, prepare_s=PREPARE_S) as p:
        p.start()
        assert p.prepare(targets, TIMING)
        time.sleep(0.1)  # the worker is preparing the first target
        waits, answers = [], []
        for job in jobs:
            t0 = time.monotonic()
            answers.append(p.run(job))
            waits.append(time.monotonic() - t0)
        # every job answered with its own answer, in the order sent, nothing else came
        assert all(same(a, replay.answer(j)) for a, j in zip(answers, jobs, strict=True))
        assert not p._conn.poll(0)
        # a job waits at most for the one preparation under way when it came, and the
        # eight jobs did not wait for the eight preparations
        assert max(waits) < PREPARE_S + 0.3, waits
        assert sum(waits) < len(targets) * PREPARE_S
        assert p.restarts == 0 and p.retried == 0
        # left idle, the worker prepares the rest
        wait_for(lambda: sum(k == "prepare" for k, _ in events(tmp_path)) == len(targets))
    got = events(tmp_path)
    assert [key for kind, key in got if kind != "prepare"] == [
        host_workers.job_key(j) for j in jobs
    ]
    assert [key for kind, key in got if kind == "prepare"] == [t.label for t in targets]


def test_a_worker_that_dies_preparing_costs_no_job(jobs, replay, tmp_path):
    """It dies (as a CUDA error would end it, or a kill) while a job waits in its pipe:
    the job runs on a fresh worker, once; and when it died idle, the next job does."""
    first = jobs[0].target.label
    with pool(tmp_path, prepare_s=PREPARE_S, prepare_crash=[first]) as p:
        p.start()
        p.prepare([jobs[0].target], TIMING)
        time.sleep(0.1)  # preparing: the job waits in the pipe, then the worker dies
        res = p.run(jobs[1])
        assert same(res, replay.answer(jobs[1]))
        assert p.restarts == 1 and p.retried == 1
        p.prepare([jobs[0].target], TIMING)
        wait_for(lambda: not p._proc.is_alive())  # died idle
        assert same(p.run(jobs[2]), replay.answer(jobs[2]))
        assert p.restarts == 2 and p.retried == 1
    ran = [key for kind, key in events(tmp_path) if kind != "prepare"]
    assert ran == [host_workers.job_key(jobs[1]), host_workers.job_key(jobs[2])]


def test_a_cuda_error_while_preparing_ends_the_worker_and_costs_no_job(jobs, replay, tmp_path):
    with pool(tmp_path, prepare_s=PREPARE_S, prepare_cuda=[jobs[0].target.label]) as p:
        p.start()
        p.prepare([jobs[0].target, jobs[1].target], TIMING)
        time.sleep(0.1)
        assert same(p.run(jobs[3]), replay.answer(jobs[3]))
        assert p.restarts == 1 and p.retried == 1
    assert [k for k, _ in events(tmp_path)] == ["measure"]  # nothing prepared after


def test_a_job_that_kills_its_worker_after_the_preparations_is_charged(jobs, tmp_path):
    """Once the worker has said it has nothing left to prepare, a death is the job's:
    answered ``runtime`` and not run again. While it may still be preparing, the job is
    run once more on a fresh worker, which prepares nothing: a second death is its own."""
    crash = host_workers.job_key(jobs[2])
    with pool(tmp_path, crash=[crash]) as p:
        p.start()
        p.prepare([jobs[0].target], TIMING)
        wait_for(lambda: ("prepare", jobs[0].target.label) in events(tmp_path))
        assert p.run(jobs[1]).status == Status.OK  # its answer: nothing left to prepare
        res = p.run(jobs[2])
        assert res.status == Status.RUNTIME and "measuring worker died" in res.error
        assert p.retried == 0 and p.restarts == 1
        p.start()
        p.prepare([jobs[0].target], TIMING)  # may be preparing when the job comes
        res = p.run(jobs[2])
        assert res.status == Status.RUNTIME and p.retried == 1 and p.restarts == 3
    ran = [key for kind, key in events(tmp_path) if kind != "prepare"]
    assert ran.count(crash) == 3


def test_no_worker_running_takes_no_prepare(jobs, tmp_path):
    p = pool(tmp_path)
    assert not p.prepare([jobs[0].target], TIMING)  # not started: nothing started for it
    assert p.pid is None


def test_the_host_runner_asks_every_gpu_to_prepare(jobs, replay, tmp_path):
    targets = [j.target for j in jobs[:3]]
    with runner(range(2), tmp_path) as r:
        r.start()
        r.prepare(targets, TIMING)
        wait_for(lambda: sum(k == "prepare" for k, _ in events(tmp_path)) == 2 * len(targets))
        answers = list(r.run(jobs))
    assert all(same(a, replay.answer(a.job)) for a in answers) and len(answers) == len(jobs)
    lines = (tmp_path / "ran.log").read_text().splitlines()
    for device in ("0", "1"):
        mine = [line.split(" ", 2)[2] for line in lines if line.startswith(f"{device} prepare")]
        assert mine == [t.label for t in targets]


def test_the_local_runner_asks_its_worker_to_prepare(jobs, replay, tmp_path):
    from cudal2.verify.local import LocalRunner

    r = LocalRunner()
    r.pool = pool(tmp_path)  # its one worker, answering from the recorded database
    with r:
        r.start()
        r.prepare([j.target for j in jobs[:2]], TIMING)
        wait_for(lambda: sum(k == "prepare" for k, _ in events(tmp_path)) == 2)
        answers = list(r.run(jobs[:3]))
    assert [a.job for a in answers] == jobs[:3]
    assert all(same(a, replay.answer(a.job)) for a in answers)
