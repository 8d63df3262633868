"""On a GPU: the sm80mma, sm90csk, sm90stream, sm90direct, sm90wgmma and sm90tma
families are correct for every dtype x layout they support on residue shapes.

Uses the project's own correctness check (fresh random trials, NaN-poisoned output,
exact {0,1} trial) through the same driver launcher the runtime ships.
"""

from __future__ import annotations

import pytest

from cudal2.generator.compile import ArtifactCache, build
from cudal2.generator.families import (
    sm80_mma,
    sm90_csk,
    sm90_direct,
    sm90_stream,
    sm90_tma,
    sm90_wgmma,
)
from cudal2.generator.space import design_name, launch_recipe, legality
from cudal2.records import KernelDesign, Target

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

# (bm, bn, bk, warps_m, warps_n, stages, warps_k): a small tile, a large tile and two
# sliced-K tiles; residue shapes hit every edge (M, N, K tails, K shorter than one
# tile, odd N with an odd ldc).
DESIGNS = [
    (16, 32, 64, 1, 1, 3, 1),
    (128, 128, 32, 2, 2, 4, 1),
    (16, 64, 128, 1, 2, 4, 4),
    (64, 32, 128, 2, 1, 2, 2),
]
SHAPES = [(1, 8, 8), (17, 40, 24), (100, 1000, 1000), (130, 264, 72), (257, 129, 2056)]
# sm90csk (bm, bn, bk, warps_m, warps_n, stages, split_k): K shares of one tile each,
# shares longer than the pipeline, empty trailing shares (K = 8, 24 with split 8).
CSK_DESIGNS = [
    (16, 64, 128, 1, 2, 4, 8),
    (64, 128, 64, 2, 2, 3, 4),
    (32, 32, 256, 1, 1, 2, 2),
]

# sm90stream (bm, bn, bk, warps_m, warps_n, stages, split_k): 8-row activation tiles
# (the two-matrix ldmatrix path), an odd count of n8 fragments (bm 24 with one warp),
# no split, rings that wrap many times (K = 2056 over 3 stages of 64), split 8 with
# empty trailing shares, K tails inside the last tile, tiles larger than M and N.
STREAM_DESIGNS = [
    (8, 64, 128, 1, 4, 4, 2),
    (16, 32, 64, 1, 2, 3, 1),
    (24, 32, 256, 1, 1, 2, 4),
    (64, 128, 64, 2, 4, 4, 8),
]

# sm90direct (bm, warps_n, warps_k, bk, split_k, stages), tn only: one 8-row fragment,
# two, three (odd), four, eight; K slices longer than a step, shorter than one load per
# lane, empty ones; activations from L1 (stages 2) or staged in shared-memory chunks
# (stages 3: chunk buffers wrapping many times at K = 2056, a partial last chunk).
DIRECT_DESIGNS = [
    (8, 4, 2, 128, 2, 2),
    (16, 2, 1, 64, 1, 2),
    (32, 1, 4, 64, 8, 2),
    (32, 8, 1, 64, 4, 2),
    (24, 1, 1, 64, 2, 2),
    (16, 4, 2, 128, 1, 3),
    (64, 8, 1, 64, 2, 3),
    (24, 2, 4, 64, 8, 3),
]

# sm90wgmma (warpgroups, bn, stages), tn only: one and two warpgroups, every wgmma N.
WGMMA_DESIGNS = [(1, 64, 3), (2, 128, 4), (2, 256, 3), (1, 256, 5)]

# sm90tma (swapped, warpgroups, 64-row blocks per warpgroup, wgmma n, stages, split_k),
# tn only: both orientations, one and two consumer warpgroups (with register
# reallocation), one and two accumulator blocks per warpgroup, the smallest and largest
# wgmma N, an odd count of n8 blocks (24), rings that wrap many times (K = 2056 over 2
# or 4 stages), split 8 with empty trailing shares, tiles past M and N (TMA zero fill).
TMA_DESIGNS = [
    (False, 1, 1, 64, 4, 1),
    (False, 2, 1, 256, 2, 1),
    (False, 2, 1, 128, 6, 4),
    (False, 2, 2, 128, 3, 1),
    (True, 1, 1, 8, 4, 2),
    (True, 1, 1, 16, 8, 8),
    (True, 1, 1, 24, 2, 4),
    (True, 2, 1, 64, 4, 1),
    (True, 1, 1, 256, 3, 1),
    (True, 2, 2, 64, 4, 2),
    (True, 1, 2, 16, 6, 8),
]
# Persistent sm90tma (swapped, 64-row blocks per warpgroup, wgmma n, stages): two
# consumer warpgroups; 2100x2056x200 has 153-289 tiles, so CTAs walk 2-3 tiles and
# the ring's slot counter runs across tile boundaries (K = 200: a partial last tile).
TMA_PERSISTENT_DESIGNS = [(False, 1, 256, 4), (True, 1, 128, 6), (False, 2, 128, 4)]
PERSISTENT_SHAPES = [*SHAPES, (2100, 2056, 200)]
# Ping-pong sm90tma (swapped, 64-row blocks per warpgroup, wgmma n, stages): tiles of
# 64 and 128 rows in both orientations, wgmma N of 112 and 160 (not powers of 2).
# 2100x2056x1096 (KT = 18, a partial last k tile) gives each CTA 2-5 tiles, so the
# warpgroups hand the ring over several times with KT > 2 x stages: a wait more than
# one phase ahead would pass early and break the result (the v3 attempt's failure).
TMA_PINGPONG_DESIGNS = [
    (False, 2, 128, 4),
    (False, 1, 256, 4),
    (False, 2, 64, 8),
    (False, 2, 160, 4),
    (False, 2, 112, 6),
    (True, 1, 128, 6),
    (True, 2, 64, 4),
]
PINGPONG_SHAPES = [*PERSISTENT_SHAPES, (2100, 2056, 1096)]
# Multicast clusters along M (swapped, warpgroups, 64-row blocks, wgmma n, stages):
# both orientations, one and two warpgroups, the narrowest B half (32 rows: a 64-row
# tile of either side) and wgmma N 160; odd M tile counts (2100 / 128 = 17) leave a
# partner CTA past M, and K = 1096 wraps the ring many times.
TMA_CLUSTER_DESIGNS = [
    (False, 2, 1, 256, 4),
    (False, 2, 2, 128, 4),
    (False, 1, 1, 64, 6),
    (False, 2, 1, 160, 4),
    (True, 1, 1, 16, 8),
    (True, 2, 1, 64, 4),
    (True, 1, 1, 128, 6),
]

