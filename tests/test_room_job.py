"""ci/room_job.py on CPU: the plan (each decode target's incumbent and its fastest tile
with room variants, plain, with each trigger, and each room with each trigger, from the
committed H100 databases) and the summary of a run's rows."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from cudal2.generator.families.base import pdl_trigger, room, with_pdl
from cudal2.generator.space import pdl_variants, room_variants

ROOT = Path(__file__).resolve().parents[1]


def _room_job():
    spec = importlib.util.spec_from_file_location("room_job", ROOT / "ci" / "room_job.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["room_job"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_plan_measures_each_tile_beside_its_room_variants():
    rj = _room_job()
    entries = rj.plan()
    targets = rj.targets()
    assert len(targets) == 32 and all(t.m <= 256 and t.dtype == "fp16" for t in targets)
    assert {t for _, t, _ in entries} <= set(targets)
    rooms = [d for _, _, d in entries if room(d) != "none"]
    assert rooms and all(pdl_trigger(d) != "none" for d in rooms)  # room only with PDL
    # every tile: plain, its triggers, then its rooms' triggers, in that order
    for role, t in {(r, t) for r, t, _ in entries}:
        mine = [d for r, tt, d in entries if (r, tt) == (role, t)]
        tile = mine[0]
        want = [
            tile,
            *pdl_variants(tile),
            *(p for x in room_variants(tile) for p in pdl_variants(x)),
        ]
        assert mine == want
    # a roomy tile is measured on every target that has one recorded
    assert sum(1 for r, _, d in entries if r == "roomy" and d == with_pdl(d, "none")) > 0


def test_the_summary_compares_the_best_pdl_time_with_and_without_room():
    rj = _room_job()

    def row(trigger, rm, us, status="ok"):
        return {"target": "fp16/tn 1x4096x4096", "role": "incumbent", "tile": "k",
                "kernel": f"k_{trigger}_{rm}", "trigger": trigger, "room": rm,
                "status": status, "error": "", "median_us": us}  # fmt: skip

    rows = [
        row("none", "none", 14.0),
        row("entry", "none", 13.0),
        row("after_mainloop", "none", 13.5),
        row("entry", "half", 12.0),
        row("after_mainloop", "half", 12.5),
        row("entry", "quarter", None, status="incorrect"),
    ]
    s = rj.summarize(rows)
    (r,) = s["rows"]
    assert r["plain_us"] == 14.0 and r["pdl_us"] == 13.0 and r["pdl_trigger"] == "entry"
    assert r["half_us"] == 12.0 and r["quarter_us"] is None
    assert r["pdl_over_room"] == round(13.0 / 12.0, 4) == s["geomean_pdl_over_room"]
    assert len(r["failed"]) == 1 and "incorrect" in r["failed"][0]
