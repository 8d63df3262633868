"""Design records, legality with reasons, names, and the enumerated space."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cudal2.generator import design_space, legality
from cudal2.generator.families import sm80_mma
from cudal2.records import KernelDesign


def _d(**kw) -> KernelDesign:
    base = dict(
        family="sm80mma",
        arch="sm_90a",
        dtype="fp16",
        layout="tn",
        bm=128,
        bn=128,
        bk=32,
        warps_m=2,
        warps_n=2,
        stages=4,
    )
    base.update(kw)
    return KernelDesign(**base)


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
        (dict(split_k=2), "not knobs of this family"),
        (dict(bk=32, warps_k=4), "multiple of 16*warps_k"),
        (dict(warps_k=0), "must be >= 1"),
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
    assert d.name == "hgemm_sm80mma_sm90_fp16_tn_128x128x32_w2x2x1_s4_c1x1_sk1_sw1"
    assert KernelDesign.from_json(d.as_json()) == d
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.bm = 64  # type: ignore[misc]


def test_persistent_field_keeps_earlier_keys():
    """``persistent`` came after the first records: left out of the JSON (and so of the
    key and the name) when 0, so every recorded design keeps its key."""
    d = _d()
    assert "persistent" not in d.as_json()
    # Designs recorded before the field existed still have their recorded keys.
    db = Path(__file__).parents[2] / "manifests" / "default.measurements.jsonl"
    records = [json.loads(line) for line in db.read_text().splitlines()[:200]]
    designs = [r for r in records if r["design"]]
    assert designs and all(
        KernelDesign.from_json(r["design"]).key == r["design_key"] for r in designs
    )
    p = KernelDesign(**{**d.as_json(), "persistent": 1})
    assert p.as_json()["persistent"] == 1 and p.key != d.key and p.name == d.name + "_p"
    assert KernelDesign.from_json(p.as_json()) == p
    assert any("not a knob of family 'sm80mma'" in r for r in legality(p))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["tn", "nn"])
def test_space_is_legal_unique_and_named_uniquely(dtype, layout):
    space = design_space("sm_90a", dtype, layout)
    assert len(space) > 100
    assert all(legality(d) == [] for d in space)
    assert len({d.name for d in space}) == len(space) == len({d.key for d in space})
    assert all(d.dtype == dtype and d.layout == layout for d in space)


def test_space_respects_shared_memory_limit_per_layout():
    from cudal2.generator.families import family_of

    for layout in ("tn", "nn"):
        assert all(
            family_of(d.family).smem_bytes(d) <= sm80_mma.MAX_SMEM_BYTES
            for d in design_space("sm_90a", "fp16", layout)
        )


def test_sliced_k_reduction_buffer_counts_in_shared_memory():
    d = _d(bm=64, bn=64, bk=64, warps_m=1, warps_n=1, stages=2, warps_k=4)
    assert sm80_mma.smem_bytes(d) == 3 * 64 * 64 * 4  # the reduction outgrows 2 stages
    assert d.threads == 128


def test_recipe_states_alignment_per_layout():
    assert sm80_mma.launch_recipe(_d())["align"] == {"k": 8}
    r = sm80_mma.launch_recipe(_d(layout="nn"))
    assert r["align"] == {"k": 8, "n": 8}
    assert r["block"] == [128, 1, 1] and r["tile_m"] == 128 and r["abi"] == "gemm_v1"
    assert r["smem_bytes"] == sm80_mma.smem_bytes(_d(layout="nn"))