# sm90tma v5, persistent cooperative (64-row blocks per warpgroup, wgmma n, stages,
# raster, ctas, store): the grouped walk with groups of 8 and 16 M tiles (2100 / 128 =
# 17 M tiles: a last group of 1; 2100 / 256 = 9: of 1 as well), the 128-CTA cap (each
# CTA walks more tiles), the bulk store through the C buffer on 128x256, 256x128 and
# 128x128 tiles with 2 to 5 stages (N = 2056, 264: whole 16-byte rows; N = 129, 1000 x
# 1001 and 8: odd or unaligned ldc, the plain-store path), each knob alone and together.
TMA_V5_DESIGNS = [
    (1, 256, 4, 8, 0, 0),
    (2, 128, 4, 16, 128, 0),
    (1, 128, 6, 0, 128, 0),
    (1, 256, 3, 0, 0, 1),
    (1, 256, 3, 8, 128, 1),
    (2, 128, 3, 16, 0, 1),
    (1, 128, 5, 8, 128, 1),
    (1, 256, 2, 16, 128, 1),
]
V5_SHAPES = [*PINGPONG_SHAPES, (1000, 1001, 264), (4096, 4096, 4096)]


# sm90tma v5 pair (issue 22): the 2-CTA multicast pair inside the persistent cooperative
# kernel, the same knobs as TMA_V5_DESIGNS: 128x256 alone, with the bulk store, with
# all three v5 knobs; 256x128 (2100 / 256 = 9 M tiles) with the bulk store and groups of
# 16; 128x128 (64-row B halves) with groups of 8 and with the cap. V5_SHAPES: 1x8x8 (one
# tile: the pair's second CTA past M), 2100x2056x1096 (17 M tiles: the last pair's second
# CTA past M; 18 k tiles wrapping the ring across tiles), residues, 4096^3.
TMA_V5_PAIR_DESIGNS = [
    (1, 256, 4, 0, 0, 0),
    (1, 256, 3, 0, 0, 1),
    (1, 256, 3, 8, 128, 1),
    (2, 128, 3, 16, 0, 1),
    (1, 128, 4, 8, 0, 0),
    (2, 128, 4, 0, 128, 0),
]

# sm90tma v5 tile N (issue 22): 128 x n tiles, n not a power of two (sm90_tma.TILE_N),
# with the bulk store (the knobs of TMA_V5_DESIGNS): each n at its deepest ring and 224
# at its shallowest too, each walk and cap. V5_SHAPES puts partial last N tiles under
# every n (N = 2056, 1001, 264, 129, 40, 8: the TMA zero fill, the bulk store's plain
# columns past the last 16-byte chunk); 1024x1280x1096 and 1024x7168x1096 are the tile
# grids of the shapes TILE_N is for (8 x 16 with 80, 8 x 32 with 224, 128 CTAs).
TMA_V5_TILE_N_DESIGNS = [
    (1, 80, 7, 8, 128, 1),
    (1, 80, 6, 0, 0, 1),
    (1, 160, 5, 16, 0, 1),
    (1, 192, 4, 8, 128, 1),
    (1, 224, 3, 0, 128, 1),
    (1, 224, 2, 16, 0, 1),
]
TILE_N_SHAPES = [*V5_SHAPES, (1024, 1280, 1096), (1024, 7168, 1096)]

