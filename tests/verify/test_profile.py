"""Profile metrics (CPU side), replayed from an ncu report recorded on the H100
(``tests/verify/data/ncu-h100-*``, written by ``ci/record_ncu.py``)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from cudal2.verify import profile as prof

DATA = Path(__file__).parent / "data"
RAW = (DATA / "ncu-h100-raw.csv").read_text()
RECORD = json.loads((DATA / "ncu-h100-profile.json").read_text())


def test_report_parses_to_the_recorded_metrics_in_launch_order():
    rows = prof.parse_raw_csv(RAW, RECORD["names"])
    assert rows == RECORD["metrics"]
    # One row per job, in job order: the report's kernel names are the jobs' symbols.
    table = [r for r in csv.DictReader(io.StringIO(RAW)) if r["ID"].isdigit()]
    assert [r["Kernel Name"] for r in table] == [j["symbol"] for j in RECORD["jobs"]]


def test_every_quantity_was_found_on_the_h100_with_its_first_name():
    assert RECORD["names"] == {k: v[0] for k, v in prof.METRICS.items()}
    for vals in RECORD["metrics"]:
        assert set(vals) == set(prof.METRICS)
        assert all(0 <= v <= 100.5 for k, v in vals.items() if k.endswith("_pct"))


def test_a_metric_missing_from_the_report_is_absent_not_zero():
    names = dict(RECORD["names"], ncu_bogus="no__such_metric.sum")
    rows = prof.parse_raw_csv(RAW, names)
    assert all("ncu_bogus" not in r for r in rows)
    assert [{k: v for k, v in r.items()} for r in rows] == RECORD["metrics"]


def test_text_without_a_report_is_an_error():
    with pytest.raises(ValueError, match="no ncu CSV header"):
        prof.parse_raw_csv((DATA / "ncu-h100-log.txt").read_text(), RECORD["names"])


def test_no_ncu_gives_empty_metrics_and_says_why(monkeypatch):
    monkeypatch.setattr(prof, "find_ncu", lambda: None)
    res = prof.profile([{"cubin": "x", "symbol": "y", "recipe": {}, "target": {}}])
    assert res.metrics == [{}] and "ncu not found" in res.error


def test_build_records_profiled_copies_and_feeds_them_on(tmp_path, recorded_measurements):
    """The build profiles each target's fastest candidates and appends enriched copies
    of their records; the proposer receives the enriched ones. The runner replays the
    recorded ncu report's metrics as if ncu had measured them."""
    import dataclasses

    from cudal2.database import MeasurementDB, latest
    from cudal2.generator.compile import ArtifactCache
    from cudal2.manifest import default_manifest_path, load_manifest
    from cudal2.pipeline.build import Build
    from cudal2.verify.replay import ReplayRunner

    unprofiled = [  # kernel records (cuBLASLt ones have nothing to profile)
        m
        for m in latest(recorded_measurements)
        if not m.is_vendor and not any("ncu_" in k for k in m.metrics)
    ]
    target = next(m.target for m in unprofiled if m.status == "ok")
    ms = [m for m in unprofiled if m.target == target]
    n = len(RECORD["metrics"])
    assert len(ms) > n
    fastest = sorted(ms, key=lambda m: (m.median_us, m.design_key))[:n]
    profiled = [
        dataclasses.replace(m, metrics={**m.metrics, **vals})
        for m, vals in zip(fastest, RECORD["metrics"], strict=True)
    ]
    runner = ReplayRunner(profiled)
    b = Build(
        load_manifest(default_manifest_path()),
        tmp_path / "db.jsonl",
        ArtifactCache(tmp_path / "cache"),
        tmp_path / "dist",
        log=io.StringIO(),
    )
    out = b._profile(runner, runner.start(), ms, n)
    written = MeasurementDB(tmp_path / "db.jsonl").read()
    assert [w.reuse_key for w in written] == [m.reuse_key for m in fastest]
    for w, vals in zip(written, RECORD["metrics"], strict=True):
        assert {k: w.metrics[k] for k in vals} == vals
    assert len(out) == len(ms) and sum(w in out for w in written) == n
    assert b._profile(runner, runner.start(), out, n) == out  # already profiled: nothing again


@pytest.mark.parametrize("error", ["", "ncu: exit 1"])
def test_the_local_runner_profiles_a_batch_in_one_ncu_run(
    monkeypatch, recorded_measurements, error
):
    """Profile jobs of one ``run`` share one ncu run; its metrics come back per job, in
    job order, and a failed run answers every job with its error (no verdict on them)."""
    from cudal2.pipeline.results import job_for
    from cudal2.records import JobKind, Status
    from cudal2.verify import local

    kernels = [m for m in recorded_measurements if m.design is not None]
    jobs = [job_for(JobKind.PROFILE, m, f"/c/{m.artifact_key}") for m in kernels[:3]]
    calls = []

    def fake_profile(batch, device=None):
        calls.append(batch)
        return prof.ProfileResult([RECORD["metrics"][i] for i in range(len(batch))], error)

    monkeypatch.setattr(local, "profile", fake_profile)
    answers = list(local.LocalRunner().run(jobs))
    assert len(calls) == 1 and [j["symbol"] for j in calls[0]] == [j.symbol for j in jobs]
    assert [a.job for a in answers] == jobs
    if error:
        assert all(a.status == Status.RUNTIME and a.error == error for a in answers)
    else:
        assert [a.metrics for a in answers] == RECORD["metrics"][:3]
        assert all(a.status == Status.OK for a in answers)
