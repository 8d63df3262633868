"""``search.profile_lag`` (``pipeline.build``, ``pipeline.profiling.lagged_history``): with
lag 1, round r's Nsight Compute run goes on beside the policy update and round r+1's
proposing and compiling; round r+1's proposals read round r's records without any ncu
metric, and round r's profiles from round r+2 on.

Checked here: what each round's proposer is shown (exactly, and the same through the
replay, the host runner over 1 and 2 fake GPUs and the local runner over a fake worker,
however long ncu takes); that the GPU measures nothing while ncu runs, and that the
next round waits for it; the stage table; a killed build resumed (during the next
round, during ncu); which rounds are profiled (one-machine and split builds); the
manifest key.

The measuring answers are the recorded H100 database of the default manifest
(``manifests/default.measurements.jsonl``, as tests/verify/test_host.py), without the
ncu metrics some of its records carry (a GPU's measuring answer has none); the profile
answers are the ncu report recorded on the H100 (``tests/verify/data/ncu-h100-profile.json``),
one of its rows per kernel (by design key), cut to the quantities the job asks for.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cudal2.database import MeasurementDB
from cudal2.generator.compile import ArtifactCache
from cudal2.manifest import ManifestError, SearchSettings, load_manifest
from cudal2.pipeline.build import Build
from cudal2.pipeline.profiling import lagged_history, unprofiled
from cudal2.pipeline.split import export_job
from cudal2.pipeline.stages import StageClock
from cudal2.policy import GridProposer
from cudal2.records import JobKind, JobResult, KernelDesign, Measurement, Status, Target
from cudal2.verify import local as local_mod
from cudal2.verify.host import HostRunner
from cudal2.verify.local import LocalRunner
from cudal2.verify.pool import WorkerPool
from cudal2.verify.profile import METRICS, is_profiled
from cudal2.verify.replay import ReplayRunner

ROOT = Path(__file__).resolve().parents[2]
DB = str(ROOT / "manifests" / "default.measurements.jsonl")
NCU = json.loads((ROOT / "tests" / "verify" / "data" / "ncu-h100-profile.json").read_text())

sys.path.insert(0, str(ROOT / "tests" / "verify"))  # the fake workers, spawned by name
import host_workers  # noqa: E402

MANIFEST = """
[package]
name = "profile_lag_test"
version = "0.1.0"

[build]
dtypes = ["fp16"]
layouts = ["tn", "nn"]

[search]
proposer = "grid"
candidates = 3
rounds = 4
profile_top = 1
{extra}

[[targets]]
shapes = [[1, 4096, 4096], [100, 1000, 1000]]
"""


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    """The default manifest's database, its records without ncu metrics."""
    contents = MeasurementDB(DB).load(warn=False)
    path = tmp_path_factory.mktemp("db") / "measured.jsonl"
    out = MeasurementDB(path)
    out.append(unprofiled(x) for x in contents.measurements)
    out.append_checks(contents.checks)
    return str(path)


@pytest.fixture(scope="module")
def recorded(db) -> list[Measurement]:
    return MeasurementDB(db).read()


def manifest(tmp: Path, **search):
    """The test manifest; ``profile_lag`` 1 unless given (the manifest's default is 0:
    on the H100 the lag measured no faster, docs/runners.md)."""
    search.setdefault("profile_lag", 1)
    extra = "\n".join(f"{k} = {json.dumps(v)}" for k, v in search.items())
    (tmp / "m.toml").write_text(MANIFEST.format(extra=extra))
    return load_manifest(tmp / "m.toml")


def ncu_answer(job) -> JobResult:
    """Nsight Compute's answer to a profile job: a row of the recorded H100 report, chosen
    by the kernel (whichever GPU, run or order profiles it), cut to what the job asks."""
    rows = NCU["metrics"]
    row = rows[int(job.design.key[:8], 16) % len(rows)]
    asked = job.profile_metrics or tuple(METRICS)
    return JobResult(job, Status.OK, metrics={k: v for k, v in row.items() if k in asked})


