"""The host runner (``verify/host.py``) on CPU: its "GPUs" are worker processes that answer
from the recorded H100 database (``tests/verify/host_workers.py``, real pipes, real
process deaths), so what is checked is the runner's own work: one queue over N workers,
every job answered exactly once and tagged with the worker that answered, a crash or a
hang costing one job, a GPU that dies for good retired with its job re-queued, nothing
run after the caller stops, mixed GPU models refused, and a whole build through it the
same as through one replayed GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from cudal2.database import MeasurementDB
from cudal2.generator.compile import ArtifactCache
from cudal2.manifest import load_manifest
from cudal2.packaging.runtime.table import DispatchTable
from cudal2.pipeline.build import Build
from cudal2.pipeline.results import job_for
from cudal2.policy import GridProposer
from cudal2.records import (
    Job,
    JobKind,
    JobResult,
    KernelDesign,
    Measurement,
    Status,
    Target,
    TimingConfig,
)
from cudal2.verify.fleet import FleetError
from cudal2.verify.host import HostRunner
from cudal2.verify.pool import WorkerError
from cudal2.verify.replay import ReplayRunner

sys.path.insert(0, str(Path(__file__).parent))  # the workers are spawned by module name
import host_workers  # noqa: E402

DB = str(Path(__file__).resolve().parents[2] / "manifests" / "default.measurements.jsonl")
H100 = "NVIDIA H100 80GB HBM3"


def runner(
    devices, tmp: Path | None = None, timeout_s: float = 30.0, log=None, **faults
) -> HostRunner:
    """A host runner over ``devices`` fake GPUs with ``faults`` (host_workers' keys)."""
    if tmp is not None:
        faults["state"] = str(tmp)
    worker = functools.partial(host_workers.replay_worker, db=DB, faults=faults)
    return HostRunner(list(devices), timeout_s, worker=worker, needs_cubins=False, log=log)


def ran(tmp: Path) -> Counter:
    """How often each job key was run, by any worker (host_workers' log; the targets
    prepared are not runs)."""
    log = tmp / "ran.log"
    lines = log.read_text().splitlines() if log.exists() else []
    runs = [line.split(" ", 2) for line in lines]
    return Counter(key for _, kind, key in runs if kind != "prepare")


@pytest.fixture(scope="module")
def recorded() -> list[Measurement]:
    return MeasurementDB(DB).read()


@pytest.fixture(scope="module")
def replay(recorded) -> ReplayRunner:
    return ReplayRunner(recorded)


@pytest.fixture(scope="module")
def jobs(recorded) -> list[Job]:
    """24 kernel measurements and 3 cuBLASLt autotunings, of several targets."""
    kernels = [m for m in recorded if m.design is not None and m.status == Status.OK]
    picked = kernels[::29][:24]
    vendor = [m for m in recorded if m.is_vendor][:3]
    out = [job_for(JobKind.MEASURE, m, "") for m in picked]
    out += [_job_of(m) for m in vendor]
    assert len(out) == 27 and len({host_workers.job_key(j) for j in out}) == 27
    return out


def key(job: Job) -> str:
    return host_workers.job_key(job)


def by_key(answers: list[JobResult]) -> dict[str, JobResult]:
    keys = [key(a.job) for a in answers]
    assert len(keys) == len(set(keys)), f"answered twice: {Counter(keys).most_common(3)}"
    return dict(zip(keys, answers, strict=True))


def same_answer(a: JobResult, b: JobResult) -> bool:
    return (a.job, a.status, a.samples_us, a.baseline_samples_us, a.vendor) == (
        b.job,
        b.status,
        b.samples_us,
        b.baseline_samples_us,
        b.vendor,
    )


# -- every job once, tagged -------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 4])
def test_every_job_is_answered_once_and_tagged_with_its_gpu(n, jobs, replay, tmp_path):
    with runner(range(n), tmp_path, delay_s=0.02) as r:
        gpu = r.start()
        answers = list(r.run(jobs))
    assert gpu.name == H100 and gpu.index == 0
    got = by_key(answers)
    assert set(got) == {key(j) for j in jobs}
    assert all(same_answer(got[key(j)], replay.answer(j)) for j in jobs)
    assert ran(tmp_path) == Counter({key(j): 1 for j in jobs})  # each run once, by one GPU
    tags = [a.gpu for a in answers]
    assert all(g is not None and g.name == H100 and g.host == socket.gethostname() for g in tags)
    used = Counter(g.index for g in tags)
    assert set(used) <= set(range(n)) and (n == 1 or len(used) >= 2), used


@pytest.mark.parametrize("n", [1, 2])
def test_a_stream_of_jobs_is_measured_as_it_comes(n, jobs, tmp_path):
    """The pipeline hands a round's jobs over as their cubins compile: the first answers
    come back while the stream has jobs left to give, each job is taken once, and
    a stream that ends early after a GPU is retired still answers every job it gave."""
    gate = threading.Event()
    taken: list[int] = []

    def stream():
        for i, j in enumerate(jobs[:8]):
            if i == 4:
                assert gate.wait(60), "no answer came back before the stream was finished"
            taken.append(i)
            yield j

    with runner(range(n), tmp_path, delay_s=0.02) as r:
        r.start()
        answers = []
        for a in r.run(stream()):
            answers.append(a)
            gate.set()  # one answer out: the stream may give its second half
    assert taken == list(range(8))
    assert set(by_key(answers)) == {key(j) for j in jobs[:8]}


class StreamBroke(RuntimeError):
    pass


@pytest.mark.parametrize("n", [1, 3])
def test_an_error_raised_by_the_job_stream_reaches_the_caller(n, jobs, tmp_path):
    """The stream (the pipeline's: the proposer's or the compile's error is raised in
    it) fails after 4 jobs, inside a GPU's thread: the caller gets that error once the
    jobs taken before it are answered, and no thread waits for ever (the run is
    consumed in a thread of the test's, so a hang fails the test instead of the suite)."""

    def stream():
        yield from jobs[:4]
        raise StreamBroke("the proposer failed")

    got: dict[str, object] = {}

    def consume(r):
        answers = []
        try:
            for a in r.run(stream()):
                answers.append(a)
        except BaseException as e:  # noqa: BLE001 - what the caller gets, checked below
            got["error"] = e
        got["answers"] = answers

    with runner(range(n), tmp_path, delay_s=0.02) as r:
        r.start()
        t = threading.Thread(target=consume, args=(r,), daemon=True)
        t.start()
        t.join(30)
        assert not t.is_alive(), "the host runner hung on a stream that raised"
        assert isinstance(got["error"], StreamBroke), got
        assert set(by_key(got["answers"])) == {key(j) for j in jobs[:4]}  # each answered
        again = list(r.run(jobs[4:8]))  # the GPUs go on
    assert set(by_key(again)) == {key(j) for j in jobs[4:8]}


# -- faults: each costs what it must, and no more ----------------------------------------
FAULTS = [
    # id, faults (job indices stand for their keys), the faulted jobs' status, error part
    ("crash", {"crash": [3]}, Status.RUNTIME, "measuring worker died"),
    ("crash-two", {"crash": [0, 26]}, Status.RUNTIME, "measuring worker died"),
    ("hang", {"hang": [5]}, Status.TIMEOUT, "no answer within"),
]


@pytest.mark.parametrize("case, faults, status, error", FAULTS, ids=[c[0] for c in FAULTS])
def test_a_crash_or_a_hang_costs_only_its_job(case, faults, status, error, jobs, replay, tmp_path):
    keyed = {k: [key(jobs[i]) for i in v] for k, v in faults.items()}
    bad = {k for v in keyed.values() for k in v}
    with runner(range(2), tmp_path, timeout_s=3.0, **keyed) as r:
        r.start()
        answers = list(r.run(jobs))
        assert not r.retired
    got = by_key(answers)
    assert set(got) == {key(j) for j in jobs}
    for j in jobs:
        a = got[key(j)]
        if key(j) in bad:
            assert a.status == status and error in a.error and a.gpu is not None
        else:
            assert same_answer(a, replay.answer(j))
    assert ran(tmp_path) == Counter({key(j): 1 for j in jobs})


def test_a_gpu_that_dies_for_good_is_retired_and_its_jobs_go_to_the_others(jobs, replay, tmp_path):
    dying = key(jobs[2])
    said: list[str] = []
    with runner(range(2), tmp_path, delay_s=0.02, die=[dying], log=said.append) as r:
        r.start()
        answers = list(r.run(jobs))
        (dead,) = r.retired
        assert "exited during start-up" in r.retired[dead]
        assert said == [
            f"CUDA device {dead} retired for the rest of the build "
            f"({r.retired[dead]}); GPUs left to measure on: 1"
        ]
        again = list(r.run(jobs[3:7]))  # a later batch: the survivor alone
    got = by_key(answers)
    assert set(got) == {key(j) for j in jobs}
    assert got[dying].status == Status.RUNTIME and "died" in got[dying].error
    for j in jobs:
        if key(j) != dying:
            assert same_answer(got[key(j)], replay.answer(j))
    # the dead GPU's job after the death was never run there: re-queued, run once
    assert ran(tmp_path) - Counter(key(j) for j in jobs[3:7]) == Counter(key(j) for j in jobs)
    assert {a.gpu.index for a in again} == {1 - dead}
    assert all(same_answer(a, replay.answer(a.job)) for a in again)


@pytest.mark.parametrize("n", [1, 3])
def test_every_gpu_dead_answers_what_is_left_at_once(n, jobs, tmp_path):
    """Every job kills the GPU that runs it: each GPU dies on its first job, and the
    jobs no GPU is left for are answered at once, each once, never hanging."""
    started = time.monotonic()
    with runner(range(n), tmp_path, die=[key(j) for j in jobs]) as r:
        r.start()
        answers = list(r.run(jobs))
        assert sorted(r.retired) == list(range(n))
        late = list(r.run(jobs[:2]))
    assert time.monotonic() - started < 60
    got = by_key(answers)
    assert set(got) == {key(j) for j in jobs}
    assert all(a.status == Status.RUNTIME for a in answers + late)
    died = [a for a in answers if "measuring worker died" in a.error]
    left = [a for a in answers if "no GPU left to run it" in a.error]
    assert len(died) == n and len(left) == len(jobs) - n
    assert all("no GPU left" in a.error for a in late)
    assert ran(tmp_path) == Counter(key(a.job) for a in died)  # nothing run twice


def test_a_gpu_whose_worker_never_starts_is_named_at_start(tmp_path):
    r = runner(range(3), tmp_path, dead=[1])
    with pytest.raises(WorkerError, match="CUDA device 1") as e:
        r.start()
    assert "CUDA device 0" not in str(e.value)
    assert all(p.pid is None for p in r.pools)  # the others were closed


def test_stopping_early_runs_nothing_more(jobs, tmp_path):
    with runner(range(2), tmp_path, delay_s=0.05) as r:
        r.start()
        answers = r.run(jobs)
        taken = []
        for _ in range(3):  # a slow caller (the pipeline's budget check between answers)
            taken.append(next(answers))
            time.sleep(0.3)
        answers.close()  # the caller stops: the two running finish, nothing else starts
        time.sleep(0.5)
        runs = sum(ran(tmp_path).values())
    assert len(taken) == 3
    assert 3 <= runs <= 3 + 2, runs  # at most one job per GPU ahead of the caller
    assert sum(ran(tmp_path).values()) == runs


# -- one GPU model per build ------------------------------------------------------------
H200 = "NVIDIA H200"
FLEETS = [
    # id, models per device, interchangeable groups, refused with (None: accepted)
    ("same-model", {}, [], None),
    ("mixed-refused", {1: H200}, [], "different models"),
    ("mixed-other-group", {1: H200}, [[H200, "NVIDIA H20"]], "different models"),
    ("mixed-interchangeable", {1: H200}, [[H100, H200]], None),
    ("mixed-cublaslt", {}, [], "cuBLASLt versions"),
]


@pytest.mark.parametrize("case, models, groups, refused", FLEETS, ids=[f[0] for f in FLEETS])
def test_gpus_of_different_models_are_refused_unless_interchangeable(
    case, models, groups, refused, jobs, tmp_path
):
    faults = {"models": models}
    if case == "mixed-cublaslt":
        faults["cublaslt"] = {1: 1}
    worker = functools.partial(host_workers.replay_worker, db=DB, faults=faults)
    r = HostRunner([0, 1], 30, interchangeable=groups, worker=worker, needs_cubins=False)
    if refused:
        with pytest.raises(FleetError, match=refused):
            r.start()
        assert all(p.pid is None for p in r.pools)
        return
    with r:
        gpu = r.start()
        answers = list(r.run(jobs[:8]))
    assert gpu.name == H100
    # every answer stands for the first GPU's model, tagged with the GPU that gave it
    assert {a.gpu.name for a in answers} == {H100}
    assert {a.gpu.index for a in answers} <= {0, 1}


# -- sanitizer and profile jobs: spread over the GPUs -----------------------------------
def test_sanitizer_and_profile_jobs_are_spread_over_the_gpus(recorded, replay):
    kernels = [m for m in recorded if m.design is not None][:10]
    checks = [job_for(JobKind.SANITIZE, m, "") for m in kernels]
    profiles = [job_for(JobKind.PROFILE, m, "") for m in kernels[:5]]
    seen: list[tuple[str, int]] = []

    def memcheck(job, timeout_s, device):
        seen.append(("sanitizer", device))
        return JobResult(job, Status.OK)

    def profile(share, device):
        seen.append(("profile", device))
        return [replay.answer(j) for j in share]

    worker = functools.partial(host_workers.replay_worker, db=DB, faults={})
    with HostRunner(
        [0, 1, 2], 30, worker=worker, memcheck=memcheck, profile=profile, needs_cubins=False
    ) as r:
        r.start()
        answers = list(r.run(checks + profiles))
    assert Counter(d for k, d in seen if k == "sanitizer") == {0: 4, 1: 3, 2: 3}
    assert sorted(d for k, d in seen if k == "profile") == [0, 1, 2]  # one ncu run per GPU
    assert sorted(key(a.job) + a.job.kind for a in answers) == sorted(
        key(j) + j.kind for j in checks + profiles
    )
    assert all(a.gpu is not None for a in answers)


# -- a whole build ----------------------------------------------------------------------
MANIFEST = """
[package]
name = "host_runner_test"
version = "0.1.0"

[build]
dtypes = ["fp16"]
layouts = ["tn", "nn"]

[search]
proposer = "grid"
candidates = 4
rounds = 2
profile_top = 1

[[targets]]
shapes = [[1, 4096, 4096], [100, 1000, 1000]]
"""


class CleanChecks(ReplayRunner):
    """The replay, standing in for the GPU's compute-sanitizer too: a check without a
    recorded failure is clean (as tests/pipeline/test_loop.py's)."""

    def answer(self, job):
        res = super().answer(job)
        if job.kind == JobKind.SANITIZE and not res.recorded:
            return JobResult(job, Status.OK)
        return res


class Killed(Exception):
    """A build killed mid-round."""


class KilledAfter:
    """A runner that dies (as a killed build does) after ``n`` answers of its first run."""

    def __init__(self, inner: HostRunner, n: int):
        self.inner, self.n = inner, n
        self.name, self.needs_cubins = inner.name, inner.needs_cubins

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run(self, jobs):
        for i, a in enumerate(self.inner.run(jobs)):
            if i == self.n:
                raise Killed
            yield a

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.inner.close()


def recorded_space(recorded):
    by_target: dict[Target, dict[str, KernelDesign]] = {}
    for m in recorded:
        if m.design is not None:
            by_target.setdefault(m.target, {})[m.design_key] = m.design
    return lambda t: sorted(by_target.get(t, {}).values())


def build(tmp: Path, recorded, runner_, name: str) -> tuple[Build, object]:
    (tmp / "m.toml").write_text(MANIFEST)
    m = load_manifest(tmp / "m.toml")
    out = tmp / name
    out.mkdir(exist_ok=True)
    b = Build(
        m,
        tmp / f"{name}.jsonl",
        ArtifactCache(tmp / "cache"),
        out,
        runner=runner_,
        proposer=GridProposer(space=recorded_space(recorded)),
        native=False,
        log=io.StringIO(),
    )
    return b, b.run


def host_build_runner(recorded, tmp, n, **faults) -> HostRunner:
    clean = CleanChecks(recorded)
    worker = functools.partial(
        host_workers.replay_worker, db=DB, faults={"state": str(tmp), "delay_s": 0.01, **faults}
    )
    return HostRunner(
        list(range(n)),
        30,
        worker=worker,
        memcheck=lambda job, timeout_s, device: clean.answer(job),
        profile=lambda share, device: [clean.answer(j) for j in share],
        needs_cubins=False,
    )


def comparable(ms: list[Measurement]) -> list[str]:
    """Records without their time stamps and GPU tags, in a fixed order."""
    out = []
    for m in ms:
        d = m.as_json()
        d.pop("measured_at")
        d["gpu"] = {k: v for k, v in d["gpu"].items() if k not in ("index", "host")}
        out.append(repr(sorted(d.items())))
    return sorted(out)


def untimed(table: DispatchTable) -> DispatchTable:
    """The table without when its winners were measured (this build's clock)."""
    entries = tuple(dataclasses.replace(e, measured_at="") for e in table.entries)
    return dataclasses.replace(table, measured_from=None, measured_to=None, entries=entries)


@pytest.fixture(scope="module")
def one_gpu_build(recorded, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replay-build")
    b, run = build(tmp, recorded, CleanChecks(recorded), "replay")
    report = run()
    return MeasurementDB(b.db.path).read(), report


@pytest.mark.parametrize("n", [1, 4])
def test_a_build_through_the_host_runner_equals_one_through_one_gpu(
    n, recorded, one_gpu_build, tmp_path
):
    expected, expected_report = one_gpu_build
    b, run = build(tmp_path, recorded, host_build_runner(recorded, tmp_path, n), "host")
    report = run()
    got = MeasurementDB(b.db.path).read()
    assert len(got) == len(expected) and comparable(got) == comparable(expected)
    assert {m.gpu.index for m in got} <= set(range(n)) and all(m.gpu.host for m in got)
    assert untimed(report.table) == untimed(expected_report.table)
    assert report.measured == expected_report.measured and report.measured > 0
    # every measure / cublaslt job was run once, by one worker
    assert max(ran(tmp_path).values()) == 1
    # the measure stage split by the answers' job seconds (the pools' round trips: the
    # stand-in reports none), each at least its 10 ms; a replay runs no worker: no split
    split = report.stages.split
    assert expected_report.stages.split is None
    assert split.jobs == report.measured - sum(m.is_vendor for m in got)
    assert split.in_jobs_s >= 0.01 * split.jobs
    assert "  in the jobs" in report.stages.table()
    assert report.stages.stages["record"] > 0  # the pipeline's own work on the answers


class Preparing(CleanChecks):
    """The replay, remembering what the build asked it to prepare (and when)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.calls: list[tuple] = []
        self.started = False

    def start(self):
        self.started = True
        return super().start()

    def prepare(self, targets, timing):
        self.calls.append((list(targets), timing, self.started))


def test_a_build_asks_its_runner_once_to_prepare_its_targets(recorded, tmp_path):
    """Once started, before any job: every target of the GPU's arch, in manifest order,
    with the timing its jobs will carry."""
    r = Preparing(recorded)
    b, run = build(tmp_path, recorded, r, "prep")
    run()
    ((targets, timing, started),) = r.calls
    assert started and targets == [t for t in b.manifest.targets if t.arch == r.gpu.arch]
    assert len(targets) == 4
    assert timing == TimingConfig(mode=b.manifest.timing_mode, seed=b.manifest.search.seed)


def test_a_killed_build_resumed_measures_each_job_once(recorded, one_gpu_build, tmp_path):
    expected, _ = one_gpu_build
    first = KilledAfter(host_build_runner(recorded, tmp_path, 2), 5)
    _, run = build(tmp_path, recorded, first, "host")
    with pytest.raises(Killed):
        run()
    db = tmp_path / "host.jsonl"
    before = MeasurementDB(db).read()
    runs_before = ran(tmp_path)
    assert 5 <= len(before) < len(expected)
    b, run = build(tmp_path, recorded, host_build_runner(recorded, tmp_path, 2), "host")
    run()
    after = MeasurementDB(b.db.path).read()
    assert comparable(after) == comparable(expected)  # each record once, none lost
    reuse = Counter(m.reuse_key for m in after)
    assert max(reuse.values()) == 1
    # the resumed build ran nothing the killed one had recorded; at most the jobs in
    # flight when it died (one per GPU) ran twice
    recorded_first = {host_workers.job_key(_job_of(m)) for m in before}
    runs_after = ran(tmp_path) - runs_before
    assert not recorded_first & set(runs_after)
    twice = [k for k, v in ran(tmp_path).items() if v > 1]
    assert len(twice) <= 2, twice


def _job_of(m: Measurement) -> Job:
    """The job whose answer is ``m`` (a cuBLASLt autotuning: of its target, library
    version and mode, as the build makes it)."""
    if m.is_vendor:
        return Job(JobKind.AUTOTUNE, m.target, TimingConfig(mode=m.mode), m.toolchain)
    return job_for(JobKind.MEASURE, m, "")


def test_a_worker_killed_while_idle_costs_no_job(jobs, replay, tmp_path):
    """A worker killed between jobs (``kill -9`` from outside, as ci/gpu_host_runner.sh
    does) is replaced before the next job is sent: no job is charged with its death."""
    import os
    import signal

    with runner(range(2), tmp_path) as r:
        r.start()
        first = list(r.run(jobs[:4]))
        victim = r.pools[1].pid
        os.kill(victim, signal.SIGKILL)
        r.pools[1]._proc.join(10)
        answers = list(r.run(jobs[4:]))
        assert not r.retired and r.pools[1].pid != victim
    assert all(same_answer(a, replay.answer(a.job)) for a in first + answers)
    assert ran(tmp_path) == Counter({key(j): 1 for j in jobs})
