"""Reading, validating and canonically writing dispatch tables."""

from __future__ import annotations

import copy
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from cudal2.packaging.table import (
    ENTRY_KEYS,
    TOP_LEVEL_KEYS,
    TableError,
    canonical_table,
    entry_sort_key,
    read_table,
    write_table_bytes,
)
from cudal2.packaging.wheel import write_wheel


def _kernel_index(table: dict[str, Any]) -> int:
    return next(i for i, e in enumerate(table["entries"]) if e["kind"] == "kernel")


def _write_json(tmp_path: Path, table: Any, name: str = "dispatch.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(table))
    return path


def test_read_json_round_trips(recorded_table, tmp_path):
    path = tmp_path / "dispatch.json"
    path.write_bytes(write_table_bytes(recorded_table))
    assert read_table(path) == canonical_table(recorded_table)
    assert read_table(str(path)) == canonical_table(recorded_table)


def test_read_from_wheel_matches_json(recorded_table, recorded_cubins, tmp_path):
    whl = write_wheel(recorded_table, recorded_cubins, tmp_path / "dist")
    json_path = tmp_path / "dispatch.json"
    json_path.write_bytes(write_table_bytes(recorded_table))
    assert read_table(whl) == read_table(json_path)


def test_write_table_bytes_is_canonical(recorded_table):
    data = write_table_bytes(recorded_table)
    assert data.endswith(b"\n") and not data.endswith(b"\n\n")
    parsed = json.loads(data)
    assert parsed["entries"] == sorted(parsed["entries"], key=entry_sort_key)
    # sorted keys, 2-space indent: re-serialising the parsed table gives the same bytes
    assert data == (json.dumps(parsed, sort_keys=True, indent=2) + "\n").encode()


def test_write_table_bytes_ignores_input_order(recorded_table):
    shuffled = copy.deepcopy(recorded_table)
    shuffled["entries"].reverse()
    shuffled = dict(reversed(list(shuffled.items())))
    assert write_table_bytes(shuffled) == write_table_bytes(recorded_table)
    # the caller's table is not reordered in place
    assert shuffled["entries"] == list(reversed(recorded_table["entries"]))


def test_unsupported_format(recorded_table, tmp_path):
    recorded_table["format"] = 2
    path = _write_json(tmp_path, recorded_table)
    with pytest.raises(TableError, match="format") as err:
        read_table(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("key", TOP_LEVEL_KEYS)
def test_missing_top_level_key(recorded_table, tmp_path, key):
    del recorded_table[key]
    path = _write_json(tmp_path, recorded_table)
    with pytest.raises(TableError, match=repr(key)) as err:
        read_table(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("key", ENTRY_KEYS)
def test_missing_entry_key(recorded_table, tmp_path, key):
    i = _kernel_index(recorded_table)
    del recorded_table["entries"][i][key]
    path = _write_json(tmp_path, recorded_table)
    with pytest.raises(TableError, match=repr(key)) as err:
        read_table(path)
    assert str(path) in str(err.value) and f"entries[{i}]" in str(err.value)


def _set(key: str, value: Any):
    def mutate(entry: dict[str, Any]) -> None:
        entry[key] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "key"),
    [
        (_set("kind", "cublas"), "kind"),
        (_set("cubin_sha256", None), "cubin_sha256"),
        (_set("cubin_sha256", "not-a-hash"), "cubin_sha256"),
        (_set("launch", None), "launch"),
        (_set("time_us", 0), "time_us"),
        (_set("time_us", "fast"), "time_us"),
        (_set("n", -1), "n"),
        (_set("k", True), "k"),
        (_set("speedup", "1.2x"), "speedup"),
    ],
)
def test_bad_kernel_entry_value(recorded_table, tmp_path, mutate, key):
    mutate(recorded_table["entries"][_kernel_index(recorded_table)])
    path = _write_json(tmp_path, recorded_table)
    with pytest.raises(TableError, match=repr(key)):
        read_table(path)


def test_fallback_must_not_name_a_kernel(recorded_table, tmp_path):
    entry = recorded_table["entries"][_kernel_index(recorded_table)]
    entry["kind"] = "fallback"
    path = _write_json(tmp_path, recorded_table)
    with pytest.raises(TableError, match="fallback entry must have 'kernel' null"):
        read_table(path)


def test_m_range_must_hold_measured_m(recorded_table, tmp_path):
    entry = recorded_table["entries"][_kernel_index(recorded_table)]
    entry["m_min"] = entry["m_measured"] + 1
    path = _write_json(tmp_path, recorded_table)
    with pytest.raises(TableError, match="m_min <= m_measured <= m_max"):
        read_table(path)


def test_duplicate_target_rejected(recorded_table, tmp_path):
    recorded_table["entries"].append(copy.deepcopy(recorded_table["entries"][0]))
    path = _write_json(tmp_path, recorded_table)
    with pytest.raises(TableError, match="repeats the target"):
        read_table(path)


def test_write_rejects_bad_table(recorded_table):
    del recorded_table["entries"][0]["gpu"]
    with pytest.raises(TableError, match="'gpu'"):
        write_table_bytes(recorded_table)


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
    path.write_bytes(write_table_bytes(recorded_table))
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


def _lt_index(table: dict[str, Any]) -> int:
    return next(i for i, e in enumerate(table["entries"]) if e["kind"] == "cublaslt")


def test_selected_table_with_cublaslt_entries_round_trips(selected_table, tmp_path):
    kinds = {e["kind"] for e in selected_table["entries"]}
    assert kinds == {"kernel", "cublaslt", "fallback"}
    path = tmp_path / "dispatch.json"
    path.write_bytes(write_table_bytes(selected_table))
    assert read_table(path) == canonical_table(selected_table)
    e = selected_table["entries"][_lt_index(selected_table)]
    assert e["kernel"].startswith("cublaslt_") and e["symbol"] is None
    assert len(bytes.fromhex(e["cublaslt"]["algo"])) == 64


def _drop(key: str):
    def mutate(entry: dict[str, Any]) -> None:
        del entry[key]

    return mutate


def _lt_set(key: str, value: Any):
    def mutate(entry: dict[str, Any]) -> None:
        entry["cublaslt"][key] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (_drop("cublaslt"), "needs an object 'cublaslt'"),
        (_set("kernel", None), "needs a non-null 'kernel'"),
        (_set("cubin_sha256", "0" * 64), "must have 'cubin_sha256' null"),
        (_lt_set("algo", "00ff"), "'cublaslt.algo' must be 128 lowercase hex"),
        (_lt_set("version", "13.1"), "'cublaslt.version' must be a non-negative integer"),
        (_lt_set("workspace_bytes", -1), "'cublaslt.workspace_bytes'"),
    ],
)
def test_bad_cublaslt_entry(selected_table, tmp_path, mutate, match):
    i = _lt_index(selected_table)
    mutate(selected_table["entries"][i])
    with pytest.raises(TableError, match=match) as err:
        read_table(_write_json(tmp_path, selected_table))
    assert f"entries[{i}]" in str(err.value)


def test_only_cublaslt_entries_carry_an_algorithm(selected_table, tmp_path):
    lt = selected_table["entries"][_lt_index(selected_table)]["cublaslt"]
    selected_table["entries"][_kernel_index(selected_table)]["cublaslt"] = lt
    with pytest.raises(TableError, match="only a cublaslt entry has key 'cublaslt'"):
        read_table(_write_json(tmp_path, selected_table))
