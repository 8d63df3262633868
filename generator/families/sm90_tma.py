"""Family ``sm90tma``: warp-specialised TMA + wgmma GEMM for sm_90a (ABI gemm_v2).

A producer warpgroup (one elected thread, registers given back with ``setmaxnreg``)
issues 2-D TMA tile loads (``cp.async.bulk.tensor``, 128-byte swizzle, out-of-bounds
rows and k filled with zeros by the TMA engine) into a ring of ``stages`` shared-memory
slots guarded by mbarriers; one or two consumer warpgroups wait on a slot's "full"
barrier, issue ``wgmma.mma_async`` from it, keep one k tile's group in flight and
release the slot on its "empty" barrier. K is split over a ``split_k``-CTA cluster
and the fp32 tiles are summed through distributed shared memory in rank order
(deterministic). The epilogue goes through shared memory (coalesced stores).

Knobs: ``swap`` (the orientation), ``warpgroups`` consumer warpgroups (1, 2),
``m_blocks`` 64-row wgmma M blocks per warpgroup (1, 2), ``wgmma_n`` (the wgmma N,
8..256), ``stages``, ``split_k``, ``persistent`` and ``cluster_m``. Two orientations:

- ``swap`` = 0 (compute side): the wgmma M side is the activations, the CTA's ``bm`` =
  64 x ``m_blocks`` per warpgroup, ``bn`` = ``wgmma_n`` (64, 128, 256);
- ``swap`` = 1 (small M, "swap AB"): the wgmma M side is the weight rows, ``bn`` = 64
  x ``m_blocks`` per warpgroup, ``bm`` = ``wgmma_n`` (8 .. 256), so a decode batch of
  8 or 16 rows wastes nothing.

128 rows per warpgroup (two 64-row accumulator sets) halve how often the other
operand is read from L2 for the same warps.

``persistent`` = 1 (split 1 only): a grid of one CTA per SM slot walks the output
tiles, the producer loading the next tile while the consumers store this one straight
from their accumulators. ``persistent`` = 2 ("ping-pong", two consumer warpgroups):
the same walk, but each warpgroup computes whole tiles (``64 x m_blocks`` rows on the
wgmma M side), the two taking turns on the ring through "turn" mbarriers, so one
warpgroup's epilogue runs under the other's wgmmas.

The v5 knobs of a persistent design (optional: left out of a design at 0,
so every earlier design keeps its key, name and source): ``raster`` = G > 0 walks the
tiles in groups of G M tiles (a super-row; the group's tiles column by column, its G M
tiles of one N tile adjacent), so a wave of CTAs reads fewer A and B tiles from L2
than the M-fastest walk over every M tile; ``ctas`` = c > 0 launches at most c CTAs
(the recipe's ``max_ctas``; fast.cu: 128 beat 132); ``store`` = 1 stores each tile
through a C buffer in shared memory with asynchronous bulk copies
(``cp.async.bulk.global.shared::cta``, one per output row), so the consumers go on to
the next tile's main loop while the copies drain. v5 tile N: the persistent cooperative
bulk-store designs also take 128 x n tiles, n in ``TILE_N`` (80, 160, 192, 224: not
powers of two), whose tile counts fill whole waves where 128x256 tiles leave SMs idle.
v5 ping-pong: the ping-pong kernel takes the three knobs too, each consumer warpgroup
storing its own tiles through its own half of the C buffer (``PINGPONG_V5_TILES``).
v5 overlap: ``store`` = 2, the persistent cooperative kernel with two accumulator sets,
each tile's bulk store run under the next tile's first k tile (``OVERLAP_TILE_N``). v5
halves: ``store`` = 3, the bulk store in two row halves through a C buffer of half the
rows, so the ring keeps a stage more (``HALVES_TILE_N``; measured to lose, not in the
space). v5 TMA store: ``store`` = 4, each tile in 64-row subtiles of 64, 32 or 16
columns through two small buffers a consumer warpgroup, one ``cp.async.bulk.tensor``
store a subtile through a third tensor map (of C, the recipe's ``tma.c`` box), so the
ring keeps a stage more (``TMA_STORE_TILE_N``, and every tile of
``PINGPONG_V5_TILES``); ``store`` = 5 the same a warp at a time (measured even with it,
not in the space). v5 ping-pong narrow: the ping-pong TMA-store kernel of 128 x n
tiles of cuBLASLt's widths (``PINGPONG_NARROW_N``: 112, 144, 176) on deep rings (176 in
the space). v5 ring counter: ``ring`` = 1 keeps the ring's slot and phase as counters in
the TMA store's kernels, where ``ring`` = 0 divides by the ring's stages every k tile (a
multiply-high where the ring is not a power of two). v5 uniform warpgroup index:
``uniform`` = 1 broadcasts a thread's warpgroup index from lane 0, so the consumers' ring
slot and matrix descriptors live in uniform registers. v5 R by TMA: ``rtma`` = 1 (a trial
variant of a residual design storing by TMA, ``epilogue_trial``) reads the residual's
subtiles by TMA through a fourth tensor map into the TMA store's buffers, each lane taking
its accumulator pairs of it with ldmatrix.

``cluster_m`` = 2 (one tile per CTA, split 1): clusters of two CTAs on adjacent M
tiles of one N tile; each loads half of the shared B tile and multicasts it to both
(``.multicast::cluster``), so B is read from L2 once per pair, and a ring slot is
refilled only when the consumers of both CTAs have released it. The persistent
cooperative kernel pairs too (v5 pair); with 128 x n tiles of ``PAIR_TILE_N`` (v5 pair
tile N: each CTA's half of B a whole number of 8-row swizzle atoms) and with the TMA
store (v5 pair TMA store) it lost to its unpaired twin, and those designs are not in the
space. The ping-pong kernel pairs with the TMA store (v5 ping-pong pair).

``bk`` is 64 (one swizzle atom). Layout ``tn`` only (both operands K-major). The
tensor maps are encoded on the host by the runtime from the recipe's ``tma`` boxes.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from typing import Any

from cudal2.generator import tags
from cudal2.generator.families import mma_sync
from cudal2.generator.families.base import (
    Features,
    Knob,
    check,
    epilogue,
    epilogue_recipe,
    gemm_v1_recipe,
    make,
    pdl_trigger,
)
from cudal2.records import EPILOGUE_ACTIVATION, ROPE_KV, ROW_SCALED, KernelDesign
from cudal2.records import EPILOGUES as ALL_EPILOGUES

FAMILY = "sm90tma"
TEMPLATE = "sm90_tma.cu.j2"
ARCHS = ("sm_90a",)  # wgmma, setmaxnreg, TMA: sm_90a only
LAYOUTS = ("tn",)  # TMA tiles are K-major for both operands
# Fused epilogues rendered (the shared ``epilogue`` knob; ABI gemm_v3 when not none);
# not yet RoPE and the KV-cache write (``ROPE_KV``: sm90direct's alone so far)
EPILOGUES = tuple(e for e in ALL_EPILOGUES if e not in ROPE_KV)

WARPGROUPS = (1, 2)
M_BLOCKS = (1, 2)  # 64-row wgmma M blocks per consumer warpgroup
WGMMA_N = (64, 128, 256)  # the wgmma N of the compute orientation
SWAP_N = (8, 16, 32, 64, 128, 256)  # the wgmma N (the CTA's bm) of the swapped one
# The wgmma N of compute-orientation ping-pong tiles: finer steps, so that a grid of
# whole tiles fills the last wave (4096x1280: 128x160 tiles make 2.0 waves where
# 128x128 make 2.4)
PINGPONG_N = (64, 96, 112, 128, 160, 192, 256)
STAGES = (4, 6, 8, 12)
PERSISTENT = (0, 1, 2)  # one tile per CTA; persistent cooperative; persistent ping-pong
# v5 (issue 22), persistent cooperative only. ``raster``: 0 the M-fastest walk; G: groups
# of G M tiles (CUTLASS's and ThunderKittens' "swizzle", super-M 8 there).
RASTER = (0, 8, 16)
# ``ctas``: 0 one CTA per SM slot; c: at most c CTAs (fast.cu: 128 of the H100's 132 SMs).
CTAS = (0, 128)
# 0: 4-byte stores from the accumulators; 1: C buffer + bulk copies; 2: the bulk store
# overlapped with the next tile's main loop (v5 overlap: two accumulator sets, below);
# 3: the bulk store in two row halves through a C buffer of half the rows (v5 halves);
# 4: 64 x 64 subtiles through two small buffers a consumer warpgroup, each stored by TMA
# through a tensor map of C (v5 TMA store); 5: the same, each warp storing its own 16
# rows (v5 TMA store a warp)
STORE = (0, 1, 2, 3, 4, 5)
# v5 tile N (issue 22): the persistent cooperative kernel's tile N (``wgmma_n``, 128 x n
# tiles) that is not a power of two, so that the tile count fills whole waves of 128 or
# 132 CTAs where v5's 128x256 tiles leave SMs idle. The rule: for each llm-public
# M >= 1024 shape (bench/shapes/llm-public-prefill.toml) whose 128x256 tiles fill less
# than 0.9 of their last wave (on the better of 128 and 132 CTAs), the largest multiple
# of 16 (<= 256) dividing N whose 128 x n tiles fill >= 0.9 of it: 1024x1280 -> 80 (128
# tiles: one wave of 128), 4096x1280 -> 160 (256: two), 1024x6144 -> 192 (256: two),
# 1024x7168 -> 224 (256: two). Multiples of 16 keep the C buffer's rows conflict-free.
# tests/generator/test_sm90_tma_v5_tile_n.py derives the set from the shapes again.
TILE_N = (80, 160, 192, 224)
TILE_N_DEPTHS = 2  # the two deepest rings that fit beside the C buffer, per tile N
# v5 pair tile N (issue 22): the persistent multicast pair with 128 x n tiles, n not a
# power of two. cuBLASLt's autotuned winners at M >= 1024 (the committed H100 sweeps'
# cublaslt-autotune records) are, in this orientation, 128 x {144, 168, 176} tiles in
# clusters of two along M sharing the weight tile (CLUSTER_SHAPE_1x2x1): this kernel's
# pair, with a narrower tile than v5's 128x256, so a deeper ring fits beside the C buffer
# (128x176: 4 stages, 128x256: 3) to absorb the pair's coupling. Each CTA multicasts
# half the B box (n / 2 rows of 128 bytes), which must start on a 1024-byte swizzle
# atom: n / 2 a multiple of 8 (168 cannot pair). 144 and 176 also unpaired, as controls.
# Measured on an H200 (docs/kernels.md, "sm90tma v5 pair tile N"): the deeper ring did not
# absorb the coupling; the pair is 0.982 of the same width unpaired (16 of 17 targets). So
# these designs are not in the space (``space``): the grid's cost model, which prices the
# pair's L2 saving and not its coupling, ranked them first at M = 2048, and every build
# would compile and measure them for nothing. ``pair_tile_n_designs`` still makes them.
PAIR_TILE_N = (144, 160, 176, 192, 224)
PAIR_TILE_N_CONTROLS = (144, 176)  # the unpaired twins the space lacks (TILE_N has the rest)
PAIR_ROWS = 8  # each CTA's half of the multicast B box: a multiple of 8 rows
# v5 ping-pong (issue 22): the ping-pong kernel's tiles (m_blocks, wgmma_n) that take v5's
# bulk store, walk and CTA cap: 128x128 and 128x160 (two 64-row blocks a warpgroup), 64x256
# (one block of the cooperative 128x256's wgmma), and the tile N ones a warpgroup's
# registers take (128x80, 64x192, 64x224; 128 x 192 or 224 would need 192 or 224
# accumulators + 40 > 224). Each at its two deepest rings beside the two C buffer halves.
PINGPONG_V5_TILES = ((2, 128), (2, 160), (1, 256), (2, 80), (1, 192), (1, 224))
# v5 overlap (issue 22): ``store`` = 2, the persistent cooperative kernel with two
# accumulator sets a consumer thread, so that a tile's epilogue (the C buffer writes,
# the barriers, the bulk copies' issue) runs after the next tile's first k tile is issued
# into the other set: the tensor pipe works through it, where the cooperative kernel's
# pipe idles from its last wgmma to the next tile's first (ping-pong's overlap, with the
# cooperative kernel's operand sharing). Two sets of 64 x n accumulators take 2 x n / 2
# registers + 40 <= OVERLAP_CONSUMER_REGS: n <= 192 (128x256 cannot). The widths: those
# whose bulk-store twins (``store`` = 1) are in the space, 128 (v5), 160 and 192 (tile N),
# each at its two deepest rings beside the C buffer, each raster x ctas.
OVERLAP_TILE_N = (128, 160, 192)
# v5 halves (issue 22): ``store`` = 3, the persistent cooperative kernel storing each
# tile in two row halves through a C buffer of half its rows (each consumer warpgroup 32
# rows: 128x256, 33 KiB, not 66), so the ring keeps one more stage: 128x256 at 4 stages,
# as torch's cuBLAS kernels at M >= 1024 on the H200 run it (nvjet_sm90_..._256x128_64x4
# _1x2_..., bench/results/h200-vendor-kernels.json), where the bulk store leaves 3. The
# widest tiles, whose rings the C buffer cuts most; each at its two deepest rings (the
# shallower is the bulk store's deepest: the two halves' cost alone), each raster x ctas.
# Measured on an H200 (docs/kernels.md, "sm90tma v5 overlap and halves"): the second
# half's wait for the first half's copies costs 3.5% at the same ring, the extra stage
# gives back 1.2%: 0.977 of the bulk store at its deepest. So these designs are not in
# the space; ``halves_designs`` still makes them.
HALVES_TILE_N = (192, 224, 256)
# v5 TMA store (issue 22): ``store`` = 4. cuBLASLt's kernels at M >= 1024 keep about 16
# KiB beside a deep ring (docs/kernels.md, the ncu-prefill block): the tile leaves in
# subtiles through a small buffer, each stored by one TMA instruction, where the bulk
# store holds the whole tile (66 KiB at 128x256) and issues a copy a row. Here each
# consumer warpgroup writes its 64-row blocks in 64-row subtiles (stmatrix, 16 bytes a
# lane, into the swizzle of the C tensor map's box) through two buffers of its own,
# double-buffered against its copies: 32 KiB for two warpgroups at 64 columns, so
# 128x256 keeps 4 stages and 128x128 6 (the bulk store: 3 and 5). A subtile is the
# widest of ``TMA_STORE_SUB_N`` dividing the tile N (80: 16 columns; 160, 224: 32), its
# box row 128, 64 or 32 bytes, the swizzle of that span (the runtime derives it from the
# box). The box's rows past M and columns past N are clipped by the tensor map. The
# kernel takes a third tensor map (tmC, after tmB; the recipe's ``tma.c`` box) encoded by
# the runtime over C [M, N] with row stride ldc.
TMA_STORE_TILE_N = (80, 128, 160, 192, 224, 256)
# v5 ping-pong narrow (issue 22): cuBLASLt's autotuned algorithms where they lead at M >=
# 1024 on the H200 are ping-pong kernels (no ``coop`` in their names) of 128 x n tiles in
# this orientation with deep rings: 128 x 112 at 7 stages (4096³,
# ``nvjet_sm90_hsh_112x128_64x7_1x2_h_bz_TNN``), 128 x 144 at 6 (4096×8192×1024), and 128 x
# 176 on the 28672- and 7168-wide shapes (docs/kernels.md, the ncu-prefill block and v5
# pair tile N). With the TMA store's small buffers this kernel's ping-pong takes those
# rings too (two 64-row blocks a warpgroup, 16-column subtiles; 176 accumulators + 40 <=
# 224): each width at its two deepest (112: 6, 7; 144: 5, 6; 176: 4, 5), each walk x cap.
# Measured on an H200 (docs/kernels.md, "sm90tma v5 ping-pong narrow and pair TMA store"):
# 112 and 144 never the fastest own kernel (128 x 112 at 7 stages 8% behind torch at 4096³,
# sustained); 176 at 4 stages ties v5's 128x256 at 8192³ sustained (+1.5% over torch). So
# only 176 is in the space (``PINGPONG_NARROW_SPACE``); ``pingpong_narrow_designs`` still
# makes the rest.
PINGPONG_NARROW_N = (112, 144, 176)
PINGPONG_NARROW_SPACE = (176,)
# v5 ring counter (issue 22): ``ring`` = 1 keeps the ring's slot and phase as counters (the
# producer's from the start; each consumer's from one division a tile; then a compare and
# increment a k tile) where ``ring`` = 0 computes ``it % STAGES`` and ``(it / STAGES) & 1``
# every k tile. Nsight Compute's
# source counters on the ping-pong 128 x 112 at 6 stages (docs/kernels.md, "sm90tma v5
# ring counter") put its dispatch stalls, 1.03 a issue against cuBLASLt's 0.04, on the
# ``LEA.HI`` after each ``IMAD.HI`` by 0x2aaaaaab: the division by 6, between the
# k tile's wgmmas. A ring of a power of two divides by shifting. The TMA-store designs
# (``store`` = 4) of the space whose rings are not a power of two take it, unpaired.
RING = (0, 1)
# v5 uniform warpgroup index (issue 22): ``uniform`` = 1 computes a thread's warpgroup as
# ``tid >> 7`` broadcast from lane 0 (``tags.TMA_WG_INDEX``). Read off the SASS (nvcc
# 13.0, no GPU run yet): with ``tid >> 7`` the compiler cannot tell the warpgroup index is
# the same across a warp, so a ping-pong consumer's ring position, slot and matrix
# descriptors are vector registers, and every wgmma is preceded by 64-bit descriptor
# arithmetic in vector registers and R2UR moves (110 R2UR in the ping-pong 128 x 128 at 6
# stages, a median of 6 instructions between two wgmmas); broadcast, they live in uniform
# registers (6 R2UR, a median of 2, 1,328 instructions in the kernel down to 1,112, the
# same 168 registers: bench/results/sass-uniform.json). The TMA store's persistent kernels
# take it (``uniform_designs``).
UNIFORM = (0, 1)
# v5 ping-pong pair (issue 22): the ping-pong kernel in multicast pairs along M
# (``cluster_m`` = 2 with ``persistent`` = 2). cuBLASLt's algorithms where they lead at M >=
# 1024 are ping-pong kernels in clusters of two along M (``nvjet_sm90_hsh_112x128_64x7_1x2``,
# docs/kernels.md "sm90tma v5 ping-pong narrow"), and this kernel's ping-pong was the
# fastest own kernel on 10 of 17 targets with the ring counter, but had no pair. Both
# CTAs of a pair walk the same pair tiles; warpgroup w of each takes the w-th of every
# two, so a slot's "empty" barrier counts the consuming warpgroup's four warps in both
# CTAs (``tags.TMA_PAIR_EMPTY_INIT``); the rest is the cooperative pair's (half of B
# multicast, the releases here and in the partner, cluster barriers at both ends). With
# the TMA store only (its C buffers do not grow with the pair). Not yet run on a GPU: no
# device was lent the session that wrote it (GPU tests and sweeps in
# tests/verify/test_kernels_gpu.py and bench/manifests/sweep-tma-v5-pppair*).
# v5 tall TMA store (issue 22): the persistent cooperative kernel's 256 x n TMA-store tiles
# (two 64-row blocks a consumer warpgroup, ``m_blocks`` = 2), whose operand bytes a k tile
# per output are fewer than 128 x n's: (256 + n) / (256 n) against (128 + n) / (128 n).
# torch's kernel at 8192³, 4096×28672 and 4096×1280 (``nvjet_sm90_hsh_320x128_64x3_1x2_
# h_bz_coopB``) has the area of 256 x 160, at 3 stages. 256 x 128 to 176 fit 3 and 4 stages
# beside the subtile buffers (128 to 176 accumulators + 40 <= 224; 192 does not), as
# ``uniform_designs`` has the rest: the counter at 3 stages, ``uniform`` = 1. Not yet run
# on a GPU (written the session the ping-pong pair was).
TALL_TMA_STORE_N = (128, 144, 160, 176)
# v5 pair TMA store (issue 22): the persistent multicast pair (``cluster_m`` = 2) with the
# TMA store. The pair lost 2% to its unpaired twin twice, with the bulk store (3 stages
# at 128x256, 4 at 128x176: v5 pair, v5 pair tile N), each slot waiting for the slower
# CTA of the two; cuBLASLt's and torch's kernels at these shapes all run in clusters of
# two along M. With the TMA store the C buffer no longer competes with the ring, so this
# measures the pair on the rings the unpaired TMA-store kernels have: each width of
# ``TMA_STORE_TILE_N`` (each CTA multicasting n / 2 rows of B: whole 8-row atoms) at the
# two deepest rings, each walk and cap. Rows of a CTA past M (odd M tile counts) are
# clipped by C's tensor map. Measured on an H200 (docs/kernels.md, "sm90tma v5 ping-pong
# narrow and pair TMA store"): 0.988 (fp16) and 0.990 (bf16) of the same design unpaired,
# a third time behind; not in the space, ``pair_tma_designs`` still makes them.
TMA_STORE_SUB_N = (64, 32, 16)  # a subtile's columns: the widest dividing the tile N
TMA_STORE_ROWS = 64  # a subtile's rows: a warpgroup's 64-row block
TMA_STORE_WARP_ROWS = 16  # ``store`` = 5: a warp's rows of it, one store each
TMA_STORE_BUFFERS = 2  # a consumer warpgroup's subtile buffers
TMA_STORE_OFFSET = 1024  # the buffers after the ring, on a 1024-byte swizzle atom
# v5 R by TMA (issue 22, ``rtma`` = 1; a trial variant of the TMA store's designs with an
# epilogue that reads R: ``epilogue_trial``): R's subtiles come by TMA through a fourth
# tensor map into the TMA store's buffers, in place of each lane's scalar 2-byte reads in
# the accumulator layout, which made the residual designs 1.25x (o) and 1.07x (down)
# their plain twins' time on the H200 (docs/kernels.md, "The fused prefill"). Their
# mbarriers (two a consumer warpgroup) follow the ring's and ping-pong's turn barriers,
# in the gap before the buffers.
RTMA = (0, 1)
# v5 stream-K (issue 22): the persistent cooperative kernel's walk cuts the last tiles
# along K (``streamk`` = 1; ``tags.TMA_STREAMK``, the protocol in the template's helpers).
# The data-parallel kernels leave SMs idle: with the 128-CTA cap (which measured as fast
# as a CTA per SM) the power-of-two tile counts of the prefill shapes fill whole waves,
# but on 128 of the H100's 132 SMs (3% of them idle); uncapped, the waves are partial
# (512 tiles of 128 x 256 at 4096 x 4096: 3.88 waves of 132). Stream-K gives each of the
# 132 CTAs the same k tiles: its data-parallel tiles, then an even share of the last
# T mod G + G tiles' k tiles, a tile cut in at most two pieces there (T < G: in more,
# 1024 x 1280's 80 tiles of 128 x 128 over 132 CTAs). A piece that does not hold the
# tile's first k tile parks its fp32 sums in a workspace (the CTA's slot: BM x BN floats,
# then a flag a CTA; ``workspace_per_cta``), which the tile's owner adds before its store.
STREAMK = (0, 1)
STREAMK_TILE_N = (80, 128, 160, 192, 256)  # TMA_STORE_TILE_N but 224, which spills
STREAMK_GATED_MAX_N = 192  # ... and with a gated activation, 256 spills too
RTMA_EPILOGUES = tuple(tags.RTMA_ADD2)
# The bulk-store C buffer's rows are padded by 16 bytes: the accumulator pairs a warp
# writes (8 rows x 4 pairs) then fall in 32 distinct banks, and each row stays 16-byte
# aligned, as cp.async.bulk asks of its shared-memory source.
C_PAD = 8
CLUSTER_M = (1, 2)  # CTAs of adjacent M tiles sharing (multicasting) the B tile
SPLIT_K = (1, 2, 4, 8)
BK = 64
ALIGN_SLACK = 1024  # the kernel aligns its dynamic shared memory to the swizzle atom
BARRIER_BYTES = 2 * 8 * 16  # full and empty mbarriers of up to 16 stages
# The gated activation and the row scale are the one-tile kernel's, but for the
# persistent kernels below: the gated activation pairs columns 2j, 2j + 1 inside its
# four-column store groups, and the row scale parks its sums of squares beside the fp32
# tile (the persistent kernels store from their accumulators).
# sm90tma v5 gated TMA store (issue 22): the gated activation in the persistent kernels
# that store by TMA (``store`` = 4). A thread's accumulator pair (2j, 2j + 1) is one
# (gate, up) pair, so each thread forms its outputs in registers; a quad's shuffles put
# two adjacent outputs in each lane for stmatrix, and a subtile of SUB_N accumulator
# columns is stored as SUB_N / 2 output columns through C's map over [M, N / 2]. At
# least 16 output columns a subtile (32-byte box rows): subtiles of 32 or 64 columns.
# So a patched model's gate_up projection can take the prefill kernels (the one-tile
# kernel's are 0.89-0.97 x torch there, docs/kernels.md "sm90tma v5"). First measured
# on an H200 at Llama's gate_up: docs/kernels.md "The fused prefill through the twins".
GATED_TMA_MIN_SUB_N = 32
# The row scale's sums of squares are taken by the producer warpgroup's three idle
# warps, a k tile's 16-byte loads in flight together and one register sum per chunk:
# at most 64 rows (6 loads and sums a thread, within the producer's budget after
# setmaxnreg). Measured on the H100 (docs/kernels.md): the sums taken by the consumers
# cost up to +70% at M = 64.
ROWSQ_MAX_BM = 64
# ... and in the persistent cooperative kernel storing by TMA (v5 row scale), in batches
# of 4 loads a thread: up to 128 rows (11 sums a thread), one 64-row block a warpgroup.
PERSISTENT_ROWSQ_MAX_BM = 128
# Where its two scale buffers' mbarriers lie after the ring's barriers: after R's four
# (``rtma``; the two are never in one design, the space stays apart).
RS_BAR_AFTER = 32
PINGPONG_MAX_STAGES = 15  # ping-pong's two turn mbarriers take one stage's pair
# Registers: with two consumer warpgroups the kernel is compiled for 168 per thread
# (the register file over three warpgroups); the producer gives back down to 56, the
# consumers take up to 224. With one, there is no reallocation: up to 128 registers
# (two CTAs per SM) when the accumulators are 64 or fewer, 255 otherwise.
PRODUCER_REGS = 56
CONSUMER_REGS = 224
# v5 overlap's split (CUTLASS's cooperative one): 2 x 232 + 40 = 504 a lane of the three
# warpgroups, the 168 x 3 they launch with.
OVERLAP_PRODUCER_REGS = 40
OVERLAP_CONSUMER_REGS = 232

KNOBS = (
    Knob("swap", (0, 1), "swap{}"),
    Knob("warpgroups", WARPGROUPS, "wg{}"),
    Knob("m_blocks", M_BLOCKS, "mb{}"),
    Knob("wgmma_n", tuple(range(8, 257, 8)), "n{}"),
    Knob("stages", tuple(range(2, 17)), "s{}"),
    Knob("split_k", SPLIT_K, "sk{}"),  # a portable cluster
    Knob("persistent", PERSISTENT, "p{}"),
    Knob("cluster_m", CLUSTER_M, "c{}"),
)
# The family's own optional knobs (base.family_optional): left out at 0.
OPTIONAL_KNOBS = (
    Knob("raster", RASTER, "r{}", default=0),
    Knob("ctas", CTAS, "ct{}", default=0),
    Knob(
        "store",
        STORE,
        "st{}",
        default=0,
        spellings=((1, "bulk"), (2, "overlap"), (3, "halves"), (4, "tma"), (5, "tmaw")),
    ),  # fmt: skip
    Knob("ring", RING, "ring{}", default=0, spellings=((1, "ctr"),)),
    Knob("uniform", UNIFORM, "uni{}", default=0, spellings=((1, "wgu"),)),
    Knob("rtma", RTMA, "res{}", default=0, spellings=((1, "tma"),)),
    Knob("streamk", STREAMK, "streamk{}", default=0, spellings=((1, ""),)),
)
_OPTIONAL_DEFAULTS = {k.name: k.default for k in OPTIONAL_KNOBS}


def design(
    dtype: str,
    wgs: int,
    mp: int,
    swap: bool,
    n: int,
    stages: int,
    split: int,
    pers: int = 0,
    cluster: int = 1,
    raster: int = 0,
    ctas: int = 0,
    store: int = 0,
    ring: int = 0,
    uniform: int = 0,
    rtma: int = 0,
    streamk: int = 0,
) -> KernelDesign:
    """The sm_90a tn design with ``wgs`` consumer warpgroups of ``mp`` 64-row blocks on
    the wgmma M side (the weights when ``swap``), wgmma N ``n``, and the other knobs
    (the v5 ones left out at 0)."""
    return make(
        FAMILY, "sm_90a", dtype, "tn", OPTIONAL_KNOBS, swap=int(swap), warpgroups=wgs,
        m_blocks=mp, wgmma_n=n, stages=stages, split_k=split, persistent=pers,
        cluster_m=cluster, raster=raster, ctas=ctas, store=store, ring=ring, uniform=uniform,
        rtma=rtma, streamk=streamk,
    )  # fmt: skip


def v5(d: KernelDesign, knob: str) -> int:
    """A v5 knob's value (``raster``, ``ctas``, ``store``, ``ring``, ``uniform``, ``rtma``,
    ``streamk``; 0 where the design leaves it out, or where it is out of the domain: the
    declared checks report that)."""
    value = d.knobs.as_json().get(knob, _OPTIONAL_DEFAULTS[knob])
    domain = {k.name: k.domain for k in OPTIONAL_KNOBS}[knob]
    return value if value in domain else 0


def swapped(d: KernelDesign) -> bool:
    """Whether the weight rows are on the wgmma M side."""
    return d.knobs.swap == 1


def warpgroups(d: KernelDesign) -> int:
    return d.knobs.warpgroups


def pingpong(d: KernelDesign) -> bool:
    """Whether each consumer warpgroup computes whole tiles, taking turns."""
    return d.knobs.persistent == 2


def overlapped(d: KernelDesign) -> bool:
    """v5 overlap: the bulk store under the next tile's first k tile (``store`` = 2)."""
    return v5(d, "store") == 2


