"""Builds that propose PDL designs (issue 20, manifest ``[search] pdl = true``), on CPU.

Proposals: each proposed tile followed by its PDL variants, within the candidates the
manifest asks for (``policy/pdl.py``). Selection, through the replay runner over the
H100 corpus hold-out (bench/results/h100-corpus-holdout.measurements.jsonl.gz) plus PDL
records of one proposed tile made from its recorded measurement (no PDL design was
measured on the H100 yet): a PDL design that passed its pair check wins and ships with
``pdl: true`` in its recipe; one that failed the pair check (status ``incorrect``) or
whose record carries no pair check never does, however fast. The switch off (the
default) leaves every proposal and table as it was.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import shutil
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from cudal2.cli import build as build_cli
from cudal2.database import MeasurementDB, default_database
from cudal2.generator.compile import ArtifactCache, artifact_key_of
from cudal2.generator.space import pdl_variants
from cudal2.manifest import default_manifest_path, load_manifest
from cudal2.pipeline.build import Build, table_from_measurements
from cudal2.pipeline.split import describe, export_job
from cudal2.policy import PROPOSERS, make_proposer
from cudal2.policy.pdl import GROUP, PdlProposer, is_pdl, pdl_candidates
from cudal2.records import JobKind, JobResult, KernelDesign, Measurement, Status, Target
from cudal2.verify.pdl_pair import PAIR_METRIC
from cudal2.verify.replay import ReplayRunner

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "results" / "h100-corpus-holdout.measurements.jsonl.gz"
MANIFEST = ROOT / "bench" / "manifests" / "corpus-holdout-h100.toml"

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="artifact keys need nvcc")


@pytest.fixture(scope="module")
def recorded() -> list[Measurement]:
    with gzip.open(DATA, "rt") as f:
        return [Measurement.from_json(json.loads(line)) for line in f]


def recorded_space(recorded: list[Measurement]):
    by_target: dict[Target, dict[str, KernelDesign]] = {}
    for m in recorded:
        if m.design is not None:
            by_target.setdefault(m.target, {})[m.design_key] = m.design
    return lambda t: sorted(by_target.get(t, {}).values())


# -- proposals ------------------------------------------------------------------------


@pytest.mark.parametrize("name", PROPOSERS)
@pytest.mark.parametrize("n", [1, 4, 8, 10])
def test_each_proposed_tile_is_followed_by_its_pdl_variants(name, n):
    t = load_manifest(MANIFEST).targets[0]
    kw = {"gpu": "NVIDIA H100 80GB HBM3", "updates": False} if name == "policy" else {}
    plain = make_proposer(name, **kw).propose(t, [], n)
    got = make_proposer(name, pdl=True, **kw).propose(t, [], n)
    assert len(plain) == n and not any(is_pdl(d) for d in plain)  # the switch off: as before
    assert len(got) == n  # the candidates the manifest asks for, no more
    assert sum(is_pdl(d) for d in got) == pdl_candidates(n)
    tiles = [d for d in got if not is_pdl(d)]
    assert len(tiles) == -(-n // GROUP)
    # tile, then its variants in trigger order; the last group cut at n
    expect = [d for tile in tiles for d in (tile, *pdl_variants(tile))][:n]
    assert got == expect
    assert tiles == make_proposer(name, **kw).propose(t, [], len(tiles))  # the proposer's own


class _Inner:
    """A proposer that records what it is shown."""

    name = "inner"

    def __init__(self, designs):
        self.designs = designs
        self.histories = []
        self.observed = []

    def propose(self, target, history, n):
        self.histories.append(list(history))
        seen = {m.design_key for m in history}
        return [d for d in self.designs if d.key not in seen][:n]

    def observe(self, ms):
        self.observed.append(list(ms))


def test_the_proposer_behind_sees_plain_designs_only(recorded):
    t = recorded[0].target
    mine = [m for m in recorded if m.target == t and m.design is not None]
    inner = _Inner([m.design for m in mine])
    p = PdlProposer(inner)
    first = p.propose(t, [], 8)
    variants = [dataclasses.replace(mine[0], design=d, design_key=d.key) for d in first[1:4]]
    history = [mine[0], *variants]
    second = p.propose(t, history, 8)
    assert inner.histories[-1] == [mine[0]]  # the PDL records are not shown to it
    assert not set(d.key for d in second) & set(d.key for d in first[:4])
    p.observe(history)
    assert inner.observed == [[mine[0]]]


def test_the_incumbents_trigger_points_come_first(recorded):
    """With recorded kernels for the target, its fastest correct one (what ships unless
    beaten) has its PDL variants proposed before any new tile; once measured, not again."""
    t = recorded[0].target
    mine = [m for m in recorded if m.target == t and m.design is not None]
    timed = [m for m in mine if m.status == "ok" and m.median_us]
    best = min(timed, key=lambda m: (m.median_us, m.design_key))
    assert best is not mine[0]  # the recorded order is not what picks it
    fresh = [m.design for m in mine if m.design_key != best.design_key][:5]  # new to it
    history = [m for m in mine if m.design not in fresh]
    p = PdlProposer(_Inner(fresh))
    got = p.propose(t, history, 8)
    assert got[:3] == list(pdl_variants(best.design))
    assert len(got) == 8 and got[3] == fresh[0]  # then the proposer's tiles and theirs
    measured = [dataclasses.replace(best, design=d, design_key=d.key) for d in got[:3]]
    again = p.propose(t, [*history, *measured], 8)
    assert not set(d.key for d in again) & set(d.key for d in got[:3])
    assert again[0] == fresh[0]  # nothing of the incumbent left: a tile leads


def test_no_search_space_holds_a_pdl_design_even_where_a_replay_recorded_one(recorded):
    """PDL designs come from the expansion only: a replay that recorded some must not
    make a proposer propose them as tiles (with the switch off, none at all)."""
    t = recorded[0].target
    designs = recorded_space(recorded)(t)
    with_pdl = [*designs, *pdl_variants(designs[0])]
    for name in ("grid", "random", "sample"):
        got = make_proposer(name, space=lambda _: with_pdl).propose(t, [], len(with_pdl))
        assert got and not any(is_pdl(d) for d in got), name


# -- the manifest switch ----------------------------------------------------------------


def _with_search_line(tmp_path: Path, line: str) -> Path:
    text = default_manifest_path().read_text()
    assert "[search]\n" in text
    p = tmp_path / "default.toml"
    p.write_text(text.replace("[search]\n", f"[search]\n{line}\n") if line else text)
    return p


@pytest.mark.parametrize("line, want", [("", False), ("pdl = false", False), ("pdl = true", True)])
def test_the_switch_is_off_unless_asked_for(tmp_path, line, want):
    assert load_manifest(_with_search_line(tmp_path, line)).search.pdl is want


def _jobs(manifest, db, tmp_path):
    """The kernel jobs a replay build of ``manifest`` over ``db`` asks for."""
    runner = ReplayRunner(MeasurementDB(db).read(), name="the default database")
    asked = []
    run = runner.run
    # ``jobs`` may be a stream filled as cubins compile: record each as it is taken
    runner.run = lambda jobs: run(asked.append(j) or j for j in jobs)
    b = Build(manifest, tmp_path / "build.jsonl", ArtifactCache(tmp_path / "c"), tmp_path,
              runner=runner, log=io.StringIO())  # fmt: skip
    b.measure_and_select()
    return [(j.target, j.design) for j in asked if j.kind == JobKind.MEASURE]


@needs_nvcc
def test_off_the_build_is_what_it_was(tmp_path, artifact_cache, monkeypatch):
    """The key absent and ``pdl = false``: the same jobs and the same table bytes (but
    for the manifest's own sha256, which the table records); ``pdl = true``: the same
    build proposes PDL designs, so the comparison sees the switch."""
    monkeypatch.setattr("cudal2.pipeline.build.gpu_names", lambda: [])
    src = default_manifest_path().with_name("default.measurements.jsonl")
    tables, jobs = [], []
    for i, line in enumerate(("", "pdl = false", "pdl = true")):
        d = tmp_path / str(i)
        d.mkdir()
        m = _with_search_line(d, line)
        db = d / "db.jsonl"
        shutil.copyfile(src, db)
        jobs.append(_jobs(load_manifest(m), db, d))
        if i == 2:
            break
        out = d / "dist"
        argv = [str(m), "--measurements", str(db), "--out", str(out)]
        assert build_cli.main([*argv, "--cache", str(artifact_cache.root)]) == 0
        (w,) = out.glob("*.whl")
        with zipfile.ZipFile(w) as z:
            raw = z.read(next(n for n in z.namelist() if n.endswith("/dispatch.json")))
        sha = load_manifest(m).sha256
        assert sha.encode() in raw
        tables.append(raw.replace(sha.encode(), b"<manifest sha256>"))
    assert tables[0] == tables[1]
    assert jobs[0] == jobs[1] and not any(is_pdl(d) for _, d in jobs[0])
    assert len(jobs[2]) == len(jobs[0])  # the candidates the manifest asks for
    assert sum(is_pdl(d) for _, d in jobs[2]) == 32 * pdl_candidates(10)


# -- selection ----------------------------------------------------------------------------


class CleanMemcheck(ReplayRunner):
    """The replay runner standing in for the GPU, compute-sanitizer included: a memcheck
    without a recorded verdict is answered clean (as in tests/pipeline/test_loop.py)."""

    def answer(self, job):
        res = super().answer(job)
        if job.kind == JobKind.SANITIZE and not res.recorded:
            return JobResult(job, Status.OK)
        return res


def _pdl_record(base: Measurement, design: KernelDesign, us: float, **kw) -> Measurement:
    """``base`` (a recorded H100 measurement) as PDL design ``design``, its kernel
    samples scaled to median ``us``, beside the same torch samples."""
    factor = us / base.median_us
    samples = tuple(s * factor for s in base.samples_us)
    return dataclasses.replace(
        base,
        design=design,
        design_key=design.key,
        artifact_key=artifact_key_of(design),
        samples_us=samples,
        median_us=us,
        **kw,
    )


@needs_nvcc
def test_a_pdl_design_ships_only_with_a_passed_pair_check(tmp_path, recorded, artifact_cache):
    m = load_manifest(MANIFEST)
    t = m.targets[0]
    search = dataclasses.replace(
        m.search, proposer="grid", rounds=1, candidates=8, profile_top=0, pdl=True
    )
    m = dataclasses.replace(m, search=search, targets=[t])
    space = recorded_space(recorded)
    proposed = make_proposer("grid", space=space, pdl=True).propose(t, [], 8)
    tile = proposed[0]
    entry, after, before = proposed[1:4]
    base = next(
        x for x in recorded if x.target == t and x.design_key == tile.key and x.status == "ok"
    )
    # Faster than every recorded kernel of the target (32.8 us) and cuBLASLt (35.6 us),
    # slower than the physical floor a record must respect (26.95 us): failed <
    # unchecked < passed, so only the gate keeps the first two from winning.
    failed = _pdl_record(
        base, entry, 28.0, status=Status.INCORRECT, metrics={**base.metrics, PAIR_METRIC: 0.0},
        error="PDL pair check, round 1: 12 output elements were written while the producer ran",
    )  # fmt: skip
    unchecked = _pdl_record(base, after, 29.0)  # no pair check on record
    assert PAIR_METRIC not in unchecked.metrics
    passed = _pdl_record(base, before, 30.0, metrics={**base.metrics, PAIR_METRIC: 1.0})
    runner = CleanMemcheck([*recorded, failed, unchecked, passed], name="hold-out + PDL")
    log = io.StringIO()
    b = Build(m, tmp_path / "db.jsonl", artifact_cache, tmp_path, runner=runner, log=log)
    assert b.manifest.search.pdl
    (sel,), missing = b.measure_and_select()
    assert missing == []
    written = MeasurementDB(b.db.path).read()
    by_key = {w.design_key: w for w in written}
    # all three were proposed and measured (replayed); the failure is a failure
    assert {entry.key, after.key, before.key} <= set(by_key)
    assert by_key[entry.key].status == Status.INCORRECT
    assert Counter(is_pdl(w.design) for w in written if w.design)[True] == 3
    # the fastest record is the pair-check failure, then the unchecked one: neither wins
    assert sel.kind == "kernel" and sel.winner.design_key == before.key
    # the dispatch table of this build's records and checks: the PDL recipe ships
    contents = b.db.load()
    table, _ = table_from_measurements(
        contents.measurements, m.timing_mode, artifact_cache, "pdl", contents.checks
    )
    (entry_,) = [e for e in table.entries if e.kind == "kernel"]
    assert entry_.launch.get("pdl") is True


# -- the dry run --------------------------------------------------------------------------


@needs_nvcc
@pytest.mark.parametrize("pdl", [False, True])
def test_the_dry_run_counts_pdl_candidates(tmp_path, artifact_cache, pdl):
    m = load_manifest(_with_search_line(tmp_path, f"pdl = {str(pdl).lower()}"))
    report = export_job(m, tmp_path / "none.jsonl", artifact_cache, None, gpu=None)
    s = describe(m, report, tmp_path / "none.jsonl")
    n = m.search.candidates
    per_target = pdl_candidates(n) if pdl else 0
    assert s["pdl"] is pdl
    assert s["pdl_per_round"] == len(m.targets) * per_target
    assert s["pdl_candidates"] == len(m.targets) * per_target  # the legal space has tiles enough
    assert s["candidates"] == len(m.targets) * n
    text = build_cli._dry_text(s)
    assert ("PDL on" in text) is pdl
    if pdl:
        assert f"{s['pdl_candidates']} of the next job's {s['candidates']} candidates" in text


# -- the H100 build ------------------------------------------------------------------------

PDL_BUILD = Path(__file__).resolve().parents[2] / "bench/manifests/pdl-decode-h100.toml"


def test_the_h100_pdl_build_ships_pair_checked_pdl_winners():
    """bench/manifests/pdl-decode-h100.toml was built on the H100 (ci/gpu_pdl_build.sh):
    its recorded database selects PDL designs for some targets, each with its passed pair
    check on record, and every record of a PDL design carries the check's outcome."""
    from cudal2.pipeline.select import select

    m = load_manifest(PDL_BUILD)
    assert m.search.pdl
    records = MeasurementDB(default_database(PDL_BUILD)).read()
    pdl_records = [r for r in records if r.design is not None and is_pdl(r.design)]
    assert pdl_records and all(PAIR_METRIC in r.metrics for r in pdl_records if r.status == "ok")
    selections, missing = select(m.targets, records, m.timing_mode)
    assert not missing and len(selections) == len(m.targets)
    winners = [s.winner for s in selections if s.kind == "kernel" and is_pdl(s.winner.design)]
    assert winners, "no target of the H100 PDL build selects a PDL design"
    assert all(w.metrics[PAIR_METRIC] == 1.0 for w in winners)