class Events:
    """What happened, in order, from every thread of the test process."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.items: list[tuple] = []
        self.proposals: Counter = Counter()  # round (from 0) -> proposals made
        self.ncu_done: set[int] = set()  # rounds (from 0) whose ncu run ended

    def add(self, *item) -> None:
        with self.lock:
            self.items.append(item)

    def proposed(self, rnd: int) -> None:
        with self.lock:
            self.items.append(("propose", rnd))
            self.proposals[rnd] += 1
            self.lock.notify_all()

    def profiled(self, rnd: int) -> None:
        with self.lock:
            self.ncu_done.add(rnd)
            self.lock.notify_all()

    def wait_proposing(self, rnd: int, n: int, timeout: float) -> bool:
        """Whether round ``rnd`` (from 0) had ``n`` proposals within ``timeout`` seconds."""
        with self.lock:
            return self.lock.wait_for(lambda: self.proposals[rnd] >= n, timeout)

    def wait_profiled(self, rnd: int, timeout: float) -> bool:
        with self.lock:
            return self.lock.wait_for(lambda: rnd in self.ncu_done, timeout)


class Killed(Exception):
    """A build killed."""


class Ncu:
    """The profile answers (``ncu_answer``), with the events logged; ``hold``: each call
    waits (at most ``hold`` seconds) until the round after the one it profiles is being
    proposed for, then ``after`` seconds more (its cubins ready meanwhile): ncu slower
    than proposing. ``die_at``: the call (from 1) in which the build is killed."""

    def __init__(
        self, events: Events, hold: float = 0.0, after: float = 0.0, die_at: int | None = None
    ):
        self.events, self.hold, self.after, self.die_at = events, hold, after, die_at
        self.proposer: Recording | None = None  # which round proposed a kernel
        self.profiled: dict[int, list[str]] = {}  # round (from 0) -> the kernels profiled
        self.saw_proposing: list[bool] = []
        self.calls = 0
        self.lock = threading.Lock()

    @property
    def runs(self) -> list[list[str]]:
        """The kernels profiled, per round profiled, in round order."""
        return [sorted(self.profiled[r]) for r in sorted(self.profiled)]

    def _round(self, job) -> int:
        assert self.proposer is not None
        return max(
            r
            for r, t, keys in self.proposer.proposed
            if t == job.target.key and job.design.key in keys
        )

    def __call__(self, jobs) -> list[JobResult]:
        jobs = list(jobs)
        with self.lock:
            self.calls += 1
            if self.calls == self.die_at:
                raise Killed
        self.events.add("ncu start")
        rnd = self._round(jobs[0])
        if self.hold:
            # every target of the next round proposed for (4 targets)
            self.saw_proposing.append(self.events.wait_proposing(rnd + 1, 4, self.hold))
            time.sleep(self.after)
        with self.lock:
            self.profiled.setdefault(rnd, []).extend(j.design.key for j in jobs)
        out = [ncu_answer(j) for j in jobs]
        self.events.add("ncu end")
        self.events.profiled(rnd)
        return out


class Recording:
    """Grid proposals shifted by a digest of the history as shown, ncu metrics included
    (a stand-in for the policy, whose prompt carries them). Records what each round's
    proposals were shown and what they were. ``ncu_first``: the rounds (from 0) whose ncu
    run ends before the next round's proposing starts (their update waits for it).
    ``inner``: a proposer that proposes and observes instead (the policy)."""

    name = "grid"

    def __init__(self, space, ncu: Ncu, ncu_first: frozenset[int] = frozenset(), inner: Any = None):
        self.grid = GridProposer(space=space)
        self.inner = inner
        self.events = ncu.events
        self.ncu_first = ncu_first
        ncu.proposer = self
        self.round = 0  # rounds observed so far: the round being proposed for
        self.shown: list[tuple] = []
        self.proposed: list[tuple] = []
        self.observed: list[list[tuple]] = []

    def propose(self, target: Target, history, n: int) -> list[KernelDesign]:
        shown = tuple(
            (x.target.key, x.design_key, tuple(sorted((k, v) for k, v in x.metrics.items()
                                                       if k in METRICS)))
            for x in history
        )  # fmt: skip
        self.events.proposed(self.round)
        if self.inner is not None:
            out = self.inner.propose(target, history, n)
        else:
            pool = self.grid.propose(target, history, 2 * n)
            digest = hashlib.sha256(repr(shown).encode()).hexdigest()
            shift = int(digest[:8], 16) % max(1, len(pool) - n)
            out = pool[shift : shift + n]
        self.shown.append((self.round, target.key, shown))
        self.proposed.append((self.round, target.key, [d.key for d in out]))
        return out

    def observe(self, measurements):
        self.observed.append(
            [(x.target.key, x.design_key, is_profiled(x.metrics)) for x in measurements]
        )
        learned = None if self.inner is None else self.inner.observe(measurements)
        if self.round in self.ncu_first:
            assert self.events.wait_profiled(self.round, 20.0)
        self.round += 1
        return learned


def space_of(recorded):
    by_target: dict[Target, dict[str, KernelDesign]] = {}
    for m in recorded:
        if m.design is not None:
            by_target.setdefault(m.target, {})[m.design_key] = m.design
    return lambda t: sorted(by_target.get(t, {}).values())


class Replay(ReplayRunner):
    """The replay runner with the fake ncu, and every measure job's start and end logged."""

    def __init__(self, recorded, ncu: Ncu):
        super().__init__(recorded)
        self.ncu = ncu

    def run(self, jobs):
        profiled = []
        for job in jobs:
            if job.kind == JobKind.PROFILE:
                profiled.append(job)
                continue
            if job.kind == JobKind.SANITIZE:
                res = self.answer(job)
                yield res if res.recorded else JobResult(job, Status.OK)
                continue
            self.ncu.events.add("measure start", job.design.key if job.design else "")
            res = self.answer(job)
            self.ncu.events.add("measure end")
            yield res
        if profiled:
            yield from self.ncu(profiled)


