"""``cudal2-diff``: output shapes and exit codes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from cudal2.cli.diff import main
from cudal2.packaging.runtime.table import DispatchTable
from cudal2.packaging.wheel import write_wheel


def _write(tmp_path: Path, name: str, table: DispatchTable) -> str:
    path = tmp_path / name
    path.write_bytes(table.to_bytes())
    return str(path)


def _write_raw(tmp_path: Path, name: str, table: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(table))
    return str(path)


def _slowed(table: DispatchTable, factor: float, drop_last: bool = False) -> DispatchTable:
    """``table`` whose first kernel entry takes ``factor`` times as long (and without
    its last entry, with ``drop_last``)."""
    entries = list(table.entries)
    i = next(i for i, e in enumerate(entries) if e.kind == "kernel")
    entries[i] = dataclasses.replace(entries[i], time_us=entries[i].time_us * factor)
    if drop_last:
        entries.pop()
    return dataclasses.replace(table, entries=tuple(entries))


@pytest.fixture
def old_path(recorded_table, tmp_path) -> str:
    return _write(tmp_path, "old.json", recorded_table)


@pytest.fixture
def slower_path(recorded_table, tmp_path) -> str:
    return _write(tmp_path, "slower.json", _slowed(recorded_table, 1.10))


def test_identical_wheels(recorded_table, recorded_cubins, tmp_path, capsys):
    a = write_wheel(recorded_table, recorded_cubins, tmp_path / "a")
    b = write_wheel(recorded_table, recorded_cubins, tmp_path / "b")
    assert main([str(a), str(b)]) == 0
    assert capsys.readouterr().out == "no changes\n"


def test_wheel_against_json(recorded_table, recorded_cubins, tmp_path, slower_path, capsys):
    whl = write_wheel(recorded_table, recorded_cubins, tmp_path / "a")
    assert main([str(whl), slower_path]) == 0
    out = capsys.readouterr().out
    assert "slower +10.0%" in out
    assert out.splitlines()[-1].startswith("1 changed")


def test_json_output_shape(recorded_table, tmp_path, old_path, capsys):
    dropped = recorded_table.entries[-1]
    new_path = _write(tmp_path, "new.json", _slowed(recorded_table, 1.10, drop_last=True))
    assert main([old_path, new_path, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"added", "removed", "changed", "regressions"}
    assert data["added"] == []
    assert [(r["m"], r["n"], r["k"]) for r in data["removed"]] == [
        (dropped.m_measured, dropped.n, dropped.k)
    ]
    assert len(data["changed"]) == 1 and data["changed"][0]["reasons"] == ["slower"]
    assert data["regressions"] == data["changed"]


def test_noise_option(old_path, slower_path, capsys):
    assert main([old_path, slower_path, "--noise", "15", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["changed"] == [] and data["regressions"] == []
    assert main([old_path, slower_path, "--noise", "5", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["changed"]) == 1


def test_fail_on_regression(old_path, slower_path, capsys):
    assert main([old_path, slower_path, "--fail-on-regression", "5"]) == 1
    assert "slower by more than 5%" in capsys.readouterr().err
    assert main([old_path, slower_path, "--fail-on-regression", "20"]) == 0
    # the regression gate does not depend on the noise threshold
    assert main([old_path, slower_path, "--noise", "15", "--fail-on-regression", "5"]) == 1
    # without the option a regression does not fail the run
    assert main([old_path, slower_path]) == 0


def test_faster_never_fails(recorded_table, tmp_path, old_path):
    faster = _write(tmp_path, "faster.json", _slowed(recorded_table, 0.5))
    assert main([old_path, faster, "--fail-on-regression", "0"]) == 0


def test_missing_file_exits_2(old_path, tmp_path, capsys):
    missing = tmp_path / "missing.whl"
    assert main([old_path, str(missing)]) == 2
    err = capsys.readouterr().err
    assert "cudal2-diff: error:" in err and str(missing) in err and "no such file" in err


def test_not_a_wheel_exits_2(old_path, tmp_path, capsys):
    fake = tmp_path / "cudal2_kernels_x-0.1.0-py3-none-any.whl"
    fake.write_text("not a zip")
    assert main([str(fake), old_path]) == 2
    assert "not a readable wheel" in capsys.readouterr().err


def test_bad_table_exits_2(recorded_table, tmp_path, old_path, capsys):
    bad = _write_raw(tmp_path, "bad.json", dict(recorded_table.as_json(), format=99))
    assert main([old_path, bad]) == 2
    assert "unsupported 'format'" in capsys.readouterr().err
    raw = recorded_table.as_json()
    del raw["entries"][0]["time_us"]
    assert main([old_path, _write_raw(tmp_path, "bad2.json", raw)]) == 2
    assert "bad2.json: entries[0]: missing key 'time_us'" in capsys.readouterr().err


def test_negative_percent_is_a_usage_error(old_path, capsys):
    assert main([old_path, old_path, "--noise", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--noise" in err and len(err.splitlines()) == 1
