"""Issue 22's ledger of techniques (``docs/kernels.md``, "The techniques of issue 22, in
one table"): each technique of sm90tma v5 in the sweep that measured it, by one pair of
rules for all of them, beside the prediction written before its run.

- Like for like: the kernels a technique applies to are grouped by every knob but the
  technique's own and those it moves with it (``Technique.free``: the ring depth where it
  changes shared memory, the tile where it is a tile). Per target and group, the group's
  fastest kernel with the technique over its fastest without; the geomean over those
  pairs and how many are above 1.
- Best for best: per target, the sweep's fastest kernel with the technique over its
  fastest without (of the kernels it applies to); the geomean over the targets and how
  many are above 1.

Each kernel is a speedup over torch timed in its own job, so every ratio compares two
kernels of the same sweep (the same GPU, the same session). The slices' own blocks
(``tma-v5-sweep``, ``tma-v5-store``, ``tma-v5-tma``, ``tma-v5-ring`` ...) hold the per-target
tables; this block only puts their techniques side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cudal2.bench.prefill_store import _gm, _sweep

Knobs = dict[str, int]


def _get(k: Knobs, name: str) -> int:
    return k.get(name, 1 if name == "cluster_m" else 0)


def _pow2(n: int) -> bool:
    return n > 0 and not n & (n - 1)


def _coop(k: Knobs) -> bool:
    return _get(k, "persistent") == 1 and _get(k, "cluster_m") == 1


def _any(_: Knobs) -> bool:
    return True


@dataclass(frozen=True)
class Technique:
    name: str
    slice: str  # the worklog section's ordinal ("first", ...)
    sweeps: tuple[str, ...]  # one database a dtype; () where not yet run
    on: Callable[[Knobs], bool]  # the kernel uses the technique
    pool: Callable[[Knobs], bool]  # a kernel the technique applies to (with or without)
    free: tuple[str, ...]  # knobs that may differ inside a like-for-like group
    predicted: str  # written before the run (the worklog's "Prediction")


_R = "bench/results/"


def _pair(stem: str) -> tuple[str, str]:
    return (f"{_R}{stem}.measurements.jsonl.gz", f"{_R}{stem}-bf16.measurements.jsonl.gz")


_TENTH_H200 = (
    # The tenth slice (trial designs, run on a lent H200 on 2026-12-05): read from
    # sweep-tma-v5-tenth[-bf16], each against the twins that sweep holds.
    Technique(
        "uniform warpgroup index", "tenth", _pair("h200-sweep-tma-v5-tenth"),
        lambda k: _get(k, "uniform") == 1, _any,
        ("uniform",), "+1–3% ping-pong, ±0.5% cooperative",
    ),
    Technique(
        "ping-pong in multicast pairs", "tenth", _pair("h200-sweep-tma-v5-tenth"),
        lambda k: _get(k, "cluster_m") == 2,
        lambda k: _get(k, "persistent") == 2, ("cluster_m",), "+1–2% at M = 4096 and 8192",
    ),
    Technique(
        "256 x n tiles (TMA store)", "tenth", _pair("h200-sweep-tma-v5-tenth"),
        lambda k: _get(k, "m_blocks") == 2,
        lambda k: _coop(k) and _get(k, "uniform") == 1, ("m_blocks", "stages", "ring"),
        "+0–2% at 8192³ and N = 28672",
    ),
    Technique(
        "256 x n tiles in multicast pairs", "tenth", _pair("h200-sweep-tma-v5-tenth"),
        lambda k: _get(k, "cluster_m") == 2,
        lambda k: _get(k, "persistent") == 1 and _get(k, "m_blocks") == 2, ("cluster_m",),
        "+1–2% at 8192³ and M = 4096",
    ),
)  # fmt: skip

TECHNIQUES = (
    Technique(
        "bulk store through a C buffer", "first", _pair("h100-sweep-tma-v5"),
        lambda k: _get(k, "store") == 1, lambda k: _coop(k) and _get(k, "store") in (0, 1),
        ("store", "stages"), "+1.5–3% at K = 4096, +5–10% at K = 1024",
    ),
    Technique(
        "grouped tile walk", "first", _pair("h100-sweep-tma-v5"),
        lambda k: _get(k, "raster") > 0, _coop, ("raster",),
        "+1–3% at 4096×4096×14336 and 4096×7168×8192, noise elsewhere",
    ),
    Technique(
        "128 CTAs, not one per SM", "first", _pair("h100-sweep-tma-v5"),
        lambda k: _get(k, "ctas") > 0, _coop, ("ctas",), "0 to +1%",
    ),
    Technique(
        "2-CTA multicast pair, persistent", "second",
        (f"{_R}h100-sweep-tma-v5-pair.measurements.jsonl.gz",),
        lambda k: _get(k, "cluster_m") == 2, lambda k: _get(k, "persistent") == 1,
        ("cluster_m", "stages"), "+1–3% at K ≥ 4096",
    ),
    Technique(
        "tile N not a power of two", "third", _pair("h100-sweep-tma-v5-n"),
        lambda k: not _pow2(_get(k, "wgmma_n")), _coop, ("wgmma_n", "stages"),
        "+5–16% on the 6 shapes of partial waves (per shape, 0.85–1.03 × torch)",
    ),
    Technique(
        "ping-pong consumers", "fourth",
        (f"{_R}h100-sweep-tma-v5-pingpong.measurements.jsonl.gz",),
        lambda k: _get(k, "persistent") == 2,
        lambda k: _get(k, "persistent") in (1, 2) and _get(k, "cluster_m") == 1,
        ("persistent", "m_blocks", "wgmma_n", "stages"), "−9% to +6% (best at K = 1024)",
    ),
    Technique(
        "multicast pair at tile N", "fifth",
        (f"{_R}h200-sweep-tma-v5-pairn.measurements.jsonl.gz",),
        lambda k: _get(k, "cluster_m") == 2, lambda k: _get(k, "persistent") == 1,
        ("cluster_m", "stages"), "+1–3% over the unpaired twin",
    ),
    Technique(
        "epilogue under the next tile", "sixth", _pair("h200-sweep-tma-v5-overlap"),
        lambda k: _get(k, "store") == 2, lambda k: _coop(k) and _get(k, "store") in (1, 2),
        ("store", "stages"), "+2% at K = 4096, up to +8% at K = 1024",
    ),
    Technique(
        "row halves (a fourth stage at 128x256)", "sixth", _pair("h200-sweep-tma-v5-halves"),
        lambda k: _get(k, "store") == 3, lambda k: _coop(k) and _get(k, "store") in (1, 3),
        ("store", "stages"), "+2–5% (the fourth stage), less about 1% (the second wait)",
    ),
    Technique(
        "TMA store of subtiles (64 columns)", "seventh", _pair("h200-sweep-tma-v5-tma"),
        lambda k: _get(k, "store") == 4, lambda k: _get(k, "store") in (1, 4),
        ("store", "stages"), "+1–3% at 128x256, less where the ring was deep",
    ),
    Technique(
        "TMA store of subtiles (16, 32 columns)", "seventh", _pair("h200-sweep-tma-v5-tma-n"),
        lambda k: _get(k, "store") == 4, lambda k: _get(k, "store") in (1, 4),
        ("store", "stages"), "as the 64-column subtiles",
    ),
    Technique(
        "TMA store a warp", "seventh",
        (f"{_R}h200-sweep-tma-v5-tmaw.measurements.jsonl.gz",),
        lambda k: _get(k, "store") == 5, lambda k: _get(k, "store") in (4, 5), ("store",),
        "up to +1% at K = 1024, nothing at 4096³",
    ),
    Technique(
        "ping-pong at 128 x 112, 144, 176", "eighth", _pair("h200-sweep-tma-v5-ppn"),
        lambda k: _get(k, "persistent") == 2 and _get(k, "wgmma_n") in (112, 144, 176),
        _any, ("persistent", "m_blocks", "wgmma_n", "stages"),
        "cuBLASLt's work a cycle at its tiles (no figure)",
    ),
    Technique(
        "multicast pair with the TMA store", "eighth", _pair("h200-sweep-tma-v5-pairtma"),
        lambda k: _get(k, "cluster_m") == 2, _any, ("cluster_m", "stages"),
        "keeps the pair's third less L2→SM traffic without the coupling (no figure)",
    ),
    Technique(
        "ring slot and phase as counters", "ninth",
        (f"{_R}h200-sweep-tma-v5-ring.measurements.jsonl.gz",),
        lambda k: _get(k, "ring") == 1, _any, ("ring",),
        "a few percent where the ring is not a power of two (no figure)",
    ),
    *_TENTH_H200,
    # ... and the same four read the same way from the same sweeps run on a lent H100
    # (2026-12-05, the reference GPU: sweep-tma-v5-tenth[-bf16]-h100's records)
    *(
        Technique(t.name, t.slice, _pair("h100-sweep-tma-v5-tenth"), t.on, t.pool, t.free,
                  t.predicted)
        for t in _TENTH_H200
    ),
    # The twelfth slice (trial variants of the residual designs, run on a lent H200 on
    # 2026-12-05): read from the fused prefill's second database (llama-prefill-fused-rows),
    # each R-by-TMA kernel against its twin of the same target (epilogue 2 residual, 3
    # bias_residual).
    Technique(
        "residual by TMA (fused prefill)", "twelfth",
        (f"{_R}h200-llama-prefill-fused-rows.measurements.jsonl.gz",),
        lambda k: _get(k, "rtma") == 1,
        lambda k: _get(k, "epilogue") in (2, 3), ("rtma",),
        "fused / plain time 1.25 → 1.02–1.04 (o), 1.07 → 1.00–1.02 (down)",
    ),
    # v5 stream-K (fourteenth slice): each stream-K kernel against its data-parallel twin
    # on a CTA per SM, then against the twin on the 128-CTA cap (the space's)
    Technique(
        "stream-K, over a CTA per SM", "fourteenth",
        (f"{_R}h100-sweep-tma-v5-streamk.measurements.jsonl.gz",),
        lambda k: _get(k, "streamk") == 1,
        lambda k: _coop(k) and _get(k, "ctas") == 0, ("streamk",),
        "+1–3% where the last wave is partial",
    ),
    Technique(
        "stream-K, over the 128-CTA cap", "fourteenth",
        (f"{_R}h100-sweep-tma-v5-streamk.measurements.jsonl.gz",),
        lambda k: _get(k, "streamk") == 1,
        lambda k: _coop(k) and (_get(k, "streamk") == 1 or _get(k, "ctas") == 128),
        ("streamk", "ctas"), "+1–2% (the 3% of idle SMs, less the pieces' traffic)",
    ),
)  # fmt: skip


@dataclass(frozen=True)
class Gain:
    gpu: str
    dtype: str
    like: tuple[float, int, int]  # geomean, pairs above 1, pairs
    best: tuple[float, int, int]  # geomean, targets above 1, targets


def _summary(ratios: list[float]) -> tuple[float, int, int]:
    return _gm(ratios), sum(r > 1 for r in ratios), len(ratios)


def gains(root: Path, t: Technique) -> list[Gain]:
    """``t`` in each of its sweeps (one a dtype): like for like and best for best."""
    out = []
    for path in t.sweeps:
        gpu, own, _ = _sweep(root, path, lambda k: tuple(sorted(k.items())))
        like: list[float] = []
        best: list[float] = []
        dtypes = {key[0] for key in own}
        for kernels in own.values():
            pool = [(dict(k), v) for k, v in kernels.items() if t.pool(dict(k))]
            groups: dict[tuple, dict[bool, float]] = {}
            for k, v in pool:
                g = tuple(sorted((n, x) for n, x in k.items() if n not in t.free))
                side = groups.setdefault(g, {})
                side[t.on(k)] = max(v, side.get(t.on(k), 0.0))
            like += [s[True] / s[False] for s in groups.values() if len(s) == 2]
            on = [v for k, v in pool if t.on(k)]
            off = [v for k, v in pool if not t.on(k)]
            if on and off:
                best.append(max(on) / max(off))
        if not like or not best:
            raise ValueError(f"{path}: no kernel of {t.name!r} beside one without it")
        if len(dtypes) != 1:
            raise ValueError(f"{path}: one dtype a sweep, found {sorted(dtypes)}")
        out.append(Gain(gpu, dtypes.pop(), _summary(like), _summary(best)))
    return out


def ledger(root: Path) -> str:
    lines = [
        "Each technique in the sweep that measured it (one database a dtype; "
        "`cudal2.bench.techniques` says how each is read): like for like, the kernels equal "
        "but for the technique (and the ring or tile it moves with), fastest with over "
        "fastest without per target and group (geomean, pairs above 1); best for best, the "
        "sweep's fastest with over its fastest without per target (geomean, targets above "
        "1). The prediction is the one written before the run.",
        "",
        "| technique | slice | GPU | dtype | like for like | best for best | predicted |",
        "|---|---|---|---|---:|---:|---|",
    ]
    for t in TECHNIQUES:
        measured = gains(root, t)
        if not measured:
            lines.append(f"| {t.name} | {t.slice} | not yet run | – | – | – | {t.predicted} |")
        for g in measured:
            like = f"{g.like[0]:.3f} ({g.like[1]} of {g.like[2]})"
            best = f"{g.best[0]:.3f} ({g.best[1]} of {g.best[2]})"
            gpu = g.gpu.removeprefix("NVIDIA ")
            lines.append(
                f"| {t.name} | {t.slice} | {gpu} | {g.dtype} | {like} | {best} | {t.predicted} |"
            )
    return "\n".join(lines)