# sm90tma v5 pair tile N (issue 22): the persistent multicast pair with 128 x n tiles
# (sm90_tma.PAIR_TILE_N), each CTA multicasting n / 2 rows of B: 176 and 224 with the
# bulk store, 144 and 160 with the accumulator store, at their deepest rings (as in the
# space), with and without the walk and the cap. V5_SHAPES: 1x8x8 (the pair's second CTA
# past M), 2100x2056x1096 (17 M tiles), N = 1001, 264, 129, 40, 8 and 4096 (4096 % 176 =
# 48: a partial last N tile), plus 1024x8192x1096 (8192 % 176 = 96, % 144 = 128).
TMA_V5_PAIR_TILE_N_DESIGNS = [
    (1, 176, 4, 8, 128, 1),
    (1, 224, 3, 0, 0, 1),
    (1, 144, 6, 8, 0, 0),
    (1, 160, 6, 0, 128, 0),
]
PAIR_TILE_N_SHAPES = [*V5_SHAPES, (1024, 8192, 1096)]
# sm90tma v5 ring counter (issue 22): TMA-store designs of rings that are not a power of
# two with the ring's slot and phase as counters (ring = 1): (m_blocks, wgmma_n, stages,
# raster, ctas, persistent). OVERLAP_SHAPES: CTAs walking many tiles (the counters
# start each tile from its ring position; ping-pong's skips the other warpgroup's tile),
# one k tile, K = 1024.
TMA_V5_RING_DESIGNS = [
    (2, 112, 6, 8, 0, 2),
    (2, 176, 5, 8, 128, 2),
    (1, 192, 5, 16, 0, 2),
    (1, 128, 5, 8, 128, 1),
    (1, 80, 7, 0, 0, 1),
    (1, 256, 3, 8, 128, 1),
]
# sm90tma v5 pair TMA store (issue 22): the multicast pair storing by TMA (the knobs of
# TMA_V5_DESIGNS, store = 4): 128x256 at both rings, 128x80 (16-column subtiles), 128x160
# (32), 128x128; a CTA past M (1x8x8, 17 M tiles) stores nothing: C's map clips its rows.
TMA_V5_PAIR_TMA_DESIGNS = [
    (1, 256, 4, 8, 128, 4),
    (1, 256, 3, 0, 0, 4),
    (1, 80, 8, 8, 0, 4),
    (1, 160, 5, 16, 128, 4),
    (1, 128, 6, 0, 128, 4),
]
# sm90tma v5 uniform warpgroup index (issue 22): TMA-store designs with the warpgroup index
# broadcast from lane 0 (uniform = 1; the ring counter where the ring is not a power of
# two): (m_blocks, wgmma_n, stages, raster, ctas, persistent), on the ring counter's
# shapes (CTAs walking many tiles, ping-pong's turns, one k tile, K = 1024).
TMA_V5_UNIFORM_DESIGNS = [
    (2, 128, 6, 8, 128, 2),
    (1, 256, 4, 8, 128, 2),
    (2, 176, 5, 16, 0, 2),
    (1, 256, 4, 8, 128, 1),
    (1, 160, 5, 0, 0, 1),
]
# sm90tma v5 tall TMA store (issue 22): the cooperative 256 x n TMA-store designs (two
# 64-row blocks a warpgroup; the counter at 3 stages, uniform = 1): (wgmma_n, stages,
# raster, ctas). The shapes: 2100 rows (9 tiles of 256, the last of 52 rows), residues,
# 4096³ (CTAs walking several tiles), one k tile, K = 1024.
TMA_V5_TALL_DESIGNS = [(128, 4, 8, 128), (144, 3, 0, 0), (160, 4, 16, 128), (176, 3, 8, 0)]
# sm90tma v5 tall pair (issue 22): the tall TMA-store designs in multicast pairs along M
# (each CTA 256 rows of A, half the B tile): (wgmma_n, stages, raster, ctas). The
# shapes: the ping-pong pair's (2100 rows: 9 tiles of 256, the fifth pair's second CTA
# past M; 4096³: CTAs walking several pair tiles; one k tile; K = 1024 and 1096).
TMA_V5_TALL_PAIR_DESIGNS = [(128, 4, 8, 128), (144, 3, 16, 0), (160, 3, 8, 128), (176, 4, 0, 0)]
# sm90tma v5 ping-pong pair (issue 22): the TMA-store designs in multicast pairs along M,
# ping-pong (each warpgroup of both CTAs the same pair tiles) and cooperative, the ring
# counter where the ring is not a power of two, uniform = 1: (m_blocks, wgmma_n, stages,
# raster, ctas, persistent). The shapes: a CTA past M (1x8x8, 2100: 17 M tiles), residues, CTAs
# walking many pair tiles (4096^3, each warpgroup's turns over several), one k tile, K =
# 1024 and 1096 (a partial last k tile).
TMA_V5_PINGPONG_PAIR_DESIGNS = [
    (2, 128, 6, 8, 128, 2),
    (2, 128, 5, 0, 0, 2),
    (1, 256, 4, 8, 128, 2),
    (2, 176, 5, 16, 0, 2),
    (1, 192, 5, 8, 128, 2),
    (2, 80, 8, 8, 0, 2),
    (1, 160, 5, 8, 128, 1),
    (1, 256, 3, 16, 0, 1),
]

