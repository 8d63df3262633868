"""Where the host time of a patched transformers Llama's eager decode forward goes:
cProfile of a few forwards (2 decoder layers of Llama-3.1-8B's dimensions, fp16, batch
1), patched and unpatched, top functions by own time.

    python bench/experiments/profile_patched.py --package PKG
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import pstats
import time

import _llama  # bench/experiments/_llama.py (this folder is on sys.path)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--package", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--forwards", type=int, default=20)
    args = ap.parse_args()
    import torch

    pkg = importlib.import_module(args.package)
    cfg = _llama.config(args.layers)
    model = _llama.model(cfg)
    patched, _ = _llama.patched_copy(model, pkg)
    pkg.warmup()
    ids = torch.randint(0, cfg.vocab_size, (1, 1), device="cuda")
    for name, m in (("unpatched", model), ("patched", patched)):
        with torch.no_grad():
            for _ in range(3):
                m(ids, use_cache=False)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.forwards):
                m(ids, use_cache=False)
            torch.cuda.synchronize()
            per = (time.perf_counter() - t0) / args.forwards * 1e3
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.forwards):
                m(ids, use_cache=False)
            prof.disable()
            torch.cuda.synchronize()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
        print(f"=== {name}: {per:.2f} ms per forward ({args.layers} layers)")
        print("\n".join(out.getvalue().splitlines()[:45]))
    print(pkg.stats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