def consumer_regs(d: KernelDesign) -> tuple[int, int]:
    """The registers setmaxnreg gives the producer and each consumer thread (two
    consumer warpgroups)."""
    if overlapped(d):
        return OVERLAP_PRODUCER_REGS, OVERLAP_CONSUMER_REGS
    return PRODUCER_REGS, CONSUMER_REGS


def m_blocks(d: KernelDesign) -> int:
    """64-row wgmma M blocks per consumer warpgroup (accumulator sets)."""
    return d.knobs.m_blocks


def mma_rows(d: KernelDesign) -> tuple[int, int]:
    """(rows on the wgmma M side, rows on the wgmma N side) of the CTA tile."""
    per_wg = 64 * d.knobs.m_blocks
    return (per_wg if pingpong(d) else per_wg * d.knobs.warpgroups), d.knobs.wgmma_n


def tile_mn(d: KernelDesign) -> tuple[int, int]:
    """The CTA's output tile (bm, bn)."""
    p, q = mma_rows(d)
    return (q, p) if swapped(d) else (p, q)


def tile(d: KernelDesign) -> mma_sync.Tile:
    """The CTA tile and its consumer warps (4 per warpgroup, along the weight rows'
    side when swapped)."""
    bm, bn = tile_mn(d)
    w = 4 * d.knobs.warpgroups
    wm, wn = (1, w) if swapped(d) else (w, 1)
    return mma_sync.Tile(bm, bn, BK, wm, wn, 1, d.knobs.stages)


