"""Every choice a template needs, made in Python: tag tables and partial names.

Templates only substitute (as CUTLASS's ``cutlass_library`` does): a knob value or a
small enum maps to its C++ spelling through a table here, and a block of lines that
only some designs have is a partial (a file under ``templates/``) whose name is picked
here, ``NONE`` where a design has no such block. A family's ``template_context(d)``
merges in what its template needs. Functions take knob values and what a family
derives (ping-pong, register reallocation) as arguments: this module imports no
family, so the two never import each other.

The rendered source is part of the artifact key that recorded measurements name: a
change here or in a template that alters any design's text (a comment included) makes
its measurements stale (tests/generator/test_templates.py pins a design per choice).
"""

from __future__ import annotations

from typing import Any

from cudal2.records import ROPE_KV, ROW_SCALED

NONE = "none.cu.j2"  # the empty partial: the design has no such block

# The cluster a kernel is compiled for: none; the split_k CTAs of one output tile
# along grid z (sm90direct, sm90stream, sm90tma); or a pair of CTAs on adjacent M
# tiles sharing a multicast B tile (sm90tma, cluster_m = 2).
CLUSTER_DIMS = {
    "none": "",
    "split_k": "__cluster_dims__(1, 1, SPLIT_K) ",
    "pair_m": "__cluster_dims__(1, 2, 1) ",
    # the persistent kernel's pair (issue 22): a 1-D grid, the two CTAs adjacent along x
    "pair_m_persistent": "__cluster_dims__(2, 1, 1) ",
}
COOPERATIVE_GROUPS_INCLUDE = {
    "none": "",
    "split_k": "#include <cooperative_groups.h>\n",
    "pair_m": "#include <cooperative_groups.h>\n",
    "pair_m_persistent": "",
}
# The header comment's grid line says when the split is a compile-time cluster.
CLUSTER_NOTE = {
    "none": "",
    "split_k": ", cluster (1, 1, SPLIT_K) fixed at compile time",
    "pair_m": "",
    "pair_m_persistent": "",
}

# Split-K: how a rank reaches rank {1}'s copy of shared-memory address {0} (through
# distributed shared memory in a cluster, its own copy without one), and the barriers
# around the reduction, keyed by split_k > 1.
RANK_SMEM = {True: "cluster.map_shared_rank({0}, {1})", False: "{0}"}
# The same before the split-K barrier has named the cluster (sm90tma's row-scale warps).
RANK_SMEM_EARLY = {
    True: "cooperative_groups::this_cluster().map_shared_rank({0}, {1})",
    False: "{0}",
}
SPLITK_WAIT = {True: "splitk/wait_cluster.cu.j2", False: "splitk/wait_cta.cu.j2"}
SPLITK_RELEASE = {True: "splitk/release_cluster.cu.j2", False: NONE}
# Each family's part of the epilogue: what a rank parked (for the wait's comment) and
# how one four-column group is summed over the ranks (sm90tma sums inline).
SPLITK_FAMILY = {
    "sm90direct": {"parked": "partial tiles are", "rank_sum": "sm90_direct/rank_sum.cu.j2"},
    "sm90stream": {"parked": "partial tile is", "rank_sum": "sm90_stream/rank_sum.cu.j2"},
    "sm90tma": {"parked": "tile is", "rank_sum": NONE},
}

# sm90direct: activations staged once per CTA through shared memory (stages 3,
# ``x_smem``), or read by every warp from L1 (stages 2), keyed by x_smem.
DIRECT_ACTIVATIONS = {
    True: {
        "x_smem_constants": "sm90_direct/x_smem/constants.cu.j2",
        "x_smem_helpers": "sm90_direct/x_smem/helpers.cu.j2",
        "mainloop": "sm90_direct/x_smem/mainloop.cu.j2",
    },
    False: {
        "x_smem_constants": NONE,
        "x_smem_helpers": NONE,
        "mainloop": "sm90_direct/mainloop.cu.j2",
    },
}

# sm90tma: the kernel by ``persistent`` (0: one tile per CTA; 1 cooperative and 2
# ping-pong: a CTA per SM slot walks the tiles).
TMA_KERNEL = {
    0: "sm90_tma/kernel.cu.j2",
    1: "sm90_tma/persistent_kernel.cu.j2",
    2: "sm90_tma/persistent_kernel.cu.j2",
}
# sm90tma, ``setmaxnreg``: with two consumer warpgroups the producer warpgroup gives
# registers to the consumers.
TMA_SETMAXNREG = {
    True: {
        "producer": "sm90_tma/setmaxnreg/producer.cu.j2",
        "consumer": "sm90_tma/setmaxnreg/consumer.cu.j2",
    },
    False: {"producer": NONE, "consumer": NONE},
}
# sm90tma, ``pair``: the blocks of the one-tile kernel that differ for a multicast pair
# of CTAs (cluster_m = 2), by cluster_m.
TMA_PAIR = {
    1: {
        "helpers": NONE,
        "raster": "grid/raster.cu.j2",
        "empty_init": "sm90_tma/unicast/empty_init.cu.j2",
        "init_sync": "sm90_tma/unicast/init_sync.cu.j2",
        "producer_loop": "sm90_tma/unicast/producer_loop.cu.j2",
        "release_slot": "sm90_tma/unicast/release_slot.cu.j2",
        "exit_sync": NONE,
    },
    2: {
        "helpers": "sm90_tma/multicast/helpers.cu.j2",
        "raster": "sm90_tma/multicast/raster.cu.j2",
        "empty_init": "sm90_tma/multicast/empty_init.cu.j2",
        "init_sync": "sm90_tma/multicast/init_sync.cu.j2",
        "producer_loop": "sm90_tma/multicast/producer_loop.cu.j2",
        "release_slot": "sm90_tma/multicast/release_slot.cu.j2",
        "exit_sync": "sm90_tma/multicast/exit_sync.cu.j2",
    },
}
# sm90tma, ``schedule``: cooperative (the consumer warpgroups split each tile's P side:
# every non-persistent design, and persistent = 1) or ping-pong (persistent = 2: each
# warpgroup computes whole tiles, the two taking turns on the ring). wg_p_block and
# wg_p_offset spell where a warpgroup's 64-row blocks start on the P side; for v5's bulk
# store (issue 22), c_half, store_sync and the store_row pair spell whose C buffer, which
# barrier and which rows: the consumers' one buffer, barrier 1 over both warpgroups and
# every consumer thread's rows (cooperative), or each warpgroup its own buffer half,
# barrier 1 + wg over its 128 threads and rows (ping-pong: no barrier across the two
# beyond their turns).
TMA_SCHEDULE = {
    "cooperative": {
        "rows_assert": "sm90_tma/cooperative/rows_assert.cu.j2",
        "about": NONE,
        "turn_barriers": NONE,
        "empty_init": "sm90_tma/cooperative/empty_init.cu.j2",
        "turn_init": NONE,
        "tile_loop": "sm90_tma/cooperative/tile_loop.cu.j2",
        "pass_turn": NONE,
        "skip_tile": NONE,
        "wg_p_block": "(wg * MP + j)",
        "wg_p_offset": " + wg * MP * 64 * BK",
        "c_half": NONE,
        "store_sync": "sm90_tma/cooperative/store_sync.cu.j2",
        "store_row0": "tid",
        "store_row_step": "128 * WGS",
    },
    "pingpong": {
        "rows_assert": "sm90_tma/pingpong/rows_assert.cu.j2",
        "about": "sm90_tma/pingpong/about.cu.j2",
        "turn_barriers": "sm90_tma/pingpong/turn_barriers.cu.j2",
        "empty_init": "sm90_tma/pingpong/empty_init.cu.j2",
        "turn_init": "sm90_tma/pingpong/turn_init.cu.j2",
        "tile_loop": "sm90_tma/pingpong/tile_loop.cu.j2",
        "pass_turn": "sm90_tma/pingpong/pass_turn.cu.j2",
        "skip_tile": "sm90_tma/pingpong/skip_tile.cu.j2",
        "wg_p_block": "j",
        "wg_p_offset": "",
        "c_half": "sm90_tma/pingpong/c_half.cu.j2",
        "store_sync": "sm90_tma/pingpong/store_sync.cu.j2",
        "store_row0": "(tid & 127)",
        "store_row_step": "128",
    },
}


