"""The reward, CUDA-L2's Eq. 3 adapted to our records, and the history a prompt carries.

CUDA-L2: r = mean(t_ref / t - alpha * maxdiff) - beta * code_length. Here, per measured
candidate:

    r = log(t_best_vendor / t) - ALPHA * deviation - BETA * code_chars / 10,000

- log speedup over the best vendor (torch or the autotuned cuBLASLt algorithm, whichever
  was faster in the target's records), so a 2x slower and a 2x faster kernel weigh
  alike and targets of any size share one scale;
- ``deviation``: the candidate's max |error| over the vendors' own max |error| on the
  same inputs (a passing kernel is <= 1; the correctness suite already rejects more).
  ALPHA = 0.02: a kernel as far from the reference as the vendors are pays 2%;
- ``code_chars``: the rendered CUDA source's length. BETA = 0.005 per 10,000
  characters: a 20,000-character sm90tma kernel pays 1% against a 10,000-character one;
  enough to break ties toward the simpler kernel, far below timing noise otherwise;
- a candidate that failed (compile, runtime, incorrect, timeout) gets FAILURE = -1.0,
  as bad as a kernel 2.7x slower than the vendor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from cudal2.policy.corpus import Row
from cudal2.policy.tokens import GpuFeatures, HistoryEntry
from cudal2.records import Target

ALPHA = 0.02
BETA = 0.005
FAILURE = -1.0


def log_speedup(row: Row, vendor_log: float) -> float | None:
    s = row.speedup
    return None if s is None else math.log(s) - vendor_log


def reward(row: Row, vendor_log: float) -> float:
    ls = log_speedup(row, vendor_log)
    if ls is None:
        return FAILURE
    return ls - ALPHA * (row.deviation or 0.0) - BETA * row.code_chars / 10_000


def entry(row: Row, vendor_log: float, gpu: GpuFeatures) -> HistoryEntry:
    """A history entry for a measured row: Nsight Compute's DRAM and tensor-pipe
    percentages where it profiled the candidate, else the rates derived from the time
    (bytes and FLOPs over time) against the datasheet peaks."""
    m = row.metrics
    dram = m["ncu_dram_pct"] / 100 if "ncu_dram_pct" in m else None
    tensor = m["ncu_tensor_pct"] / 100 if "ncu_tensor_pct" in m else None
    if dram is None and "gbps" in m:
        dram = m["gbps"] * 1e9 / gpu.bandwidth
    if tensor is None and "tflops" in m:
        tensor = m["tflops"] * 1e12 / gpu.flops
    ok = row.status == "ok"
    return HistoryEntry(
        row.design,
        log_speedup(row, vendor_log),
        row.status,
        dram if ok else None,
        tensor if ok else None,
    )


def _distance(a: Target, b: Target) -> float:
    return sum(abs(math.log2(x) - math.log2(y)) for x, y in ((a.m, b.m), (a.n, b.n), (a.k, b.k)))


def neighbours(t: Target, pool: Sequence[Target], count: int) -> list[Target]:
    """The ``count`` targets of ``pool`` of t's dtype and layout nearest in log M, N, K
    (t itself excluded)."""
    same = [u for u in pool if u != t and u.dtype == t.dtype and u.layout == t.layout]
    return sorted(same, key=lambda u: (_distance(t, u), u))[:count]


def neighbour_history(
    t: Target,
    rows_by_target: Mapping[Target, Sequence[Row]],
    vendor_log: Mapping[Target, float],
    gpu: GpuFeatures,
    count: int = 3,
) -> list[HistoryEntry]:
    """Contrastive context from similar, already measured targets: for each of the
    ``count`` nearest, its best and its worst-but-correct design."""
    out = []
    for u in neighbours(t, list(rows_by_target), count):
        vl = vendor_log.get(u, 0.0)
        ok = [r for r in rows_by_target[u] if r.status == "ok"]
        if not ok:
            continue
        ranked = sorted(ok, key=lambda r: reward(r, vl))
        for r in {id(x): x for x in (ranked[0], ranked[-1])}.values():
            out.append(entry(r, vl, gpu))
    return out
