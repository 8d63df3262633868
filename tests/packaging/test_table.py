"""Reading dispatch tables from files: a dispatch.json, or the one inside a wheel.

The schema's own rules are tested with the schema (tests/packaging/runtime/test_table.py);
here, that a file's table is the table written, and that every way a file can be
unreadable is reported with the file's name.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from cudal2.packaging.runtime.table import TableError
from cudal2.packaging.table import read_table
from cudal2.packaging.wheel import write_wheel


def _write_json(tmp_path: Path, table: Any, name: str = "dispatch.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(table))
    return path


def test_read_json_round_trips(recorded_table, tmp_path):
    path = tmp_path / "dispatch.json"
    path.write_bytes(recorded_table.to_bytes())
    assert read_table(path) == recorded_table
    assert read_table(str(path)) == recorded_table


def test_read_from_wheel_matches_json(recorded_table, recorded_cubins, tmp_path):
    whl = write_wheel(recorded_table, recorded_cubins, tmp_path / "dist")
    json_path = tmp_path / "dispatch.json"
    json_path.write_bytes(recorded_table.to_bytes())
    assert read_table(whl) == read_table(json_path) == recorded_table


def test_selected_table_with_cublaslt_entries_round_trips(selected_table, tmp_path):
    assert {e.kind for e in selected_table.entries} == {"kernel", "cublaslt", "fallback"}
    path = tmp_path / "dispatch.json"
    path.write_bytes(selected_table.to_bytes())
    assert read_table(path) == selected_table
    assert read_table(path).to_bytes() == selected_table.to_bytes()


def test_a_broken_table_is_reported_with_its_file(recorded_table, tmp_path):
    raw = recorded_table.as_json()
    raw["entries"][0]["n"] = -1
    path = _write_json(tmp_path, raw)
    with pytest.raises(TableError, match="'n' must be a positive integer") as err:
        read_table(path)
    assert str(err.value).startswith(f"{path}: entries[0]: ")


def test_unsupported_format(recorded_table, tmp_path):
    path = _write_json(tmp_path, dict(recorded_table.as_json(), format=2))
    with pytest.raises(TableError, match="format") as err:
        read_table(path)
    assert str(path) in str(err.value)


def test_not_a_table(tmp_path):
    path = _write_json(tmp_path, [1, 2, 3])
    with pytest.raises(TableError, match="JSON object"):
        read_table(path)


def test_not_json(tmp_path):
    path = tmp_path / "dispatch.json"
    path.write_text("{ this is not json")
    with pytest.raises(TableError, match="not valid JSON") as err:
        read_table(path)
    assert str(path) in str(err.value)


def test_missing_file(tmp_path):
    path = tmp_path / "nowhere" / "dispatch.json"
    with pytest.raises(TableError, match="cannot read") as err:
        read_table(path)
    assert str(path) in str(err.value)


def test_missing_wheel(tmp_path):
    with pytest.raises(TableError, match="cannot read"):
        read_table(tmp_path / "cudal2_kernels_x-0.1.0-py3-none-any.whl")


def test_file_that_is_not_a_wheel(recorded_table, tmp_path):
    path = tmp_path / "cudal2_kernels_x-0.1.0-py3-none-any.whl"
    path.write_bytes(recorded_table.to_bytes())
    with pytest.raises(TableError, match="not a readable wheel") as err:
        read_table(path)
    assert str(path) in str(err.value)


def test_wheel_without_dispatch_json(recorded_table, recorded_cubins, tmp_path):
    whl = write_wheel(recorded_table, recorded_cubins, tmp_path / "dist")
    stripped = tmp_path / whl.name
    with zipfile.ZipFile(whl) as src, zipfile.ZipFile(stripped, "w") as dst:
        for info in src.infolist():
            if not info.filename.endswith("/dispatch.json"):
                dst.writestr(info, src.read(info))
    with pytest.raises(TableError, match="dispatch.json"):
        read_table(stripped)


def test_corrupted_wheel_member(recorded_table, recorded_cubins, tmp_path):
    whl = write_wheel(recorded_table, recorded_cubins, tmp_path / "dist")
    tampered = tmp_path / whl.name
    with zipfile.ZipFile(whl) as src, zipfile.ZipFile(tampered, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("/dispatch.json"):
                tampered_data = data.replace(b'"format": 1', b'"format": 1 ')
                assert tampered_data != data
                data = tampered_data
            dst.writestr(info, data)
    # RECORD no longer matches the member: reported as an unreadable wheel
    with pytest.raises(TableError, match="not a readable wheel"):
        read_table(tampered)


def test_directory_is_not_a_table(tmp_path):
    with pytest.raises(TableError, match="not a regular file"):
        read_table(tmp_path)