def cluster(split_k: int, cluster_m: int = 1) -> str:
    """The design's cluster: ``none``, ``split_k`` or ``pair_m`` (legality never
    allows a split and a pair together)."""
    if split_k > 1 and cluster_m > 1:
        raise ValueError(f"split_k={split_k} and cluster_m={cluster_m}: not both")
    if split_k > 1:
        return "split_k"
    return "pair_m" if cluster_m > 1 else "none"


def cluster_tags(split_k: int, cluster_m: int = 1) -> dict[str, str]:
    """The cluster's spellings: ``__cluster_dims__``, the include, the header note."""
    c = cluster(split_k, cluster_m)
    return {
        "cluster_dims": CLUSTER_DIMS[c],
        "cg_include": COOPERATIVE_GROUPS_INCLUDE[c],
        "cluster_note": CLUSTER_NOTE[c],
    }


def splitk_tags(family: str, split_k: int) -> dict[str, str]:
    """The split-K reduce-and-store epilogue (``templates/splitk/``): the barriers
    around it, how a rank reaches other ranks' shared memory, and the family's part."""
    split = split_k > 1
    return {
        "splitk_wait": SPLITK_WAIT[split],
        "splitk_release": SPLITK_RELEASE[split],
        "rank_smem": RANK_SMEM[split],
        "rank_smem_early": RANK_SMEM_EARLY[split],
        **SPLITK_FAMILY[family],
    }


# sm90direct's 16-byte loads, keyed by "a fused PDL design": non-coherent (``.nc``, the
# read-only path) as always, or coherent. ptxas treats a .nc load as invariant and may
# hoist it above griddepcontrol.wait: in fused PDL designs (stages 2, the row scale) it
# moved the first step's weight and activation loads above the wait (SASS, nvcc 13.0;
# tests/generator/test_epilogue_splitk.py), where A may still be being written. A
# coherent load stays after the wait. Plain and plain-PDL designs keep ``.nc`` (their
# source, and so their recorded measurements, unchanged; their SASS passes the check).
DIRECT_LDG_NC = {False: ".nc", True: ""}


def sm90_direct(split_k: int, x_smem: bool, fused_pdl: bool = False) -> dict[str, Any]:
    """sm90direct: activations through shared memory (``x_smem``) or from L1; coherent
    loads in a fused PDL design (``DIRECT_LDG_NC``)."""
    return {
        **cluster_tags(split_k),
        **splitk_tags("sm90direct", split_k),
        **DIRECT_ACTIVATIONS[x_smem],
        "ldg_nc": DIRECT_LDG_NC[fused_pdl],
    }


def sm90_stream(split_k: int) -> dict[str, Any]:
    """sm90stream: only the cluster and the split-K epilogue vary."""
    return {**cluster_tags(split_k), **splitk_tags("sm90stream", split_k)}


# sm90tma, ``ppair``: the blocks of the persistent kernel that differ for a multicast
# pair (issue 22, cluster_m = 2 with persistent = 1 or 2), by cluster_m: the walk's first
# tile, tile count and step (spelled in the kernel's variables), the loads, the slot
# releases and the cluster barriers. The 1 row renders the persistent kernel byte for
# byte as before the pair existed.
_PP = "sm90_tma/persistent_pair/"
_PU = "sm90_tma/persistent_unicast/"
TMA_PERSISTENT_PAIR = {
    1: {
        "about": NONE,
        "walk": NONE,
        "init_sync": NONE,
        "exit_sync": NONE,
        "first": "blockIdx.x",
        "count": "tiles",
        "step": "gridDim.x",
        "loads": _PU + "loads.cu.j2",
        "release": _PU + "release.cu.j2",
        "release_last": _PU + "release_last.cu.j2",
    },
    2: {
        "about": _PP + "about.cu.j2",
        "walk": _PP + "walk.cu.j2",
        "init_sync": _PP + "init_sync.cu.j2",
        "exit_sync": _PP + "exit_sync.cu.j2",
        "first": "(blockIdx.x >> 1)",
        "count": "pair_tiles",
        "step": "(gridDim.x >> 1)",
        "loads": _PP + "loads.cu.j2",
        "release": _PP + "release.cu.j2",
        "release_last": _PP + "release_last.cu.j2",
    },
}


# The persistent pair's "empty" barriers, by schedule: every consumer warp of both CTAs
# (cooperative), or the four warps of the consuming warpgroup in both (ping-pong: the
# same warpgroup of each CTA takes the same tiles of the pair's walk).
TMA_PAIR_EMPTY_INIT = {
    "cooperative": TMA_PAIR[2]["empty_init"],
    "pingpong": "sm90_tma/pingpong/empty_init_pair.cu.j2",
}


