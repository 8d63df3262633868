"""Designs that leave room (issue 20 item 3): the optional ``room`` knob (left out at its
default, so no existing design's key, name, recipe or source moves), its budgets
(threads, shared memory, the register model against the launch bound's cap), the
rendered launch bound, and (with nvcc) ptxas's registers and spills under the cap."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from cudal2.generator import design_name, design_space, launch_recipe, legality
from cudal2.generator.compile import ArtifactCache, build
from cudal2.generator.families import base, sm90_direct, sm90_stream
from cudal2.generator.render import render
from cudal2.records import KernelDesign, Knobs

ROOM_FAMILIES = ("sm90direct", "sm90stream")
WORD = {"half": "room_half", "quarter": "room_quarter"}


def _first(family: str, layout: str = "tn", **knobs: int) -> KernelDesign:
    return next(
        d
        for d in design_space("sm_90a", "fp16", layout, [family])
        if all(getattr(d.knobs, k) == v for k, v in knobs.items())
    )


def _with(d: KernelDesign, **extra: int) -> KernelDesign:
    return KernelDesign(d.family, d.arch, d.dtype, d.layout, Knobs.of(**d.knobs.as_json(), **extra))


def test_a_plain_design_keeps_its_key_name_recipe_and_source():
    """The knob at its default is left out: ``make`` with room=0 gives the plain key,
    ``with_room(.., "none")`` takes it off again, and the launch bound reads 1 as before."""
    for family in ROOM_FAMILIES:
        d = _first(family)
        assert base.room(d) == "none" and "room" not in d.knobs.names()
        assert base.make(family, "sm_90a", "fp16", "tn", **d.knobs.as_json(), room=0) == d
        assert "room" not in design_name(d) and "room" not in launch_recipe(d)
        assert "__launch_bounds__(THREADS, 1)" in render(d)


@pytest.mark.parametrize("room", ["half", "quarter"])
@pytest.mark.parametrize("family", ROOM_FAMILIES)
def test_a_room_design_is_named_and_compiled_for_its_share_of_an_sm(family, room):
    d = _first(family, bm=8)
    r = base.with_room(d, room)
    assert legality(r) == [], legality(r)
    assert r.key != d.key and base.room(r) == room and base.with_room(r, "none") == d
    assert design_name(r) == f"{design_name(d)}_{WORD[room]}"
    assert launch_recipe(r) == launch_recipe(d)  # the same launch: only the compile differs
    share = {"half": 2, "quarter": 4}[room]
    assert base.room_share(r) == share
    assert f"__launch_bounds__(THREADS, {share})" in render(r)
    # the PDL trigger and the room print in SHARED_KNOBS order
    p = base.with_pdl(r, "entry")
    assert design_name(p) == f"{design_name(d)}_pdl_entry_{WORD[room]}" and legality(p) == []


# Hostile room values and families: (design, the reason's needle).
def _bad():
    direct = _first("sm90direct")
    return [
        ("default-given", _with(direct, room=0), "room=0 is the default: leave it out"),
        ("out-of-domain", _with(direct, room=3), "room=3 is not one of (0, 1, 2)"),
        ("negative", _with(direct, room=-1), "room=-1 is not one of"),
        ("family-without-room", _with(_first("sm90tma"), room=1), "family 'sm90tma' renders"),
        ("sm80mma", _with(_first("sm80mma"), room=2), "room 'quarter': family 'sm80mma'"),
        # 1024 threads x 4 > 2048 resident threads per SM
        (
            "threads",
            base.with_room(
                sm90_direct.design("sm_90a", "fp16", "tn", 8, 8, 4, 64, 2, 1), "quarter"
            ),
            "1024 threads x 4 > 2048",
        ),
        # 8 K-slice warps of bm 64 x (64 + 4) fp32 partial tiles: 139 KB > half an SM
        (
            "smem",
            base.with_room(sm90_direct.design("sm_90a", "fp16", "tn", 64, 4, 8, 64, 2, 1), "half"),
            "shared memory 139264 B > 115712 B",
        ),
        # bm 32, bk 128 stages 2: 168 modelled registers > 128 at 256 threads x 2
        (
            "registers",
            base.with_room(sm90_direct.design("sm_90a", "fp16", "tn", 32, 4, 2, 128, 2, 1), "half"),
            "modelled registers > 128 per thread (would spill)",
        ),
    ]


@pytest.mark.parametrize("case", _bad(), ids=[c[0] for c in _bad()])
def test_illegal_room_designs_say_why(case):
    _, d, needle = case
    reasons = legality(d)
    assert any(needle in r for r in reasons), reasons


def test_with_room_rejects_an_unknown_name():
    with pytest.raises(ValueError, match="room 'third' is not one of"):
        base.with_room(_first("sm90direct"), "third")


def test_the_register_cap_is_the_file_over_the_ctas_in_allocation_units():
    assert base.room_register_cap(256, 2) == 128
    assert base.room_register_cap(384, 2) == 80  # 85.3 rounded down to whole 8s
    assert base.room_register_cap(32, 2) == 255  # never above the per-thread maximum
    assert base.room_register_cap(128, 4) == 128


def test_features_carry_the_share():
    from cudal2.generator import features

    for family in ROOM_FAMILIES:
        d = _first(family, bm=8)
        assert features(d).room_share == 1
        assert features(base.with_room(d, "half")).room_share == 2


# --- ptxas under the cap ---------------------------------------------------------------


def _tightest(family, regs_of, threads_of, room: str, **knobs: int) -> KernelDesign:
    """The legal room design of ``family`` (fp16 tn) whose register model comes closest
    to the launch bound's cap: where a spill would show first."""
    legal = []
    for d in design_space("sm_90a", "fp16", "tn", [family]):
        r = base.with_room(d, room)
        if all(getattr(d.knobs, k) == v for k, v in knobs.items()) and not legality(r):
            legal.append(r)
    cap = lambda d: base.room_register_cap(threads_of(d), base.room_share(d))  # noqa: E731
    return max(legal, key=lambda d: (regs_of(d) / cap(d), d.key))


