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
    technique_on,
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
    ({"persistent": 1, "store": 1, "wgmma_n": 80}, "persistent v5"),  # v5 tile N
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


# (knobs, technique knob, whether the design uses it): v5's tile N is a wgmma_n that is
# not a power of two; every other technique a knob away from its default.
TECHNIQUE_ON = [
    ({"wgmma_n": 80}, "wgmma_n", True),
    ({"wgmma_n": 224}, "wgmma_n", True),
    ({"wgmma_n": 160, "persistent": 1}, "wgmma_n", True),
    ({"wgmma_n": 128}, "wgmma_n", False),
    ({"wgmma_n": 256}, "wgmma_n", False),
    ({"wgmma_n": 64}, "wgmma_n", False),
    ({}, "wgmma_n", False),
    ({"store": 1}, "store", True),
    ({}, "store", False),
    ({"cluster_m": 1}, "cluster_m", False),
    ({"cluster_m": 2}, "cluster_m", True),
    ({"persistent": 2, "store": 1}, "persistent", True),  # v5 ping-pong
    ({"persistent": 1, "store": 1}, "persistent", False),
    ({}, "persistent", False),
]


@pytest.mark.parametrize(("knobs", "knob", "on"), TECHNIQUE_ON)
def test_technique_on(knobs, knob, on):
    assert technique_on(knobs, knob) is on


def test_the_tile_n_gain_is_best_non_power_of_two_over_best_power_of_two():
    by_target = {
        ("fp16", 1, 1, 1): [
            _t(0.73, wgmma_n=128, store=1),
            _t(0.70, wgmma_n=256, store=1),
            _t(0.90, wgmma_n=80, store=1),
            _t(0.60, wgmma_n=160, store=1),
        ],
        ("fp16", 2, 2, 2): [_t(0.9, wgmma_n=256, store=1), _t(0.85, wgmma_n=224, store=1)],
        ("fp16", 3, 3, 3): [_t(0.9, wgmma_n=256, store=1)],  # no tile N kernel: left out
    }
    gain, n = technique_gain(by_target, "wgmma_n")
    assert n == 2 and gain == pytest.approx(math.sqrt(0.90 / 0.73 * 0.85 / 0.9))


def test_the_pingpong_gain_is_best_pingpong_over_best_cooperative():
    """v5 ping-pong's row: among the unpaired persistent kernels (a pair or a one-tile
    kernel is neither side), the best ping-pong one over the best cooperative one."""
    by_target = {
        ("fp16", 1, 1, 1): [
            _t(0.94, store=1),
            _t(0.90, store=1, raster=8),
            _t(0.97, persistent=2, store=1),
            _t(0.99, cluster_m=2, store=1),  # a pair: left out
            _t(0.99, persistent=0),  # one tile: left out
        ],
        ("fp16", 2, 2, 2): [_t(0.9, store=1), _t(0.85, persistent=2, store=1, ctas=128)],
        ("fp16", 3, 3, 3): [_t(0.9, persistent=2, store=1)],  # no cooperative kernel: left out
    }
    gain, n = technique_gain(by_target, "persistent")
    assert n == 2 and gain == pytest.approx(math.sqrt(0.97 / 0.94 * 0.85 / 0.9))
    # the other techniques still compare persistent = 1 kernels only (the pair among them)
    assert technique_gain(by_target, "raster") == (pytest.approx(0.90 / 0.99), 1)


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


@pytest.mark.parametrize("path", [standing.TMA_V5_SWEEP, standing.TMA_V5_SWEEP_BF16])
def test_the_v5_sweeps_hold_no_tile_n_kernel(path):
    """v5's sweeps measured 128x128 and 128x256 tiles only: no tile N gain in them."""
    by_target = _committed(path)
    assert not any(technique_on(r.knobs, "wgmma_n") for rows in by_target.values() for r in rows)
    assert technique_gain(by_target, "wgmma_n") == (None, 0)