def host(db: str, recorded, tmp: Path, n: int, ncu: Ncu) -> HostRunner:
    worker = functools.partial(
        host_workers.replay_worker, db=db, faults={"state": str(tmp), "delay_s": 0.005}
    )
    replay = ReplayRunner(recorded)

    def check(job, timeout_s, device):
        res = replay.answer(job)
        return res if res.recorded else JobResult(job, Status.OK)

    def profile(share, device):
        with open(tmp / "ran.log", "a") as f:  # beside the workers' own lines
            f.write(f"{device} ncu-start -\n")
        out = ncu(share)
        with open(tmp / "ran.log", "a") as f:
            f.write(f"{device} ncu-end -\n")
        return out

    return HostRunner(
        list(range(n)), 30, worker=worker, memcheck=check, profile=profile, needs_cubins=False
    )


def local(db: str, recorded, monkeypatch, ncu: Ncu) -> LocalRunner:
    r = LocalRunner(0, 30)
    r.pool = WorkerPool(0, 30, worker=functools.partial(host_workers.replay_worker, db=db))
    r.needs_cubins = False
    replay = ReplayRunner(recorded)

    def check(job, timeout_s, device):
        res = replay.answer(job)
        return res if res.recorded else JobResult(job, Status.OK)

    monkeypatch.setattr(local_mod, "profile_jobs", lambda jobs, device: iter(ncu(jobs)))
    monkeypatch.setattr(local_mod, "memcheck_job", check)
    return r


