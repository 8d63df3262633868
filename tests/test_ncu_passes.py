"""ci/ncu_passes.py on CPU: each quantity set profiled once, with what the profiling
call reports (here the ncu log recorded on the H100, 9 passes per kernel, for every set:
the stand-in does not know what ncu would do with fewer counters)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from cudal2.verify import profile as prof

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "verify" / "data"
RECORD = json.loads((DATA / "ncu-h100-profile.json").read_text())


def _ncu_passes():
    spec = importlib.util.spec_from_file_location("ncu_passes", ROOT / "ci" / "ncu_passes.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ncu_passes"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_each_set_is_profiled_once_asking_for_its_quantities():
    mod = _ncu_passes()
    asked = []
    passes = prof.passes_of((DATA / "ncu-h100-log.txt").read_text())

    def run(jobs, wanted=()):
        asked.append(wanted)
        metrics = [{k: v for k, v in m.items() if k in wanted} for m in RECORD["metrics"]]
        return prof.ProfileResult(metrics, passes=passes, seconds={"ncu_run_1": 1.0})

    out = mod.measure_sets(RECORD["jobs"], run=run)
    assert asked == [tuple(q) for q in mod.SETS.values()]
    assert out["search"]["quantities"] == list(prof.SEARCH_QUANTITIES)
    assert "ncu_duration_us" not in out["search without duration"]["quantities"]
    assert out["all"]["collected"] == sorted(prof.METRICS)
    assert all(r["passes"] == [9, 9, 9] and r["ncu_runs_s"] == [1.0] for r in out.values())
