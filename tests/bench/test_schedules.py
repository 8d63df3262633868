"""sm90tma's schedules and v5's technique gains (``cudal2.bench.schedules``), on the
committed H100 v5 sweep database."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from cudal2.bench import standing
from cudal2.bench.schedules import (
    SCHEDULES,
    Timed,
    best_by_schedule,
    schedule,
    technique_gain,
    timed,
)
from cudal2.database import MeasurementDB, latest

ROOT = Path(__file__).resolve().parents[2]

# (knobs as a design's JSON holds them, its schedule)
KNOBS = [
    ({"persistent": 0, "cluster_m": 1}, "one tile"),
    ({}, "one tile"),
    ({"persistent": 0, "cluster_m": 2}, "multicast pair"),
    ({"persistent": 1, "cluster_m": 1}, "persistent"),
    ({"persistent": 1, "store": 1}, "persistent v5"),
    ({"persistent": 1, "raster": 8}, "persistent v5"),
    ({"persistent": 1, "ctas": 128}, "persistent v5"),
    ({"persistent": 1, "cluster_m": 2}, "persistent pair"),
    ({"persistent": 1, "cluster_m": 2, "store": 1}, "persistent pair"),
    ({"persistent": 1, "raster": 0, "ctas": 0, "store": 0}, "persistent"),
    ({"persistent": 2}, "ping-pong"),
]


@pytest.mark.parametrize(("knobs", "expected"), KNOBS)
def test_schedule_of_a_design(knobs, expected):
    assert schedule(knobs) == expected
    assert expected in SCHEDULES


def _t(speedup: float, **knobs: int) -> Timed:
    return Timed({"persistent": 1, **knobs}, 100.0, 100.0 * speedup, {})


def test_a_technique_gain_is_the_geomean_of_best_on_over_best_off():
    by_target = {
        ("fp16", 1, 1, 1): [_t(0.9), _t(0.8), _t(0.99, store=1), _t(0.5, store=1)],
        ("fp16", 2, 2, 2): [_t(0.8), _t(0.88, store=1)],
        ("fp16", 3, 3, 3): [_t(0.8, store=1)],  # no "off" kernel: left out
    }
    gain, n = technique_gain(by_target, "store")
    assert n == 2
    assert gain == pytest.approx(math.sqrt(0.99 / 0.9 * 0.88 / 0.8))
    # cluster_m's "off" is 1, not 0
    pair = {("fp16", 1, 1, 1): [_t(0.9, cluster_m=1), _t(0.95, cluster_m=2)]}
    assert technique_gain(pair, "cluster_m") == (pytest.approx(0.95 / 0.9), 1)
    assert technique_gain(by_target, "raster") == (None, 0)


def _committed(path: str = standing.TMA_V5_SWEEP):
    return timed(latest(MeasurementDB(ROOT / path).read()))


@pytest.mark.parametrize("path", [standing.TMA_V5_SWEEP, standing.TMA_V5_SWEEP_BF16])
def test_the_sweep_times_every_schedule_on_every_target(path):
    by_target = _committed(path)
    assert len(by_target) == 17  # llm-public's 16 M >= 1024 shapes and 8192^3
    for key, rows in by_target.items():
        best = best_by_schedule(rows)
        assert {"one tile", "multicast pair", "persistent", "persistent v5"} <= set(best), key
        assert all(0.1 < r.speedup < 2.0 for r in rows)  # sanity: ratios, not µs


@pytest.mark.parametrize("path", [standing.TMA_V5_SWEEP, standing.TMA_V5_SWEEP_BF16])
def test_the_recorded_gains_of_the_v5_techniques(path):
    """What the H100 sweeps say (docs/kernels.md, sm90tma v5): the bulk store is the
    technique that pays; the grouped walk and the 128-CTA cap are within 2%."""
    by_target = _committed(path)
    store, n = technique_gain(by_target, "store")
    assert n == 17 and store > 1.05
    for knob in ("raster", "ctas"):
        gain, n = technique_gain(by_target, knob)
        assert n == 17 and 0.98 < gain < 1.02


def test_the_sweep_table_is_made_from_the_database():
    table = standing.tma_v5_sweep(ROOT)
    assert table.count("\n| fp16 | ") == table.count("\n| bf16 | ") == 17
    assert "| bulk store through a C buffer | `store` | `h100-sweep-tma-v5-bf16` | bf16 |" in table
    assert "| 2-CTA multicast pair | `cluster_m` | `h100-sweep-tma-v5-pair` | fp16 |" in table
