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


def kernel_table(
    kernels: Sequence[tuple[str, float, float, float]], per: int, unit: str
) -> dict[str, Any]:
    """Profiled kernels ``(name, start µs, end µs, GPU µs)`` summed by name, per ``per``
    (layers or decode steps, named by ``unit``): each kernel's GPU time, launches, and
    the GPU's idle time just before it (since the latest end of the kernels started
    before it: with PDL a kernel starts before the one it waits for ends, so its
    duration holds that wait and the durations overlap); the totals, the span, and the
    idle time (the span less the union of the kernels' intervals)."""
    by_name: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    gap: dict[str, float] = defaultdict(float)
    reach: float | None = None
    for name, start, end, gpu_us in sorted(kernels, key=lambda e: e[1]):
        by_name[name] += gpu_us
        count[name] += 1
        if reach is not None:
            gap[name] += max(0.0, start - reach)
        reach = end if reach is None else max(reach, end)
    rows = sorted(
        (
            {
                "kernel": k[:160],
                "role": role(k),
                f"us_per_{unit}": round(v / per, 3),
                f"launches_per_{unit}": round(count[k] / per, 3),
                f"idle_before_us_per_{unit}": round(gap[k] / per, 3),
            }
            for k, v in by_name.items()
        ),
        key=lambda r: -r[f"us_per_{unit}"],
    )
    span = max(e[2] for e in kernels) - min(e[1] for e in kernels)
    return {
        "kernels": rows,
        "by_role_us": {
            k: round(v, 3) for k, v in by_role({"kernels": rows}, f"us_per_{unit}").items()
        },
        "kernel_sum_us": round(sum(by_name.values()) / per, 3),
        "span_us": round(span / per, 3),
        # the GPU with no kernel running (launch gaps, a kernel waiting for the host)
        "idle_us": round(sum(gap.values()) / per, 3),
        f"launches_per_{unit}": round(len(kernels) / per, 2),
    }


def profiled_kernels(prof: Any) -> list[tuple[str, float, float, float]]:
    """A ``torch.profiler`` run's GPU kernels as ``kernel_table`` takes them."""
    import torch

    return [
        (e.name, e.time_range.start, e.time_range.end, e.device_time)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0
    ]


def by_role(variant: Mapping[str, Any], key: str = "us_per_layer") -> dict[str, float]:
    """µs per layer (per ``key``: ``us_per_step`` for a whole decode step) by role of one
    variant of a profiled case."""
    out: dict[str, float] = defaultdict(float)
    for k in variant["kernels"]:
        out[role(k["kernel"])] += k[key]
    return {r: out.get(r, 0.0) for r in ROLES}


def read_times(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int, int, int], float]:
    """(dtype, M, N, K) -> the pure read's median µs, from read-ceiling records."""
    return {
        (r["target"]["dtype"], r["target"]["m"], r["target"]["n"], r["target"]["k"]): r[
            "read_best"
        ]["median_us"]
        for r in rows
    }


def vendor_times(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int, int, int], float]:
    """(dtype, M, N, K) -> the best vendor's median µs timed beside the pure read."""
    return {
        (r["target"]["dtype"], r["target"]["m"], r["target"]["n"], r["target"]["k"]): r["vendor"][
            "median_us"
        ]
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


# -- the whole decode step (bench/experiments/kv_decode_profile.py) ----------------------

# Llama-3.1-8B's LM head: vocabulary x hidden, read once per decode step.
LM_HEAD_NK = (128256, 4096)


def decode_ceiling_rows(
    profile: Mapping[str, Any],
    reads: Mapping[tuple[str, int, int, int], float],
    read_tbps: float,
    bench_ms: Mapping[str, Mapping[str, float]] | None = None,
    targets: Mapping[str, float] | None = None,
    vendors: Mapping[tuple[str, int, int, int], float] | None = None,
) -> list[dict[str, Any]]:
    """Per profiled batch of a whole compiled decode step (``kv_decode_profile.py``): the
    GEMMs' pure-read time (32 layers' four GEMMs from ``reads`` at M = batch, plus the LM
    head's bytes at ``read_tbps``, the fastest pure read measured), the patched step's
    other kernels, and two ceilings on the speedup patching can give, each the unpatched
    step over a patched step whose GEMMs run as fast as a pure read: ``ceiling`` keeps the
    patched step's other kernels (attention, RoPE, the cache writes: identical in both
    models but for what the fusions removed), ``ceiling_attention_only`` only its
    attention. ``ceiling_bench`` takes the unpatched step from the benchmark (``bench_ms``:
    batch -> {"unpatched": ms per step}, no profiler) instead of the profiled span.
    ``gemm_fraction_needed``: how close to a pure read (reads / GEMM time) the patched
    GEMMs must come for ``targets[batch]`` with today's other kernels (> 1: beyond
    physics), ``gemm_fraction_now`` what they reach in the benchmark's patched step.
    ``vendor_fraction``: the same for the best vendor kernel of each of the
    layer's GEMMs timed beside its pure read (``vendors``), what the fastest measured
    kernels reach in isolation."""
    out = []
    shape = layer_shape("llama-3.1-8b")
    layers = profile["layers"]
    for b, case in sorted(profile["batches"].items(), key=lambda x: int(x[0])):
        m = int(b)
        keys = [("fp16", m, n, k) for n, k in shape.gemms().values()]
        if not all(key in reads for key in keys):
            continue
        head_us = 2 * LM_HEAD_NK[0] * LM_HEAD_NK[1] / (read_tbps * 1e6)
        read = layers * sum(reads[key] for key in keys) + head_us
        u = by_role(case["unpatched"], "us_per_step")
        p = by_role(case["patched"], "us_per_step")
        rest = sum(us for r, us in p.items() if r != "gemm")
        span_u, span_p = case["unpatched"]["span_us"], case["patched"]["span_us"]
        row = {
            "batch": m,
            "unpatched_span_us": span_u,
            "patched_span_us": span_p,
            "profiled_speedup": span_u / span_p,
            "unpatched_gemm_us": u["gemm"],
            "patched_gemm_us": p["gemm"],
            "read_us": read,
            "patched_rest_us": rest,
            "attention_us": p["attention"],
            "ceiling": span_u / (read + rest),
            "ceiling_attention_only": span_u / (read + p["attention"]),
        }
        if vendors and all(key in vendors for key in keys):
            row["vendor_fraction"] = sum(reads[k] for k in keys) / sum(vendors[k] for k in keys)
        if bench_ms and b in bench_ms:
            bench_u = bench_ms[b]["unpatched"] * 1e3
            row["bench_unpatched_us"] = bench_u
            row["ceiling_bench"] = bench_u / (read + rest)
            if "patched" in bench_ms[b]:  # what the patched GEMMs reach today
                row["gemm_fraction_now"] = read / (bench_ms[b]["patched"] * 1e3 - rest)
            if targets and b in targets:
                row["target"] = targets[b]
                gemm_budget = bench_u / targets[b] - rest
                row["gemm_fraction_needed"] = read / gemm_budget if gemm_budget > 0 else None
        out.append(row)
    return out