def sm90_tma(
    split_k: int, cluster_m: int, persistent: int, pingpong: bool, setmaxnreg: bool
) -> dict[str, Any]:
    """sm90tma: the kernel (one tile per CTA, or persistent), its ``schedule``, the
    multicast ``pair`` (the one-tile kernel's; ``ppair`` the persistent kernel's) and the
    register reallocation (``setmaxnreg``)."""
    pair_persistent = persistent in (1, 2) and cluster_m > 1
    name = "pingpong" if pingpong else "cooperative"
    schedule = TMA_SCHEDULE[name]
    if pair_persistent:  # a slot's empty barrier counts its consumers' warps in both CTAs
        schedule = {**schedule, "empty_init": TMA_PAIR_EMPTY_INIT[name]}
    return {
        **cluster_tags(split_k, cluster_m),
        **(
            {"cluster_dims": CLUSTER_DIMS["pair_m_persistent"], "cg_include": ""}
            if pair_persistent
            else {}
        ),
        **splitk_tags("sm90tma", split_k),
        "kernel": TMA_KERNEL[persistent],
        "schedule": schedule,
        "pair": TMA_PAIR[cluster_m],
        "ppair": TMA_PERSISTENT_PAIR[cluster_m if persistent else 1],
        "setmaxnreg": TMA_SETMAXNREG[setmaxnreg],
    }


# sm90tma v5 (issue 22), the persistent cooperative kernel: its walk over the tiles
# (``raster``: 0 the M-fastest walk as it was, G > 0 groups of G M tiles; the tile's
# first row and column spelled in the kernel's variables) and its store (``store``: 0
# from the accumulators as it was, 1 through the C buffer and bulk copies; ``drain``
# after the tile loop). The 0 rows render the kernel byte for byte as before the knobs.
TMA_RASTER = {
    "m_fastest": {
        "helpers": NONE,
        "m0": "(tile % tiles_m) * BM",
        "n0": "(tile / tiles_m) * BN",
    },
    "grouped": {
        "helpers": "sm90_tma/raster/grouped.cu.j2",
        "m0": "raster_m(tile, tiles_m, tiles) * BM",
        "n0": "raster_n(tile, tiles_m, tiles) * BN",
    },
    # The multicast pair (issue 22) walks pair tiles: pair row r holds M tiles 2r and
    # 2r + 1 (the CTA's: 2r + crank); a grouped walk groups G / 2 pair rows.
    "m_fastest_pair": {
        "helpers": NONE,
        "m0": "(2 * (tile % pairs_m) + crank) * BM",
        "n0": "(tile / pairs_m) * BN",
    },
    "grouped_pair": {
        "helpers": "sm90_tma/raster/grouped.cu.j2",
        "m0": "(2 * raster_m(tile, pairs_m, pair_tiles) + crank) * BM",
        "n0": "raster_n(tile, pairs_m, pair_tiles) * BN",
    },
}
# ``params``: what the store adds to the kernel's parameters after tmB (the TMA store's
# tensor map of C; the runtime encodes it from the recipe's ``tma.c`` box).
TMA_STORE = {
    0: {"tile": "sm90_tma/store/direct.cu.j2", "drain": NONE, "params": ""},
    1: {"tile": "sm90_tma/store/bulk.cu.j2", "drain": "sm90_tma/store/drain.cu.j2", "params": ""},
    # v5 overlap: the same bulk store, run by its own kernel under the next tile's first
    # k tile (two accumulator sets)
    2: {"tile": "sm90_tma/store/bulk.cu.j2", "drain": "sm90_tma/store/drain.cu.j2", "params": ""},
    # v5 halves: in two row halves through a C buffer of half the rows
    3: {
        "tile": "sm90_tma/store/bulk_halves.cu.j2",
        "drain": "sm90_tma/store/drain.cu.j2",
        "params": "",
    },
    # v5 TMA store: 64-row subtiles through two buffers a consumer warpgroup, written
    # with stmatrix and stored by cp.async.bulk.tensor through a tensor map of C; the
    # c_ keys: the rows one store takes, whose buffers, who issues, how they sync, the
    # writer's first row in the box and the box's first row past the 64-row block's
    4: {
        "tile": "sm90_tma/store/tma.cu.j2",
        "drain": "sm90_tma/store/drain.cu.j2",
        "params": ",\n    const __grid_constant__ TmaMap tmC",
        "c_rows": "64",
        "c_owner": "wg",
        "c_issuer": "(tid & 127) == 0",
        "c_sync": 'asm volatile("bar.sync %0, 128;\\n" ::"r"(8 + wg) : "memory");',
        "c_box_row": "w * 16 + ",
        "c_row0": "",
    },
    # ... each warp its own 16 rows: two buffers a warp, its lane 0 issuing, __syncwarp
    # in place of the warpgroup's barriers
    5: {
        "tile": "sm90_tma/store/tma.cu.j2",
        "drain": "sm90_tma/store/drain.cu.j2",
        "params": ",\n    const __grid_constant__ TmaMap tmC",
        "c_rows": "16",
        "c_owner": "(wg * 4 + w)",
        "c_issuer": "lane == 0",
        "c_sync": "__syncwarp();",
        "c_box_row": "",
        "c_row0": " + w * 16",
    },
}
# v5 R by TMA (issue 22, ``rtma`` = 1): a residual epilogue's R read by the TMA into the
# TMA store's subtile buffers (a fourth tensor map, ``tmR``, after C's: the runtime
# encodes it from the residual operand with C's box, the recipe's ``tma.r``), each lane
# reading its accumulator pairs of it back with ldmatrix; the pieces: the header's note,
# ldmatrix, the map parameter, the buffers' mbarriers (``init``), a consumer warpgroup's
# state and loader, the tile's first two loads under its main loop (``prefetch``), a
# subtile's wait, its lane's words, and the load of subtile u + 2 (``next``). ``add2``
# in ``RTMA_ADD2`` replaces the epilogue's scalar reads of R.
_RTMA = "sm90_tma/rtma/"
TMA_RTMA = {
    0: {
        "about": NONE,
        "helpers": NONE,
        "params": "",
        "init": NONE,
        "state": NONE,
        "prefetch": NONE,
        "wait": NONE,
        "words": NONE,
        "next": NONE,
    },
    1: {
        "about": _RTMA + "about.cu.j2",
        "helpers": "ptx/ldmatrix.cu.j2",
        "params": ",\n    const __grid_constant__ TmaMap tmR",
        "init": _RTMA + "init.cu.j2",
        "state": _RTMA + "state.cu.j2",
        "prefetch": _RTMA + "prefetch.cu.j2",
        "wait": _RTMA + "wait.cu.j2",
        "words": _RTMA + "words.cu.j2",
        "next": _RTMA + "next.cu.j2",
    },
}
# The kernel a store brings where it is not the persistent kernel of TMA_KERNEL.
TMA_STORE_KERNEL = {2: "sm90_tma/persistent_overlap_kernel.cu.j2"}


