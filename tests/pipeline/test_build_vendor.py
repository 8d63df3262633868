"""The build's cuBLASLt autotuning step (``Build._autotune_vendor``) on recorded data:
which targets it sends to the worker, and the records it makes of the answers."""

from __future__ import annotations

import io
import time

from cudal2.database import MeasurementDB
from cudal2.generator.compile import ArtifactCache
from cudal2.manifest import default_manifest_path, load_manifest
from cudal2.pipeline.build import Build, vendor_measurement, vendor_toolchain
from cudal2.verify.timing import TimingConfig


class ReplayPool:
    """Answers vendor jobs with the recorded answers of the H100 database."""

    def __init__(self, records, version):
        self.cublaslt_version = version
        self.answers = {r.target: r for r in records}
        self.jobs = []

    def run(self, job):
        self.jobs.append(job)
        r = self.answers[next(t for t in self.answers if t.as_json() == job["target"])]
        return {
            "status": r.status,
            "error": r.error,
            "max_abs_err": r.max_abs_err,
            "max_rel_err": r.max_rel_err,
            "samples_us": list(r.samples_us),
            "baseline_samples_us": {k: list(v) for k, v in r.baseline_samples_us.items()},
            "vendor": r.vendor,
        }


def _build(tmp_path, log):
    m = load_manifest(default_manifest_path())
    return Build(m, tmp_path / "db.jsonl", ArtifactCache(tmp_path / "c"), tmp_path, log=log)


def test_only_targets_without_a_record_of_this_version_are_autotuned(
    tmp_path, recorded_measurements
):
    vendor = [m for m in recorded_measurements if m.is_vendor]
    assert vendor, "the recorded database has cuBLASLt records"
    version = vendor[0].vendor["version"]
    b = _build(tmp_path, io.StringIO())
    targets = sorted({m.target for m in vendor})
    history = [m for m in vendor if m.target != targets[0]]  # one target never tuned
    pool = ReplayPool(vendor, version)
    gpu = vendor[0].gpu
    b._autotune_vendor(pool, gpu, targets, history, TimingConfig(), time.monotonic())
    assert [j["target"] for j in pool.jobs] == [targets[0].as_json()]
    (rec,) = MeasurementDB(tmp_path / "db.jsonl").read()
    old = next(m for m in vendor if m.target == targets[0])
    assert rec.reuse_key == old.reuse_key  # same algorithm, version, GPU and mode
    assert rec.toolchain == vendor_toolchain(version) and rec.design is None
    assert rec.median_us == old.median_us and rec.metrics["workspace_bytes"] >= 0
    # Another cuBLASLt version: every target is tuned again.
    pool = ReplayPool(vendor, version + 1)
    b._autotune_vendor(pool, gpu, targets, history, TimingConfig(), time.monotonic())
    assert len(pool.jobs) == len(targets)


def test_no_nvmath_in_the_worker_says_so_and_tunes_nothing(tmp_path, recorded_measurements):
    log = io.StringIO()
    b = _build(tmp_path, log)
    pool = ReplayPool([], None)
    gpu = recorded_measurements[0].gpu
    b._autotune_vendor(pool, gpu, b.manifest.targets, [], TimingConfig(), time.monotonic())
    assert pool.jobs == [] and "nvmath-python" in log.getvalue()


def test_vendor_records_round_trip_through_the_database(tmp_path, recorded_measurements):
    rec = next(m for m in recorded_measurements if m.is_vendor)
    db = MeasurementDB(tmp_path / "db.jsonl")
    db.append([rec])
    assert db.read() == [rec]
    again = vendor_measurement(
        rec.target, ReplayPool([rec], 0).run({"target": rec.target.as_json()}), rec.gpu, rec.mode
    )
    assert again.design_key == rec.design_key and again.vendor == rec.vendor
