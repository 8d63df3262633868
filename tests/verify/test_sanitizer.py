"""compute-sanitizer gating (CPU side): the problem it runs, and what a failure does."""

from __future__ import annotations

import dataclasses

import pytest

from cudal2.database import MeasurementDB
from cudal2.generator.compile import ArtifactCache
from cudal2.manifest import default_manifest_path, load_manifest
from cudal2.pipeline.results import unsafe_artifacts
from cudal2.pipeline.select import Selection
from cudal2.records import Status, Target
from cudal2.verify import sanitizer


@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (1, 4096, 14336), (100, 1000, 1000)])
def test_small_problem_keeps_residues_and_alignment(shape):
    t = Target("sm_90a", "fp16", "nn", *shape)
    s = sanitizer.small(t)
    assert s.m <= 130 and s.n <= 136 and s.k <= 264
    assert s.k % 8 == 0 and s.n % 8 == 0  # the nn alignment rule still holds
    assert (s.dtype, s.layout) == (t.dtype, t.layout)
    assert s.m == min(t.m, 130)


def test_missing_tool_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(sanitizer, "find_sanitizer", lambda: None)
    with pytest.raises(FileNotFoundError, match="compute-sanitizer"):
        sanitizer.memcheck(tmp_path / "k.cubin", "k", {}, Target("sm_90a", "fp16", "tn", 1, 8, 8))


def test_a_failed_memcheck_is_recorded_once_per_build(tmp_path, recorded_measurements):
    """A runner's ``sanitizer`` verdict on a selected kernel is recorded with that
    status (the gate reads the status, not the text), and each artifact is checked
    once per build. The verdict is replayed from a record."""
    from cudal2.pipeline.build import Build
    from cudal2.verify.replay import ReplayRunner

    kernels = (m for m in recorded_measurements if m.status == "ok" and not m.is_vendor)
    best = min(kernels, key=lambda m: m.median_us)
    sel = Selection(
        best.gpu.name,
        best.target,
        "kernel",
        best,
        best.median_us,
        best.baselines_us["torch"],
        best.spread,
        best.measured_at,
        1,
    )
    report = "memcheck exited 86:\nInvalid __global__ write of size 2"
    verdict = dataclasses.replace(best, status=Status.SANITIZER, error=report, median_us=None)
    runner = ReplayRunner([verdict])
    db = tmp_path / "db.jsonl"
    b = Build(load_manifest(default_manifest_path()), db, ArtifactCache(tmp_path / "c"), tmp_path)
    assert b._sanitize(runner, [sel], set()) == {best.artifact_key}
    (rec,) = MeasurementDB(db).read()
    assert rec.status == Status.SANITIZER and rec.error == report
    assert rec.artifact_key == best.artifact_key and rec.median_us is None
    assert unsafe_artifacts([rec]) == {best.artifact_key}
    # Checked once per build: a second look does not ask again.
    assert b._sanitize(runner, [sel], set()) == set()
    # Without a verdict on record the kernel is unchecked, never failed.
    fresh = Build(b.manifest, tmp_path / "other.jsonl", b.cache, tmp_path)
    assert fresh._sanitize(ReplayRunner([best]), [sel], set()) == set()
    assert not (tmp_path / "other.jsonl").exists()


def test_the_local_runner_answers_memcheck_with_a_status(monkeypatch, recorded_measurements):
    from cudal2.pipeline.results import job_for
    from cudal2.records import JobKind
    from cudal2.verify import local

    m = next(m for m in recorded_measurements if m.design is not None)
    job = job_for(JobKind.SANITIZE, m, "/nowhere/kernel.cubin")
    for ok, status in [(True, Status.OK), (False, Status.SANITIZER)]:
        res = sanitizer.SanitizerResult(ok, "" if ok else "memcheck exited 86:\n...")
        monkeypatch.setattr(local, "memcheck", lambda *a, res=res: res)
        (answer,) = local.LocalRunner().run([job])
        assert answer.job == job and answer.status == status and answer.error == res.report
