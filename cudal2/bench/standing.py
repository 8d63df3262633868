"""Where cudal2 stands, as generated markdown: the figures the README and the docs
quote, computed from committed results so that they cannot drift from them.

A document holds each generated block between two markers::

    <!-- cudal2:begin NAME -->
    ...
    <!-- cudal2:end NAME -->

``cudal2-bench report FILE...`` rewrites every known block in place; ``--check`` only
compares (a CPU test runs it on README.md and docs/). What each block reads:

- ``where-it-stands``: every shipped manifest's selection, made as a build without a
  GPU makes it from the manifest's committed database (``manifests/*.measurements.jsonl``):
  no compile, the same sanitizer gate and the same "still builds to the measured
  artifact" rule; then the vendor comparison (``BENCH_RESULTS``), the read ceiling and
  the Llama-3.1-8B end-to-end run.
- ``llama-e2e``: the end-to-end table of ``docs/inference.md``.
- ``host-overhead``: the host cost per call of every launch path (``docs/inference.md``).
- ``floor-fractions``: ``docs/measuring.md``'s vendor table (``VENDOR_RUN``).
- ``policy-eval``: the replay table of ``docs/policy.md`` (``POLICY_EVALS``).
- ``policy-retrain``: its before/after table of the v5 retrain (``POLICY_RETRAIN``).
- ``policy-seeds``: the v5 retrain judged over training seeds
  (``cudal2.bench.policy_seeds``).
- ``tma-v5-techniques``: issue 22's techniques side by side, each in the sweep that
  measured it (``cudal2.bench.techniques``).
- ``layer-bench``: the layer benchmark's table (``LAYER_RESULTS``, written by
  ``cudal2-bench layer``); until that file is committed the block cannot be made
  (``ResultsMissing``), and no document may hold it.
- ``layer-ceiling``: where the layer's time goes and its read ceiling
  (``LAYER_PROFILE`` beside ``READ_CEILING``, ``cudal2.bench.layer_profile``).
- ``math-ceiling``: issue 22's power-bound ceiling per prefill shape (``MATH_CEILING``,
  ``cudal2.bench.math_ceiling``); until that file is committed the block cannot be made
  (``ResultsMissing``), and no document may hold it.
- ``declared-*``: issue 22's prefill decided in one declared timing state, its run-offs and
  the wheels before and after them in both clock states (``cudal2.bench.declared``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cudal2.bench import (
    baselines,
    declared,
    grid_sample,
    llm_public_steps,
    policy_seeds,
    prefill_narrow_pair,
    prefill_store,
    prefill_streamk,
    prefill_tma_store,
    prefill_uniform,
    runoffs,
    techniques,
)
from cudal2.bench.report import Filter, baseline_us, geomean, read_results, summarize, wins

# The last run that timed every vendor beside the llm-public wheel of its day.
BENCH_RESULTS = "bench/results/h100-llm-public-sm90tma-v4.jsonl"
CEILING_RESULTS = "bench/results/h100-read-ceiling.jsonl"
E2E_RESULTS = "bench/results/h100-llama-e2e.json"
# The manifests that ship with a committed database, in the order the README lists them.
SHIPPED = ("default", "llm-public-h100", "llama-3.1-8b-hf-h100", "grid-sample-h100")


class StaleBlockError(ValueError):
    """A document's markers are broken (an end without a begin, a block twice)."""


class ResultsMissing(FileNotFoundError):
    """A block's results file is not committed (yet): the block cannot be made."""


@dataclass(frozen=True)
class Shipped:
    """What one manifest's wheel dispatches, per target."""

    manifest: str
    targets: int
    kernel_targets: int
    kernels: int  # distinct own kernels (one kernel may serve several targets)
    cublaslt: int
    fallback: int
    families: tuple[str, ...]
    kernel_m: tuple[int, ...]  # measured M of the targets an own kernel serves
    kernel_shapes_m1024: tuple[str, ...]  # MxNxK of own-kernel targets at M >= 1024


def shipped(root: Path, name: str) -> Shipped:
    """The selection a CPU build of ``manifests/NAME.toml`` makes from its committed
    database (see the module docstring)."""
    from cudal2.database import MeasurementDB, default_database, latest
    from cudal2.generator.render import design_name
    from cudal2.manifest import load_manifest
    from cudal2.pipeline.build import believable, shippable
    from cudal2.pipeline.gate import SanitizerGate, ledger_of

    path = root / "manifests" / f"{name}.toml"
    manifest = load_manifest(path)
    contents = MeasurementDB(default_database(path), manifest.reuse).load(warn=False)
    history = latest(contents.measurements)
    gate = SanitizerGate(None, ledger_of(contents.checks, history))
    sels, _ = gate.select(manifest.targets, believable(history), manifest.timing_mode, shippable())
    kinds = Counter(s.kind for s in sels)
    own = [s for s in sels if s.kind == "kernel" and s.winner and s.winner.design]
    covered = {s.target for s in sels}
    return Shipped(
        manifest=name,
        targets=len(manifest.targets),
        kernel_targets=kinds["kernel"],
        kernels=len({design_name(s.winner.design) for s in own}),
        cublaslt=kinds["cublaslt"],
        # a target without any selection falls back too
        fallback=kinds["fallback"] + sum(t not in covered for t in manifest.targets),
        families=tuple(sorted({s.winner.design.family for s in own})),
        kernel_m=tuple(sorted({s.target.m for s in own})),
        kernel_shapes_m1024=tuple(
            sorted({f"{s.target.m}x{s.target.n}x{s.target.k}" for s in own if s.target.m >= 1024})
        ),
    )


def _x(v: float, nd: int = 2) -> str:
    return f"{v:.{nd}f}x"


def _m_ranges(ms: tuple[int, ...]) -> str:
    return f"{ms[0]}–{ms[-1]}" if len(ms) > 1 else (str(ms[0]) if ms else "–")


def _vendor_line(root: Path) -> str:
    rows = read_results(root / BENCH_RESULTS)
    small, large = Filter(m_max=256), Filter(m_min=1024)
    s, g = summarize(rows, small), summarize(rows, large)
    won = [
        baseline_us(r, "best_vendor") / r["cudal2"]["median_us"]
        for r in rows
        if small.keep(r) and wins(r)
    ]
    best = f" by up to {_x(max(won))}" if won else ""
    return (
        f"Measured beside every vendor in one run (`{BENCH_RESULTS}`, fp16 `tn`, the "
        f"llm-public wheel of that day: {s['own_kernel_targets']} own-kernel targets at "
        f"M ≤ 256, {g['own_kernel_targets']} at M ≥ 1024), cudal2's dispatch is at "
        f"{_x(s['geomean_speedup']['best_vendor'])} the fastest vendor call per shape at "
        f"M ≤ 256 (geomean of {s['shapes']} shapes; it wins {s['wins_vs_best_vendor']}"
        f"{best}) and {_x(g['geomean_speedup']['best_vendor'])} at M ≥ 1024 "
        f"({g['shapes']} shapes)."
    )


def _ceiling_line(root: Path) -> str:
    rows = read_results(root / CEILING_RESULTS)
    g = geomean(r["ceiling_speedup"] for r in rows)
    assert g is not None, f"{CEILING_RESULTS} holds no shapes"
    return (
        "A measured ceiling (a kernel that only moves each shape's bytes, "
        f"`{CEILING_RESULTS}`) bounds any kernel at M ≤ 256 to {_x(g)} the best vendor "
        f"in geomean over {len(rows)} shapes (`docs/kernels.md`)."
    )


def _e2e(root: Path) -> dict[str, Any]:
    return json.loads((root / E2E_RESULTS).read_text())


def _e2e_line(root: Path) -> str:
    d = _e2e(root)
    decode = [c for c in d["cases"] if c["kind"] == "decode"]
    prefill = [c for c in d["cases"] if c["kind"] == "prefill"]
    graph = ", ".join(f"{c['tokens']}: {_x(c['graph']['speedup'], 3)}" for c in decode)
    eager = [c["eager"]["speedup"] for c in decode]
    pre = ", ".join(f"{c['tokens']} tokens: {_x(c['graph']['speedup'], 3)}" for c in prefill)
    text = (
        f"In a transformers Llama-3.1-8B ({d['layers']} layers, fp16, "
        f"{d['patched_layers']} of {d['linear_layers']} linear layers patched with a wheel "
        f"built for them, `{E2E_RESULTS}`), a forward under CUDA graphs is faster by "
        f"decode batch {graph}; prefill {pre}. "
    )
    if d.get("launcher") != "native":
        return text + (
            "Eagerly, decode is host-bound and the wheel's Python launch path makes it "
            f"slower: {_x(min(eager))}–{_x(max(eager))} from an idle GPU (`docs/inference.md`)."
        )
    b2b = [c["back_to_back"]["speedup"] for c in d["cases"]]
    py = [c["back_to_back"]["speedup_python"] for c in d["cases"]]
    return text + (
        "Eagerly, with the native launcher, forwards run back to back at "
        f"{_x(min(b2b))}–{_x(max(b2b))} the unpatched model's speed (decode and prefill; "
        f"the Python launch path: {_x(min(py))}–{_x(max(py))}), and from an idle GPU decode "
        f"at {_x(min(eager))}–{_x(max(eager))} (`docs/inference.md`)."
    )


def _kv_grouped_line(root: Path) -> str:
    """The README's line on generating with a KV cache: ``patch_model``'s defaults against
    the compiled unpatched model (``kv_e2e_default``'s run), and the GEMMs' share alone
    (``kv_e2e_grouped``'s runs: a batch run on several machines gives each figure)."""
    d = json.loads((root / KV_E2E_DEFAULT).read_text())
    env = d["env"]

    def speedups(mode: str) -> str:
        rows = sorted(d["llama"][mode]["batches"].items(), key=lambda x: int(x[0]))
        return ", ".join(f"{b}: {_x(r['paired_speedup'], 3)}" for b, r in rows)

    runs = [
        json.loads((root / f).read_text())
        for f in (KV_E2E_GROUPED, KV_E2E_GROUPED_RULE, KV_E2E_GROUPED_MATH)
    ]
    per: dict[int, list[float]] = {}
    for g in runs:
        for b, r in g["llama"]["grouped"]["batches"].items():
            per.setdefault(int(b), []).append(r["paired_speedup"])
    gemms = ", ".join(
        f"{b}: {_x(min(v), 3) if min(v) == max(v) else f'{min(v):.3f}–{_x(max(v), 3)}'}"
        for b, v in sorted(per.items())
    )
    pf = d["llama"]["prefill"]
    return (
        f"Generating with transformers' static cache over a {env['context']}-token context "
        f"(Llama-3.1-8B, {env['gpu']}, `{KV_E2E_DEFAULT}`), `patch_model`'s defaults (the "
        "fused GEMMs, and the decode attention over the grouped KV heads in place, where "
        "transformers' compiled path copies the cache per query head) decode faster, both "
        f'models compiled (`torch.compile(mode="reduce-overhead")`), by batch '
        f"{speedups('graph')}; eagerly by batch {speedups('eager')}; a "
        f"{pf['tokens']}-token prefill at {_x(pf['speedup'], 3)}. The fused GEMMs' share "
        f"alone (with `rope_kv`), compiled, over {len(runs)} machines: by batch {gemms} "
        '(`docs/inference.md`, "Grouped decode").'
    )