def acc_regs(d: KernelDesign) -> int:
    """fp32 accumulator registers per consumer thread (both sets of v5 overlap)."""
    return (2 if overlapped(d) else 1) * d.knobs.m_blocks * d.knobs.wgmma_n // 2


def threads(d: KernelDesign) -> int:
    return 128 * (d.knobs.warpgroups + 1)  # + the producer warpgroup


def ring_bytes(d: KernelDesign) -> int:
    p, q = mma_rows(d)
    return d.knobs.stages * (p + q) * BK * 2


def _epilogue_or_none(d: KernelDesign) -> str:
    """The design's epilogue, ``none`` where its knob is out of the domain (the declared
    checks report that; the rules must still run on such a design)."""
    value = d.knobs.as_json().get("epilogue", 0)
    return ALL_EPILOGUES[value] if value in range(len(ALL_EPILOGUES)) else "none"


def tma_stored(d: KernelDesign) -> bool:
    """Whether the design stores by TMA (``store`` = 4, a warpgroup a subtile, or 5, a
    warp its 16 rows)."""
    return v5(d, "store") in (4, 5)


def gated_tma(d: KernelDesign) -> bool:
    """Whether the design is the gated TMA store: a gated activation (``silu``,
    ``gelu_tanh``) in a persistent kernel storing by TMA (``store`` = 4) in subtiles of
    at least ``GATED_TMA_MIN_SUB_N`` columns."""
    return (
        _epilogue_or_none(d) in EPILOGUE_ACTIVATION
        and d.knobs.persistent in (1, 2)
        and v5(d, "store") == 4
        and tma_store_sub_n(d) >= GATED_TMA_MIN_SUB_N
    )


