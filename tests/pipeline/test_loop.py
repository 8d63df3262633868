"""The whole measuring loop on CPU, through the replay runner, against densely measured
H100 data: bench/results/h100-corpus-holdout.measurements.jsonl.gz (12 held-out
targets of bench/manifests/corpus-holdout-h100.toml, 288 designs each, and each
target's autotuned cuBLASLt algorithm).

The build's proposers propose round after round (the policy's weights updated between
rounds), over the designs recorded for each target (as the replay evaluation of the
policy does: a proposer over the whole legal space lands in the recorded 288 of ~8,000
designs a few times in a hundred) or over the whole legal space, where the replay
answers "not recorded" for most. The build's selection must then be what the recorded
data says is best among the proposals, and a recorded sanitizer failure of a would-be
winner must make the build pick the next one and never ship it.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from cudal2.database import MeasurementDB, latest
from cudal2.generator.compile import ArtifactCache
from cudal2.manifest import load_manifest
from cudal2.pipeline.build import Build, shippable
from cudal2.pipeline.select import contested, noise
from cudal2.policy import GridProposer
from cudal2.records import CheckEvent, JobKind, JobResult, KernelDesign, Measurement, Status, Target
from cudal2.verify.replay import ReplayRunner

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="artifact keys need nvcc")

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "results" / "h100-corpus-holdout.measurements.jsonl.gz"
MANIFEST = ROOT / "bench" / "manifests" / "corpus-holdout-h100.toml"

ALL = tuple(range(12))
# One build per line: proposer, searched over the recorded designs (else the legal
# space), rounds, candidates per target per round, which of the manifest's 12 targets
# (the policy costs about a second per target and round on 2 cores; 0 and 7 are the
# two targets where recorded kernels beat torch).
CASES = [
    pytest.param("grid", True, 6, 20, ALL, id="grid-recorded-12-targets"),
    pytest.param("grid", False, 3, 8, ALL, id="grid-legal-space-12-targets"),
    pytest.param("policy", True, 2, 8, (0, 7, 9), id="policy-recorded-3-targets"),
]
# The sanitizer gate's build: grid reaches target 0's two winning kernels by round 4.
GATE = ("grid", True, 4, 16, (0, 7, 9))


@pytest.fixture(scope="module")
def recorded() -> list[Measurement]:
    with gzip.open(DATA, "rt") as f:
        return [Measurement.from_json(json.loads(line)) for line in f]


class Spy(ReplayRunner):
    """The replay runner, remembering the jobs it was given. It stands in for the GPU,
    compute-sanitizer included: a memcheck of a kernel without a recorded failure is
    answered clean."""

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

    def answer(self, job):
        res = super().answer(job)
        if job.kind == JobKind.SANITIZE and not res.recorded:
            return JobResult(job, Status.OK)  # stands in for a clean memcheck on the GPU
        return res

    def of(self, kind: JobKind):
        """The jobs of ``kind`` the rounds asked for (run-offs apart: ``runoffs``)."""
        return [j for j in self.jobs if j.kind == kind and not j.rival]

    def runoffs(self):
        return [j for j in self.jobs if j.rival]


def recorded_space(recorded: list[Measurement]):
    """Per target, the designs recorded for it, in a fixed order."""
    by_target: dict[Target, dict[str, KernelDesign]] = {}
    for m in recorded:
        if m.design is not None:
            by_target.setdefault(m.target, {})[m.design_key] = m.design
    return lambda t: sorted(by_target.get(t, {}).values())


def _build(tmp_path, recorded, proposer, restricted, rounds, candidates, which):
    m = load_manifest(MANIFEST)
    search = dataclasses.replace(
        m.search, proposer=proposer, rounds=rounds, candidates=candidates, profile_top=0
    )
    m = dataclasses.replace(m, search=search, targets=[m.targets[i] for i in which])
    runner = Spy(recorded, name="the corpus hold-out")
    space = recorded_space(recorded) if restricted else None
    if proposer == "grid":
        chosen = GridProposer(space=space)
    else:
        from cudal2.policy.learned import PolicyProposer

        chosen = PolicyProposer(m.search.seed, gpu=runner.gpu.name, space=space)
    log = io.StringIO()
    cache = ArtifactCache(tmp_path / "cache")
    b = Build(m, tmp_path / "db.jsonl", cache, tmp_path, runner=runner, proposer=chosen, log=log)
    selections, missing = b.measure_and_select()
    return b, runner, {s.target: s for s in selections}, missing, log.getvalue()


def _speedup(m: Measurement) -> float:
    return m.baselines_us["torch"] / m.median_us


def expected_winner(ok: list[Measurement], vendor: Measurement | None) -> Measurement | None:
    """What the recorded data says should ship for a target: the fastest kernel among
    the measured proposals, or the cuBLASLt algorithm, whichever is faster relative to
    torch of those whose speedup exceeds its own noise; None: nothing does (fallback)."""
    kernel = min(ok, key=lambda m: m.median_us, default=None)
    beats = [m for m in (kernel, vendor) if m is not None and _speedup(m) - 1 > noise(m)]
    return max(beats, key=_speedup, default=None)


def _check_selections(b, runner, sels, recorded, unsafe=frozenset()):
    index = {(m.target, m.design_key): m for m in recorded if m.status != Status.SANITIZER}
    vendor = {m.target: m for m in recorded if m.is_vendor}
    written = MeasurementDB(b.db.path).read()
    kernels = [w for w in written if w.design is not None and w.status != Status.SANITIZER]
    kernel_jobs = runner.of(JobKind.MEASURE)
    # Each proposal measured once; the replayed ones are the recorded measurements.
    assert len({(j.target, j.design.key) for j in kernel_jobs}) == len(kernel_jobs)
    answered = [j for j in kernel_jobs if (j.target, j.design.key) in index]
    assert [(w.target, w.design) for w in kernels] == [(j.target, j.design) for j in answered]
    for w in kernels:
        r = index[(w.target, w.design_key)]
        assert (w.reuse_key, w.status, w.samples_us, w.median_us) == (
            r.reuse_key,
            r.status,
            r.samples_us,
            r.median_us,
        )
        assert w.baseline_samples_us == r.baseline_samples_us and w.metrics == r.metrics
    # A proposal without a record is unmeasured: no record, no failure.
    assert b.counts["unmeasured"] == len(kernel_jobs) - len(answered)
    assert not b.failures
    for t, s in sels.items():
        ok = [w for w in kernels if w.target == t and w.artifact_key not in unsafe]
        want = expected_winner(ok, vendor.get(t))
        if want is None:
            assert s.kind == "fallback", t.label
        else:
            assert s.winner is not None and s.winner.design_key == want.design_key, t.label
            assert s.kind == ("cublaslt" if want.is_vendor else "kernel")
            assert s.speedup == pytest.approx(_speedup(want))
        assert s.winner is None or s.winner.artifact_key not in unsafe


@pytest.mark.parametrize("proposer, restricted, rounds, candidates, which", CASES)
def test_the_loop_selects_the_best_measured_proposal(
    tmp_path, recorded, proposer, restricted, rounds, candidates, which
):
    args = (proposer, restricted, rounds, candidates, which)
    b, runner, sels, missing, log = _build(tmp_path, recorded, *args)
    targets = b.manifest.targets
    assert set(sels) == set(targets) and missing == []
    # Every round proposed ``candidates`` new designs per target.
    per_target = Counter(j.target for j in runner.of(JobKind.MEASURE))
    assert per_target == {t: rounds * candidates for t in targets}
    assert len(runner.of(JobKind.AUTOTUNE)) == len(targets)
    # Then the run-offs of the targets contested in what was measured: a replay without
    # run-off records answers none, and none is recorded (_check_selections)
    written = latest(MeasurementDB(b.db.path).read())
    pairs = contested(targets, written, b.manifest.timing_mode, shippable())
    asked = [(j.target, j.design.key, j.rival["design_key"]) for j in runner.runoffs()]
    assert asked == [(k.target, k.design_key, v.design_key) for k, v in pairs]
    _check_selections(b, runner, sels, recorded)
    if restricted:  # every proposal measured; some kernel wins (the check is not vacuous)
        assert b.counts["unmeasured"] == 0
        assert any(s.kind == "kernel" for s in sels.values())
    else:  # most proposals have no record: unmeasured, and not proposed again
        assert b.counts["unmeasured"] > b.counts["measured"] > 0
    if proposer == "policy":  # the weights were updated after each round
        updates = [line for line in log.splitlines() if line.startswith("policy: weights")]
        assert len(updates) == rounds and "from 0 targets" not in updates[0]


def test_a_recorded_sanitizer_failure_makes_the_build_ship_the_next(tmp_path, recorded):
    _, _, sels, _, _ = _build(tmp_path / "first", recorded, *GATE)
    # The would-be winner whose target has a runner-up among its measured proposals.
    first = sorted((s for s in sels.values() if s.kind == "kernel"), key=lambda s: s.target)
    assert first
    bad = first[0].winner
    memcheck = dataclasses.replace(
        bad,
        status=Status.SANITIZER,
        error="memcheck exited 86:\nInvalid __global__ write of size 2",
        samples_us=(),
        median_us=None,
    )
    copy = [*recorded, memcheck]
    b, runner, again, _, log = _build(tmp_path / "second", copy, *GATE)
    assert "1 selected kernels failed compute-sanitizer: reselecting" in log
    asked = [j.artifact_key for j in runner.of(JobKind.SANITIZE)]
    assert bad.artifact_key in asked and len(asked) == len(set(asked))
    recorded_failures = [c for c in b.db.load().checks if c.event == CheckEvent.FAILED]
    assert [c.artifact_key for c in recorded_failures] == [bad.artifact_key]
    assert again[bad.target].winner is None or again[bad.target].winner.design != bad.design
    _check_selections(b, runner, again, copy, unsafe={bad.artifact_key})
    # Every other target kept its selection.
    for t, s in sels.items():
        if t != bad.target:
            assert (again[t].kind, again[t].winner and again[t].winner.design_key) == (
                s.kind,
                s.winner and s.winner.design_key,
            )
