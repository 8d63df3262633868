"""``cudal2-bench layer``: one decoder layer per case (model x dtype x M), the vendor and
the cudal2 layer of ``cudal2.bench.layer`` in one process: checked against the fp32
reference first, then timed with the project's one timing function.

Timing (``verify.timing.time_interleaved``, offline): each variant is captured as one
CUDA graph of back-to-back layer calls cycling through ``sets`` distinct layers (their
own weights, KV caches and inputs; together more than L2 holds several times over), so
every call reads its weights and cache from HBM, as the layers of a model do; the two
variants interleaved in a fresh random order every repetition. A sample is one
replay's time divided by its calls: µs per layer.

Correctness (before any timing, on the first set): each variant's output against the
fp32 reference layer with the same (rounded) weights. A variant passes when its max
|error| is at most ``REL_BOUND[dtype]`` times the reference's largest |value|, and the
cudal2 layer also when it is at most ``TOLERANCE`` times the vendor layer's error (both
accumulate in fp32 and round differently, as llama_e2e's patched model). A case with a
failing variant is reported with its errors, not timed.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
from collections.abc import Callable, Mapping
from typing import Any

from cudal2 import __version__
from cudal2.bench.layer import (
    FUSIONS,
    GEMMS,
    Cudal2Layer,
    LayerShape,
    Pieces,
    VendorLayer,
    fusions,
    make_state,
    make_weights,
    reference,
)
from cudal2.verify.timing import TIMING_METHOD, Timing, operand_sets, paired_spread

FORMAT = 1
KIND = "cudal2-layer-bench"
VARIANTS = ("vendor", "cudal2")
REL_BOUND = {"fp16": 1e-2, "bf16": 5e-2, "fp32": 1e-4}
TOLERANCE = 2.0
M_MAX = 1024  # decode sequences per step
# A timer: {variant: fn(set index)}, the number of sets, a layer time estimate (µs) ->
# {variant: Timing}. On the GPU, time_interleaved with the run's TimingConfig.
Timer = Callable[[Mapping[str, Callable[[int], object]], int, float], dict[str, Timing]]


class LayerResultsError(ValueError):
    """A layer results file that is not what ``results_doc`` writes."""


def _dtype(name: str) -> Any:
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name]


def dispatch(pkg: Any, probe: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Per GEMM, what one call ran: the op, then each table entry it hit (kind
    ``kernel`` or ``cublaslt``, the kernel's name, whether its recipe launches with PDL)
    and each fallback reason, from the package's ``stats`` of that call."""
    api = getattr(pkg, "_api", None)
    entries = {str(e.key): e for e in api.table.entries} if api is not None else {}
    out: dict[str, Any] = {}
    for gemm, p in probe.items():
        runs = []
        for key, calls in sorted(p.get("hits", {}).items()):
            e = entries.get(key)
            runs.append(
                {
                    "entry": key,
                    "kind": e.kind if e else "unknown",
                    "kernel": e.kernel if e else None,
                    "pdl": bool(e and e.launch and e.launch.get("pdl") is True),
                    "calls": calls,
                }
            )
        for reason, calls in sorted(p.get("fallbacks", {}).items()):
            runs.append({"kind": "fallback", "reason": reason, "pdl": False, "calls": calls})
        kinds = sorted({r["kind"] for r in runs})
        out[gemm] = {
            "op": p["op"],
            "fused": p["op"] != "linear",
            "ran": kinds[0] if len(kinds) == 1 else ("mixed" if kinds else "none"),
            "pdl": bool(runs) and all(r["pdl"] for r in runs),
            "runs": runs,
        }
    return out


