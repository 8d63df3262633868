"""The append-only measurement database: round trip, concatenation merge, torn lines."""

from __future__ import annotations

import pytest

from cudal2.database import DatabaseError, MeasurementDB, latest


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


def test_reused_databases_are_read_first_and_never_written(tmp_path, recorded_measurements):
    """A database with ``reuse``: the reused files' records first (each file once,
    however spelled, the own file too), then its own, whose record of a key stands over
    a reused one's; appends go to its own file only."""
    import dataclasses

    a, b = MeasurementDB(tmp_path / "a.jsonl"), MeasurementDB(tmp_path / "b.jsonl")
    a.append(recorded_measurements[:3])
    b.append(recorded_measurements[3:6])
    own = tmp_path / "own.jsonl"
    spellings = [a.path, b.path, tmp_path / "." / "a.jsonl", own]
    db = MeasurementDB(own, spellings)
    assert db.reuse == (a.path, b.path)
    assert db.read() == recorded_measurements[:6]  # a missing own file: empty
    m1 = recorded_measurements[1]
    again = dataclasses.replace(m1, metrics={**m1.metrics, "ncu_sm_pct": 50.0})
    db.append([again, *recorded_measurements[6:7]])
    assert db.read() == [*recorded_measurements[:6], again, recorded_measurements[6]]
    assert a.read() == recorded_measurements[:3] and b.read() == recorded_measurements[3:6]
    stands = {m.reuse_key: m for m in latest(db.read())}
    assert stands[again.reuse_key] == again != m1


def test_the_newest_record_of_a_key_stands_whichever_file_holds_it(tmp_path, recorded_measurements):
    """With reused databases, a key's newest measurement stands (``latest``): a sweep's
    re-measurement newer than the database's own record, or the database's own newer one;
    at equal times, the database's own."""
    import dataclasses

    m = recorded_measurements[0]
    newer = dataclasses.replace(m, measured_at="2099-01-01T00:00:00Z")
    enriched = dataclasses.replace(m, metrics={**m.metrics, "ncu_sm_pct": 50.0})
    cases = [  # (reused file's records, own file's records, the one that stands)
        ([newer], [m], newer),
        ([m], [newer], newer),
        ([m], [enriched], enriched),
        ([enriched], [m], m),
    ]
    for i, (reused, own, stands) in enumerate(cases):
        r = MeasurementDB(tmp_path / f"r{i}.jsonl")
        r.append(reused)
        db = MeasurementDB(tmp_path / f"own{i}.jsonl", [r.path])
        db.append(own)
        (got,) = latest(db.read())
        assert got == stands, i


def test_a_bad_line_in_a_reused_database_is_named_by_its_file(tmp_path, recorded_measurements):
    reused = MeasurementDB(tmp_path / "sweep.jsonl")
    reused.append(recorded_measurements[:1])
    with reused.path.open("a") as f:
        f.write("not json\n")
    db = MeasurementDB(tmp_path / "own.jsonl", [reused.path])
    db.append(recorded_measurements[1:2])
    with pytest.warns(UserWarning, match=r"sweep\.jsonl:2: skipping unreadable record"):
        contents = db.load()
    assert contents.measurements == tuple(recorded_measurements[:2])
    assert [(s.file, s.line) for s in contents.skipped] == [(reused.path, 2)]


def test_a_missing_reused_database_is_an_error(tmp_path):
    db = MeasurementDB(tmp_path / "own.jsonl", [tmp_path / "gone.jsonl"])
    with pytest.raises(DatabaseError, match=r"gone\.jsonl: no such reused measurement database"):
        db.load()


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
