"""sm90tma v5 pair tile N (issue 22): the persistent multicast pair with 128 x n tiles, n
not a power of two (``sm90_tma.PAIR_TILE_N``), as cuBLASLt's autotuned winners at
M >= 1024 are: the space (each n at its deepest ring with either store, each walk and
cap; the unpaired controls), the rule that each CTA's half of the multicast B box is a
whole number of 8-row swizzle atoms (hostile widths as table rows), what the kernel
takes from n (the TMA box, the cluster), and nvcc + SASS. Every earlier design renders
byte for byte as before: the v4, v5 and pair digest tests."""

from __future__ import annotations

import shutil

import pytest

from cudal2.generator import design_name, launch_recipe, legality
from cudal2.generator.families import sm90_tma


def _pair(n: int, store: int = 1, stages: int | None = None, dtype: str = "fp16", **v5):
    stages = stages or sm90_tma.pair_tile_n_stages(n, store, dtype)
    return sm90_tma.design(dtype, 2, 1, False, n, stages, 1, pers=1, cluster=2, store=store, **v5)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_each_width_pairs_at_its_deepest_ring_and_none_is_in_the_space(dtype):
    """``pair_tile_n_designs``: each width paired at its deepest ring with either store,
    each walk and cap, and the unpaired controls, all legal; measured (0.982 of the same
    width unpaired), so none of them is in the space any more."""
    made = sm90_tma.pair_tile_n_designs(dtype)
    assert len({d.key for d in made}) == len(made) == 64
    assert all(legality(d) == [] for d in made)
    space = {d.key for d in sm90_tma.space("sm_90a", dtype, "tn")}
    new = [d for d in made if d.knobs.cluster_m == 2 or d.knobs.wgmma_n in (144, 176)]
    assert new and not any(d.key in space for d in new)
    pairs = [d for d in made if d.knobs.cluster_m == 2]
    assert len(pairs) == 40 and {d.knobs.wgmma_n for d in pairs} == set(sm90_tma.PAIR_TILE_N)
    for n in sm90_tma.PAIR_TILE_N:
        for store in (0, 1):
            mine = [d for d in pairs if d.knobs.wgmma_n == n and sm90_tma.v5(d, "store") == store]
            walks = {(sm90_tma.v5(d, "raster"), sm90_tma.v5(d, "ctas")) for d in mine}
            assert walks == {(r, c) for r in (0, 8) for c in sm90_tma.CTAS}
            (stages,) = {d.knobs.stages for d in mine}
            assert stages == sm90_tma.pair_tile_n_stages(n, store, dtype)
            deeper = _pair(n, store, stages + 1, dtype)  # the deepest: one more does not fit
            assert any("shared memory" in r for r in legality(deeper)), (n, store)
    controls = [d for d in made if d.knobs.cluster_m == 1]
    assert len(controls) == 24 and all(sm90_tma.v5(d, "store") for d in controls)
    assert {d.knobs.wgmma_n for d in controls} == set(sm90_tma.PAIR_TILE_N_CONTROLS)
    # the narrower tile's ring is deeper beside the C buffer than 128x256's 3
    assert sm90_tma.pair_tile_n_stages(176, 1, dtype) == 4
    assert sm90_tma.pair_tile_n_stages(144, 1, dtype) == 5


# Hostile widths for a persistent pair: (wgmma_n, a phrase of the reason). Each refused,
# saying why; the same widths unpaired are legal where their tile fits.
HOSTILE = [
    (168, "multicasts 84 rows of B"),
    (200, "multicasts 100 rows of B"),
    (232, "multicasts 116 rows of B"),
    (24, "multicasts 12 rows of B"),
]


@pytest.mark.parametrize(("n", "phrase"), HOSTILE, ids=[str(n) for n, _ in HOSTILE])
def test_a_pair_whose_half_b_box_is_not_whole_swizzle_atoms_is_refused(n, phrase):
    reasons = legality(_pair(n, stages=3))
    assert any(phrase in r and "multiple of 8" in r for r in reasons), reasons
    unpaired = sm90_tma.design("fp16", 2, 1, False, n, 3, 1, pers=1, store=1)
    assert not any("multicasts" in r for r in legality(unpaired))


def test_the_recipe_multicasts_half_the_b_box_of_n_rows():
    d = _pair(176, raster=8, ctas=128)
    r = launch_recipe(d)
    assert r["cluster"] == [2, 1, 1] and r["tile_n"] == 176 and r["tile_m"] == 128
    assert r["tma"] == {"a": [64, 128], "b": [64, 88]}
    assert r["smem_bytes"] <= 227 * 1024


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize(
    "d",
    [
        _pair(176),
        _pair(144, store=0, raster=8, ctas=128),
        _pair(224, dtype="bf16", raster=8),
        _pair(160, store=0, dtype="bf16"),
    ],
    ids=design_name,
)
def test_tile_n_pairs_compile_to_hgmma_and_multicast_without_local_memory(sass_of, d):
    listing = sass_of(d)
    assert f"HGMMA.64x{d.knobs.wgmma_n}x16" in listing
    assert "UTMALDG" in listing and ".MULTICAST" in listing
    assert "LDL" not in listing and "STL" not in listing
    assert ("UBLKCP" in listing) == bool(sm90_tma.v5(d, "store"))
