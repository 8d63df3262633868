"""On a GPU machine with ncu: profile three recorded kernels of the default database
and write what the CPU tests replay: the imported report as CSV, ncu's log, and the
jobs with the metrics parsed from it (``tests/verify/data/``).

    python ci/record_ncu.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from cudal2.database import MeasurementDB
from cudal2.generator.compile import ArtifactCache, build_all
from cudal2.manifest import default_manifest_path
from cudal2.records import Measurement
from cudal2.verify.profile import job, profile


def recorded_jobs() -> tuple[list[Measurement], list[dict[str, Any]]]:
    """Three recorded kernels of the default database (the fastest, the median and the
    slowest; kernel records only: a cuBLASLt record has no design to compile), compiled
    here, and their profile jobs."""
    ms = MeasurementDB(default_manifest_path().with_name("default.measurements.jsonl")).read()
    ok = sorted(
        (m for m in ms if m.status == "ok" and m.design is not None), key=lambda m: m.median_us
    )
    chosen = [ok[0], ok[len(ok) // 2], ok[-1]]
    cache = ArtifactCache()
    built = build_all([m.design for m in chosen], cache)
    jobs = [
        job(cache.cubin_path(built[m.design_key].artifact_key), m.design, m.target) for m in chosen
    ]
    return chosen, jobs


def main(out: Path) -> int:
    chosen, jobs = recorded_jobs()
    res = profile(jobs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ncu-raw.csv").write_text(res.csv)
    (out / "ncu-log.txt").write_text(res.log)
    record = {
        "error": res.error,
        "names": res.names,
        "jobs": [{"symbol": j["symbol"], "target": j["target"]} for j in jobs],
        "metrics": res.metrics,
        "recorded_median_us": [m.median_us for m in chosen],
    }
    (out / "ncu-profile.json").write_text(json.dumps(record, indent=1))
    print(json.dumps(record, indent=1))
    return 0 if not res.error else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