def persistent_rows(d: KernelDesign) -> bool:
    """Whether the design is v5's row scale: an RMSNorm row-scaled epilogue in the
    persistent cooperative kernel storing by TMA (``persistent`` = 1, ``store`` = 4),
    unpaired."""
    return (
        _epilogue_or_none(d) in ROW_SCALED
        and d.knobs.persistent == 1
        and v5(d, "store") == 4
        and d.knobs.cluster_m == 1
    )


def tma_store_sub_n(d: KernelDesign) -> int:
    """The TMA store's subtile columns: the widest of ``TMA_STORE_SUB_N`` dividing the
    tile N (0: none does)."""
    return next((c for c in TMA_STORE_SUB_N if d.knobs.wgmma_n % c == 0), 0)


def c_buffer_bytes(d: KernelDesign) -> int:
    """The bulk store's C buffer [bm][bn + C_PAD] of 2-byte outputs (``store`` = 1, 2), or
    0; ping-pong has one a consumer warpgroup (each stores its own tiles); v5 halves
    (``store`` = 3) half the rows; the TMA store (4, 5) two 64-row subtiles of its
    ``tma_store_sub_n`` columns a consumer warpgroup, from the first 1024-byte boundary
    after the barriers."""
    if tma_stored(d):
        sub = TMA_STORE_ROWS * tma_store_sub_n(d) * 2
        return TMA_STORE_OFFSET - BARRIER_BYTES + d.knobs.warpgroups * TMA_STORE_BUFFERS * sub
    bm, bn = tile_mn(d)
    halves = 2 if pingpong(d) else 1
    rows = bm // 2 if v5(d, "store") == 3 else bm
    return halves * rows * (bn + C_PAD) * 2 if v5(d, "store") else 0


def smem_bytes(d: KernelDesign) -> int:
    """The ring, or the fp32 output tile [bm][bn + 4] that reuses it, the barriers,
    the bulk store's C buffer (after the barriers) and the alignment slack."""
    bm, bn = tile_mn(d)
    # the row scale's fp32 sums of squares of A's rows, [split_k][bm] (v5's: the scales
    # of two tiles, [2][bm])
    rowsq = 4 * bm * d.knobs.split_k if _epilogue_or_none(d) in ROW_SCALED else 0
    if persistent_rows(d):
        rowsq = 4 * bm * 2
    data = max(ring_bytes(d), bm * (bn + 4) * 4)
    return data + BARRIER_BYTES + rowsq + c_buffer_bytes(d) + ALIGN_SLACK


def min_blocks(d: KernelDesign) -> int:
    """CTAs per SM the register budget is compiled for (``__launch_bounds__``)."""
    return 2 if d.knobs.warpgroups == 1 and acc_regs(d) <= 64 else 1


