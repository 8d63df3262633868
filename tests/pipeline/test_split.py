"""The split build of issue 18, end to end on CPU: dry run -> export (compile only) ->
measure (a ``ReplayRunner`` over densely recorded H100 data stands in for the GPU
runner, through the same ``JobMeasurer`` the GPU runs) -> export the next round ... ->
package from the database. The wheel must be byte-identical to the one a one-machine
build makes with the same GPU stand-in, and to a CPU replay build of that build's
database.

Data: bench/results/h100-corpus-holdout.measurements.jsonl.gz (288 designs per target
measured on the H100, each target's cuBLASLt algorithm), as tests/pipeline/test_loop.py.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cudal2.database import MeasurementDB
from cudal2.manifest import load_manifest
from cudal2.pipeline.build import Build
from cudal2.pipeline.job import JOB_FILE, JobBundleError, JobMeasurer, read_job
from cudal2.pipeline.split import describe, export_job
from cudal2.records import CheckEvent, JobKind, JobResult, Measurement, Status
from cudal2.verify.profile import METRICS, SEARCH_QUANTITIES
from cudal2.verify.replay import ReplayRunner

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="the export compiles")

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "results" / "h100-corpus-holdout.measurements.jsonl.gz"
MANIFEST = ROOT / "bench" / "manifests" / "corpus-holdout-h100.toml"
WHICH = (0, 7)  # the two held-out targets where recorded kernels beat torch (test_loop)


@pytest.fixture(scope="module")
def recorded() -> list[Measurement]:
    with gzip.open(DATA, "rt") as f:
        return [Measurement.from_json(json.loads(line)) for line in f]


class Gpu(ReplayRunner):
    """The GPU's stand-in: recorded answers; a memcheck without a recorded failure is
    answered clean (as tests/pipeline/test_loop.py's ``Spy``). Its design space, per
    target, is small (the compiles are the test's time): the 3 fastest recorded kernels
    and the 9 first others by key, so a few rounds of 4 reach a winner."""

    def designs(self, target):
        ok = [m for m in self.recorded if m.target == target and m.design is not None]
        fast = sorted(
            (m for m in ok if m.status == Status.OK and m.median_us),
            key=lambda m: (m.median_us, m.design_key),
        )[:3]
        rest = sorted({m.design_key: m.design for m in ok}.items())[:9]
        chosen = {m.design_key: m.design for m in fast} | dict(rest)
        legal = {d.key for d in super().designs(target)}
        return [d for k, d in sorted(chosen.items()) if k in legal]

    def __init__(self, recorded, **kw):
        super().__init__(recorded, **kw)
        self.recorded = recorded

    def answer(self, job):
        res = super().answer(job)
        if job.kind == JobKind.SANITIZE and not res.recorded:
            return JobResult(job, Status.OK)
        return res


def _manifest(rounds: int = 3, candidates: int = 4):
    m = load_manifest(MANIFEST)
    search = dataclasses.replace(
        m.search, proposer="grid", rounds=rounds, candidates=candidates, profile_top=1
    )
    return dataclasses.replace(m, search=search, targets=tuple(m.targets[i] for i in WHICH))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _split(tmp_path, manifest, recorded, cache, *, max_jobs: int = 8):
    """The split flow; returns the phases of the jobs exported and the wheel."""
    db = tmp_path / "split.measurements.jsonl"
    gpu = Gpu(recorded, name="the corpus hold-out")
    log = io.StringIO()
    dry = export_job(manifest, db, cache, None, gpu=gpu.gpu.name, space=gpu.designs, log=log)
    assert not db.exists() and not (tmp_path / "job").exists()  # a dry run writes nothing
    phases = []
    for _ in range(max_jobs):
        report = export_job(
            manifest, db, cache, tmp_path / "job", gpu=gpu.gpu.name, space=gpu.designs, log=log
        )
        if report.folder is None:
            break
        phases.append(report.job.phase)
        JobMeasurer(report.folder, db, Gpu(recorded, name="the corpus hold-out"), log=log).run()
    else:
        pytest.fail(f"the split did not finish in {max_jobs} jobs: {phases}")
    out = tmp_path / "split-dist"
    packaged = Build(manifest, db, cache, out, measure=False, log=log).run()
    # Progress of compiling and measuring (the GPU's side too) as lines: a log is no tty.
    text = log.getvalue()
    assert "\r" not in text
    assert "round 1/3: compile: " in text and "round 1/3: measure: 8/8 candidates" in text
    return dry, phases, packaged, db


def test_split_build_equals_one_machine_build(tmp_path, recorded, artifact_cache, monkeypatch):
    # A table names when its records were measured: one clock for both builds.
    monkeypatch.setattr("cudal2.pipeline.results.now", lambda: "2026-11-24T09:00:00Z")
    manifest = _manifest()
    one = Build(
        manifest,
        tmp_path / "one.measurements.jsonl",
        artifact_cache,
        tmp_path / "one-dist",
        runner=Gpu(recorded, name="the corpus hold-out"),
        log=io.StringIO(),
    ).run()
    dry, phases, split, db = _split(tmp_path, manifest, recorded, artifact_cache)

    summary = describe(manifest, dry, db)
    assert (summary["targets"], summary["phase"]) == (2, "round 1/3")
    assert summary["candidates"] == 2 * 4 and summary["autotune"] == 2
    # Each round is proposed from the answers to the rounds before: a trip per round,
    # then one for the sanitizer check of a would-be winner measured in round 1 or 2
    # (the last round's job checks only its own likely winners: their cubins are in it).
    assert phases == ["round 1/3", "round 2/3", "round 3/3", "memcheck"]
    kinds = [e.kind for e in one.table.entries]
    assert "kernel" in kinds, "the case must ship a kernel, so the memcheck path is exercised"
    assert split.table.as_json() == one.table.as_json()
    assert _sha(split.wheel) == _sha(one.wheel)
    # ... and a one-machine CPU build from the split's database gives the same bytes.
    again = Build(manifest, db, artifact_cache, tmp_path / "again", measure=False).run()
    assert _sha(again.wheel) == _sha(split.wheel)

    # What the GPU step recorded is what the one-machine build recorded (times and keys).
    def keyed(path):
        ms = MeasurementDB(path).read()
        return sorted((str(m.reuse_key), m.status, m.samples_us, m.proposer) for m in ms)

    assert keyed(db) == keyed(tmp_path / "one.measurements.jsonl")
    checks = MeasurementDB(db).load().checks
    assert {c.event for c in checks} == {CheckEvent.STARTED, CheckEvent.CLEAN}


def test_export_leaves_nothing_behind_and_job_is_checked(tmp_path, recorded, artifact_cache):
    manifest = _manifest(rounds=1, candidates=2)
    gpu = Gpu(recorded)
    db = tmp_path / "db.jsonl"
    out = tmp_path / "job"
    report = export_job(
        manifest, db, artifact_cache, out, gpu=gpu.gpu.name, space=gpu.designs, log=io.StringIO()
    )
    assert report.folder == out and not db.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job"]  # no temporary left
    job = read_job(out)
    assert len(job.measure) == 4 and job.final_round
    # the last round is not profiled unless the manifest asks; the search's quantities
    assert (job.profile_top, job.profile_metrics) == (0, SEARCH_QUANTITIES)
    asked = dataclasses.replace(
        manifest,
        search=dataclasses.replace(manifest.search, profile_last_round=True, profile_metrics="all"),
    )
    again = export_job(asked, db, artifact_cache, None, gpu=gpu.gpu.name, space=gpu.designs,
                       log=io.StringIO()).job  # fmt: skip
    assert (again.profile_top, again.profile_metrics) == (1, tuple(METRICS))
    assert {p.name for p in (out / "cubins").iterdir()} == {
        f"{k.job.artifact_key}.cubin" for k in job.measure
    }


def _tamper_cubin(folder: Path) -> None:
    p = next((folder / "cubins").iterdir())
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))


def _edit_job(edit):
    def go(folder: Path) -> None:
        d = json.loads((folder / JOB_FILE).read_text())
        edit(d)
        (folder / JOB_FILE).write_text(json.dumps(d))

    return go


def _escape(d):
    d["measure"][0]["job"]["cubin"] = "../../etc/passwd"


HOSTILE = [
    pytest.param(_tamper_cubin, "tampered", id="cubin-byte-flipped"),
    pytest.param(lambda f: next((f / "cubins").iterdir()).unlink(), "missing", id="cubin-gone"),
    pytest.param(lambda f: (f / JOB_FILE).unlink(), "no job.json", id="no-job-file"),
    pytest.param(lambda f: (f / JOB_FILE).write_text("{not json"), "not JSON", id="not-json"),
    pytest.param(
        _edit_job(lambda d: d.update(format_version=2)), "format_version 2", id="newer-format"
    ),
    pytest.param(_edit_job(lambda d: d.update(format="x")), "not a cudal2", id="other-format"),
    pytest.param(_edit_job(lambda d: d.pop("measure")), "malformed", id="key-missing"),
    pytest.param(_edit_job(_escape), "is not cubins/", id="cubin-path-escapes"),
    pytest.param(
        _edit_job(lambda d: d["measure"][0].update(cubin_sha256="0" * 64)),
        "tampered",
        id="sha-edited",
    ),
    pytest.param(
        _edit_job(lambda d: d.update(gpu="NVIDIA H200")), "exported for NVIDIA H200", id="gpu"
    ),
]


def _one_round_job(tmp_path, recorded, cache) -> Path:
    """A job folder of one round of two candidates, exported from an empty database."""
    gpu = Gpu(recorded)
    out = tmp_path / "job"
    export_job(
        _manifest(rounds=1, candidates=2),
        tmp_path / "x.jsonl",
        cache,
        out,
        gpu=gpu.gpu.name,
        space=gpu.designs,
        log=io.StringIO(),
    )
    return out


@pytest.mark.parametrize(("break_it", "message"), HOSTILE)
def test_a_broken_job_is_refused_before_anything_runs(
    tmp_path, recorded, artifact_cache, break_it, message
):
    out = _one_round_job(tmp_path, recorded, artifact_cache)
    break_it(out)
    db = tmp_path / "measured.jsonl"
    with pytest.raises(JobBundleError, match=message):
        JobMeasurer(out, db, Gpu(recorded), log=io.StringIO()).run()
    assert not db.exists()


MEASURE_WITHOUT_NVCC = r"""
import importlib.abc, io, shutil, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in ("cudal2.generator.compile", "cudal2.generator.nvcc", "cudal2.generator.cache"):
            raise ImportError(f"{name} imported while measuring a job")
sys.meta_path.insert(0, Block())
assert shutil.which("nvcc") is None, "nvcc still on PATH"
from cudal2.pipeline.job import JobMeasurer
from cudal2.verify.replay import ReplayRunner
runner = ReplayRunner.from_database(sys.argv[3])
report = JobMeasurer(sys.argv[1], sys.argv[2], runner, log=io.StringIO()).run()
print(report.measured)
"""


def test_measuring_a_job_needs_no_nvcc(tmp_path, recorded, artifact_cache):
    """The GPU side imports nothing of the compiler, with nvcc off PATH."""
    out = _one_round_job(tmp_path, recorded, artifact_cache)
    nvcc_dir = str(Path(shutil.which("nvcc")).parent)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != nvcc_dir)
    env = {**os.environ, "PATH": path}
    db = tmp_path / "measured.jsonl"
    res = subprocess.run(
        [sys.executable, "-c", MEASURE_WITHOUT_NVCC, str(out), str(db), str(DATA)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert int(res.stdout.split()[-1]) == 4
    assert len(MeasurementDB(db).read()) >= 4


def test_a_measured_job_folder_is_removed_only_if_it_is_one(tmp_path):
    from cudal2.pipeline.split import remove_job

    job = tmp_path / "job"
    (job / "cubins").mkdir(parents=True)
    (job / JOB_FILE).write_text("{}")
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    remove_job(job)
    remove_job(other)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]


H100_SPLIT = ROOT / "bench" / "results" / "h100-split-demo.measurements.jsonl.gz"
SPLIT_DEMO = ROOT / "bench" / "manifests" / "split-demo-h100.toml"


def test_the_h100_split_run_packages_on_cpu(tmp_path, artifact_cache, monkeypatch):
    """The GPU half run for real (ci/gpu_split.sh on the H100, nvcc hidden, 2026-11-24):
    its database answers every job of the demo manifest, and packaging from it without
    measuring gives the bytes of a one-machine build that finds everything recorded."""
    monkeypatch.setattr("cudal2.pipeline.results.now", lambda: "2026-11-24T09:00:00Z")
    manifest = load_manifest(SPLIT_DEMO)
    db = tmp_path / "split.measurements.jsonl"
    db.write_bytes(gzip.decompress(H100_SPLIT.read_bytes()))
    recorded = MeasurementDB(db).read()
    assert {m.gpu.name for m in recorded} == {"NVIDIA H100 80GB HBM3"}
    assert {m.target for m in recorded} == set(manifest.targets)

    report = export_job(
        manifest,
        db,
        artifact_cache,
        tmp_path / "next",
        gpu="NVIDIA H100 80GB HBM3",
        log=io.StringIO(),
    )
    assert report.folder is None, "the recorded run left a job to measure"
    assert not (tmp_path / "next").exists()

    packaged = Build(manifest, db, artifact_cache, tmp_path / "split", measure=False).run()
    one_db = tmp_path / "one.measurements.jsonl"
    shutil.copyfile(db, one_db)
    one = Build(
        manifest,
        one_db,
        artifact_cache,
        tmp_path / "one",
        runner=ReplayRunner(recorded, name="the H100 split run"),
        log=io.StringIO(),
    ).run()
    assert _sha(packaged.wheel) == _sha(one.wheel)
    assert one_db.read_bytes() == db.read_bytes(), "the one-machine build measured again"
    assert len(packaged.table.entries) == len(manifest.targets)