# sm90tma v5 ping-pong (issue 22): the ping-pong kernel with v5's bulk store (each
# warpgroup through its own C buffer half), walk and cap (the knobs of TMA_V5_DESIGNS):
# 128x128 (4 and 3 stages), 128x160, 64x256 (3 and 2), the tile N ones (128x80, 64x224,
# 64x192), each walk and cap; and the walk and cap without the bulk store (legal, not in
# the space). V5_SHAPES has the residues and CTAs walking several tiles (4096^3: 1024
# tiles of 128x128 or 64x256, each warpgroup storing 3-4 times through its half, so it
# waits on its own previous copies); 1024x8192x1024 is the K = 1024 shape the schedule
# is for (16 k tiles a tile), 1024x1280x1096 the 128x80 tile grid (8 x 16).
TMA_V5_PINGPONG_DESIGNS = [
    (2, 128, 4, 0, 0, 1),
    (2, 128, 3, 8, 128, 1),
    (2, 160, 3, 16, 0, 1),
    (1, 256, 3, 8, 128, 1),
    (1, 256, 2, 0, 0, 1),
    (2, 80, 6, 16, 128, 1),
    (1, 224, 4, 8, 0, 1),
    (1, 192, 5, 0, 128, 1),
    (2, 128, 4, 8, 128, 0),
]
PINGPONG_V5_SHAPES = [*V5_SHAPES, (1024, 8192, 1024), (1024, 1280, 1096)]

# sm90tma v5 overlap (issue 22, store = 2): the persistent cooperative kernel with two
# accumulator sets, each tile's epilogue under the next tile's first k tile, for each
# width of sm90_tma.OVERLAP_TILE_N at both rings, each walk and cap. V5_SHAPES: CTAs
# with no tile (1x8x8), one k tile (K = 8, 24: the epilogue right after the only group),
# an odd and an even number of tiles a CTA (2100x2056x1096, 4096^3: the last tile in
# either set), partial last N tiles; 1024x8192x1024 the K = 1024 shape the overlap is for.
TMA_V5_OVERLAP_DESIGNS = [
    (1, 128, 5, 0, 0, 2),
    (1, 128, 4, 16, 128, 2),
    (1, 160, 5, 8, 128, 2),
    (1, 160, 4, 0, 0, 2),
    (1, 192, 4, 8, 0, 2),
    (1, 192, 3, 16, 128, 2),
]
OVERLAP_SHAPES = [*V5_SHAPES, (1024, 8192, 1024)]

# sm90tma v5 stream-K (issue 22): cooperative TMA-store designs whose last tiles are cut
# along K (the grouped walk of 8, no cap, the counter where the ring is not a power of
# two, uniform = 1): (wgmma_n, stages). Beyond OVERLAP_SHAPES' residues and walks (the
# tiles in one or two stream-K waves), the shapes of each case of the walk: fewer tiles
# than CTAs (1024x1280 at 128 x 128 and 80: every tile cut), as many (4224x1024 at 128 x
# 256 on 132 SMs: no stream-K), one k tile a tile (pieces are whole tiles), two tiles of
# 128 k tiles (each cut over about 66 CTAs: an owner adding many pieces), three k tiles in
# all (most CTAs' shares empty).
TMA_V5_STREAMK_DESIGNS = [(256, 3), (128, 6), (80, 7), (192, 4)]  # streamk_designs: not 224
STREAMK_SHAPES = [
    *OVERLAP_SHAPES, (1024, 1280, 1096), (4224, 1024, 200), (4096, 4096, 64), (256, 256, 8192),
    (128, 80, 192),
]  # fmt: skip

# sm90tma v5 halves (issue 22, store = 3): the persistent cooperative kernel storing each
# tile in two row halves through a C buffer of half the rows, for each width of
# sm90_tma.HALVES_TILE_N at both rings, each walk and cap. V5_SHAPES: tiles past M (the
# second half's rows past M copy nothing), partial last N tiles, CTAs walking several
# tiles (each half waiting on the previous half's and tile's copies).
TMA_V5_HALVES_DESIGNS = [
    (1, 256, 4, 8, 128, 3),
    (1, 256, 3, 0, 0, 3),
    (1, 224, 4, 16, 0, 3),
    (1, 224, 3, 8, 128, 3),
    (1, 192, 5, 0, 128, 3),
    (1, 192, 4, 16, 128, 3),
]

