"""Issue 22's generated blocks of the eighth slice (``docs/kernels.md``, "sm90tma v5
ping-pong narrow and pair TMA store"): the ping-pong TMA-store kernel at cuBLASLt's tile
widths (128 x 112, 144, 176) against the TMA store's fastest tiles, and the multicast
pair storing by TMA against the same designs unpaired, in the same H200 sweeps (fp16,
bf16); the fastest own kernel of the three TMA-store sweeps against cuBLASLt; the
sustained runs of the fastest own kernels beside cuBLASLt and torch; Nsight Compute on
the narrow ping-pong kernels; the Llama-3.1-8B 2,048-token prefill end to end; and the
ninth slice's ring counter against its twins ("sm90tma v5 ring counter")."""

from __future__ import annotations

import json
from pathlib import Path

from cudal2.bench import prefill_tma_store
from cudal2.bench.prefill_store import _gm, ncu_prefill, power_own
from cudal2.bench.prefill_tma_store import (
    SUMMARY_HEAD,
    TMA_N_SWEEPS,
    TMA_SWEEPS,
    _label,
    summary_row,
)

# ci/gpu_prefill.sh on a lent H200 (bench/manifests/sweep-tma-v5-ppn[-bf16]-h100.toml)
PPN_SWEEPS = {
    "fp16": "bench/results/h200-sweep-tma-v5-ppn.measurements.jsonl.gz",
    "bf16": "bench/results/h200-sweep-tma-v5-ppn-bf16.measurements.jsonl.gz",
}
# ... (bench/manifests/sweep-tma-v5-pairtma[-bf16]-h100.toml)
PAIRTMA_SWEEPS = {
    "fp16": "bench/results/h200-sweep-tma-v5-pairtma.measurements.jsonl.gz",
    "bf16": "bench/results/h200-sweep-tma-v5-pairtma-bf16.measurements.jsonl.gz",
}
# ci/gpu_power_own.sh DBS=<the tma, tma-n and ppn fp16 sweeps>
POWER_OWN_PPN = "bench/results/h200-power-own-ppn.json"
# ... SHAPES=bench/experiments/prefill-squares.toml REPS=5 SECONDS_PER_RUN=1.5: DBS=<the ppn
# sweep> (its fastest own kernel: cooperative 128x256), then a database of the ppn
# sweep's narrow ping-pong records only (128 x 176 at 8192³, 128 x 112 at 4096³)
POWER_SQUARES = (
    ("the ping-pong narrow sweep's", "bench/results/h200-power-own-squares.json"),
    ("the narrow ping-pong designs'", "bench/results/h200-power-own-squares-narrow.json"),
)
# ci/gpu_ncu_prefill.sh DBS=<the narrow ping-pong records> TAG=-ppn EXTRA_METRICS=<stalls>
NCU_PPN = (
    "bench/results/h200-ncu-prefill-4096x4096x4096-ppn.csv",
    "bench/results/h200-ncu-prefill-8192x8192x8192-ppn.csv",
)
# ci/gpu_prefill_e2e.sh: bench/manifests/llama-prefill-tma-h100.toml's build, then
# bench/experiments/llama_e2e.py --tokens 2048 with its wheel
LLAMA_DB = "bench/results/h200-llama-prefill-tma.measurements.jsonl.gz"
LLAMA_E2E = "bench/results/h200-llama-e2e-prefill-tma.json"
# ci/gpu_prefill.sh SWEEP=bench/manifests/sweep-tma-v5-ring-h100.toml (fp16)
RING_SWEEP = "bench/results/h200-sweep-tma-v5-ring.measurements.jsonl.gz"
NARROW = (112, 144, 176)

# A kernel of these sweeps: (persistent, m_blocks, wgmma_n, stages, ctas, cluster_m, store,
# ring)
Kernel = tuple[int, int, int, int, int, int, int, int]


def _kernel(knobs: dict) -> Kernel:
    names = ("persistent", "m_blocks", "wgmma_n", "stages", "ctas", "cluster_m", "store", "ring")
    return tuple(knobs.get(k, 0) for k in names)


def _kernels(root: Path, path: str) -> tuple[str, dict, dict]:
    """``prefill_tma_store._kernels`` keyed by this module's ``_kernel``."""
    return prefill_tma_store._kernels(root, path, _kernel)


def _name(k: Kernel) -> str:
    return _label((*k[:4], 0))


def _narrow(k: Kernel) -> bool:
    return k[0] == 2 and k[1] == 2 and k[2] in NARROW


