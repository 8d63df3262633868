"""sm90tma v5 row scale (issue 22): the RMSNorm row scale in the persistent cooperative
kernel storing by TMA (``persistent`` = 1, ``store`` = 4, unpaired). The producer
warpgroup's three idle warps sum the squares of each tile's A rows from the ring and hand
rsqrt(sum / K + eps) per row to the consumers through two scale buffers. Legality
(hostile designs as table rows, among them the ping-pong gated row scale that was legal
and could not render), shared memory, what the kernel renders, the epilogue space, and
nvcc + SASS (no local memory, the helper warps within the producer's registers)."""

from __future__ import annotations

import re
import shutil
import sys

import pytest

from cudal2.generator import design_name, legality
from cudal2.generator.families import base, sm90_tma
from cudal2.generator.render import render
from cudal2.records import EPILOGUES, ROW_SCALED, KernelDesign, Knobs

ROWS = ("rmsnorm", "rmsnorm_bias", "rmsnorm_silu", "rmsnorm_gelu_tanh")


def _tma(n: int = 256, stages: int = 4, pers: int = 1, mp: int = 1, dtype: str = "fp16", **v5):
    return sm90_tma.design(dtype, 2, mp, False, n, stages, 1, pers=pers, store=4, **v5)


def _rows(epilogue: str = "rmsnorm", *args, **knobs) -> KernelDesign:
    return base.with_epilogue(_tma(*args, **knobs), epilogue)


def _with(d: KernelDesign, **knobs) -> KernelDesign:
    return KernelDesign(
        d.family, d.arch, d.dtype, d.layout, Knobs.of(**{**d.knobs.as_json(), **knobs})
    )


def test_row_scaled_designs_are_legal_in_the_cooperative_tma_store():
    for epilogue in ROWS:
        for d in (
            _rows(epilogue),
            _rows(epilogue, 160, 5, raster=8, ctas=128, ring=1),
            _rows(epilogue, 128, 5, raster=8, ctas=128, ring=1, uniform=1),
            _rows(epilogue, 256, 4, dtype="bf16", raster=16),
        ):
            assert legality(d) == [] and sm90_tma.persistent_rows(d), design_name(d)
    assert set(ROWS) | {"rmsnorm_rope_kv", "rmsnorm_bias_rope_kv"} == ROW_SCALED


_SQ = "the one-tile kernel (persistent=0), or the persistent cooperative kernel storing by TMA"
# Hostile designs: (epilogue, knobs over a cooperative 128x256 TMA-store design, a
# reason's phrase).
ILLEGAL = [
    # ping-pong: legal before, and its source could not be rendered
    ("rmsnorm_silu", dict(persistent=2, m_blocks=1, stages=3), _SQ),
    ("rmsnorm", dict(persistent=2, m_blocks=1, stages=3), _SQ),
    ("rmsnorm", dict(cluster_m=2), _SQ),
    ("rmsnorm_bias", dict(store=1, stages=3), _SQ),
    ("rmsnorm", dict(store=5), _SQ),
    ("rmsnorm", dict(store=2, stages=3), _SQ),
    ("rmsnorm", dict(m_blocks=2, wgmma_n=160), "at most 128 rows (bm=256)"),
    ("rmsnorm_silu", dict(wgmma_n=144, stages=4), "subtiles of at least 32 columns"),
    ("rmsnorm_silu", dict(rtma=1), "rtma=1: an epilogue that reads R"),
]


@pytest.mark.parametrize(
    "epilogue, knobs, needle", ILLEGAL, ids=[f"{e}-{k}" for e, k, _ in ILLEGAL]
)
def test_illegal_row_scaled_designs_say_why(epilogue, knobs, needle):
    reasons = legality(_with(_rows(epilogue), **knobs))
    assert any(needle in r for r in reasons), reasons


def test_every_legal_persistent_row_scaled_design_renders():
    """The space's TMA-store designs with each row-scaled epilogue: those legal are this
    slice's, and each renders (the ping-pong gated ones were legal and raised)."""
    legal = 0
    for d in sm90_tma._stored("fp16"):
        for epilogue in ROWS:
            x = sm90_tma.with_knobs(d, epilogue=EPILOGUES.index(epilogue))
            if base.check(x, sys.modules[sm90_tma.__name__]):
                continue
            assert sm90_tma.persistent_rows(x), design_name(x)
            assert "rsqrtf(sq[i] * inv_k + eps)" in render(x)
            legal += 1
    assert legal == 264  # 72 + 72 + 60 + 60 (the gated ones: subtiles of 32 columns or more)