# How the TMA store (``store`` 4, 5) forms a subtile's outputs: two adjacent accumulator
# columns a 32-bit stmatrix word (``pairs``: every earlier TMA-store design, byte for
# byte), or, for a gated activation, each (gate, up) pair one output column, a quad's
# shuffles making the stmatrix words of SUB_N / 2 output columns (``gated``): the
# include that fills a stmatrix's four words, the box row's bytes, the stmatrix calls a
# subtile, and the box's first column.
_STORE = "sm90_tma/store/"
TMA_STORE_PACK = {
    "pairs": {
        "c_pack": _STORE + "tma_pack_pairs.cu.j2",
        "c_sub_b": "SUB_N * 2",
        "c_x": "SUB_N / 16",
        "c_col": "n0 + SUB_N * c",
    },
    "gated": {
        "c_pack": _STORE + "tma_pack_gated.cu.j2",
        "c_sub_b": "SUB_N",
        "c_x": "SUB_N / 32",
        "c_col": "(n0 + SUB_N * c) >> 1",
    },
}


def tma_v5(raster: int, store: int, pair: bool = False, gated: bool = False) -> dict[str, Any]:
    """sm90tma's persistent walk (``raster`` = G, 0 the M-fastest one; over pair tiles,
    G / 2 pair rows a group, for a multicast ``pair``) and store (with its own kernel,
    ``TMA_STORE_KERNEL``, for v5 overlap; the TMA store's outputs, ``TMA_STORE_PACK``,
    of a ``gated`` activation)."""
    walk = TMA_RASTER[("grouped" if raster else "m_fastest") + ("_pair" if pair else "")]
    group = raster // 2 if pair else raster
    kernel = {"kernel": TMA_STORE_KERNEL[store]} if store in TMA_STORE_KERNEL else {}
    pack = TMA_STORE_PACK["gated" if gated else "pairs"]
    return {"raster": {**walk, "group": group}, "store": {**TMA_STORE[store], **pack}, **kernel}


# sm90tma v5 ring counter (issue 22): how the persistent kernels name a k tile's ring
# slot and phase. 0: ``it % STAGES`` and ``(it / STAGES) & 1`` at every k tile (as
# before the knob: the 0 row renders every earlier design byte for byte); 1: counters,
# one division a tile (``ring`` = 1, the TMA store's kernels).
_RING = "sm90_tma/ring/"
TMA_RING = {
    0: {
        "producer_start": NONE,
        "producer_step": NONE,
        "pslot": "it % STAGES",
        "pphase": "((it / STAGES) & 1)",
        "consumer_start": NONE,
        "consumer_step": NONE,
        "slot": "it % STAGES",
        "phase": "(it / STAGES) & 1",
        "prev": "(it - 1) % STAGES",
    },
    1: {
        "producer_start": _RING + "producer_start.cu.j2",
        "producer_step": _RING + "producer_step.cu.j2",
        "pslot": "ring_s",
        "pphase": "ring_ph",
        "consumer_start": _RING + "consumer_start.cu.j2",
        "consumer_step": _RING + "consumer_step.cu.j2",
        "slot": "ring_s",
        "phase": "ring_ph",
        "prev": "ring_prev",
    },
}


# sm90tma v5 stream-K (issue 22, ``streamk`` = 1): the persistent cooperative kernel's
# walk over units (a tile's k tiles [kb, ke)) in place of whole tiles: the walk's helpers,
# the producer's loop, the consumers' (``tile_loop``, the schedule's), the k loop's bounds,
# the piece's park-or-add before the store (``fixup``) and the workspace parameter (the
# runtime allocates it: the recipe's ``workspace_per_cta``). 0 renders every earlier
# design byte for byte.
_STREAMK = "sm90_tma/streamk/"
TMA_STREAMK = {
    0: {
        "helpers": NONE,
        "producer_loop": _STREAMK + "producer_tiles.cu.j2",
        "kb": "0",
        "ke": "KT",
        "fixup": NONE,
        "params": "",
    },
    1: {
        "helpers": _STREAMK + "helpers.cu.j2",
        "producer_loop": _STREAMK + "producer_loop.cu.j2",
        "tile_loop": _STREAMK + "tile_loop.cu.j2",
        "kb": "kb",
        "ke": "ke",
        "fixup": _STREAMK + "fixup.cu.j2",
        "params": ",\n    float* __restrict__ WS",
    },
}


# sm90tma v5 uniform warpgroup index (issue 22): how the persistent kernel computes a
# thread's warpgroup. 0: ``tid >> 7`` (as before the knob: every earlier design byte for
# byte); 1: the same broadcast from lane 0 (``uniform`` = 1), which tells the compiler the
# value is the same across the warp (as CUTLASS's canonical_warp_group_idx does), so a
# consumer's ring position, slot and matrix descriptors live in uniform registers: the
# k loop's descriptors are formed in the uniform datapath instead of vector registers
# moved over by R2UR before every wgmma.
TMA_WG_INDEX = {0: "tid >> 7", 1: "__shfl_sync(0xffffffff, tid >> 7, 0)"}


# Designs that leave room (base.ROOM, docs/kernels.md "Designs that leave room"): the
# minimum of CTAs per SM the kernel is compiled for (``__launch_bounds__``'s second
# argument, so ptxas caps its registers at the register file over that many CTAs), by
# the design's ``room``. ``none`` is the 1 the templates had before the knob existed.
ROOM_MIN_BLOCKS = {"none": 1, "half": 2, "quarter": 4}


def room(name: str) -> dict[str, Any]:
    """The launch bound's CTAs per SM (``min_blocks``) of a design's ``room``."""
    if name not in ROOM_MIN_BLOCKS:
        raise ValueError(f"room {name!r} is not one of {list(ROOM_MIN_BLOCKS)}")
    return {"min_blocks": ROOM_MIN_BLOCKS[name]}