def rules(d: KernelDesign) -> list[str]:
    """Every reason beyond the declared checks that this design cannot be built or run."""
    k = d.knobs
    reasons = []
    if k.persistent and k.split_k != 1:
        reasons.append(f"persistent designs do not split K (split_k={k.split_k})")
    if k.persistent and swapped(d) and k.m_blocks == 2 and tile_mn(d)[0] > 64:
        # Measured: ptxas spilled the swapped persistent epilogue of two 64-row blocks
        # of more than 32 accumulators (128x256 cooperative, 128x128 ping-pong) in
        # fp16 and bf16.
        reasons.append("swapped persistent designs with two 64-row blocks and bm > 64 spill")
    if pingpong(d):
        if k.warpgroups != 2:
            reasons.append("ping-pong designs have two consumer warpgroups")
        if k.stages > PINGPONG_MAX_STAGES:
            reasons.append(f"stages={k.stages}: ping-pong has at most {PINGPONG_MAX_STAGES}")
    rows_max = PERSISTENT_ROWSQ_MAX_BM if persistent_rows(d) else ROWSQ_MAX_BM
    if _epilogue_or_none(d) in ROW_SCALED and tile_mn(d)[0] > rows_max:
        reasons.append(
            f"epilogue {_epilogue_or_none(d)!r}: the row scale's helper warps take tiles of "
            f"at most {rows_max} rows (bm={tile_mn(d)[0]})"
        )
    if k.persistent and _epilogue_or_none(d) in ROW_SCALED and not persistent_rows(d):
        # The persistent row scale is written for the cooperative walk (the helper warps
        # take every tile, as both consumer warpgroups do) and its TMA store.
        reasons.append(
            f"epilogue {_epilogue_or_none(d)!r}: the one-tile kernel (persistent=0), or the "
            "persistent cooperative kernel storing by TMA (persistent=1, store=4), unpaired"
        )
    elif k.persistent and _epilogue_or_none(d) in EPILOGUE_ACTIVATION and not gated_tma(d):
        reasons.append(
            f"epilogue {_epilogue_or_none(d)!r}: the one-tile kernel only (persistent=0), or "
            f"the TMA store (store=4) of subtiles of at least {GATED_TMA_MIN_SUB_N} columns"
        )
    if k.cluster_m > 1:
        reasons += _pair_reasons(d)
    reasons += _v5_reasons(d)
    reasons += mma_sync.smem_reason(smem_bytes(d))
    cap = consumer_regs(d)[1] if k.warpgroups > 1 else 255
    if acc_regs(d) + 40 > cap:
        reasons.append(f"{acc_regs(d)} accumulator registers + 40 > {cap} per thread")
    return reasons


