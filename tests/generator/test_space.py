"""Design records, legality with reasons, names, and the enumerated space."""

from __future__ import annotations

import dataclasses

import pytest

from cudal2.generator import FAMILIES, design_name, design_space, family_of, legality
from cudal2.generator.families import base, mma_sync, sm80_mma
from cudal2.records import KernelDesign, Knobs

IDENTITY = ("family", "arch", "dtype", "layout")


def _d(**kw) -> KernelDesign:
    """An sm80mma design; identity fields and knobs (also ones it does not have) by name."""
    ident = dict(family="sm80mma", arch="sm_90a", dtype="fp16", layout="tn")
    knobs = dict(bm=128, bn=128, bk=32, warps_m=2, warps_n=2, warps_k=1, stages=4)
    for k, v in kw.items():
        (ident if k in IDENTITY else knobs)[k] = v
    return KernelDesign(**ident, knobs=Knobs.of(**knobs))


def test_legal_design_has_no_reasons():
    assert legality(_d()) == []


@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(bm=24), "multiple of 16*warps_m"),
        (dict(bn=40), "multiple of 16*warps_n"),
        (dict(bk=24), "multiple of 16"),
        (dict(stages=1), "stages=1 < 2"),
        (dict(bm=256, bn=256, bk=64, stages=6), "shared memory"),
        (dict(bm=256, bn=256, warps_m=1, warps_n=1), "fragment registers"),
        (dict(dtype="fp8"), "dtype 'fp8'"),
        (dict(layout="tt"), "layout 'tt'"),
        (dict(arch="sm_80"), "arch 'sm_80'"),
        (dict(split_k=2), "split_k is not a knob of family 'sm80mma'"),
        (dict(bk=32, warps_k=4), "multiple of 16*warps_k"),
        (dict(warps_k=0), "must be >= 1"),
        (dict(warps_k=0), "warps_k=0 is not one of"),
        (dict(family="wgmma"), "unknown kernel family"),
    ],
)
def test_illegal_designs_say_why(kw, needle):
    reasons = legality(_d(**kw))
    assert any(needle in r for r in reasons), reasons


def test_reasons_are_all_reported_not_just_the_first():
    assert len(legality(_d(bm=24, bn=40, stages=1))) >= 3


def test_key_is_content_hash_and_name_is_procedural():
    d = _d()
    assert d.key == _d().key and len(d.key) == 64
    assert d.key != _d(stages=3).key
    assert design_name(d) == "hgemm_sm80mma_sm90_fp16_tn_128x128x32_w2x2x1_s4"
    assert KernelDesign.from_json(d.as_json()) == d
    assert d.as_json()["knobs"] == {
        "bk": 32, "bm": 128, "bn": 128, "stages": 4, "warps_k": 1, "warps_m": 2, "warps_n": 2
    }  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.family = "sm90tma"  # type: ignore[misc]
    assert d.replace(stages=3) == _d(stages=3)


@pytest.mark.parametrize(
    "knobs, needle",
    [
        ({}, "knob bm of family 'sm80mma' is missing"),
        ({"persistent": 1}, "persistent is not a knob of family 'sm80mma'"),
        ({"swizzle": 1}, "swizzle is not a knob of family 'sm80mma'"),
    ],
)
def test_a_family_has_exactly_its_knobs(knobs, needle):
    full = _d().knobs.as_json()
    d = KernelDesign("sm80mma", "sm_90a", "fp16", "tn", Knobs.of(**{**full, **knobs}))
    if not knobs:
        d = KernelDesign("sm80mma", "sm_90a", "fp16", "tn", Knobs.of(bn=128))
    assert any(needle in r for r in legality(d)), legality(d)


def test_names_print_each_family_knob_and_only_those():
    """Every knob a family declares appears in its designs' names, nothing else does:
    two designs of a family differing in one knob differ in name."""
    for fam in FAMILIES.values():
        d = fam.space("sm_90a", "fp16", "tn")[0]
        for knob in fam.KNOBS:
            other = next((v for v in knob.domain if v != getattr(d.knobs, knob.name)), None)
            if other is not None:
                assert design_name(d.replace(**{knob.name: other})) != design_name(d)
        assert design_name(d).count("_") == 4 + sum(not k.label.startswith("x") for k in fam.KNOBS)


def test_old_flat_designs_are_refused_with_the_way_out():
    flat = {"family": "sm80mma", "arch": "sm_90a", "dtype": "fp16", "layout": "tn", "bm": 16}
    with pytest.raises(ValueError, match="cudal2.migrate"):
        KernelDesign.from_json(flat)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["tn", "nn"])
def test_space_is_legal_unique_and_named_uniquely(dtype, layout):
    space = design_space("sm_90a", dtype, layout)
    assert len(space) > 100
    assert all(legality(d) == [] for d in space)
    assert len({design_name(d) for d in space}) == len(space) == len({d.key for d in space})
    assert all(d.dtype == dtype and d.layout == layout for d in space)


def test_space_respects_shared_memory_limit_per_layout():
    for layout in ("tn", "nn"):
        assert all(
            family_of(d.family).smem_bytes(d) <= mma_sync.LIMITS.max_smem_bytes
            for d in design_space("sm_90a", "fp16", layout)
        )


def test_sliced_k_reduction_buffer_counts_in_shared_memory():
    d = _d(bm=64, bn=64, bk=64, warps_m=1, warps_n=1, stages=2, warps_k=4)
    assert sm80_mma.smem_bytes(d) == 3 * 64 * 64 * 4  # the reduction outgrows 2 stages
    assert sm80_mma.tile(d).threads == 128


def test_knob_domains_cover_the_space_and_base_is_shared():
    for fam in FAMILIES.values():
        for d in fam.space("sm_90a", "fp16", "tn"):
            for knob in fam.KNOBS:
                assert getattr(d.knobs, knob.name) in knob.domain
    assert base.make("sm80mma", "sm_90a", "fp16", "tn", **_d().knobs.as_json()) == _d()


def test_recipe_states_alignment_per_layout():
    assert sm80_mma.launch_recipe(_d())["align"] == {"k": 8}
    r = sm80_mma.launch_recipe(_d(layout="nn"))
    assert r["align"] == {"k": 8, "n": 8}
    assert r["block"] == [128, 1, 1] and r["tile_m"] == 128 and r["abi"] == "gemm_v1"
    assert r["smem_bytes"] == sm80_mma.smem_bytes(_d(layout="nn"))
