"""Eager alternatives in the selection (``pipeline.select``, ``[build]
eager_host_saving_us``), from the committed llama-3.1-8b-hf-h100 database: the boundary
taken from a recorded target's actual gap, the manifest's setting from the committed
host-overhead run, and the sanitizer gate over the alternatives."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil

import pytest

from cudal2.cli.build import _summary
from cudal2.database import MeasurementDB
from cudal2.generator.compile import ArtifactCache
from cudal2.manifest import default_manifest_path, load_manifest
from cudal2.pipeline.build import Build, believable, latest, shippable
from cudal2.pipeline.gate import shipped_kernels
from cudal2.pipeline.select import EAGER_MAX_M, pair_checked, select

from ..conftest import EAGER_STEM, committed_db, eager_selections

ROOT = default_manifest_path().parents[1]


@pytest.fixture(scope="module")
def llama():
    manifest = load_manifest(default_manifest_path().with_name(f"{EAGER_STEM}.toml"))
    history = believable(latest(MeasurementDB(committed_db(EAGER_STEM)).load().measurements))
    return manifest, history


def _best_kernel(history, sel, usable):
    """The fastest usable timed kernel of a selection's target on its GPU (the rule's
    candidate, found here independently)."""
    ks = [
        m
        for m in history
        if m.target == sel.target
        and m.gpu.name == sel.gpu
        and m.mode == "offline"
        and not m.is_vendor
        and m.status == "ok"
        and m.median_us
        and pair_checked(m)
        and usable(m)
    ]
    return min(ks, key=lambda m: (m.median_us, m.design_key), default=None)


def test_the_manifest_setting_is_the_committed_host_saving():
    """``eager_host_saving_us`` = F_linear - op_linear_native of the committed run."""
    run = json.loads((ROOT / "bench/results/h100-host-overhead.json").read_text())
    per_call = run["host_us_per_call"]
    manifest = load_manifest(default_manifest_path().with_name(f"{EAGER_STEM}.toml"))
    assert manifest.eager_host_saving_us == round(
        per_call["F_linear"] - per_call["op_linear_native"], 2
    )
    # Every other committed manifest asks for none: its tables stay as they were.
    for path in sorted(default_manifest_path().parent.glob("*.toml")):
        if path.stem != EAGER_STEM:
            assert load_manifest(path).eager_host_saving_us == 0.0, path.name


def test_the_alternative_appears_at_the_recorded_gap(llama):
    """64x1024x4096: cuBLASLt is selected; the fastest own kernel is slower by a
    recorded gap. A host saving just above the gap gives it as the alternative, just
    below (and 0) gives none."""
    manifest, history = llama
    usable = shippable()
    target = next(t for t in manifest.targets if (t.m, t.n, t.k) == (64, 1024, 4096))
    (base,) = select([target], history, "offline", usable)[0]
    assert base.kind == "cublaslt" and base.eager is None
    best = _best_kernel(history, base, usable)
    gap = best.median_us - base.time_us
    assert 0 < gap < manifest.eager_host_saving_us, gap  # recorded: 9.55 vs 8.98
    for saving, wanted in ((gap + 0.01, best), (gap - 0.01, None), (0.0, None)):
        (sel,) = select([target], history, "offline", usable, saving)[0]
        assert sel.eager == wanted, saving
        # The selection itself is what it was: only the alternative is added.
        assert dataclasses.replace(sel, eager=None) == base


def test_the_rule_at_the_manifest_setting(llama):
    """Every selection, all token counts: an alternative exactly where the target's
    selection is not a kernel and its fastest usable kernel is within the saving; at
    M = 64 (the decode batch the eager benchmark missed) the targets that get one."""
    manifest, history = llama
    usable = shippable()
    saving = manifest.eager_host_saving_us
    sels, _ = select(manifest.targets, history, "offline", usable, saving)
    got = 0
    for s in sels:
        best = _best_kernel(history, s, usable)
        wanted = (
            s.kind != "kernel"
            and best is not None
            and best.median_us - s.time_us < saving
            and s.target.m <= EAGER_MAX_M  # decode-sized only: prefill is GPU-bound
        )
        assert (s.eager is not None) == wanted, s.target
        if s.eager is not None:
            assert s.eager == best and s.eager.design is not None
            got += 1
    assert got
    at64 = {
        (s.target.n, s.target.k): (s.kind, s.time_us, s.eager.median_us)
        for s in eager_selections(64)
        if s.eager is not None
    }
    print("M = 64 entries with an eager alternative (kind, time_us, alternative's us):")
    for (n, k), row in sorted(at64.items()):
        print(f"  {n}x{k}: {row}")
    assert set(at64) == {(1024, 4096), (4096, 4096), (4096, 14336), (14336, 4096)}


def test_a_prefill_target_within_the_saving_gets_no_alternative(llama):
    """The 2,048-token 4096x4096 target's fastest kernel is within the saving of its
    fallback (recorded), yet prefill is GPU-bound: no alternative above EAGER_MAX_M."""
    manifest, history = llama
    usable = shippable()
    saving = manifest.eager_host_saving_us
    sels, _ = select(manifest.targets, history, "offline", usable, saving)
    (s,) = [x for x in sels if (x.target.m, x.target.n, x.target.k) == (2048, 4096, 4096)]
    best = _best_kernel(history, s, usable)
    assert s.kind != "kernel" and best.median_us - s.time_us < saving and s.target.m > EAGER_MAX_M
    assert s.eager is None


def test_no_saving_means_no_alternative_anywhere(llama):
    manifest, history = llama
    plain, _ = select(manifest.targets, history, "offline", shippable())
    assert not any(s.eager for s in plain)
    zero, _ = select(manifest.targets, history, "offline", shippable(), 0.0)
    assert zero == plain


def test_shipped_kernels_are_the_winners_and_the_alternatives():
    sels = eager_selections(64)
    want = []
    for s in sels:
        if s.kind == "kernel":
            want.append(s.winner)
        if s.eager is not None:
            want.append(s.eager)
    assert shipped_kernels(sels) == want and any(s.eager for s in sels)


class Proposes:
    """Proposes nothing: the selection reads the whole database (see test_memcheck)."""

    name = "none"

    def propose(self, target, history, n):
        return []

    def observe(self, measurements):
        return None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="artifact keys need nvcc")
def test_a_cpu_build_ships_no_alternative_without_a_clean_check(
    tmp_path, monkeypatch, db_unchecked
):
    """Without sanitizer checks on record (the committed database without its check
    lines), a CPU build ships no alternative and says how many wait."""
    monkeypatch.setattr("cudal2.pipeline.build.gpu_names", lambda: [])
    manifest = load_manifest(default_manifest_path().with_name(f"{EAGER_STEM}.toml"))
    log = io.StringIO()
    b = Build(
        manifest,
        db_unchecked(EAGER_STEM),
        ArtifactCache(tmp_path / "c"),
        tmp_path,
        proposer=Proposes(),
        log=log,
    )
    selections, _ = b.measure_and_select()
    assert not any(s.eager for s in selections)
    ungated = [s for s in eager_selections(None) if s.eager is not None]
    assert b.gate.eager_waiting == {(s.gpu, s.target) for s in ungated}
    assert f"{len(ungated)} eager alternatives are not shipped until compute-sanitizer" in (
        log.getvalue()
    )


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="artifact keys need nvcc")
def test_the_memcheck_run_checks_the_alternatives_and_the_build_then_ships_them(
    tmp_path, monkeypatch, capsys
):
    """``ci/gpu_memcheck.sh``'s entry point (a replay standing in for the H100, whose
    memcheck passes) checks each alternative as a winner; a CPU build from that database
    then ships them: at M = 64 the four targets of ``test_the_rule_at_the_manifest_setting``."""
    from cudal2.pipeline import memcheck

    from .test_memcheck import Memcheck

    db = tmp_path / f"{EAGER_STEM}.measurements.jsonl"
    shutil.copyfile(committed_db(EAGER_STEM), db)
    records = MeasurementDB(db).read()
    manifest_path = default_manifest_path().with_name(f"{EAGER_STEM}.toml")
    argv = ["--db", str(manifest_path), str(db)]
    assert memcheck.main(argv, make_runner=lambda a: Memcheck(records)) == 0
    ungated = {(s.gpu, s.target): s.eager for s in eager_selections(None) if s.eager}
    checked = MeasurementDB(db).load().checks
    assert {c.artifact_key for c in checked} >= {w.artifact_key for w in ungated.values()}

    monkeypatch.setattr("cudal2.pipeline.build.gpu_names", lambda: [])
    log = io.StringIO()
    b = Build(
        load_manifest(manifest_path),
        db,
        ArtifactCache(tmp_path / "c"),
        tmp_path / "dist",
        proposer=Proposes(),
        log=log,
    )
    report = b.run()
    got = {(e.gpu, e.n, e.k, e.m_measured): e for e in report.table.entries if e.eager}
    assert {(g, t.n, t.k, t.m) for g, t in ungated} == set(got)
    assert "eager alternatives are not shipped" not in log.getvalue()
    print("entries of the llama-3.1-8b-hf-h100 wheel with an eager alternative:")
    for (_, n, k, m), e in sorted(got.items(), key=lambda x: (x[0][3], x[0][1], x[0][2])):
        print(f"  m{m} {n}x{k}: {e.kind} {e.time_us} us -> {e.eager.kernel} {e.eager.time_us} us")
    summary = _summary(report)  # what cudal2-build prints
    assert f"{len(got)} eager alternatives (an own kernel launched" in summary
    assert all(e.eager.kernel in summary for e in got.values())
    at64 = {(n, k) for (_, n, k, m) in got if m == 64}
    assert at64 == {(1024, 4096), (4096, 4096), (4096, 14336), (14336, 4096)}
