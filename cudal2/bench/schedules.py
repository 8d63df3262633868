"""sm90tma's schedules at prefill sizes (issue 22), from a sweep's measurement database:
per target, the fastest correct kernel of each schedule against torch timed in the same
job, and what each of sm90tma v5's techniques gave (``docs/kernels.md``, "sm90tma v5").

A schedule is read off a design's knobs: one tile per CTA, the 2-CTA multicast pair
(``cluster_m`` = 2), the persistent cooperative kernel of v2 (``persistent`` = 1 with v5's
knobs at their defaults) and of v5 (any of ``raster``, ``ctas``, ``store`` set), the
multicast pair inside it (``persistent`` = 1, ``cluster_m`` = 2), or ping-pong
(``persistent`` = 2). A technique's gain is, per target, the best persistent
cooperative kernel with the knob set over the best with it at its default (each as a
speedup over its own job's torch), geomean over the targets that have both; for v5's
tile N (``wgmma_n``), "set" is a tile N that is not a power of two (128 x 80, 160, 192,
224: the persistent cooperative kernel's tile N of issue 22) and "default" one that is.
For v5 ping-pong (``persistent``), the pool is every unpaired persistent kernel, "set" is
ping-pong (``persistent`` = 2) and "default" the cooperative kernel (1).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

V5_KNOBS = ("raster", "ctas", "store")  # sm90tma v5's knobs, each 0 by default
DEFAULTS = {"raster": 0, "ctas": 0, "store": 0, "cluster_m": 1}  # a technique's "off"
SCHEDULES = (
    "one tile",
    "multicast pair",
    "persistent",
    "persistent v5",
    "persistent pair",
    "ping-pong",
)


def schedule(knobs: dict[str, int]) -> str:
    """The schedule of an sm90tma design, from its knobs (JSON form: defaults left out)."""
    if knobs.get("persistent", 0) == 2:
        return "ping-pong"
    if knobs.get("persistent", 0) == 1:
        if knobs.get("cluster_m", 1) > 1:
            return "persistent pair"
        return "persistent v5" if any(knobs.get(k, 0) for k in V5_KNOBS) else "persistent"
    return "multicast pair" if knobs.get("cluster_m", 1) > 1 else "one tile"


@dataclass(frozen=True)
class Timed:
    """One correct kernel's median and its job's torch median, µs."""

    knobs: dict[str, int]
    us: float
    torch_us: float
    metrics: dict[str, Any]

    @property
    def speedup(self) -> float:
        return self.torch_us / self.us


def timed(ms: Iterable[Any]) -> dict[tuple[str, int, int, int], list[Timed]]:
    """(dtype, M, N, K) -> the correct sm90tma kernels measured with a torch baseline."""
    out: dict[tuple[str, int, int, int], list[Timed]] = defaultdict(list)
    for m in ms:
        if m.status != "ok" or m.design is None or m.design.family != "sm90tma":
            continue
        base = (m.baseline_samples_us or {}).get("torch")
        if not base or not m.median_us:
            continue
        key = (m.target.dtype, m.target.m, m.target.n, m.target.k)
        knobs = dict(m.design.knobs.as_json())
        out[key].append(Timed(knobs, m.median_us, statistics.median(base), dict(m.metrics)))
    return out


def vendor_timed(ms: Iterable[Any]) -> dict[tuple[str, int, int, int], float]:
    """(dtype, M, N, K) -> cuBLASLt's autotuned record (no design) as a speedup over the
    torch baseline timed beside it."""
    return {
        (m.target.dtype, m.target.m, m.target.n, m.target.k): m.baselines_us["torch"] / m.median_us
        for m in ms
        if m.status == "ok" and m.design is None and "torch" in m.baselines_us
    }


def best_by_schedule(rows: Sequence[Timed]) -> dict[str, Timed]:
    """The fastest (over its own torch) kernel of each schedule present."""
    best: dict[str, Timed] = {}
    for r in rows:
        s = schedule(r.knobs)
        if s not in best or r.speedup > best[s].speedup:
            best[s] = r
    return best


def technique_on(knobs: dict[str, int], knob: str) -> bool:
    """Whether a design (JSON knobs) uses a technique: ``wgmma_n`` not a power of two
    (v5's tile N), any other knob away from its default (``DEFAULTS``, else 0)."""
    if knob == "wgmma_n":
        n = knobs.get("wgmma_n", 0)
        return n > 0 and n & (n - 1) != 0
    if knob == "persistent":  # ping-pong, against the cooperative kernel
        return knobs.get("persistent", 0) == 2
    off = DEFAULTS.get(knob, 0)
    return knobs.get(knob, off) != off


def technique_gain(
    by_target: dict[tuple[str, int, int, int], list[Timed]], knob: str
) -> tuple[float | None, int]:
    """Geomean over targets of the best persistent cooperative kernel with ``knob`` set
    over the best with it at its default, and how many targets had both (``persistent``:
    the best ping-pong kernel over the best cooperative one, neither a multicast pair)."""
    logs = []
    for rows in by_target.values():
        coop = [r for r in rows if r.knobs.get("persistent", 0) == 1]
        if knob == "persistent":
            coop = [
                r
                for r in rows
                if r.knobs.get("persistent", 0) in (1, 2) and r.knobs.get("cluster_m", 1) == 1
            ]
        on = [r.speedup for r in coop if technique_on(r.knobs, knob)]
        off = [r.speedup for r in coop if not technique_on(r.knobs, knob)]
        if on and off:
            logs.append(math.log(max(on) / max(off)))
    if not logs:
        return None, 0
    return math.exp(sum(logs) / len(logs)), len(logs)