# Programmatic dependent launch (docs/kernels.md, "Programmatic dependent launch"):
# the points of a kernel where PDL code may stand, each a partial or NONE. ``helpers``
# (the griddepcontrol wrappers and the L2 prefetch) go before the kernel; ``wait``
# (an L2 prefetch of the CTA's first weight bytes, then griddepcontrol.wait) before the
# first read of A and the first write of C or any global scratch; the trigger
# (griddepcontrol.launch_dependents) at one of ``entry``, ``after_mainloop``,
# ``before_epilogue``, by the design's ``pdl_trigger``. ``none``: no griddepcontrol at
# all, and the source of every plain design is what it was before PDL existed.
PDL_POINTS = ("entry", "after_mainloop", "before_epilogue")
PDL_HELPERS = "ptx/pdl.cu.j2"
PDL_WAIT = "ptx/pdl_wait.cu.j2"
PDL_TRIGGER = "ptx/pdl_trigger.cu.j2"
# Cache lines (128 bytes) of B a CTA prefetches into L2 before its wait: 16 KiB, the
# first k of each of its weight rows. Bounded so that the CTAs resident beside the
# previous kernel (at most a few per SM) stay far below L2 (50 MiB on the H100) and
# do not evict what that kernel is still reading.
PDL_PREFETCH_LINES = 128
# The CTA's slice of B as the prefetch helper takes it (pointer, leading dimension,
# rows, columns, rows-first), spelled in each kernel's own variables, by kernel and
# layout. tn: rows are weight rows, each of contiguous k: the first k of every row;
# nn: rows are k, whole rows in order.
PDL_PREFETCH = {
    ("sm80mma", "tn"): (
        "pdl_prefetch_l2(B + (long long)n0 * ldb, ldb, max(0, min(BN, N - n0)), K, false);"
    ),
    ("sm80mma", "nn"): "pdl_prefetch_l2(B + n0, ldb, K, max(0, min(BN, N - n0)), true);",
    ("sm90direct", "tn"): (
        "pdl_prefetch_l2(B + (long long)n0 * ldb + min(K, rank * WARPS_K * per * 32), ldb,\n"
        "                  max(0, min(BN, N - n0)),\n"
        "                  max(0, min(K, (rank + 1) * WARPS_K * per * 32) -\n"
        "                             min(K, rank * WARPS_K * per * 32)),\n"
        "                  false);"
    ),
    ("sm90stream", "tn"): (
        "pdl_prefetch_l2(B + (long long)n0 * ldb + min(K, kt0 * BK), ldb, "
        "max(0, min(BN, N - n0)),\n"
        "                  max(0, min(K, (kt0 + nk) * BK) - min(K, kt0 * BK)), false);"
    ),
    ("sm90stream", "nn"): (
        "pdl_prefetch_l2(B + (long long)min(K, kt0 * BK) * ldb + n0, ldb,\n"
        "                  max(0, min(K, (kt0 + nk) * BK) - min(K, kt0 * BK)),\n"
        "                  max(0, min(BN, N - n0)), true);"
    ),
    ("sm90tma", "tn"): (
        "pdl_prefetch_l2(B + (long long)n0 * ldb + min(K, kt0 * BK), ldb, "
        "max(0, min(BN, N - n0)),\n"
        "                  max(0, min(K, (kt0 + nk) * BK) - min(K, kt0 * BK)), false);"
    ),
    # The persistent kernel: the weight rows of the CTA's first tile.
    ("sm90tma_persistent", "tn"): (
        "pdl_prefetch_l2(B + (long long)(blockIdx.x / tiles_m) * BN * ldb, ldb,\n"
        "                  max(0, min(BN, N - (int)(blockIdx.x / tiles_m) * BN)), K, false);"
    ),
    # ... as a multicast pair (issue 22): the N tile of its first pair tile.
    ("sm90tma_persistent_pair", "tn"): (
        "pdl_prefetch_l2(B + (long long)((blockIdx.x >> 1) / pairs_m) * BN * ldb, ldb,\n"
        "                  max(0, min(BN, N - (int)((blockIdx.x >> 1) / pairs_m) * BN)), K,\n"
        "                  false);"
    ),
    ("sm90tma_persistent_pair_grouped", "tn"): (
        "pdl_prefetch_l2(B + (long long)raster_n(blockIdx.x >> 1, pairs_m, pair_tiles) * BN *\n"
        "                      ldb, ldb,\n"
        "                  max(0, min(BN, N - raster_n(blockIdx.x >> 1, pairs_m, pair_tiles) *\n"
        "                                      BN)), K, false);"
    ),
    # ... walking the tiles in groups (sm90tma v5's raster): its first tile's N tile.
    ("sm90tma_persistent_grouped", "tn"): (
        "pdl_prefetch_l2(B + (long long)raster_n(blockIdx.x, tiles_m, tiles) * BN * ldb, ldb,\n"
        "                  max(0, min(BN, N - raster_n(blockIdx.x, tiles_m, tiles) * BN)), K,\n"
        "                  false);"
    ),
    ("sm90wgmma", "tn"): (
        "pdl_prefetch_l2(B + (long long)n0 * ldb, ldb, max(0, min(BN, N - n0)), K, false);"
    ),
}
# sm90csk runs the sm80mma main loop on its CTA's share of K (A, B and K rebased).
PDL_PREFETCH_KERNEL = {"sm90csk": "sm80mma"}


def pdl(kernel: str, layout: str, trigger: str) -> dict[str, Any]:
    """The PDL partials of a design (``pdl.helpers``, ``pdl.wait``, one per trigger
    point) and its prefetch call (``pdl.prefetch``); every one NONE (and no prefetch)
    for ``trigger`` ``none``. ``kernel`` is the family, or ``sm90tma_persistent``."""
    if trigger == "none":
        return {"helpers": NONE, "wait": NONE, "prefetch": "", **dict.fromkeys(PDL_POINTS, NONE)}
    if trigger not in PDL_POINTS:
        raise ValueError(f"pdl trigger {trigger!r} is not one of {PDL_POINTS} or 'none'")
    return {
        "helpers": PDL_HELPERS,
        "wait": PDL_WAIT,
        "prefetch": PDL_PREFETCH[(PDL_PREFETCH_KERNEL.get(kernel, kernel), layout)],
        "prefetch_lines": PDL_PREFETCH_LINES,
        **{p: PDL_TRIGGER if p == trigger else NONE for p in PDL_POINTS},
    }


