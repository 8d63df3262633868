"""Where a decoder layer's time goes: per-kernel GPU time of the vendor layer and the
cudal2 layer of the layer benchmark (``cudal2.bench.layer``), under CUDA-graph replay.

Per case (model x dtype x M): the same ``sets`` layers as ``cudal2-bench layer`` builds,
each variant captured as one CUDA graph of ``sets`` back-to-back layer calls, replayed
``--reps`` times under ``torch.profiler`` (CUDA activity only). Each kernel's device time
is summed by name and divided by the calls: µs per layer. Kernels are grouped by role
(``cudal2.bench.layer_profile.role``: GEMM, attention, elementwise, copy) from their
names; the layer's span (first
kernel start to last kernel end of a replay, per call) is reported beside the kernels'
sum, so the difference says how much ran overlapped (PDL) or idle (launch gaps).

  python bench/experiments/layer_profile.py --package PKG --out profile.json
    [--model llama-3.1-8b] [--dtype fp16] [--m 1 16 64] [--reps 5]

Profiling adds its own overhead per kernel: the absolute µs are a little above the
benchmark's; the shares and the differences between variants are what this is for.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from cudal2.bench.layer import (
    Cudal2Layer,
    Pieces,
    VendorLayer,
    layer_shape,
    make_state,
    make_weights,
)
from cudal2.bench.layer_profile import kernel_table, profiled_kernels
from cudal2.bench.layer_run import _dtype
from cudal2.verify.timing import operand_sets


def profile_case(pkg: Any, model: str, dtype: str, m: int, reps: int) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    shape = layer_shape(model)
    tdt = _dtype(dtype)
    itemsize = torch.empty((), dtype=tdt).element_size()
    nsets = operand_sets(shape.weight_bytes(itemsize) + shape.cache_bytes(m, itemsize))
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = [make_weights(shape, tdt, "cuda", gen) for _ in range(nsets)]
    states = [make_state(shape, m, tdt, "cuda", gen) for _ in range(nsets)]
    pieces = Pieces.make(True)
    layers = {
        "vendor": [VendorLayer(shape, w, pieces) for w in weights],
        "cudal2": [Cudal2Layer(shape, w, pieces, pkg) for w in weights],
    }
    out: dict[str, Any] = {"model": model, "dtype": dtype, "m": m, "sets": nsets}
    with torch.no_grad():
        graphs = {}
        for name, ls in layers.items():
            for j in range(nsets):  # warm: compile, load modules
                ls[j](states[j])
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for j in range(nsets):
                    ls[j](states[j])
            graphs[name] = g
        for name, g in graphs.items():
            for _ in range(3):
                g.replay()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    g.replay()
                torch.cuda.synchronize()
            out[name] = kernel_table(profiled_kernels(prof), reps * nsets, "layer")
    del graphs, layers, weights, states
    torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", required=True)
    ap.add_argument("--model", nargs="+", default=["llama-3.1-8b"])
    ap.add_argument("--dtype", nargs="+", default=["fp16"])
    ap.add_argument("--m", nargs="+", type=int, default=[1, 16, 64])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    import torch

    pkg = importlib.import_module(a.package)
    doc: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "package": a.package,
        "launcher": getattr(getattr(pkg, "_api", None), "launcher", None),
        "cases": [],
    }
    for model in a.model:
        for dtype in a.dtype:
            for m in a.m:
                case = profile_case(pkg, model, dtype, m, a.reps)
                doc["cases"].append(case)
                v, c = case["vendor"], case["cudal2"]
                print(
                    f"{model} {dtype} M={m}: span vendor {v['span_us']} cudal2 {c['span_us']}"
                    f" | kernels {v['kernel_sum_us']} / {c['kernel_sum_us']}"
                    f" | launches {v['launches_per_layer']} / {c['launches_per_layer']}"
                )
                for name in ("vendor", "cudal2"):
                    print(f"  {name}: {case[name]['by_role_us']}")
                    for r in case[name]["kernels"][:12]:
                        print(
                            f"    {r['us_per_layer']:8.2f} x{r['launches_per_layer']:<5} "
                            f"{r['role'][:10]:10} {r['kernel'][:110]}"
                        )
                with open(a.out, "w") as f:
                    json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
