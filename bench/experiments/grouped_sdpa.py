"""Grouped decode attention against transformers' path, alone (issue 21): where does
``patch_model(grouped_decode="sdpa")``'s SDPA over the grouped KV heads beat what
transformers runs under ``torch.compile`` (``repeat_kv``: a copy of every KV head per
query head, then SDPA over all query heads)?

One decode step's attention for ``--layers`` layers (each its own static-cache K/V of
``--context`` + 32 positions, the first ``--context`` + 1 attended: a bool mask [b, 1, 1,
kv], as transformers' static cache gives SDPA), per batch and per head layout (Llama-3.1-8B
32/8/128, Qwen2-7B 28/4/128): both variants compiled (``torch.compile(fullgraph=True)``),
the layers' calls captured in one CUDA graph per variant, replays timed with CUDA events,
the two variants interleaved in random order, ``--reps`` medians. The outputs of the two
are compared (max |diff|, fp16). The grouped variant is ``_grouped_decode_sdpa`` of the
package runtime's ``models`` module, transformers' is its own ``sdpa_attention_forward``.

    python bench/experiments/grouped_sdpa.py --out out/grouped-sdpa.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

LAYOUTS = {"llama-3.1-8b": (32, 8, 128), "qwen2-7b": (28, 4, 128)}


class _Attn:
    """What transformers' sdpa_attention_forward reads of the attention module."""

    def __init__(self, groups: int) -> None:
        self.num_key_value_groups = groups
        self.is_causal = True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--replays", type=int, default=10, help="graph replays per timed rep")
    ap.add_argument(
        "--math", action="store_true", help="a third variant: the grouped heads' attention as "
        "two matmuls and a softmax (_grouped_decode_math)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    import torch
    import transformers
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from cudal2.packaging.runtime.models import _grouped_decode_sdpa

    try:  # the matmul-and-softmax form, where this checkout has it
        from cudal2.packaging.runtime.models import _grouped_decode_math
    except ImportError:
        _grouped_decode_math = None
    if args.math and _grouped_decode_math is None:
        ap.error("--math: this checkout's runtime has no _grouped_decode_math")

    dev = torch.device("cuda")
    for name in ("recompile_limit", "cache_size_limit"):  # one compile per batch and layout
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
    batches = [int(b) for b in args.batches.split(",")]
    length = args.context + 32
    rows = []
    torch.manual_seed(0)
    for layout, (heads, kv_heads, d) in LAYOUTS.items():
        attn = _Attn(heads // kv_heads)
        scaling = d**-0.5

        def hf(q: Any, k: Any, v: Any, mask: Any, attn: Any = attn, scaling: float = scaling):
            return sdpa_attention_forward(attn, q, k, v, mask, scaling=scaling)[0]

        def grouped(q: Any, k: Any, v: Any, mask: Any, scaling: float = scaling):
            return _grouped_decode_sdpa(torch, q, k, v, mask, scaling)

        def grouped_math(q: Any, k: Any, v: Any, mask: Any, scaling: float = scaling):
            return _grouped_decode_math(torch, q, k, v, mask, scaling)

        fns = {
            "transformers": torch.compile(hf, fullgraph=True, dynamic=False),
            "grouped": torch.compile(grouped, fullgraph=True, dynamic=False),
        }
        if args.math:
            fns["grouped_math"] = torch.compile(grouped_math, fullgraph=True, dynamic=False)
        for b in batches:
            t0 = time.monotonic()
            q = torch.randn(b, heads, 1, d, device=dev, dtype=torch.float16)
            kv = [
                (
                    torch.randn(b, kv_heads, length, d, device=dev, dtype=torch.float16),
                    torch.randn(b, kv_heads, length, d, device=dev, dtype=torch.float16),
                )
                for _ in range(args.layers)
            ]
            mask = torch.zeros(b, 1, 1, length, dtype=torch.bool, device=dev)
            mask[..., : args.context + 1] = True
            outs, graphs = {}, {}
            for name, fn in fns.items():
                for _ in range(2):  # compile, then warm
                    fn(q, *kv[0], mask)
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    got = [fn(q, k, v, mask) for k, v in kv]
                g.replay()  # a capture runs nothing: the outputs are written by a replay
                graphs[name], outs[name] = g, got
            torch.cuda.synchronize()
            diff = {
                name: max(
                    (a.float() - c.float()).abs().max().item()
                    for a, c in zip(outs["transformers"], outs[name], strict=True)
                )
                for name in outs
                if name != "transformers"
            }
            times: dict[str, list[float]] = {n: [] for n in graphs}
            rng = random.Random(b)
            for rep in range(args.reps + 1):
                order = list(graphs)
                rng.shuffle(order)
                for name in order:
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(args.replays):
                        graphs[name].replay()
                    end.record()
                    end.synchronize()
                    if rep:  # the first round warms
                        times[name].append(start.elapsed_time(end) * 1e3 / args.replays)
            med = {n: statistics.median(v) for n, v in times.items()}
            ratio = sorted(
                t / g for t, g in zip(times["transformers"], times["grouped"], strict=True)
            )
            row = {
                "layout": layout,
                "heads": [heads, kv_heads, d],
                "batch": b,
                "kv_rows": b * kv_heads,
                "us_per_step": {n: round(t, 1) for n, t in med.items()},
                "speedup_grouped": round(med["transformers"] / med["grouped"], 4),
                "paired_p20_p80": [
                    round(ratio[len(ratio) // 5], 4),
                    round(ratio[4 * len(ratio) // 5], 4),
                ],
                "max_abs_diff": round(diff["grouped"], 5),
                "wall_s": round(time.monotonic() - t0, 1),
            }
            if "grouped_math" in times:
                row["speedup_grouped_math"] = round(med["transformers"] / med["grouped_math"], 4)
                row["max_abs_diff_math"] = round(diff["grouped_math"], 5)
            rows.append(row)
            print(json.dumps(row), flush=True)
            del kv, graphs, outs
            torch.cuda.empty_cache()
    result = {
        "env": {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "layers": args.layers,
            "context": args.context,
            "cache_length": length,
            "reps": args.reps,
            "replays": args.replays,
        },
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    head = ("layout", "batch", "kv rows", "transformers us", "grouped us", "x", "math us", "x")
    print("{:14} {:>5} {:>7} {:>16} {:>11} {:>6} {:>8} {:>6}".format(*head))
    for r in rows:
        u = r["us_per_step"]
        math = f" {u['grouped_math']:8.1f} {r['speedup_grouped_math']:6.3f}" if args.math else ""
        print(
            f"{r['layout']:14} {r['batch']:5d} {r['kv_rows']:7d} {u['transformers']:16.1f} "
            f"{u['grouped']:11.1f} {r['speedup_grouped']:6.3f}{math}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
