"""End to end with a KV cache (issue 21): a transformers Llama with Llama-3.1-8B's
dimensions, unpatched against ``patch_model``, generating with transformers' static cache.

The models. ``LlamaForCausalLM`` from ``manifests/configs/llama-3.1-8b/config.json``
(``--layers`` of its 32 decoder layers), built on the GPU in fp16 with transformers' own
init (linear weights N(0, 0.02)), then the RMSNorm weights set to 1 + N(0, 0.1) (and
biases to N(0, 0.1)) so a wrong fold or a lost bias shows in the logits (seeded). The
patched model is a second module tree over the same parameters (``copy.deepcopy`` with
the parameters in the memo), patched with ``patch_model(originals="keep")``: the memory it
adds is only the packed qkv / gate_up weights. The Qwen2-style model (``--part qwen2``)
is ``Qwen2ForCausalLM`` from ``manifests/configs/qwen2-7b/config.json`` (Qwen2-7B: 28
layers, hidden 3584, its q/k/v bias: qkv runs ``linear_rmsnorm`` with the bias, epilogue
``rmsnorm_bias``), decode at batch 1. The wheel: bench/manifests/llama-e2e-h100.toml
(``epilogues = "auto"``), which covers both models' fused GEMMs and LM heads at the Ms run
here (decode 1, 16, 64; prefill 2,048; Qwen2-7B at 1).

The path per M. ``patch_model`` runs a layer fused where every fused GEMM of it has a
kernel entry at the call's M, else (originals kept) the layer's own forward: ``check``
and ``qwen2`` record ``paths`` (per M run here: how many layers took each path, and the
LM head's), from ``ModelPatch.report(ms=...)`` and the eager calls seen.

Decode (``graph``, ``eager``). A ``StaticCache`` per model and batch, of ``CONTEXT``
(1,024) + ``--steps`` tokens, its first 1,024 positions filled with random K/V (N(0, 1),
the cache's ``cumulative_length`` set to 1,024: the attention of every step reads the
whole 1,024-token context, as after a prefill, without paying a 65k-token prefill per
batch); then blocks of ``--steps`` decode steps (each feeds the argmax of the step
before), the cache rewound to 1,024 before each block. tokens/s = batch x steps / block
time (median of ``--reps`` blocks, the two models interleaved in random order).
``graph``: both models under ``torch.compile(mode="reduce-overhead", fullgraph=True)``
(inductor + CUDA graphs: the unpatched baseline is what a transformers user would run),
compiled once per batch size (a new cache object and static shapes: one compile, one
graph recording per model and batch; the compile time is reported); the compiled step's
logits are also checked against the same model's eager step. ``eager``: the same loops
without compile.

Prefill (``prefill``): one [1, ``--prefill``] forward into a fresh static cache, eager,
``logits_to_keep=1`` (the median of ``--reps``).

Correctness (``check``, and ``qwen2``): an fp32 copy of the fp16 model (same values) is
the reference: a [4, 128] prompt into a static cache, then 4 decode steps fed the
reference's tokens; every logit of the prefill and the steps compared. The patched model
passes when its max |error| against fp32 is at most ``TOLERANCE`` (2) times the unpatched
model's (today's e2e rule). ``qwen2`` also checks a [1, 128] prompt
(``correctness_b1``): the wheel's Qwen2 targets are at decode batch 1, so at 4 sequences
its layers may run their original modules. ``check`` also records the patch's memory
(``ModelPatch.memory()`` and ``torch.cuda.memory_allocated`` before / after), its
per-layer report (which GEMMs hit a table entry, which fall back) and the package's hit
/ fallback counts over one patched eager decode step.

A bound (``bound``, not in the default parts): the ``graph`` decode with a third model,
the patched one with RoPE and the KV-cache write taken out (each layer's rotary an
identity, each cache layer's ``update`` returning its tensors unwritten): what a qkv
epilogue that rotated q and k and wrote k and v into the cache itself could at most gain,
since such an epilogue still reads and writes what these kernels did, minus their
launches. Its logits are wrong by design; only its time is reported
(``speedup_bound``: unpatched over it, paired as ``speedup``).

Grouped decode (``grouped``, not in the default parts): the ``graph`` decode with a third
model, a patched twin with ``grouped_decode`` (a decode step's attention over the grouped
KV heads in place, not transformers' copy of every KV head per query head), timed
interleaved with the unpatched and the patched model, so the attention's share of the
gain is told apart from the GEMMs' (``speedup_grouped``, paired as ``speedup``); its
logits are checked against fp32 as ``check`` checks the patched model's
(``correctness_grouped``). ``--grouped-variant``: the twin's form, ``math`` (the
default, as ``patch_model``'s: two matmuls and a softmax, at any batch) or ``sdpa`` (one
SDPA call, from 16 (sequence, KV head) pairs).
``--grouped-decode``: the patched model itself is grouped; without it, it passes
``grouped_decode=False`` (``patch_model``'s default is on), so that every part measures
the GEMMs' share alone unless asked.

``--rope-kv``: the patched models are ``patch_model(..., rope_kv=True)``'s (docs/inference.md,
"RoPE and the cache write in the qkv kernel": from the second call on the static cache,
each layer's qkv kernel rotates q and k and writes k and v into the cache itself); the
wheel needs ``rmsnorm_rope_kv`` (Qwen2: ``rmsnorm_bias_rope_kv``) entries for it to run
them, else the op's fallback runs. ``env.rope_kv`` records it: use another ``--out``.

Each part is rerun-safe: the results JSON (``--out``) is read, the part's key replaced,
and written atomically after every part, so parts can run in separate processes (one
10-minute command each; ci/gpu_e2e_kv.sh) and a run cut short keeps what it finished.

    python bench/experiments/llama_kv_e2e.py --package cudal2_kernels_layer_epilogues_h100 \\
        --out out/llama-kv-e2e.json --part check --part eager --part prefill --part graph
    python bench/experiments/llama_kv_e2e.py --dry-run --package <pkg> --out /tmp/x.json
        (a tiny model on the CPU: every part's code path, fp32; "graph" compiles with
        backend="aot_eager", which traces the whole step as the GPU run does, no graphs)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import importlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

CONFIG = Path(__file__).resolve().parents[2] / "manifests/configs/llama-3.1-8b"
QWEN2_CONFIG = CONFIG.parent / "qwen2-7b"
CONTEXT = 1024
TOLERANCE = 2.0
FLOOR = 1e-5  # of the largest |logit|: below it, errors are rounding order (fp32 dry run)
PARTS = ("check", "eager", "prefill", "graph", "qwen2", "bound", "grouped")
EXTRA_PARTS = ("bound", "grouped")  # asked for by name only
# --dry-run: a tiny Llama on the CPU (the code paths, not figures).
TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=97,
)


class Setup:
    """The run's device, dtype, sizes and the package."""

    def __init__(self, args: argparse.Namespace):
        import torch

        self.torch = torch
        self.args = args
        self.dry = args.dry_run
        self.device = torch.device("cpu" if self.dry else args.device)
        self.dtype = torch.float32 if self.dry else torch.float16
        self.context = 16 if self.dry else CONTEXT
        self.pkg = importlib.import_module(args.package)

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def config(self, family: str = "llama") -> Any:
        """Llama-3.1-8B's config, or Qwen2-7B's (``family="qwen2"``), with ``--layers``
        of its decoder layers (at most its own count); the dry run's tiny sizes."""
        from transformers import AutoConfig

        path = CONFIG if family == "llama" else QWEN2_CONFIG
        cfg = AutoConfig.from_pretrained(str(path), local_files_only=True)
        cfg.num_hidden_layers = min(self.args.layers, cfg.num_hidden_layers)
        if self.dry:
            for k, v in TINY.items():
                setattr(cfg, k, v)
            cfg.num_hidden_layers = 2
        cfg.bos_token_id = cfg.eos_token_id = None
        return cfg


