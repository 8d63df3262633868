"""The build's Nsight Compute rounds (``pipeline.profiling``): which rounds are profiled
and which quantities are asked for, as the manifest's ``[search]`` says.

The builds replay the densely measured H100 hold-out corpus (as tests/pipeline/test_stages.py);
the profile answers are the ncu report recorded on the H100
(``tests/verify/data/ncu-h100-profile.json``), cut to the quantities each job asks for.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import shutil
from pathlib import Path

import pytest

from cudal2.generator.compile import ArtifactCache
from cudal2.manifest import load_manifest
from cudal2.pipeline.build import Build
from cudal2.policy import GridProposer
from cudal2.records import JobKind, JobResult, Measurement, Status
from cudal2.verify.profile import METRICS, SEARCH_QUANTITIES, is_profiled
from cudal2.verify.replay import ReplayRunner

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "results" / "h100-corpus-holdout.measurements.jsonl.gz"
MANIFEST = ROOT / "bench" / "manifests" / "corpus-holdout-h100.toml"
NCU = json.loads((ROOT / "tests" / "verify" / "data" / "ncu-h100-profile.json").read_text())

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="artifact keys need nvcc")


@pytest.fixture(scope="module")
def recorded() -> list[Measurement]:
    with gzip.open(DATA, "rt") as f:
        return [Measurement.from_json(json.loads(line)) for line in f]


class Profiling(ReplayRunner):
    """The replay runner, answering profile jobs as ncu did on the H100 (the recorded
    report's rows in turn, cut to what each job asks for); records each profile run."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.profile_runs: list[list] = []

    def run(self, jobs):
        profiled = []
        for job in jobs:
            if job.kind != JobKind.PROFILE:
                yield self.answer(job)
                continue
            profiled.append(job)
            row = NCU["metrics"][len(profiled) % len(NCU["metrics"])]
            asked = job.profile_metrics or tuple(METRICS)
            yield JobResult(job, Status.OK, metrics={k: v for k, v in row.items() if k in asked})
        if profiled:
            self.profile_runs.append(profiled)


class Observing(GridProposer):
    def __init__(self, space):
        super().__init__(space=space)
        self.observed: list[list[Measurement]] = []

    def observe(self, measurements):
        self.observed.append(list(measurements))
        return None


def _build(tmp_path, recorded, **search):
    m = load_manifest(MANIFEST)
    m = dataclasses.replace(
        m,
        search=dataclasses.replace(
            m.search,
            proposer="grid",
            rounds=3,
            candidates=4,
            profile_top=1,
            **{"profile_lag": 0, **search},  # lag 1: tests/pipeline/test_profile_lag.py
        ),
        targets=[m.targets[i] for i in (0, 7)],
    )
    space: dict = {}
    for x in recorded:
        if x.design is not None:
            space.setdefault(x.target, {})[x.design_key] = x.design
    proposer = Observing(lambda t: sorted(space.get(t, {}).values()))
    runner = Profiling(recorded, name="the corpus hold-out")
    log = io.StringIO()
    b = Build(m, tmp_path / "db.jsonl", ArtifactCache(tmp_path / "cache"), tmp_path / "out",
              runner=runner, proposer=proposer, log=log, native=False)  # fmt: skip
    b.run()
    return b, runner, proposer, log.getvalue()


@needs_nvcc
def test_the_last_round_is_not_profiled_and_the_search_set_is_asked_by_default(tmp_path, recorded):
    """Rounds 1 and 2 of 3 are profiled, each target's best, asking for the search's
    quantities only; the last round's results reach the proposer unprofiled (nothing is
    proposed after them) and the log says so. What was collected is recorded."""
    b, runner, proposer, log = _build(tmp_path, recorded)
    assert len(runner.profile_runs) == 2
    assert all(len(run) == 2 for run in runner.profile_runs)  # 2 targets, top 1
    assert {j.profile_metrics for run in runner.profile_runs for j in run} == {SEARCH_QUANTITIES}
    assert len(proposer.observed) == 3
    assert [sum(is_profiled(x.metrics) for x in r) for r in proposer.observed] == [2, 2, 0]
    assert "round 3/3: not profiled (the last round" in log
    enriched = [x for x in b.db.read() if is_profiled(x.metrics)]
    assert len(enriched) == 4
    assert all(set(SEARCH_QUANTITIES) >= {k for k in x.metrics if k in METRICS} for x in enriched)


@needs_nvcc
def test_a_manifest_may_ask_for_every_quantity_and_the_last_round(tmp_path, recorded):
    b, runner, proposer, log = _build(
        tmp_path, recorded, profile_metrics="all", profile_last_round=True
    )
    assert len(runner.profile_runs) == 3
    assert {j.profile_metrics for run in runner.profile_runs for j in run} == {tuple(METRICS)}
    assert [sum(is_profiled(x.metrics) for x in r) for r in proposer.observed] == [2, 2, 2]
    assert "not profiled" not in log
    enriched = [x for x in b.db.read() if is_profiled(x.metrics)]
    assert len(enriched) == 6 and all(set(METRICS) <= set(x.metrics) for x in enriched)
