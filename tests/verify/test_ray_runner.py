"""The Ray runner on CPU: a local Ray head with fake GPUs (``num_gpus=3``: Ray sets each
actor's ``CUDA_VISIBLE_DEVICES``), its actors answering from the replay runner over
the H100 database recorded for the default manifest (manifests/default.measurements.jsonl).

The head starts once for the module (a few seconds on 2 cores). Each test makes its
own ``RayRunner``, which joins that head (it then leaves it running at ``close``).
What is checked: every job answered exactly once, tagged with the fake GPU that answered
it; an actor killed mid-batch (``ray.kill``) costs nothing (its job goes to another);
a hung actor is killed and a job that hangs two is answered ``timeout``; every actor
lost answers the rest ``runtime``, never a hang; a caller that stops starts nothing
more; a job stream is read as actors free up, never drained ahead (an actor killed
while it blocks, a stream that raises, a caller that stops: no reader thread left);
mixed GPU models are refused unless interchangeable; cubins travel by artifact key,
checked (bytes corrupted in flight are never launched); compile tasks fill the
artifact cache as ``build_all`` does; and a whole build through Ray, an actor killed in
its first batch, writes the same records and the same dispatch table as a build on the
replay runner directly.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip(
    "ray", reason="Ray is the optional extra cudal2[ray] (.ci/run installs it with the tests)"
)

from cudal2.database import MeasurementDB  # noqa: E402
from cudal2.generator.compile import ArtifactCache, build_all  # noqa: E402
from cudal2.manifest import default_manifest_path, load_manifest  # noqa: E402
from cudal2.pipeline.build import Build  # noqa: E402
from cudal2.pipeline.results import job_for  # noqa: E402
from cudal2.records import BuildResult, JobKind, Status, sha256_hex  # noqa: E402
from cudal2.verify.fleet import FleetError  # noqa: E402
from cudal2.verify.ray_runner import RayRunner, RayUnavailableError  # noqa: E402
from cudal2.verify.replay import ReplayRunner  # noqa: E402

GPUS = 3
DB = default_manifest_path().with_name("default.measurements.jsonl")
H100 = "NVIDIA H100 80GB HBM3"
NEEDS_NVCC = pytest.mark.skipif(shutil.which("nvcc") is None, reason="artifact keys need nvcc")


class FakeGpuRunner:
    """An actor's inner runner: the replay runner over ``DB``, as if on a GPU. The GPU
    it reports is the replayed one, renamed per fake GPU index (``models``); each job
    takes ``delay_s`` (``delays``: by fake GPU index); the job of ``key()`` ``hang``
    never returns; where ``launched`` names
    a folder, each job launched leaves a file there holding the sha256 of its cubin."""

    def __init__(self, spec: Fake):
        self.spec = spec
        self.replay = ReplayRunner.from_database(spec.db)
        self.needs_cubins = spec.needs_cubins
        self.name = "a fake GPU (replayed H100 answers)"

    @property
    def cublaslt_version(self):
        return self.spec.cublaslt.get(self.index, self.replay.cublaslt_version)

    def start(self):
        gpu = self.replay.start()
        self.index = int(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0])
        return dataclasses.replace(gpu, name=self.spec.models.get(self.index, gpu.name), index=0)

    def designs(self, target):
        return self.replay.designs(target)

    def run(self, jobs):
        for job in jobs:
            if self.spec.hang == key(job):
                time.sleep(3600)
            time.sleep(self.spec.delays.get(self.index, self.spec.delay_s))
            if self.spec.launched:
                seen = sha256_hex(Path(job.cubin).read_bytes()) if job.cubin else ""
                name = f"{job.artifact_key[:16]}-{job.kind}-{os.getpid()}-{time.monotonic_ns()}"
                Path(self.spec.launched, name).write_text(seen)
            yield self.replay.answer(job)

    def close(self):
        pass


@dataclasses.dataclass(frozen=True)
class Fake:
    """The picklable factory of ``FakeGpuRunner`` (what ``actor_runner`` is given)."""

    db: str = str(DB)
    delay_s: float = 0.0
    delays: dict[int, float] = dataclasses.field(default_factory=dict)  # by fake GPU index
    models: dict[int, str] = dataclasses.field(default_factory=dict)
    cublaslt: dict[int, int] = dataclasses.field(default_factory=dict)
    needs_cubins: bool = False
    launched: str = ""
    hang: tuple = ()  # the key() of the job that hangs

    def __call__(self) -> FakeGpuRunner:
        return FakeGpuRunner(self)


@pytest.fixture(scope="module")
def cluster():
    """One local Ray head with ``GPUS`` fake GPUs for the module; this module's
    classes travel to the actors by value (the workers cannot import a test file)."""
    old = os.environ.get("RAY_USAGE_STATS_ENABLED")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(
        address="local",  # a head of its own, even where this host runs another Ray
        num_gpus=GPUS,
        num_cpus=GPUS + 3,
        include_dashboard=False,
        object_store_memory=96 << 20,
        log_to_driver=False,
    )
    yield
    ray.shutdown()
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    if old is None:
        os.environ.pop("RAY_USAGE_STATS_ENABLED", None)
    else:
        os.environ["RAY_USAGE_STATS_ENABLED"] = old


@pytest.fixture
def free(cluster):
    """Every fake GPU free again (a killed actor's GPU returns to Ray a moment later)."""
    deadline = time.monotonic() + 30
    while ray.available_resources().get("GPU", 0) < GPUS:
        assert time.monotonic() < deadline, "the fake GPUs did not come back to Ray"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def recorded():
    return MeasurementDB(DB).load().measurements


def measure_jobs(recorded, n: int, cubin: str = ""):
    """``n`` measure jobs of recorded kernels (distinct reuse keys), in file order."""
    kernels = [m for m in recorded if m.design is not None][:n]
    return [job_for(JobKind.MEASURE, m, cubin) for m in kernels]


def key(job):
    return (job.target.key, job.artifact_key, job.kind)


def once(answers, jobs):
    """Each job answered exactly once (and nothing else answered)."""
    assert Counter(key(a.job) for a in answers) == Counter(key(j) for j in jobs)


def runner(log: list[str] | None = None, **kw) -> RayRunner:
    kw.setdefault("actor_runner", Fake())
    return RayRunner(log=(log.append if log is not None else lambda _: None), **kw)


# -- tags, answers -------------------------------------------------------------------
def test_each_answer_tagged_with_its_fake_gpu_and_equal_to_the_replay(free, recorded):
    jobs = measure_jobs(recorded, 24)
    replay = ReplayRunner.from_database(DB)
    with runner(actor_runner=Fake(delay_s=0.02)) as r:
        gpu = r.start()
        assert (gpu.name, r.cublaslt_version) == (H100, replay.cublaslt_version)
        assert not r.needs_cubins  # a replay inside needs none: the pipeline renders only
        assert r.designs(jobs[0].target) == replay.designs(jobs[0].target)
        answers = list(r.run(jobs))
    once(answers, jobs)
    tags = {(a.gpu.name, a.gpu.host, a.gpu.index) for a in answers}
    assert tags == {(H100, socket.gethostname(), i) for i in range(GPUS)}  # each GPU worked
    for a in answers:
        assert dataclasses.replace(a, gpu=None) == replay.answer(a.job)


# -- lost actors -----------------------------------------------------------------------
def test_an_actor_killed_mid_batch_loses_no_job_and_answers_none_twice(free, recorded):
    jobs = measure_jobs(recorded, 40)
    said: list[str] = []
    with runner(said, actor_runner=Fake(delay_s=0.05)) as r:
        r.start()
        answers, killed = [], None
        for a in r.run(jobs):
            answers.append(a)
            if len(answers) == 4:  # every actor has a job in flight now
                killed = a.gpu.index
                victim = next(x for x in r._actors if x.gpu.index == killed)
                ray.kill(victim.handle)
        assert len(r.actors) == GPUS - 1
    once(answers, jobs)
    assert all(a.status == Status.OK for a in answers)
    assert len(r.losses) == 1 and "died" in r.losses[0], r.losses
    assert any("lost the actor" in s for s in said)
    # after the loss, only the others answer
    late = {a.gpu.index for a in answers[8:]}
    assert killed not in late and len(late) == GPUS - 1


def test_every_actor_lost_answers_the_rest_runtime_never_hangs(free, recorded):
    jobs = measure_jobs(recorded, 20)
    with runner(actor_runner=Fake(delay_s=0.05)) as r:
        r.start()
        answers = []
        for a in r.run(jobs):
            answers.append(a)
            if len(answers) == 2:
                for h in r.actors:
                    ray.kill(h)
    once(answers, jobs)
    lost = [a for a in answers if a.status == Status.RUNTIME]
    assert lost and all("every Ray actor was lost" in a.error for a in lost)
    assert len(lost) == len(jobs) - sum(a.status == Status.OK for a in answers)


def test_a_hung_actor_is_killed_and_a_job_that_hangs_two_is_answered_timeout(free, recorded):
    jobs = measure_jobs(recorded, 9)
    fake = Fake(delay_s=0.02, hang=key(jobs[4]))
    with runner(actor_runner=fake, job_timeout_s=0.5, grace_s=0.5) as r:
        r.start()
        answers = list(r.run(jobs))
        assert len(r.actors) == GPUS - 2  # the two it hung, killed
    once(answers, jobs)
    (hung,) = [a for a in answers if a.job == jobs[4]]
    assert hung.status == Status.TIMEOUT and "hung 2 Ray actors" in hung.error
    assert all(a.status == Status.OK for a in answers if a is not hung)


def test_a_caller_that_stops_starts_nothing_more(free, recorded, tmp_path):
    jobs = measure_jobs(recorded, 30)
    fake = Fake(delay_s=0.1, launched=str(tmp_path))
    with runner(actor_runner=fake) as r:
        r.start()
        it = r.run(jobs)
        first = [next(it), next(it)]
        it.close()
        time.sleep(0.5)  # the calls in flight finish unheard
        started = len(list(tmp_path.iterdir()))
        assert started <= len(first) + GPUS  # two answered + one in flight per actor
        # the runner goes on: a later batch is answered whole
        again = list(r.run(jobs[:6]))
    once(again, jobs[:6])


# -- the fleet ---------------------------------------------------------------------------
H200 = "NVIDIA H200"
FLEETS = [
    # (models by fake GPU index, interchangeable, error expected (a fragment) or None)
    pytest.param({}, (), None, id="one-model"),
    pytest.param({1: H200}, (), "different models", id="h100-h200-refused"),
    pytest.param({1: H200}, [(H100, H200)], None, id="h100-h200-interchangeable"),
    pytest.param({1: H200}, [(H100, "NVIDIA A100")], "different models", id="another-group"),
    pytest.param({}, (), "different cuBLASLt versions", id="two-cublaslt-versions"),
]


@pytest.mark.parametrize("models, interchangeable, error", FLEETS)
def test_mixed_models_refused_unless_interchangeable(
    free, recorded, models, interchangeable, error
):
    cublaslt = {2: 1} if "cuBLASLt" in (error or "") else {}
    fake = Fake(models=models, cublaslt=cublaslt)
    r = runner(actor_runner=fake, interchangeable=interchangeable)
    with r:
        if error:
            with pytest.raises(FleetError, match=error):
                r.start()
            assert r.actors == []  # refused: the actors are gone, their GPUs back to Ray
            return
        assert r.start().name == H100
        answers = list(r.run(measure_jobs(recorded, 9)))
    # recorded as the model start() returned, each keeping its own index and host
    assert {a.gpu.name for a in answers} == {H100}
    assert {a.gpu.index for a in answers} == set(range(GPUS))


# -- cubins by content key --------------------------------------------------------------
class Corrupting(RayRunner):
    """Flips the last byte of every cubin on its way into the object store."""

    def _in_flight(self, data: bytes) -> bytes:
        return data[:-1] + bytes([data[-1] ^ 1])


def _cache_with(tmp_path, jobs) -> ArtifactCache:
    """An artifact cache holding a cubin (stand-in bytes) for each job's artifact key,
    entered as a compile enters it (its sha256 recorded)."""
    cache = ArtifactCache(tmp_path / "cache")
    for j in jobs:
        data = f"cubin of {j.artifact_key}".encode() * 64
        res = BuildResult(
            j.design.key, j.artifact_key, True, j.symbol, cubin_sha256=sha256_hex(data),
            cubin_size=len(data),
        )  # fmt: skip
        cache.put(res, "// source", data)
    return cache


def _tamper_entry(cache, job):
    cache.cubin_path(job.artifact_key).write_bytes(b"not the cubin that was compiled")


SHIPPING = [
    # (what is wrong, runner class, change to the cache, answer expected (status, fragment))
    pytest.param(None, RayRunner, None, (Status.OK, ""), id="sound"),
    pytest.param("in flight", Corrupting, None, (Status.RUNTIME, "arrived as"), id="in-flight"),
    pytest.param(
        "on disk", RayRunner, _tamper_entry, (Status.RUNTIME, "cannot be shipped"), id="on-disk"
    ),
]


@pytest.mark.parametrize("wrong, cls, change, expected", SHIPPING)
def test_cubins_travel_by_key_checked_and_a_bad_one_never_launches(
    free, recorded, tmp_path, wrong, cls, change, expected
):
    jobs = measure_jobs(recorded, 6)
    cache = _cache_with(tmp_path, jobs)
    launched = tmp_path / "launched"
    launched.mkdir()
    with_cubins = [
        dataclasses.replace(j, cubin=str(cache.cubin_path(j.artifact_key))) for j in jobs
    ]
    want = {j.artifact_key: sha256_hex(cache.cubin(j.artifact_key)) for j in jobs}
    if change:
        change(cache, with_cubins[0])
    fake = Fake(needs_cubins=True, launched=str(launched))
    with cls(actor_runner=fake, log=lambda _: None) as r:
        r.start()
        assert r.needs_cubins
        answers = list(r.run(with_cubins + with_cubins))  # twice: shipped once per key
    assert len(answers) == 2 * len(jobs)
    status, fragment = expected
    bad = [a for a in answers if a.status != Status.OK]
    if wrong is None:
        assert not bad
        runs = {p.name[:16]: p.read_text() for p in launched.iterdir()}
        assert len(list(launched.iterdir())) == 2 * len(jobs)
        assert runs == {k[:16]: sha for k, sha in want.items()}  # the bytes compiled
        return
    hit = bad if wrong == "in flight" else [a for a in bad if a.job == with_cubins[0]]
    assert hit and all(a.status == status and fragment in a.error for a in hit), bad
    launched_keys = {p.name[:16] for p in launched.iterdir()}
    assert not {a.job.artifact_key[:16] for a in hit} & launched_keys  # never launched
    if wrong == "on disk":
        assert len(bad) == 2 and len(launched_keys) == len(jobs) - 1
        assert list((cache.root / "quarantine").iterdir())  # the broken entry, set aside


HOSTILE_KEYS = [
    # artifact keys that must never become a path in an actor's cubin folder
    "../../etc",
    "a/b",
    ".hidden",
    "k" * 129,
]


def test_an_artifact_key_that_cannot_name_a_file_is_refused(free, recorded, tmp_path):
    """One runner for the whole table (an actor start costs seconds on 2 cores)."""
    cubin = tmp_path / "fixture.cubin"
    cubin.write_bytes(b"a hand-written fixture kernel")
    base = measure_jobs(recorded, 1)[0]
    jobs = [dataclasses.replace(base, artifact_key=k, cubin=str(cubin)) for k in HOSTILE_KEYS]
    with runner(actor_runner=Fake(needs_cubins=True)) as r:
        r.start()
        answers = {a.job.artifact_key: a for a in r.run(jobs)}
    assert sorted(answers) == sorted(HOSTILE_KEYS)
    for k, a in answers.items():
        assert a.status == Status.RUNTIME and "cannot name a file" in a.error, k


# -- compiling as Ray tasks ----------------------------------------------------------------
@NEEDS_NVCC
def test_compile_tasks_fill_the_cache_as_build_all_does(free, recorded, tmp_path):
    designs = list({m.design.key: m.design for m in recorded if m.design is not None}.values())
    designs = designs[:2]
    local, remote = ArtifactCache(tmp_path / "local"), ArtifactCache(tmp_path / "ray")
    expected = build_all(designs, local, jobs=2)
    done = []
    r = runner()
    got = r.compile(designs + designs[:1], remote, jobs=2, on_done=done.append)
    assert got == expected and sorted(x.design_key for x in done) == sorted(expected)
    for res in expected.values():
        a, b = local.entry(res.artifact_key), remote.entry(res.artifact_key)
        assert sorted(p.name for p in b.iterdir()) == sorted(p.name for p in a.iterdir())
        for p in a.iterdir():
            assert (b / p.name).read_bytes() == p.read_bytes(), p.name
    # compiled already: answered from the cache, no task
    again = r.compile(designs, remote)
    assert again == expected
    r.close()


# -- a whole build ---------------------------------------------------------------------------
class KillingOne(RayRunner):
    """From the 3rd answer of its first batch on, kills the first actor that has
    answered and holds a job in flight (the fault the issue asks for: a lost actor
    mid-batch, inside a real build). The jobs come from the build's stream, so an actor
    may be idle, waiting for a cubin: one holding a job is chosen."""

    killed = False

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.holding: dict[int, tuple] = {}  # fake GPU index -> the job it was sent last
        self.answered_by: set[int] = set()

    def _send(self, ray_, actor, job):
        self.holding[actor.gpu.index] = key(job)
        return super()._send(ray_, actor, job)

    def run(self, jobs):
        for n, a in enumerate(super().run(jobs), 1):
            if self.holding.get(a.gpu.index) == key(a.job):
                del self.holding[a.gpu.index]
            self.answered_by.add(a.gpu.index)
            yield a
            busy = [i for i in self.holding if i in self.answered_by]
            if n >= 3 and busy and not self.killed:
                KillingOne.killed = True
                (victim,) = [x for x in self._actors if x.gpu.index == busy[0]]
                ray.kill(victim.handle)


def _records(path: Path):
    """What a build wrote, without what differs run to run (time stamps) or by who
    answered (the GPU's tag), in a fixed order."""
    out = []
    for m in MeasurementDB(path).load().measurements:
        d = m.as_json()
        d.pop("measured_at")
        d["gpu"].pop("index", None)
        d["gpu"].pop("host", None)
        out.append(d)
    return sorted(out, key=lambda d: json.dumps(d, sort_keys=True))


@NEEDS_NVCC
def test_a_build_through_ray_with_an_actor_killed_equals_a_one_gpu_build(
    free, tmp_path, artifact_cache
):
    m = load_manifest(default_manifest_path())
    m = dataclasses.replace(
        m,
        targets=m.targets[:6],
        search=dataclasses.replace(m.search, candidates=6, profile_top=0),
    )
    one = tmp_path / "one"
    KillingOne.killed = False
    built = {}
    for name, make in (
        ("one", lambda: ReplayRunner.from_database(DB)),
        ("ray", lambda: KillingOne(actor_runner=Fake(delay_s=0.01), log=lambda _: None)),
    ):
        out = tmp_path / name
        run = make()
        b = Build(m, out / "db.jsonl", artifact_cache, out, runner=run, log=io.StringIO())
        built[name] = (b.run(), out, run)
    assert KillingOne.killed and len(built["ray"][2].losses) == 1
    (one_report, _, _), (ray_report, ray_out, _) = built["one"], built["ray"]
    ray_records = MeasurementDB(ray_out / "db.jsonl").load().measurements
    keys = Counter(x.reuse_key for x in ray_records)
    assert keys and max(keys.values()) == 1  # every record exactly once
    assert _records(ray_out / "db.jsonl") == _records(one / "db.jsonl")
    tags = {(x.gpu.host, x.gpu.index) for x in ray_records if x.gpu.index is not None}
    assert len(tags) == GPUS  # answered by every fake GPU, the killed one included
    assert _table(ray_report.table) == _table(one_report.table)


def _table(table):
    """A dispatch table without its time stamps (when its records were measured)."""
    d = table.as_json()
    found = [d.pop(k, None) for k in ("measured_from", "measured_to")]
    assert all(found), "the table's time stamps are named otherwise now: update this"
    for e in d["entries"]:
        e.pop("measured_at")
    return d


def test_a_call_abandoned_on_a_hung_actor_is_killed_at_its_deadline(free, recorded):
    jobs = measure_jobs(recorded, 12)
    fake = Fake(delay_s=0.05, hang=key(jobs[0]))
    with runner(actor_runner=fake, job_timeout_s=0.5, grace_s=0.5) as r:
        r.start()
        it = r.run(jobs)
        next(it)  # another job's answer: the hung one is still in flight
        it.close()
        time.sleep(1.5)  # past the hung call's deadline (0.5 + 0.5 s after it was sent)
        later = list(r.run(jobs[1:]))
        assert len(r.actors) == GPUS - 1
        assert all(a.status == Status.OK for a in later)
    once(later, jobs[1:])
    assert r.losses == ["no answer to an abandoned job by its deadline"]


# -- starting --------------------------------------------------------------------------
def test_ray_is_imported_only_when_a_ray_runner_starts():
    code = "import sys, cudal2.verify.ray_runner; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def _no_ray(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError


def _gpus_taken(monkeypatch):
    holder = runner()
    holder.start()  # every fake GPU held by another build
    monkeypatch.setattr(sys.modules[__name__], "_holder", holder, raising=False)


STARTS = [
    # (how the start is broken, error type, fragment of its message)
    pytest.param(_no_ray, RayUnavailableError, "pip install 'cudal2\\[ray\\]'", id="no-ray"),
    pytest.param(_gpus_taken, FleetError, "has no free GPU", id="no-free-gpu"),
]


@pytest.mark.parametrize("breaks, error, fragment", STARTS)
def test_a_start_that_cannot_be_refuses_clearly(free, monkeypatch, breaks, error, fragment):
    breaks(monkeypatch)
    try:
        with runner() as r, pytest.raises(error, match=fragment):
            r.start()
    finally:
        holder = getattr(sys.modules[__name__], "_holder", None)
        if holder is not None:
            holder.close()


def test_a_shipped_cubin_changed_on_the_actors_disk_is_fetched_again(free, recorded, tmp_path):
    jobs = measure_jobs(recorded, 3)
    cache = _cache_with(tmp_path, jobs)
    jobs = [dataclasses.replace(j, cubin=str(cache.cubin_path(j.artifact_key))) for j in jobs]
    launched = tmp_path / "launched"
    launched.mkdir()
    with runner(actor_runner=Fake(needs_cubins=True, launched=str(launched))) as r:
        r.start()
        assert all(a.status == Status.OK for a in r.run(jobs))
        folders = ray.get([h.__ray_call__.remote(lambda a: str(a.folder)) for h in r.actors])
        shipped = [p for f in folders for p in Path(f).rglob("kernel.cubin")]
        assert shipped
        for p in shipped:
            p.write_bytes(b"changed on the actor's disk after its check")
        for p in launched.iterdir():
            p.unlink()
        assert all(a.status == Status.OK for a in r.run(jobs + jobs))
    want = {sha256_hex(cache.cubin(j.artifact_key)) for j in jobs}
    assert {p.read_text() for p in launched.iterdir()} == want  # the compiled bytes ran


# -- a job stream, read as the actors free up (issue 23: measuring overlaps compiling) --------
class Recording(RayRunner):
    """Notes each job as it is sent to an actor (the actor's fake GPU index with it)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.sent: list[tuple[tuple, int]] = []

    def _send(self, ray_, actor, job):
        self.sent.append((key(job), actor.gpu.index))
        return super()._send(ray_, actor, job)


def recording(**kw) -> Recording:
    kw.setdefault("actor_runner", Fake())
    return Recording(log=lambda _: None, **kw)


def readers() -> list:
    """The Ray runner's job-reading threads still alive."""
    import threading

    return [t for t in threading.enumerate() if t.name == "ray-job-reader" and t.is_alive()]


def test_the_job_stream_is_read_as_actors_free_up_not_drained_first(free, recorded):
    """When job i is read, at least i - GPUS jobs were sent and i - 2 x GPUS answers
    taken: one job read ahead per idle actor, one in flight per busy one. (Reading the
    whole stream before the first send, as a ``deque(jobs)`` does, fails both.)"""
    jobs = measure_jobs(recorded, 24)
    answers: list = []
    at_read: list[tuple[int, int]] = []  # (jobs sent, answers taken) when job i was read
    with recording(actor_runner=Fake(delay_s=0.05)) as r:
        r.start()

        def stream():
            for j in jobs:
                at_read.append((len(r.sent), len(answers)))
                yield j

        for a in r.run(stream()):
            answers.append(a)
    once(answers, jobs)
    for i, (sent, taken) in enumerate(at_read):
        assert sent >= i - GPUS, (i, at_read)
        assert taken >= i - 2 * GPUS, (i, at_read)
    assert not readers()


def test_an_actor_killed_while_the_stream_blocks_has_its_job_answered_once(free, recorded):
    """Fake GPU 0 takes 5 s a job, the others 0.05 s. When the stream is asked for job
    GPUS + 2, GPU 0 still holds the first job: its actor is killed and the stream's
    next() then blocks 1.5 s (a slow compile). The loop does not wait on the stream: the
    lost job goes to another actor and is answered during that wait, once."""
    jobs = measure_jobs(recorded, 10)
    answers: list = []
    answered_at: dict[tuple, float] = {}
    blocked: dict[str, Any] = {}
    with recording(actor_runner=Fake(delay_s=0.05, delays={0: 5.0})) as r:
        r.start()

        def stream():
            for i, j in enumerate(jobs):
                if i == GPUS + 2:
                    (held,) = [k for k, gpu in r.sent if gpu == 0]  # sent first, to GPU 0
                    assert held not in answered_at
                    (victim,) = [a for a in r._actors if a.gpu.index == 0]
                    ray.kill(victim.handle)
                    blocked.update({"held": held, "from": time.monotonic()})
                    time.sleep(1.5)
                    blocked["to"] = time.monotonic()
                yield j

        for a in r.run(stream()):
            answers.append(a)
            answered_at[key(a.job)] = time.monotonic()
        assert len(r.actors) == GPUS - 1
    once(answers, jobs)
    assert all(a.status == Status.OK for a in answers)
    assert len(r.losses) == 1 and "died" in r.losses[0], r.losses
    held = blocked["held"]
    (lost,) = [a for a in answers if key(a.job) == held]
    assert lost.gpu.index != 0  # re-queued to another actor
    assert blocked["from"] < answered_at[held] < blocked["to"]  # while the stream blocked
    assert [k for k, _ in r.sent].count(held) == 2  # sent twice, answered once
    assert not readers()


class StreamBroke(RuntimeError):
    pass


def test_an_error_raised_by_the_job_stream_reaches_the_caller(free, recorded):
    jobs = measure_jobs(recorded, 9)

    def stream():
        yield from jobs[:5]
        raise StreamBroke("the proposer failed")

    with recording(actor_runner=Fake(delay_s=0.02)) as r:
        r.start()
        answers = []
        with pytest.raises(StreamBroke, match="the proposer failed"):
            for a in r.run(stream()):
                answers.append(a)
        assert not readers()
        assert {key(a.job) for a in answers} <= {key(j) for j in jobs[:5]}
        again = list(r.run(jobs[5:]))  # the runner goes on (the calls left finish unheard)
    once(again, jobs[5:])


def test_a_caller_that_stops_leaves_no_reader_and_the_stream_unread(free, recorded):
    jobs = measure_jobs(recorded, 30)
    read: list[int] = []

    def stream():
        for i, j in enumerate(jobs):
            read.append(i)
            time.sleep(0.3)  # compiling, slower than measuring: the reader is inside next()
            yield j

    with recording(actor_runner=Fake(delay_s=0.05)) as r:
        r.start()
        it = r.run(stream())
        first = [next(it), next(it)]
        it.close()
        assert not readers()  # stopped, and joined (its next() in hand returned first)
        assert len(read) <= len(first) + 2 * GPUS  # not drained: the rest is never read
        again = list(r.run(jobs[:6]))
    once(again, jobs[:6])


def test_every_actor_lost_answers_the_unread_stream_runtime(free, recorded):
    jobs = measure_jobs(recorded, 20)
    answers: list = []
    with recording(actor_runner=Fake(delay_s=0.05)) as r:
        r.start()
        for a in r.run(iter(jobs)):
            answers.append(a)
            if len(answers) == 2:
                for h in r.actors:
                    ray.kill(h)
    once(answers, jobs)
    lost = [a for a in answers if a.status == Status.RUNTIME]
    assert lost and all("every Ray actor was lost" in a.error for a in lost)
    assert len(r.sent) < len(jobs)  # most were never sent: read only to be answered
    assert not readers()