# sm90tma, fused epilogues (``records.EPILOGUES``, the design's ``epilogue`` knob):
# the kernel's extra parameters (ABI gemm_v3: bias, residual, ldr, after gemm_v2's;
# then eps for the RMSNorm row scale), the header's note, and the partials: ``add4``
# changes the one-tile kernel's four split-K-summed columns v of row m (by the rank
# that stores them: once per element) and ``store4`` stores them; ``add2`` is the
# persistent kernel's (an accumulator pair before its store: bias and residual only,
# the others are legal in the one-tile kernel alone). The row scale's sums of squares
# are taken from A's tiles in the ring by the producer warpgroup's idle warps
# (``rowsq_helper``, their constants ``consts``, ``TMA_ROWSQ_PAIR``), stored into every
# split-K rank's slot, and applied per four-column group (``add4``; ``rs_rows`` holds
# 1 / K); the gated activations are device functions (``helpers``).
# ``none``: no parameters and NONE partials, so a plain design's source is unchanged,
# and bias / residual designs' source is what it was before the later epilogues.
EPILOGUE_PARAMS = ",\n    const T* __restrict__ bias, const T* residual, long long ldr"
EPS_PARAM = ",\n    float eps"
STORE4 = "splitk/store4.cu.j2"
_EPI = "sm90_tma/epilogue/"
_PLAIN_PARTS = {
    "helpers": NONE,
    "consts": NONE,
    "rowsq_helper": NONE,
    "rs_rows": NONE,
    "store4": STORE4,
    "act": "",
    "eps_note": "",
    "ring_readers": "",
    "rs_init": NONE,
    "rs_state": NONE,
    "rs_tile": NONE,
}
_ROW_SCALE_PARTS = {
    "eps_note": ", then eps",
    # the helper warps read the ring too: the consumers wait for them before the fp32
    # tile overwrites it
    "ring_readers": " + 32 * ROWSQ_WARPS",
    "consts": _EPI + "rowsq_consts.cu.j2",
    "rowsq_helper": _EPI + "rowsq_helper.cu.j2",
    "rs_rows": _EPI + "rs_rows.cu.j2",
}
# sm90tma v5 row scale (issue 22): the RMSNorm row scale in the persistent cooperative
# kernel that stores by TMA (``persistent`` = 1, ``store`` = 4, unpaired). The producer
# warpgroup's three idle warps walk the CTA's tiles, sum the squares of each tile's A rows
# from the ring (releasing its slots like consumer warps: the empty barrier counts them,
# ``TMA_ROWSQ_PAIR[1]``) and write rsqrt(sum / K + eps) per row into one of two scale buffers
# after the TMA store's; the consumers wait for their tile's buffer after the main loop,
# scale their accumulators by row, release it, and store as the plain (``rmsnorm``), bias
# (``rmsnorm_bias``, ``add2``) or gated (``rmsnorm_<act>``) TMA store does. The parts:
# the header's constants, the scale buffers' mbarriers, the helper warps' loop, a
# consumer's tile count, and the scaling before the store.
PERSISTENT_ROW_SCALE = {
    "consts": _EPI + "prs_consts.cu.j2",
    "rs_init": _EPI + "prs_init.cu.j2",
    "rowsq_helper": _EPI + "prs_helper.cu.j2",
    "rs_state": _EPI + "prs_state.cu.j2",
    "rs_tile": _EPI + "prs_tile.cu.j2",
    "rs_rows": NONE,
    "add4": NONE,
}
# ... its ``add2`` after the scale, by epilogue (the rest add nothing there).
PERSISTENT_ROW_SCALE_ADD2 = {"rmsnorm_bias": _EPI + "bias2.cu.j2"}
# The row scale's helper warps release ring slots too: the empty barrier counts them,
# and a multicast pair's release both CTAs' slots (``pair`` blocks, by cluster_m).
TMA_ROWSQ_PAIR = {
    cm: {
        "empty_init": f"{_EPI}rowsq_empty_init{cm}.cu.j2",
        "rowsq_release": f"{_EPI}rowsq_release{cm}.cu.j2",
    }
    for cm in (1, 2)
}


def _gated(act: str) -> dict[str, str]:
    return {
        "helpers": f"{_EPI}act_{act}.cu.j2",
        "store4": _EPI + "gated_store.cu.j2",
        "act": f"act_{act}",
    }


