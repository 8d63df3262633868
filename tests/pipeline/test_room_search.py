"""Builds that search designs that leave room (issue 20 item 3, manifest ``[search] room =
true`` beside ``pdl = true``), on CPU: room tiles in every proposer's space, each
measured with PDL only; the incumbent's room variants right after its PDL variants; the
proposer behind seeing a room tile by its fastest PDL variant; the manifest switch (off
by default, refused without PDL) and the dry run's count."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from cudal2.cli import build as build_cli
from cudal2.database import MeasurementDB
from cudal2.generator import legality
from cudal2.generator.families.base import with_pdl, with_room
from cudal2.generator.space import pdl_variants, room_variants
from cudal2.manifest import ManifestError, default_manifest_path, load_manifest
from cudal2.pipeline.split import describe, export_job
from cudal2.policy import PROPOSERS, make_proposer
from cudal2.policy.base import search_space
from cudal2.policy.pdl import PdlProposer, is_pdl
from cudal2.policy.room import is_room, room_pdl_variants, room_space, room_tile_records
from cudal2.records import Measurement, Target

ROOT = Path(__file__).resolve().parents[2]
# The H100 records of llm-public: at M <= 256, 13 of its targets' fastest kernels are
# sm90direct tiles with room variants
DATA = ROOT / "manifests" / "llm-public-h100.measurements.jsonl.gz"
DECODE = Target("sm_90a", "fp16", "tn", 16, 4096, 4096)
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="artifact keys need nvcc")


@pytest.fixture(scope="module")
def recorded() -> list[Measurement]:
    return MeasurementDB(DATA).load(warn=False).measurements


# -- the space and the proposals --------------------------------------------------------


def test_the_room_space_holds_each_tiles_legal_room_variants_after_it():
    space = list(room_space(["sm90direct"], None)(DECODE))
    plain = search_space(DECODE, ["sm90direct"])
    assert [d for d in space if not is_room(d)] == plain  # the plain space, in order
    rooms = [d for d in space if is_room(d)]
    assert rooms and all(legality(d) == [] and not is_pdl(d) for d in rooms)
    assert rooms == [r for d in plain for r in room_variants(d)]
    # a family that renders no room adds nothing
    assert list(room_space(["sm90tma"], None)(DECODE)) == search_space(DECODE, ["sm90tma"])


@pytest.mark.parametrize("name", PROPOSERS)
@pytest.mark.parametrize("n", [1, 8, 10])
def test_every_room_candidate_is_a_pdl_design(name, n):
    """Whatever the proposer picks, a room design is proposed launched with PDL only,
    and the round has the candidates the manifest asks for."""
    kw = {"gpu": "NVIDIA H100 80GB HBM3", "updates": False} if name == "policy" else {}
    fams = ["sm90direct", "sm90stream"]
    got = make_proposer(name, families=fams, pdl=True, room=True, **kw).propose(DECODE, [], n)
    assert len(got) == n == len({d.key for d in got})
    assert all(is_pdl(d) for d in got if is_room(d))
    assert all(legality(d) == [] for d in got)
    # a room tile is never proposed without its PDL: its group is its variants
    for d in got:
        if is_room(d):
            assert d in pdl_variants(with_pdl(d, "none"))


def test_grid_search_proposes_room_designs_where_the_model_credits_them(monkeypatch):
    """With the first prior's credit (1 µs) the grid proposes room tiles; with the credit
    measured on the H100 (0.04 µs, policy/cost_model.py) a room tile ranks just above its
    twin and the fastest tiles of the space come first."""
    from cudal2.policy import cost_model

    monkeypatch.setattr(cost_model, "ROOM_OVERLAP_S", 1.0e-6)
    got = make_proposer("grid", families=["sm90direct"], pdl=True, room=True).propose(
        DECODE, [], 12
    )
    assert any(is_room(d) for d in got)


def test_room_needs_pdl():
    with pytest.raises(ValueError, match="room needs pdl"):
        make_proposer("grid", room=True)


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


def _roomy_target(recorded):
    """A decode target whose fastest correct plain record has room variants."""
    by_target = {}
    for m in recorded:
        if m.design is not None and not is_pdl(m.design) and m.status == "ok" and m.median_us:
            have = by_target.get(m.target)
            if have is None or (m.median_us, m.design_key) < (have.median_us, have.design_key):
                by_target[m.target] = m
    for t, best in sorted(by_target.items(), key=lambda kv: str(kv[0])):
        if t.m <= 256 and room_variants(best.design):
            return t, best
    raise AssertionError("no recorded decode incumbent has room variants")


def test_the_incumbents_room_variants_follow_its_trigger_points(recorded):
    t, best = _roomy_target(recorded)
    history = [m for m in recorded if m.target == t and not is_pdl(m.design)]
    fresh = [with_room(best.design, "none")]  # nothing new to it: the incumbent only
    p = PdlProposer(_Inner([]), room=True)
    got = p.propose(t, history, 64)
    expect = [*pdl_variants(best.design), *room_pdl_variants(best.design)]
    assert got == expect and all(is_room(d) for d in got[3:]) and len(got) > 3
    assert fresh[0] == best.design
    # without room: its trigger points only, as before
    assert PdlProposer(_Inner([])).propose(t, history, 64) == expect[:3]
    # once measured, not again
    measured = [dataclasses.replace(best, design=d, design_key=d.key) for d in got]
    assert p.propose(t, [*history, *measured], 64) == []


def test_the_proposer_behind_sees_a_room_tile_by_its_fastest_pdl_variant(recorded):
    t, best = _roomy_target(recorded)
    tile = room_variants(best.design)[0]
    a, b, c = pdl_variants(tile)
    ms = [
        dataclasses.replace(best, design=a, design_key=a.key, median_us=best.median_us * 1.1),
        dataclasses.replace(best, design=b, design_key=b.key, median_us=best.median_us * 0.9),
        dataclasses.replace(best, design=c, design_key=c.key, status="incorrect", median_us=None),
    ]
    (seen,) = room_tile_records(ms)
    assert seen.design == tile and seen.design_key == tile.key
    assert seen.median_us == best.median_us * 0.9
    inner = _Inner([tile])
    p = PdlProposer(inner, room=True)
    assert p.propose(t, ms, 4) == []  # no plain record: no incumbent; the tile is measured
    assert tile.key in {m.design_key for m in inner.histories[-1]}  # to the proposer behind
    p.observe(ms)
    assert [m.design for m in inner.observed[-1]] == [tile]
    # without room the PDL records are hidden from it, as before
    q = PdlProposer(_Inner([]))
    q.observe(ms)
    assert q.inner.observed == [[]]


def test_a_replayed_space_gives_the_room_tiles_of_its_recorded_room_designs(recorded):
    t, best = _roomy_target(recorded)
    tile = room_variants(best.design)[0]
    given = [best.design, *pdl_variants(tile)]
    space = room_space(None, lambda _t: given)(t)
    assert space == [*given, tile]
    assert search_space(t, None, lambda _t: space) == [best.design, tile]


# -- the manifest switch and the dry run ------------------------------------------------


def _with_search_lines(tmp_path: Path, *lines: str) -> Path:
    text = default_manifest_path().read_text()
    p = tmp_path / "default.toml"
    p.write_text(text.replace("[search]\n", "[search]\n" + "".join(f"{x}\n" for x in lines)))
    return p


@pytest.mark.parametrize(
    "lines, want",
    [((), False), (("room = false",), False), (("pdl = true", "room = true"), True)],
)
def test_the_switch_is_off_unless_asked_for(tmp_path, lines, want):
    assert load_manifest(_with_search_lines(tmp_path, *lines)).search.room is want


def test_room_without_pdl_is_refused_with_its_key_path(tmp_path):
    with pytest.raises(ManifestError) as e:
        load_manifest(_with_search_lines(tmp_path, "room = true"))
    assert e.value.key_path == "search.room" and "set search.pdl = true" in str(e.value)


@needs_nvcc
@pytest.mark.parametrize("on", [False, True])
def test_the_dry_run_counts_room_candidates(tmp_path, artifact_cache, on, monkeypatch):
    from cudal2.policy import cost_model

    monkeypatch.setattr(cost_model, "ROOM_OVERLAP_S", 1.0e-6)  # the grid proposes room tiles
    lines = ("pdl = true", "room = true") if on else ("pdl = true",)
    m = load_manifest(_with_search_lines(tmp_path, *lines, 'families = ["sm90direct"]'))
    decode = [t for t in m.targets if t.m <= 256 and t.layout == "tn"]
    m = dataclasses.replace(m, targets=decode[:2])
    report = export_job(m, tmp_path / "none.jsonl", artifact_cache, None, gpu=None)
    s = describe(m, report, tmp_path / "none.jsonl")
    assert s["room"] is on
    assert (s["room_candidates"] > 0) is on
    assert s["room_candidates"] <= s["pdl_candidates"]  # every room candidate is PDL
    text = build_cli._dry_text(s)
    assert ("room on" in text) is on
    if on:
        assert f"{s['room_candidates']} of the next job's {s['candidates']} candidates" in text
