"""A cheap analytic time model that ranks designs before anything is timed.

Roofline per block schedule: blocks are spread over the SMs, each SM's tensor rate
is shared by the blocks it holds, and operand tiles are re-read from L2 once per
block. It is used only to order candidates (as Triton's ``prune_configs_by``),
never as a measurement.
"""

from __future__ import annotations

import functools
import math

from cudal2.generator import Features, features
from cudal2.hardware import ARCH_LIMITS, DATASHEETS, REFERENCE_GPU
from cudal2.records import KernelDesign, Target

_SHEET = DATASHEETS[REFERENCE_GPU]
_LIMITS = ARCH_LIMITS["sm_90a"]
SM_COUNT = _SHEET.sm_count
PEAK_FLOPS = _SHEET.flops  # dense fp16/bf16, datasheet
HBM_BW = _SHEET.bandwidth
L2_BW = 3 * HBM_BW  # rough: L2 feeds several times HBM's rate
# Effective constants, fitted (least squares on log time, grid over a few values) to
# the recorded H100 sm80mma measurements (manifests/default.measurements.jsonl): rms
# log error 0.25, against 0.86 with the textbook 0.6 and 1 us.
MMA_SYNC_EFFICIENCY = 0.3  # share of the wgmma peak mma.sync kernels reached (4096^3: 0.31)
MEM_LATENCY_S = 4e-6  # effective latency x bandwidth window a stream must cover
CLUSTER_REDUCE_S = 0.5e-6  # a split-K cluster's two cluster barriers and DSMEM sums
# wgmma families: the share of the peak sm90tma reached at 4096^3 (128x256 tile, v0:
# 700 TFLOP/s), consumer warpgroups per SM that keep the tensor pipe full, and the L2
# rate its tiles stream at: a grid over (0.5, 0.7) x (1, 2, 4) x (2, 3, 5) x HBM,
# ranked by the mean Spearman correlation with 1,312 recorded H100 sm90tma
# measurements over 40 llm-public targets (0.65; 0.58 with the mma.sync L2 rate).
WGMMA_EFFICIENCY = 0.7
WGMMA_SATURATING_WGS = 2
WGMMA_L2_BW = 2 * HBM_BW
# A non-persistent wgmma CTA's prologue (barriers, pipeline fill) and epilogue run
# with its tensor pipe idle, once per round of CTAs on an SM. A cooperative persistent
# CTA overlaps the next tile's loads with the epilogue but not its math (measured: no
# faster than one tile per CTA), so it pays per tile as well; a ping-pong CTA runs one
# warpgroup's epilogue under the other's wgmmas and pays once. A prior (the epilogue
# of a 128x256 tile moves 64-128 KB through shared memory, about a microsecond), not
# fitted, though it raises the Spearman correlation above from 0.65 to 0.71 on the
# same recorded (non-persistent) measurements.
WGMMA_TILE_OVERHEAD_S = 1e-6
# Designs that leave room (``room``, docs/kernels.md "Designs that leave room") are
# measured only with PDL, back to back with a like-sized successor: its CTAs become
# resident beside this kernel's while it drains, and run their launch and pre-wait work
# (the L2 prefetch of their weight rows) under its tail. The probe (H100, a
# graph of 64 weight-streaming calls) saved 1.50 / 1.73 / 2.52 / 1.91 / 3.46 us per call
# with PDL when small CTAs were co-resident, and 1.23 / 1.46 / 0.81 / 0.85 / 0.84 us
# when each CTA filled an SM (8 / 21 / 32 / 48 / 96 MB of weights): the room itself
# bought 0.27-2.62 us, 1.06 in the median: the first prior (1 us). Measured on GEMMs
# since (ci/gpu_room.sh, bench/results/h100-room-timing.json: 29 decode tiles, each's
# best PDL design without room against its best with room), the median saving is
# 0.04 us (mean 0.12, -2.7 to +2.7): a decode GEMM's successor can only prefetch and
# wait, which PDL already overlaps (docs/kernels.md, "Designs that leave room"). The
# credit is that median (tests/policy/test_cost_model_room.py refits it).
ROOM_OVERLAP_S = 0.04e-6


def _blocks_per_sm(f: Features) -> int:
    by_smem = _LIMITS.smem_per_sm // max(f.smem_bytes + 1024, 1)
    by_threads = _LIMITS.max_threads_per_sm // f.threads
    by_regs = _LIMITS.registers_per_sm // (f.threads * f.regs)
    return max(1, min(by_smem, by_threads, by_regs, 32))


