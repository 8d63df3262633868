"""Where a whole decode step's time goes, and how far issue 21's end-to-end targets are from
physics: per-kernel GPU time of one Llama-3.1-8B decode step (32 layers, static cache over
a 1,024-token context, the LM head), unpatched and patched, each compiled with
``torch.compile(mode="reduce-overhead")`` as ``llama_kv_e2e.py --part graph`` runs them, under
``torch.profiler`` (CUDA activity only) over ``--steps`` graph replays.

Per batch and variant: every kernel's µs per step (summed by name), grouped by role
(``cudal2.bench.layer_profile.role``), the kernels' sum and the steps' span (first kernel
start to last kernel end, per step: it includes the host's gaps between replays). The
ceiling (``cudal2.bench.decode_ceiling``) then sets the unpatched step beside a step whose
GEMMs run as fast as a pure read of their bytes (``bench/results/h100-read-ceiling.jsonl``).

  python bench/experiments/kv_decode_profile.py --package PKG --out decode-profile.json
    [--batches 1,16,64] [--steps 8]

Profiling adds its own overhead per kernel: the absolute µs are a little above the
benchmark's; the shares and the differences between variants are what this is for.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import llama_kv_e2e as e2e  # this folder is on sys.path when run as a script

from cudal2.bench.layer_profile import kernel_table, profiled_kernels


def profile_steps(s: e2e.Setup, fn: Any, cache: Any, ids: Any, steps: int) -> dict[str, Any]:
    """Per-kernel µs per step of ``steps`` compiled decode steps (graph replays)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        for _ in range(3):  # warm: the graph recorded and replayed
            e2e.rewind(cache, s.context)
            torch.compiler.cudagraph_mark_step_begin()
            fn(ids)
        torch.cuda.synchronize()
        e2e.rewind(cache, s.context)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            x = ids
            for _ in range(steps):
                torch.compiler.cudagraph_mark_step_begin()
                x = fn(x).argmax(-1)
            torch.cuda.synchronize()
    return kernel_table(profiled_kernels(prof), steps, "step")


def profile_batch(s: e2e.Setup, model: Any, patched: Any, batch: int, steps: int) -> dict:
    import torch

    out: dict[str, Any] = {"batch": batch, "steps": steps}
    ids = torch.zeros((batch, 1), dtype=torch.long, device=s.device)
    for name, m in (("unpatched", model), ("patched", patched)):
        t0 = time.monotonic()
        cache = e2e.static_cache(s, m, batch, s.context + steps + 8, s.context)
        fn = torch.compile(
            e2e.step_fn(m, cache), mode="reduce-overhead", fullgraph=True, dynamic=False
        )
        out[name] = profile_steps(s, fn, cache, ids, steps)
        out[name]["compile_and_profile_s"] = round(time.monotonic() - t0, 1)
        del fn, cache
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--batches", type=lambda v: [int(x) for x in v.split(",")], default=[1, 16, 64])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument(
        "--rope-kv", action="store_true", help="the patched model is patch_model(rope_kv=True)'s"
    )
    ap.add_argument(
        "--grouped-decode", action="store_true", help="and patch_model(grouped_decode=True)'s"
    )
    a = ap.parse_args(argv)
    args = argparse.Namespace(
        package=a.package,
        layers=a.layers,
        dry_run=False,
        device="cuda",
        steps=a.steps,
        rope_kv=a.rope_kv,
        grouped_decode=a.grouped_decode,
    )
    s = e2e.Setup(args)
    torch = s.torch
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
    model = e2e.build(s, s.config())
    patched, patch = e2e.patched_copy(s, model)
    doc: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "package": a.package,
        "launcher": s.pkg._api.launcher,
        "layers": a.layers,
        "rope_kv": a.rope_kv,
        "grouped_decode": a.grouped_decode,
        "context": s.context,
        "warmed_entries": s.pkg.warmup(),
        "batches": {},
    }
    for batch in a.batches:
        case = profile_batch(s, model, patched, batch, a.steps)
        doc["batches"][str(batch)] = case
        for name in ("unpatched", "patched"):
            v = case[name]
            print(
                f"batch {batch} {name}: span {v['span_us']} µs/step (idle {v['idle_us']}),"
                f" kernels {v['kernel_sum_us']},"
                f" launches {v['launches_per_step']} | {v['by_role_us']}",
                flush=True,
            )
            for r in v["kernels"][:14]:
                print(
                    f"    {r['us_per_step']:9.2f} x{r['launches_per_step']:<6} "
                    f"{r['role'][:10]:10} {r['kernel'][:100]}"
                )
        e2e.write_json(a.out, doc)
    patch.restore()
    return 0


if __name__ == "__main__":
    sys.exit(main())