def test_the_scales_add_two_tiles_of_rows_after_the_tma_stores_buffers():
    for twin in (_tma(256, 4), _tma(160, 5), _tma(80, 7)):
        bm = sm90_tma.tile_mn(twin)[0]
        d = base.with_epilogue(twin, "rmsnorm")
        assert sm90_tma.smem_bytes(d) == sm90_tma.smem_bytes(twin) + 2 * bm * 4
    # the scales' four mbarriers fit the gap after R's
    assert sm90_tma.BARRIER_BYTES + sm90_tma.RS_BAR_AFTER + 4 * 8 <= sm90_tma.TMA_STORE_OFFSET


def test_what_the_row_scale_renders():
    """The helper warps in the producer warpgroup, the slots released by them too, the
    scales' mbarriers, the consumers' wait and release around the scaling, before the
    store; the plain twin renders none of it."""
    src = render(_rows("rmsnorm_silu", raster=8, ctas=128))
    for needle in (
        "mbar_init(empty0 + 8 * s, 4 * WGS + ROWSQ_WARPS);",
        "constexpr int RS_OFFSET = DATA_BYTES + 33792;",
        "constexpr int RS_BAR_OFFSET = DATA_BYTES + 288;",
        "if (tid >= WGS * 128 + 32) {",
        "if ((h & 31) == 0) mbar_arrive(empty0 + 8 * s);",
        "if (n >= 2) mbar_wait(rs_bar + 16 + 8 * b, ((n >> 1) - 1) & 1);",
        # a tile of the last tile's rows keeps its sums
        "const int m0 = raster_m(tile, tiles_m, tiles) * BM;\n"
        "        const bool again = m0 == m_prev;",
        "sq[i] = again ? sq[i] : 0.f;",
        "if ((h & 7) == 0 && row < BM) rs[row] = rsqrtf(sq[i] * inv_k + eps);",
        "mbar_wait(rs_bar + 8 * b, (rs_n >> 1) & 1);",
        "const float r = rs[(wg * MP + j) * 64 + w * 16 + g + h * 8];",
        "if (lane == 0) mbar_arrive(rs_bar + 16 + 8 * b);",
        "act_silu_fast(",
    ):
        assert needle in src, needle
    # the scaling after the main loop and before the first stmatrix
    at = [src.rindex("wgmma.wait_group.sync.aligned 0"), src.index("d[j][i * 4 + 2 * h] *= r;")]
    assert at == sorted(at) and at[1] < src.index("stmatrix.sync")
    plain = render(_tma(256, 4, raster=8, ctas=128))
    assert "ROWSQ" not in plain and "rs_bar" not in plain
    bias = render(_rows("rmsnorm_bias", 128, 5))
    assert "+= __half2float(bias[n0 + q])" in bias or "bias[n0 + q]" in bias


def test_the_search_offers_the_row_scale_to_row_scaled_targets():
    from cudal2.policy.base import search_space
    from cudal2.records import Target

    t = Target("sm_90a", "fp16", "tn", 2048, 6144, 4096, epilogue="rmsnorm")
    space = search_space(t, ["sm90tma"])
    rows = [d for d in space if sm90_tma.persistent_rows(d)]
    assert len(rows) > 50 and all(sm90_tma._epilogue_or_none(d) == "rmsnorm" for d in rows)
    assert not [d for d in space if d.knobs.persistent == 2]
    assert not [d for d in space if d.knobs.persistent and not sm90_tma.persistent_rows(d)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize(
    "d",
    [
        _rows("rmsnorm", raster=8, ctas=128),
        _rows("rmsnorm_silu", 160, 5, dtype="bf16", raster=8, ctas=128, ring=1),
        _rows("rmsnorm_bias", 128, 5, raster=8, ctas=128, ring=1, uniform=1),
    ],
    ids=design_name,
)
def test_row_scaled_designs_compile_within_the_producers_registers(v5_sass, d):
    """No local memory (v5_sass); one rsqrt a row sum (MUFU.RSQ, ceil(128 / 12) = 11
    a helper thread, unrolled), none in the twin; and after the producer warpgroup gives
    registers back (USETMAXREG.DEALLOC to 56), no register past R55."""
    listing = v5_sass(d)
    twin = v5_sass(sm90_tma.with_knobs(d, epilogue=0))
    rsq = len(re.findall(r"\bMUFU\.RSQ\b", listing))
    assert rsq >= 11 and len(re.findall(r"\bMUFU\.RSQ\b", twin)) == 0
    lines = listing.splitlines()
    at = next(i for i, x in enumerate(lines) if "USETMAXREG.DEALLOC" in x)
    assert "0x38" in lines[at]
    # the producer's and helpers' code: from the dealloc to the kernel's last EXIT (the
    # consumers', which take registers with TRY_ALLOC, is placed before it; the wait
    # loops' retries after it)
    end = max(i for i, x in enumerate(lines) if re.search(r"\bEXIT\b", x))
    used = [int(r) for x in lines[at:end] for r in re.findall(r"\bR(\d+)\b", x.split(";")[0])]
    assert max(used) < 56, max(used)
