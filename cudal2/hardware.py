"""The physical floor of a GEMM on a GPU model, from its datasheet: no kernel can run
faster than max(2MNK / peak FLOP/s, bytes / peak bandwidth)."""

from __future__ import annotations

from cudal2.records import Target

# Dense fp16/bf16 tensor rate and HBM bandwidth by GPU model prefix (SXM datasheets).
DATASHEET = {
    "NVIDIA H100": (989e12, 3.35e12),
    "NVIDIA H200": (989e12, 4.8e12),
}


def datasheet(gpu_name: str) -> tuple[float, float]:
    for prefix, peaks in DATASHEET.items():
        if gpu_name.startswith(prefix):
            return peaks
    raise ValueError(f"no datasheet peaks for {gpu_name!r}; known: {sorted(DATASHEET)}")


def floor_us(t: Target, gpu_name: str) -> float:
    flops, bw = datasheet(gpu_name)
    return max(t.flops / flops, t.min_bytes / bw) * 1e6
