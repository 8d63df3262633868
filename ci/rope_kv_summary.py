"""The rope_kv sweep's table (ci/gpu_rope_kv.sh): per target (M) and sm90direct design,
the median µs of the rmsnorm_rope_kv kernel, of the same design with the plain rmsnorm
epilogue (what RoPE and the cache write cost inside the kernel), and torch's unfused
sequence (the baseline timed beside each). Reads a measurement database (.jsonl or
.jsonl.gz); prints a markdown table and, per M, the fastest of each.

    python ci/rope_kv_summary.py OUT/sweep-rope-kv-h100.measurements.jsonl.gz
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict

from cudal2.database import MeasurementDB
from cudal2.generator.families.base import with_epilogue
from cudal2.generator.space import design_name
from cudal2.records import Status


def main(path: str) -> int:
    ms = [m for m in MeasurementDB(path).read() if m.design is not None]
    # (M, the design without its epilogue) -> epilogue -> (median µs, torch µs)
    rows: dict[tuple[int, str], dict[str, tuple[float, float]]] = defaultdict(dict)
    failed = [m for m in ms if m.status != Status.OK]
    for m in ms:
        if m.status != Status.OK or m.median_us is None:
            continue
        plain = design_name(with_epilogue(m.design, "none"))
        torch_us = statistics.median(m.baselines_us.values()) if m.baselines_us else float("nan")
        rows[(m.target.m, plain)][m.target.epilogue] = (m.median_us, torch_us)
    rope = "rmsnorm_rope_kv"
    print(f"{len(ms)} records, {len(failed)} not ok")
    for m in failed[:20]:
        print(f"  {m.status.value}: {m.target.label} {design_name(m.design)}: {m.error[:200]}")
    print()
    print(
        "| M | design | rope_kv µs | rmsnorm µs | rope_kv - rmsnorm | torch unfused µs "
        "| torch / rope_kv |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|")
    best: dict[int, tuple[float, str]] = {}
    for (mm, name), by in sorted(rows.items()):
        if rope not in by:
            continue
        r_us, t_us = by[rope]
        s_us = by.get("rmsnorm", (float("nan"), 0.0))[0]
        print(
            f"| {mm} | {name.removeprefix('hgemm_sm90direct_sm90_')} | {r_us:.1f} | {s_us:.1f} | "
            f"{r_us - s_us:+.1f} | {t_us:.1f} | {t_us / r_us:.3f} |"
        )
        if mm not in best or r_us < best[mm][0]:
            best[mm] = (r_us, name)
    for mm, (us, name) in sorted(best.items()):
        print(f"M = {mm}: fastest rope_kv {us:.1f} µs ({name})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