# sm90tma v5 TMA store (issue 22, store = 4): 64-row subtiles through two buffers a
# consumer warpgroup, stored by TMA through a tensor map of C, for each cooperative width
# of sm90_tma.TMA_STORE_TILE_N and each ping-pong tile of PINGPONG_V5_TILES at
# both rings, walks and caps spread over them (the last field: persistent). V5_SHAPES:
# tiles past M and N (the map clips the subtiles' rows and columns), N % 64 != 0 (a
# subtile partly past N), CTAs walking several tiles (each warpgroup's first subtile
# waiting for the previous tile's copies), 1024x8192x1024.
TMA_V5_TMA_DESIGNS = [
    (1, 256, 4, 8, 128, 4, 1),
    (1, 256, 3, 0, 0, 4, 1),
    (1, 192, 4, 16, 0, 4, 1),
    (1, 192, 3, 8, 128, 4, 1),
    (1, 128, 6, 0, 128, 4, 1),
    (1, 128, 5, 16, 128, 4, 1),
    (2, 128, 6, 8, 128, 4, 2),
    (1, 256, 4, 0, 0, 4, 2),
    (1, 192, 6, 16, 128, 4, 2),
    # subtiles of 16 columns (80: 32-byte box rows) and 32 (160, 224: 64-byte rows)
    (1, 80, 8, 8, 128, 4, 1),
    (1, 160, 5, 0, 0, 4, 1),
    (1, 224, 4, 16, 128, 4, 1),
    (2, 80, 7, 8, 0, 4, 2),
    (2, 160, 5, 16, 128, 4, 2),
    (1, 224, 5, 0, 128, 4, 2),
    # v5 ping-pong narrow: 128 x 112, 144, 176 in 16-column subtiles (7, 9, 11 a block)
    (2, 112, 7, 8, 128, 4, 2),
    (2, 144, 6, 0, 0, 4, 2),
    (2, 176, 5, 16, 128, 4, 2),
    (2, 112, 6, 8, 0, 4, 2),
    # store = 5: each warp its 16 rows (box [SUB_N, 16])
    (1, 256, 4, 8, 128, 5, 1),
    (1, 80, 8, 8, 128, 5, 1),
    (2, 160, 5, 8, 128, 5, 2),
    (1, 192, 6, 8, 128, 5, 2),
]


def _v5_design(dtype: str, knobs: tuple[int, ...], cluster: int = 1, pers: int = 1) -> KernelDesign:
    mp, n, st, raster, ctas, store = knobs
    return sm90_tma.design(
        dtype, 2, mp, False, n, st, 1, pers=pers, cluster=cluster, raster=raster, ctas=ctas,
        store=store,
    )  # fmt: skip


def _streamk_design(dtype: str, n: int, st: int) -> KernelDesign:
    """A stream-K design (issue 22): ``sm90_tma.streamk_designs``' knobs."""
    return sm90_tma.design(
        dtype, 2, 1, False, n, st, 1, pers=1, raster=8, store=4, ring=int(st not in (4, 8)),
        uniform=1, streamk=1,
    )  # fmt: skip


def _uniform_design(
    dtype: str, mp: int, n: int, st: int, raster: int, ctas: int, pers: int, cluster: int = 1
) -> KernelDesign:
    """A TMA-store design of the tenth slice (issue 22): the ring counter where the ring is
    not a power of two, the warpgroup index broadcast from lane 0."""
    return sm90_tma.design(
        dtype, 2, mp, False, n, st, 1, pers=pers, cluster=cluster, raster=raster, ctas=ctas,
        store=4, ring=int(st not in (4, 8)), uniform=1,
    )  # fmt: skip


def _check_design(tmp_path, d: KernelDesign, shapes=SHAPES) -> None:
    from cudal2.packaging.runtime import driver
    from cudal2.verify import correctness
    from cudal2.verify.launch import launch_dense

    cache = ArtifactCache(tmp_path)
    b = build(d, cache)
    assert b.ok, b.error
    assert b.spill_bytes == 0
    kernel = driver.Kernel(cache.cubin(b.artifact_key), b.symbol, launch_recipe(d)["smem_bytes"])
    for m, n, k in shapes:
        if d.layout == "nn" and n % 8:
            continue  # nn needs N % 8 == 0 (dispatch falls back otherwise)
        if n % launch_recipe(d)["align"].get("n", 1):
            continue  # the TMA store's N % 8 (C's map; the ABI's rule): dispatch falls back
        t = Target("sm_90a", d.dtype, d.layout, m, n, k)

        def run(a, bb, c, t=t):
            stream = torch.cuda.current_stream().cuda_stream
            launch_dense(
                kernel, launch_recipe(d), t, a.data_ptr(), bb.data_ptr(), c.data_ptr(), stream
            )

        res = correctness.check(t, run, 1)
        assert res.ok, f"{design_name(d)} on {t.label}: {res.error}"


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["tn", "nn"])
@pytest.mark.parametrize("knobs", DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_family_correct_on_residue_shapes(tmp_path, dtype, layout, knobs):
    *tile, wk = knobs
    _check_design(tmp_path, sm80_mma.design("sm_90a", dtype, layout, *tile, warps_k=wk))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["tn", "nn"])
@pytest.mark.parametrize("knobs", CSK_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_cluster_split_k_correct_on_residue_shapes(tmp_path, dtype, layout, knobs):
    *tile, sk = knobs
    _check_design(tmp_path, sm90_csk.design("sm_90a", dtype, layout, *tile, split_k=sk))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["tn", "nn"])