def where_it_stands(root: Path) -> str:
    """The README's block: what each shipped wheel dispatches, then how fast."""
    lines = [
        "What each shipped manifest's wheel dispatches, as `cudal2-build` packages it "
        "without a GPU from the H100 database committed beside it (per target: one of "
        "cudal2's own kernels, an autotuned cuBLASLt algorithm, or the fallback to "
        "`torch.matmul`):",
        "",
        "| manifest | targets | own kernels (targets) | cuBLASLt | fallback | families "
        "| M of own-kernel targets |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for name in SHIPPED:
        s = shipped(root, name)
        m = _m_ranges(s.kernel_m)
        if s.kernel_shapes_m1024:
            m += f" (M ≥ 1024: {', '.join(s.kernel_shapes_m1024)})"
        lines.append(
            f"| `{name}` | {s.targets} | {s.kernels} ({s.kernel_targets}) | {s.cublaslt} "
            f"| {s.fallback} | {', '.join(f'`{f}`' for f in s.families) or '–'} | {m} |"
        )
    lines += ["", _vendor_line(root), _ceiling_line(root), llm_public_steps.shipped_line(root)]
    lines.append(_feed_bound_line(root))
    lines += ["", _e2e_line(root), ""]
    lines.append(_kv_grouped_line(root))
    lines += ["", _fused_prefill_line(root)]
    return "\n".join(lines)


def _fused_prefill_line(root: Path) -> str:
    """The fused prefill end to end (issue 22), from its latest run (with its CUDA-graph
    figure where the run took one)."""
    d = json.loads((root / FUSED_PREFILL_SELECT_E2E).read_text())
    env, pf = d["env"], d["llama"]["prefill"]
    paths = d["llama"]["check"]["report"]["paths"][str(pf["tokens"])]["layers"]
    g = pf.get("graph") or {}
    graph = (
        f", and {g['speedup']:.3f}x captured whole in a CUDA graph ({g['ms']['patched']:.2f} "
        f"against {g['ms']['unpatched']:.2f} ms)"
        if "speedup" in g
        else ""
    )
    return (
        f"The {pf['tokens']}-token prefill of the same model with a measurement wheel of its "
        f"fused GEMMs (`bench/manifests/llama-prefill-fused-h100.toml`, built on an "
        f"{env['gpu'].removeprefix('NVIDIA ')}, `{FUSED_PREFILL_SELECT_E2E}`): "
        f"{pf['speedup']:.3f}x the unpatched model eagerly ({pf['ms']['patched']:.2f} "
        f"against {pf['ms']['unpatched']:.2f} ms){graph}; {paths.get('fused', 0)} of "
        f"{sum(paths.values())} layers fused, {sum(pf['hits'].values())} launches of cudal2's "
        f"kernels and {sum(pf['fallbacks'].values())} fallbacks a prefill (`docs/kernels.md`, "
        f'"The twin path in the selection").'
    )


def llama_e2e(root: Path) -> str:
    """``docs/inference.md``'s table of the end-to-end run; a CUDA-graph speedup above
    1.01 is bold. A run with the native launcher has its eager tables too (back to back
    and from an idle GPU, native and Python launch paths)."""
    d = _e2e(root)
    if d.get("launcher") == "native":
        repeat = _e2e_repeat(root)
        paired = _prefill_paired(root)
        return (
            _llama_e2e_native(d)
            + (f"\n\n{repeat}" if repeat else "")
            + (f"\n\n{paired}" if paired else "")
        )
    lines = [
        "| run | tokens | max err vs fp32, unpatched | patched | eager, unpatched ms "
        "| patched ms | speedup | CUDA graph, unpatched ms | patched ms | speedup |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in d["cases"]:
        e, g = c["eager"], c["graph"]
        gs = _graph_speedup(g)
        lines.append(
            f"| {c['kind']} | {c['tokens']} | {c['err_unpatched_vs_fp32']:.4f} "
            f"| {c['err_patched_vs_fp32']:.4f} | {e['unpatched'] / 1000:.2f} "
            f"| {e['patched'] / 1000:.2f} | {e['speedup']:.3f} | {g['unpatched'] / 1000:.3f} "
            f"| {g['patched'] / 1000:.3f} | {gs} |"
        )
    return "\n".join(lines)


def _graph_speedup(g: dict[str, Any]) -> str:
    """A CUDA-graph speedup cell: bold above 1.01."""
    cell = f"{g['speedup']:.3f}"
    return f"**{cell}**" if g["speedup"] > 1.01 else cell


def _llama_e2e_native(d: dict[str, Any]) -> str:
    lines = [
        "| run | tokens | max err vs fp32, unpatched | patched | back to back, unpatched ms "
        "| native | Python | speedup native | Python | from idle, unpatched ms | native "
        "| Python | speedup native | Python | CUDA graph, unpatched ms | patched ms | speedup |",
        "|---" * 17 + "|",
    ]
    for c in d["cases"]:
        b, e, g = c["back_to_back"], c["eager"], c["graph"]
        ms = b["ms_per_forward"]
        gs = _graph_speedup(g)
        lines.append(
            f"| {c['kind']} | {c['tokens']} | {c['err_unpatched_vs_fp32']:.4f} "
            f"| {c['err_patched_vs_fp32']:.4f} | {ms['unpatched']:.2f} | {ms['patched']:.2f} "
            f"| {ms['patched_python']:.2f} | {b['speedup']:.3f} | {b['speedup_python']:.3f} "
            f"| {e['unpatched'] / 1000:.2f} | {e['patched'] / 1000:.2f} "
            f"| {e['patched_python'] / 1000:.2f} | {e['speedup']:.3f} | {e['speedup_python']:.3f} "
            f"| {g['unpatched'] / 1000:.3f} | {g['patched'] / 1000:.3f} | {gs} |"
        )
    return "\n".join(lines)


# the run before it: the same wheel less its eager alternatives (another lent H100)
E2E_REPEAT = "bench/results/h100-llama-e2e-before-eager-alt.json"


def _e2e_repeat(root: Path) -> str:
    """One line: the speedups of the run before (the same wheel without its eager
    alternatives), to show what they changed and how much eager figures move."""
    path = root / E2E_REPEAT
    if not path.exists():
        return ""
    d = json.loads(path.read_text())

    def col(mode: str) -> str:
        return ", ".join(f"{c['tokens']}: {c[mode]['speedup']:.3f}" for c in d["cases"])

    return (
        f"The run before it, without eager alternatives (`{E2E_REPEAT}`, another lent "
        f"H100): native speedup back to back {col('back_to_back')}; from idle "
        f"{col('eager')}; CUDA graph {col('graph')}."
    )


# the 2,048-token prefill alone, many repetitions, speedups paired per repetition
PREFILL_PAIRED = "bench/results/h100-llama-e2e-prefill-paired.json"


def _prefill_paired(root: Path) -> str:
    """One line: the prefill case measured alone with paired per-repetition ratios."""
    path = root / PREFILL_PAIRED
    if not path.exists():
        return ""
    d = json.loads(path.read_text())
    lines = []
    for c in d["cases"]:
        b = c["back_to_back"]
        lo, hi = b["paired_p20_p80"]
        lines.append(
            f"The {c['tokens']}-token {c['kind']} alone (`{PREFILL_PAIRED}`): back to "
            "back, unpatched / native "
            f"patched paired per repetition {b['paired_speedup']:.4f} (p20–p80 {lo:.4f}–"
            f"{hi:.4f}); from idle {c['eager']['speedup']:.3f}; CUDA graph "
            f"{c['graph']['speedup']:.3f}."
        )
    return "\n".join(lines)


HOST_RESULTS = "bench/results/h100-host-overhead.json"
_HOST_ROWS = (  # (result key, what the path is)
    ("raw_cuLaunchKernelEx_native", "`cuLaunchKernelEx` from C, the native launcher's floor"),
    ("raw_cuLaunchKernel", "`cuLaunchKernel` through cuda-python, arguments prepared once"),
    ("runtime_launch_gemm", "the runtime's `launch_gemm` (Python)"),
    ("op_linear_native", "`torch.ops.<ns>.linear`, native CUDA kernel"),
    ("op_linear_python", "`torch.ops.<ns>.linear`, Python kernel (`CUDAL2_NATIVE=0`)"),
    ("api_linear_native", "`k.linear` on torch tensors (hands the call to the op)"),
    ("api_linear_python", "`k.linear`, Python path"),
    ("patched_module_native", "a patched `nn.Linear` in inference, native"),
    ("patched_module_python", "a patched `nn.Linear` in inference, Python path"),
    ("unpatched_module", "the same `nn.Linear` unpatched (cuBLAS)"),
    ("F_linear", "`F.linear` (cuBLAS)"),
    ("cupy_linear", "`k.linear` on CuPy arrays (Python launcher)"),
)


def host_overhead(root: Path) -> str:
    """``docs/inference.md``'s host cost table: every launch path, one run."""
    d = json.loads((root / HOST_RESULTS).read_text())
    med, spread = d["host_us_per_call"], d["p20_p80_us"]
    m, n, k = d["shape"]
    lines = [
        f"{d['gpu']}, torch {d['torch']}, {m}x{n}x{k} (`{d['entry']}`, ABI `{d['abi']}`), "
        f"launcher: {d.get('launcher', 'python')}; median of {d['batches']} batches of "
        f"{d['calls_per_batch']} calls, paths interleaved in random order (`{HOST_RESULTS}`).",
        "",
        "| path | µs per call | p20–p80 | above its floor (the raw launch from C for a "
        "native path, from Python otherwise) |",
        "|---|---|---|---|",
    ]
    for key, what in _HOST_ROWS:
        if key in med:
            lo, hi = spread[key]
            lines.append(
                f"| {what} | {med[key]:.1f} | {lo:.1f}–{hi:.1f} "
                f"| {d.get('above_floor_us', d['above_raw_launch_us'])[key]:.1f} |"
            )
    if ratios := d.get("ratios"):
        lines += ["", "Ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(ratios.items()))]
    return "\n".join(lines)


VENDOR_RUN = "bench/results/h100-llm-public.jsonl"  # the run docs/measuring.md reports


def floor_fractions(root: Path) -> str:
    """``docs/measuring.md``'s table: how close the vendors come to the physical floor,
    per M bucket (the median of floor / time, Lt-autotune and best vendor)."""
    import statistics

    from cudal2.bench.report import M_BUCKETS

    rows = read_results(root / VENDOR_RUN)
    cols = [(d, mo) for mo in ("offline", "server") for d in ("fp16", "bf16")]
    lines = [
        f"`{VENDOR_RUN}`: median fraction of the physical floor by M bucket "
        "(Lt-autotune / best vendor):",
        "",
        "| M | " + " | ".join(f"{d} {mo}" for d, mo in cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for lo, hi in M_BUCKETS:
        cells, shapes = [], 0
        for d, mo in cols:
            f = Filter(mode=mo, dtype=d, m_min=lo, m_max=hi)
            kept = [r for r in rows if f.keep(r)]
            shapes = max(shapes, len(kept))
            lt = [
                r["floor_us"] / r["baselines"]["cublaslt_autotune"]["median_us"]
                for r in kept
                if "cublaslt_autotune" in r["baselines"]
            ]
            bv = [r["floor_us"] / baseline_us(r, "best_vendor") for r in kept]
            cells.append(
                f"{statistics.median(lt):.3f} / {statistics.median(bv):.3f}" if kept else "–"
            )
        if shapes:
            label = f"{lo}–{hi}" if hi < (1 << 31) else f"≥ {lo}"
            lines.append(f"| {label} ({shapes} shapes) | " + " | ".join(cells) + " |")
    s = summarize(rows, Filter())
    g = s["geomean_speedup"]
    lines += [
        "",
        f"Geomean speedup of cudal2's dispatch over each baseline, fp16 offline "
        f"({s['shapes']} shapes; {s['own_kernel_targets']} ran an own kernel): cuBLAS "
        f"{g['cublas']:.3f}, Lt heuristic {g['cublaslt_heuristic']:.3f}, Lt autotune "
        f"{g['cublaslt_autotune']:.3f}, best vendor {g['best_vendor']:.3f}; floor fraction "
        f"median {s['floor_fraction_median']:.3f}.",
    ]
    return "\n".join(lines)


POLICY_EVALS = (  # (column, results file of ``cudal2-policy eval --out``)
    ("policy", "bench/results/h100-policy-eval.json"),
    ("policy, --online", "bench/results/h100-policy-eval-online.json"),
    ("policy, --restriction grammar", "bench/results/h100-policy-eval-grammar.json"),
)


def policy_eval(root: Path) -> str:
    """``docs/policy.md``'s replay table: median best-found / best-known per k."""
    runs = [(name, json.loads((root / f).read_text())) for name, f in POLICY_EVALS]
    base = runs[0][1]
    seeds = base["seeds"]
    ks = sorted(base["k"], key=int)
    head = [name for name, _ in runs] + [f"random ({seeds['random']} seeds)", "grid"]
    lines = [
        f"Median over {base['holdout_targets']} held-out targets of best-found / best-known "
        f"({seeds['policy']} policy seeds; " + ", ".join(f"`{f}`" for _, f in POLICY_EVALS) + "):",
        "",
        "| k | " + " | ".join(head) + " |",
        "|---" * (len(head) + 1) + "|",
    ]
    for k in ks:
        cells = [f"{r['k'][k]['policy']:.3f}" for _, r in runs]
        cells += [f"{base['k'][k]['random']:.3f}", f"{base['k'][k]['grid']:.3f}"]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines.append("")
    for fam, g in base["by_family"].items():
        pol = " / ".join(f"{g['k'][k]['policy']:.3f}" for k in ks)
        grid = " / ".join(f"{g['k'][k]['grid']:.3f}" for k in ks)
        lines.append(f"- {fam}, {g['targets']} targets: policy {pol}; grid {grid}.")
    return "\n".join(lines)


# docs/policy.md's table of the v5 retrains: (the checkpoint's training seed and corpus,
# the corpus replayed, the results files of its three replays: replay, --online,
# --restriction grammar; None where one was not run).
# Every corpus holds the same 12 held-out targets with the same rows; they differ in the
# training targets' rows (the prompt's neighbours, the legal space's v5 designs).
_EVAL = "bench/results/h100-policy-eval"
POLICY_RETRAIN_EVALS = ("replay", "--online", "--restriction grammar")
_ALL = "+ all v5 sweeps"
_THREE = ("", "-online", "-grammar")
POLICY_RETRAIN = (
    ("0 on committed (the committed one)", "committed", tuple(f for _, f in POLICY_EVALS)),
    (
        "0 on committed (the committed one)",
        "+ fp16 v5 sweep",
        (f"{_EVAL}-v5-corpus.json", None, None),
    ),
    (
        "0 on committed (the committed one)",
        _ALL,
        tuple(f"{_EVAL}-v5-sweeps-committed{m}.json" for m in _THREE),
    ),
    ("1 on committed", "committed", (f"{_EVAL}-room-seed1.json", None, None)),
    ("2 on committed", "committed", (f"{_EVAL}-room-seed2.json", None, None)),
    ("0 on + fp16 v5 sweep", "+ fp16 v5 sweep", (f"{_EVAL}-v5-retrain.json", None, None)),
    ("0 on + all v5 sweeps", _ALL, tuple(f"{_EVAL}-v5-sweeps-seed0{m}.json" for m in _THREE)),
    (
        "0 on + all v5 sweeps",
        "committed",
        (f"{_EVAL}-v5-sweeps-seed0-committed-corpus.json", None, None),
    ),
    ("1 on + all v5 sweeps", _ALL, (f"{_EVAL}-v5-sweeps-seed1.json", None, None)),
    (
        "1 on + all v5 sweeps",
        "committed",
        (f"{_EVAL}-v5-sweeps-seed1-committed-corpus.json", None, None),
    ),
    ("2 on + all v5 sweeps", _ALL, (f"{_EVAL}-v5-sweeps-seed2.json", None, None)),
    (
        "2 on + all v5 sweeps",
        "committed",
        (f"{_EVAL}-v5-sweeps-seed2-committed-corpus.json", None, None),
    ),
)


def policy_retrain(root: Path) -> str:
    """``docs/policy.md``'s table of the v5 retrains: each checkpoint on each corpus, its
    replays' medians at every k ("not run" where a replay was not run)."""
    ks = sorted(json.loads((root / POLICY_EVALS[0][1]).read_text())["k"], key=int)
    lines = [
        "Median over the 12 held-out targets of best-found / best-known at k = "
        + " / ".join(ks)
        + ":",
        "",
        "| checkpoint: seed on corpus | replayed on | " + " | ".join(POLICY_RETRAIN_EVALS) + " |",
        "|---|---|" + "---|" * len(POLICY_RETRAIN_EVALS),
    ]
    for checkpoint, corpus, files in POLICY_RETRAIN:
        cells = []
        for f in files:
            if f is None:
                cells.append("not run")
                continue
            r = json.loads((root / f).read_text())
            if sorted(r["k"], key=int) != ks:
                raise ValueError(f"{f}: k = {sorted(r['k'], key=int)}, the table's are {ks}")
            cells.append(" / ".join(f"{r['k'][k]['policy']:.3f}" for k in ks))
        lines.append(f"| {checkpoint} | {corpus} | " + " | ".join(cells) + " |")
    named = [
        f for *_, fs in POLICY_RETRAIN for f in fs if f and f not in dict(POLICY_EVALS).values()
    ]
    lines += ["", "Results files: " + ", ".join(f"`{f}`" for f in named) + "."]
    return "\n".join(lines)


PDL_TIMING = "bench/results/h100-pdl-timing.json"
PDL_PAIR = "bench/results/h100-pdl-pair.json"


def pdl_timing(root: Path) -> str:
    """``docs/kernels.md``'s PDL table: each target's recorded best kernel launched
    plainly and with each trigger, offline (a graph of back-to-back calls), and the
    pair sample's outcome (``ci/gpu_pdl.sh``)."""
    d = json.loads((root / PDL_TIMING).read_text())
    pairs = json.loads((root / PDL_PAIR).read_text())
    passed = sum(r["status"] == "ok" and r["pair_check"] == 1.0 for r in pairs)
    families = sorted({r["family"] for r in pairs})
    by_target: dict[str, dict[str, Any]] = {}
    for r in d["rows"]:
        by_target.setdefault(r["target"], {"plain": r, "triggers": {}})["triggers"][
            r["trigger"]
        ] = r
    triggers = ("entry", "after_mainloop", "before_epilogue")
    lines = [
        f"{d['gpu']}; offline timing (a graph of back-to-back calls of one kernel), "
        f"torch in the same process (`{PDL_TIMING}`). PDL µs, and plain / PDL in brackets.",
        "",
        "| target | kernel (plain) | plain µs | " + " | ".join(triggers) + " | torch µs |",
        "|---|---|---|" + "---|" * len(triggers) + "---|",
    ]
    for target, g in by_target.items():
        p = g["plain"]
        cells = []
        for t in triggers:
            r = g["triggers"].get(t)
            cells.append(f"{r['pdl_us']:.1f} ({r['plain_over_pdl']:.2f})" if r else "—")
        lines.append(
            f"| {target} | `{p['kernel']}` | {p['plain_us']:.1f} | "
            + " | ".join(cells)
            + f" | {p['torch_us']:.1f} |"
        )
    lines += [
        "",
        f"Geomean plain / PDL over every trigger: {d['geomean_plain_over_pdl']:.3f}; with the "
        f"best trigger per target: {d['geomean_best_trigger']:.3f}. Pair check on the sample "
        f"(one PDL design per family and trigger, `{PDL_PAIR}`): {passed} of {len(pairs)} "
        f"passed ({', '.join(families)}).",
    ]
    return "\n".join(lines)


EAGER_HOST = "bench/results/h100-eager-host.json"
EAGER_HOST_BEFORE = "bench/results/h100-eager-host-before-eager-alt.json"


def eager_host(root: Path) -> str:
    """``docs/inference.md``'s eager host tables: a forward's host time with the GPU held
    busy (``bench/experiments/eager_host.py``), patched against unpatched, and each
    linear shape's host µs per call with what the table runs for it; the wheel before
    its eager alternatives, then with them."""
    return "\n\n".join(
        f"**{what}**\n\n" + _eager_host_tables(root, path)
        for what, path in (
            ("Before eager alternatives", EAGER_HOST_BEFORE),
            ("With eager alternatives", EAGER_HOST),
        )
        if (root / path).exists()
    )


def _eager_host_tables(root: Path, path: str) -> str:
    d = json.loads((root / path).read_text())
    tokens = sorted(d["forward"], key=int)
    lines = [
        f"{d['gpu']}, torch {d['torch']}, launcher: {d['launcher']}, {d['layers']} layers, "
        f"{d['reps']} repetitions, models interleaved in random order (`{path}`).",
        "",
        "| tokens | host ms per forward, unpatched | patched | unpatched / patched, paired "
        "(p20–p80) |",
        "|---|---|---|---|",
    ]
    for t in tokens:
        f = d["forward"][t]
        lo, hi = f["paired_p20_p80"]
        lines.append(
            f"| {t} | {f['host_ms']['unpatched']:.1f} | {f['host_ms']['patched']:.1f} | "
            f"{f['paired_unpatched_over_patched']:.3f} ({lo:.3f}–{hi:.3f}) |"
        )
    order = ("q_proj", "k_proj", "o_proj", "gate_proj", "down_proj", "lm_head")
    names = sorted(
        d["linear"][tokens[0]],
        key=lambda n: (n not in order, order.index(n) if n in order else 0, n),
    )
    lines += [
        "",
        "Host µs per call of one layer's linears (200 back to back, GPU held busy), "
        "unpatched / patched, and what the patched call runs:",
        "",
        "| tokens | "
        + " | ".join(
            f"{n} ({d['linear'][tokens[0]][n]['n']}×{d['linear'][tokens[0]][n]['k']})"
            for n in names
        )
        + " |",
        "|---|" + "---|" * len(names),
    ]
    for t in tokens:
        cells = []
        for n in names:
            r = d["linear"][t][n]
            what = _served_label(r["served"])
            cells.append(f"{r['host_us']['unpatched']:.1f} / {r['host_us']['patched']:.1f} {what}")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _served_label(served: str) -> str:
    """What a linear call ran, short: kernel, cublaslt, torch, or eager (an eager
    alternative's hit, counted under its entry's key + ``/eager``)."""
    if served.endswith("/eager"):
        return "eager"
    return served.split(" ")[0].replace("fallback:", "torch")


PDL_PUBLIC = "bench/results/h100-llm-public-pdl.jsonl"


def pdl_public(root: Path) -> str:
    """``docs/kernels.md``'s llm-public-with-PDL table: the wheel of
    ``bench/manifests/llm-public-pdl-h100.toml`` against every vendor, M <= 256
    (``ci/gpu_pdl_public.sh``), per dtype and timing mode."""
    rows = read_results(root / PDL_PUBLIC)
    lines = [
        f"{rows[0]['gpu']['name']}, torch {rows[0]['gpu']['torch']} "
        f"(`{PDL_PUBLIC}`; `cudal2-bench summarize … --m-max 256`):",
        "",
        "| dtype | mode | shapes | geomean vs best vendor | vs torch | own kernels (PDL) | "
        "cuBLASLt | fallback | own kernel beats best vendor beyond spread | min / max vs best "
        "vendor |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for dtype in ("fp16", "bf16"):
        for mode in ("offline", "server"):
            f = Filter(mode=mode, dtype=dtype, m_max=256)
            kept = [r for r in rows if f.keep(r) and r["cudal2"]["median_us"]]
            s = summarize(rows, f)
            kinds = [r["cudal2"]["dispatch"]["kind"] for r in kept]
            pdl = sum("_pdl_" in (r["cudal2"]["dispatch"].get("kernel") or "") for r in kept)
            x = [r["best_vendor"]["median_us"] / r["cudal2"]["median_us"] for r in kept]
            g = s["geomean_speedup"]
            lines.append(
                f"| {dtype} | {mode} | {s['shapes']} | {g['best_vendor']:.3f} | {g['torch']:.3f} "
                f"| {kinds.count('kernel')} ({pdl}) | {kinds.count('cublaslt')} | "
                f"{kinds.count('fallback')} | {s['wins_vs_best_vendor']} | "
                f"{min(x):.3f} / {max(x):.3f} |"
            )
    return "\n".join(lines)


LAYER_RESULTS = "bench/results/h100-layer.json"  # cudal2-bench layer --out, on the H100


def layer_bench(root: Path) -> str:
    """The layer benchmark's table (``cudal2-bench layer``'s markdown of ``LAYER_RESULTS``)."""
    from cudal2.bench.layer_run import load_results, markdown_table

    path = root / LAYER_RESULTS
    if not path.exists():
        raise ResultsMissing(
            f"{LAYER_RESULTS} is not committed: run ci/gpu_layer.sh on the H100 and commit "
            "its layer.json there (docs/inference.md, 'The layer benchmark')"
        )
    return f"`{LAYER_RESULTS}`: " + markdown_table(load_results(path.read_text(), LAYER_RESULTS))


LAYER_PROFILE = "bench/results/h100-layer-profile.json"  # ci/gpu_layer_profile.sh, H100
READ_CEILING = "bench/results/h100-read-ceiling.jsonl"  # bench/experiments/read_ceiling.py


def layer_ceiling(root: Path) -> str:
    """The layer's read ceiling (``cudal2.bench.layer_profile``): per profiled case, the
    spans, the GEMMs against a pure read of their bytes, and the two ceilings."""
    from cudal2.bench.layer_profile import load

    prof = json.loads((root / LAYER_PROFILE).read_text())
    rows = load((root / LAYER_PROFILE).read_text(), (root / READ_CEILING).read_text())
    lines = [
        f"{prof['gpu']}, torch {prof['torch']}, package `{prof['package']}` "
        f"(`{LAYER_PROFILE}`, read times from `{READ_CEILING}`). µs per layer under graph "
        "replay with the profiler on (its overhead makes spans a little longer than the "
        "benchmark's).",
        "",
        "| model | dtype | M | vendor µs | cudal2 µs | speedup | cudal2 GEMM kernels µs | "
        "pure reads µs | GEMMs / reads | cudal2's other kernels µs (attention) | "
        "ceiling, today's other kernels | ceiling, attention only |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['dtype']} | {r['m']} | {r['vendor_us']:.1f} | "
            f"{r['cudal2_us']:.1f} | {r['speedup']:.3f} | {r['cudal2_gemm_us']:.1f} | "
            f"{r['read_us']:.1f} | {r['cudal2_gemm_us'] / r['read_us']:.3f} | "
            f"{r['cudal2_rest_us']:.1f} ({r['cudal2_attention_us']:.1f}) | "
            f"{r['ceiling']:.3f} | {r['ceiling_attention_only']:.3f} |"
        )
    lines += [
        "",
        "Geomean ceiling, today's other kernels: "
        f"{geomean([r['ceiling'] for r in rows]):.3f}; attention only: "
        f"{geomean([r['ceiling_attention_only'] for r in rows]):.3f}.",
    ]
    return "\n".join(lines)


LAYER_DB = "bench/manifests/layer-epilogues-h100.measurements.jsonl.gz"  # its H100 records
SPLITK_FAMILIES = ("sm90direct", "sm90stream")


def splitk_epilogues(root: Path) -> str:
    """``docs/kernels.md``'s table of the decode families' fused epilogues at M = 1, from
    the layer manifest's H100 database: per epilogue target, the fastest correct fused
    kernel of sm90direct / sm90stream and of sm90tma, the plain GEMM's fastest own kernel,
    and torch's unfused op timed beside the fused kernel (offline)."""
    from cudal2.database import MeasurementDB, latest

    ms = [m for m in latest(MeasurementDB(root / LAYER_DB).read()) if m.target.m == 1]
    ok = [m for m in ms if m.status == "ok" and m.median_us and m.design is not None]

    def best(target: Any, families: tuple[str, ...] | None = None) -> Any:
        got = [
            m for m in ok
            if m.target == target and (families is None or m.design.family in families)
        ]  # fmt: skip
        return min(got, key=lambda m: m.median_us) if got else None

    lines = [
        f"`{LAYER_DB}` (the layer manifest's H100 database), M = 1, offline; µs of the "
        "fastest correct kernel of each kind.",
        "",
        "| dtype | N×K | epilogue | sm90direct / sm90stream fused | sm90tma fused | "
        "plain GEMM, fastest own | torch unfused | unfused / fastest fused |",
        "|---|---|---|---|---|---|---|---|",
    ]
    targets = sorted({m.target for m in ok if m.target.epilogue != "none"}, key=str)
    for t in targets:
        split, tma = best(t, SPLITK_FAMILIES), best(t, ("sm90tma",))
        plain = best(t.plain)
        fused = min((x for x in (split, tma) if x), key=lambda m: m.median_us)
        torch_us = fused.baselines_us["torch"]

        def us(m: Any) -> str:
            return f"{m.median_us:.1f}" if m else "–"

        lines.append(
            f"| {t.dtype} | {t.n}×{t.k} | {t.epilogue} | {us(split)} | {us(tma)} | "
            f"{us(plain)} | {torch_us:.1f} | {torch_us / fused.median_us:.3f} |"
        )
    return "\n".join(lines)


KV_E2E = "bench/results/h100-llama-kv-e2e.json"  # ci/gpu_e2e_kv.sh on the H100


def llama_kv_e2e(root: Path) -> str:
    """``docs/inference.md``'s end to end with a KV cache on the H100 (the GEMMs' patch)."""
    return _kv_e2e_table(root, KV_E2E)


# ci/gpu_e2e_default.sh on an H200: patch_model's defaults (grouped decode, "math" form)
KV_E2E_DEFAULT = "bench/results/h200-llama-kv-e2e-default.json"


def kv_e2e_default(root: Path) -> str:
    """``docs/inference.md``'s end to end with ``patch_model``'s defaults (on an H200)."""
    return _kv_e2e_table(root, KV_E2E_DEFAULT)


def _run_env(env: dict[str, Any]) -> str:
    """An end-to-end run's GPU, torch, transformers and package, as its blocks open."""
    return (
        f"{env['gpu']}, torch {env['torch']}, transformers {env['transformers']}, package "
        f"`{env['package']}`"
    )


def _patch_settings(env: dict[str, Any]) -> str:
    """How a run's patched model was patched, from its env (runs before ``grouped_decode``
    existed record neither key: their patch was the GEMMs')."""
    if "grouped_decode" not in env:
        return ""
    grouped = json.dumps(env.get("grouped_variant", "sdpa")) if env["grouped_decode"] else "False"
    return f" Patched: `patch_model(rope_kv={env['rope_kv']}, grouped_decode={grouped})`."


def _logits(c: dict[str, Any]) -> str:
    """One ``llama_kv_e2e.py`` logits check, as the tables say it."""
    return (
        f"(a {c['prompt'][0]}x{c['prompt'][1]} prompt and {c['decode_steps']} decode steps) "
        f"against fp32: unpatched {c['err_unpatched_vs_fp32']:.4f}, patched "
        f"{c['err_patched_vs_fp32']:.4f} (at most {c['tolerance']:g}x: "
        f"{'passes' if c['ok'] else 'FAILS'})"
    )


def _kv_e2e_table(root: Path, path: str) -> str:
    """One ``llama_kv_e2e.py`` run's table: decode tokens/s per model, mode and batch,
    prefill, the logits check, the patch's memory and the path Qwen2's layers took."""
    d = json.loads((root / path).read_text())
    env = d["env"]
    lines = [
        f"{_run_env(env)} ({env['launcher']} launcher), {env['layers']} layers, context "
        f"{env['context']} tokens (`{path}`). Graphs: {env['compile']}.{_patch_settings(env)}",
        "",
        "| model | mode | batch | unpatched tok/s | patched tok/s | speedup (paired p20–p80) |",
        "|---|---|---:|---:|---:|---|",
    ]
    for model in ("llama", "qwen2"):
        for mode in ("graph", "eager"):
            for b, r in sorted(
                d[model].get(mode, {}).get("batches", {}).items(), key=lambda x: int(x[0])
            ):
                lo, hi = r["paired_p20_p80"]
                lines.append(
                    f"| {model} | {mode} | {b} | {r['tokens_per_s']['unpatched']:.1f} | "
                    f"{r['tokens_per_s']['patched']:.1f} | {r['paired_speedup']:.3f} "
                    f"({lo:.3f}–{hi:.3f}) |"
                )
    pf = d["llama"]["prefill"]
    c = d["llama"]["check"]["correctness"]
    mem = d["llama"]["check"]["memory"]
    added = sum(mem["patch_memory"].values())
    lines += [
        "",
        f"Prefill of {pf['tokens']} tokens (eager): unpatched {pf['ms']['unpatched']:.1f} ms, "
        f"patched {pf['ms']['patched']:.1f} ms, speedup {pf['speedup']:.3f}. Logits "
        f'{_logits(c)}. Memory the patch added (`originals="keep"`): '
        f"{added / 2**30:.2f} GiB, {added / mem['model_bytes']:.1%} of the model's "
        f"{mem['model_bytes'] / 2**30:.2f} GiB.",
    ]
    q = (d.get("qwen2") or {}).get("report")
    if q:  # the paths Qwen2's layers took at batch 1, and its GEMMs without a kernel
        paths = ", ".join(f"{k} {n}" for k, n in q["paths"]["1"]["layers"].items())
        none = [g for g, r in q["per_gemm"].items() if not r["entry_in_layers"]]
        lines[-1] += (
            f" Qwen2-7B's layers at batch 1: {paths}"
            + (f" (no kernel entry for {', '.join(none)})" if none else "")
            + "."
        )
    return "\n".join(lines)


# Issue 22's fused prefill, its first run on a lent H200 (2026-12-05): the check and
# prefill parts with the wheel of bench/manifests/llama-prefill-fused-h100.toml
# (bash ci/gpu_prefill_fused.sh)
FUSED_PREFILL_E2E = "bench/results/h200-llama-prefill-fused-e2e.json"
# ... its second run (2026-12-05): R by TMA, the row scale (qkv) and the fast activation,
# the gated vendor baseline by halves, torch's RMSNorm as five ops
FUSED_PREFILL_ROWS_E2E = "bench/results/h200-llama-prefill-fused-rows-e2e.json"
# ... its third run (2026-12-05): the row scale's sums kept across tiles, the twins after
# F.rms_norm
FUSED_PREFILL_TWINS_E2E = "bench/results/h200-llama-prefill-fused-twins-e2e.json"
# ... its fourth, on a lent H100 (2026-12-05): the twin path in the selection, and the
# prefill captured whole in a CUDA graph too
FUSED_PREFILL_SELECT_E2E = "bench/results/h100-llama-prefill-fused-select-e2e.json"


def fused_prefill_e2e(root: Path, path: str = FUSED_PREFILL_E2E) -> str:
    """``docs/kernels.md``'s fused prefill end to end: the run's table, and the path its
    layers took at the prefill's M (``patch.report``)."""
    d = json.loads((root / path).read_text())
    env, pf, check = d["env"], d["llama"]["prefill"], d["llama"]["check"]
    paths = check["report"]["paths"][str(pf["tokens"])]["layers"]
    took = ", ".join(f"{k} {n}" for k, n in paths.items())
    lo, hi = (pf["p20_p80_ms"][k] for k in ("unpatched", "patched"))
    return (
        f"{_run_env(env)} ({env['launcher']} launcher), {env['layers']} layers "
        f"(`{path}`). Prefill of {pf['tokens']} tokens (eager, medians of "
        f"{env['reps']}): unpatched {pf['ms']['unpatched']:.2f} ms (p20–p80 "
        f"{lo[0]:.2f}–{lo[1]:.2f}), patched {pf['ms']['patched']:.2f} ms "
        f"({hi[0]:.2f}–{hi[1]:.2f}), speedup {pf['speedup']:.3f}. The layers at M = "
        f"{pf['tokens']}: {took}; one patched prefill's kernel hits "
        f"{sum(pf['hits'].values())}, its last logits "
        f"{pf['max_diff_patched_vs_unpatched']:g} from the unpatched model's. Logits "
        f"{_logits(check['correctness'])}.{_prefill_graph(pf.get('graph'))}"
    )


def _prefill_graph(g: dict | None) -> str:
    """The prefill captured whole in a CUDA graph, where the run took it (after
    2026-12-05): its replays' medians, or the capture's errors."""
    if g is None:
        return ""
    if "errors" in g:
        return (
            " Under a CUDA graph: not captured ("
            + "; ".join(f"{k}: {e}" for k, e in sorted(g["errors"].items()))
            + ")."
        )
    lo, hi = (g["p20_p80_ms"][k] for k in ("unpatched", "patched"))
    diff = g["max_diff_graph_vs_eager"]
    return (
        f" Captured whole in a CUDA graph (replays, CUDA events): unpatched "
        f"{g['ms']['unpatched']:.2f} ms ({lo[0]:.2f}–{lo[1]:.2f}), patched "
        f"{g['ms']['patched']:.2f} ms ({hi[0]:.2f}–{hi[1]:.2f}), speedup "
        f"{g['speedup']:.3f}; the graphs' last logits {diff['unpatched']:g} and "
        f"{diff['patched']:g} from their eager prefills'."
    )


# Qwen2-7B's part again with its batch-1 logits check (``correctness_b1``), on another
# lent H200 (2026-12-04): PARTS=qwen2 bash ci/gpu_e2e_default.sh
KV_E2E_QWEN2_B1 = "bench/results/h200-llama-kv-e2e-qwen2-b1.json"


def kv_e2e_qwen2_b1(root: Path) -> str:
    """``docs/inference.md``'s Qwen2-7B batch-1 check: its logits at batch 1 (where the
    wheel's Qwen2 entries are) against fp32, and the part's speedups beside it."""
    d = json.loads((root / KV_E2E_QWEN2_B1).read_text())
    env, q = d["env"], d["qwen2"]
    parts = [_logits(q[name]) for name in ("correctness", "correctness_b1")]
    speed = []
    for mode in ("graph", "eager"):
        for b, r in sorted(q.get(mode, {}).get("batches", {}).items(), key=lambda x: int(x[0])):
            lo, hi = r["paired_p20_p80"]
            speed.append(f"{mode} at batch {b} {r['paired_speedup']:.3f} ({lo:.3f}–{hi:.3f})")
    return (
        f"{_run_env(env)} ({env['launcher']} launcher) (`{KV_E2E_QWEN2_B1}`). Qwen2-7B's "
        "logits "
        + "; ".join(parts)
        + ". Its paired speedups in the same run: "
        + ", ".join(speed)
        + "."
    )


# The same wheel's records on a second lent H100 (2026-11-25): graph decode again, and the
# bound without RoPE and the cache write (llama_kv_e2e.py --part bound)
KV_E2E_2 = "bench/results/h100-llama-kv-e2e-machine2.json"


def kv_e2e_bound(root: Path) -> str:
    """``docs/inference.md``'s second H100: the graph decode per batch beside the first
    H100's (``KV_E2E``), and the bound of a qkv epilogue doing RoPE and the cache write."""
    first = json.loads((root / KV_E2E).read_text())["llama"]["graph"]["batches"]
    d = json.loads((root / KV_E2E_2).read_text())
    env, graph, bound = d["env"], d["llama"]["graph"]["batches"], d["llama"]["bound"]["batches"]
    m = env["machine"]
    lines = [
        f"{env['gpu']} (serial {m['nvidia_smi_serial']}, power limit {m['power_limit_w']} W, "
        f"driver {m['driver']}), torch {env['torch']}, package `{env['package']}` "
        f"(`{KV_E2E_2}`; the first H100's figures from `{KV_E2E}`). ms per decode step under "
        "graphs; speedups paired per block (p20–p80).",
        "",
        "| batch | target | first H100: unpatched / patched ms, speedup | this H100: unpatched / "
        "patched ms, speedup | bound run: unpatched / patched / no RoPE nor cache write ms | "
        "speedup patched | speedup without RoPE and the cache write |",
        "|---:|---:|---|---|---|---|---|",
    ]

    def pair(r: dict, key: str = "") -> str:
        lo, hi = r[f"paired_p20_p80{key}"]
        return f"{r[f'paired_speedup{key}']:.3f} ({lo:.3f}–{hi:.3f})"

    for b in sorted(bound, key=int):
        f, g, r = first.get(b), graph.get(b), bound[b]
        ms = r["ms_per_step"]
        cells = [
            b,
            f"{KV_TARGETS[b]:.2f}",
            f"{f['ms_per_step']['unpatched']:.3f} / {f['ms_per_step']['patched']:.3f}, {pair(f)}"
            if f
            else "–",
            f"{g['ms_per_step']['unpatched']:.3f} / {g['ms_per_step']['patched']:.3f}, {pair(g)}"
            if g
            else "–",
            f"{ms['unpatched']:.3f} / {ms['patched']:.3f} / {ms['bound']:.3f}",
            pair(r),
            pair(r, "_bound"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"{env['note'][0].upper()}{env['note'][1:]}."]
    return "\n".join(lines)


KV_E2E_ROPE = "bench/results/h100-llama-kv-e2e-rope.json"  # ROPE_KV=1 ci/gpu_e2e_kv.sh
KV_PROFILE_ROPE = (
    "bench/results/h100-kv-decode-profile-b1-rope.json"  # ROPE_KV=1 ci/gpu_kv_profile.sh
)
KV_PROFILE_2 = "bench/results/h100-kv-decode-profile-b1-machine2.json"


def _by_kernel(profile: dict, side: str) -> list[dict]:
    return profile["batches"]["1"][side]["kernels"]


def _sdpa_prep(kernels: list[dict]) -> float:
    """µs per step of the Triton kernels that prepare SDPA's operands (the GQA expand's
    clone of the cache, the mask, RoPE where it is fused there)."""
    return sum(
        k["us_per_step"]
        for k in kernels
        if k["kernel"].startswith("triton_") and "scaled_dot_product" in k["kernel"]
    )


def kv_e2e_rope(root: Path) -> str:
    """``docs/inference.md``'s ``rope_kv=True`` decode: the graph decode per batch with
    RoPE and the cache write in the qkv kernel, beside the two earlier H100s and the
    bound; the correctness check; the b1 profile's qkv and SDPA-prep kernels against the
    second H100's profile of the same step without the fusion."""
    first = json.loads((root / KV_E2E).read_text())["llama"]["graph"]["batches"]
    second = json.loads((root / KV_E2E_2).read_text())["llama"]
    d = json.loads((root / KV_E2E_ROPE).read_text())
    env, graph, check = d["env"], d["llama"]["graph"]["batches"], d["llama"]["check"]
    lines = [
        f"{_run_env(env)} ({env['launcher']} launcher, `{KV_E2E_ROPE}`; the earlier "
        f"H100s from `{KV_E2E}` and `{KV_E2E_2}`). ms per decode step under graphs; "
        "speedups paired per block (p20–p80).",
        "",
        "| batch | target | first H100: unpatched / patched, speedup | second H100: unpatched "
        "/ patched, speedup (bound: no RoPE nor cache write) | this H100: unpatched / "
        "patched with `rope_kv` | speedup |",
        "|---:|---:|---|---|---|---|",
    ]
    targets = {"1": 1.12, "16": 1.12, "64": 1.05}
    for b, r in sorted(graph.items(), key=lambda x: int(x[0])):
        f = first[b]["ms_per_step"]
        sec = second["graph"]["batches"][b]
        bound = second["bound"]["batches"].get(b, {})
        bound_txt = (
            f" ({bound['ms_per_step']['bound']:.3f})"
            if "bound" in bound.get("ms_per_step", {})
            else ""
        )
        p20, p80 = r["paired_p20_p80"]
        lines.append(
            f"| {b} | {targets.get(b, float('nan')):.2f} | {f['unpatched']:.3f} / "
            f"{f['patched']:.3f}, {first[b]['paired_speedup']:.3f} | "
            f"{sec['ms_per_step']['unpatched']:.3f} / {sec['ms_per_step']['patched']:.3f}, "
            f"{sec['paired_speedup']:.3f}{bound_txt} | {r['ms_per_step']['unpatched']:.3f} / "
            f"{r['ms_per_step']['patched']:.3f} | **{r['paired_speedup']:.3f}** "
            f"({p20:.3f}–{p80:.3f}) |"
        )
    c = check["correctness"]
    old = json.loads((root / KV_PROFILE_2).read_text())
    new = json.loads((root / KV_PROFILE_ROPE).read_text())
    p0, p1 = _sdpa_prep(_by_kernel(old, "patched")), _sdpa_prep(_by_kernel(new, "patched"))
    s0, s1 = old["batches"]["1"]["patched"], new["batches"]["1"]["patched"]
    roles = ", ".join(
        f"{role} {s0['by_role_us'][role]:.0f} → {s1['by_role_us'][role]:.0f}"
        for role in ("gemm", "elementwise", "attention")
    )
    lines += [
        "",
        f"Logits (a {c['prompt'][0]}x{c['prompt'][1]} prompt and {c['decode_steps']} decode "
        f"steps) against fp32: unpatched {c['err_unpatched_vs_fp32']}, patched "
        f"{c['err_patched_vs_fp32']} (at most {c['tolerance']:g}x: "
        f"{'passes' if c['ok'] else 'fails'}).",
        "",
        f"The patched step at batch 1 profiled (`{KV_PROFILE_ROPE}` against the second "
        f"H100's `{KV_PROFILE_2}`, µs per step): span {s0['span_us']:.0f} → "
        f"{s1['span_us']:.0f}, kernels summed {s0['kernel_sum_us']:.0f} → "
        f"{s1['kernel_sum_us']:.0f} ({roles}; a PDL kernel launched early counts its wait, "
        f"so sums exceed spans); of attention, the Triton kernels preparing SDPA's operands "
        f"(the GQA expand's copy of the cache, the mask) {p0:.0f} → {p1:.0f}; launches "
        f"{s0['launches_per_step']:.0f} → {s1['launches_per_step']:.0f}; GPU idle "
        f"{s0['idle_us']:.0f} → {s1['idle_us']:.0f}.",
    ]
    return "\n".join(lines)


# ci/gpu_e2e_grouped.sh on an H200: the "sdpa" form at every batch (1, 16, 64), then with
# GROUPED_MIN_KV_ROWS (1, 4; another machine), then the "math" form (1, 4, 16, 64; a
# third); bench/experiments/grouped_sdpa.py
KV_E2E_GROUPED = "bench/results/h200-llama-kv-e2e-grouped.json"
KV_E2E_GROUPED_RULE = "bench/results/h200-llama-kv-e2e-grouped-rule.json"
KV_E2E_GROUPED_MATH = "bench/results/h200-llama-kv-e2e-grouped-math.json"
GROUPED_SDPA = "bench/results/h200-grouped-sdpa.json"


def kv_e2e_grouped(root: Path) -> str:
    """``docs/inference.md``'s grouped decode: per run and batch, the graph decode of the
    unpatched model, the patched one (GEMMs, ``rope_kv``) and the patched one with
    ``grouped_decode``, interleaved; the grouped twin's logits check; the attention alone
    (``grouped_sdpa.py``) per head layout and batch."""
    runs = [
        (KV_E2E_GROUPED, '`"sdpa"` at every batch'),
        (KV_E2E_GROUPED_RULE, '`"sdpa"` from 16 (sequence, KV head) pairs'),
        (KV_E2E_GROUPED_MATH, '`"math"` (the default) at every batch'),
    ]
    first = json.loads((root / runs[0][0]).read_text())["env"]
    lines = [
        f"{first['gpu']}, torch {first['torch']}, transformers {first['transformers']}, "
        f"package `{first['package']}` ({first['launcher']} launcher), Llama-3.1-8B "
        f"({first['layers']} layers, random fp16 weights), context {first['context']}, "
        'torch.compile(mode="reduce-overhead") per model and batch; ms per decode step, '
        "the three models interleaved; speedups over the unpatched model paired per block "
        "(p20–p80). Each run on its own machine (a lent H200 each time).",
        "",
        "| run | batch | target | unpatched | patched (GEMMs, `rope_kv`) | speedup | "
        "patched + `grouped_decode` | speedup |",
        "|---|---:|---:|---:|---:|---|---:|---|",
    ]
    checks = []
    for path, what in runs:
        d = json.loads((root / path).read_text())["llama"]["grouped"]
        for b, r in sorted(d["batches"].items(), key=lambda x: int(x[0])):
            ms = r["ms_per_step"]
            lo, hi = r["paired_p20_p80"]
            glo, ghi = r["paired_p20_p80_grouped"]
            target = KV_TARGETS.get(b)
            lines.append(
                f"| `{path.rsplit('/', 1)[1]}` ({what}) | {b} | "
                f"{'–' if target is None else f'{target:.2f}'} | {ms['unpatched']:.3f} | "
                f"{ms['patched']:.3f} | {r['paired_speedup']:.3f} ({lo:.3f}–{hi:.3f}) | "
                f"{ms['grouped']:.3f} | **{r['paired_speedup_grouped']:.3f}** "
                f"({glo:.3f}–{ghi:.3f}) |"
            )
        c = d["correctness_grouped"]
        checks.append(
            f"`{path.rsplit('/', 1)[1]}`: unpatched {c['err_unpatched_vs_fp32']}, patched with "
            f"grouped decode {c['err_patched_vs_fp32']} ({'passes' if c['ok'] else 'fails'})"
        )
    c0 = json.loads((root / runs[0][0]).read_text())["llama"]["grouped"]["correctness_grouped"]
    lines += [
        "",
        f"Logits (a {c0['prompt'][0]}x{c0['prompt'][1]} prompt, {c0['decode_steps']} decode "
        f"steps: {c0['prompt'][0]} sequences x 8 KV heads, so the grouped call runs) against "
        f"fp32, at most {c0['tolerance']:g}x the unpatched error: " + "; ".join(checks) + ".",
    ]
    sd = json.loads((root / GROUPED_SDPA).read_text())
    env = sd["env"]
    math = all("grouped_math" in r["us_per_step"] for r in sd["rows"])
    lines += [
        "",
        f"The attention alone (`{GROUPED_SDPA}`, {env['gpu']}): one decode step's attention "
        f"for {env['layers']} layers over a {env['context']}-token context (static cache of "
        f"{env['cache_length']}), transformers' compiled path (`repeat_kv`, then SDPA) "
        "against the grouped SDPA call"
        + (' and the grouped math form (`grouped_decode="math"`)' if math else "")
        + f", each compiled and captured in a CUDA graph, µs per step (median of "
        f"{env['reps']}, interleaved); the outputs' max |difference| from transformers' path "
        "(fp16).",
        "",
        "| heads (q / kv / d) | batch | (sequence, KV head) pairs | transformers µs | grouped "
        "SDPA µs | speedup | max diff |" + (" math µs | speedup | max diff |" if math else ""),
        "|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|---:|" if math else ""),
    ]
    for r in sd["rows"]:
        u = r["us_per_step"]
        row = (
            f"| {r['layout']} {'/'.join(map(str, r['heads']))} | {r['batch']} | {r['kv_rows']} | "
            f"{u['transformers']:.0f} | {u['grouped']:.0f} | {r['speedup_grouped']:.3f} | "
            f"{r['max_abs_diff']:g} |"
        )
        if math:
            row += (
                f" {u['grouped_math']:.0f} | {r['speedup_grouped_math']:.3f} | "
                f"{r['max_abs_diff_math']:g} |"
            )
        lines.append(row)
    return "\n".join(lines)


KV_PROFILE = "bench/results/h100-kv-decode-profile.json"  # ci/gpu_kv_profile.sh on the H100
# the same at batch 1, 16 steps, with the GPU's idle time recorded (a second run)
KV_PROFILE_IDLE = "bench/results/h100-kv-decode-profile-b1-idle.json"
KV_TARGETS = {"1": 1.12, "16": 1.12, "64": 1.05}  # issue 21's decode targets under graphs


def kv_decode_ceiling(root: Path) -> str:
    """``docs/inference.md``'s ceiling of the end to end (``decode_ceiling_rows``): per
    decode batch, where a compiled step's time goes and how close to a pure read the
    patched GEMMs must come for issue 21's target."""
    from cudal2.bench.layer_profile import decode_ceiling_rows, read_times, vendor_times

    prof = json.loads((root / KV_PROFILE).read_text())
    e2e = json.loads((root / KV_E2E).read_text())
    ceil = [json.loads(x) for x in (root / READ_CEILING).read_text().splitlines() if x.strip()]
    bench = {b: r["ms_per_step"] for b, r in e2e["llama"]["graph"]["batches"].items()}
    rows = decode_ceiling_rows(
        prof,
        read_times(ceil),
        max(r["read_tbps"] for r in ceil),
        bench,
        KV_TARGETS,
        vendor_times(ceil),
    )
    lines = [
        f"{prof['gpu']}, torch {prof['torch']}, package `{prof['package']}` "
        f"(`{KV_PROFILE}` profiled, `{KV_E2E}` timed, reads from `{READ_CEILING}`). "
        f"Llama-3.1-8B, {prof['layers']} layers, context {prof['context']}, compiled "
        "(reduce-overhead); µs per decode step.",
        "",
        "| batch | unpatched step | patched step | GEMMs as pure reads | patched other "
        "kernels (attention) | ceiling | target | GEMM speed needed (of a pure read) | "
        "patched GEMMs today | best vendor GEMMs in isolation |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['bench_unpatched_us']:.0f} | "
            f"{bench[str(r['batch'])]['patched'] * 1e3:.0f} | {r['read_us']:.0f} | "
            f"{r['patched_rest_us']:.0f} ({r['attention_us']:.0f}) | {r['ceiling_bench']:.3f} | "
            f"{r['target']:.2f} | {r['gemm_fraction_needed']:.3f} | "
            f"{r['gemm_fraction_now']:.3f} | {r['vendor_fraction']:.3f} |"
        )
    idle = json.loads((root / KV_PROFILE_IDLE).read_text())["batches"]["1"]
    u, p = idle["unpatched"], idle["patched"]
    lines += [
        "",
        f"Batch 1 again with the GPU's idle time (`{KV_PROFILE_IDLE}`, {idle['steps']} steps): "
        f"unpatched span {u['span_us']:.0f} µs, idle {u['idle_us']:.0f} "
        f"({u['launches_per_step']:.0f} kernels); patched span {p['span_us']:.0f} µs, "
        f"idle {p['idle_us']:.0f} ({p['launches_per_step']:.0f} kernels).",
    ]
    return "\n".join(lines)


ROOM_TIMING = "bench/results/h100-room-timing.json"  # ci/gpu_room.sh on the H100


def room_timing(root: Path) -> str:
    """``docs/kernels.md``'s room table (``ci/room_job.py run``): per target and tile with
    room variants, plain, the best PDL trigger without room and the best with each room,
    offline; then the jobs the PDL pair check rejected, by whether they leave room."""
    d = json.loads((root / ROOM_TIMING).read_text())
    rows = [r for r in d["rows"] if r.get("pdl_over_room")]
    lines = [
        f"{d['gpu']}, fp16 tn, offline (`{ROOM_TIMING}`): {len(d['jobs'])} jobs, "
        f"{sum(j['status'] == 'ok' for j in d['jobs'])} correct; {len(rows)} tiles with room "
        "variants timed beside their PDL variants. µs of the best of each kind.",
        "",
        "| target | tile | plain | best PDL | best half | best quarter | PDL / best room |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]

    def us(v: float | None) -> str:
        return f"{v:.2f}" if v else "–"

    for r in rows:
        tile = r["tile"].removeprefix("hgemm_").replace("_sm90_fp16_tn_", " ")
        lines.append(
            f"| {r['target']} | `{tile}` | {us(r['plain_us'])} | {us(r['pdl_us'])} | "
            f"{us(r.get('half_us'))} | {us(r.get('quarter_us'))} | {r['pdl_over_room']:.3f} |"
        )
    bad = Counter(j["room"] != "none" for j in d["jobs"] if j["status"] != "ok")
    lines += [
        "",
        f"Geomean PDL / best room: {d['geomean_pdl_over_room']:.4f} over {len(rows)} tiles "
        f"(min {min(r['pdl_over_room'] for r in rows):.3f}, max "
        f"{max(r['pdl_over_room'] for r in rows):.3f}). Rejected: {bad[True]} room and "
        f"{bad[False]} other PDL jobs.",
    ]
    return "\n".join(lines)


FUSED_HOST = "bench/results/h100-fused-host.json"  # STEPS=fused ci/gpu_native.sh, H100
FUSED_HOST_PATHS = (
    ("native", "the package's function, native launcher"),
    ("op", "`torch.ops.<ns>.*`, native launcher"),
    ("python", "the Python launch path"),
    ("torch", "torch's unfused ops"),
)


def fused_host(root: Path) -> str:
    """The fused ops' host time per call by launch path (``fused_host.py``): the median,
    min and max over every fused entry of the wheel's table at 1 / 16 / 64 tokens."""
    import statistics

    d = json.loads((root / FUSED_HOST).read_text())
    ops = d["ops"]
    lines = [
        f"{d['gpu']}, torch {d['torch']} (`{FUSED_HOST}`): host µs per call with the GPU "
        f"held busy, {d['calls']} calls x {d['reps']} repetitions, over {len(ops)} fused "
        "entries (dtype, N, K, M, epilogue).",
        "",
        "| path | median µs | min | max |",
        "|---|---:|---:|---:|",
    ]
    for key, label in FUSED_HOST_PATHS:
        xs = [o["host_us"][key] for o in ops]
        lines.append(f"| {label} | {statistics.median(xs):.1f} | {min(xs):.1f} | {max(xs):.1f} |")
    ratio = statistics.median(o["paired_python_over_native"] for o in ops)
    lines += ["", f"Median paired Python / native: {ratio:.2f}."]
    return "\n".join(lines)


EPILOGUE_TIMING = "bench/results/h100-epilogue-timing.json"


def epilogue_timing(root: Path) -> str:
    """``docs/kernels.md``'s fused-epilogue table (``ci/gpu_epilogue.sh``): per target and
    epilogue (the row ``ci/epilogue_job.py`` keeps: the faster of its designs), fused, the
    same tile plain, and torch's unfused op (GEMM, then the adds), offline, one process."""
    d = json.loads((root / EPILOGUE_TIMING).read_text())
    best = {(r["m"], r["n"], r["k"], r["epilogue"]): r for r in d["rows"]}
    ok = sum(j["status"] == "ok" for j in d["jobs"])
    lines = [
        f"{d['gpu']}, fp16 tn, offline (`{EPILOGUE_TIMING}`): {ok} of {len(d['jobs'])} "
        "jobs passed the correctness suite (fp32 fused reference, bounded by torch's "
        "unfused op).",
        "",
        "| M×N×K | epilogue | fused µs | the tile plain µs | torch unfused µs | unfused / fused |",
        "|---|---|---|---|---|---|",
    ]
    for (m, n, k, epi), r in sorted(best.items()):
        lines.append(
            f"| {m}×{n}×{k} | {epi} | {r['fused_us']:.1f} | {r['plain_kernel_us']:.1f} | "
            f"{r['unfused_torch_us']:.1f} | {r['unfused_over_fused']:.3f} |"
        )
    lines += ["", f"Geomean unfused / fused over every row: {d['geomean_unfused_over_fused']:.3f}."]
    return "\n".join(lines)


EPILOGUE_GATED_TIMING = "bench/results/h100-epilogue-gated-timing.json"


def epilogue_gated_timing(root: Path) -> str:
    """``docs/kernels.md``'s table of the row-scaled and gated epilogues
    (``ci/epilogue_job.py prepare --set gated``, then ``ci/gpu_epilogue.sh``): per dtype,
    target and epilogue, the job's fastest fused design, the same tile plain, and torch's
    unfused op (RMSNorm in the dtype, GEMM, SiLU·mul), offline, one process."""
    d = json.loads((root / EPILOGUE_GATED_TIMING).read_text())
    ok = sum(j["status"] == "ok" for j in d["jobs"])
    lines = [
        f"{d['gpu']}, tn, offline (`{EPILOGUE_GATED_TIMING}`): {ok} of {len(d['jobs'])} "
        "jobs passed the correctness suite (fp32 fused reference, bounded by torch's "
        "unfused op).",
        "",
        "| dtype | M×N×K | epilogue | fused µs | the tile plain µs | fused − plain µs "
        "| torch unfused µs | unfused / fused |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(d["rows"], key=lambda r: (r["dtype"], r["n"], r["m"], r["epilogue"])):
        lines.append(
            f"| {r['dtype']} | {r['m']}×{r['n']}×{r['k']} | {r['epilogue']} | "
            f"{r['fused_us']:.1f} | {r['plain_kernel_us']:.1f} | "
            f"{r['fused_us'] - r['plain_kernel_us']:+.1f} | {r['unfused_torch_us']:.1f} | "
            f"{r['unfused_over_fused']:.3f} |"
        )
    lines += ["", f"Geomean unfused / fused over every row: {d['geomean_unfused_over_fused']:.3f}."]
    return "\n".join(lines)


TMA_V5_SWEEP = "bench/results/h100-sweep-tma-v5.measurements.jsonl.gz"  # ci/gpu_prefill.sh
TMA_V5_SWEEP_BF16 = "bench/results/h100-sweep-tma-v5-bf16.measurements.jsonl.gz"  # likewise
TMA_V5_PAIR = "bench/results/h100-sweep-tma-v5-pair.measurements.jsonl.gz"  # likewise, fp16
# v5 tile N (issue 22; sweep-tma-v5-n-h100.toml and its bf16 twin, ci/gpu_prefill.sh): in
# the tables once committed (each is left out while its file is absent).
TMA_V5_TILE_N = "bench/results/h100-sweep-tma-v5-n.measurements.jsonl.gz"
TMA_V5_TILE_N_BF16 = "bench/results/h100-sweep-tma-v5-n-bf16.measurements.jsonl.gz"
# v5 ping-pong (issue 22; sweep-tma-v5-pingpong-h100.toml, ci/gpu_prefill.sh), fp16: in the
# tables once committed (left out while its file is absent).
TMA_V5_PINGPONG = "bench/results/h100-sweep-tma-v5-pingpong.measurements.jsonl.gz"
TECHNIQUES = (
    ("bulk store through a C buffer", "store"),
    ("grouped tile walk", "raster"),
    ("128 CTAs, not one per SM", "ctas"),
    ("2-CTA multicast pair", "cluster_m"),
    ("tile N not a power of two", "wgmma_n"),
    ("ping-pong, not cooperative", "persistent"),
)


def tma_v5_sweep(root: Path) -> str:
    """``docs/kernels.md``'s sm90tma v5 tables (``cudal2.bench.schedules``): per target of
    the v5 sweep, each schedule's fastest kernel against torch in its own job, cuBLASLt's
    autotuned algorithm likewise, the v5 winner's knobs and Nsight Compute figures; then
    the gain of each technique."""
    import statistics

    from cudal2.bench.schedules import (
        DEFAULTS,
        SCHEDULES,
        best_by_schedule,
        schedule,
        technique_gain,
        timed,
    )
    from cudal2.database import MeasurementDB, latest

    tile_n = tuple(p for p in (TMA_V5_TILE_N, TMA_V5_TILE_N_BF16) if (root / p).exists())
    pingpong = (TMA_V5_PINGPONG,) if (root / TMA_V5_PINGPONG).exists() else ()
    paths = (TMA_V5_SWEEP, TMA_V5_SWEEP_BF16, TMA_V5_PAIR, *tile_n, *pingpong)
    runs = {p: latest(MeasurementDB(root / p).read()) for p in paths}
    ms = [m for p in paths for m in runs[p]]
    by_target = timed(ms)
    lt = {  # cuBLASLt as the v5 sweeps timed it (the pair sweep's own run is its own)
        (m.target.dtype, m.target.m, m.target.n, m.target.k): m
        for p in (TMA_V5_SWEEP, TMA_V5_SWEEP_BF16)
        for m in runs[p]
        if m.status == "ok" and m.vendor and (m.baseline_samples_us or {}).get("torch")
    }
    gpu = next((m.gpu.name for m in ms if m.gpu), "?")
    ok = sum(m.status == "ok" for m in ms)
    lines = [
        f"{gpu}, tn, offline ("
        + ", ".join(f"`{p}`" for p in paths)
        + f": {len(ms)} records, {ok} correct; the pair sweep is fp16 only, with its own "
        + (
            "controls; the tile N sweeps' own controls are v5's 128x128 and 128x256 "
            "bulk-store designs, on 6 of the targets"
            if tile_n
            else "controls"
        )
        + (
            "; the ping-pong sweep is fp16 only, on 9 of the targets, with v5's "
            "cooperative bulk-store designs as its controls"
            if pingpong
            else ""
        )
        + "). Each cell: "
        + "the schedule's fastest kernel as a speedup over torch timed in the same job "
        "(> 1: faster); cuBLASLt: the build's autotuned algorithm, likewise.",
        "",
        "| dtype | M×N×K | torch TFLOP/s | " + " | ".join(SCHEDULES) + " | cuBLASLt | "
        "v5's best (knobs) | its TFLOP/s | ncu tensor % (the kernel profiled) |",
        "|---|---|---:|" + "---:|" * len(SCHEDULES) + "---:|---|---:|---:|",
    ]

    def cell(t: Any) -> str:
        return f"{t.speedup:.3f}" if t else "–"

    for key in sorted(by_target, key=lambda k: (k[0], k[1], k[2], k[3])):
        dtype, m, n, k = key
        best = best_by_schedule(by_target[key])
        flop = 2.0 * m * n * k
        torch_us = statistics.median(r.torch_us for r in by_target[key])
        v5 = best.get("persistent v5")
        lt_cell = "–"
        if key in lt:
            r = lt[key]
            lt_cell = f"{statistics.median(r.baseline_samples_us['torch']) / r.median_us:.3f}"
        knobs = "–"
        if v5:  # the tile, then the v5 knobs that are not at their defaults
            shown = [f"{x} {v5.knobs[x]}" for x in ("wgmma_n", "stages") if x in v5.knobs]
            shown += [
                f"{x} {v5.knobs[x]}" for x, off in DEFAULTS.items() if v5.knobs.get(x, off) != off
            ]
            knobs = ", ".join(shown)
        prof = next((r for r in by_target[key] if "ncu_tensor_pct" in r.metrics), None)
        ncu = f"{prof.metrics['ncu_tensor_pct']:.1f} ({schedule(prof.knobs)})" if prof else "–"
        lines.append(
            f"| {dtype} | {m}×{n}×{k} | {flop / torch_us / 1e6:.0f} | "
            + " | ".join(cell(best.get(s)) for s in SCHEDULES)
            + f" | {lt_cell} | {knobs} | "
            + (f"{flop / v5.us / 1e6:.0f}" if v5 else "–")
            + f" | {ncu} |"
        )
    lines += [
        "",
        "Each technique's gain within one sweep (its kernels with the knob set against its "
        "kernels without, both timed in that run):",
        "",
        "| technique | knob | sweep | dtype | gain (geomean over targets) | targets |",
        "|---|---|---|---|---:|---:|",
    ]
    per_run = {p: timed(runs[p]) for p in paths}  # each sweep's kernels, once
    for label, knob in TECHNIQUES:
        for p in paths:
            run = per_run[p]
            for dtype in sorted({k[0] for k in run}):
                gain, n = technique_gain({k: v for k, v in run.items() if k[0] == dtype}, knob)
                if n:
                    name = Path(p).name.removesuffix(".measurements.jsonl.gz")
                    lines.append(f"| {label} | `{knob}` | `{name}` | {dtype} | {gain:.3f} | {n} |")
    return "\n".join(lines)


# v5 pair tile N (issue 22; sweep-tma-v5-pairn-h100.toml on a lent H200, ci/gpu_prefill.sh)
TMA_V5_PAIRN = "bench/results/h200-sweep-tma-v5-pairn.measurements.jsonl.gz"


def tma_v5_pairn(root: Path) -> str:
    """``docs/kernels.md``'s sm90tma v5 pair tile N table: per target, the fastest kernel
    of each kind (a pair of 128 x n tiles, n not 256; the same widths unpaired; v5's
    128x256 unpaired and paired) and cuBLASLt's autotuned algorithm, each against torch
    in its own job; then the pair's gain at the same width, and the narrow tiles' over
    128x256."""
    import math

    from cudal2.bench.schedules import timed, vendor_timed
    from cudal2.database import MeasurementDB, latest

    ms = latest(MeasurementDB(root / TMA_V5_PAIRN).read())
    by_target = timed(ms)
    lt = vendor_timed(ms)
    gpu = next((m.gpu.name for m in ms if m.gpu), "?")
    kinds = {
        "pair, 128 x n": lambda k: k.get("cluster_m", 1) == 2 and k["wgmma_n"] != 256,
        "unpaired, 128 x n": lambda k: k.get("cluster_m", 1) == 1 and k["wgmma_n"] != 256,
        "unpaired, 128x256": lambda k: k.get("cluster_m", 1) == 1 and k["wgmma_n"] == 256,
        "pair, 128x256": lambda k: k.get("cluster_m", 1) == 2 and k["wgmma_n"] == 256,
    }
    lines = [
        f"{gpu}, fp16 tn, offline (`{TMA_V5_PAIRN}`: {len(ms)} records, "
        f"{sum(m.status == 'ok' for m in ms)} correct). Each cell: the kind's fastest "
        "kernel as a speedup over torch timed in the same job (n: its tile N, and `a` where "
        "it stores from its accumulators, not through the C buffer); cuBLASLt: the build's "
        "autotuned algorithm, likewise.",
        "",
        "| M×N×K | " + " | ".join(kinds) + " | cuBLASLt |",
        "|---|" + "---:|" * (len(kinds) + 1),
    ]
    logs: dict[str, list[float]] = {"pair": [], "narrow": [], "own": [], "lt": []}
    for key in sorted(by_target):
        rows = by_target[key]
        best = {}
        for name, pick in kinds.items():
            mine = [r for r in rows if pick(r.knobs)]
            best[name] = max(mine, key=lambda r: r.speedup) if mine else None

        def cell(r: Any, wide: bool) -> str:
            if r is None:
                return "–"
            tag = f" ({r.knobs['wgmma_n']}{'' if r.knobs.get('store') else ' a'})" if wide else ""
            return f"{r.speedup:.3f}{tag}"

        lines.append(
            f"| {key[1]}×{key[2]}×{key[3]} | "
            + " | ".join(cell(best[n], n.endswith("x n")) for n in kinds)
            + f" | {lt[key]:.3f} |"
        )
        for n in {r.knobs["wgmma_n"] for r in rows if r.knobs.get("cluster_m", 1) == 2}:
            pair = [
                r.speedup
                for r in rows
                if r.knobs["wgmma_n"] == n and r.knobs.get("cluster_m", 1) == 2
            ]
            solo = [
                r.speedup
                for r in rows
                if r.knobs["wgmma_n"] == n and r.knobs.get("cluster_m", 1) == 1
            ]
            if pair and solo:
                logs["pair"].append(math.log(max(pair) / max(solo)))
        narrow, wide = best["unpaired, 128 x n"], best["unpaired, 128x256"]
        if narrow and wide:
            logs["narrow"].append(math.log(narrow.speedup / wide.speedup))
        logs["own"].append(math.log(max(r.speedup for r in rows)))
        logs["lt"].append(math.log(lt[key]))

    def gm(xs: list[float]) -> str:
        return f"{math.exp(sum(xs) / len(xs)):.3f}"

    lines += [
        "",
        f"Geomean over the {len(by_target)} targets: the pair against the same width unpaired "
        f"(each width and target with both) {gm(logs['pair'])} ({len(logs['pair'])} pairs of "
        f"kernels); the fastest narrow tile against 128x256, both unpaired, {gm(logs['narrow'])}; "
        f"the fastest own kernel over torch {gm(logs['own'])}, cuBLASLt's {gm(logs['lt'])}.",
    ]
    return "\n".join(lines)


BUILD_STAGES = "bench/results/h100-build-stages.json"  # ci/gpu_build_stages.sh on the H100
STAGE_ROWS = ("runner start", "wait for runner", "proposer load", "propose", "compile",
              "wait for cubins", "measure", "record", "profile", "wait for profile",
              "policy update", "autotune", "memcheck", "package")  # fmt: skip
# Rows only runs recorded since have (``pipeline.stages``): shown where one of them does.
NEWER_ROWS = ("record", "wait for profile")
# Stages a run may have run in the background where earlier runs did not: "(bg)" there.
BACKGROUND_ROWS = ("profile",)


def build_stages(root: Path) -> str:
    """``docs/runners.md``'s one-GPU build of the llama manifest before and after issue
    23's work: wall, targets per GPU-hour and the stage table of each run (every
    ``after*`` run, in the order recorded; the measure stage's split where a run has it)."""
    d = json.loads((root / BUILD_STAGES).read_text())
    runs = [(name, r) for name, r in d.items() if name.startswith("after") and "stages" in r]
    before = d["before"]
    lines = [
        f"{d['gpu']}, {d['machine']}, `{d['manifest']}` ({d['targets']} targets), {d['how']} "
        f"(`{BUILD_STAGES}`). Before (`{before['command']}`, {before['code']}): wall "
        + ", ".join(f"{w:.1f}" for w in before["wall_s"])
        + " s.",
        "",
        "| stage (busy s) | " + " | ".join(f"{n}" for n, _ in runs) + " |",
        "|---|" + "---:|" * len(runs),
    ]

    def cell(stages: dict[str, float], stage: str) -> str:
        return f"{stages[stage]:.1f}" if stage in stages else "–"

    def background(r: dict[str, Any], stage: str) -> str:
        """ " (bg)" where the run ran the stage beside the others though older runs did
        not (``profile`` with ``search.profile_lag`` 1)."""
        return " (bg)" if stage in BACKGROUND_ROWS and stage in r["stages"]["overlapped"] else ""

    for stage in STAGE_ROWS:
        timed = [r["stages"]["stages_s"] for _, r in runs]
        if stage in NEWER_ROWS and not any(stage in t for t in timed):
            continue
        cells = [cell(r["stages"]["stages_s"], stage) + background(r, stage) for _, r in runs]
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
        splits = [r["stages"].get("measure_split", {}) for _, r in runs]
        if stage == "measure" and any(splits):
            for label, key in (
                ("in the worker's jobs", "in_jobs_s"),
                ("outside them", "outside_s"),
            ):
                lines.append(
                    f"| measure: {label} | " + " | ".join(cell(x, key) for x in splits) + " |"
                )
    for label, key in (("GPU busy", "gpu_busy_s"), ("build's own wall", "wall_s")):
        lines.append(
            f"| {label} | " + " | ".join(f"{r['stages'][key]:.1f}" for _, r in runs) + " |"
        )
    # (a run whose shell wall did not come back from the machine has None: "–")
    lines.append(
        "| wall from the shell | "
        + " | ".join("–" if r["wall_s"] is None else f"{r['wall_s']:.1f}" for _, r in runs)
        + " |"
    )
    lines.append(
        "| targets per GPU-hour (shell wall / build's wall) | "
        + " | ".join(
            ("–" if r["wall_s"] is None else f"{d['targets'] * 3600 / r['wall_s']:.0f}")
            + f" / {r['stages']['targets_per_gpu_hour']:.0f}"
            for _, r in runs
        )
        + " |"
    )
    if any(background(r, s) for _, r in runs for s in BACKGROUND_ROWS):
        lines += [
            "",
            "(bg): in the background (`search.profile_lag = 1`: each round's Nsight Compute "
            "run beside the next round's proposing and compiling; the next round's wait for "
            'it is "wait for profile").',
        ]
    lines += ["", "Commands: " + "; ".join(f"{n}: `{r['command']}`" for n, r in runs) + "."]
    timed = [(n, r) for n, r in runs if "database" in r and "measure_split" in r["stages"]]
    if timed:
        lines += [
            "",
            "The timing method's own GPU time (each kernel job's replays as its record's "
            "samples say: warm-up and timed, candidate and torch, each replay as many "
            "launches as `time_interleaved` sizes it for the target), against the seconds "
            "the worker spent in its jobs:",
            "",
        ]
        for name, r in timed:
            jobs, replay_s, slow_s = timing_replay_s(root / r["database"], d["gpu"])
            lines.append(
                f"- {name} (`{r['database']}`): {jobs} jobs, {replay_s:.1f} s of replays in "
                f"{r['stages']['measure_split']['in_jobs_s']:.1f} s; those of the candidates "
                f"slower than half of torch's time, {slow_s:.1f} s."
            )
    return "\n".join(lines)


BUILD_AB = "bench/results/h200-build-ab.json"  # ci/gpu_build_ab.sh on a lent H200
# The A/B's two databases the selections are compared from (call B's last pair).
BUILD_AB_DBS = (
    "bench/results/h200-llama-build-ab-before.measurements.jsonl.gz",
    "bench/results/h200-llama-build-ab-after.measurements.jsonl.gz",
)
AB_ROWS = ("propose", "compile", "wait for cubins", "measure", "profile")


def best_speedups(db: Path) -> tuple[float, float]:
    """A build's database: the geomean over its targets of the fastest own kernel's
    speedup over torch (in its own job), and of the fastest of that, the autotuned
    cuBLASLt algorithm and torch itself."""
    from cudal2.database import MeasurementDB
    from cudal2.records import Status

    own: dict[Any, float] = {}
    lt: dict[Any, float] = {}
    for m in MeasurementDB(db).read():
        if m.status != Status.OK or "torch" not in m.baselines_us:
            continue
        x = m.baselines_us["torch"] / m.median_us
        if m.design is not None:
            own[m.target] = max(own.get(m.target, 0.0), x)
        elif m.proposer == "cublaslt-autotune":
            lt[m.target] = x
    return geomean(list(own.values())), geomean(
        [max(v, lt.get(t, 0.0), 1.0) for t, v in own.items()]
    )


def build_ab(root: Path) -> str:
    """``docs/runners.md``'s before and after of issue 23's fourth slice: each call of
    ``ci/gpu_build_ab.sh`` on one machine, its builds in the order they ran."""
    d = json.loads((root / BUILD_AB).read_text())
    runs = [(c, r) for c in d["calls"] for r in c["runs"]]
    head = [f"{c['label']}{r['i']} {r['side']}" for c, r in runs]
    lines = [
        f"{d['gpu']}, driver {d['driver']}, power limit {d['power_limit_w']} W, {d['machine']}, "
        f"`{d['manifest']}` ({d['targets']} targets); {d['how']} (`{BUILD_AB}`). Busy seconds "
        "per stage; each column one build, in the order the call ran them.",
        "",
        "| | " + " | ".join(head) + " |",
        "|---|" + "---:|" * len(runs),
        "| cores | " + " | ".join(str(c["cores"]) for c, _ in runs) + " |",
    ]

    def row(label: str, cell: Callable[[dict[str, Any]], float | None], fmt: str = "{:.1f}"):
        vals = [cell(r) for _, r in runs]
        lines.append(
            f"| {label} | " + " | ".join("–" if v is None else fmt.format(v) for v in vals) + " |"
        )

    row("wall from the shell", lambda r: r["shell_wall_s"])
    row("build's own wall", lambda r: r["stages"]["wall_s"])
    row("targets per GPU-hour (shell)", lambda r: d["targets"] * 3600 / r["shell_wall_s"], "{:.0f}")
    for stage in AB_ROWS:
        row(stage, lambda r, s=stage: r["stages"]["stages_s"].get(s))
        if stage == "measure":
            for label, key in (
                ("in the worker's jobs", "in_jobs_s"),
                ("outside them", "outside_s"),
            ):
                row(
                    f"measure: {label}",
                    lambda r, k=key: r["stages"].get("measure_split", {}).get(k),
                )
    lines.append("")
    for c in d["calls"]:
        lines.append(f"- {c['label']}: `{c['command']}`; after = {c['after_code']}; {c['note']}.")
    (b_own, b_all), (a_own, a_all) = (best_speedups(root / p) for p in BUILD_AB_DBS)
    lines.append(
        f"- Selections (B's last pair, `{BUILD_AB_DBS[0]}` and `{BUILD_AB_DBS[1]}`): the fastest "
        f"own kernel per target, geomean over torch, {b_own:.3f} before and {a_own:.3f} after; "
        f"with cuBLASLt's autotuned algorithm and torch among them, {b_all:.3f} and {a_all:.3f}."
    )
    return "\n".join(lines)


LAG_RUN = "after5b"  # the lag-0 run (its database and stages) the lag's estimate reads
LAG_ROUNDS = 4  # its manifest's search.rounds (manifests/llama-3.1-8b-h100.toml)


def round_spans(db: Path, rounds: int) -> list[tuple[float, float]]:
    """Each of a build's ``rounds`` search rounds' first and last kernel record (seconds
    after the first, as the records' one-second time stamps say), from its database in
    the order written: a build from an empty database writes each round's records (one
    per candidate: as many each round), its profiled copies (which keep their records'
    time stamps: left out), the next round's; the cuBLASLt records after the last."""
    from datetime import datetime

    from cudal2.database import MeasurementDB
    from cudal2.verify.profile import is_profiled

    stamps = [
        datetime.strptime(m.measured_at, "%Y-%m-%dT%H:%M:%SZ").timestamp()
        for m in MeasurementDB(db).read()
        if m.design is not None and not is_profiled(m.metrics)
    ]
    each, left = divmod(len(stamps), rounds)
    if left or not each:
        raise ValueError(f"{db}: {len(stamps)} kernel records are not {rounds} equal rounds")
    t0 = stamps[0]
    return [(stamps[i] - t0, stamps[i + each - 1] - t0) for i in range(0, len(stamps), each)]


def ncu_buckets(db: Path, gpu: str) -> tuple[int, int, int]:
    """How many profiled copies a build's database holds, and for how many of them the
    policy's prompt token of the DRAM share, and of the tensor-pipe share (tenths of the
    datasheet peak, ``policy/tokens.py``), differs between ncu's figure and the one
    derived from the time (``policy/reward.py``'s ``entry`` without the profile)."""
    from cudal2.database import MeasurementDB
    from cudal2.hardware import datasheet
    from cudal2.policy.tokens import FRAC_BUCKETS

    sheet = datasheet(gpu)

    def bucket(frac: float) -> int:
        return min(FRAC_BUCKETS, max(0, round(frac * FRAC_BUCKETS)))

    n = dram = tensor = 0
    for m in MeasurementDB(db).read():
        x = m.metrics
        if "ncu_dram_pct" not in x or "ncu_tensor_pct" not in x:
            continue
        n += 1
        dram += bucket(x["ncu_dram_pct"] / 100) != bucket(x["gbps"] * 1e9 / sheet.bandwidth)
        tensor += bucket(x["ncu_tensor_pct"] / 100) != bucket(x["tflops"] * 1e12 / sheet.flops)
    return n, dram, tensor


def profile_lag(root: Path) -> str:
    """``docs/runners.md``'s estimate of what ``search.profile_lag = 1`` saves, from the
    lag-0 run ``LAG_RUN``: each boundary between two rounds (the GPU's gap, from the time
    stamps) as ncu (the profile stage's seconds over the rounds profiled) plus the rest
    (the policy update, the next round's first proposals and cubins); with the lag a
    profiled boundary costs the longer of the two, an unprofiled one the rest alone."""
    from cudal2.manifest import SearchSettings

    d = json.loads((root / BUILD_STAGES).read_text())
    run = d[LAG_RUN]
    spans = round_spans(root / run["database"], LAG_ROUNDS)
    ncu_rounds = len(spans) - 1  # lag 0: every round but the last
    ncu = run["stages"]["stages_s"]["profile"] / ncu_rounds
    lag1 = SearchSettings(rounds=len(spans), profile_lag=1)
    # the runs made with the lag (their profile in the background): their own gaps
    measured = [
        (name, round_spans(root / r["database"], LAG_ROUNDS))
        for name, r in d.items()
        if name.startswith("after") and "database" in r
        and "profile" in r.get("stages", {}).get("overlapped", ())
    ]  # fmt: skip
    lines = [
        f"From `{LAG_RUN}` (`{run['database']}`, {len(spans)} rounds; ncu "
        f"{run['stages']['stages_s']['profile']:.1f} s over {ncu_rounds} rounds, "
        f"{ncu:.1f} s each):",
        "",
        "| boundary | GPU's gap, lag 0 (s) | ncu | the rest | lag 1, estimated |"
        + "".join(f" {name}, measured |" for name, _ in measured),
        "|---|---:|---:|---:|---:|" + "---:|" * len(measured),
    ]
    saved = 0.0
    for r in range(len(spans) - 1):
        gap = spans[r + 1][0] - spans[r][1]
        rest = max(0.0, gap - ncu)
        after = max(ncu, rest) if lag1.profiled(r) else rest
        saved += gap - after
        lines.append(
            f"| round {r + 1} → {r + 2} | {gap:.0f} | {ncu:.1f} | {rest:.1f} | {after:.1f}"
            + ("" if lag1.profiled(r) else " (not profiled)")
            + " |"
            + "".join(f" {x[r + 1][0] - x[r][1]:.0f} |" for _, x in measured)
        )
    wall = run["stages"]["wall_s"]
    targets = run["stages"]["targets"]
    n, dram, tensor = ncu_buckets(root / run["database"], d["gpu"])
    lines += [
        "",
        f"Saved, estimated: {saved:.1f} s of the build's own wall of {wall:.1f} s "
        f"({targets * 3600 / wall:.0f} → {targets * 3600 / (wall - saved):.0f} targets per "
        "GPU-hour by the build's wall); the time stamps are whole seconds. "
        f"What the proposer then reads one round later: of the {n} profiled kernels, the "
        f"prompt's DRAM tenth would be another without ncu for {dram}, the tensor-pipe "
        f"tenth for {tensor}.",
    ]
    return "\n".join(lines)


def timing_replay_s(db: Path, gpu: str) -> tuple[int, float, float]:
    """The GPU seconds the timing of a build's kernel jobs took (each job: its warm-up
    calls, then ``warmup`` replays and one per recorded sample of the candidate's and
    torch's graphs of ``replay_calls`` launches, at the medians recorded), the number of
    jobs, and the part spent on candidates slower than half of torch's time."""
    from cudal2.database import MeasurementDB
    from cudal2.hardware import floor_us
    from cudal2.records import TimingConfig
    from cudal2.verify.timing import operand_sets, replay_calls

    cfg = TimingConfig()
    jobs, total, slow = 0, 0.0, 0.0
    seen: set[tuple[str, str]] = set()
    for m in MeasurementDB(db).read():
        if m.status != "ok" or m.design is None or "torch" not in m.baselines_us:
            continue
        if (m.target.label, m.artifact_key) in seen:
            continue  # the same job's record again, with its Nsight Compute metrics
        seen.add((m.target.label, m.artifact_key))
        nsets = operand_sets(m.target.min_bytes)
        calls = replay_calls(nsets, cfg, max(floor_us(m.target, gpu), 2.0))
        pair_us = m.median_us + m.baselines_us["torch"]
        reps = len(m.samples_us)  # fewer than cfg.reps where the worker stopped early
        s = ((cfg.warmup + reps) * calls + min(nsets, 2)) * pair_us / 1e6
        jobs, total = jobs + 1, total + s
        if m.baselines_us["torch"] / m.median_us < 0.5:
            slow += s
    return jobs, total, slow


# ci/gpu_prefill.sh's llm-public rebuilds, each with the sweeps' records of its time
PREFILL_BENCHES = (
    ("v5", "bench/results/h100-llm-public-prefill-v5.jsonl"),
    ("v5 + tile N", "bench/results/h100-llm-public-prefill-v5n.jsonl"),
)


def prefill_bench(root: Path, benches: tuple[tuple[str, str], ...] = PREFILL_BENCHES) -> str:
    """``docs/kernels.md``'s issue 22 summary: the llm-public wheel (rebuilt with the
    sweeps' records of each slice; or, ``benches``, other kernels' results files) beside
    every vendor in one process on the prefill shapes, M >= 1024, per dtype and timing
    mode (``cudal2-bench summarize --m-min 1024``)."""
    files = ", ".join(f"{label}: `{path}`" for label, path in benches)
    lines = [
        f"{files} (`cudal2-bench summarize … --m-min 1024`): the geomean speedup of the "
        "wheel's dispatch over each baseline, its own kernels and cuBLASLt entries, wins "
        "over the best vendor beyond the spread.",
        "",
        "| wheel | dtype | mode | shapes | × torch | × cuBLASLt autotune | × best vendor | own | "
        "cuBLASLt | wins | floor frac |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, path in benches:
        rows = read_results(root / path)
        for dtype in ("fp16", "bf16"):
            for mode in ("offline", "server"):
                s = summarize(rows, Filter(mode=mode, dtype=dtype, m_min=1024))
                if not s["shapes"]:
                    continue
                g = s["geomean_speedup"]
                lines.append(
                    f"| {label} | {dtype} | {mode} | {s['shapes']} | {g['torch']:.3f} | "
                    f"{g['cublaslt_autotune']:.3f} | {g['best_vendor']:.3f} | "
                    f"{s['own_kernel_targets']} | {s['cublaslt_targets']} | "
                    f"{s['wins_vs_best_vendor']} | {s['floor_fraction_median']:.3f} |"
                )
    return "\n".join(lines)


MATH_CEILING = "bench/results/h100-math-ceiling.json"  # ci/gpu_math_ceiling.sh on the H100


def math_ceiling(root: Path) -> str:
    """The math ceiling's table (``cudal2.bench.math_ceiling``): per prefill shape, torch,
    the best vendor and a kernel that only issues wgmma, sustained under the power limit."""
    from cudal2.bench import math_ceiling as mc

    path = root / MATH_CEILING
    if not path.exists():
        raise ResultsMissing(
            f"{MATH_CEILING} is not committed: run ci/gpu_math_ceiling.sh on the H100 and "
            "commit its math-ceiling.json there"
        )
    return mc.markdown(mc.load(path.read_text(), MATH_CEILING), MATH_CEILING)


FEED_CEILING = "bench/results/h100-feed-ceiling.json"  # FEED=1 ci/gpu_math_ceiling.sh, H100
# FEED_KERNELS=feed,feedpair,gemmpair: the first pair kernels (cluster-scope arrives and waits)
FEED_CEILING_PAIR_V1 = "bench/results/h100-feed-ceiling-pair-v1.json"
FEED_CEILING_PAIR_V2 = "bench/results/h100-feed-ceiling-pair-v2.json"
FEED_CEILING_TALL = "bench/results/h100-feed-ceiling-tall.json"
# FEED_KERNELS=feed,feedsk: the even share of every SM (stream-K without its partial sums)
FEED_CEILING_SK = "bench/results/h100-feed-ceiling-sk.json"
# FEED_KERNELS=feedtall,feedtallsk SHAPES_FILE=bench/experiments/prefill-tall.toml: the even
# share of the 256x176 tiles
FEED_CEILING_TALLSK = "bench/results/h100-feed-ceiling-tallsk.json"
# FEED_KERNELS=feed80,feed160,feed192,feed224,feedsplit,feedsk
# SHAPES_FILE=bench/experiments/prefill-partial.toml: the own kernels' widths and the aligned
# split of the last wave on the four partial-wave shapes
FEED_CEILING_NARROW = "bench/results/h100-feed-ceiling-narrow.json"
FEED_RUNS = (
    FEED_CEILING,
    FEED_CEILING_PAIR_V1,
    FEED_CEILING_PAIR_V2,
    FEED_CEILING_TALL,
    FEED_CEILING_SK,
    FEED_CEILING_TALLSK,
    FEED_CEILING_NARROW,
)
NCU_FEED = (  # FEED=1 ci/gpu_ncu_prefill.sh on the H100
    "bench/results/h100-ncu-feed-4096x4096x4096.csv",
    "bench/results/h100-ncu-feed-1024x28672x4096.csv",
)


def feed_ceiling(root: Path, path: str = FEED_CEILING) -> str:
    """The feed ceiling's table (``cudal2.bench.math_ceiling.feed_markdown``): per prefill
    shape, the math kernel beside kernels that also move a GEMM's operand bytes."""
    from cudal2.bench import math_ceiling as mc

    if not (root / path).exists():
        raise ResultsMissing(
            f"{path} is not committed: run FEED=1 ci/gpu_math_ceiling.sh on the H100 and "
            "commit its feed-ceiling.json there"
        )
    return mc.feed_markdown(mc.load((root / path).read_text(), path), path)


def _feed_runs(root: Path, files: tuple[str, ...]) -> dict[str, Any]:
    from cudal2.bench import math_ceiling as mc

    if missing := [f for f in files if not (root / f).exists()]:
        raise ResultsMissing(f"{missing[0]} is not committed: run FEED=1 ci/gpu_math_ceiling.sh")
    return {f: mc.load((root / f).read_text(), f) for f in files}


def feed_bound(root: Path, files: tuple[str, ...] = FEED_RUNS) -> str:
    """Every committed feed run together: the best stall-free kernel per llm-public shape
    (``cudal2.bench.math_ceiling.bound_markdown``)."""
    from cudal2.bench import math_ceiling as mc

    return mc.bound_markdown(_feed_runs(root, files))


def _feed_bound_line(root: Path, files: tuple[str, ...] = FEED_RUNS) -> str:
    """The README's sentence: the prefill designs' stall-free bound (``feed_bound``)."""
    from cudal2.bench import math_ceiling as mc

    g, shapes = mc.bound(_feed_runs(root, files))
    lead = "no prefill design measured can" if g < mc.TARGET else "a prefill design measured may"
    return (
        f"On llm-public's {shapes} shapes at M ≥ 1024, {lead} reach issue 22's "
        f"{mc.TARGET:.2f}x: per design, a kernel that moves its GEMM's operand bytes and never "
        f"waits for them reaches at most {_x(g, 3)} the best vendor in geomean ({len(files)} "
        f"runs, `{files[0]}` and beside it; 128x256, 256x176 and narrow tiles, multicast "
        "pairs, stream-K, the aligned split of the last wave; `docs/kernels.md`, "
        '"The partial waves").'
    )


def ncu_feed(root: Path, files: tuple[str, ...] = NCU_FEED) -> str:
    """One launch of the own kernel, the vendors' and the feed kernels under ncu."""
    from cudal2.bench import math_ceiling as mc

    if missing := [f for f in files if not (root / f).exists()]:
        raise ResultsMissing(f"{missing[0]} is not committed: run FEED=1 ci/gpu_ncu_prefill.sh")
    return mc.ncu_feed_markdown({f: (root / f).read_text() for f in files})


NCU_FEEDPAIR = (  # FEED=1 EXTRA_METRICS=<bytes> ci/gpu_ncu_prefill.sh on the H100
    "bench/results/h100-ncu-feedpair-4096x28672x4096.csv",
    "bench/results/h100-ncu-feedpair-8192x8192x8192.csv",
)


NCU_FEEDTALL = (  # FEED=1 FEED_KERNELS=feed,feedpaced,feedtall EXTRA_METRICS=<bytes>
    "bench/results/h100-ncu-feedtall-8192x8192x8192.csv",
    "bench/results/h100-ncu-feedtall-4096x28672x4096.csv",
)


def _ncu_bytes(root: Path, files: tuple[str, ...], roles, what: str, named) -> str:
    """One launch of each of ``roles`` under ncu, with the bytes each memory level moved."""
    from cudal2.bench import math_ceiling as mc

    if missing := [f for f in files if not (root / f).exists()]:
        raise ResultsMissing(f"{missing[0]} is not committed: run FEED=1 ci/gpu_ncu_prefill.sh")
    text = {f: (root / f).read_text() for f in files}
    return mc.ncu_feed_markdown(text, roles, mc.NCU_PAIR_ROWS, what, named)


NCU_PARTIAL = tuple(  # FEED=1 FEED_KERNELS=feed TAG=-partial DBS=<H100 v5 sweeps>
    f"bench/results/h100-ncu-{s}-partial.csv"
    for s in ("1024x1280x8192", "4096x1280x8192", "1024x6144x4096", "1024x7168x8192")
)


def ncu_partial(root: Path, files: tuple[str, ...] = NCU_PARTIAL) -> str:
    """One launch each of the H100 sweeps' fastest own kernel, cuBLASLt's autotuned
    algorithm, torch, the feed kernel and the math kernel on the four partial-wave
    prefill shapes, with the bytes each memory level moved."""
    from cudal2.bench import math_ceiling as mc

    what = (
        "the H100 v5 sweeps' fastest own kernel (own), cuBLASLt's autotuned algorithm, "
        "torch.matmul, the 128x256 feed kernel and the math kernel at the shape's FLOPs"
    )
    return _ncu_bytes(root, files, mc.NCU_PARTIAL_ROLES, what, ("own", "cublaslt", "torch"))


def ncu_feedpair(root: Path, files: tuple[str, ...] = NCU_FEEDPAIR) -> str:
    """One launch of torch's 2x1 pair beside the feed kernels and their multicast pairs
    under ncu, with the bytes each memory level moved."""
    from cudal2.bench import math_ceiling as mc

    what = (
        "torch.matmul, the feed kernel and its GEMM twin, their 2-CTA multicast pairs "
        "(feedpair, gemmpair) and the math kernel at the shape's FLOPs"
    )
    return _ncu_bytes(root, files, mc.NCU_PAIR_ROLES, what, ("torch",))


def ncu_feedtall(root: Path, files: tuple[str, ...] = NCU_FEEDTALL) -> str:
    """One launch of the paced and tall feed kernels beside torch's kernel and cuBLASLt's
    autotuned algorithm under ncu, with the bytes each memory level moved."""
    from cudal2.bench import math_ceiling as mc

    what = (
        "the sweeps' fastest own kernel (own), cuBLASLt's autotuned algorithm, "
        "torch.matmul, the feed kernel, the same paced as a GEMM (feedpaced) and on "
        "256x176 tiles (feedtall), and the math kernel at the shape's FLOPs"
    )
    return _ncu_bytes(root, files, mc.NCU_TALL_ROLES, what, ("own", "cublaslt", "torch"))


NCU_FEEDSK = tuple(  # FEED=1 FEED_KERNELS=feed,feedsk TAG=-sk EXTRA_METRICS=<bytes>
    f"bench/results/h100-ncu-feedsk-{s}.csv"
    for s in ("1024x4096x14336", "1024x6144x4096", "4096x4096x4096")
)


def ncu_feedsk(root: Path, files: tuple[str, ...] = NCU_FEEDSK) -> str:
    """One launch of the even share (feedsk) beside the feed kernel, the sweeps' fastest
    own kernel, cuBLASLt's autotuned algorithm and torch under ncu, with the bytes each
    memory level moved."""
    from cudal2.bench import math_ceiling as mc

    what = (
        "the sweeps' fastest own kernel (own), cuBLASLt's autotuned algorithm, "
        "torch.matmul, the feed kernel, the same with every SM an equal share (feedsk), "
        "and the math kernel at the shape's FLOPs"
    )
    return _ncu_bytes(root, files, mc.NCU_SK_ROLES, what, ("own", "cublaslt", "torch"))


# FEED=1 FEED_KERNELS=feed,feedsk,feedsplit TAG=-split EXTRA_METRICS=<bytes>
NCU_FEEDSPLIT = tuple(
    f"bench/results/h100-ncu-feedsplit-{s}.csv" for s in ("1024x1280x8192", "1024x6144x4096")
)


def ncu_feedsplit(root: Path, files: tuple[str, ...] = NCU_FEEDSPLIT) -> str:
    """One launch of the aligned split (feedsplit) beside the even share, the feed kernel,
    the sweeps' fastest own kernel, cuBLASLt's autotuned algorithm and torch under ncu,
    with the bytes each memory level moved."""
    from cudal2.bench import math_ceiling as mc

    what = (
        "the H100 v5 sweeps' fastest own kernel (own), cuBLASLt's autotuned algorithm, "
        "torch.matmul, the feed kernel, its even share (feedsk), its aligned split of the "
        "last wave (feedsplit), and the math kernel at the shape's FLOPs"
    )
    return _ncu_bytes(root, files, mc.NCU_SPLIT_ROLES, what, ("own", "cublaslt", "torch"))


BLOCKS: dict[str, Callable[[Path], str]] = {
    "where-it-stands": where_it_stands,
    "llama-e2e": llama_e2e,
    "host-overhead": host_overhead,
    "policy-eval": policy_eval,
    "policy-retrain": policy_retrain,
    "policy-seeds": policy_seeds.policy_seeds,
    "policy-seeds-v5designs": lambda root: policy_seeds.policy_seeds(
        root, policy_seeds.RECIPES_V5DESIGNS, policy_seeds.CHECKPOINT_V5DESIGNS
    ),
    "floor-fractions": floor_fractions,
    "pdl-timing": pdl_timing,
    "eager-host": eager_host,
    "pdl-public": pdl_public,
    "layer-bench": layer_bench,
    "layer-ceiling": layer_ceiling,
    "splitk-epilogues": splitk_epilogues,
    "llama-kv-e2e": llama_kv_e2e,
    "kv-decode-ceiling": kv_decode_ceiling,
    "kv-e2e-bound": kv_e2e_bound,
    "kv-e2e-rope": kv_e2e_rope,
    "kv-e2e-grouped": kv_e2e_grouped,
    "kv-e2e-default": kv_e2e_default,
    "kv-e2e-qwen2-b1": kv_e2e_qwen2_b1,
    "room-timing": room_timing,
    "fused-host": fused_host,
    "epilogue-timing": epilogue_timing,
    "epilogue-gated-timing": epilogue_gated_timing,
    "tma-v5-sweep": tma_v5_sweep,
    "tma-v5-pairn": tma_v5_pairn,
    "tma-v5-store": prefill_store.tma_v5_store,
    "power-own": prefill_store.power_own,
    "ncu-prefill": prefill_store.ncu_prefill,
    "tma-v5-tma": prefill_tma_store.tma_v5_tma,
    "tma-v5-tma-n": prefill_tma_store.tma_v5_tma_n,
    "tma-v5-best": prefill_tma_store.tma_v5_best,
    "tma-v5-tmaw": prefill_tma_store.tma_v5_tmaw,
    "power-own-tma": prefill_tma_store.power_own_tma,
    "power-own-tma-n": prefill_tma_store.power_own_tma_n,
    "ncu-prefill-tma": prefill_tma_store.ncu_prefill_tma,
    "prefill-bench-tma": lambda root: prefill_bench(root, prefill_tma_store.PREFILL_TMA),
    "tma-v5-ppn": prefill_narrow_pair.tma_v5_ppn,
    "tma-v5-pairtma": prefill_narrow_pair.tma_v5_pairtma,
    "tma-v5-best-ppn": prefill_narrow_pair.tma_v5_best_ppn,
    "power-own-ppn": prefill_narrow_pair.power_own_ppn,
    "power-squares": prefill_narrow_pair.power_squares,
    "ncu-prefill-ppn": prefill_narrow_pair.ncu_prefill_ppn,
    "llama-prefill-tma": prefill_narrow_pair.llama_prefill_tma,
    "tma-v5-ring": prefill_narrow_pair.tma_v5_ring,
    "sass-uniform": prefill_uniform.sass_uniform,
    "sass-epilogue": prefill_uniform.sass_epilogue,
    "tma-v5-tenth": prefill_uniform.tma_v5_tenth,
    "tma-v5-tenth-h100": lambda root: prefill_uniform.tma_v5_tenth(
        root, prefill_uniform.TENTH_SWEEPS_H100
    ),
    "llm-public-steps-h100": llm_public_steps.steps,
    "prefill-bench-tenth-h100": lambda root: prefill_bench(
        root, prefill_uniform.PREFILL_TENTH_H100
    ),
    "fused-prefill": prefill_uniform.fused_prefill,
    "fused-prefill-e2e": fused_prefill_e2e,
    "fused-prefill-rows": lambda root: prefill_uniform.fused_prefill(
        root, prefill_uniform.FUSED_PREFILL_ROWS
    ),
    "fused-prefill-rows-e2e": lambda root: fused_prefill_e2e(root, FUSED_PREFILL_ROWS_E2E),
    "fused-prefill-twins": lambda root: prefill_uniform.fused_prefill(
        root, prefill_uniform.FUSED_PREFILL_TWINS
    ),
    "fused-prefill-twins-e2e": lambda root: fused_prefill_e2e(root, FUSED_PREFILL_TWINS_E2E),
    "fused-prefill-select": lambda root: prefill_uniform.fused_prefill(
        root, prefill_uniform.FUSED_PREFILL_SELECT
    ),
    "fused-prefill-select-e2e": lambda root: fused_prefill_e2e(root, FUSED_PREFILL_SELECT_E2E),
    "ncu-rows-qkv": prefill_uniform.ncu_rows,
    "tma-v5-streamk": prefill_streamk.tma_v5_streamk,
    "ncu-streamk": prefill_streamk.ncu_streamk,
    "gated-baseline": baselines.gated_baseline,
    "tma-v5-gated": lambda root: prefill_uniform.fused_prefill(root, prefill_uniform.GATED_SWEEP),
    "rmsnorm-paths": baselines.rmsnorm_paths,
    "tma-v5-techniques": techniques.ledger,
    "build-stages": build_stages,
    "build-ab": build_ab,
    "profile-lag": profile_lag,
    "prefill-bench": prefill_bench,
    "math-ceiling": math_ceiling,
    "feed-ceiling": feed_ceiling,
    "feed-ceiling-pair-v1": lambda root: feed_ceiling(root, FEED_CEILING_PAIR_V1),
    "feed-ceiling-pair-v2": lambda root: feed_ceiling(root, FEED_CEILING_PAIR_V2),
    "ncu-feed": ncu_feed,
    "ncu-feedpair": ncu_feedpair,
    "feed-ceiling-tall": lambda root: feed_ceiling(root, FEED_CEILING_TALL),
    "ncu-feedtall": ncu_feedtall,
    "feed-ceiling-sk": lambda root: feed_ceiling(root, FEED_CEILING_SK),
    "feed-ceiling-tallsk": lambda root: feed_ceiling(root, FEED_CEILING_TALLSK),
    "feed-ceiling-narrow": lambda root: feed_ceiling(root, FEED_CEILING_NARROW),
    "feed-bound": feed_bound,
    "ncu-feedsk": ncu_feedsk,
    "ncu-feedsplit": ncu_feedsplit,
    "ncu-partial": ncu_partial,
    "runoffs-h100": runoffs.runoffs,
    "runoff-wheels-h100": runoffs.wheels_ab,
    "vendor-view-h100": runoffs.vendor_view,
    "settled-300-h100": lambda root: runoffs.settled(root, runoffs.SETTLED_300),
    "settled-h100": runoffs.settled,
    "shipped-llm-public-h100": runoffs.shipped,
    "declared-regimes-h100": declared.regimes,
    "declared-runoffs-h100": declared.declared_runoffs,
    "declared-h100": declared.llm_public,
    "declared-shapes-h100": declared.shapes,
    "declared-grid-h100": declared.grid,
    "grid-sample-v5-h100": grid_sample.ab,
    "grid-sample-v5-shapes-h100": grid_sample.shapes,
}

_BLOCK = re.compile(
    r"(?P<begin><!-- cudal2:begin (?P<name>[a-z0-9-]+)[^>]*-->\n)(?P<body>.*?)"
    r"(?P<end><!-- cudal2:end (?P=name) -->)",
    re.S,
)


def blocks_in(text: str) -> list[str]:
    """The names of the generated blocks in ``text``; broken markers are an error."""
    names = [m["name"] for m in _BLOCK.finditer(text)]
    begins = re.findall(r"<!-- cudal2:begin ([a-z0-9-]+)", text)
    if sorted(begins) != sorted(names) or len(re.findall(r"<!-- cudal2:end ", text)) != len(names):
        raise StaleBlockError("a cudal2:begin marker without its cudal2:end (or the reverse)")
    if len(set(names)) != len(names):
        raise StaleBlockError(f"a generated block appears twice: {sorted(names)}")
    if unknown := sorted(set(names) - set(BLOCKS)):
        raise StaleBlockError(f"unknown generated block {unknown[0]!r} (known: {sorted(BLOCKS)})")
    return names


def regenerate(text: str, root: Path) -> str:
    """``text`` with every generated block's body made again from ``root``'s results."""
    blocks_in(text)
    made: dict[str, str] = {}

    def body(m: re.Match[str]) -> str:
        name = m["name"]
        if name not in made:
            made[name] = BLOCKS[name](root)
        return f"{m['begin']}{made[name]}\n{m['end']}"

    return _BLOCK.sub(body, text)
