"""The sanitizer rule against the committed databases, and the entry point the H100 run
of ``ci/gpu_memcheck.sh`` uses to record their checks.

The committed databases hold the H100's clean compute-sanitizer check of each of the 41
kernel entries their CPU-built tables shipped before the rule, so those tables are the
ones built before the rule. Without the check lines (``db_unchecked``: the files as they
were before that run) a CPU build ships no kernel of its own: every one waits for a
sanitizer run on a GPU.
"""

from __future__ import annotations

import dataclasses
import io
import json
import shutil

import pytest

from cudal2.database import MeasurementDB, default_database
from cudal2.generator.compile import ArtifactCache
from cudal2.manifest import default_manifest_path, load_manifest
from cudal2.pipeline import memcheck
from cudal2.pipeline.build import Build
from cudal2.pipeline.gate import check_key, shipped_kernels
from cudal2.pipeline.memcheck import before_the_rule, kernel_entries
from cudal2.records import CheckEvent, CheckKey, JobKind, JobResult, Status
from cudal2.verify.replay import ReplayRunner

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="artifact keys need nvcc")

# The committed manifests whose CPU-built tables ship kernels, and how many.
SHIPPED = {"default": 2, "llm-public-h100": 32, "grid-sample-h100": 8, "llama-3.1-8b-hf-h100": 10}
# ... of which checked clean in a database the manifest reuses (the v5 sweeps' builds)
CHECKED_IN_REUSED = {"llm-public-h100": 5, "grid-sample-h100": 3}


class Proposes:
    """Proposes nothing: a CPU build measures nothing either way, and its selection
    reads the whole database, so the table is the build's without the proposer's cost
    (the learned policy spends a minute on llama-3.1-8b-hf's targets on 2 cores)."""

    name = "none"

    def propose(self, target, history, n):
        return []

    def observe(self, measurements):
        return None


def _cpu_build(stem: str, db, tmp_path, monkeypatch):
    monkeypatch.setattr("cudal2.pipeline.build.gpu_names", lambda: [])
    manifest = load_manifest(default_manifest_path().with_name(f"{stem}.toml"))
    log = io.StringIO()
    b = Build(manifest, db, ArtifactCache(tmp_path / "c"), tmp_path, proposer=Proposes(), log=log)
    selections, _ = b.measure_and_select()
    return manifest, selections, log.getvalue()


def _clean(checks) -> set[CheckKey]:
    return {c.key for c in checks if c.event == CheckEvent.CLEAN}


@pytest.mark.parametrize("stem", SHIPPED)
def test_the_rule_leaves_the_cpu_built_tables_as_they_were_once_checked(
    stem, tmp_path, monkeypatch, db_unchecked
):
    """With the H100's checks on record, each committed table is the one a build made
    before the rule, every kernel it ships (winners and eager alternatives) checked
    clean. Without its own database's check lines, the kernels checked only there wait
    for a GPU and their targets take another candidate; every other entry stays. (Checks
    of kernels no longer shipped stay on record: the 2,048-token eager alternative, and
    the winners displaced when kernels of different runs came to be ranked by speedup.)"""
    committed = default_database(default_manifest_path().with_name(f"{stem}.toml"))
    manifest, sels, log = _cpu_build(stem, committed, tmp_path, monkeypatch)
    checked = kernel_entries(sels)
    before = before_the_rule(manifest, committed)
    kernels = {k: v for k, v in before.items() if v.startswith("kernel:")}
    assert len(kernels) == SHIPPED[stem]
    assert checked == before and "wait for a sanitizer run" not in log
    own = MeasurementDB(committed).load().checks
    events = [c.event for c in own]
    assert events.count(CheckEvent.STARTED) == events.count(CheckEvent.CLEAN) == len(events) / 2
    elsewhere = _clean(MeasurementDB(tmp_path / "none.jsonl", manifest.reuse).load().checks)
    shipped = shipped_kernels(sels)
    assert {check_key(m) for m in shipped} <= _clean(own) | elsewhere
    waiting = {
        f"{s.gpu} {s.target.label}"
        for s in sels
        if s.kind == "kernel" and check_key(s.winner) not in elsewhere
    }
    assert len(waiting) == SHIPPED[stem] - CHECKED_IN_REUSED.get(stem, 0)
    _, unchecked_sels, log = _cpu_build(stem, db_unchecked(stem), tmp_path, monkeypatch)
    unchecked = kernel_entries(unchecked_sels)
    assert f"{len(waiting)} selected kernels wait for a sanitizer run on a GPU" in log
    assert all(unchecked[k] != before[k] for k in waiting)
    assert {k: v for k, v in unchecked.items() if k not in waiting} == {
        k: v for k, v in before.items() if k not in waiting
    }