def build(tmp: Path, recorded, runner, proposer, name: str = "b", **search) -> Build:
    out = tmp / name
    out.mkdir(exist_ok=True)
    return Build(
        manifest(tmp, **search),
        tmp / f"{name}.jsonl",
        ArtifactCache(tmp / "cache"),
        out,
        runner=runner,
        proposer=proposer,
        native=False,
        log=io.StringIO(),
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


@pytest.fixture(scope="module")
def replayed(recorded, tmp_path_factory):
    """The lag-1 build through the replay runner, each ncu run ended before the next
    round's proposing starts."""
    tmp = tmp_path_factory.mktemp("replayed")
    ncu = Ncu(Events())
    proposer = Recording(space_of(recorded), ncu, ncu_first=frozenset({0, 1}))
    b = build(tmp, recorded, Replay(recorded, ncu), proposer)
    report = b.run()
    return b, proposer, ncu, report


# -- what each round's proposals are shown ----------------------------------------------
def test_each_round_is_shown_the_round_before_without_ncu_and_earlier_ones_with(replayed):
    b, proposer, ncu, report = replayed
    assert b.manifest.search.profile_lag == 1  # the tests' manifest's
    # 4 rounds, lag 1: rounds 1 and 2 are profiled (read by rounds 3 and 4), round 3 is
    # read by no proposal, round 4 is the last
    assert len(ncu.runs) == 2 and all(len(r) == 4 for r in ncu.runs)  # 4 targets, top 1
    log = b.log.getvalue()
    assert "round 3/4: not profiled (with search.profile_lag = 1, round 5 would" in log
    assert "round 4/4: not profiled (the last round" in log
    rounds = [[x for x in proposer.observed[r]] for r in range(4)]
    by_round: dict[int, list] = {}
    for rnd, _, shown in proposer.shown:
        by_round.setdefault(rnd, []).append(shown)
    profiled_keys = {k for run in ncu.runs for k in run}
    for rnd, shown_lists in by_round.items():
        for shown in shown_lists:
            # every record of the earlier rounds, in round and proposal order
            want = [(t, d) for r in range(rnd) for t, d, _ in rounds[r]]
            assert [(t, d) for t, d, _ in shown] == want
            with_ncu = [(r_, d) for r_ in range(rnd) for t, d, _ in rounds[r_]
                        for (tt, dd, ncu_) in shown if (tt, dd) == (t, d) and ncu_]  # fmt: skip
            # round rnd-1's records carry no ncu metric; rounds <= rnd-2 carry theirs
            assert {r_ for r_, _ in with_ncu} <= set(range(rnd - 1))
            if rnd >= 2:
                assert {d for r_, d in with_ncu if r_ == 0} == set(ncu.runs[0])
            if rnd >= 3:
                assert {d for r_, d in with_ncu if r_ == 1} == set(ncu.runs[1])
    # every proposal of round 3 and 4 was shown round 1's profiles; none of round 2's
    assert len(by_round) == 4 and all(by_round[3]) and all(by_round[2])
    assert profiled_keys  # (the ncu answers did reach the database)
    enriched = [x for x in b.db.read() if is_profiled(x.metrics)]
    assert {x.design_key for x in enriched} >= profiled_keys
    # the policy update reads each round as the next round's proposals do: no ncu
    assert not any(p for r in proposer.observed for _, _, p in r)


def test_with_lag_0_each_round_is_shown_every_earlier_profile(recorded, tmp_path):
    ncu = Ncu(Events())
    proposer = Recording(space_of(recorded), ncu)
    b = build(tmp_path, recorded, Replay(recorded, ncu), proposer, profile_lag=0)
    b.run()
    assert len(ncu.runs) == 3  # rounds 1-3; the last not
    assert b.log.getvalue().count("not profiled") == 1
    for rnd, _, shown in proposer.shown:
        seen = {d for _, d, metrics in shown if metrics}
        assert seen >= {k for run in ncu.runs[:rnd] for k in run}
    assert [sum(p for _, _, p in r) >= 4 for r in proposer.observed] == [True] * 3 + [False]


@pytest.mark.parametrize("how", ["ncu slower than proposing", "host 1", "host 2", "local"])
def test_the_same_records_show_the_same_proposals_whatever_ran_them(
    how, db, recorded, replayed, tmp_path, monkeypatch
):
    """The replay with each ncu run ended before the next round's proposing (the module's
    build) against: ncu held until every target of the next round is proposed for (it
    ends after them), the host runner over 1 and 2 fake GPUs, the local runner over a
    fake worker."""
    b0, expected, _, report0 = replayed
    ncu = Ncu(Events(), hold=20.0, after=0.1) if how.startswith("ncu") else Ncu(Events())
    proposer = Recording(space_of(recorded), ncu)
    if how.startswith("ncu"):
        runner = Replay(recorded, ncu)
    elif how.startswith("host"):
        runner = host(db, recorded, tmp_path, int(how.split()[1]), ncu)
    else:
        runner = local(db, recorded, monkeypatch, ncu)
    b = build(tmp_path, recorded, runner, proposer)
    report = b.run()
    if ncu.hold:
        assert ncu.saw_proposing == [True, True]  # it did end after them
    assert proposer.shown == expected.shown
    assert proposer.proposed == expected.proposed
    assert proposer.observed == expected.observed
    assert comparable(b.db.read()) == comparable(b0.db.read())
    assert [s.winner.design_key if s.winner else None for s in report.selections] == [
        s.winner.design_key if s.winner else None for s in report0.selections
    ]


# -- ncu beside the next round's proposing, never beside measuring ----------------------
def test_ncu_runs_beside_the_next_rounds_proposing_and_measuring_waits_for_it(recorded, tmp_path):
    ncu = Ncu(Events(), hold=20.0, after=0.3)  # the next round's cubins ready before it ends
    proposer = Recording(space_of(recorded), ncu)
    events = ncu.events
    b = build(tmp_path, recorded, Replay(recorded, ncu), proposer)
    report = b.run()
    assert ncu.saw_proposing == [True, True]
    items = events.items
    starts = [i for i, e in enumerate(items) if e[0] == "ncu start"]
    ends = [i for i, e in enumerate(items) if e[0] == "ncu end"]
    assert len(starts) == len(ends) == 2
    for s, e in zip(starts, ends, strict=True):
        inside = items[s:e]
        assert not [x for x in inside if x[0].startswith("measure")]  # the GPU idle
        assert ("propose", len([x for x in starts if x <= s])) in inside  # the next round
        # the next measure job started only after ncu ended
        nxt = next(i for i in range(e, len(items)) if items[i][0] == "measure start")
        assert nxt > e
    times = report.stages
    assert "profile" in times.overlapped and times.stages["wait for profile"] >= 0.3 * 2 * 0.9
    table = times.table()
    assert any(ln.startswith("profile") and "(background)" in ln for ln in table.splitlines())


def test_with_lag_0_ncu_runs_alone_between_the_rounds(recorded, tmp_path):
    ncu = Ncu(Events(), hold=0.5)
    proposer = Recording(space_of(recorded), ncu)
    b = build(tmp_path, recorded, Replay(recorded, ncu), proposer, profile_lag=0)
    report = b.run()
    assert ncu.saw_proposing == [False, False, False]  # nothing proposed while it ran
    assert "profile" not in report.stages.overlapped
    assert report.stages.stages["wait for profile"] == 0


def test_through_the_host_runner_no_kernel_is_measured_while_ncu_runs(db, recorded, tmp_path):
    ncu = Ncu(Events(), hold=5.0, after=0.2)
    proposer = Recording(space_of(recorded), ncu)
    b = build(tmp_path, recorded, host(db, recorded, tmp_path, 2, ncu), proposer)
    b.run()
    lines = [ln.split(" ", 2)[1] for ln in (tmp_path / "ran.log").read_text().splitlines()]
    # one ncu run per GPU and profiled round, each ending after the next round's proposing
    assert lines.count("ncu-start") == 4 and ncu.saw_proposing == [True] * 4
    inside = False
    for kind in lines:
        if kind == "ncu-start":
            inside = True
        elif kind == "ncu-end":
            inside = False
        else:
            assert not (inside and kind in ("measure", "autotune")), lines


# -- resuming ------------------------------------------------------------------------------
class KillAt(Replay):
    """The replay, killed at its ``n``-th measure answer."""

    def __init__(self, recorded, ncu: Ncu, n: int | None = None):
        super().__init__(recorded, ncu)
        self.n, self.measured = n, 0

    def run(self, jobs):
        for res in super().run(jobs):
            if res.job.kind == JobKind.MEASURE:
                self.measured += 1
                if self.measured == self.n:
                    raise Killed
            yield res


@pytest.mark.parametrize("where", ["round 3 measuring", "round 2's ncu"])
def test_a_killed_build_resumed_proposes_the_same_and_profiles_nothing_twice(
    where, recorded, replayed, tmp_path
):
    b0, expected, ncu0, _ = replayed
    ncu = Ncu(Events(), die_at=None if where == "round 3 measuring" else 2)
    first = KillAt(recorded, ncu, n=2 * 12 + 5 if where == "round 3 measuring" else None)
    b = build(tmp_path, recorded, first, Recording(space_of(recorded), ncu))
    with pytest.raises(Killed):
        b.run()
    before = MeasurementDB(b.db.path).read()
    profiled_before = {x.design_key for x in before if is_profiled(x.metrics)}
    assert profiled_before == set(ncu0.runs[0]) | (
        set(ncu0.runs[1]) if where == "round 3 measuring" else set()
    )
    ncu2 = Ncu(Events())
    proposer = Recording(space_of(recorded), ncu2)
    b2 = build(tmp_path, recorded, Replay(recorded, ncu2), proposer)
    b2.run()
    # nothing profiled again; what the killed build had not profiled, profiled now
    assert ncu2.runs == ([] if where == "round 3 measuring" else [ncu0.runs[1]])
    assert proposer.shown == expected.shown and proposer.proposed == expected.proposed
    after = MeasurementDB(b2.db.path).read()
    assert comparable(after) == comparable(b0.db.read())  # none lost, none twice
    assert max(Counter((x.reuse_key, is_profiled(x.metrics)) for x in after).values()) == 1


# -- which rounds are profiled -------------------------------------------------------------
@pytest.mark.parametrize(
    "rounds, lag, last, want",
    [
        (4, 0, False, [True, True, True, False]),
        (4, 1, False, [True, True, False, False]),
        (4, 1, True, [True, True, True, True]),
        (2, 1, False, [False, False]),
        (1, 0, False, [False]),
        (1, 1, True, [True]),
    ],
)
def test_a_round_is_profiled_where_a_later_proposal_reads_it(rounds, lag, last, want):
    s = SearchSettings(rounds=rounds, profile_lag=lag, profile_last_round=last)
    assert [s.profiled(r) for r in range(rounds)] == want


def test_lagged_history_and_unprofiled(recorded):
    base = next(m for m in recorded if m.design is not None and m.metrics)

    def rec(key: str, ncu: bool) -> Measurement:
        metrics = {k: v for k, v in base.metrics.items() if k not in METRICS}
        if ncu:
            metrics |= NCU["metrics"][0]
        return dataclasses.replace(base, design_key=key, metrics=metrics)

    r1 = [rec("a", False), rec("b", False)]
    r1p = [rec("a", True), rec("b", False)]
    r2 = [rec("c", True)]  # a record reused with a profile on record: shown without it
    assert lagged_history([], [], 1) == []
    assert lagged_history([r1], [None], 1) == r1
    assert lagged_history([r1, r2], [r1p, None], 1) == r1p + [unprofiled(r2[0])]
    assert lagged_history([r1, r2], [r1p, r2], 0) == r1p + r2
    with pytest.raises(RuntimeError, match="round 1's profiles are read before"):
        lagged_history([r1], [None], 0)
    x = rec("d", True)
    assert is_profiled(x.metrics) and not is_profiled(unprofiled(x).metrics)
    assert {k: v for k, v in x.metrics.items() if k not in METRICS} == unprofiled(x).metrics
    plain = rec("e", False)
    assert unprofiled(plain) is plain


def test_the_stage_clock_marks_a_stage_run_in_the_background():
    clock = StageClock()
    assert "profile" not in clock.times(1).overlapped
    clock.background("profile")
    times = clock.times(1)
    assert times.overlapped == ("runner start", "propose", "compile", "profile")
    assert "profile" in times.as_json()["overlapped"]
    with pytest.raises(ValueError, match="unknown build stage 'ncu'"):
        clock.background("ncu")


# -- the manifest key ----------------------------------------------------------------------
@pytest.mark.parametrize("value", [2, -1, True, '"1"', 1.0, "[1]"])
def test_a_profile_lag_other_than_0_or_1_is_refused_by_name(value, tmp_path):
    text = MANIFEST.format(extra=f"profile_lag = {json.dumps(value) if value is True else value}")
    (tmp_path / "m.toml").write_text(text)
    with pytest.raises(ManifestError) as e:
        load_manifest(tmp_path / "m.toml")
    assert e.value.key_path == "search.profile_lag"


@pytest.mark.parametrize("rounds, lag, top", [(2, 1, 0), (2, 0, 1), (3, 1, 1)])
def test_a_split_build_asks_for_round_1s_profiles_where_a_proposal_reads_them(
    rounds, lag, top, recorded, tmp_path
):
    """The first job exported (round 1) asks the GPU for profiles as a one-machine build
    profiles that round: not where no proposal would read them."""
    m = manifest(tmp_path, profile_lag=lag)
    m = dataclasses.replace(m, search=dataclasses.replace(m.search, rounds=rounds))
    gpu = recorded[0].gpu.name
    job = export_job(
        m, tmp_path / "db.jsonl", ArtifactCache(tmp_path / "cache"), None, gpu=gpu,
        space=space_of(recorded), log=io.StringIO(),
    ).job  # fmt: skip
    assert job.phase == f"round 1/{rounds}" and job.measure
    assert job.profile_top == top


@pytest.mark.parametrize(
    "flag, top", [([], 0), (["--profile-lag", "0"], 1), (["--profile-lag", "1"], 0)]
)
def test_the_command_line_overrides_the_manifest_s_lag(flag, top, tmp_path, capsys):
    """``cudal2-build --dry-run``: 2 rounds, the manifest's lag 1 (round 1's profiles read
    by no proposal: not asked for), or lag 0 from the command line (asked for)."""
    from cudal2.cli import build as build_cli

    m = manifest(tmp_path, profile_lag=1)
    text = (tmp_path / "m.toml").read_text().replace("rounds = 4", "rounds = 2")
    (tmp_path / "m.toml").write_text(text)
    argv = [str(m.path), "--dry-run", "--json", "--cache", str(tmp_path / "cache"), *flag]
    assert build_cli.main(argv) == 0, capsys.readouterr().err
    s = json.loads(capsys.readouterr().out)
    assert s["phase"] == "round 1/2" and s["candidates"] > 0
    assert (s["profile_lag"], s["profile_top"]) == (1 if top == 0 else 0, top)


@pytest.mark.parametrize("value", ["2", "-1", "one"])
def test_the_command_line_refuses_another_lag(value, tmp_path, capsys):
    from cudal2.cli import build as build_cli

    m = manifest(tmp_path)
    assert build_cli.main([str(m.path), "--dry-run", "--profile-lag", value]) == 2
    err = capsys.readouterr().err
    assert "--profile-lag" in err and err.count("\n") == 1


def test_the_policy_proposes_the_same_whether_ncu_ends_before_or_after_its_proposals(
    recorded, tmp_path
):
    """The learned policy (its prompt carries the ncu shares where a record has them),
    updated between rounds: ncu ending before the next round's proposing, or after all
    of it, gives the same prompts' records, proposals and database."""
    from cudal2.policy.learned import PolicyProposer

    runs = []
    for name, hold, first in (("first", 0.0, frozenset({0, 1})), ("last", 20.0, frozenset())):
        ncu = Ncu(Events(), hold=hold)
        inner = PolicyProposer(0, gpu=recorded[0].gpu.name, space=space_of(recorded))
        proposer = Recording(space_of(recorded), ncu, ncu_first=first, inner=inner)
        b = build(tmp_path, recorded, Replay(recorded, ncu), proposer, name=name)
        b.run()
        runs.append((proposer, ncu, comparable(b.db.read())))
    (a, ncu_a, db_a), (b_, ncu_b, db_b) = runs
    assert ncu_b.saw_proposing == [True, True] and len(ncu_a.runs) == 2
    # round 3 was shown round 1's profiles (the prompt's shares), the same in both
    assert any(metrics for rnd, _, shown in a.shown if rnd == 2 for _, _, metrics in shown)
    assert a.shown == b_.shown and a.proposed == b_.proposed and db_a == db_b


def test_a_lag_1_build_that_profiles_nothing_has_no_background_profile(recorded, tmp_path):
    ncu = Ncu(Events())
    b = build(tmp_path, recorded, Replay(recorded, ncu), Recording(space_of(recorded), ncu))
    b.manifest = dataclasses.replace(
        b.manifest, search=dataclasses.replace(b.manifest.search, profile_top=0)
    )
    report = b.run()
    assert ncu.runs == [] and "not profiled" not in b.log.getvalue()
    assert "profile" not in report.stages.overlapped
    assert report.stages.stages["profile"] == report.stages.stages["wait for profile"] == 0
