"""End to end: a transformers Llama with Llama-3.1-8B's dimensions, patched vs unpatched.

The model is ``LlamaForCausalLM`` built from ``manifests/configs/llama-3.1-8b/config.json``
(``--layers`` of its 32 decoder layers; random fp16 weights, seeded), run with
``use_cache=False`` on ``input_ids`` of shape [batch, 1] for decode batches and
[1, tokens] for the prefill, so each linear layer runs M = batch (or tokens) rows.
The patched model is a second module tree sharing the same parameters, whose covered
``nn.Linear`` layers ``patch_linear`` routed through the wheel's op.

Correctness: logits of the unpatched and patched fp16 models against an fp32 model with
the same (fp16-valued) weights. The patched model passes when its max |error| against
fp32 is at most ``TOLERANCE`` times the unpatched model's: both are fp16 models with
fp32-accumulating GEMMs that round differently (tile order, split-K), so the wheel must
not be further from the exact result than torch's own fp16 model is.

Timing (``cudal2.verify.timing``, the models interleaved in one process): eager
forwards from an idle GPU (``time_eager``: L2 flushed, GPU idle, host launches
included), eager forwards back to back (10 queued, one synchronise), and CUDA-graph
replays (``time_interleaved`` offline: a graph of forwards over two input sets). With
the native launcher, a third model runs the same patch on the Python launch path
(patched and run with ``CUDAL2_NATIVE=0``). Then ``torch.compile(fullgraph=True)`` of
the patched model must run and match.

    python bench/experiments/llama_e2e.py --package cudal2_kernels_llama_3_1_8b_hf_h100 \\
        --out bench/results/h100-llama-e2e.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import random
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import _llama  # bench/experiments/_llama.py (this folder is on sys.path)

from cudal2.verify.timing import TimingConfig, time_eager, time_interleaved

TOLERANCE = 2.0
CASES = (("decode", 1), ("decode", 16), ("decode", 64), ("decode", 256), ("prefill", 2048))


def _ids(torch, kind: str, n: int, vocab: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (n, 1) if kind == "decode" else (1, n)
    return torch.randint(0, vocab, shape, generator=g, device="cuda")


@contextlib.contextmanager
def _python_path() -> Iterator[None]:
    """``CUDAL2_NATIVE=0`` inside: the wheel's Python launch path."""
    os.environ["CUDAL2_NATIVE"] = "0"
    try:
        yield
    finally:
        del os.environ["CUDAL2_NATIVE"]