class Memcheck(ReplayRunner):
    """A replay standing in for the H100: its memcheck fails for ``failing`` artifacts
    and passes for every other."""

    failing: set[str] = set()

    def answer(self, job):
        if job.kind != JobKind.SANITIZE:
            return super().answer(job)
        bad = job.artifact_key in self.failing
        return JobResult(job, Status.SANITIZER if bad else Status.OK, "exit 86" * bad)


def test_the_memcheck_run_records_checks_and_reselects_past_a_failure(
    tmp_path, capsys, db_unchecked
):
    db = tmp_path / "default.measurements.jsonl"
    shutil.copyfile(db_unchecked("default"), db)
    first = before_the_rule(load_manifest(default_manifest_path()), db)
    winners = sorted(v.split(":")[1] for v in first.values() if v.startswith("kernel:"))
    records = MeasurementDB(db).read()
    bad = next(m.artifact_key for m in records if m.design_key == winners[0])

    def runner(args):
        assert (args.parallel, args.timeout) == (2, 60.0)
        r = Memcheck(records)
        r.failing = {bad}
        return r

    argv = ["--db", str(default_manifest_path()), str(db), "--parallel", "2", "--timeout", "60"]
    summary = tmp_path / "summary.json"
    assert memcheck.main([*argv, "--json", str(summary)], make_runner=runner) == 0
    (s,) = json.loads(summary.read_text())
    # Both would-be winners checked; one failed, and its target's next candidate (itself
    # a kernel: the default database has runners-up) was checked and shipped.
    assert (s["kernel_entries_before"], s["failed"], s["waiting"]) == (2, 1, 0)
    assert s["checked"] == 3 and s["kernel_entries"] == 2 and not s["unchanged"]
    (label, (was, now)) = next(iter(s["changed"].items()))
    assert was == f"kernel:{winners[0]}" and now.startswith("kernel:") and now != was
    assert "CHANGED" in capsys.readouterr().out
    events = [c.event for c in MeasurementDB(db).load().checks]
    assert events.count(CheckEvent.STARTED) == 3 and events.count(CheckEvent.FAILED) == 1
    # Run again: everything has a verdict, nothing is checked twice.
    assert memcheck.main([*argv, "--json", str(summary)], make_runner=runner) == 0
    assert json.loads(summary.read_text())[0]["checked"] == 0


def test_the_memcheck_run_says_what_it_could_not_check(tmp_path, capsys, db_unchecked):
    """A GPU of another model checks nothing of an H100 table: exit 1, all waiting."""
    db = tmp_path / "default.measurements.jsonl"
    shutil.copyfile(db_unchecked("default"), db)
    records = MeasurementDB(db).read()

    def h200(args):
        r = Memcheck(records)
        r.gpu = dataclasses.replace(r.gpu, name="NVIDIA H200")
        return r

    argv = ["--db", str(default_manifest_path()), str(db)]
    assert memcheck.main(argv, make_runner=h200) == 1
    assert "checked 0, failed 0, waiting 2" in capsys.readouterr().out
    assert MeasurementDB(db).load().checks == ()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--parallel", "0"], "--parallel and --timeout must be positive"),
        (["--timeout", "-1"], "--parallel and --timeout must be positive"),
    ],
)
def test_bad_arguments_exit_2(tmp_path, capsys, argv, message):
    db = tmp_path / "db.jsonl"
    assert memcheck.main(["--db", str(default_manifest_path()), str(db), *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_database_that_is_no_file_exits_2(tmp_path, capsys):
    records = MeasurementDB(default_manifest_path().with_name("default.measurements.jsonl"))
    argv = ["--db", str(default_manifest_path()), str(tmp_path)]
    assert memcheck.main(argv, make_runner=lambda a: Memcheck(records.read())) == 2
    assert "is a directory, not a measurement database" in capsys.readouterr().err
