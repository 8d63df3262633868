"""The database check of ``ci/gpu_host_runner.sh``: a build measured every job once.

``python ci/host_runner_check.py DB MANIFEST [--exit N --wall S --runner R --killed PID]``
prints one JSON object: every reuse key measured once (a profiled copy repeats its key
with the same status, samples and error: not a second measurement), each target's
distinct designs against ``rounds x candidates``, the cuBLASLt records, the GPUs that
answered (host:index), and the jobs answered "worker died" (the killed worker's job).
Exit status 0 only where the build exited 0, nothing was measured twice and no target is
short of its proposals.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict

from cudal2.database import MeasurementDB
from cudal2.manifest import load_manifest


def check(db: str, manifest: str) -> dict:
    m = load_manifest(manifest)
    ms = MeasurementDB(db).load(warn=False).measurements
    runs: dict = defaultdict(set)
    designs: dict = defaultdict(set)
    for x in ms:
        runs[x.reuse_key].add((x.status.value, x.samples_us, x.error))
        if x.design is not None:
            designs[x.target].add(x.design_key)
    want = m.search.rounds * m.search.candidates
    return {
        "records": len(ms),
        "reuse_keys": len(runs),
        "measured_twice": [str(k) for k, v in runs.items() if len(v) > 1],
        "targets": len(m.targets),
        "designs_per_target_expected": want,
        "targets_short": {t.label: len(designs[t]) for t in m.targets if len(designs[t]) < want},
        "cublaslt_records": sum(1 for x in ms if x.is_vendor),
        "gpus": dict(sorted(Counter(f"{x.gpu.host}:{x.gpu.index}" for x in ms).items())),
        "answered_worker_died": [x.target.label for x in ms if "worker died" in x.error],
        "statuses": dict(Counter(x.status.value for x in ms)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("db")
    p.add_argument("manifest")
    p.add_argument("--exit", type=int, default=0, help="the build's exit status")
    p.add_argument("--wall", type=float, help="the build's wall time, s")
    p.add_argument("--runner", default="")
    p.add_argument("--killed", default="", help="the pid of the worker killed, if any")
    a = p.parse_args(argv)
    out = {"runner": a.runner, "exit": a.exit, "wall_s": a.wall, "killed_worker_pid": a.killed}
    out |= check(a.db, a.manifest)
    out["ok"] = a.exit == 0 and not out["measured_twice"] and not out["targets_short"]
    print(json.dumps(out, indent=1))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