def _bytes_in_flight(f: Features, k_block: int) -> int:
    """Operand bytes one resident block keeps requested ahead of its math."""
    if f.stream_bytes:
        return f.stream_bytes
    return min(f.prefetch_tiles, math.ceil(k_block / f.bk)) * (f.bm + f.bn) * f.bk * 2


@functools.cache  # a design's alone, and asked for once per design per target ranked
def _features(d: KernelDesign) -> Features:
    return features(d)


def predicted_time_s(d: KernelDesign, t: Target) -> float:
    f = _features(d)
    # Tiles cover the GEMM's N (a gated epilogue's packed gate_up rows); the bytes
    # written are the output's, ``t.out_n`` wide (N/2 when gated), in ``t.min_bytes``.
    tiles = math.ceil(t.m / f.bm) * math.ceil(t.n / f.bn)
    # Split-K: ``split_k`` blocks per output tile, each with its share of K's tiles.
    blocks = tiles * f.split_k
    k_block = math.ceil(math.ceil(t.k / f.bk) / f.split_k) * f.bk
    occ = _blocks_per_sm(f)
    # Work of the busiest SM: its share of blocks, at a rate that needs >= 8 warps to saturate.
    blocks_on_busiest = math.ceil(blocks / SM_COUNT)
    warps_resident = min(occ, blocks_on_busiest) * f.warps
    if f.wgmma:
        wgs = warps_resident / 4
        sm_rate = PEAK_FLOPS * WGMMA_EFFICIENCY / SM_COUNT * min(1.0, wgs / WGMMA_SATURATING_WGS)
    else:
        sm_rate = PEAK_FLOPS * MMA_SYNC_EFFICIENCY / SM_COUNT * min(1.0, warps_resident / 8)
    compute = blocks_on_busiest * 2 * f.bm * f.bn * k_block / sm_rate
    # Bandwidth: DRAM once, L2 once per block; only the SMs in use pull data, and an
    # SM streams at full rate only with bandwidth x latency bytes in flight (Little's
    # law), which the tiles it prefetches per resident block provide.
    active = min(blocks, SM_COUNT) / SM_COUNT
    need = HBM_BW / SM_COUNT * MEM_LATENCY_S
    in_flight = min(occ, blocks_on_busiest) * _bytes_in_flight(f, k_block)
    feed = min(1.0, in_flight / need)
    dram = t.min_bytes / (HBM_BW * max(active, 0.25) * feed)
    l2_bw = WGMMA_L2_BW if f.wgmma else L2_BW
    # a multicast cluster along M reads each B tile once per cluster_m CTAs
    l2 = blocks * (f.bm + f.bn / f.cluster_m) * k_block * 2 / (l2_bw * active * feed)
    # Pipeline fill: each block waits for its first tiles before the first mma.
    fill = MEM_LATENCY_S * (1 + 0.1 * f.fill_stages)
    reduce = CLUSTER_REDUCE_S if f.split_k > 1 else 0.0
    rounds = 0.0
    if f.wgmma:
        # sm90tma v5's bulk store (issue 22): the copies drain under the next tile's
        # main loop, priced as ping-pong's overlap. A prior, not yet measured (the
        # conversion into the C buffer still runs with the tensor pipe idle).
        overlapped = f.pingpong or f.store_overlap
        rounds = 1 if overlapped else math.ceil(blocks_on_busiest / occ)
    return (
        max(compute, dram, l2)
        + fill
        + reduce
        + rounds * WGMMA_TILE_OVERHEAD_S
        - room_overlap_s(f, blocks, blocks_on_busiest, occ)
    )


def room_overlap_s(f: Features, blocks: int, blocks_on_busiest: int, occ: int) -> float:
    """The successor's work a room design hides under its tail (``ROOM_OVERLAP_S`` on
    every SM it keeps busy), or nothing: without room (``room_share`` 1), and where its
    own CTAs fill the share of every busy SM (a grid of at least ``room_share`` CTAs
    resident per SM leaves the successor no slot until they drain, as a design without
    room does). What room may cost its own kernel (registers capped at the launch
    bound's share of the file) is not priced here: the family's rules reject a design
    whose register model exceeds the cap, and below it the model has no register
    pressure term to move."""
    if f.room_share <= 1 or min(occ, blocks_on_busiest) >= f.room_share:
        return 0.0
    return ROOM_OVERLAP_S * min(blocks, SM_COUNT) / SM_COUNT
