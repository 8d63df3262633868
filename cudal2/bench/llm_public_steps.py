"""What ships for llm-public at M >= 1024 on the H100, one step at a time (issue 22,
2026-12-05): the wheel packaged on the CPU machine from the committed databases at each
step (``cudal2-build manifests/llm-public-h100.toml --no-measure``), then on a lent H100
``cudal2-bench bench/shapes/llm-public-prefill.toml --kernels <the wheel> --mode both
--dtype fp16 bf16`` (``ci/gpu_prefill.sh`` with ``WHEEL=``), repeated where a step has
several files; the tenth sweeps' winners last, for the ceiling of those designs."""

from __future__ import annotations

from pathlib import Path

from cudal2.bench.report import Filter, read_results, summarize

R = "bench/results/"
# (step, its bench runs), in the order they were taken
STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the llm-public database alone", (f"{R}h100-prefill-llm-public.jsonl",)),
    (
        "+ the v5 sweeps it reuses (`[build] reuse`), kernels ranked by median",
        (f"{R}h100-prefill-llm-public-reuse.jsonl.gz",),
    ),
    (
        "+ kernels ranked by speedup over torch in their own run",
        tuple(f"{R}h100-prefill-llm-public-ratio{s}.jsonl.gz" for s in ("", "-2", "-3")),
    ),
    (
        "+ the tenth slice's wider sweeps, the fastest beyond its noise, a key's newest "
        "record standing",
        tuple(f"{R}h100-prefill-llm-public-shipped{s}.jsonl.gz" for s in ("", "-2")),
    ),
    (
        "+ run-offs: a kernel and an algorithm too close to order from their own runs timed "
        "together",
        (
            f"{R}h100-prefill-llm-public-runoff.jsonl.gz",
            f"{R}h100-prefill-llm-public-runoff-2.jsonl.gz",
            f"{R}h100-prefill-llm-public-ab-b-1.jsonl.gz",
            f"{R}h100-prefill-llm-public-ab-b-2.jsonl.gz",
        ),
    ),
    (
        "+ prefill decided in its declared timing state: run-offs settled 2 s, wherever "
        "a candidate is faster than torch, the algorithm weighed by its settled run-off: "
        "what ships",
        tuple(f"{R}h100-prefill-llm-public-declared-c-{i}.jsonl.gz" for i in (1, 2)),
    ),
    ("the tenth sweeps' winners, every vendor in one process", (f"{R}h100-prefill-tenth.jsonl",)),
)
SHIPPED = STEPS[5]


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.3f}" if f"{lo:.3f}" == f"{hi:.3f}" else f"{lo:.3f}–{hi:.3f}"


Rows = list[dict]


def runs(root: Path, paths: tuple[str, ...]) -> list[tuple[str, Rows]]:
    """Each run's path and rows, read once."""
    return [(p, read_results(root / p)) for p in paths]


def geomeans(
    rows: list[tuple[str, Rows]],
    mode: str,
    dtype: str,
    key: str,
    shapes: frozenset[tuple[int, int, int]] | None = None,
) -> list[float]:
    """Per run, the geomean speedup over ``key`` (a baseline) at M >= 1024 (of
    ``shapes`` only, where given)."""
    out = []
    for p, r in rows:
        s = summarize(r, Filter(mode=mode, dtype=dtype, m_min=1024, shapes=shapes))
        if not s["shapes"] or s["geomean_speedup"].get(key) is None:
            raise ValueError(f"{p}: no {mode} {dtype} rows at M >= 1024")
        out.append(s["geomean_speedup"][key])
    return out


def own_targets(rows: list[tuple[str, Rows]], dtype: str) -> str:
    counts = {summarize(r, Filter(dtype=dtype, m_min=1024))["own_kernel_targets"] for _, r in rows}
    return "/".join(map(str, sorted(counts)))


def steps(root: Path) -> str:
    lines = [
        "H100 80GB HBM3, `cudal2-bench summarize … --m-min 1024` (the 17 prefill shapes: "
        "llm-public's 16 and 8192³, which has no entry and falls back): the geomean speedup "
        "of the wheel's dispatch over the best vendor per shape (torch, cuBLAS, cuBLASLt's "
        "heuristic and its autotuned algorithm, in the same process), min–max over the "
        "step's runs; its own-kernel targets offline (fp16 / bf16); × torch offline.",
        "",
        "| step | runs | fp16 offline | bf16 offline | fp16 server | bf16 server | own kernels "
        "| × torch fp16 / bf16 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, paths in STEPS:
        rows = runs(root, paths)
        cells = [
            _span(geomeans(rows, mode, dtype, "best_vendor"))
            for mode in ("offline", "server")
            for dtype in ("fp16", "bf16")
        ]
        own = f"{own_targets(rows, 'fp16')} / {own_targets(rows, 'bf16')}"
        torch = " / ".join(_span(geomeans(rows, "offline", d, "torch")) for d in ("fp16", "bf16"))
        lines.append(f"| {label} | {len(paths)} | {' | '.join(cells)} | {own} | {torch} |")
    return "\n".join(lines)


def shipped_line(root: Path) -> str:
    """The README's sentence: what ships against the best vendor, offline, per dtype."""
    _, paths = SHIPPED
    shipped = runs(root, paths)
    fp16, bf16 = (_span(geomeans(shipped, "offline", d, "best_vendor")) for d in ("fp16", "bf16"))
    _, tenth = STEPS[-1]
    sweeps = runs(root, tenth)
    t16, tb16 = (_span(geomeans(sweeps, "offline", d, "best_vendor")) for d in ("fp16", "bf16"))
    return (
        "On the 17 prefill shapes (M ≥ 1024) of an H100, against the fastest vendor call per "
        f"shape, offline, the shipped llm-public wheel runs at {fp16}x (fp16) and {bf16}x "
        f"(bf16) over {len(paths)} runs (`{paths[0]}`), and the current designs' sweep "
        f"winners at {t16}x and {tb16}x (`{tenth[0]}`). Issue 22 asks for 1.03x "
        '(`docs/kernels.md`, "Prefill in one declared timing state").'
    )
