"""compute-sanitizer gating (CPU side): the problem it runs, and what a failure does."""

from __future__ import annotations

import shutil

import pytest

from cudal2.database import MeasurementDB
from cudal2.generator.compile import ArtifactCache
from cudal2.manifest import default_manifest_path, load_manifest
from cudal2.pipeline.select import Selection
from cudal2.records import Target
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


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_a_failed_memcheck_is_recorded_once_per_build(tmp_path, monkeypatch, recorded_measurements):
    from cudal2.pipeline import build as build_mod

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
    report = f"{sanitizer.PREFIX}: exit 86\nInvalid __global__ write of size 2"
    monkeypatch.setattr(build_mod, "memcheck", lambda *a: sanitizer.SanitizerResult(False, report))
    db = tmp_path / "db.jsonl"
    b = build_mod.Build(
        load_manifest(default_manifest_path()), db, ArtifactCache(tmp_path / "c"), tmp_path
    )
    assert b._sanitize([sel], set()) == {best.artifact_key}
    (rec,) = MeasurementDB(db).read()
    assert rec.status == "runtime" and rec.error == report
    assert rec.artifact_key == best.artifact_key and rec.median_us is None
    # Checked once per build: a second look does not run memcheck again.
    assert b._sanitize([sel], set()) == set()