def test_the_tile_n_sweeps_join_the_table_once_committed(tmp_path):
    """Absent, the tile N sweeps change nothing (the table as before them); present,
    their files are read and named. Here the pair sweep's real records stand in for the
    fp16 one's file (no tile N kernel in them, so no tile N row)."""
    for p in (standing.TMA_V5_SWEEP, standing.TMA_V5_SWEEP_BF16, standing.TMA_V5_PAIR):
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / p).symlink_to(ROOT / p)
    before = standing.tma_v5_sweep(tmp_path)
    assert "tile N" not in before
    if not (ROOT / standing.TMA_V5_TILE_N).exists():  # the tree before the sweep's commit
        assert before == standing.tma_v5_sweep(ROOT)
    (tmp_path / standing.TMA_V5_TILE_N).symlink_to(ROOT / standing.TMA_V5_PAIR)
    table = standing.tma_v5_sweep(tmp_path)
    assert f"`{standing.TMA_V5_TILE_N}`" in table and "the tile N sweeps' own controls" in table
    assert "| tile N not a power of two |" not in table
    assert table.count("\n| fp16 | ") == table.count("\n| bf16 | ") == 17


def test_a_committed_tile_n_sweep_gives_the_technique_row():
    """Once the H100 tile N sweep is committed, its technique row is in the table."""
    if not (ROOT / standing.TMA_V5_TILE_N).exists():
        pytest.skip("the tile N sweep is not committed yet (docs/kernels.md, sm90tma v5 tile N)")
    table = standing.tma_v5_sweep(ROOT)
    assert "| tile N not a power of two | `wgmma_n` | `h100-sweep-tma-v5-n` | fp16 |" in table


def test_the_sweep_table_is_made_from_the_database():
    table = standing.tma_v5_sweep(ROOT)
    assert table.count("\n| fp16 | ") == table.count("\n| bf16 | ") == 17
    assert "| bulk store through a C buffer | `store` | `h100-sweep-tma-v5-bf16` | bf16 |" in table
    assert "| 2-CTA multicast pair | `cluster_m` | `h100-sweep-tma-v5-pair` | fp16 |" in table


def test_the_pingpong_sweep_joins_the_table_once_committed(tmp_path):
    """Absent, the ping-pong sweep changes nothing; present, its file is read and named,
    and its kernels give the ping-pong row. Here the committed llm-public database
    (ping-pong and cooperative kernels of the accumulator store beside each other on 19
    fp16 and 21 bf16 targets) stands in for its file."""
    paths = (standing.TMA_V5_SWEEP, standing.TMA_V5_SWEEP_BF16, standing.TMA_V5_PAIR)
    for p in (*paths, standing.TMA_V5_TILE_N, standing.TMA_V5_TILE_N_BF16):
        if (ROOT / p).exists():
            (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / p).symlink_to(ROOT / p)
    before = standing.tma_v5_sweep(tmp_path)
    assert "ping-pong, not cooperative" not in before and "the ping-pong sweep" not in before
    if not (ROOT / standing.TMA_V5_PINGPONG).exists():  # the tree before the sweep's commit
        assert before == standing.tma_v5_sweep(ROOT)
    stand_in = "manifests/llm-public-h100.measurements.jsonl.gz"
    (tmp_path / standing.TMA_V5_PINGPONG).write_bytes((ROOT / stand_in).read_bytes())
    table = standing.tma_v5_sweep(tmp_path)
    assert f"`{standing.TMA_V5_PINGPONG}`" in table and "the ping-pong sweep is fp16 only" in table
    rows = [r for r in table.splitlines() if r.startswith("| ping-pong, not cooperative |")]
    by_target = timed(latest(MeasurementDB(ROOT / stand_in).read()))
    expected = []
    for dtype in ("fp16", "bf16"):
        run = {k: v for k, v in by_target.items() if k[0] == dtype}
        gain, n = technique_gain(run, "persistent")
        if n:
            name = "h100-sweep-tma-v5-pingpong"
            expected.append(
                f"| ping-pong, not cooperative | `persistent` | `{name}` | {dtype} | {gain:.3f} "
                f"| {n} |"
            )
    assert expected and sorted(rows) == sorted(expected)


def test_a_committed_pingpong_sweep_gives_the_technique_row():
    """Once the H100 ping-pong sweep is committed, its technique row is in the table."""
    if not (ROOT / standing.TMA_V5_PINGPONG).exists():
        pytest.skip("the ping-pong sweep is not committed yet (docs/kernels.md, v5 ping-pong)")
    table = standing.tma_v5_sweep(ROOT)
    assert (
        "| ping-pong, not cooperative | `persistent` | `h100-sweep-tma-v5-pingpong` | fp16 |"
        in table
    )
