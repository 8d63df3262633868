"""Run-offs (``pipeline.runoff``; ``select.contested``, ``ran_off``, ``settled_view``)
against the committed llm-public H100 database, whose last records are the H100's
run-offs: its first (2026-12-06, ``bench/results/h100-runoff-llm-public.json``), taken
at once, and those of the prefill targets in the declared timing state (the same day,
later: each after 2 s of its callables, ``bench/results/h100-runoff-llm-public-declared.json``).
``first``: the database before the declared run-offs (the committed one less the records
that carry a rival's baseline and a settling); ``declared``: those records."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from cudal2.database import MeasurementDB, default_database, latest
from cudal2.manifest import load_manifest
from cudal2.pipeline import select as select_mod
from cudal2.pipeline.build import believable, shippable
from cudal2.pipeline.runoff import run_off
from cudal2.pipeline.select import (
    RUNOFF_MARGIN,
    RUNOFF_SETTLE_MS,
    SETTLE_METRIC,
    SETTLE_MIN_M,
    _ratio,
    contested,
    is_runoff,
    noise,
    ran_off,
    select,
    settled_view,
)
from cudal2.records import TimingConfig
from cudal2.verify.replay import ReplayRunner

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="artifact keys need nvcc")

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "manifests/llm-public-h100.toml"
SUMMARY = ROOT / "bench/results/h100-runoff-llm-public-declared.json"


def _rival(m) -> str | None:
    """The design key of the algorithm a run-off record timed beside its kernel."""
    return next((k for k in m.baselines_us if k.startswith("cublaslt:")), None)


def _declared(m) -> bool:
    return is_runoff(m) and SETTLE_METRIC in m.metrics


@pytest.fixture(scope="module")
def llm_public():
    manifest = load_manifest(MANIFEST)
    records = list(
        MeasurementDB(default_database(MANIFEST), manifest.reuse).load(warn=False).measurements
    )
    declared = [m for m in records if _declared(m)]
    first = believable(latest([m for m in records if not _declared(m)]))
    after = believable(latest(records))
    return manifest, first, after, declared, records


def _picks(manifest, history, usable=None):
    usable = usable or shippable()
    sels = select(manifest.targets, history, manifest.timing_mode, usable)[0]
    return {s.target.label: s for s in sels}


def test_the_contested_pairs_are_prefill_targets_close_kernel_and_algorithm(llm_public):
    """Over the database of the first run-offs, only prefill targets are contested: their
    first run-offs were not taken in the declared state, the decode ones' stand."""
    manifest, first, after, _, _ = llm_public
    usable = shippable()
    pairs = contested(manifest.targets, first, manifest.timing_mode, usable)
    assert len(pairs) == 30  # the first wave of the H100 run (runoff.txt)
    for k, v in pairs:
        assert not k.is_vendor and v.is_vendor and usable(k)
        assert (k.gpu.name, k.target) == (v.gpu.name, v.target)
        assert k.target.m >= SETTLE_MIN_M
        assert max(_ratio(k), _ratio(v)) / min(_ratio(k), _ratio(v)) - 1 < RUNOFF_MARGIN
    assert contested(manifest.targets, first, manifest.timing_mode, usable, margin=0.0) == []
    # once run off in the declared state, nothing is contested any more
    assert contested(manifest.targets, after, manifest.timing_mode, usable) == []


@pytest.mark.parametrize(
    ("which", "m_at_least_1024", "orders"),
    [  # which run-off records order their pair (``ran_off``), by target size and settling
        ("first", False, True),  # decode, taken at once: the declared state of decode
        ("first", True, False),  # prefill, taken at once: straddles two clock states
        ("declared", True, True),  # prefill, settled 2 s
    ],
)
def test_a_prefill_run_off_orders_its_pair_only_when_settled(
    llm_public, which, m_at_least_1024, orders
):
    manifest, _, _, declared, records = llm_public
    runs = declared if which == "declared" else [m for m in records if is_runoff(m)]
    runs = [
        m
        for m in runs
        if (m.target.m >= SETTLE_MIN_M) == m_at_least_1024 and (which == "declared") == _declared(m)
    ]
    vendors = {(m.target, m.design_key): m for m in records if m.is_vendor}
    assert runs
    for m in runs:
        v = vendors[(m.target, _rival(m))]
        assert (ran_off(m, v) is not None) == orders, m.target.label
        assert (m.metrics.get(SETTLE_METRIC) == RUNOFF_SETTLE_MS) == (which == "declared")


def _replayed(manifest, history, runner):
    """The run-off loop over ``history`` on ``runner`` (a replay: no cubins): the history
    it returns, its outcomes and the records it appended."""
    appended = []
    timing = TimingConfig(mode=manifest.timing_mode, seed=manifest.search.seed)
    no_cubins = lambda ms: {m.artifact_key: "" for m in ms}  # noqa: E731
    args = (manifest.targets, manifest.timing_mode, shippable(), timing, no_cubins)
    history, outcomes = run_off(runner, runner.start(), history, *args, appended.extend)
    return history, outcomes, appended


