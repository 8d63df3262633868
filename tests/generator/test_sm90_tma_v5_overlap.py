"""sm90tma v5 overlap (issue 22, ``store`` = 2): the persistent cooperative kernel with
two accumulator sets a consumer thread, each tile's epilogue run under the next tile's
first k tile. The space, legality (hostile designs as table rows), the register split,
what the kernel renders, and nvcc + SASS: the epilogue's bulk copies issued while a
group of the next tile is in flight, and no wgmma serialised (ptxas serialises every
wgmma of a kernel whose non-wgmma instructions may read an in-flight accumulator: the
first version of this kernel did)."""

from __future__ import annotations

import re
import shutil

import pytest

from cudal2.generator import design_name, legality
from cudal2.generator.families import base, sm90_tma
from cudal2.generator.render import render
from cudal2.records import KernelDesign, Knobs, Target


def _overlap(n: int, stages: int | None = None, dtype: str = "fp16", **v5) -> KernelDesign:
    """A v5 overlap design of 128 x n tiles (its bulk-store twin's deepest ring by default)."""
    stages = stages or max(sm90_tma.tile_n_stages(n, dtype))
    return sm90_tma.design(dtype, 2, 1, False, n, stages, 1, pers=1, store=2, **v5)


def _twin(d: KernelDesign) -> KernelDesign:
    """The same design with the bulk store of v5 (``store`` = 1)."""
    return KernelDesign(
        d.family, d.arch, d.dtype, d.layout, Knobs.of(**{**d.knobs.as_json(), "store": 1})
    )


def _raw(**knobs) -> KernelDesign:
    """A design with exactly these knobs over a v5 overlap 128x160 one."""
    base_knobs = dict(swap=0, warpgroups=2, m_blocks=1, wgmma_n=160, stages=5, split_k=1)
    base_knobs.update(persistent=1, cluster_m=1, store=2)
    base_knobs.update(knobs)
    return KernelDesign("sm90tma", "sm_90a", "fp16", "tn", Knobs.of(**base_knobs))


def test_space_holds_the_overlap_designs_beside_their_twins():
    for dtype in ("fp16", "bf16"):
        space = sm90_tma.space("sm_90a", dtype, "tn")
        keys = {d.key for d in space}
        new = [d for d in space if sm90_tma.overlapped(d)]
        assert len(new) == 36 and all(legality(d) == [] for d in new)
        assert {sm90_tma.tile_mn(d) for d in new} == {(128, n) for n in sm90_tma.OVERLAP_TILE_N}
        for n in sm90_tma.OVERLAP_TILE_N:
            mine = [d for d in new if d.knobs.wgmma_n == n]
            walks = {(sm90_tma.v5(d, "raster"), sm90_tma.v5(d, "ctas")) for d in mine}
            assert walks == {(r, c) for r in sm90_tma.RASTER for c in sm90_tma.CTAS}
            assert {d.knobs.stages for d in mine} == set(sm90_tma.tile_n_stages(n, dtype))
        # every one has its bulk-store twin in the space: the sweep measures the pair
        assert all(_twin(d).key in keys for d in new)
        assert len(keys) == len(space)


# Hostile designs: (knobs over a v5 overlap 128x160 design, a phrase of the reason).
ILLEGAL = [
    (dict(wgmma_n=256, stages=3), "256 accumulator registers + 40 > 232"),  # two sets of 128
    (dict(wgmma_n=224, stages=3), "224 accumulator registers + 40 > 232"),
    (dict(m_blocks=2, wgmma_n=128, stages=3), "one 64-row block a warpgroup"),
    (dict(persistent=2, stages=3), "store=2: the persistent cooperative kernel"),
    (dict(persistent=0), "persistent designs only"),
    (dict(cluster_m=2), "store=2: the persistent cooperative kernel"),
    (dict(warpgroups=1), "store=2: the persistent cooperative kernel"),
    (dict(swap=1, wgmma_n=128, stages=4), "store=2: the compute orientation only"),
    (dict(stages=6), "shared memory"),  # 6 x 36 KiB ring + 42 KiB C buffer
    (dict(split_k=2), "do not split K"),
]