def _pair_reasons(d: KernelDesign) -> list[str]:
    """Why a multicast pair (``cluster_m`` = 2) cannot have these knobs: split 1, and
    one tile per CTA (v4) or the persistent cooperative kernel of two consumer
    warpgroups in the compute orientation (issue 22's pair: B is the multicast operand,
    halves of ``wgmma_n`` rows)."""
    k = d.knobs
    if k.split_k != 1:
        return ["a multicast cluster along M has split 1"]
    if k.persistent == 2 and not tma_stored(d):
        # The ping-pong pair is written for the TMA store (v5 ping-pong pair).
        return ["a ping-pong multicast pair (persistent=2): the TMA store's (store=4 or 5) only"]
    if k.persistent and (swapped(d) or k.warpgroups != 2):
        return [
            "a persistent multicast pair: the compute orientation (swap=0) with two "
            "consumer warpgroups only"
        ]
    if k.persistent and (k.wgmma_n // 2) % PAIR_ROWS:
        return [
            f"wgmma_n={k.wgmma_n}: each CTA of a pair multicasts {k.wgmma_n // 2} rows of "
            f"B, which must be a multiple of {PAIR_ROWS} (its half starts on a 1024-byte "
            "swizzle atom)"
        ]
    return []


def _v5_reasons(d: KernelDesign) -> list[str]:
    """Why the v5 knobs (``raster``, ``ctas``, ``store``, ``ring``, ``uniform``, ``rtma``,
    ``streamk``) cannot take these values."""
    k = d.knobs
    set_ = [
        n for n in ("raster", "ctas", "store", "ring", "uniform", "rtma", "streamk") if v5(d, n)
    ]
    if set_ and k.persistent not in (1, 2):
        # The walk, the CTA cap and the C buffer are written for the persistent kernels
        # (cooperative and ping-pong, whose warpgroups each store through their own half
        # of the C buffer); one tile per CTA has no walk.
        return [f"{', '.join(set_)}: persistent designs only (persistent=1 or 2)"]
    if v5(d, "store") and swapped(d):
        # The C buffer is written row-major from the compute orientation's accumulator
        # pairs (two adjacent columns of one row); swapped pairs are two rows.
        return [f"store={v5(d, 'store')}: the compute orientation only (swap=0)"]
    if overlapped(d) and (k.persistent != 1 or k.cluster_m != 1 or k.warpgroups != 2):
        # Written for the cooperative kernel's one walk: ping-pong overlaps already, and
        # the pair's partner would wait on slots held across the epilogue.
        return [
            "store=2: the persistent cooperative kernel (persistent=1) of two consumer "
            "warpgroups, unpaired (cluster_m=1)"
        ]
    if overlapped(d) and k.m_blocks != 1:
        # The overlap kernel holds one 64-row block a set (its turn takes MP = 1).
        return ["store=2: one 64-row block a warpgroup (m_blocks=1)"]
    if tma_stored(d) and k.warpgroups != 2:
        # Written for the persistent kernels of two consumer warpgroups (cooperative,
        # ping-pong, and the cooperative pair: _pair_reasons has the rest).
        return [
            f"store={v5(d, 'store')}: the persistent kernels (persistent=1 or 2) of two "
            "consumer warpgroups"
        ]
    if tma_stored(d) and not tma_store_sub_n(d):
        return [
            f"store={v5(d, 'store')}: wgmma_n={k.wgmma_n} is not a multiple of a subtile's "
            "columns "
            f"({', '.join(map(str, TMA_STORE_SUB_N))})"
        ]
    if v5(d, "ring") and not tma_stored(d):
        # The counters are the TMA store's kernels' (cooperative and ping-pong, paired or
        # not).
        return ["ring=1: the TMA store's persistent kernels (store=4 or 5)"]
    if v5(d, "uniform") and not tma_stored(d):
        # Measured nowhere else yet: the TMA store's kernels, where the ring counter is.
        return ["uniform=1: the TMA store's persistent kernels (store=4 or 5)"]
    if v5(d, "rtma") and v5(d, "store") != 4:
        # R lands in a warpgroup's subtile buffers, whose issuer loads it.
        return ["rtma=1: the TMA store a warpgroup a subtile (store=4)"]
    if v5(d, "rtma") and _epilogue_or_none(d) not in RTMA_EPILOGUES:
        return [
            f"rtma=1: an epilogue that reads R ({', '.join(RTMA_EPILOGUES)}), not "
            f"{_epilogue_or_none(d)!r}"
        ]
    if v5(d, "streamk"):
        return _streamk_reasons(d)
    if v5(d, "store") == 3 and (
        k.persistent != 1 or k.cluster_m != 1 or k.warpgroups != 2 or k.m_blocks != 1
    ):
        # Each consumer warpgroup stores its one 64-row block through its 32 buffer rows.
        return [
            "store=3: the persistent cooperative kernel (persistent=1) of two consumer "
            "warpgroups of one 64-row block (m_blocks=1), unpaired (cluster_m=1)"
        ]
    return []


def _streamk_reasons(d: KernelDesign) -> list[str]:
    """Why ``streamk`` = 1 cannot go with these knobs: it is written for the persistent
    cooperative kernel storing by TMA a warpgroup a subtile, unpaired, and for epilogues
    applied at the store (the row scale's helper warps and R by TMA walk whole tiles)."""
    k = d.knobs
    if k.persistent != 1 or k.cluster_m != 1 or v5(d, "store") != 4:
        return [
            "streamk=1: the persistent cooperative kernel (persistent=1) storing by TMA "
            "(store=4), unpaired (cluster_m=1)"
        ]
    if v5(d, "rtma") or _epilogue_or_none(d) in ROW_SCALED:
        return ["streamk=1: not with R by TMA (rtma=1) or a row scale's helper warps"]
    if gated_tma(d) and k.wgmma_n > STREAMK_GATED_MAX_N:
        # measured (nvcc 13.0): 24 bytes spilled at 128 x 256, fp16 and bf16
        return [
            f"streamk=1: a gated activation at wgmma_n <= {STREAMK_GATED_MAX_N} (ptxas "
            f"spills the gated store beside the owner's loop at {k.wgmma_n})"
        ]
    return []


def workspace_per_cta(d: KernelDesign) -> int:
    """The workspace bytes a CTA of a stream-K design needs (``streamk`` = 1: its slot of
    BM x BN fp32 sums and its flag; 0 for every other design)."""
    if not v5(d, "streamk"):
        return 0
    bm, bn = tile_mn(d)
    return bm * bn * 4 + 4


# The C buffer leaves room for fewer ring stages (128x256: 3).
V5_STAGES = tuple(sorted({2, 3, 5, *STAGES}))


def space(arch: str, dtype: str, layout: str) -> list[KernelDesign]:
    """Every legal design of this family for (arch, dtype, layout), in a fixed order:
    the compute orientation, then the swapped one; then the persistent designs (two
    consumer warpgroups, tiles of at least 128 x 128, the large-M side); then the
    ping-pong ones (tiles of at least 64 x 128); then the multicast clusters; then v5's
    persistent cooperative designs (tiles of at least 128 x 128, compute orientation):
    each raster x ctas with the accumulator store, then with the bulk store; then the
    persistent multicast pairs (issue 22, ``_pair_designs``); then v5's tile N (128 x n
    tiles, n not a power of two, ``_tile_n_designs``); then v5 ping-pong's (the ping-pong
    kernel with the bulk store, ``_pingpong_v5_designs``); then v5 overlap's (two
    accumulator sets, ``_overlap_designs``); then v5 TMA store's (``tma_store_designs``);
    then v5 ping-pong narrow's (``pingpong_narrow_designs`` of 128 x 176); then v5 ring
    counter's (``ring_designs``). The trial designs are apart (``trial_space``). Not the
    pairs of 128 x n tiles
    (``pair_tile_n_designs``), v5 halves (``halves_designs``), the TMA store a warp
    (``tma_store_warp_designs``), the narrow ping-pong of 112 and 144 nor the pair storing
    by TMA (``pair_tma_designs``): measured and taken out."""
    if arch not in ARCHS or layout not in LAYOUTS:
        return []
    out = []
    for swap, ns in ((False, WGMMA_N), (True, SWAP_N)):
        for wgs, mp, n, st, sk in itertools.product(WARPGROUPS, M_BLOCKS, ns, STAGES, SPLIT_K):
            d = design(dtype, wgs, mp, swap, n, st, sk)
            if not check(d, sys.modules[__name__]):
                out.append(d)
    for swap, ns in ((False, WGMMA_N), (True, SWAP_N)):
        for mp, n, st in itertools.product(M_BLOCKS, ns, STAGES):
            d = design(dtype, 2, mp, swap, n, st, 1, pers=1)
            if min(tile_mn(d)) >= 128 and not check(d, sys.modules[__name__]):
                out.append(d)
    for swap, ns in ((False, PINGPONG_N), (True, SWAP_N)):
        for mp, n, st in itertools.product(M_BLOCKS, ns, STAGES):
            d = design(dtype, 2, mp, swap, n, st, 1, pers=2)
            bm, bn = tile_mn(d)
            if bm * bn >= 64 * 128 and not check(d, sys.modules[__name__]):
                out.append(d)
    for swap, ns in ((False, PINGPONG_N), (True, SWAP_N)):
        for wgs, mp, n, st in itertools.product(WARPGROUPS, M_BLOCKS, ns, STAGES):
            d = design(dtype, wgs, mp, swap, n, st, 1, cluster=2)
            if not check(d, sys.modules[__name__]):
                out.append(d)
    for store in STORE[:2]:  # store = 2, 3: their own widths (``_overlap_designs``, ...)
        stages = V5_STAGES if store else STAGES
        for mp, n, st, raster, ctas in itertools.product(M_BLOCKS, WGMMA_N, stages, RASTER, CTAS):
            if not (store or raster or ctas):
                continue  # today's persistent designs, above
            d = design(dtype, 2, mp, False, n, st, 1, pers=1, raster=raster, ctas=ctas, store=store)
            if min(tile_mn(d)) >= 128 and not check(d, sys.modules[__name__]):
                out.append(d)
    out += _pair_designs(dtype)
    out += _tile_n_designs(dtype)
    out += _pingpong_v5_designs(dtype)
    out += _overlap_designs(dtype)
    out += tma_store_designs(dtype)
    out += pingpong_narrow_designs(dtype, PINGPONG_NARROW_SPACE)
    out += ring_designs(dtype)
    return out


def trial_space(arch: str, dtype: str, layout: str) -> list[KernelDesign]:
    """The trial designs (``base.family_trial``: written, legal, not yet measured on a
    GPU; a build searches them only with ``[search] trial = true``), in a fixed order: v5
    uniform warpgroup index's (``uniform_designs``), then v5 ping-pong pair's
    (``pingpong_pair_designs``), then v5 tall TMA store's (256 x n,
    ``tall_tma_store_designs``), then those in pairs (``tall_pair_designs``), then v5
    stream-K's (``streamk_designs``). A sweep that measures them decides which move into
    ``space``."""
    if arch not in ARCHS or layout not in LAYOUTS:
        return []
    return (
        uniform_designs(dtype)
        + pingpong_pair_designs(dtype)
        + tall_tma_store_designs(dtype)
        + tall_pair_designs(dtype)
        + streamk_designs(dtype)
    )


def epilogue_trial(d: KernelDesign) -> list[KernelDesign]:
    """The trial variants of ``d``, a design with a fused epilogue
    (``base.family_epilogue_trial``): v5 R by TMA (``rtma`` = 1) where ``d`` stores by
    TMA a warpgroup a subtile and its epilogue reads R (``RTMA_EPILOGUES``); none
    otherwise."""
    if v5(d, "rtma") or v5(d, "store") != 4 or _epilogue_or_none(d) not in RTMA_EPILOGUES:
        return []
    t = with_knobs(d, rtma=1)
    return [] if check(t, sys.modules[__name__]) else [t]


def _fitting(make: Callable[[int], KernelDesign], most: int = 16) -> list[int]:
    """The ring depths 2 .. ``most``, in order, at which ``make(stages)`` is legal (fits
    shared memory, among the rest)."""
    return [st for st in range(2, most + 1) if not check(make(st), sys.modules[__name__])]


def pair_tile_n_stages(n: int, store: int, dtype: str = "fp16") -> int:
    """The deepest ring of a persistent 128 x ``n`` pair (with the bulk store's C buffer
    for ``store`` 1) that fits shared memory (144: 5 and 6 stages; 176: 4 and 5; 224: 3
    and 5)."""
    return max(
        _fitting(lambda st: design(dtype, 2, 1, False, n, st, 1, pers=1, cluster=2, store=store))
    )


def pair_tile_n_designs(dtype: str) -> list[KernelDesign]:
    """v5 pair tile N (issue 22; in the space at 8bed9bd, measured, taken out): for each
    n of ``PAIR_TILE_N`` the persistent pair at its deepest ring with the bulk store and
    with the accumulator store, each raster 0 / 8 x ctas 0 / 128 (5 x 2 x 4 = 40 per
    dtype); then the unpaired bulk-store twins of ``PAIR_TILE_N_CONTROLS`` as
    ``_tile_n_designs`` makes them (2 x 2 x 6 = 24)."""
    out = []
    for n, store, raster, ctas in itertools.product(PAIR_TILE_N, (1, 0), RASTER[:2], CTAS):
        st = pair_tile_n_stages(n, store, dtype)
        d = design(
            dtype, 2, 1, False, n, st, 1, pers=1, cluster=2, raster=raster, ctas=ctas,
            store=store,
        )  # fmt: skip
        if not check(d, sys.modules[__name__]):
            out.append(d)
    return out + _tile_n_designs(dtype, PAIR_TILE_N_CONTROLS)


def pingpong_v5_stages(mp: int, n: int, dtype: str = "fp16", store: int = 1) -> tuple[int, ...]:
    """The ring depths of a ping-pong design of 64 ``mp`` x ``n`` tiles with ``store`` in
    the space: the ``TILE_N_DEPTHS`` deepest that fit shared memory beside its C buffers
    (the bulk store's two halves: 128x128: 3, 4; 128x160: 2, 3; 64x256: 2, 3; 128x80: 5,
    6; 64x192: 4, 5; 64x224: 3, 4)."""
    fits = _fitting(
        lambda st: design(dtype, 2, mp, False, n, st, 1, pers=2, store=store),
        PINGPONG_MAX_STAGES,
    )
    return tuple(fits[-TILE_N_DEPTHS:])


def _pingpong_v5_designs(
    dtype: str, store: int = 1, tiles: tuple[tuple[int, int], ...] = PINGPONG_V5_TILES
) -> list[KernelDesign]:
    """v5 ping-pong (issue 22): the ping-pong designs with ``store`` (the bulk store: each
    consumer warpgroup through its own C buffer half) for each tile (m_blocks, n) of
    ``tiles``, at its two deepest rings, each raster x ctas: 6 x 2 x 6 = 72 per dtype of
    ``PINGPONG_V5_TILES``."""
    out = []
    for mp, n in tiles:
        stages = pingpong_v5_stages(mp, n, dtype, store)
        for st, raster, ctas in itertools.product(stages, RASTER, CTAS):
            d = design(dtype, 2, mp, False, n, st, 1, pers=2, raster=raster, ctas=ctas, store=store)
            if not check(d, sys.modules[__name__]):
                out.append(d)
    return out


def _deepest(n: int, dtype: str, store: int, cluster: int = 1) -> tuple[int, ...]:
    """The ``TILE_N_DEPTHS`` deepest rings at which a persistent cooperative 128 x ``n``
    design with ``store`` (in clusters of ``cluster`` along M) fits."""
    fits = _fitting(
        lambda st: design(dtype, 2, 1, False, n, st, 1, pers=1, cluster=cluster, store=store)
    )
    return tuple(fits[-TILE_N_DEPTHS:])


def _with_store(
    dtype: str,
    widths: tuple[int, ...],
    stages: Callable[[int, str], tuple[int, ...]],
    store: int,
    cluster: int = 1,
) -> list[KernelDesign]:
    """The legal persistent cooperative 128 x n designs with ``store`` (in clusters of
    ``cluster`` along M), for each n of ``widths`` at each ring of ``stages(n, dtype)``,
    each raster x ctas."""
    out = []
    for n in widths:
        for st, raster, ctas in itertools.product(stages(n, dtype), RASTER, CTAS):
            d = design(
                dtype, 2, 1, False, n, st, 1, pers=1, cluster=cluster, raster=raster, ctas=ctas,
                store=store,
            )  # fmt: skip
            if not check(d, sys.modules[__name__]):
                out.append(d)
    return out


def tile_n_stages(n: int, dtype: str = "fp16") -> tuple[int, ...]:
    """The ring depths of a 128 x ``n`` bulk-store design in the space: the
    ``TILE_N_DEPTHS`` deepest that fit shared memory beside the C buffer (80: 7, 6; 160:
    5, 4; 192: 4, 3; 224: 3, 2)."""
    return _deepest(n, dtype, 1)


def _tile_n_designs(dtype: str, widths: tuple[int, ...] = TILE_N) -> list[KernelDesign]:
    """v5 tile N (issue 22): the persistent cooperative 128 x n designs with the bulk
    store for each n of ``widths`` (``TILE_N``), at its two deepest rings, each raster x
    ctas (as v5's bulk-store designs): 4 x 2 x 6 = 48 per dtype."""
    return _with_store(dtype, widths, tile_n_stages, 1)


def _overlap_designs(dtype: str) -> list[KernelDesign]:
    """v5 overlap (issue 22): the persistent cooperative 128 x n designs whose epilogue
    runs under the next tile's first k tile (``store`` = 2), for each n of
    ``OVERLAP_TILE_N`` at the two rings of its bulk-store twin, each raster x ctas:
    3 x 2 x 6 = 36 per dtype."""
    return _with_store(dtype, OVERLAP_TILE_N, tile_n_stages, 2)


def halves_stages(n: int, dtype: str = "fp16") -> tuple[int, ...]:
    """The ring depths of a 128 x ``n`` v5 halves design: the ``TILE_N_DEPTHS`` deepest
    beside the half C buffer (192: 4, 5; 224: 3, 4; 256: 3, 4)."""
    return _deepest(n, dtype, 3)


def tma_store_stages(n: int, dtype: str = "fp16") -> tuple[int, ...]:
    """The ring depths of a persistent cooperative 128 x ``n`` TMA-store design: the
    ``TILE_N_DEPTHS`` deepest beside its subtile buffers (80: 7, 8; 128: 5, 6; 160: 4, 5;
    192: 3, 4; 224: 3, 4; 256: 3, 4)."""
    return _deepest(n, dtype, 4)


def tma_store_designs(dtype: str) -> list[KernelDesign]:
    """v5 TMA store (issue 22): the persistent cooperative 128 x n designs for each n of
    ``TMA_STORE_TILE_N`` and the ping-pong ones of ``PINGPONG_V5_TILES``, each at
    its two deepest rings, each raster x ctas, storing through subtiles by TMA
    (``store`` = 4): (6 + 6) x 2 x 6 = 144 per dtype."""
    return _with_store(dtype, TMA_STORE_TILE_N, tma_store_stages, 4) + _pingpong_v5_designs(
        dtype, 4
    )


def pingpong_narrow_designs(
    dtype: str, widths: tuple[int, ...] = PINGPONG_NARROW_N
) -> list[KernelDesign]:
    """v5 ping-pong narrow (issue 22): the ping-pong TMA-store designs of 128 x n tiles,
    n of ``widths`` (cuBLASLt's, ``PINGPONG_NARROW_N``), each at its two deepest rings,
    each raster x ctas: 2 x 6 = 12 per width and dtype (the space: 176's)."""
    return _pingpong_v5_designs(dtype, 4, tuple((2, n) for n in widths))


def ring_designs(dtype: str) -> list[KernelDesign]:
    """v5 ring counter (issue 22): each TMA-store design of the space (``store`` = 4:
    ``tma_store_designs`` and the narrow ping-pong's) whose ring is not a power of two,
    with ``ring`` = 1."""
    return [with_ring(d) for d in _stored(dtype) if not _pow2(d.knobs.stages)]


def with_knobs(d: KernelDesign, **knobs: int) -> KernelDesign:
    """``d`` with ``knobs`` changed (an optional knob set to its default is left out)."""
    return make(FAMILY, d.arch, d.dtype, d.layout, OPTIONAL_KNOBS, **{**d.knobs.as_json(), **knobs})


def with_ring(d: KernelDesign, **knobs: int) -> KernelDesign:
    """``d`` with its ring's slot and phase kept as counters (``ring`` = 1), and any
    other ``knobs`` changed."""
    return with_knobs(d, **{"ring": 1, **knobs})


def _pow2(stages: int) -> bool:
    return not stages & (stages - 1)


def _counted(d: KernelDesign, **knobs: int) -> KernelDesign:
    """``d`` with ``knobs`` changed, and the ring counter where its ring is not a power
    of two (where the counter gained: ``ring_designs``)."""
    return with_ring(d, **{"ring": int(not _pow2(d.knobs.stages)), **knobs})


def _stored(dtype: str) -> list[KernelDesign]:
    """The TMA-store designs of the space without the later knobs: ``tma_store_designs``
    and the narrow ping-pong's."""
    return tma_store_designs(dtype) + pingpong_narrow_designs(dtype, PINGPONG_NARROW_SPACE)


def uniform_designs(dtype: str) -> list[KernelDesign]:
    """v5 uniform warpgroup index (issue 22): each TMA-store design of the space
    (``_stored``: 156 per dtype), with the ring counter where its ring is not a power of
    two, and ``uniform`` = 1."""
    return [_counted(d, uniform=1) for d in _stored(dtype)]


def streamk_designs(dtype: str) -> list[KernelDesign]:
    """v5 stream-K (issue 22): each cooperative TMA-store design of the space with the
    grouped walk of 8 and no CTA cap (a CTA per SM: stream-K's point is the four SMs the
    cap leaves idle), the ring counter where its ring is not a power of two, the uniform
    warpgroup index, and ``streamk`` = 1: 5 widths x 2 rings = 10 per dtype (not 224:
    with the owner's loop over the pieces, ptxas spills 24 bytes of it at 168 registers)."""
    return [
        _counted(d, uniform=1, streamk=1)
        for d in _with_store(dtype, STREAMK_TILE_N, tma_store_stages, 4)
        if v5(d, "raster") == 8 and not v5(d, "ctas")
    ]


def tall_tma_store_designs(dtype: str) -> list[KernelDesign]:
    """v5 tall TMA store (issue 22): the persistent cooperative 256 x n TMA-store designs,
    n of ``TALL_TMA_STORE_N``, at their two deepest rings, each raster x ctas, with the
    ring counter where the ring is not a power of two and ``uniform`` = 1: 4 x 2 x 6 = 48
    per dtype."""
    out = []
    for n in TALL_TMA_STORE_N:
        fits = _fitting(lambda st, n=n: design(dtype, 2, 2, False, n, st, 1, pers=1, store=4))
        for st, raster, ctas in itertools.product(fits[-TILE_N_DEPTHS:], RASTER, CTAS):
            d = design(dtype, 2, 2, False, n, st, 1, pers=1, raster=raster, ctas=ctas, store=4)
            d = _counted(d, uniform=1)
            if not check(d, sys.modules[__name__]):
                out.append(d)
    return out


def tall_pair_designs(dtype: str) -> list[KernelDesign]:
    """v5 tall pair (issue 22): each tall TMA-store design (``tall_tma_store_designs``) in
    a multicast pair along M (``cluster_m`` = 2, on the same ring), each CTA loading its
    256 rows of A and n / 2 rows of B and multicasting those to both: torch's kernel at
    8192³ and 4096×28672 in this orientation (a 1x2 cluster of 128 x 320 tiles, the two
    consumer warpgroups splitting N) moves the same operand bytes a k tile per output.
    4 x 2 x 6 = 48 per dtype."""
    out = []
    for d in tall_tma_store_designs(dtype):
        p = _counted(d, cluster_m=2)
        if not check(p, sys.modules[__name__]):
            out.append(p)
    return out


def pingpong_pair_designs(dtype: str) -> list[KernelDesign]:
    """v5 ping-pong pair (issue 22): the TMA-store designs of the space (``_stored``) in
    multicast pairs along M (``cluster_m`` = 2, on their unpaired rings), as
    ``uniform_designs`` has them (the ring counter where the ring is not a power of two,
    ``uniform`` = 1): every ping-pong design (7 tiles x 2 rings x 6 = 84 per dtype), and
    the cooperative ones whose ring is not a power of two, now with the counter
    (``pair_tma_designs`` measured the rest, dividing by shifts, behind their unpaired
    twins): 126 per dtype."""
    out = []
    for d in _stored(dtype):
        if pingpong(d) or not _pow2(d.knobs.stages):
            p = _counted(d, cluster_m=2, uniform=1)
            if not check(p, sys.modules[__name__]):
                out.append(p)
    return out


def pair_tma_designs(dtype: str) -> list[KernelDesign]:
    """v5 pair TMA store (issue 22): the persistent cooperative pair of 128 x n tiles, n
    of ``TMA_STORE_TILE_N``, storing by TMA (``store`` = 4), at its two deepest rings,
    each raster x ctas: 6 x 2 x 6 = 72 per dtype."""
    return _with_store(
        dtype, TMA_STORE_TILE_N, lambda n, dt: _deepest(n, dt, 4, cluster=2), 4, cluster=2
    )


def tma_store_warp_designs(dtype: str) -> list[KernelDesign]:
    """v5 TMA store a warp (issue 22, ``store`` = 5): each TMA-store tile (cooperative and
    ping-pong) at its deepest ring with the grouped walk of 8 and the 128-CTA cap, each
    warp storing its own 16 rows of a subtile (a box [SUB_N, 16], ``__syncwarp`` in place
    of the warpgroup's two barriers): 12 per dtype. Measured on an H200 (docs/kernels.md,
    "sm90tma v5 TMA store"): 1.000 of the warpgroup's store over 204 pairs, so these
    designs are not in the space."""
    deepest = [(1, 1, n, _deepest(n, dtype, 5)[-1]) for n in TMA_STORE_TILE_N]
    deepest += [(2, mp, n, pingpong_v5_stages(mp, n, dtype, 5)[-1]) for mp, n in PINGPONG_V5_TILES]
    return [
        design(dtype, 2, mp, False, n, st, 1, pers=pers, raster=8, ctas=128, store=5)
        for pers, mp, n, st in deepest
    ]


def halves_designs(dtype: str) -> list[KernelDesign]:
    """v5 halves (issue 22; measured, not in the space): the persistent cooperative
    128 x n designs storing through a C buffer of half the rows (``store`` = 3), for each
    n of ``HALVES_TILE_N`` at its two deepest rings, each raster x ctas: 3 x 2 x 6 = 36
    per dtype."""
    return _with_store(dtype, HALVES_TILE_N, halves_stages, 3)


def _pair_designs(dtype: str) -> list[KernelDesign]:
    """Issue 22's multicast pairs inside the persistent cooperative kernel (tiles of at
    least 128 x 128, compute orientation): each stage count, raster and ctas with the
    accumulator store, then with the bulk store."""
    out = []
    for store in STORE[:2]:  # stores 2 and 3 do not pair
        stages = V5_STAGES if store else STAGES
        for mp, n, st, raster, ctas in itertools.product(M_BLOCKS, WGMMA_N, stages, RASTER, CTAS):
            d = design(
                dtype, 2, mp, False, n, st, 1, pers=1, cluster=2, raster=raster, ctas=ctas,
                store=store,
            )  # fmt: skip
            if min(tile_mn(d)) >= 128 and not check(d, sys.modules[__name__]):
                out.append(d)
    return out


def ctas_per_sm(d: KernelDesign) -> int:
    """CTAs that fit one SM (registers as compiled, shared memory): a persistent
    grid's slots per SM."""
    limit = mma_sync.LIMITS.max_smem_bytes
    return max(1, min(min_blocks(d), (limit + 1024) // (smem_bytes(d) + 1024)))


def launch_recipe(d: KernelDesign) -> dict[str, Any]:
    """ABI gemm_v2: gemm_v1's parameters then two tensor maps (A, then B), each a
    [rows, K] K-major matrix read in boxes of ``tma[x]`` = [64 k, rows]."""
    p, q = mma_rows(d)
    bm, bn = tile_mn(d)
    k = d.knobs
    a_rows, b_rows = (q, p) if swapped(d) else (p, q)
    recipe = gemm_v1_recipe(bm, bn, threads(d), smem_bytes(d), {"k": 8}, k.split_k, k.cluster_m)
    recipe["abi"] = "gemm_v2"
    recipe["tma"] = {"a": [BK, a_rows], "b": [BK, b_rows // k.cluster_m]}
    if tma_stored(d):  # the TMA store's map of C [M, N]: [columns, rows]
        rows = TMA_STORE_WARP_ROWS if v5(d, "store") == 5 else TMA_STORE_ROWS
        recipe["tma"]["c"] = [tma_store_sub_n(d), rows]
        # C's row stride a multiple of 16 bytes (the runtime's C has ldc = N)
        recipe["align"] = {**recipe["align"], "n": 8}
        if gated_tma(d):  # ... of the gated output [M, N / 2]: half the columns a box
            recipe["tma"]["c"] = [tma_store_sub_n(d) // 2, rows]
            recipe["align"] = {**recipe["align"], "n": 16}
        if v5(d, "rtma"):  # R's map [M, N] (row stride ldr), after C's: C's box
            recipe["tma"]["r"] = list(recipe["tma"]["c"])
    if k.persistent and k.cluster_m > 1:
        # The persistent pair's grid is 1-D: clusters of two CTAs along x (the runtime
        # launches whole clusters, driver.gemm_grid and the native launcher's plan).
        recipe["cluster"] = [k.cluster_m, 1, 1]
    if k.persistent:
        recipe.update(persistent=k.persistent, ctas_per_sm=ctas_per_sm(d))
        if v5(d, "ctas"):  # absent: one CTA per SM slot (every earlier recipe)
            recipe["max_ctas"] = v5(d, "ctas")
        if v5(d, "streamk"):  # a CTA per slot even past the tiles, and their workspace
            recipe.update(streamk=1, workspace_per_cta=workspace_per_cta(d))
    return epilogue_recipe(recipe, d)


def template_context(d: KernelDesign) -> dict[str, Any]:
    ctx = mma_sync.context(tile(d), d.dtype, d.layout)
    p, q = mma_rows(d)
    k = d.knobs
    nacc = q // 2
    ctx.update(
        wgs=k.warpgroups,
        mp=k.m_blocks,
        swap="true" if swapped(d) else "false",
        p_rows=p,
        q_rows=q,
        split_k=k.split_k,
        min_blocks=min_blocks(d),
        producer_regs=consumer_regs(d)[0],
        consumer_regs=consumer_regs(d)[1],
        nacc=nacc,
        acc_list=", ".join(f"%{i}" for i in range(nacc)),
        acc_constraints=", ".join(f'"+f"(d[{i}])' for i in range(nacc)),
    )
    ctx.update(
        tags.sm90_tma(
            k.split_k, k.cluster_m, k.persistent, pingpong=pingpong(d), setmaxnreg=k.warpgroups > 1
        )
    )
    pair = k.persistent in (1, 2) and k.cluster_m > 1
    ctx.update(
        tags.tma_v5(v5(d, "raster"), v5(d, "store"), pair=pair, gated=gated_tma(d)),
        ring=tags.TMA_RING[v5(d, "ring")],
        wg_index=tags.TMA_WG_INDEX[v5(d, "uniform")],
        c_pad=C_PAD,
        c_tma_offset=TMA_STORE_OFFSET,
        c_sub_n=tma_store_sub_n(d),
        rtma=tags.TMA_RTMA[v5(d, "rtma")],
        streamk=tags.TMA_STREAMK[v5(d, "streamk")],
        rtma_bar_offset=BARRIER_BYTES,  # after the ring's barriers, before the buffers
        rtma_buf_bytes=TMA_STORE_ROWS * tma_store_sub_n(d) * 2,
    )
    if v5(d, "streamk"):  # the consumers walk the stream-K units
        ctx["schedule"] = {**ctx["schedule"], "tile_loop": ctx["streamk"]["tile_loop"]}
    # The persistent kernel prefetches its first tile's weight rows (PDL designs).
    kernel = "sm90tma_persistent" if k.persistent else FAMILY
    if pair:  # ... of its first pair tile
        kernel = "sm90tma_persistent_pair"
    if v5(d, "raster"):  # ... of the grouped walk's first tile
        kernel += "_grouped"
    ctx.update(pdl=tags.pdl(kernel, d.layout, pdl_trigger(d)))
    # the row scale parks its sums after the barriers' bytes; its helper warps release
    # ring slots too
    rtma = bool(v5(d, "rtma"))
    rows = persistent_rows(d)
    epi = tags.tma_epilogue(epilogue(d), d.dtype, rtma, fast_act=gated_tma(d), persistent_rows=rows)
    ctx.update(epilogue=epi, barrier_bytes=BARRIER_BYTES)
    if epilogue(d) in ROW_SCALED:
        ctx["pair"] = {**ctx["pair"], **tags.TMA_ROWSQ_PAIR[k.cluster_m]}
    if rows:  # the scales after the TMA store's buffers; the helper warps release slots
        ctx.update(
            rs_offset=BARRIER_BYTES + c_buffer_bytes(d),
            rs_bar_offset=BARRIER_BYTES + RS_BAR_AFTER,
        )
        empty_init = tags.TMA_ROWSQ_PAIR[1]["empty_init"]
        ctx["schedule"] = {**ctx["schedule"], "empty_init": empty_init}
    return ctx


def features(d: KernelDesign) -> Features:
    t = tile(d)
    k = d.knobs
    return Features(
        bm=t.bm, bn=t.bn, bk=t.bk, threads=threads(d), warps=t.warps,
        regs=min(255, acc_regs(d) + 40), smem_bytes=smem_bytes(d), split_k=k.split_k,
        cluster_m=k.cluster_m, prefetch_tiles=k.stages, fill_stages=k.stages,
        wgmma=True, pingpong=pingpong(d), store_overlap=bool(v5(d, "store")),
    )  # fmt: skip