def check(ref: Any, outs: Mapping[str, Any], dtype: str) -> dict[str, Any]:
    """Each variant's max |error| against the fp32 reference, and the verdicts (see the
    module doc)."""
    big = ref.abs().max().item()
    err = {name: (o.float() - ref).abs().max().item() for name, o in outs.items()}
    bound = REL_BOUND[dtype] * big
    ok = {name: e <= bound for name, e in err.items()}
    if "cudal2" in ok and "vendor" in err:
        ok["cudal2"] = ok["cudal2"] and err["cudal2"] <= TOLERANCE * err["vendor"]
    return {
        "max_abs_ref": round(big, 5),
        "bound_abs": round(bound, 6),
        "err": {n: round(e, 6) for n, e in err.items()},
        "ok": ok,
    }


def measure_case(
    shape: LayerShape,
    dtype: str,
    m: int,
    pkg: Any,
    timer: Timer,
    *,
    device: str = "cuda",
    compiled: bool = True,
    sets: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """One case: build ``sets`` layers (default: enough to exceed L2 several times),
    check both variants on the first, time them if both pass."""
    import torch

    tdt = _dtype(dtype)
    itemsize = torch.empty((), dtype=tdt).element_size()
    nsets = sets or operand_sets(shape.weight_bytes(itemsize) + shape.cache_bytes(m, itemsize))
    gen = torch.Generator(device=device).manual_seed(seed)
    weights = [make_weights(shape, tdt, device, gen) for _ in range(nsets)]
    states = [make_state(shape, m, tdt, device, gen) for _ in range(nsets)]
    pieces = Pieces.make(compiled)
    vendor = [VendorLayer(shape, w, pieces) for w in weights]
    cudal2 = [Cudal2Layer(shape, w, pieces, pkg) for w in weights]
    case: dict[str, Any] = {"model": shape.model, "dtype": dtype, "m": m, "sets": nsets}
    with torch.no_grad():
        ref = reference(shape, weights[0], states[0])
        cudal2[0].probe = {}
        outs = {"vendor": vendor[0](states[0]), "cudal2": cudal2[0](states[0])}
        probe, cudal2[0].probe = cudal2[0].probe, None
        case |= check(ref, outs, dtype)
        case["plan"] = dict(cudal2[0].plan)
        case["dispatch"] = dispatch(pkg, probe)
        del ref, outs
        if not all(case["ok"].values()):
            failed = [n for n, ok in case["ok"].items() if not ok]
            case["not_timed"] = f"failed the fp32 check: {', '.join(failed)}"
            return case
        # Bytes one layer call reads at least (weights and cache), at ~3 TB/s: the
        # estimate that sizes the graphs (it sets how many calls a replay holds).
        est_us = (shape.weight_bytes(itemsize) + shape.cache_bytes(m, itemsize)) / 3e6
        fns = {
            "vendor": lambda j: vendor[j](states[j]),
            "cudal2": lambda j: cudal2[j](states[j]),
        }
        t = timer(fns, nsets, est_us)
    case["timing"] = {n: t[n].as_json() for n in VARIANTS}
    case["median_us"] = {n: round(t[n].median_us, 3) for n in VARIANTS}
    case["spread"] = {n: round(t[n].spread, 4) for n in VARIANTS}
    case["speedup"] = round(t["vendor"].median_us / t["cudal2"].median_us, 4)
    ps = paired_spread(t["cudal2"].samples_us, t["vendor"].samples_us)
    case["speedup_spread"] = None if ps is None else round(ps, 4)
    return case


def failed_case(model: str, dtype: str, m: int, exc: BaseException) -> dict[str, Any]:
    """A case that raised (a kernel error, out of memory): what it was and why, in the
    shape of a case that failed its check."""
    why = f"error: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    return {"model": model, "dtype": dtype, "m": m, "err": {}, "ok": {}, "dispatch": {},
            "not_timed": why}  # fmt: skip


