"""On a GPU machine with ncu: how many replay passes, and seconds, each set of Nsight
Compute quantities costs, on three recorded kernels of the default database (those
``ci/record_ncu.py`` profiles). The evidence behind ``search.profile_metrics``: the
search's set against all seven, and each of its quantities alone (does the duration
cost a pass of its own?).

    python ci/ncu_passes.py OUT_DIR      # writes OUT_DIR/ncu-passes.json
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cudal2.verify.profile import METRICS, SEARCH_QUANTITIES, ProfileResult, profile

# name -> the quantities profiled together
SETS: dict[str, tuple[str, ...]] = {
    "search": SEARCH_QUANTITIES,
    "search without duration": tuple(q for q in SEARCH_QUANTITIES if q != "ncu_duration_us"),
    **{q: (q,) for q in SEARCH_QUANTITIES},
    "all": tuple(METRICS),
}


def measure_sets(
    jobs: list[dict[str, Any]],
    sets: dict[str, Sequence[str]] = SETS,
    run: Callable[..., ProfileResult] = profile,
) -> dict[str, dict[str, Any]]:
    """Each set profiled once on ``jobs``: ncu's passes per kernel, the wall seconds of
    the call and of its runs, the child's launches (its replays), what came back."""
    out = {}
    for name, wanted in sets.items():
        t0 = time.perf_counter()
        res = run(jobs, wanted=tuple(wanted))
        out[name] = {
            "quantities": list(wanted),
            "passes": res.passes,
            "call_s": round(time.perf_counter() - t0, 3),
            "ncu_runs_s": [v for k, v in res.seconds.items() if k.startswith("ncu_run_")],
            "child_launches_s": res.seconds.get("child_launches"),
            "collected": sorted({k for m in res.metrics for k in m}),
            "error": res.error.splitlines()[0] if res.error else "",
        }
    return out


def main(out: Path) -> int:
    # record_ncu's three recorded kernels (this folder is on sys.path when run as a script)
    from record_ncu import recorded_jobs

    _, jobs = recorded_jobs()
    result = measure_sets(jobs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ncu-passes.json").write_text(json.dumps(result, indent=1) + "\n")
    for name, r in result.items():
        print(f"{name:<26} passes {r['passes']}  call {r['call_s']:.1f} s  {r['error']}")
    return 0 if not any(r["error"] for r in result.values()) else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