@pytest.mark.parametrize("knobs", STREAM_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_bulk_copy_streaming_correct_on_residue_shapes(tmp_path, dtype, layout, knobs):
    *tile, sk = knobs
    _check_design(tmp_path, sm90_stream.design("sm_90a", dtype, layout, *tile, split_k=sk))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", DIRECT_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_direct_register_streaming_correct_on_residue_shapes(tmp_path, dtype, knobs):
    bm, wn, wk, bk, sk, st = knobs
    d = sm90_direct.design("sm_90a", dtype, "tn", bm, wn, wk, bk, st, sk)
    _check_design(tmp_path, d)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", WGMMA_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_wgmma_correct_on_residue_shapes(tmp_path, dtype, knobs):
    wgs, bn, st = knobs
    d = sm90_wgmma.design("sm_90a", dtype, "tn", wgs, bn, st)
    _check_design(tmp_path, d)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", TMA_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_tma_warp_specialised_correct_on_residue_shapes(tmp_path, dtype, knobs):
    swap, wgs, mp, n, st, sk = knobs
    _check_design(tmp_path, sm90_tma.design(dtype, wgs, mp, swap, n, st, sk))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", TMA_PERSISTENT_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_tma_warp_specialised_persistent_correct(tmp_path, dtype, knobs):
    swap, mp, n, st = knobs
    d = sm90_tma.design(dtype, 2, mp, swap, n, st, 1, pers=1)
    _check_design(tmp_path, d, PERSISTENT_SHAPES)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", TMA_PINGPONG_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_tma_warp_specialised_pingpong_correct(tmp_path, dtype, knobs):
    swap, mp, n, st = knobs
    d = sm90_tma.design(dtype, 2, mp, swap, n, st, 1, pers=2)
    _check_design(tmp_path, d, PINGPONG_SHAPES)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", TMA_CLUSTER_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_tma_warp_specialised_multicast_cluster_correct(tmp_path, dtype, knobs):
    swap, wgs, mp, n, st = knobs
    d = sm90_tma.design(dtype, wgs, mp, swap, n, st, 1, cluster=2)
    _check_design(tmp_path, d, PINGPONG_SHAPES)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", TMA_V5_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_tma_v5_persistent_correct(tmp_path, dtype, knobs):
    _check_design(tmp_path, _v5_design(dtype, knobs), V5_SHAPES)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", TMA_V5_PAIR_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_tma_v5_pair_persistent_correct(tmp_path, dtype, knobs):
    d = _v5_design(dtype, knobs, cluster=2)
    assert launch_recipe(d)["cluster"] == [2, 1, 1]
    _check_design(tmp_path, d, V5_SHAPES)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", TMA_V5_TILE_N_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_tma_v5_tile_n_persistent_correct(tmp_path, dtype, knobs):
    d = _v5_design(dtype, knobs)
    assert d.knobs.wgmma_n in sm90_tma.TILE_N and launch_recipe(d)["tile_n"] == knobs[1]
    _check_design(tmp_path, d, TILE_N_SHAPES)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", TMA_V5_PAIR_TILE_N_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_tma_v5_pair_tile_n_persistent_correct(tmp_path, dtype, knobs):
    d = _v5_design(dtype, knobs, cluster=2)
    assert d.knobs.wgmma_n in sm90_tma.PAIR_TILE_N and legality(d) == []
    assert launch_recipe(d)["cluster"] == [2, 1, 1]
    _check_design(tmp_path, d, PAIR_TILE_N_SHAPES)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", TMA_V5_RING_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_tma_v5_ring_counter_persistent_correct(tmp_path, dtype, knobs):
    d = sm90_tma.with_ring(_v5_design(dtype, (*knobs[:5], 4), pers=knobs[5]))
    assert sm90_tma.v5(d, "ring") == 1 and legality(d) == []
    _check_design(tmp_path, d, OVERLAP_SHAPES)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", TMA_V5_PAIR_TMA_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_tma_v5_pair_tma_store_persistent_correct(tmp_path, dtype, knobs):
    d = _v5_design(dtype, knobs, cluster=2)
    assert sm90_tma.tma_stored(d) and legality(d) == []
    assert launch_recipe(d)["cluster"] == [2, 1, 1]
    _check_design(tmp_path, d, PAIR_TILE_N_SHAPES)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", TMA_V5_UNIFORM_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_tma_v5_uniform_persistent_correct(tmp_path, dtype, knobs):
    d = _uniform_design(dtype, *knobs)
    assert d in sm90_tma.uniform_designs(dtype)
    _check_design(tmp_path, d, OVERLAP_SHAPES)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", TMA_V5_STREAMK_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_tma_v5_streamk_persistent_correct(tmp_path, dtype, knobs):
    d = _streamk_design(dtype, *knobs)
    assert d in sm90_tma.streamk_designs(dtype)
    _check_design(tmp_path, d, STREAMK_SHAPES)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", TMA_V5_TALL_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_tma_v5_tall_persistent_correct(tmp_path, dtype, knobs):
    d = _uniform_design(dtype, 2, *knobs, 1)
    assert d in sm90_tma.tall_tma_store_designs(dtype) and sm90_tma.tile_mn(d) == (256, knobs[0])
    _check_design(tmp_path, d, OVERLAP_SHAPES)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", TMA_V5_TALL_PAIR_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_tma_v5_tallpair_persistent_correct(tmp_path, dtype, knobs):
    d = _uniform_design(dtype, 2, *knobs, 1, cluster=2)
    assert d in sm90_tma.tall_pair_designs(dtype) and sm90_tma.tile_mn(d) == (256, knobs[0])
    assert launch_recipe(d)["cluster"] == [2, 1, 1]
    _check_design(tmp_path, d, [*OVERLAP_SHAPES, (1024, 8192, 1096)])


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", TMA_V5_PINGPONG_PAIR_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_tma_v5_pppair_persistent_correct(tmp_path, dtype, knobs):
    d = _uniform_design(dtype, *knobs, cluster=2)
    assert d in sm90_tma.pingpong_pair_designs(dtype)
    assert launch_recipe(d)["cluster"] == [2, 1, 1]
    _check_design(tmp_path, d, [*OVERLAP_SHAPES, (1024, 8192, 1096)])


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", TMA_V5_PINGPONG_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_tma_v5_pingpong_persistent_correct(tmp_path, dtype, knobs):
    d = _v5_design(dtype, knobs, pers=2)
    assert sm90_tma.pingpong(d) and launch_recipe(d)["persistent"] == 2
    _check_design(tmp_path, d, PINGPONG_V5_SHAPES)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", TMA_V5_OVERLAP_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_tma_v5_overlap_persistent_correct(tmp_path, dtype, knobs):
    d = _v5_design(dtype, knobs)
    assert sm90_tma.overlapped(d) and legality(d) == []
    _check_design(tmp_path, d, OVERLAP_SHAPES)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", TMA_V5_HALVES_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_tma_v5_halves_persistent_correct(tmp_path, dtype, knobs):
    d = _v5_design(dtype, knobs)
    assert sm90_tma.v5(d, "store") == 3 and legality(d) == []
    _check_design(tmp_path, d, OVERLAP_SHAPES)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("knobs", TMA_V5_TMA_DESIGNS, ids=lambda k: "x".join(map(str, k)))
def test_tma_v5_tma_store_persistent_correct(tmp_path, dtype, knobs):
    d = _v5_design(dtype, knobs[:6], pers=knobs[6])
    assert sm90_tma.tma_stored(d) and legality(d) == []
    rows = 16 if sm90_tma.v5(d, "store") == 5 else 64
    assert launch_recipe(d)["tma"]["c"] == [sm90_tma.tma_store_sub_n(d), rows]
    _check_design(tmp_path, d, OVERLAP_SHAPES)


# (N, ldc - N, C offset in elements): the bulk store's rows into a strided C: N % 8 != 0
# with ldc % 8 == 0 (whole 16-byte chunks by cp.async.bulk, the last N % 8 columns by
# plain stores), and a C 2 bytes past 16-byte alignment (every row by plain stores).
V5_STRIDED = [(2052, 4, 0), (1001, 7, 0), (2056, 8, 0), (2056, 8, 1), (264, 0, 3)]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("n, pad, offset", V5_STRIDED)
def test_tma_v5_bulk_store_into_a_strided_output(tmp_path, dtype, n, pad, offset):
    """The bulk store writes C[:, :N] of a padded [M, ldc] output as the contiguous
    launch does (bit for bit: the same kernel and operands), and nothing past column N."""
    _strided_output(tmp_path, _v5_design(dtype, (1, 256, 3, 8, 128, 1)), n, pad, offset)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("n, pad, offset", V5_STRIDED)
def test_tma_v5_pair_bulk_store_into_a_strided_output(tmp_path, dtype, n, pad, offset):
    """As above, the persistent multicast pair (17 M tiles: a CTA past M)."""
    _strided_output(tmp_path, _v5_design(dtype, (1, 256, 3, 8, 128, 1), cluster=2), n, pad, offset)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("n, pad, offset", V5_STRIDED)
@pytest.mark.parametrize("tile_n", [80, 224])
def test_tma_v5_tile_n_bulk_store_into_a_strided_output(tmp_path, dtype, n, pad, offset, tile_n):
    """As above, 128 x 80 and 128 x 224 tiles (N tiles starting at 80 j and 224 j: each
    16-byte aligned in a row of C where ldc % 8 == 0)."""
    knobs = (1, tile_n, max(sm90_tma.tile_n_stages(tile_n, dtype)), 8, 128, 1)
    _strided_output(tmp_path, _v5_design(dtype, knobs), n, pad, offset)


@pytest.mark.parametrize("n, pad, offset", V5_STRIDED)
@pytest.mark.parametrize("tile", [(2, 128, 4), (1, 224, 4)], ids=["128x128", "64x224"])
def test_tma_v5_pingpong_bulk_store_into_a_strided_output(tmp_path, n, pad, offset, tile):
    """As above, ping-pong (fp16: bf16's bulk store is the kernel tests'): each warpgroup's
    rows through its own C buffer half."""
    knobs = (*tile, 8, 128, 1)
    _strided_output(tmp_path, _v5_design("fp16", knobs, pers=2), n, pad, offset)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("n, pad, offset", V5_STRIDED)
def test_tma_v5_overlap_bulk_store_into_a_strided_output(tmp_path, dtype, n, pad, offset):
    """As above, v5 overlap (128 x 192, the epilogue under the next tile's first k tile)."""
    _strided_output(tmp_path, _v5_design(dtype, (1, 192, 4, 8, 128, 2)), n, pad, offset)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("n, pad, offset", V5_STRIDED)
def test_tma_v5_halves_bulk_store_into_a_strided_output(tmp_path, dtype, n, pad, offset):
    """As above, v5 halves (128 x 256 at 4 stages, each half's rows by bulk copies)."""
    _strided_output(tmp_path, _v5_design(dtype, (1, 256, 4, 8, 128, 3)), n, pad, offset)


# The TMA store's C: a tensor map over [M, N] with row stride ldc, so ldc % 8 == 0 and C
# 16-byte aligned, and N % 8 == 0 (the recipe's align; the ABI's C has ldc = N, N % 8
# == 0): measured on the H200, the store writes whole 16-byte granules, so N = 2052 and
# 1001 got columns written past N (to the next multiple of 8). N % 64 != 0 (a subtile
# partly past N) is clipped by the map.
V5_TMA_STRIDED = [(2056, 8, 0), (1000, 8, 0), (264, 0, 8), (2056, 16, 8)]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("n, pad, offset", V5_TMA_STRIDED)
@pytest.mark.parametrize(
    "knobs",
    [
        (1, 256, 4, 8, 128, 4, 1),
        (2, 128, 6, 8, 128, 4, 2),
        (1, 80, 8, 8, 128, 4, 1),
        (1, 160, 5, 8, 128, 5, 1),
        (2, 144, 6, 8, 128, 4, 2),
    ],
    ids=lambda k: "x".join(map(str, k)),
)
def test_tma_v5_tma_store_into_a_strided_output(tmp_path, dtype, n, pad, offset, knobs):
    """As above, the TMA store (cooperative 128x256, ping-pong 128x128, cooperative 128x80
    in 16-column subtiles, the warp store, ping-pong 128x144 in nine 16-column subtiles a
    block): the map's columns past N are not written."""
    _strided_output(tmp_path, _v5_design(dtype, knobs[:6], pers=knobs[6]), n, pad, offset)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("n, pad, offset", V5_TMA_STRIDED)
def test_tma_v5_pair_tma_store_into_a_strided_output(tmp_path, dtype, n, pad, offset):
    """As above, the multicast pair storing by TMA (17 M tiles: a CTA past M)."""
    _strided_output(tmp_path, _v5_design(dtype, (1, 256, 4, 8, 128, 4), cluster=2), n, pad, offset)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("n, pad, offset", V5_TMA_STRIDED)
def test_tma_v5_pppair_into_a_strided_output(tmp_path, dtype, n, pad, offset):
    """As above, the ping-pong pair (17 M tiles: a CTA past M), with the ring counter and
    the uniform warpgroup index."""
    d = _uniform_design(dtype, 2, 128, 6, 8, 128, 2, cluster=2)
    _strided_output(tmp_path, d, n, pad, offset)


def test_tma_v5_tma_store_refuses_a_misaligned_c(tmp_path):
    """A C that a tensor map cannot address (2 bytes past 16-byte alignment) is refused
    by the map's encoding, before any launch: nothing is written."""
    from cudal2.packaging.runtime import driver

    with pytest.raises(driver.CudaDriverError, match="cuTensorMapEncodeTiled"):
        _strided_output(tmp_path, _v5_design("fp16", (1, 256, 4, 8, 128, 4)), 264, 0, 1)


def _strided_output(tmp_path, d: KernelDesign, n: int, pad: int, offset: int) -> None:
    from cudal2.packaging.runtime import driver
    from cudal2.packaging.runtime.abi import GemmArgs

    dtype = d.dtype
    cache = ArtifactCache(tmp_path)
    b = build(d, cache)
    assert b.ok, b.error
    recipe = launch_recipe(d)
    kernel = driver.Kernel(cache.cubin(b.artifact_key), b.symbol, recipe["smem_bytes"])
    m, k = 2100, 1096
    tdtype = torch.float16 if dtype == "fp16" else torch.bfloat16
    gen = torch.Generator(device="cuda")
    gen.manual_seed(22)
    a = torch.randn(m, k, device="cuda", dtype=tdtype, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=tdtype, generator=gen)
    stream = torch.cuda.current_stream().cuda_stream
    dense = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
    driver.launch_gemm(
        kernel,
        recipe,
        GemmArgs(a.data_ptr(), w.data_ptr(), dense.data_ptr(), m, n, k, k, k, n),
        stream,
    )
    ldc = n + pad
    store = torch.full((m * ldc + offset,), float("nan"), device="cuda", dtype=tdtype)
    c = store[offset:].view(m, ldc)
    driver.launch_gemm(
        kernel,
        recipe,
        GemmArgs(a.data_ptr(), w.data_ptr(), c.data_ptr(), m, n, k, k, k, ldc),
        stream,
    )
    torch.cuda.synchronize()
    assert torch.equal(c[:, :n], dense), f"{design_name(d)}: strided C differs"
    assert torch.isnan(c[:, n:]).all() and torch.isnan(store[:offset]).all()
    ref = (a.float() @ w.float().T).to(tdtype)
    assert (dense.float() - ref.float()).abs().max() <= 0.05 * ref.float().abs().max()
