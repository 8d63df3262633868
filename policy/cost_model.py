"""A cheap analytic time model that ranks designs before anything is timed.

Roofline per block schedule: blocks are spread over the SMs, each SM's tensor rate
is shared by the blocks it holds, and operand tiles are re-read from L2 once per
block. It is used only to order candidates (as Triton's ``prune_configs_by``),
never as a measurement.
"""

from __future__ import annotations

import functools
import math

from cudal2.generator.families import family_of, sm90_direct, sm90_tma
from cudal2.generator.space import launch_recipe
from cudal2.records import KernelDesign, Target

SM_COUNT = 132  # H100 SXM / H200
PEAK_FLOPS = 989e12  # dense fp16/bf16, datasheet
HBM_BW = 3.35e12
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
# CTA (persistent = 1) overlaps the next tile's loads with the epilogue but not its
# math (measured: no faster than one tile per CTA), so it pays per tile as well; a
# ping-pong CTA (persistent = 2) runs one warpgroup's epilogue under the other's
# wgmmas and pays once. A prior (the epilogue of a 128x256 tile moves 64-128 KB
# through shared memory, about a microsecond), not fitted, though it raises the
# Spearman correlation above from 0.65 to 0.71 on the same recorded (non-persistent)
# measurements.
WGMMA_TILE_OVERHEAD_S = 1e-6
WGMMA_FAMILIES = ("sm90tma", "sm90wgmma")


def _threads(d: KernelDesign) -> int:
    """Threads per block, as the family launches it (sm90stream adds its producer)."""
    return launch_recipe(d)["block"][0]


def _regs(d: KernelDesign) -> int:
    if d.family == "sm90direct":  # the family's own budget, both register buffers
        return min(255, sm90_direct.data_regs(d) + sm90_direct.OTHER_REGS)
    if d.family == "sm90tma":  # the consumers' accumulators; the producer gives back
        return min(255, sm90_tma.acc_regs(d) + 40)
    if d.family == "sm90stream":  # weight rows on the mma M side
        mi, nj = d.bn // d.warps_n // 16, d.bm // d.warps_m // 8
        return min(255, mi * nj * 4 + mi * 4 + nj * 2 + 40)
    mi, ni = d.bm // d.warps_m // 16, d.bn // d.warps_n // 8
    return min(255, mi * ni * 4 + mi * 4 + ni * 2 + 48)


@functools.cache  # a design's alone, and asked for once per design per target ranked
def _blocks_per_sm(d: KernelDesign) -> int:
    smem = family_of(d.family).smem_bytes(d)
    by_smem = (228 * 1024) // max(smem + 1024, 1)
    by_threads = 2048 // _threads(d)
    by_regs = 65536 // (_threads(d) * _regs(d))
    return max(1, min(by_smem, by_threads, by_regs, 32))


def _bytes_in_flight(d: KernelDesign, k_block: int) -> int:
    """Operand bytes one resident block keeps requested ahead of its math."""
    if d.family == "sm90direct":
        # Every warp: bk/32 16-byte loads per lane for each of its two weight rows
        # and its bm/8 activation rows, all issued before the step's mmas.
        return d.threads * (d.bk // 32) * (2 + d.bm // 8) * 16
    ahead = d.stages if d.family in ("sm90stream", "sm90tma") else d.stages - 1  # producer
    return min(ahead, math.ceil(k_block / d.bk)) * (d.bm + d.bn) * d.bk * 2


def predicted_time_s(d: KernelDesign, t: Target) -> float:
    tiles = math.ceil(t.m / d.bm) * math.ceil(t.n / d.bn)
    # Split-K: ``split_k`` blocks per output tile, each with its share of K's tiles.
    blocks = tiles * d.split_k
    k_block = math.ceil(math.ceil(t.k / d.bk) / d.split_k) * d.bk
    occ = _blocks_per_sm(d)
    # Work of the busiest SM: its share of blocks, at a rate that needs >= 8 warps to saturate.
    blocks_on_busiest = math.ceil(blocks / SM_COUNT)
    warps_resident = min(occ, blocks_on_busiest) * d.warps_m * d.warps_n * d.warps_k
    if d.family in WGMMA_FAMILIES:
        wgs = warps_resident / 4
        sm_rate = PEAK_FLOPS * WGMMA_EFFICIENCY / SM_COUNT * min(1.0, wgs / WGMMA_SATURATING_WGS)
    else:
        sm_rate = PEAK_FLOPS * MMA_SYNC_EFFICIENCY / SM_COUNT * min(1.0, warps_resident / 8)
    compute = blocks_on_busiest * 2 * d.bm * d.bn * k_block / sm_rate
    # Bandwidth: DRAM once, L2 once per block; only the SMs in use pull data, and an
    # SM streams at full rate only with bandwidth x latency bytes in flight (Little's
    # law), which the (stages - 1) tiles it prefetches per resident block provide.
    active = min(blocks, SM_COUNT) / SM_COUNT
    need = HBM_BW / SM_COUNT * MEM_LATENCY_S
    in_flight = min(occ, blocks_on_busiest) * _bytes_in_flight(d, k_block)
    feed = min(1.0, in_flight / need)
    dram = t.min_bytes / (HBM_BW * max(active, 0.25) * feed)
    l2_bw = WGMMA_L2_BW if d.family in WGMMA_FAMILIES else L2_BW
    # a multicast cluster along M reads each B tile once per cluster_m CTAs
    l2 = blocks * (d.bm + d.bn / d.cluster_m) * k_block * 2 / (l2_bw * active * feed)
    # Pipeline fill: each block waits for its first tiles before the first mma.
    fill = MEM_LATENCY_S * (1 + 0.1 * (d.stages if d.family != "sm90direct" else 4))
    reduce = CLUSTER_REDUCE_S if d.split_k > 1 else 0.0
    rounds = 0.0
    if d.family in WGMMA_FAMILIES:
        rounds = 1 if d.persistent == 2 else math.ceil(blocks_on_busiest / occ)
    return max(compute, dram, l2) + fill + reduce + rounds * WGMMA_TILE_OVERHEAD_S
