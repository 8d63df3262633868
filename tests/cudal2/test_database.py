"""The append-only measurement database: round trip, concatenation merge, torn lines."""

from __future__ import annotations

import pytest

from cudal2.database import MeasurementDB, latest


def test_round_trip_and_append_only(tmp_path, recorded_measurements):
    db = MeasurementDB(tmp_path / "m.jsonl")
    assert db.read() == []
    half = len(recorded_measurements) // 2
    db.append(recorded_measurements[:half])
    db.append(recorded_measurements[half:])
    assert db.read() == recorded_measurements


def test_merge_is_concatenation(tmp_path, recorded_measurements):
    a, b = MeasurementDB(tmp_path / "a.jsonl"), MeasurementDB(tmp_path / "b.jsonl")
    a.append(recorded_measurements[:3])
    b.append(recorded_measurements[3:6])
    merged = tmp_path / "merged.jsonl"
    merged.write_bytes(a.path.read_bytes() + b.path.read_bytes())
    assert MeasurementDB(merged).read() == recorded_measurements[:6]


def test_torn_last_line_is_skipped_and_next_append_starts_clean(tmp_path, recorded_measurements):
    db = MeasurementDB(tmp_path / "m.jsonl")
    db.append(recorded_measurements[:2])
    with db.path.open("a") as f:  # a writer killed mid-line
        f.write('{"schema_version": 1, "target": {"ar')
    with pytest.warns(UserWarning, match="skipping unreadable record"):
        assert db.read() == recorded_measurements[:2]
    db.append(recorded_measurements[2:3])
    with pytest.warns(UserWarning):
        assert db.read() == recorded_measurements[:3]


def test_latest_record_of_a_key_stands(recorded_measurements):
    """A record appended later for the same (GPU, target, artifact, toolchain, mode),
    e.g. one enriched with profile metrics, replaces the earlier one in place."""
    import dataclasses

    ms = recorded_measurements[:5]
    enriched = dataclasses.replace(ms[1], metrics={**ms[1].metrics, "ncu_sm_pct": 50.0})
    out = latest([*ms, enriched])
    assert len(out) == len({m.reuse_key for m in ms})
    assert enriched in out and ms[1] not in out
    assert out.index(enriched) == [m.reuse_key for m in out].index(ms[1].reuse_key)
    # The recorded build profiled its best candidates after measuring them: each of
    # those keys has two records, and the later, profiled one stands.
    out = latest(recorded_measurements)
    assert (
        len(out) == len({m.reuse_key for m in recorded_measurements}) < len(recorded_measurements)
    )
    profiled = [m for m in out if any(k.startswith("ncu_") for k in m.metrics)]
    twice = [m for m in recorded_measurements if any(k.startswith("ncu_") for k in m.metrics)]
    assert profiled and len(profiled) == len(twice)