def build(s: Setup, cfg: Any, seed: int = 0) -> Any:
    """The model on the device in the run's dtype, eval mode, norms and biases randomised."""
    import transformers

    torch = s.torch
    cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}[
        cfg.model_type
    ]
    torch.manual_seed(seed)
    before = torch.get_default_dtype()
    try:
        with torch.device(s.device):
            torch.set_default_dtype(s.dtype)
            model = cls(cfg).eval()
    finally:
        torch.set_default_dtype(before)
    g = torch.Generator(device=s.device).manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g, device=s.device))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g, device=s.device))
    return model


def patched_copy(s: Setup, model: Any, grouped: bool | None = None) -> tuple[Any, Any]:
    """New modules over the same parameters and buffers, patched with ``patch_model``
    (``grouped``: ``grouped_decode`` as given, else as ``--grouped-decode`` says)."""
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    twin = copy.deepcopy(model, shared)
    # The dry run's fp32 has no table entry at any M: it asks for the fused forward (its
    # ops on torch's fallbacks), so the CPU runs the code path the GPU's fused layers run.
    uncovered = "fused" if s.dry else None
    rope = {"rope_kv": True} if s.args.rope_kv else {}  # the keyword only where asked
    # grouped_decode always given: patch_model's default (on) would fold the attention's
    # gain into the GEMMs'; the experiment's patched model is the GEMM patch alone unless
    # --grouped-decode (the ``grouped`` part times both)
    on = grouped if grouped is not None else getattr(s.args, "grouped_decode", False)
    rope["grouped_decode"] = getattr(s.args, "grouped_variant", "math") if on else False
    return twin, s.pkg.patch_model(twin, originals="keep", uncovered=uncovered, **rope)