@pytest.mark.parametrize("knobs, needle", ILLEGAL, ids=[str(k) for k, _ in ILLEGAL])
def test_illegal_overlap_designs_say_why(knobs, needle):
    reasons = legality(_raw(**knobs))
    assert any(needle in r for r in reasons), reasons


def test_the_overlap_takes_cutlass_register_split():
    """setmaxnreg gives the consumers 232 and the producer 40 (2 x 232 + 40 = 3 x 168,
    what the three warpgroups launch with); the bulk-store twin keeps 224 and 56."""
    d = _overlap(192)
    assert sm90_tma.consumer_regs(d) == (40, 232)
    assert (40 + 2 * 232) == 3 * 168
    src = render(d)
    assert "setmaxnreg.inc.sync.aligned.u32 232;" in src
    assert "setmaxnreg.dec.sync.aligned.u32 40;" in src
    twin = render(_twin(d))
    assert "setmaxnreg.inc.sync.aligned.u32 224;" in twin
    assert "setmaxnreg.dec.sync.aligned.u32 56;" in twin


def test_what_the_overlap_kernel_renders():
    """Its own kernel: two accumulator sets alternated by two calls of one turn, the
    previous tile's epilogue after the first k tile, every group waited for at a tile's
    end; the recipe and shared memory are the twin's (the same ring and C buffer)."""
    d = _overlap(160, raster=8, ctas=128)
    src = render(d)
    for needle in (
        "float acc0[NACC], acc1[NACC];",
        "if (!turn(acc0, acc1)) {",
        "if (!turn(acc1, acc0)) {",
        "k_tile(cur, false);\n      if (pending) {",
        'asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");',
        "cp.async.bulk.global.shared::cta.bulk_group",
        "constexpr int RASTER_G = 8;",
    ):
        assert needle in src, needle
    assert sm90_tma.launch_recipe(d) == sm90_tma.launch_recipe(_twin(d))
    assert sm90_tma.smem_bytes(d) == sm90_tma.smem_bytes(_twin(d))
    assert "float acc0" not in render(_twin(d))


def test_the_cost_model_prices_the_overlap_as_its_twin():
    """A prior, as for the bulk store: the overlap is not priced beyond it (its gain is
    what the sweep measures); the grid ranks the two alike."""
    from cudal2.policy.cost_model import predicted_time_s

    t = Target("sm_90a", "fp16", "tn", 4096, 4096, 4096)
    d = _overlap(192)
    assert predicted_time_s(d, t) == predicted_time_s(_twin(d), t)


def _epilogue_under_a_group(listing: str) -> bool:
    """Whether a bulk copy (UBLKCP: a tile's epilogue) is issued while a wgmma group is
    in flight, reading the listing in order: an HGMMA puts a group in flight, a wait for
    every group (``WARPGROUP.DEPBAR.LE gsb0, 0x0``) ends that."""
    in_flight = False
    for ln in listing.splitlines():
        if "HGMMA" in ln:
            in_flight = True
        elif "gsb0, 0x0" in ln:
            in_flight = False
        elif "UBLKCP" in ln and in_flight:
            return True
    return False


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize(
    "d",
    [
        _overlap(192, raster=8, ctas=128),
        _overlap(128, 4, "bf16", raster=16),
        base.with_epilogue(_overlap(160, ctas=128), "bias_residual"),
        base.with_pdl(_overlap(192, 3, raster=8), "before_epilogue"),
    ],
    ids=design_name,
)
def test_overlap_designs_issue_their_epilogue_under_a_group(v5_sass, d):
    listing = v5_sass(d)
    # not serialised: a k tile's four wgmmas, then a wait for all but the newest group
    waits = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x\d)", listing)
    assert waits.count("0x1") >= 2 and waits.count("0x0") <= 3, waits
    assert _epilogue_under_a_group(listing)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_bulk_store_twin_waits_for_every_group_before_its_epilogue(sass_of):
    """The check above can fail: the v5 bulk-store kernel stores only after the tile's
    last group (its tensor pipe idles through the epilogue)."""
    assert not _epilogue_under_a_group(sass_of(_twin(_overlap(192, raster=8, ctas=128))))