_ADD_ABOUT = _EPI + "about.cu.j2"
_GATED_ABOUT = _EPI + "about_scaled_gated.cu.j2"
TMA_EPILOGUE: dict[str, dict[str, str]] = {
    "none": {
        "params": "",
        "about": NONE,
        "add4": NONE,
        "add2": NONE,
        "formula": "",
        **_PLAIN_PARTS,
    },
    "bias": {
        **_PLAIN_PARTS,
        "params": EPILOGUE_PARAMS,
        "about": _ADD_ABOUT,
        "add4": _EPI + "bias4.cu.j2",
        "add2": _EPI + "bias2.cu.j2",
        "formula": "C = A B^T + bias[N] (broadcast over rows)",
    },
    "residual": {
        **_PLAIN_PARTS,
        "params": EPILOGUE_PARAMS,
        "about": _ADD_ABOUT,
        "add4": _EPI + "residual4.cu.j2",
        "add2": _EPI + "residual2.cu.j2",
        "formula": "C = A B^T + R[M,N] (row stride ldr)",
    },
    "bias_residual": {
        **_PLAIN_PARTS,
        "params": EPILOGUE_PARAMS,
        "about": _ADD_ABOUT,
        "add4": _EPI + "bias_residual4.cu.j2",
        "add2": _EPI + "bias_residual2.cu.j2",
        "formula": "C = A B^T + bias[N] + R[M,N], summed in that order",
    },
    "silu": {
        **_PLAIN_PARTS,
        **_gated("silu"),
        "params": EPILOGUE_PARAMS,
        "about": _GATED_ABOUT,
        "add4": NONE,
        "add2": NONE,
        "formula": "C[M,N/2], C[m,j] = silu(acc[m,2j]) * acc[m,2j+1], acc = A B^T",
    },
    "gelu_tanh": {
        **_PLAIN_PARTS,
        **_gated("gelu_tanh"),
        "params": EPILOGUE_PARAMS,
        "about": _GATED_ABOUT,
        "add4": NONE,
        "add2": NONE,
        "formula": "C[M,N/2], C[m,j] = gelu_tanh(acc[m,2j]) * acc[m,2j+1], acc = A B^T",
    },
    "rmsnorm": {
        **_PLAIN_PARTS,
        **_ROW_SCALE_PARTS,
        "params": EPILOGUE_PARAMS + EPS_PARAM,
        "about": _GATED_ABOUT,
        "add4": _EPI + "rmsnorm4.cu.j2",
        "add2": NONE,
        "formula": "C = rs[M] * A B^T, rs[m] = rsqrt(sum_k A[m,k]^2 / K + eps)",
    },
    "rmsnorm_bias": {
        **_PLAIN_PARTS,
        **_ROW_SCALE_PARTS,
        "params": EPILOGUE_PARAMS + EPS_PARAM,
        "about": _GATED_ABOUT,
        "add4": _EPI + "rmsnorm_bias4.cu.j2",
        "add2": NONE,
        "formula": "C = rs[M] * A B^T + bias[N], rs[m] = rsqrt(sum_k A[m,k]^2 / K + eps)",
    },
    "rmsnorm_silu": {
        **_PLAIN_PARTS,
        **_ROW_SCALE_PARTS,
        **_gated("silu"),
        "params": EPILOGUE_PARAMS + EPS_PARAM,
        "about": _GATED_ABOUT,
        "add4": _EPI + "rmsnorm4.cu.j2",
        "add2": NONE,
        "formula": "C[M,N/2], C[m,j] = silu(acc[m,2j]) * acc[m,2j+1], acc = rs[M] * A B^T",
    },
    "rmsnorm_gelu_tanh": {
        **_PLAIN_PARTS,
        **_ROW_SCALE_PARTS,
        **_gated("gelu_tanh"),
        "params": EPILOGUE_PARAMS + EPS_PARAM,
        "about": _GATED_ABOUT,
        "add4": _EPI + "rmsnorm4.cu.j2",
        "add2": NONE,
        "formula": "C[M,N/2], C[m,j] = gelu_tanh(acc[m,2j]) * acc[m,2j+1], acc = rs[M] * A B^T",
    },
}
# An epilogue operand element to fp32, and a pair of them to a float2, by dtype.
TO_FLOAT = {"fp16": "__half2float", "bf16": "__bfloat162float"}
UNPACK2 = {"fp16": "__half22float2", "bf16": "__bfloat1622float2"}


# The persistent kernel's ``add2`` of an epilogue that reads R, where R comes by TMA
# (``rtma`` = 1): from the lane's ldmatrix words of it, not from global memory.
RTMA_ADD2 = {
    "residual": _EPI + "residual_tma2.cu.j2",
    "bias_residual": _EPI + "bias_residual_tma2.cu.j2",
}


# The gated TMA store's activations (persistent kernels, ``store`` = 4): the same
# functions by the hardware exp2 and reciprocal (``__expf``, ``__fdividef``; GeLU as
# g * sigmoid(2u), no tanh). The accurate ones cost about 1,800 instructions a thread a
# 128x256 tile there (64 IEEE divisions with their slow-path calls, expf's polynomial),
# an epilogue nothing overlaps in the cooperative kernel; the one-tile kernels (decode,
# bound by the weights' read) keep the accurate ones.
TMA_FAST_ACT = {
    act: {"helpers": f"{_EPI}act_{act}_fast.cu.j2", "act": f"act_{act}_fast"}
    for act in ("silu", "gelu_tanh")
}


def tma_epilogue(
    epilogue: str,
    dtype: str,
    rtma: bool = False,
    fast_act: bool = False,
    persistent_rows: bool = False,
) -> dict[str, str]:
    """sm90tma's epilogue partials and spellings (``epilogue.*`` in its templates); with
    ``rtma``, R's reads from the TMA store's buffers (``RTMA_ADD2``); with ``fast_act``,
    the gated TMA store's activation (``TMA_FAST_ACT``, ``rmsnorm_<act>``'s too); with
    ``persistent_rows``, the row scale of the persistent TMA store
    (``PERSISTENT_ROW_SCALE``)."""
    if epilogue not in TMA_EPILOGUE:
        raise ValueError(f"epilogue {epilogue!r}: sm90tma renders {list(TMA_EPILOGUE)}")
    if rtma and epilogue not in RTMA_ADD2:
        raise ValueError(f"epilogue {epilogue!r}: R by TMA takes {list(RTMA_ADD2)}")
    act = epilogue.removeprefix("rmsnorm_")
    if fast_act and act not in TMA_FAST_ACT:
        raise ValueError(f"epilogue {epilogue!r}: the fast activations are {list(TMA_FAST_ACT)}")
    if persistent_rows and epilogue not in ROW_SCALED:
        raise ValueError(f"epilogue {epilogue!r}: the row scale is {sorted(ROW_SCALED)}'s")
    rows = {}
    if persistent_rows:
        rows = {**PERSISTENT_ROW_SCALE, "add2": PERSISTENT_ROW_SCALE_ADD2.get(epilogue, NONE)}
    return {
        **TMA_EPILOGUE[epilogue],
        **({"add2": RTMA_ADD2[epilogue]} if rtma else {}),
        **(TMA_FAST_ACT[act] if fast_act else {}),
        **rows,
        "name": epilogue,
        "to_float": TO_FLOAT[dtype],
        "unpack2": UNPACK2[dtype],
    }