def results_doc(
    env: Mapping[str, Any], pkg: Any, shapes: list[LayerShape], cases: list[dict[str, Any]]
) -> dict[str, Any]:
    """The results file's content. ``env``: gpu, torch, cuda, reps, seed, and
    ``timing``, how a sample was taken (words for the table's header)."""
    api = getattr(pkg, "_api", None)
    return {
        "format": FORMAT,
        "kind": KIND,
        "tool_version": __version__,
        "measured_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **env,
        "package": getattr(pkg, "__name__", str(pkg)),
        "package_version": getattr(pkg, "__version__", None),
        "launcher": getattr(api, "launcher", None),
        "fusions": fusions(pkg),
        "timing_method": TIMING_METHOD,
        "bound": {"rel": REL_BOUND, "tolerance_vs_vendor": TOLERANCE},
        "shapes": {s.model: s.as_json() for s in shapes},
        "cases": cases,
    }


def results_json(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


_NEEDS = ("format", "kind", "gpu", "torch", "package", "timing", "fusions", "shapes", "cases")
_CASE_NEEDS = ("model", "dtype", "m", "err", "ok", "dispatch")


def load_results(text: str, source: str = "layer results") -> dict[str, Any]:
    """A results file's content, checked to be what ``results_doc`` writes."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise LayerResultsError(f"{source}: not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND or doc.get("format") != FORMAT:
        raise LayerResultsError(f"{source}: not a {KIND} results file of format {FORMAT}")
    if missing := [k for k in _NEEDS if k not in doc]:
        raise LayerResultsError(f"{source}: missing {', '.join(missing)}")
    for i, c in enumerate(doc["cases"]):
        if missing := [k for k in _CASE_NEEDS if k not in c]:
            raise LayerResultsError(f"{source}: case {i} lacks {', '.join(missing)}")
        if c["model"] not in doc["shapes"]:
            raise LayerResultsError(f"{source}: case {i}: model {c['model']!r} has no shape")
    return doc


def _gemms(c: Mapping[str, Any]) -> str:
    """``qkv: kernel, o_proj: kernel+residual (pdl), ...`` of one case."""
    parts = []
    for gemm in (g for g in GEMMS if g in c["dispatch"]):
        d = c["dispatch"][gemm]
        text = d["ran"] + (f"+{d['op'].removeprefix('linear_')}" if d["fused"] else "")
        parts.append(f"{gemm} {text}{' PDL' if d['pdl'] else ''}")
    return ", ".join(parts)


def shapes_text(doc: Mapping[str, Any]) -> str:
    """One line per model: its per-GPU layer and GEMM shapes (N x K)."""
    lines = []
    # in the order the cases run them (a results file's keys are sorted)
    for name in dict.fromkeys([*(c["model"] for c in doc["cases"]), *doc["shapes"]]):
        s = doc["shapes"][name]
        gemms = ", ".join(f"{g} {s['gemms_nk'][g][0]}x{s['gemms_nk'][g][1]}" for g in GEMMS)
        lines.append(
            f"- `{name}` (tp {s['tp']}, per GPU): hidden {s['hidden']}, {s['heads']} heads, "
            f"{s['kv_heads']} kv heads of {s['head_dim']}, intermediate {s['intermediate']}; "
            f"GEMMs (N x K) {gemms}; KV cache {s['cache_tokens']} tokens"
        )
    return "\n".join(lines)


def markdown_table(doc: Mapping[str, Any]) -> str:
    """The results as markdown: a header line, the shapes, one row per case."""
    lines = [
        f"{doc['gpu']}, torch {doc['torch']}, package `{doc['package']}` "
        f"({doc.get('launcher') or 'no'} launcher), fused ops available: "
        + (", ".join(f for f in FUSIONS if doc["fusions"].get(f)) or "none")
        + f". µs per layer: median of {doc['timing']} (p20–p80 spread in brackets; the "
        "speedup's spread is that of the paired per-repetition ratios).",
        "",
        shapes_text(doc),
        "",
        "| model | dtype | M | vendor µs | cudal2 µs | speedup | max err vendor / cudal2 "
        "(bound) | GEMMs |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for c in doc["cases"]:
        err = c["err"]
        errs = "–"
        if set(VARIANTS) <= set(err):
            errs = f"{err['vendor']:.2g} / {err['cudal2']:.2g} ({c['bound_abs']:.2g})"
        if "median_us" in c:
            med, sp = c["median_us"], c["spread"]
            vendor = f"{med['vendor']:.1f} ({sp['vendor']:.1%})"
            own = f"{med['cudal2']:.1f} ({sp['cudal2']:.1%})"
            spread = c.get("speedup_spread")
            speedup = f"{c['speedup']:.3f}" + (f" ({spread:.1%})" if spread is not None else "")
        else:
            vendor = own = "–"
            speedup = f"not timed: {c.get('not_timed', '?')}"
        lines.append(
            f"| {c['model']} | {c['dtype']} | {c['m']} | {vendor} | {own} | {speedup} "
            f"| {errs} | {_gemms(c)} |"
        )
    if geo := _geomeans(doc):
        lines += ["", "Geomean speedup by M: " + ", ".join(f"{m}: {g:.3f}" for m, g in geo)]
    return "\n".join(lines)


def _geomeans(doc: Mapping[str, Any]) -> list[tuple[int, float]]:
    by_m: dict[int, list[float]] = {}
    for c in doc["cases"]:
        if c.get("speedup"):
            by_m.setdefault(c["m"], []).append(c["speedup"])
    return [(m, statistics.geometric_mean(v)) for m, v in sorted(by_m.items())]


def run(
    pkg: Any,
    shapes: list[LayerShape],
    dtypes: list[str],
    ms: list[int],
    reps: int,
    seed: int = 0,
    log: Any = None,
    save: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every case on this GPU (progress and one line per case on ``log``, default
    stderr); the results document. ``save`` is given the document so far after each
    case, so a run stopped part way (a time limit) leaves the cases it finished."""
    import sys

    import torch

    from cudal2.pipeline.progress import progress
    from cudal2.records import TimingConfig
    from cudal2.verify.timing import time_interleaved

    log = log or sys.stderr
    cfg = TimingConfig(reps=reps, warmup=2, mode="offline", seed=seed)

    def timer(fns: Mapping[str, Callable[[int], object]], nsets: int, est: float) -> Any:
        return time_interleaved(fns, nsets, cfg, est)

    # Every kernel loaded and every cuBLASLt workspace made before any capture.
    warmed = pkg.warmup() if hasattr(pkg, "warmup") else 0
    env = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "reps": reps,
        "seed": seed,
        "warmed_entries": warmed,
        "timing": f"{reps} CUDA-graph replays of back-to-back layers, each layer's own "
        "weights and cache, the variants interleaved",
    }
    todo = [(s, d, m) for s in shapes for d in dtypes for m in ms]
    bar = progress(len(todo), "layer cases", "case", log)
    cases: list[dict[str, Any]] = []
    for s, d, m in todo:
        torch.compiler.reset()  # a fresh specialisation of the small functions per case
        try:
            case = measure_case(s, d, m, pkg, timer, seed=seed)
        except Exception as e:  # one case's failure is reported; the run goes on
            case = failed_case(s.model, d, m, e)
        cases.append(case)
        med = case.get("median_us")
        said = (
            f"vendor {med['vendor']:.1f} us, cudal2 {med['cudal2']:.1f} us, "
            f"speedup {case['speedup']:.3f}"
            if med
            else case["not_timed"]
        )
        gemms = _gemms(case)
        print(
            f"{s.model} {d} M={m}: {said}" + (f"; {gemms}" if gemms else ""), file=log, flush=True
        )
        if save is not None:
            save(results_doc(env, pkg, shapes, list(cases)))
        bar.update()
        torch.cuda.empty_cache()
    bar.close()
    return results_doc(env, pkg, shapes, cases)