def static_cache(s: Setup, model: Any, batch: int, length: int, filled: int) -> Any:
    """A StaticCache of ``length`` tokens for ``model`` (its dtype) whose first
    ``filled`` positions hold random K/V."""
    from transformers import StaticCache

    torch = s.torch
    cfg = model.config
    cache = StaticCache(config=cfg, max_cache_len=length)
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    dtype = next(model.parameters()).dtype
    cache.early_initialization(batch, cfg.num_key_value_heads, d, dtype, s.device)
    if filled:
        g = torch.Generator(device=s.device).manual_seed(batch)
        for layer in cache.layers:
            layer.keys[:, :, :filled].normal_(generator=g)
            layer.values[:, :, :filled].normal_(generator=g)
    rewind(cache, filled)
    return cache


def rewind(cache: Any, position: int) -> None:
    """Set every layer's write position (an in-place fill: the tensor's address is
    static, so compiled graphs see it)."""
    for layer in cache.layers:
        layer.cumulative_length.fill_(position)


def _no_rotary(q: Any, k: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
    return q, k


def _unwritten_update(self: Any, key_states: Any, value_states: Any, *a: Any, **kw: Any) -> Any:
    return self.keys, self.values


def bound_twin(s: Setup, model: Any) -> tuple[Any, Any]:
    """``bound``'s model: a patched twin whose fused layers skip RoPE (an identity in
    each layer's plan); its cache skips the write (``unwritten``)."""
    twin, patch = patched_copy(s, model)
    for layer in twin.model.layers:
        plan = layer.__dict__.get("_cudal2")
        if plan is not None:
            layer._cudal2 = dataclasses.replace(plan, rotary=_no_rotary)
    return twin, patch


def unwritten(cache: Any) -> Any:
    """The cache with every layer's ``update`` returning its tensors as they are."""
    for layer in cache.layers:
        layer.update = types.MethodType(_unwritten_update, layer)
    return cache


def step_fn(model: Any, cache: Any) -> Any:
    def step(ids: Any) -> Any:
        return model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits

    return step


def time_blocks(s: Setup, runs: dict[str, Any], steps: int, reps: int) -> dict[str, list[float]]:
    """Seconds per block of ``steps`` decode steps for each run (step, cache, first
    ids, compiled), interleaved in random order, ``reps`` blocks each (one warm-up block)."""
    rng = random.Random(0)
    times: dict[str, list[float]] = {name: [] for name in runs}
    torch = s.torch
    with torch.no_grad():
        for rep in range(reps + 1):
            order = list(runs)
            rng.shuffle(order)
            for name in order:
                step, cache, ids, compiled = runs[name]
                rewind(cache, s.context)
                s.sync()
                t0 = time.perf_counter()
                x = ids
                for _ in range(steps):
                    if compiled:  # a new iteration: the last step's outputs are consumed
                        torch.compiler.cudagraph_mark_step_begin()
                    x = step(x).argmax(-1)
                s.sync()
                if rep:
                    times[name].append(time.perf_counter() - t0)
    return times


def summarise(times: dict[str, list[float]], batch: int, steps: int) -> dict:
    med = {name: statistics.median(v) for name, v in times.items()}
    out: dict = {
        "tokens_per_s": {n: round(batch * steps / t, 1) for n, t in med.items()},
        "ms_per_step": {n: round(t / steps * 1e3, 3) for n, t in med.items()},
        "speedup": round(med["unpatched"] / med["patched"], 4),
    }
    for other in times:
        if other == "unpatched":
            continue
        key = "" if other == "patched" else f"_{other}"
        ratio = sorted(u / p for u, p in zip(times["unpatched"], times[other], strict=True))
        if key:
            out[f"speedup{key}"] = round(med["unpatched"] / med[other], 4)
        out[f"paired_speedup{key}"] = round(statistics.median(ratio), 4)
        out[f"paired_p20_p80{key}"] = [
            round(ratio[len(ratio) // 5], 4),
            round(ratio[(4 * len(ratio)) // 5], 4),
        ]
    return out


# -- the parts ---------------------------------------------------------------------------


def correctness(s: Setup, model: Any, patched: Any, batch: int | None = None) -> dict:
    """Logits of the prefill and 4 decode steps against an fp32 copy (module docstring);
    ``batch``: that many sequences (default 4; the dry run's 8)."""
    torch = s.torch
    ref = copy.deepcopy(model).float()
    # the dry run: 8 sequences x 2 KV heads, so grouped decode (from 16 pairs) runs
    b, t, n = (8, 8, 3) if s.dry else (4, 128, 4)
    b = batch or b
    g = torch.Generator(device=s.device).manual_seed(7)
    prompt = torch.randint(0, model.config.vocab_size, (b, t), generator=g, device=s.device)
    out: dict[str, list] = {"ref": [], "unpatched": [], "patched": []}
    with torch.no_grad():
        models = {"ref": ref, "unpatched": model, "patched": patched}
        caches = {k: static_cache(s, m, b, t + n, 0) for k, m in models.items()}
        ids = prompt
        for _ in range(n + 1):
            for name, m in models.items():
                logits = m(input_ids=ids, past_key_values=caches[name], use_cache=True).logits
                out[name].append(logits.float().cpu())
            ids = out["ref"][-1][:, -1:].argmax(-1).to(s.device)  # the reference's token
    del ref, caches
    if s.device.type == "cuda":
        torch.cuda.empty_cache()
    want = torch.cat([x.flatten() for x in out["ref"]])
    got = {k: torch.cat([x.flatten() for x in out[k]]) for k in ("unpatched", "patched")}
    err_u = (got["unpatched"] - want).abs().max().item()
    err_p = (got["patched"] - want).abs().max().item()
    return {
        "prompt": [b, t],
        "decode_steps": n,
        "max_abs_logit": round(want.abs().max().item(), 4),
        "err_unpatched_vs_fp32": round(err_u, 5),
        "err_patched_vs_fp32": round(err_p, 5),
        "max_diff_patched_vs_unpatched": round(
            (got["patched"] - got["unpatched"]).abs().max().item(), 5
        ),
        "tolerance": TOLERANCE,
        # The floor: an fp32 dry run's unpatched model IS the reference (error 0); the
        # patched one differs by the rounding order of the fold (~1e-7 of the logits).
        "ok": err_p <= TOLERANCE * max(err_u, FLOOR * want.abs().max().item()),
    }


def report_summary(patch: Any, ms: list[int]) -> dict:
    """The patch's report in brief: per GEMM of the first layer its entries and in how
    many layers it has one; the LM head's; per M (``ms`` and every eager call seen) how
    many layers took each path (fused / original / fused_fallback) and the head's."""
    rep = patch.report(ms=ms)
    paths: dict[str, dict] = {}
    for name, per_m in rep["paths"].items():
        for m, path in per_m.items():
            row = paths.setdefault(m, {"layers": {}, "lm_head": None})
            if name == "lm_head":
                row["lm_head"] = path
            else:
                row["layers"][path] = row["layers"].get(path, 0) + 1
    layers = rep["layers"]
    first = next(iter(layers.values()))
    per_gemm = {
        r["gemm"]: {
            "op": r["op"],
            "epilogue": r["epilogue"],
            "nk": [r["n"], r["k"]],
            "entry_in_layers": sum(
                1
                for rows in layers.values()
                for x in rows
                if x["gemm"] == r["gemm"] and x["fallback"] is None
            ),
            "entries": r["entries"],
        }
        for r in first
    }
    return {
        "layers": len(layers),
        "per_gemm": per_gemm,
        "lm_head": rep["lm_head"],
        "paths": dict(sorted(paths.items(), key=lambda kv: int(kv[0]))),
    }


def run_ms(s: Setup) -> list[int]:
    """The Ms this run's calls make: decode batches, the prefill's tokens (its LM head:
    1 row, logits_to_keep), the check's prompt and steps."""
    prefill = 32 if s.dry else s.args.prefill
    b, t = (2, 8) if s.dry else (4, 128)
    return sorted({*s.args.batches, prefill, 1, b * t, b})


def part_check(s: Setup, model: Any, patched: Any, patch: Any, mem: dict) -> dict:
    torch = s.torch
    res = {
        "correctness": correctness(s, model, patched),
        "memory": mem,
        "report": report_summary(patch, run_ms(s)),
    }
    cache = static_cache(s, patched, 1, s.context + 1, s.context)
    ids = torch.zeros((1, 1), dtype=torch.long, device=s.device)
    with torch.no_grad():
        patched(input_ids=ids, past_key_values=cache, use_cache=True)  # first use: loads
        rewind(cache, s.context)
        s.pkg.stats.reset()
        patched(input_ids=ids, past_key_values=cache, use_cache=True)
    res["one_decode_step"] = {
        "hits": dict(s.pkg.stats.hits),
        "fallbacks": dict(s.pkg.stats.fallbacks),
    }
    return res


def part_decode(
    s: Setup, model: Any, patched: Any, compiled: bool, others: dict[str, Any] | None = None
) -> dict:
    """Decode timed per batch; ``others``: more models timed beside the two, by name
    (``bound``: ``bound_twin``'s, on an ``unwritten`` cache; ``grouped``: a
    ``grouped_decode`` twin)."""
    torch = s.torch
    args = s.args
    rows = {}
    models = [("unpatched", model), ("patched", patched), *(others or {}).items()]
    for batch in args.batches:
        t0 = time.monotonic()
        runs, row = {}, {"batch": batch}
        ids = torch.zeros((batch, 1), dtype=torch.long, device=s.device)
        for name, m in models:
            cache = static_cache(s, m, batch, s.context + args.steps, s.context)
            if name == "bound":
                unwritten(cache)
            step = step_fn(m, cache)
            if compiled:
                with torch.no_grad():
                    eager_logits = step(ids).float()
                    rewind(cache, s.context)
                    if s.dry:  # the CPU: trace (dynamo + AOT with the ops' fake impls) only
                        fn = torch.compile(step, backend="aot_eager", fullgraph=True, dynamic=False)
                    else:
                        fn = torch.compile(
                            step, mode="reduce-overhead", fullgraph=True, dynamic=False
                        )
                    c0 = time.monotonic()
                    for _ in range(3):  # compile, record the graph, replay
                        rewind(cache, s.context)
                        torch.compiler.cudagraph_mark_step_begin()
                        got = fn(ids).float()
                    s.sync()
                    row[f"compile_s_{name}"] = round(time.monotonic() - c0, 1)
                    row[f"max_diff_compiled_vs_eager_{name}"] = round(
                        (got - eager_logits).abs().max().item(), 5
                    )
                step = fn
            runs[name] = (step, cache, ids, compiled)
        if not compiled:  # which entries one patched step hits at this batch (eager: the
            # Python path counts; graph replays do not pass through it)
            step, cache = runs["patched"][:2]
            with torch.no_grad():
                step(ids)  # first use at this M: loads
                rewind(cache, s.context)
                s.pkg.stats.reset()
                step(ids)
            rewind(cache, s.context)
            row["patched_step"] = {
                "hits": dict(s.pkg.stats.hits),
                "fallbacks": dict(s.pkg.stats.fallbacks),
            }
        row |= summarise(time_blocks(s, runs, args.steps, args.reps), batch, args.steps)
        row["wall_s"] = round(time.monotonic() - t0, 1)
        rows[str(batch)] = row
        print(json.dumps(row), flush=True)
        del runs
        if s.device.type == "cuda":
            torch.cuda.empty_cache()
    return {"batches": rows}


def _prefill_fn(m: Any, cache: Any, ids: Any) -> Any:
    return lambda: m(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)


def part_prefill(s: Setup, model: Any, patched: Any) -> dict:
    torch = s.torch
    n = 32 if s.dry else s.args.prefill
    g = torch.Generator(device=s.device).manual_seed(3)
    ids = torch.randint(0, model.config.vocab_size, (1, n), generator=g, device=s.device)
    caches = {k: static_cache(s, model, 1, n, 0) for k in ("unpatched", "patched")}
    fns = {
        k: _prefill_fn(m, caches[k], ids) for k, m in (("unpatched", model), ("patched", patched))
    }
    rng = random.Random(1)
    times: dict[str, list[float]] = {k: [] for k in fns}
    with torch.no_grad():
        for rep in range(s.args.reps + 1):
            order = list(fns)
            rng.shuffle(order)
            for k in order:
                rewind(caches[k], 0)
                s.sync()
                t0 = time.perf_counter()
                fns[k]()
                s.sync()
                if rep:
                    times[k].append(time.perf_counter() - t0)
    # one more prefill of each: the patched one's hits and fallbacks, and how far its
    # last logits are from the unpatched model's (the same fp16 weights)
    with torch.no_grad():
        rewind(caches["unpatched"], 0)
        want = fns["unpatched"]().logits.float()
        rewind(caches["patched"], 0)
        s.pkg.stats.reset()
        got = fns["patched"]().logits.float()
        s.sync()
    out = {
        "tokens": n,
        **_timed(times),
        "hits": dict(s.pkg.stats.hits),
        "fallbacks": dict(s.pkg.stats.fallbacks),
        "max_abs_logit": round(want.abs().max().item(), 4),
        "max_diff_patched_vs_unpatched": round((got - want).abs().max().item(), 5),
    }
    if not s.dry:  # the CPU has no CUDA graphs
        out["graph"] = _prefill_graphed(s, fns, caches, {"unpatched": want, "patched": got})
    return out


def _prefill_graphed(s: Setup, fns: dict, caches: dict, eager: dict) -> dict:
    """Each prefill captured whole in a CUDA graph (the cache's rewind inside it), its
    replays timed by CUDA events, interleaved in random order as the eager ones; each
    graph's last logits against its eager prefill's. A capture that fails is reported
    by its error, not raised (what a user's graph capture would meet)."""
    torch = s.torch
    graphs, diffs, errors = {}, {}, {}
    with torch.no_grad():
        for k, fn in fns.items():

            def body(fn=fn, cache=caches[k]) -> Any:
                rewind(cache, 0)
                return fn()

            try:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):  # warm-up outside the capture (loads, workspaces)
                        body()
                torch.cuda.current_stream().wait_stream(side)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    logits = body().logits
                g.replay()
                s.sync()
            except Exception as exc:  # noqa: BLE001 - reported in the results
                errors[k] = f"{type(exc).__name__}: {exc}"[:400]
                continue
            graphs[k] = g
            diffs[k] = round((logits.float() - eager[k]).abs().max().item(), 5)
    if errors:
        return {"errors": errors}
    rng = random.Random(2)
    times: dict[str, list[float]] = {k: [] for k in graphs}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for rep in range(s.args.reps + 1):
        order = list(graphs)
        rng.shuffle(order)
        for k in order:
            start.record()
            graphs[k].replay()
            end.record()
            end.synchronize()
            if rep:
                times[k].append(start.elapsed_time(end) / 1e3)
    return {**_timed(times), "max_diff_graph_vs_eager": diffs}


def _timed(times: dict[str, list[float]]) -> dict:
    """Prefill seconds by model: their medians and p20-p80 in ms, and the speedup."""
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "ms": {k: round(v * 1e3, 3) for k, v in med.items()},
        "p20_p80_ms": {k: [round(x * 1e3, 3) for x in _p20_p80(v)] for k, v in times.items()},
        "speedup": round(med["unpatched"] / med["patched"], 4),
    }


def _p20_p80(v: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(v, n=10)
    return q[1], q[7]


# -- driver ------------------------------------------------------------------------------


def write_json(path: Path, data: dict) -> None:
    """Atomically: a temporary file beside it, then os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", required=True, help="the wheel's import name")
    ap.add_argument("--out", required=True, type=Path, help="results JSON (parts merged in)")
    ap.add_argument("--part", action="append", choices=PARTS, help="repeatable; default: all")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument(
        "--batches",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[1, 16, 64],
        help="decode batches (comma-separated; default 1,16,64)",
    )
    ap.add_argument("--steps", type=int, default=32, help="decode steps per timed block")
    ap.add_argument("--reps", type=int, default=10, help="timed blocks (prefills) per model")
    ap.add_argument("--prefill", type=int, default=2048, help="prefill tokens")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dry-run", action="store_true", help="a tiny fp32 model on the CPU")
    ap.add_argument(
        "--rope-kv", action="store_true", help="patch_model(rope_kv=True): RoPE and the cache "
        "write in the qkv kernel",
    )  # fmt: skip
    ap.add_argument(
        "--grouped-decode", action="store_true", help="patch_model(grouped_decode=...): a "
        "decode step's attention over the grouped KV heads in place",
    )  # fmt: skip
    ap.add_argument(
        "--grouped-variant", choices=("math", "sdpa"), default="math", help="the grouped "
        "models' form (--grouped-decode, the grouped part): grouped_decode='math' (two "
        "matmuls and a softmax; patch_model's default) or 'sdpa' (one SDPA call)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    for name, v in (("--layers", args.layers), ("--steps", args.steps), ("--reps", args.reps)):
        if v < 1:
            ap.error(f"{name} must be at least 1, got {v}")
    if not args.batches or min(args.batches) < 1:
        ap.error(f"--batches must be positive integers, got {args.batches}")
    if args.prefill < 1:
        ap.error(f"--prefill must be at least 1, got {args.prefill}")
    args.part = list(dict.fromkeys(args.part or [p for p in PARTS if p not in EXTRA_PARTS]))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        # the static cache's cumulative_length, early_initialization and patch_model's
        # fused forward are transformers 5's
        print(f"transformers {transformers.__version__}: this needs 5.x", file=sys.stderr)
        return 2
    s = Setup(args)
    torch = s.torch
    # Every (model, batch) compiles the one code object of step_fn's closure: each is a
    # cache entry of that frame, so dynamo's per-frame limit (8) must not cut them off.
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))

    result: dict = json.loads(args.out.read_text()) if args.out.exists() else {}
    gpu = torch.cuda.get_device_name() if s.device.type == "cuda" else "cpu (dry run)"
    result["env"] = {
        "gpu": gpu,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "package": args.package,
        "launcher": s.pkg._api.launcher,
        "layers": 2 if s.dry else args.layers,
        "context": s.context,
        "steps": args.steps,
        "reps": args.reps,
        "dry_run": s.dry,
        "rope_kv": args.rope_kv,
        "grouped_decode": args.grouped_decode,
        "grouped_variant": args.grouped_variant,
        "compile": 'torch.compile(mode="reduce-overhead", fullgraph=True, dynamic=False), '
        "once per model and batch",
    }
    write_json(args.out, result)
    llama = [p for p in args.part if p != "qwen2"]
    if llama:
        t0 = time.monotonic()
        model = build(s, s.config())
        alloc = torch.cuda.memory_allocated() if s.device.type == "cuda" else 0
        patched, patch = patched_copy(s, model)
        mem = {
            "patch_memory": patch.memory(),
            "allocated_added": (torch.cuda.memory_allocated() - alloc) if alloc else None,
            "model_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        }
        print(f"llama: built and patched in {time.monotonic() - t0:.0f} s; {mem}", flush=True)
        if s.device.type == "cuda":  # every kernel loaded now: none during a capture
            result["env"]["warmed_entries"] = s.pkg.warmup()
        for part in llama:
            t1 = time.monotonic()
            if part == "check":
                got = part_check(s, model, patched, patch, mem)
            elif part == "prefill":
                got = part_prefill(s, model, patched)
            elif part == "bound":
                twin, twin_patch = bound_twin(s, model)
                got = part_decode(s, model, patched, compiled=True, others={"bound": twin})
                twin_patch.restore()
                del twin
            elif part == "grouped":
                twin, twin_patch = patched_copy(s, model, grouped=True)
                if s.device.type == "cuda":
                    s.pkg.warmup()
                got = {"correctness_grouped": correctness(s, model, twin)}
                got |= part_decode(s, model, patched, compiled=True, others={"grouped": twin})
                twin_patch.restore()
                del twin
            else:
                got = part_decode(s, model, patched, compiled=part == "graph")
            got["wall_s"] = round(time.monotonic() - t1, 1)
            before = result.setdefault("llama", {}).get(part) or {}
            if "batches" in got:  # a run of other batches keeps the ones measured before
                got["batches"] = {**before.get("batches", {}), **got["batches"]}
            result["llama"][part] = got
            write_json(args.out, result)
            print(f"== {part}: {json.dumps(got)[:2000]}", flush=True)
        patch.restore()
        del model, patched
        if s.device.type == "cuda":
            torch.cuda.empty_cache()
    if "qwen2" in args.part:
        t1 = time.monotonic()
        model = build(s, s.config("qwen2"))
        patched, patch = patched_copy(s, model)
        got = {"correctness": correctness(s, model, patched)}
        # and at batch 1, the decode M the Qwen2 targets cover (4 sequences may run the
        # original modules, where the wheel has no entry)
        got["correctness_b1"] = correctness(s, model, patched, batch=1)
        batches, args.batches = args.batches, [1]
        got["graph"] = part_decode(s, model, patched, compiled=True)
        got["eager"] = part_decode(s, model, patched, compiled=False)
        got["report"] = report_summary(patch, run_ms(s))
        args.batches = batches
        got["memory"] = patch.memory()
        got["wall_s"] = round(time.monotonic() - t1, 1)
        result["qwen2"] = got
        write_json(args.out, result)
        print(f"== qwen2: {json.dumps(got)[:2000]}", flush=True)
        patch.restore()
    llama_parts = result.get("llama", {})
    bad = [
        name
        for name, check in (
            ("llama", (llama_parts.get("check") or {}).get("correctness")),
            ("qwen2", (result.get("qwen2") or {}).get("correctness")),
            ("qwen2 batch 1", (result.get("qwen2") or {}).get("correctness_b1")),
            ("llama grouped_decode", (llama_parts.get("grouped") or {}).get("correctness_grouped")),
        )
        if check and not check["ok"]
    ]
    if bad:
        print(f"correctness FAILED for {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
    raise SystemExit(130)
