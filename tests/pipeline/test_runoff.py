"""Run-offs (``pipeline.runoff``; ``select.contested``, ``ran_off``)
against the committed llm-public H100 database, whose last records are the H100's
run-offs of 2026-12-06 (``ci/gpu_runoff.sh``, ``bench/results/h100-runoff-llm-public.json``):
the database before them (``before``) is the committed one less its records that carry
a rival's baseline."""

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
    _ratio,
    contested,
    is_runoff,
    noise,
    ran_off,
    select,
)
from cudal2.records import TimingConfig
from cudal2.verify.replay import ReplayRunner

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="artifact keys need nvcc")

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "manifests/llm-public-h100.toml"
SUMMARY = ROOT / "bench/results/h100-runoff-llm-public.json"


def _rival(m) -> str | None:
    """The design key of the algorithm a run-off record timed beside its kernel."""
    return next((k for k in m.baselines_us if k.startswith("cublaslt:")), None)


@pytest.fixture(scope="module")
def llm_public():
    manifest = load_manifest(MANIFEST)
    records = list(
        MeasurementDB(default_database(MANIFEST), manifest.reuse).load(warn=False).measurements
    )
    runoffs = [m for m in records if is_runoff(m)]
    before = believable(latest([m for m in records if not is_runoff(m)]))
    after = believable(latest(records))
    return manifest, before, after, runoffs


def test_the_contested_pairs_are_a_targets_close_kernel_and_algorithm(llm_public):
    manifest, before, _, _ = llm_public
    usable = shippable()
    pairs = contested(manifest.targets, before, manifest.timing_mode, usable)
    assert len(pairs) == 55  # the first wave of the H100 run (runoff.txt)
    for k, v in pairs:
        assert not k.is_vendor and v.is_vendor and usable(k)
        assert (k.gpu.name, k.target) == (v.gpu.name, v.target)
        assert max(_ratio(k), _ratio(v)) / min(_ratio(k), _ratio(v)) - 1 < RUNOFF_MARGIN
    assert contested(manifest.targets, before, manifest.timing_mode, usable, margin=0.0) == []
    # once run off, nothing is contested any more
    assert contested(manifest.targets, llm_public[2], manifest.timing_mode, usable) == []


def _replayed(manifest, before, runner):
    """The run-off loop over ``before`` on ``runner`` (a replay: no cubins): the history
    it returns, its outcomes and the records it appended."""
    appended = []
    timing = TimingConfig(mode=manifest.timing_mode, seed=manifest.search.seed)
    no_cubins = lambda ms: {m.artifact_key: "" for m in ms}  # noqa: E731
    args = (manifest.targets, manifest.timing_mode, shippable(), timing, no_cubins)
    history, outcomes = run_off(runner, runner.start(), before, *args, appended.extend)
    return history, outcomes, appended


def test_replaying_the_h100_run_offs_gives_the_committed_records(llm_public):
    """The run-off loop, on a replay of the committed database, asks for the run-offs the
    H100 ran, in the same waves, and makes of each answer the committed record."""
    manifest, before, after, runoffs = llm_public
    history, outcomes, appended = _replayed(manifest, before, ReplayRunner(runoffs))
    summary = json.loads(SUMMARY.read_text())[0]["runoffs"]
    assert [o.as_json() for o in outcomes] == summary
    assert len(appended) == len(runoffs) == 79
    for new, old in zip(appended, runoffs, strict=True):
        assert new.reuse_key == old.reuse_key and new.baselines_us == old.baselines_us
        assert new.samples_us == old.samples_us and new.metrics == old.metrics

    def picks(h):
        sels = select(manifest.targets, h, manifest.timing_mode, shippable())[0]
        return [(s.target, s.kind, s.winner and s.winner.design_key, s.time_us) for s in sels]

    assert picks(history) == picks(after)


def test_a_run_off_orders_the_kernel_and_the_algorithm(llm_public, monkeypatch):
    """Where the records of different runs put the kernel first and the run-off the
    algorithm (fp16 1024x28672x4096: 1.026x and 1.017x torch in their runs; the kernel
    0.98x the algorithm beside it), the algorithm ships; without the run-off, the kernel."""
    manifest, before, after, runoffs = llm_public
    usable = shippable()
    sels = {
        s.target.label: s for s in select(manifest.targets, after, manifest.timing_mode, usable)[0]
    }
    flipped = sels["fp16/tn 1024x28672x4096"]
    assert flipped.kind == "cublaslt"
    first = {
        k.target: (k, v)
        for k, v in contested(manifest.targets, before, manifest.timing_mode, usable)
    }
    k0, v0 = first[flipped.target]  # first by their own runs: the kernel
    assert _ratio(k0) < _ratio(v0) and v0.design_key == flipped.winner.design_key
    kernel = next(m for m in runoffs if m.reuse_key == k0.reuse_key)
    assert ran_off(kernel, v0) < 1  # beside it, the algorithm
    # A kernel that lost its run-off ships only where its algorithm's own record does not
    # beat torch beyond its noise (three targets: docs/kernels.md, "Run-offs")
    vendors = {(m.target, m.design_key): m for m in after if m.is_vendor}
    lost = []
    for s in sels.values():
        algo = vendors.get((s.target, _rival(s.winner))) if s.kind == "kernel" else None
        if algo is not None and ran_off(s.winner, algo) < 1:
            assert 1.0 / _ratio(algo) - 1.0 <= noise(algo), s.target.label
            lost.append(s.target.label)
    assert len(lost) == 3
    monkeypatch.setattr(select_mod, "ran_off", lambda k, v: None)
    blind = {
        s.target.label: s for s in select(manifest.targets, after, manifest.timing_mode, usable)[0]
    }
    assert blind["fp16/tn 1024x28672x4096"].kind == "kernel"


def test_a_run_off_the_kernel_fails_is_recorded_and_rejects_it(llm_public):
    """A kernel wrong in its run-off is recorded wrong: its key's newest record, so it
    never ships again (a rejected kernel stays rejected)."""
    manifest, before, _, runoffs = llm_public
    first = runoffs[0]
    wrong = dataclasses.replace(first, status="incorrect", error="max abs err 3.2 > bound 0.01")

    class Wrong(ReplayRunner):
        def answer(self, job):
            res = super().answer(job)
            if job.reuse_key(first.gpu.name) == first.reuse_key:
                return dataclasses.replace(res, status=wrong.status, error=wrong.error)
            return res

    history, outcomes, appended = _replayed(manifest, before, Wrong(runoffs))
    rec = next(m for m in appended if m.reuse_key == first.reuse_key)
    assert rec.status == "incorrect" and rec.error == wrong.error
    assert next(o for o in outcomes if o.kernel == first.design_key).status == "incorrect"
    sels = select(manifest.targets, history, manifest.timing_mode, shippable())[0]
    assert all(s.winner is None or s.winner.reuse_key != first.reuse_key for s in sels)