def tma_v5_ppn(root: Path) -> str:
    """Per fp16 target: the fastest ping-pong kernel of each narrow width, the fastest
    control and cuBLASLt, each against torch in its own job; per dtype and width, the
    width's fastest over the fastest control (geomean over the targets, wins)."""
    sweeps = {dtype: _kernels(root, p) for dtype, p in PPN_SWEEPS.items()}
    gpu, own, lt = sweeps["fp16"]
    files = ", ".join(f"`{p}`" for p in PPN_SWEEPS.values())
    lines = [
        f"{gpu}, tn, offline ({files}). fp16: each cell the fastest kernel of its kind as "
        "a speedup over torch in the same job (its tile / ring stages; ping-pong tiles are "
        "a warpgroup's); the controls: the TMA store's cooperative 128 x 128, 160, 256 "
        "and ping-pong 128x128, 128x160, 64x256; cuBLASLt: the build's autotuned "
        "algorithm, likewise.",
        "",
        "| M×N×K | "
        + " | ".join(f"pp 128x{n}" for n in NARROW)
        + " | fastest control | cuBLASLt |",
        "|---|" + "---:|" * (len(NARROW) + 2),
    ]
    for key in sorted(own):
        ks = own[key]
        cells = [f"{max(v for k, v in ks.items() if _narrow(k) and k[2] == n):.3f}" for n in NARROW]
        ck, cv = max(((k, v) for k, v in ks.items() if not _narrow(k)), key=lambda kv: kv[1])
        cells += [f"{cv:.3f} ({_name(ck)})", f"{lt[key]:.3f}"]
        lines.append(f"| {key[0]}×{key[1]}×{key[2]} | " + " | ".join(cells) + " |")
    lines += ["", "Each width's fastest over the fastest control, per target:", ""]
    lines += ["| dtype | " + " | ".join(f"pp 128x{n}" for n in NARROW) + " |"]
    lines += ["|---|" + "---:|" * len(NARROW)]
    for dtype, (_, own, _) in sweeps.items():
        cells = []
        for n in NARROW:
            r = [
                max(v for k, v in ks.items() if _narrow(k) and k[2] == n)
                / max(v for k, v in ks.items() if not _narrow(k))
                for ks in own.values()
            ]
            cells.append(f"{_gm(r):.3f}, {sum(x > 1 for x in r)} of {len(r)}")
        lines.append(f"| {dtype} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tma_v5_pairtma(root: Path) -> str:
    """Per tile width and dtype: each pair storing by TMA over the same design unpaired
    (ring, CTA cap) in the same sweep, geomean over the targets and wins."""
    sweeps = {dtype: _kernels(root, p) for dtype, p in PAIRTMA_SWEEPS.items()}
    gpu = sweeps["fp16"][0]
    files = ", ".join(f"`{p}`" for p in PAIRTMA_SWEEPS.values())
    ratios: dict[str, dict[int, list[float]]] = {}
    for dtype, (_, own, _) in sweeps.items():
        ratios[dtype] = {}
        for ks in own.values():
            for k, v in ks.items():
                twin = (*k[:5], 1, *k[6:])
                if k[5] == 2 and twin in ks:
                    ratios[dtype].setdefault(k[2], []).append(v / ks[twin])
    lines = [
        f"{gpu}, tn, offline ({files}): the persistent cooperative pair storing by TMA "
        "over the same design unpaired (tile, ring, CTA cap; the grouped walk of 8), both "
        "against torch in their jobs; geomean over the 17 targets and both rings, and "
        "the pairs faster than their twins.",
        "",
        "| tile | fp16 | bf16 |",
        "|---|---:|---:|",
    ]
    for n in sorted(ratios["fp16"]):
        cells = [
            f"{_gm(r[n]):.3f}, {sum(x > 1 for x in r[n])} of {len(r[n])}" for r in ratios.values()
        ]
        lines.append(f"| 128x{n} | " + " | ".join(cells) + " |")
    every = {d: [x for v in r.values() for x in v] for d, r in ratios.items()}
    cells = [f"{_gm(v):.3f}, {sum(x > 1 for x in v)} of {len(v)}" for v in every.values()]
    lines.append("| every tile | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tma_v5_best_ppn(root: Path) -> str:
    """Per dtype: the fastest own TMA-store kernel of the three sweeps (64-column,
    narrow subtiles, ping-pong narrow) per target against the fastest of their cuBLASLt
    autotunings (each a speedup over torch in its own job): geomeans and targets at or
    above cuBLASLt."""
    lines = [
        "The three TMA-store sweeps together (`tma-v5-best`'s two and the ping-pong narrow "
        "one): per target the fastest TMA-store kernel against the fastest of the three "
        "cuBLASLt autotunings, each × torch in its job.",
        "",
        *SUMMARY_HEAD,
    ]
    for dtype in ("fp16", "bf16"):
        runs = [_kernels(root, f[dtype]) for f in (TMA_SWEEPS, TMA_N_SWEEPS, PPN_SWEEPS)]
        keys = sorted(runs[0][1])
        own = [max(v for _, o, _ in runs for k, v in o[key].items() if k[6] == 4) for key in keys]
        lines.append(summary_row(dtype, own, [max(x[key] for _, _, x in runs) for key in keys]))
    return "\n".join(lines)


def power_own_ppn(root: Path) -> str:
    """The sustained runs (``power_own``'s table) of the three TMA-store sweeps' fastest."""
    return power_own(root, POWER_OWN_PPN, "the three v5 TMA store sweeps' (fastest by median)")


def power_squares(root: Path) -> str:
    """The sustained runs at 8192³ and 4096³: the ping-pong narrow sweep's fastest own
    kernel, then its narrow ping-pong designs, each run beside torch and cuBLASLt."""
    return "\n\n".join(power_own(root, path, who) for who, path in POWER_SQUARES)


def _hit_key(d: dict, key: tuple[int, int, int]) -> str:
    """The end to end's name of a (M, N, K) entry's hits."""
    m, n, k = key
    return f"{d['gpu']}/sm_90a/fp16/tn/n{n}/k{k}/m{m}"


def ncu_prefill_ppn(root: Path) -> str:
    """``ncu_prefill``'s tables for the narrow ping-pong kernels against cuBLASLt's."""
    return ncu_prefill(root, NCU_PPN, NCU_PPN[0], "the narrow ping-pong designs")


def llama_prefill_tma(root: Path) -> str:
    """Per linear-layer shape of the Llama-3.1-8B 2,048-token prefill: the fastest own
    TMA-store kernel and cuBLASLt's algorithm (× torch in the build's job) and what the
    wheel dispatches; then the end to end, unpatched against patched."""
    gpu, own, lt = _kernels(root, LLAMA_DB)
    d = json.loads((root / LLAMA_E2E).read_text())
    (case,) = d["cases"]
    lines = [
        f"{gpu}, fp16 tn, offline (`{LLAMA_DB}`; the end to end `{LLAMA_E2E}`). Each cell × "
        "torch in the build's job; the last column: the wheel's entry a patched forward "
        "called (the faster of own and cuBLASLt; the build selects only what beats torch "
        "beyond the spread), or torch where the wheel has none.",
        "",
        "| M×N×K | fastest own (tile / ring) | cuBLASLt | a forward's calls |",
        "|---|---:|---:|---|",
    ]
    for key in sorted(own, key=lambda k: (k[1], k[2])):
        k, v = max(own[key].items(), key=lambda kv: kv[1])
        calls = case["hits"].get(_hit_key(d, key))
        served = f"{'own' if v > lt[key] else 'cuBLASLt'} entry, {calls}" if calls else "torch"
        lines.append(
            f"| {key[0]}×{key[1]}×{key[2]} | {v:.3f} ({_name(k)}) | {lt[key]:.3f} | {served} |"
        )
    b = case["back_to_back"]
    lo, hi = b["paired_p20_p80"]
    lines += [
        "",
        f"End to end ({d['layers']} layers, {d['patched_layers']} of {d['linear_layers']} "
        f"linear layers patched, the {d['launcher']} launcher; logits within "
        f"{case['err_patched_vs_fp32']:.4f} of fp32, unpatched "
        f"{case['err_unpatched_vs_fp32']:.4f}): "
        f"back to back, unpatched / patched paired per repetition {b['paired_speedup']:.4f} "
        f"(p20–p80 {lo:.4f}–{hi:.4f}); from idle {case['eager']['speedup']:.3f}; CUDA graph "
        f"{case['graph']['speedup']:.3f}.",
    ]
    return "\n".join(lines)


def tma_v5_ring(root: Path) -> str:
    """Per tile and ring: each ring-counter kernel over its twin (the same design computing
    the slot and phase by division) in the same sweep, geomean over the targets and wins;
    per target the fastest kernel of the sweep and cuBLASLt (× torch in the job); the
    geomeans."""
    gpu, own, lt = _kernels(root, RING_SWEEP)
    gains: dict[tuple, list[float]] = {}
    for ks in own.values():
        for k, v in ks.items():
            if k[7] == 1:
                gains.setdefault(k[:4], []).append(v / ks[(*k[:7], 0)])
    lines = [
        f"{gpu}, fp16 tn, offline (`{RING_SWEEP}`): each design with the ring counter "
        "(`ring` = 1) over its twin (`it % STAGES`, `it / STAGES` every k tile), both "
        "against torch in their jobs (the grouped walk of 8, the 128-CTA cap).",
        "",
        "| tile / ring stages | gain | wins |",
        "|---|---:|---:|",
    ]
    for k, g in sorted(gains.items()):
        lines.append(
            f"| {_name((*k, 0, 0, 0, 0))} | {_gm(g):.3f} | {sum(x > 1 for x in g)} of {len(g)} |"
        )
    every = [x for g in gains.values() for x in g]
    lines.append(
        f"| every design | {_gm(every):.3f} | {sum(x > 1 for x in every)} of {len(every)} |"
    )
    lines += ["", "| M×N×K | fastest of the sweep | cuBLASLt |", "|---|---:|---:|"]
    best = {key: max(ks.items(), key=lambda kv: kv[1]) for key, ks in own.items()}
    for key, (k, v) in sorted(best.items()):
        ring = ", counter" if k[7] else ""
        lines.append(f"| {key[0]}×{key[1]}×{key[2]} | {v:.3f} ({_name(k)}{ring}) | {lt[key]:.3f} |")
    lines += ["", *SUMMARY_HEAD]
    lines.append(summary_row("fp16", [v for _, v in best.values()], [lt[key] for key in best]))
    return "\n".join(lines)
