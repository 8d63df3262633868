"""Records of earlier versions read in today's spelling: a sanitizer failure stored as
``runtime`` with the memcheck text becomes status ``sanitizer``."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cudal2.database import MeasurementDB
from cudal2.migrate import upgrade
from cudal2.records import Measurement, Status
from cudal2.verdicts import SanitizerLedger

LEGACY_ERROR = "compute-sanitizer memcheck: exit 86\n========= Invalid __global__ write of size 2"


@pytest.fixture
def failed(recorded_measurements) -> Measurement:
    best = next(m for m in recorded_measurements if m.design and m.status == "ok")
    return dataclasses.replace(best, status=Status.RUNTIME, error=LEGACY_ERROR, median_us=None)


# (status, error, status after upgrade)
CASES = [
    ("runtime", LEGACY_ERROR, "sanitizer"),  # the legacy spelling
    ("sanitizer", LEGACY_ERROR, "sanitizer"),  # already today's: unchanged
    ("sanitizer", "memcheck exited 86:\n...", "sanitizer"),
    ("runtime", "CudaDriverError: an illegal memory access", "runtime"),  # a real runtime fault
    ("runtime", "measuring worker died (exit code -9)", "runtime"),
    ("incorrect", LEGACY_ERROR, "incorrect"),  # only runtime records were gate verdicts
]


@pytest.mark.parametrize("status, error, after", CASES)
def test_upgrade(failed, status, error, after):
    d = dict(failed.as_json(), status=status, error=error)
    up = upgrade(d)
    assert up["status"] == after and up["error"] == error
    assert {k: v for k, v in up.items() if k != "status"} == {
        k: v for k, v in d.items() if k != "status"
    }
    assert upgrade(up) == up  # idempotent
    if after == status:
        assert up is d


def test_the_database_reads_legacy_and_new_records_alike(tmp_path, failed):
    path = tmp_path / "db.jsonl"
    new = dataclasses.replace(failed, status=Status.SANITIZER, error="memcheck exited 86:\n...")
    path.write_text(json.dumps(failed.as_json()) + "\n" + json.dumps(new.as_json()) + "\n")
    contents = MeasurementDB(path).load()
    legacy, current = contents.measurements
    assert legacy.status == current.status == Status.SANITIZER
    assert legacy.error == LEGACY_ERROR  # the text is kept; the status says what it is
    # Both are failures of the artifact, which then never ships.
    assert [c.error for c in contents.checks] == [LEGACY_ERROR, new.error]
    for check in contents.checks:
        assert SanitizerLedger([check]).vetoed(failed.artifact_key)
    assert path.read_text().count('"status": "runtime"') == 1  # the file is not rewritten
