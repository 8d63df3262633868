"""Host time of an eager forward, patched against unpatched, with the GPU out of the
picture: before each forward the GPU is held busy (``torch.cuda._sleep``) long enough
that every launch of the forward only queues, and the host's time to issue the whole
forward is measured (then one synchronise). Variants interleaved in random order per
repetition; the paired ratio unpatched / patched per repetition, its median and p20-p80.

Then the same per linear shape of the model: one layer's ``nn.Linear`` of each (N, K),
patched and unpatched, ``--calls`` calls back to back while the GPU spins, with the
table's answer for that M (kernel, cuBLASLt entry, or torch's own call): which path of
the patched forward costs what on the host.

Made to explain the eager decode figures at 64 and 256 tokens (docs/inference.md):
if the patched forward issues faster but runs slower back to back, its kernels are the
difference; if it issues slower, the host path is.

    python bench/experiments/eager_host.py --package PKG --out eager-host.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import statistics
import time
from pathlib import Path

import _llama  # bench/experiments/_llama.py (this folder is on sys.path)


def _q(v: list[float], f: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(f * len(s)))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--package", required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--tokens", default="1,16,64,256")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch

    pkg = importlib.import_module(args.package)
    cfg = _llama.config(args.layers)
    model = _llama.model(cfg)
    patched, patch = _llama.patched_copy(model, pkg)
    pkg.warmup()
    kinds = {str(e.key): f"{e.kind} {e.kernel or ''}".strip() for e in pkg._api.table.entries}
    variants = {"unpatched": model, "patched": patched}
    rng = random.Random(0)
    out: dict = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "launcher": pkg._api.launcher,
        "layers": args.layers,
        "reps": args.reps,
        "forward": {},
        "linear": {},
    }
    tokens = [int(t) for t in args.tokens.split(",")]
    with torch.no_grad():
        for m in tokens:
            ids = torch.randint(0, cfg.vocab_size, (m, 1), device="cuda")
            for v in variants.values():  # warm: allocator, tables, per-size memos
                for _ in range(2):
                    v(ids, use_cache=False)
            torch.cuda.synchronize()
            host = {name: [] for name in variants}
            for _ in range(args.reps):
                order = list(variants)
                rng.shuffle(order)
                for name in order:
                    torch.cuda.synchronize()
                    torch.cuda._sleep(200_000_000)  # ~0.1 s: the forward only queues
                    t0 = time.perf_counter()
                    variants[name](ids, use_cache=False)
                    host[name].append((time.perf_counter() - t0) * 1e3)
                    torch.cuda.synchronize()
            ratio = [u / p for u, p in zip(host["unpatched"], host["patched"], strict=True)]
            out["forward"][m] = {
                "host_ms": {k: round(statistics.median(v), 3) for k, v in host.items()},
                "host_p20_p80_ms": {
                    k: [round(_q(v, 0.2), 3), round(_q(v, 0.8), 3)] for k, v in host.items()
                },
                "paired_unpatched_over_patched": round(statistics.median(ratio), 4),
                "paired_p20_p80": [round(_q(ratio, 0.2), 4), round(_q(ratio, 0.8), 4)],
            }
            print(m, out["forward"][m], flush=True)
            # Per linear shape of layer 0 (and the LM head): host us per call.
            layer_p = patched.model.layers[0]
            layer_u = model.model.layers[0]
            mods = {
                n: (getattr(layer_u.self_attn, n, None) or getattr(layer_u.mlp, n),
                    getattr(layer_p.self_attn, n, None) or getattr(layer_p.mlp, n))
                for n in ("q_proj", "k_proj", "o_proj", "gate_proj", "down_proj")
            }  # fmt: skip
            mods["lm_head"] = (model.lm_head, patched.lm_head)
            per: dict = {}
            for name, (mu, mp) in mods.items():
                x = torch.randn(m, mu.in_features, device="cuda", dtype=torch.float16)
                before = pkg.stats.as_dict()
                mp(x)
                after = pkg.stats.as_dict()
                served = _served(before, after, kinds)
                times = {"unpatched": [], "patched": []}
                for _ in range(max(5, args.reps // 3)):
                    for which, mod in rng.sample([("unpatched", mu), ("patched", mp)], 2):
                        torch.cuda.synchronize()
                        torch.cuda._sleep(100_000_000)
                        t0 = time.perf_counter()
                        for _ in range(args.calls):
                            mod(x)
                        times[which].append((time.perf_counter() - t0) / args.calls * 1e6)
                        torch.cuda.synchronize()
                per[name] = {
                    "n": mu.out_features,
                    "k": mu.in_features,
                    "served": served,
                    "host_us": {k: round(statistics.median(v), 2) for k, v in times.items()},
                }
            out["linear"][m] = per
            print(m, json.dumps(per), flush=True)
    out["stats"] = pkg.stats.as_dict()
    patch.restore()
    Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


def _served(before: dict, after: dict, kinds: dict[str, str]) -> str:
    """What served the one call between two stats snapshots: the entry hit (its kind
    and kernel) or the fallback reason."""
    for kind in ("hits", "fallbacks"):
        for key, n in after.get(kind, {}).items():
            if n > before.get(kind, {}).get(key, 0):
                return kinds.get(key, key) if kind == "hits" else f"fallback: {key}"
    return "?"


if __name__ == "__main__":
    raise SystemExit(main())