def _direct_regs(d):
    slack = sm90_direct.ROOM_X_SMEM_REGS if sm90_direct.x_smem(d) else 0
    return sm90_direct.data_regs(d) + sm90_direct.OTHER_REGS + slack


def _direct_threads(d):
    return sm90_direct.tile(d).threads


def _stream_regs(d):
    return sm90_stream.fragment_regs(d) + sm90_stream.OTHER_REGS


SPREAD = [
    ("sm90direct", "half", {"stages": 2}),
    ("sm90direct", "half", {"stages": 3}),
    ("sm90direct", "quarter", {"stages": 2}),
    ("sm90direct", "quarter", {"stages": 3}),
    ("sm90stream", "half", {}),
    ("sm90stream", "quarter", {}),
]
_MODEL = {
    "sm90direct": (_direct_regs, _direct_threads),
    "sm90stream": (_stream_regs, sm90_stream.block_threads),
}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("case", SPREAD, ids=[f"{f}-{r}-{k}" for f, r, k in SPREAD])
def test_the_tightest_room_designs_compile_within_the_cap_without_spills(case):
    """ptxas honours the launch bound (registers <= the cap) and the register model keeps
    the tightest legal design of each (family, room, stages) from spilling. Without
    sm90direct's stages-3 reserve (ROOM_X_SMEM_REGS = 0) the tightest stages-3 design is
    bm 32, bk 64, which spilled 8-28 bytes: this test failed so."""
    family, room, knobs = case
    regs_of, threads_of = _MODEL[family]
    d = base.with_pdl(_tightest(family, regs_of, threads_of, room, **knobs), "entry")
    cap = base.room_register_cap(threads_of(d), base.room_share(d))
    with tempfile.TemporaryDirectory() as tmp:
        r = build(d, ArtifactCache(tmp))
    assert r.ok, r.error
    assert r.spill_bytes == 0, (design_name(d), r.registers, cap)
    assert 0 < r.registers <= cap, (design_name(d), r.registers, cap)


def test_the_space_offers_room_variants_only_when_asked():
    from cudal2.generator.space import pdl_variants, room_variants

    plain = design_space("sm_90a", "fp16", "tn", ["sm90direct"])
    assert all(base.room(d) == "none" for d in plain)
    roomy = design_space("sm_90a", "fp16", "tn", ["sm90direct"], room=True)
    assert roomy == [t for d in plain for t in (d, *room_variants(d))]
    both = design_space("sm_90a", "fp16", "tn", ["sm90direct"], room=True, pdl=True)
    assert both == [p for t in roomy for p in (t, *pdl_variants(t))]
    assert len({d.key for d in both}) == len(both) == 4 * len(roomy)
    # sm90tma renders no room: asking changes nothing
    tma = design_space("sm_90a", "fp16", "tn", ["sm90tma"])
    assert design_space("sm_90a", "fp16", "tn", ["sm90tma"], room=True) == tma