def test_replaying_the_declared_run_offs_gives_the_committed_records(llm_public):
    """The run-off loop, on a replay of the database of the first run-offs, asks for the
    run-offs the H100 ran in the declared state, each settled ``RUNOFF_SETTLE_MS``, and
    makes of each answer the committed record: the whole first wave (30), then three of
    the H100's six later ones. The H100 ran its later waves before ``settled_view``: an
    algorithm beaten in its settled run-off was still weighed by its own record there,
    close enough to the next kernel to contest it (bf16 1024x4096x14336 and, twice, bf16
    4096x4096x14336). Their records stand, and the committed database is the loop's fixed
    point all the same (nothing left contested: the test above)."""
    manifest, first, after, declared, _ = llm_public
    history, outcomes, appended = _replayed(manifest, first, ReplayRunner(declared))
    summary = json.loads(SUMMARY.read_text())[0]["runoffs"]
    got = [o.as_json() for o in outcomes]
    assert got[:30] == summary[:30] and len(summary) == len(declared) == 36
    assert [x for x in summary[30:] if x not in got] == [
        x for x in summary[30:] if x["target"] in EXTRA
    ] and len(got) == 33
    committed = {m.reuse_key: m for m in declared}
    for new in appended:
        old = committed[new.reuse_key]
        assert new.baselines_us == old.baselines_us and new.samples_us == old.samples_us
        assert new.metrics == old.metrics and new.metrics[SETTLE_METRIC] == RUNOFF_SETTLE_MS

    def picks(h):
        return {
            t: (s.kind, s.winner and s.winner.design_key) for t, s in _picks(manifest, h).items()
        }

    replayed, shipped = picks(history), picks(after)
    assert {t for t in shipped if shipped[t] != replayed[t]} == {"bf16/tn 4096x4096x14336"}


# The targets of the H100's later-wave run-offs that the loop no longer asks for.
EXTRA = ("bf16/tn 1024x4096x14336", "bf16/tn 4096x4096x14336")


def test_the_declared_run_off_ships_the_algorithm_whose_records_disagreed(llm_public, monkeypatch):
    """fp16 4096x6144x4096: the algorithm's own records put it at 1.00x torch in some runs
    and 1.04x in others (each run's samples straddle the clock's step into the power
    limit), its newest at 1.006x, inside its noise: the target fell back, 0.96x the best
    vendor in every bench. Settled beside torch, the algorithm beats it beyond its noise
    and ships; weighed by its own record instead (no ``settled_view``), it cannot, and
    the kernel it beat in the run-off ships."""
    manifest, first, after, _, records = llm_public
    label = "fp16/tn 4096x6144x4096"
    before, now = _picks(manifest, first)[label], _picks(manifest, after)[label]
    assert before.kind == "fallback" and now.kind == "cublaslt"
    own = [
        m
        for m in records
        if m.design_key == now.winner.design_key and m.target == now.target and m.mode == "offline"
    ]
    speedups = [1.0 / _ratio(m) for m in own]
    assert sum(s >= 1.03 for s in speedups) >= 3 and sum(s <= 1.01 for s in speedups) >= 3
    assert 1.0 / _ratio(own[-1]) - 1.0 <= noise(own[-1])  # its newest: no evidence
    assert now.speedup - 1.0 > now.spread  # settled: beyond its noise
    monkeypatch.setattr(select_mod, "settled_view", lambda v, timed: v)
    assert _picks(manifest, after)[label].kind == "kernel"


def test_the_algorithm_is_weighed_by_its_run_off_whichever_kernel_it_ran_beside(llm_public):
    """bf16 1024x4096x4096: the algorithm's settled run-off was beside one kernel; the
    build's gate pairs it with another (one memchecked). Its run-off still weighs it
    (``settled_view``), and it ships either way."""
    manifest, _, after, declared, _ = llm_public
    label = "bf16/tn 1024x4096x4096"
    runoff = next(m for m in declared if m.target.label == label)
    usable = shippable()
    for excluded in (None, runoff.design_key):
        sel = _picks(manifest, after, lambda m, x=excluded: usable(m) and m.design_key != x)
        assert sel[label].kind == "cublaslt" and sel[label].winner.design_key == _rival(runoff)
    timed = [m for m in after if m.target == runoff.target]
    vendor = next(m for m in timed if m.design_key == _rival(runoff))
    view = settled_view(vendor, timed)
    assert view.samples_us == runoff.baseline_samples_us[vendor.design_key]
    assert view.baselines_us == {"torch": runoff.baselines_us["torch"]}


def test_a_run_off_the_kernel_fails_is_recorded_and_rejects_it(llm_public):
    """A kernel wrong in its run-off is recorded wrong: its key's newest record, so it
    never ships again (a rejected kernel stays rejected)."""
    manifest, first, _, declared, _ = llm_public
    wrong_one = declared[0]
    wrong = dataclasses.replace(wrong_one, status="incorrect", error="max abs err 3.2 > bound 0.01")

    class Wrong(ReplayRunner):
        def answer(self, job):
            res = super().answer(job)
            if job.reuse_key(wrong_one.gpu.name) == wrong_one.reuse_key:
                return dataclasses.replace(res, status=wrong.status, error=wrong.error)
            return res

    history, outcomes, appended = _replayed(manifest, first, Wrong(declared))
    rec = next(m for m in appended if m.reuse_key == wrong_one.reuse_key)
    assert rec.status == "incorrect" and rec.error == wrong.error
    assert next(o for o in outcomes if o.kernel == wrong_one.design_key).status == "incorrect"
    sels = select(manifest.targets, history, manifest.timing_mode, shippable())[0]
    assert all(s.winner is None or s.winner.reuse_key != wrong_one.reuse_key for s in sels)
