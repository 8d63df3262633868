"""Where an eager forward's time goes, patched against unpatched: one Llama-3.1-8B
forward (``--layers``, ``--tokens`` decode rows) under ``torch.profiler`` with CUDA
activity, per model: the forward's wall span, the GPU's busy time (kernels), its idle
gaps, and the kernels grouped by name (count, total and median µs). Made to find the
milliseconds the native launcher still loses at 64 and 256 decode tokens
(docs/inference.md, "Where it does not yet"): host time shows as GPU idle gaps, slower
kernels as kernel time.

    python bench/experiments/eager_trace.py --package PKG --tokens 64 --out trace-64.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
from collections import defaultdict
from pathlib import Path

import _llama  # bench/experiments/_llama.py (this folder is on sys.path)


def _summary(prof) -> dict:
    """Kernel intervals of one profiled forward: busy, idle gaps, per-name groups."""
    kernels = [
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start
    ]
    kernels.sort()
    busy, gaps = 0.0, []
    lo = hi = None  # the current run of overlapping kernels
    for start, stop, _ in kernels:
        if hi is None:
            lo, hi = start, stop
        elif start > hi:
            busy += hi - lo
            gaps.append(start - hi)
            lo, hi = start, stop
        else:
            hi = max(hi, stop)
    if hi is not None:
        busy += hi - lo
    groups: dict[str, list[float]] = defaultdict(list)
    for start, stop, name in kernels:
        groups[name[:80]].append(stop - start)
    top = sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:15]
    return {
        "span_us": round(kernels[-1][1] - kernels[0][0], 1) if kernels else 0.0,
        "kernels": len(kernels),
        "busy_us": round(busy, 1),
        "gaps": len(gaps),
        "gap_us": round(sum(gaps), 1),
        "gaps_over_20us": sum(g > 20 for g in gaps),
        "by_kernel": {
            name: {
                "count": len(d),
                "total_us": round(sum(d), 1),
                "median_us": round(statistics.median(d), 2),
            }
            for name, d in top
        },
    }


def _group(durations: list[float]) -> dict:
    return {
        "count": len(durations),
        "total_us": round(sum(durations), 1),
        "median_us": round(statistics.median(durations), 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--package", required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    pkg = importlib.import_module(args.package)
    cfg = _llama.config(args.layers)
    model = _llama.model(cfg)
    patched, patch = _llama.patched_copy(model, pkg)
    pkg.warmup()
    ids = torch.randint(0, cfg.vocab_size, (args.tokens, 1), device="cuda")
    out: dict = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "launcher": pkg._api.launcher,
        "tokens": args.tokens,
        "layers": args.layers,
    }
    with torch.no_grad():
        for name, m in (("unpatched", model), ("patched", patched)):
            for _ in range(3):
                m(ids, use_cache=False)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                m(ids, use_cache=False)
                torch.cuda.synchronize()
            out[name] = _summary(prof)
            print(name, {k: v for k, v in out[name].items() if k != "by_kernel"}, flush=True)
    out["stats"] = pkg.stats.as_dict()
    patch.restore()
    Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