def _back_to_back(torch, variants: dict, reps: int, forwards: int = 10) -> dict:
    """Eager forwards back to back (``forwards`` queued, then one synchronise), the
    variants interleaved in random order: median ms per forward and the speedups. The
    host's launch rate, not an idle GPU's ramp, decides these figures."""
    rng = random.Random(0)
    times: dict[str, list[float]] = {name: [] for name in variants}
    with torch.no_grad():
        for fn in variants.values():
            fn()
        for _ in range(reps):
            order = list(variants)
            rng.shuffle(order)
            for name in order:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(forwards):
                    variants[name]()
                torch.cuda.synchronize()
                times[name].append((time.perf_counter() - t0) / forwards * 1e3)
    med = {name: round(statistics.median(v), 3) for name, v in times.items()}
    out: dict = {"ms_per_forward": med}
    out["speedup"] = round(med["unpatched"] / med["patched"], 4)
    if "patched_python" in med:
        out["speedup_python"] = round(med["unpatched"] / med["patched_python"], 4)
    # Paired per repetition (each repetition runs every variant moments apart, so the
    # GPU's clock state is shared): unpatched / patched, median and p20-p80.
    ratio = sorted(u / p for u, p in zip(times["unpatched"], times["patched"], strict=True))
    out["paired_speedup"] = round(statistics.median(ratio), 4)
    out["paired_p20_p80"] = [
        round(ratio[len(ratio) // 5], 4),
        round(ratio[(4 * len(ratio)) // 5], 4),
    ]
    out["p20_p80_ms"] = {
        name: [round(sorted(v)[len(v) // 5], 3), round(sorted(v)[(4 * len(v)) // 5], 3)]
        for name, v in times.items()
    }
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--package", required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument(
        "--tokens",
        type=lambda v: {int(t) for t in v.split(",")},
        default=None,
        help="only these cases' token counts, e.g. 2048 (default: every case)",
    )
    args = ap.parse_args()

    import torch

    pkg = importlib.import_module(args.package)
    cfg = _llama.config(args.layers)
    started = time.monotonic()
    model = _llama.model(cfg)
    ref = _llama.model(cfg, torch.float32)
    ref.load_state_dict(model.state_dict())  # fp32 copies of the fp16 weights
    patched, patch = _llama.patched_copy(model, pkg)  # new modules, the same parameters
    # The same patch on the Python launch path (patched with CUDAL2_NATIVE=0, run with
    # it set): both launch paths and the unpatched model in one process.
    native = pkg._api.launcher == "native"
    with _python_path():
        patched_py, patch_py = _llama.patched_copy(model, pkg)
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    print(
        f"model: {args.layers} layers, {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B "
        f"parameters, {len(patch.names)} of {linears} linear layers patched "
        f"({time.monotonic() - started:.0f} s)",
        flush=True,
    )
    warmed = pkg.warmup()
    gpu = torch.cuda.get_device_name()
    result: dict = {
        "gpu": gpu,
        "torch": torch.__version__,
        "package": args.package,
        "layers": args.layers,
        "patched_layers": len(patch.names),
        "linear_layers": linears,
        "warmed_entries": warmed,
        "launcher": pkg._api.launcher,
        "native_reason": pkg._api.native_reason,
        "tolerance": TOLERANCE,
        "cases": [],
    }
    vocab = cfg.vocab_size
    tcfg = TimingConfig(reps=args.reps, warmup=2, mode="offline")
    for kind, n in [c for c in CASES if args.tokens is None or c[1] in args.tokens]:
        ids = [_ids(torch, kind, n, vocab, s) for s in (1, 2)]
        with torch.no_grad():
            want = ref(ids[0], use_cache=False).logits.float()
            plain = model(ids[0], use_cache=False).logits.float()
            pkg.stats.reset()
            got = patched(ids[0], use_cache=False).logits.float()
            hits = dict(pkg.stats.hits)
            fallbacks = dict(pkg.stats.fallbacks)
            err_plain = (plain - want).abs().max().item()
            err_patched = (got - want).abs().max().item()
            case = {
                "kind": kind,
                "tokens": n,
                "max_abs_logit": round(want.abs().max().item(), 4),
                "err_unpatched_vs_fp32": round(err_plain, 5),
                "err_patched_vs_fp32": round(err_patched, 5),
                "max_diff_patched_vs_unpatched": round((got - plain).abs().max().item(), 5),
                "ok": err_patched <= TOLERANCE * err_plain,
                "hits": hits,
                "fallbacks": fallbacks,
            }
            del want, plain, got
            variants = {
                "unpatched": lambda ids=ids: model(ids[0], use_cache=False),
                "patched": lambda ids=ids: patched(ids[0], use_cache=False),
            }
            if native:  # "patched" is the native path; this one today's Python path

                def python_path(ids=ids):
                    with _python_path():
                        return patched_py(ids[0], use_cache=False)

                variants["patched_python"] = python_path
            eager = time_eager(variants, tcfg)
            b2b = _back_to_back(torch, variants, args.reps)
            graphs = time_interleaved(
                {
                    "unpatched": lambda j, ids=ids: model(ids[j], use_cache=False),
                    "patched": lambda j, ids=ids: patched(ids[j], use_cache=False),
                },
                2,
                tcfg,
                est_us=1e4,
            )
        for mode, t in (("eager", eager), ("graph", graphs)):
            case[mode] = {name: round(x.median_us, 1) for name, x in t.items()}
            case[mode]["speedup"] = round(t["unpatched"].median_us / t["patched"].median_us, 4)
            if "patched_python" in t:
                case[mode]["speedup_python"] = round(
                    t["unpatched"].median_us / t["patched_python"].median_us, 4
                )
            case[mode]["spread"] = {name: round(x.spread, 4) for name, x in t.items()}
        case["back_to_back"] = b2b
        result["cases"].append(case)
        print(json.dumps({k: v for k, v in case.items() if k not in ("hits",)}), flush=True)
        torch.cuda.empty_cache()
    del ref
    torch.cuda.empty_cache()
    if not args.no_compile:
        # Inductor fuses and reorders the non-GEMM ops (norms, rotary, softmax), which
        # changes rounding by itself: the unpatched model is compiled too, so the
        # patched model's compiled-vs-eager difference has its yardstick.
        compiled = {
            "patched": torch.compile(patched, fullgraph=True),
            "unpatched": torch.compile(model, fullgraph=True),
        }
        checks = []
        for kind, n in (("decode", 16), ("prefill", 2048)):
            ids = _ids(torch, kind, n, vocab, 3)
            row: dict = {"kind": kind, "tokens": n}
            with torch.no_grad():
                eager = {
                    "patched": patched(ids, use_cache=False).logits.float(),
                    "unpatched": model(ids, use_cache=False).logits.float(),
                }
                outs = {}
                for name, fn in compiled.items():
                    t0 = time.monotonic()
                    pkg.stats.reset()
                    outs[name] = fn(ids, use_cache=False).logits.float()
                    row[f"first_call_s_{name}"] = round(time.monotonic() - t0, 1)
                    if name == "patched":
                        row["op_calls_in_compiled"] = sum(pkg.stats.hits.values()) + sum(
                            pkg.stats.fallbacks.values()
                        )
                        row["kernel_hits_in_compiled"] = sum(pkg.stats.hits.values())
            for name in compiled:
                diff = (outs[name] - eager[name]).abs().max().item()
                row[f"max_diff_compiled_vs_eager_{name}"] = round(diff, 5)
            row["max_diff_compiled_patched_vs_compiled_unpatched"] = round(
                (outs["patched"] - outs["unpatched"]).abs().max().item(), 5
            )
            row["ok"] = row["max_diff_compiled_vs_eager_patched"] <= TOLERANCE * max(
                row["max_diff_compiled_vs_eager_unpatched"], 1e-3
            ) and row["op_calls_in_compiled"] == len(patch.names)
            checks.append(row)
            print(json.dumps(row), flush=True)
        result["compile"] = checks
    patch.restore()
    patch_py.restore()
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
