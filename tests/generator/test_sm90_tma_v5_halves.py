"""sm90tma v5 halves (issue 22, ``store`` = 3): the persistent cooperative kernel storing
each tile in two row halves through a C buffer of half its rows, so the ring keeps one
more stage (128x256: 4, as torch's cuBLAS kernels run it on the H200). The space,
legality (hostile designs as table rows), shared memory, what the kernel renders, and
nvcc + SASS. Measured to lose (docs/kernels.md): made by ``sm90_tma.halves_designs``,
not in the space."""

from __future__ import annotations

import shutil

import pytest

from cudal2.generator import design_name, legality
from cudal2.generator.families import base, sm90_tma
from cudal2.generator.render import render
from cudal2.records import KernelDesign, Knobs


def _halves(n: int, stages: int | None = None, dtype: str = "fp16", **v5) -> KernelDesign:
    """A v5 halves design of 128 x n tiles (its deepest ring by default)."""
    stages = stages or max(sm90_tma.halves_stages(n, dtype))
    return sm90_tma.design(dtype, 2, 1, False, n, stages, 1, pers=1, store=3, **v5)


def _raw(**knobs) -> KernelDesign:
    """A design with exactly these knobs over a v5 halves 128x256 one (4 stages)."""
    base_knobs = dict(swap=0, warpgroups=2, m_blocks=1, wgmma_n=256, stages=4, split_k=1)
    base_knobs.update(persistent=1, cluster_m=1, store=3)
    base_knobs.update(knobs)
    return KernelDesign("sm90tma", "sm_90a", "fp16", "tn", Knobs.of(**base_knobs))


def test_halves_designs_are_made_but_not_in_the_space():
    """Measured to lose to the bulk store (docs/kernels.md), so not in the space;
    ``halves_designs`` still makes them: each width at its two deepest rings (the bulk
    store's deepest, and one more stage), each walk and cap."""
    for dtype in ("fp16", "bf16"):
        space = sm90_tma.space("sm_90a", dtype, "tn")
        assert not [d for d in space if sm90_tma.v5(d, "store") == 3]
        made = sm90_tma.halves_designs(dtype)
        assert len(made) == 36 and len({d.key for d in made}) == 36
        assert all(legality(d) == [] and sm90_tma.v5(d, "store") == 3 for d in made)
        assert {sm90_tma.tile_mn(d) for d in made} == {(128, n) for n in sm90_tma.HALVES_TILE_N}
        for n in sm90_tma.HALVES_TILE_N:
            mine = [d for d in made if d.knobs.wgmma_n == n]
            walks = {(sm90_tma.v5(d, "raster"), sm90_tma.v5(d, "ctas")) for d in mine}
            assert walks == {(r, c) for r in sm90_tma.RASTER for c in sm90_tma.CTAS}
            stages = sorted({d.knobs.stages for d in mine})
            # one stage deeper than the bulk store fits beside its whole C buffer
            bulk = max(sm90_tma.tile_n_stages(n, dtype)) if n != 256 else 3
            assert stages == [bulk, bulk + 1], (n, stages)
    assert [sm90_tma.halves_stages(n) for n in sm90_tma.HALVES_TILE_N] == [(4, 5), (3, 4), (3, 4)]


def test_the_half_buffer_leaves_128x256_a_fourth_stage():
    """128x256: 4 ring stages of 48 KiB + two warpgroups' 32 rows of 264 outputs + the
    barriers + the alignment slack fit 227 KiB; with the whole C buffer only 3 do."""
    d = _halves(256)
    assert d.knobs.stages == 4
    assert sm90_tma.c_buffer_bytes(d) == 2 * 32 * (256 + sm90_tma.C_PAD) * 2
    assert sm90_tma.smem_bytes(d) == 4 * 48 * 1024 + 33792 + sm90_tma.BARRIER_BYTES + 1024
    assert sm90_tma.launch_recipe(d)["smem_bytes"] <= 227 * 1024
    bulk = sm90_tma.design("fp16", 2, 1, False, 256, 4, 1, pers=1, store=1)
    assert any("shared memory" in r for r in legality(bulk))


# Hostile designs: (knobs over a v5 halves 128x256 design, a phrase of the reason).
ILLEGAL = [
    (dict(stages=5), "shared memory"),
    (dict(m_blocks=2, wgmma_n=128, stages=3), "store=3: the persistent cooperative kernel"),
    (dict(persistent=2, stages=3), "store=3: the persistent cooperative kernel"),
    (dict(persistent=0), "persistent designs only"),
    (dict(cluster_m=2, stages=3), "store=3: the persistent cooperative kernel"),
    (dict(warpgroups=1, stages=3), "store=3: the persistent cooperative kernel"),
    (dict(swap=1, wgmma_n=128, stages=4), "store=3: the compute orientation only"),
    (dict(split_k=2), "do not split K"),
    (dict(store=6), "store=6 is not one of"),
]


@pytest.mark.parametrize("knobs, needle", ILLEGAL, ids=[str(k) for k, _ in ILLEGAL])
def test_illegal_halves_designs_say_why(knobs, needle):
    reasons = legality(_raw(**knobs))
    assert any(needle in r for r in reasons), reasons


def test_what_the_halves_kernel_renders():
    """The persistent cooperative kernel with the halves store: each warpgroup's 32
    buffer rows, a barrier over its 128 threads, the issuers waiting for the first
    half's copies before the second half is written."""
    src = render(_halves(256, raster=8, ctas=128))
    for needle in (
        "T* sCw = sC + wg * 32 * C_LD;",
        'asm volatile("bar.sync %0, 128;\\n" ::"r"(2 + wg) : "memory");',
        'if (r < 32) asm volatile("cp.async.bulk.wait_group.read 0;\\n" ::: "memory");',
        "const int p = wg * 64 + (r >> 3) * 16 + (r & 7) + h * 8;",
        "cp.async.bulk.global.shared::cta.bulk_group",
    ):
        assert needle in src, needle
    assert "float acc0" not in src  # the cooperative kernel, not the overlap's


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize(
    "d",
    [
        _halves(256, raster=8, ctas=128),
        _halves(192, 4, "bf16", raster=16),
        base.with_epilogue(_halves(224, ctas=128), "bias_residual"),
        base.with_pdl(_halves(256, 3, raster=8), "before_epilogue"),
    ],
    ids=design_name,
)
def test_halves_designs_compile_to_hgmma_without_local_memory(v5_sass, d):
    # not serialised: a k tile's wgmmas, then a wait for all but the newest group
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in v5_sass(d)
