"""Where the host time of a patched transformers Llama's eager decode forward goes:
cProfile of a few forwards (2 decoder layers of Llama-3.1-8B's dimensions, fp16, batch
1), patched and unpatched, top functions by own time.

    python bench/experiments/profile_patched.py --package PKG
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import importlib
import io
import pstats
import time
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[2] / "manifests/configs/llama-3.1-8b"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--package", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--forwards", type=int, default=20)
    args = ap.parse_args()
    import torch
    from transformers import AutoConfig, LlamaForCausalLM

    pkg = importlib.import_module(args.package)
    cfg = AutoConfig.from_pretrained(str(CONFIG), local_files_only=True)
    cfg.num_hidden_layers = args.layers
    with torch.device("cuda"):
        torch.set_default_dtype(torch.float16)
        model = LlamaForCausalLM(cfg).eval()
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    patched = copy.deepcopy(model, shared)
    pkg.patch_linear(patched)
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