# sm90direct and sm90stream, fused epilogues (docs/kernels.md, "Fused epilogues in
# sm90direct"): both end in ``splitk/reduce_store.cu.j2``, where the rank that stores a
# four-column group applies ``add4`` (sm90tma's partials where they fit: bias, residual,
# their sum) and ``store4`` (the plain store, or sm90tma's gated pair store). ABI gemm_v3
# as sm90tma's: the runtime passes the two tensor maps to every gemm_v3 kernel, so these
# kernels take them (``types``: the descriptor's type) and read neither. The row scale's
# sums of squares are taken from the activation values the warps with wn == 0 already
# hold for their mmas (``sq_init``, ``sq_step0`` / ``sq_step1`` in the main loop, the
# family's ``rowsq_helpers``), parked per K slice after the plain kernel's shared memory
# (``consts``, ``sq_park``) and summed over ranks and slices by ``add4``. ``none``: every
# partial NONE and no parameters, so a plain design's source is what it was.
_SK = "splitk/epilogue/"
SPLITK_ROWSQ_PARTS = {
    "consts": _SK + "consts.cu.j2",
    "sq_init": _SK + "sq_init.cu.j2",
    "sq_park": _SK + "park.cu.j2",
    "rs_rows": _SK + "rs_rows.cu.j2",
    "eps_note": ", then eps",
}
# The family's row-scale parts: where its main loop holds activation values, and which
# rows a warp's sums are (its K slice for sm90direct, its wm rows for sm90stream).
SPLITK_ROWSQ_FAMILY = {
    ("sm90direct", False): {
        "rowsq_helpers": "sm90_direct/rowsq/helpers.cu.j2",
        "sq_step0": "sm90_direct/rowsq/step_f0.cu.j2",
        "sq_step1": "sm90_direct/rowsq/step_f1.cu.j2",
        "rowsq_slices": "WARPS_K",
        "park_row": "wk * BM",
    },
    ("sm90direct", True): {
        "rowsq_helpers": "sm90_direct/rowsq/x_smem_helpers.cu.j2",
        "sq_step0": "sm90_direct/rowsq/chunk_xs0.cu.j2",
        "sq_step1": "sm90_direct/rowsq/chunk_xs1.cu.j2",
        "rowsq_slices": "WARPS_K",
        "park_row": "wk * BM",
    },
    ("sm90stream", False): {
        "rowsq_helpers": "sm90_stream/rowsq/helpers.cu.j2",
        "sq_step0": "sm90_stream/rowsq/step.cu.j2",
        "sq_step1": NONE,
        "rowsq_slices": "1",
        "park_row": "wm * WTM",
    },
}
SPLITK_EPILOGUE_PARAMS = (
    ",\n    const __grid_constant__ TmaMap tmA, const __grid_constant__ TmaMap tmB"
    + EPILOGUE_PARAMS
)
_SPLITK_PLAIN = {
    "params": "",
    "about": NONE,
    "types": NONE,
    "helpers": NONE,
    "add4": NONE,
    "store4": STORE4,
    "act": "",
    "formula": "",
    "eps_note": "",
    **dict.fromkeys(("consts", "sq_init", "sq_park", "rs_rows"), NONE),
    **dict.fromkeys(("rowsq_helpers", "sq_step0", "sq_step1"), NONE),
}
_SPLITK_FUSED = {
    "params": SPLITK_EPILOGUE_PARAMS,
    "about": _SK + "about.cu.j2",
    "types": "ptx/tma_map.cu.j2",
}
# Per epilogue: sm90tma's add / store parts (bias4, residual4, gated_store, ...) where
# they fit as they are; the row scale's own (its sums live elsewhere than sm90tma's).
SPLITK_EPILOGUE: dict[str, dict[str, str]] = {
    "none": {},
    "bias": {"add4": TMA_EPILOGUE["bias"]["add4"]},
    "residual": {"add4": TMA_EPILOGUE["residual"]["add4"]},
    "bias_residual": {"add4": TMA_EPILOGUE["bias_residual"]["add4"]},
    "silu": _gated("silu"),
    "gelu_tanh": _gated("gelu_tanh"),
    "rmsnorm": {"add4": _SK + "rmsnorm4.cu.j2"},
    "rmsnorm_bias": {"add4": _SK + "rmsnorm_bias4.cu.j2"},
    "rmsnorm_silu": {**_gated("silu"), "add4": _SK + "rmsnorm4.cu.j2"},
    "rmsnorm_gelu_tanh": {**_gated("gelu_tanh"), "add4": _SK + "rmsnorm4.cu.j2"},
    "rmsnorm_rope_kv": {
        "add4": _SK + "rmsnorm4.cu.j2",
        "store4": _SK + "rope_kv_store.cu.j2",
        "about": _SK + "about_rope_kv.cu.j2",
        "formula": "acc = rs[M] * A B^T; q heads rotated into C[M, q_heads * head_dim], "
        "k heads rotated and v heads into the caches",
    },
    "rmsnorm_bias_rope_kv": {
        "add4": _SK + "rmsnorm_bias4.cu.j2",
        "store4": _SK + "rope_kv_store.cu.j2",
        "about": _SK + "about_rope_kv.cu.j2",
        "formula": "acc = rs[M] * A B^T + bias[N]; q heads rotated into C[M, q_heads * "
        "head_dim], k heads rotated and v heads into the caches",
    },
}
# RoPE and the KV-cache write (records.ROPE_KV): the kernel's parameters after eps, in
# the runtime's ``abi.RopeKvArgs`` order (strides spread).
ROPE_KV_PARAMS = (
    ",\n    const T* __restrict__ rope_cos, const T* __restrict__ rope_sin, T* k_cache,"
    "\n    T* v_cache, const long long* __restrict__ positions, int seq, int cos_batch,"
    " int cache_len,"
    "\n    int q_heads, int kv_heads, int head_dim, long long ks0, long long ks1, long long ks2,"
    "\n    long long vs0, long long vs1, long long vs2"
)


def splitk_epilogue(
    family: str, epilogue: str, dtype: str, x_smem: bool = False, rowsq_offset: int = 0
) -> dict[str, str]:
    """sm90direct's / sm90stream's epilogue partials and spellings (``epilogue.*`` in
    their templates); ``rowsq_offset`` is where the row scale's sums park (the plain
    kernel's shared-memory bytes)."""
    if epilogue not in SPLITK_EPILOGUE:
        raise ValueError(f"epilogue {epilogue!r}: {family} renders {list(SPLITK_EPILOGUE)}")
    out = {**_SPLITK_PLAIN, "name": epilogue}
    if epilogue != "none":
        out.update(_SPLITK_FUSED, formula=TMA_EPILOGUE.get(epilogue, {}).get("formula", ""))
        out.update(SPLITK_EPILOGUE[epilogue], to_float=TO_FLOAT[dtype], unpack2=UNPACK2[dtype])
    if epilogue in ROW_SCALED:
        out.update(SPLITK_ROWSQ_PARTS, **SPLITK_ROWSQ_FAMILY[(family, x_smem)])
        out.update(params=SPLITK_EPILOGUE_PARAMS + EPS_PARAM, rowsq_offset=str(rowsq_offset))
    if epilogue in ROPE_KV:
        out.update(params=out["params"] + ROPE_KV_PARAMS)
    return out
