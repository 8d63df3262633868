"""Hardware facts, one table each: the GPU models' datasheets and the limits of the
archs the kernels are built for. The physical floor of a GEMM follows from the
datasheet: no kernel can run faster than max(2MNK / peak FLOP/s, bytes / peak
bandwidth)."""

from __future__ import annotations

from dataclasses import dataclass

from cudal2.records import Target


@dataclass(frozen=True)
class Datasheet:
    """A GPU model's published peaks (SXM parts): dense fp16/bf16 tensor FLOP/s, HBM
    bytes/s, and its multiprocessor count."""

    flops: float
    bandwidth: float
    sm_count: int


# By GPU model name prefix, as torch / nvidia-smi name them.
DATASHEETS: dict[str, Datasheet] = {
    "NVIDIA H100": Datasheet(flops=989e12, bandwidth=3.35e12, sm_count=132),
    "NVIDIA H200": Datasheet(flops=989e12, bandwidth=4.8e12, sm_count=132),
}
# The model the cost model and the policy's default features assume.
REFERENCE_GPU = "NVIDIA H100"


@dataclass(frozen=True)
class ArchLimits:
    """What one CTA of an arch may use (CUDA's compute-capability tables)."""

    max_smem_bytes: int  # opt-in dynamic shared memory per block
    smem_per_sm: int
    max_threads: int
    registers_per_sm: int
    max_registers: int  # per thread
    max_threads_per_sm: int


ARCH_LIMITS: dict[str, ArchLimits] = {
    "sm_90a": ArchLimits(
        max_smem_bytes=227 * 1024,
        smem_per_sm=228 * 1024,
        max_threads=1024,
        registers_per_sm=65536,
        max_registers=255,
        max_threads_per_sm=2048,
    ),
}


def datasheet(gpu_name: str) -> Datasheet:
    for prefix, sheet in DATASHEETS.items():
        if gpu_name.startswith(prefix):
            return sheet
    raise ValueError(f"no datasheet for {gpu_name!r}; known: {sorted(DATASHEETS)}")


def floor_us(t: Target, gpu_name: str) -> float:
    sheet = datasheet(gpu_name)
    return max(t.flops / sheet.flops, t.min_bytes / sheet.bandwidth) * 1e6


def norm_floor_us(t: Target, gpu_name: str) -> float:
    """The floor of torch's RMSNorm of a row-scaled target's A (``records.NORM_BASELINE``,
    timed beside its GEMM): A [M, K] read once (2-byte elements), not the GEMM's floor."""
    return 2 * t.m * t.k / datasheet(gpu_name).bandwidth * 1e6
