"""Where a build's seconds go (``pipeline.stages``), and the build keeping the GPU busy:
a round's jobs handed to the runner as their cubins finish, the runner started while the
proposer loads and the first round compiles, and each round's results observed in one
fixed order whichever job the runner answered first.

The builds replay the densely measured H100 hold-out corpus
(bench/results/h100-corpus-holdout.measurements.jsonl.gz, as tests/pipeline/test_loop.py);
the clock tests use a fake clock.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
import random
import shutil
import threading
import time
from pathlib import Path

import pytest

from cudal2.generator.compile import ArtifactCache
from cudal2.manifest import load_manifest
from cudal2.pipeline import build as build_mod
from cudal2.pipeline.build import STAGES_LINE, Build, BuildError, rendered
from cudal2.pipeline.stages import GPU_STAGES, STAGES, StageClock, StageTimes
from cudal2.policy import GridProposer
from cudal2.records import JobKind, Measurement
from cudal2.verify.replay import ReplayRunner

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "results" / "h100-corpus-holdout.measurements.jsonl.gz"
MANIFEST = ROOT / "bench" / "manifests" / "corpus-holdout-h100.toml"

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="artifact keys need nvcc")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the clock ---------------------------------------------------------------------------
def test_an_inner_stage_pauses_the_outer_one_and_the_wall_counts_from_the_start():
    t = FakeClock()
    clock = StageClock(t)
    with clock.stage("measure"):
        t.now += 2.0
        with clock.stage("wait for cubins"):
            t.now += 3.0
        t.now += 1.0
    with clock.stage("profile"):
        t.now += 4.0
    t.now += 0.5  # in no stage
    times = clock.times(targets=2)
    assert times.stages["measure"] == 3.0
    assert times.stages["wait for cubins"] == 3.0
    assert times.stages["profile"] == 4.0
    assert set(times.stages) == set(STAGES)
    assert times.wall_s == 10.5
    assert times.gpu_busy_s == 7.0  # measure + profile: the wait for cubins is idle
    assert times.gpu_idle_s == 3.5
    assert times.targets_per_gpu_hour == pytest.approx(2 * 3600 / 10.5)


def test_stages_of_two_threads_overlap_and_sum_to_more_than_the_wall():
    t = FakeClock()
    clock = StageClock(t)
    entered, leave = threading.Event(), threading.Event()

    def compile_() -> None:
        with clock.stage("compile"):
            entered.set()
            leave.wait()

    thread = threading.Thread(target=compile_)
    thread.start()
    entered.wait()
    with clock.stage("measure"):
        t.now += 5.0
    leave.set()
    thread.join()
    times = clock.times(targets=1)
    assert times.stages["compile"] == times.stages["measure"] == 5.0
    assert times.busy_s == 10.0 > times.wall_s == 5.0
    assert "stages overlap" in times.table()


def test_a_shared_stage_counts_overlapping_spans_of_threads_once():
    t = FakeClock()
    clock = StageClock(t)
    with clock.shared("compile"):  # [0, 2) alone, [2, 5) beside another, [5, 6) that one
        t.now += 2.0
        with clock.shared("compile"):  # as a second pool thread would
            t.now += 3.0
        t.now += 0.0
    t.now += 4.0  # no compile running
    with clock.shared("compile"):
        t.now += 1.0
    assert clock.times(1).stages["compile"] == 6.0  # 2 + 3 + 1, not 2 + 3 + 3 + 1
    with pytest.raises(ValueError, match="unknown build stage"), clock.shared("compiles"):
        pass


def test_timed_counts_the_wait_for_each_item_and_closes_what_it_stopped():
    t = FakeClock()
    clock = StageClock(t)
    closed = []

    def answers():
        try:
            for i in range(3):
                t.now += 1.0  # the GPU's time for one answer
                yield i
        finally:
            closed.append(True)

    for i in clock.timed(answers(), "autotune"):
        t.now += 10.0  # the caller's own time: not the runner's
        if i == 1:
            break
    assert clock.times(1).stages["autotune"] == 2.0
    assert closed == [True]


@pytest.mark.parametrize("name", ["", "compiling", "Measure", "gpu"])
def test_an_unknown_stage_is_refused(name):
    with pytest.raises(ValueError, match="unknown build stage"), StageClock().stage(name):
        pass


def test_the_table_names_every_stage_and_the_json_round_trips(tmp_path):
    times = StageTimes({s: float(i) for i, s in enumerate(STAGES)}, wall_s=120.0, targets=24)
    table = times.table()
    for s in STAGES:
        assert s in table
    assert "GPU busy" in table and "GPU idle" in table and "targets per GPU-hour" in table
    path = tmp_path / "stages.json"
    times.write(path)
    back = StageTimes.from_json(json.loads(path.read_text()))
    assert back == times
    data = json.loads(path.read_text())
    assert data["gpu_busy_s"] == sum(STAGES.index(s) for s in GPU_STAGES)
    assert data["targets_per_gpu_hour"] == 720.0
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temporary file


def test_the_measure_stage_is_split_by_the_answers_job_seconds(tmp_path):
    """The worker's jobs and the rest of the measure stage's wait, in the table and the
    JSON; answers without job seconds (a replay) count in neither; the pipeline's own
    work on the answers is "record", not "measure"."""
    t = FakeClock()
    clock = StageClock(t)
    for job_s in (0.05, None, 0.07):
        with clock.stage("measure"):
            t.now += 0.1
        clock.measured(job_s)
        with clock.stage("record"):
            t.now += 0.01
    times = clock.times(targets=1)
    assert times.stages["measure"] == pytest.approx(0.3)
    assert times.stages["record"] == pytest.approx(0.03)
    assert (times.split.jobs, times.split.in_jobs_s) == (2, pytest.approx(0.12))
    assert times.as_json()["measure_split"] == {"jobs": 2, "in_jobs_s": 0.12, "outside_s": 0.18}
    table = times.table().splitlines()
    at = next(i for i, line in enumerate(table) if line.startswith("measure "))
    assert table[at + 1].split()[:4] == ["in", "the", "jobs", "0.1"]
    assert "(2 jobs, 60 ms each)" in table[at + 1]
    assert table[at + 2].split()[:3] == ["outside", "them", "0.2"]
    assert table[at + 3].startswith("record ")
    path = tmp_path / "stages.json"
    times.write(path)
    assert StageTimes.from_json(json.loads(path.read_text())).as_json() == times.as_json()
    # jobs that overlap the recording (a runner that ran ahead): nothing outside them
    ahead = dataclasses.replace(times, split=dataclasses.replace(times.split, in_jobs_s=0.5))
    assert ahead.as_json()["measure_split"]["outside_s"] == 0.0


def test_the_committed_stage_tables_read_back_without_a_split():
    """The H100 runs recorded before the split (bench/results/h100-build-stages.json)
    read back as they were: no split rows, and no "record" seconds."""
    d = json.loads((ROOT / "bench" / "results" / "h100-build-stages.json").read_text())
    for run in ("after", "after2"):
        times = StageTimes.from_json(d[run]["stages"])
        assert times.split is None and times.stages.get("record", 0.0) == 0.0
        assert "in the jobs" not in times.table()
        assert times.gpu_busy_s == pytest.approx(d[run]["stages"]["gpu_busy_s"], abs=0.01)


# -- builds over recorded measurements ---------------------------------------------------
@pytest.fixture(scope="module")
def recorded() -> list[Measurement]:
    with gzip.open(DATA, "rt") as f:
        return [Measurement.from_json(json.loads(line)) for line in f]


def _space(recorded):
    by_target: dict = {}
    for m in recorded:
        if m.design is not None:
            by_target.setdefault(m.target, {})[m.design_key] = m.design
    return lambda t: sorted(by_target.get(t, {}).values())


def _manifest(which=(0, 7, 9), rounds=2, candidates=6, profile_top=1, profile_lag=0):
    """Profiles read by the next round (lag 1's background ncu: test_profile_lag.py)."""
    m = load_manifest(MANIFEST)
    search = dataclasses.replace(
        m.search,
        proposer="grid",
        rounds=rounds,
        candidates=candidates,
        profile_top=profile_top,
        profile_lag=profile_lag,
    )
    return dataclasses.replace(m, search=search, targets=[m.targets[i] for i in which])


class Shuffled(ReplayRunner):
    """The replay runner answering each ``run`` in a seeded random order (as workers on
    several GPUs finish), after taking all its jobs (seed None: in order)."""

    def __init__(self, *args, seed: int | None = None, **kw):
        super().__init__(*args, **kw)
        self.rng = None if seed is None else random.Random(seed)

    def run(self, jobs):
        jobs = list(jobs)
        if self.rng is not None:
            self.rng.shuffle(jobs)
        for job in jobs:
            yield self.answer(job)


class OrderSensitive:
    """Grid proposals, shifted by a digest of the history *in the order given*: a
    stand-in for the policy, whose prompt and update depend on the order it is shown
    the results. Records what it proposed and observed."""

    name = "grid"

    def __init__(self, space):
        self.grid = GridProposer(space=space)
        self.proposed: list = []
        self.observed: list = []

    def propose(self, target, history, n):
        pool = self.grid.propose(target, history, 2 * n)
        order = "".join(f"{x.target.key}{x.design_key}" for x in history)
        shift = int(hashlib.sha256(order.encode()).hexdigest()[:8], 16) % max(1, len(pool) - n)
        out = pool[shift : shift + n]
        self.proposed.append((target, [d.key for d in out]))
        return out

    def observe(self, measurements):
        self.observed.append([(x.target, x.design_key, x.metrics.get("dram") is not None)
                              for x in measurements])  # fmt: skip
        return None


def _replay_build(tmp_path, recorded, seed, manifest=None):
    m = manifest or _manifest()
    runner = Shuffled(recorded, name="the corpus hold-out", seed=seed)
    proposer = OrderSensitive(_space(recorded))
    cache = ArtifactCache(tmp_path / "cache")
    b = Build(m, tmp_path / "db.jsonl", cache, tmp_path / "out", runner=runner,
              proposer=proposer, log=io.StringIO(), native=False,
              stages_json=tmp_path / "stages.json")  # fmt: skip
    return b, proposer, b.run()


def _entries(table):
    """The table's entries, but when their records were written (this build's clock)."""
    return [dataclasses.replace(e, measured_at="") for e in table.entries]


@needs_nvcc
def test_a_runner_answering_in_any_order_gives_the_same_search_and_table(tmp_path, recorded):
    b0, in_order, report0 = _replay_build(tmp_path / "in-order", recorded, seed=None)
    assert len(in_order.observed) == 2 and all(in_order.observed)
    assert report0.measured > 0
    for seed in (1, 2):
        b, shuffled, report = _replay_build(tmp_path / f"shuffled-{seed}", recorded, seed=seed)
        assert shuffled.observed == in_order.observed
        assert shuffled.proposed == in_order.proposed
        # the runner did answer in another order: the database's lines show it
        got = [(x.target, x.design_key) for x in b.db.read() if x.design is not None]
        want = [(x.target, x.design_key) for x in b0.db.read() if x.design is not None]
        assert got != want and sorted(got) == sorted(want)
        assert _entries(report.table) == _entries(report0.table)
        assert [s.winner.design_key if s.winner else None for s in report.selections] == [
            s.winner.design_key if s.winner else None for s in report0.selections
        ]


@needs_nvcc
def test_the_build_reports_its_stages_in_the_log_the_report_and_beside_the_wheel(
    tmp_path, recorded
):
    b, _, report = _replay_build(tmp_path, recorded, seed=None)
    times = report.stages
    assert times is not None and set(times.stages) == set(STAGES)
    assert times.targets == 3
    # three threads at most: the build's, the runner's start, the compile
    assert 0 < times.busy_s <= 3 * times.wall_s
    for s in ("start-up", "propose", "measure", "profile", "policy update", "autotune",
              "select", "package"):  # fmt: skip
        assert times.stages[s] > 0, s
    assert times.gpu_busy_s + times.gpu_idle_s == pytest.approx(times.wall_s)
    log = b.log.getvalue()
    assert "where the build's seconds went" in log
    assert all(s in log for s in STAGES) and "targets per GPU-hour" in log
    assert json.loads((tmp_path / "stages.json").read_text()) == times.as_json()
    (line,) = [ln for ln in log.splitlines() if ln.startswith(STAGES_LINE)]
    assert StageTimes.from_json(json.loads(line[len(STAGES_LINE) :])).wall_s == pytest.approx(
        times.wall_s, abs=1e-3
    )
    assert [p.suffix for p in (tmp_path / "out").iterdir()] == [".whl"]  # the wheel alone


class SlowCompiles(Shuffled):
    """A runner that needs cubins and compiles them itself (``compile``, the Ray
    runner's contract), ``delay_s`` per design, in order; it records when each design
    finished compiling and when each measure job reached it."""

    needs_cubins = True

    def __init__(self, *args, delay_s: float = 0.02, start_s: float = 0.0, **kw):
        super().__init__(*args, **kw)
        self.delay_s, self.start_s = delay_s, start_s
        self.compiled: dict[str, float] = {}
        self.arrived: dict[str, float] = {}
        self.started_at = self.proposed_at = 0.0

    def start(self):
        time.sleep(self.start_s)
        self.started_at = time.monotonic()
        return super().start()

    def compile(self, designs, cache, jobs=None, on_done=None):
        out = {}
        for d in designs:
            time.sleep(self.delay_s)
            out[d.key] = rendered(d)
            self.compiled[d.key] = time.monotonic()
            if on_done is not None:
                on_done(out[d.key])
        return out

    def run(self, jobs):
        for job in jobs:
            if job.kind == JobKind.MEASURE:
                self.arrived[job.design.key] = time.monotonic()
            yield self.answer(job)


@pytest.fixture
def no_cubins(monkeypatch):
    """The fake compile writes no cubin: the job names a path nobody opens."""
    monkeypatch.setattr(build_mod, "checked_cubin_path", lambda d, c, key: Path(f"/x/{key}"))


@needs_nvcc
def test_a_rounds_jobs_reach_the_runner_while_it_still_compiles(tmp_path, recorded, no_cubins):
    runner = SlowCompiles(recorded, name="the corpus hold-out", delay_s=0.05)
    m = _manifest(rounds=1, candidates=8, profile_top=0)
    b = Build(m, tmp_path / "db.jsonl", ArtifactCache(tmp_path / "c"), tmp_path, runner=runner,
              proposer=GridProposer(space=_space(recorded)), log=io.StringIO())  # fmt: skip
    b.measure_and_select()
    assert runner.arrived and len(runner.compiled) > 4
    # each job after its own cubin, and the first long before the last cubin
    assert all(runner.arrived[k] >= runner.compiled[k] for k in runner.arrived)
    assert min(runner.arrived.values()) < max(runner.compiled.values()) - 0.1
    assert b.counts["compiled"] == len(runner.compiled)
    times = b.clock.times(len(m.targets))
    # the seconds with any compile running: the designs' delays over the pool's workers
    workers = os.cpu_count() or 1
    assert times.stages["compile"] >= 0.05 * len(runner.compiled) / workers


class Sees:
    """A grid proposer taking ``slow_s`` per target, noting when each proposal was
    asked for (the first also on the runner)."""

    name = "grid"

    def __init__(self, space, runner, slow_s=0.0):
        self.grid, self.runner, self.slow_s = GridProposer(space=space), runner, slow_s
        self.asked: list[float] = []

    def propose(self, target, history, n):
        self.asked.append(time.monotonic())
        if not self.runner.proposed_at:
            self.runner.proposed_at = self.asked[0]
        time.sleep(self.slow_s)
        return self.grid.propose(target, history, n)

    def observe(self, measurements):
        return None


def _slow_start_build(tmp_path, recorded, monkeypatch, smi_name, host=False):
    """A runner that takes 0.5 s to start, on one GPU of this host (``device = 0``, as a
    LocalRunner), or (``host``) on a HostRunner's ``devices = [1, 0]`` under
    ``CUDA_VISIBLE_DEVICES=3,2`` (its first GPU: physical 2); nvidia-smi (faked) names
    that GPU ``smi_name`` and every other GPU an A100."""
    runner = SlowCompiles(recorded, name="the corpus hold-out", delay_s=0.0, start_s=0.5)
    other = ("NVIDIA A100-SXM4-80GB", "sm_80")
    if host:
        runner.devices = [1, 0]
        models = [other, other, (smi_name, runner.gpu.arch), other]
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2")
    else:
        runner.device = 0
        models = [(smi_name, runner.gpu.arch), other]
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(build_mod, "gpu_models", lambda: models)
    m = _manifest(rounds=1, candidates=2, profile_top=0)
    b = Build(m, tmp_path / "db.jsonl", ArtifactCache(tmp_path / "c"), tmp_path, runner=runner,
              proposer=Sees(_space(recorded), runner), log=io.StringIO())  # fmt: skip
    return b, runner


@needs_nvcc
@pytest.mark.parametrize("host", [False, True], ids=["local", "host"])
def test_the_runner_starts_while_the_first_round_is_proposed(
    tmp_path, recorded, no_cubins, monkeypatch, host
):
    b, runner = _slow_start_build(tmp_path, recorded, monkeypatch, "NVIDIA H100 80GB HBM3", host)
    b.measure_and_select()
    assert runner.gpu.name == "NVIDIA H100 80GB HBM3"
    assert 0 < runner.proposed_at < runner.started_at
    times = b.clock.times(3)
    assert times.stages["runner start"] >= 0.5
    assert "measuring with" in b.log.getvalue()


@needs_nvcc
@pytest.mark.parametrize("host", [False, True], ids=["local", "host"])
def test_a_gpu_other_than_nvidia_smi_named_stops_the_build(
    tmp_path, recorded, no_cubins, monkeypatch, host
):
    b, _ = _slow_start_build(tmp_path, recorded, monkeypatch, "NVIDIA H200", host)
    with pytest.raises(BuildError, match="nvidia-smi named NVIDIA H200"):
        b.measure_and_select()


H100_SMI, H200_SMI, A100_SMI = (
    ("NVIDIA H100 80GB HBM3", "sm_90a"),
    ("NVIDIA H200", "sm_90a"),
    ("NVIDIA A100-SXM4-80GB", "sm_80"),
)
SMI = [H100_SMI, H200_SMI, A100_SMI]  # nvidia-smi's rows: physical GPUs 0, 1, 2
EXPECTED = [
    # (runner's attributes, CUDA_VISIBLE_DEVICES (None: unset), nvidia-smi's models, expected)
    pytest.param({"device": 1}, None, SMI, H200_SMI, id="local"),
    pytest.param({"device": 1}, "2,0", SMI, H100_SMI, id="local-visible"),
    pytest.param({"devices": [0]}, None, SMI, H100_SMI, id="host-one"),
    pytest.param({"devices": [2, 0, 1]}, None, SMI, A100_SMI, id="host-first-of-three"),
    pytest.param({"devices": (1,)}, None, SMI, H200_SMI, id="host-tuple"),
    pytest.param({"devices": [1, 0]}, "2,1", SMI, H200_SMI, id="host-visible-indices"),
    pytest.param({"devices": [0]}, " 1 , 2 ", SMI, H200_SMI, id="host-visible-spaces"),
    pytest.param({"devices": [0]}, "GPU-8f2e1c3a,GPU-77d1", SMI, None, id="host-uuids"),
    pytest.param({"devices": [1]}, "0,GPU-77d1", SMI, None, id="host-uuid-second"),
    pytest.param({"devices": [0]}, "MIG-5c1d2b9e", SMI, None, id="host-mig"),
    pytest.param({"devices": [0]}, "", SMI, None, id="host-none-visible"),
    pytest.param({"devices": [1]}, "2", SMI, None, id="host-past-visible"),
    pytest.param({"devices": [3]}, None, SMI, None, id="host-past-nvidia-smi"),
    pytest.param({"devices": [0]}, None, [], None, id="nvidia-smi-cannot-say"),
    pytest.param({"devices": []}, None, SMI, None, id="host-no-devices"),
    pytest.param({"devices": [-1]}, None, SMI, None, id="host-negative"),
    pytest.param({"devices": [True]}, None, SMI, None, id="host-bool"),
    pytest.param({"devices": "0"}, None, SMI, None, id="host-devices-a-string"),
    pytest.param({}, None, SMI, None, id="a-cluster"),
    pytest.param({"devices": [0], "needs_cubins": False}, None, SMI, None, id="a-replay"),
]


@pytest.mark.parametrize("attrs, visible, models, expected", EXPECTED)
def test_the_gpu_model_expected_before_the_runner_starts(
    tmp_path, recorded, monkeypatch, attrs, visible, models, expected
):
    """What ``_expected_gpu`` reads of a runner before its start: a LocalRunner's
    ``device`` or a HostRunner's first ``devices`` entry, mapped to nvidia-smi's
    numbering through ``CUDA_VISIBLE_DEVICES``; None (wait for the start) wherever the
    mapping or nvidia-smi cannot say."""
    import types

    monkeypatch.setattr(build_mod, "gpu_models", lambda: models)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    b = Build(_manifest(rounds=1), tmp_path / "db.jsonl", ArtifactCache(tmp_path / "c"),
              tmp_path, runner=ReplayRunner(recorded), log=io.StringIO())  # fmt: skip
    runner = types.SimpleNamespace(**{"needs_cubins": True, **attrs})
    assert b._expected_gpu(runner) == expected


def test_a_host_runners_devices_are_what_the_build_reads(tmp_path, recorded, monkeypatch):
    """The attribute read is the real HostRunner's (not started: no worker is spawned)."""
    from cudal2.verify.host import HostRunner

    monkeypatch.setattr(build_mod, "gpu_models", lambda: SMI)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2,0")
    b = Build(_manifest(rounds=1), tmp_path / "db.jsonl", ArtifactCache(tmp_path / "c"),
              tmp_path, runner=ReplayRunner(recorded), log=io.StringIO())  # fmt: skip
    host = HostRunner([2, 0], needs_cubins=True)
    assert b._expected_gpu(host) == H100_SMI  # its device 2: physical GPU 0
    assert b._expected_gpu(HostRunner([1], needs_cubins=False)) is None  # answers by key


@pytest.mark.parametrize(
    "attrs, hint",
    [
        ({"device": 1}, "choose the GPU with --device"),
        ({"devices": [1]}, "choose the GPU with [runner] devices"),
    ],
)
def test_a_runner_on_another_gpu_than_proposed_for_is_refused(tmp_path, recorded, attrs, hint):
    """The runner started on a GPU model other than the one nvidia-smi named (which the
    proposals were made for): a BuildError naming both and the setting that chose it."""
    import types
    from concurrent.futures import Future

    from cudal2.pipeline.build import BuildError
    from cudal2.records import GpuInfo

    b = Build(_manifest(rounds=1), tmp_path / "db.jsonl", ArtifactCache(tmp_path / "c"),
              tmp_path, runner=ReplayRunner(recorded), log=io.StringIO())  # fmt: skip
    runner = types.SimpleNamespace(name="the runner", **attrs)
    started: Future = Future()
    started.set_result(GpuInfo("NVIDIA H200", "sm_90a", 132, "580", "13.0"))
    assert b._started(runner, started, ("NVIDIA H200", "sm_90a")).name == "NVIDIA H200"
    with pytest.raises(BuildError, match="H100") as got:
        b._started(runner, started, ("NVIDIA H100 80GB HBM3", "sm_90a"))
    assert "measures on NVIDIA H200" in str(got.value) and hint in str(got.value)


def _slowly_proposed(tmp_path, recorded, candidates: int, jobs: int):
    """A one-round build of three targets whose proposer takes 0.3 s a target and whose
    compiles take none: (the runner, the proposer) after it."""
    runner = SlowCompiles(recorded, name="the corpus hold-out", delay_s=0.0)
    proposer = Sees(_space(recorded), runner, slow_s=0.3)
    m = _manifest(rounds=1, candidates=candidates, profile_top=0)
    b = Build(m, tmp_path / "db.jsonl", ArtifactCache(tmp_path / "c"), tmp_path, runner=runner,
              proposer=proposer, log=io.StringIO(), jobs=jobs)  # fmt: skip
    b.measure_and_select()
    return runner, proposer


@needs_nvcc
def test_the_first_targets_are_measured_while_later_ones_are_proposed(
    tmp_path, recorded, no_cubins
):
    runner, proposer = _slowly_proposed(tmp_path, recorded, candidates=8, jobs=2)
    assert len(proposer.asked) == 3
    # the first target's 8 designs compiled as proposed; its jobs run meanwhile
    assert min(runner.arrived.values()) < proposer.asked[-1]
    assert len(runner.arrived) == len(runner.compiled)


@needs_nvcc
def test_a_targets_designs_are_compiled_and_measured_before_the_next_is_proposed(
    tmp_path, recorded, no_cubins
):
    """One new design a target (a late round's pattern: most of its candidates were
    built in earlier rounds) and many cores: each target's cubin is compiled and
    measured while the next target is proposed, not held back until enough new designs
    fill every core (the chunks before issue 23's fourth slice held all three)."""
    runner, proposer = _slowly_proposed(tmp_path, recorded, candidates=1, jobs=8)
    assert len(proposer.asked) == len(runner.arrived) == 3
    arrived = sorted(runner.arrived.values())
    # target i's job while target i + 1 is proposed (asked at i's end, 0.3 s each)
    assert arrived[0] < proposer.asked[2] and arrived[1] < proposer.asked[2] + 0.3
