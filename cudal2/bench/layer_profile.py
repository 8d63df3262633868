"""Where a decoder layer's time goes, and how far the layer benchmark's targets are from
physics: the layer's own read ceiling.

``bench/experiments/layer_profile.py`` profiles the layer benchmark's vendor and cudal2
layers under CUDA-graph replay (per-kernel GPU time, ``bench/results/h100-layer-profile.json``).
Here its kernels are sorted by role, and each case is set beside the read ceiling of its
GEMMs (``bench/results/h100-read-ceiling.jsonl``: the time a kernel that only reads the
shape's bytes takes, docs/kernels.md "The read ceiling"). Two ceilings, each the vendor
layer's time over the time of a layer whose four GEMMs run as fast as a pure read:
``ceiling`` keeps the cudal2 layer's other kernels as they are (attention, the KV-cache
copies, RoPE, whatever the fusions left: no fused layer built from today's pieces can do
better), ``ceiling_attention_only`` keeps only attention (the same kernel in both layers:
every other small kernel fused away, RoPE and the cache write into the qkv GEMM's
epilogue too). A target above the second is beyond physics for this layer.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from cudal2.bench.layer import layer_shape

ROLES = ("gemm", "attention", "elementwise", "copy", "other")

# Name fragments by role, first match wins (lowercased kernel names as the profiler
# reports them): cudal2's kernels, cuBLAS's (nvjet, its split-K reduction), cuDNN's and
# torch's attention, torch.compile's triton kernels and torch's elementwise kernels.
_ROLE_PATTERNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gemm", ("hgemm_", "nvjet", "splitkreduce", "gemm", "cutlass", "xmma")),
    ("attention", ("flash", "fmha", "sdpa", "attention", "lean_reduction", "softmax")),
    ("copy", ("direct_copy", "memcpy", "memset")),
    ("elementwise", ("triton_", "elementwise", "functor")),
)


def role(kernel: str) -> str:
    """A kernel's role in the layer, from its name."""
    n = kernel.lower()
    for name, fragments in _ROLE_PATTERNS:
        if any(f in n for f in fragments):
            return name
    return "other"


def by_role(variant: Mapping[str, Any]) -> dict[str, float]:
    """µs per layer by role of one variant of a profiled case."""
    out: dict[str, float] = defaultdict(float)
    for k in variant["kernels"]:
        out[role(k["kernel"])] += k["us_per_layer"]
    return {r: out.get(r, 0.0) for r in ROLES}


def read_times(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int, int, int], float]:
    """(dtype, M, N, K) -> the pure read's median µs, from read-ceiling records."""
    return {
        (r["target"]["dtype"], r["target"]["m"], r["target"]["n"], r["target"]["k"]): r[
            "read_best"
        ]["median_us"]
        for r in rows
    }


def ceiling_rows(
    profile: Mapping[str, Any], reads: Mapping[tuple[str, int, int, int], float]
) -> list[dict[str, Any]]:
    """Per profiled case whose four GEMMs all have a read time: the spans, the GEMM time
    against the reads, and the layer's ceiling (module doc)."""
    out = []
    for c in profile["cases"]:
        shape = layer_shape(c["model"])
        keys = [(c["dtype"], c["m"], n, k) for n, k in shape.gemms().values()]
        if not all(key in reads for key in keys):
            continue
        read = sum(reads[key] for key in keys)
        v, u = by_role(c["vendor"]), by_role(c["cudal2"])
        rest = sum(us for r, us in u.items() if r != "gemm")
        attention = u["attention"]
        vendor_span, cudal2_span = c["vendor"]["span_us"], c["cudal2"]["span_us"]
        out.append(
            {
                "model": c["model"],
                "dtype": c["dtype"],
                "m": c["m"],
                "vendor_us": vendor_span,
                "cudal2_us": cudal2_span,
                "speedup": vendor_span / cudal2_span,
                "vendor_gemm_us": v["gemm"],
                "cudal2_gemm_us": u["gemm"],
                "read_us": read,
                "cudal2_rest_us": rest,
                "cudal2_attention_us": attention,
                "ceiling": vendor_span / (read + rest),
                "ceiling_attention_only": vendor_span / (read + attention),
            }
        )
    return out


def load(profile_text: str, read_text: str) -> list[dict[str, Any]]:
    """``ceiling_rows`` of a profile JSON and a read-ceiling JSON Lines text."""
    reads = read_times([json.loads(line) for line in read_text.splitlines() if line.strip()])
    return ceiling_rows(json.loads(profile_text), reads)
