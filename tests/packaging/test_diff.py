"""Comparing dispatch tables: added, removed, changed, kernel<->fallback, regressions."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from cudal2.packaging.diff import (
    FASTER,
    KERNEL_SWAPPED,
    SLOWER,
    TO_CUBLASLT,
    TO_FALLBACK,
    TO_KERNEL,
    diff_tables,
    render_text,
)
from cudal2.packaging.table import TableError


def _kernel_index(table: dict[str, Any]) -> int:
    return next(i for i, e in enumerate(table["entries"]) if e["kind"] == "kernel")


def _target(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "gpu": entry["gpu"],
        "dtype": entry["dtype"],
        "layout": entry["layout"],
        "m": entry["m_measured"],
        "n": entry["n"],
        "k": entry["k"],
    }


def _row_target(row: dict[str, Any]) -> dict[str, Any]:
    return {key: row[key] for key in ("gpu", "dtype", "layout", "m", "n", "k")}


def _as_fallback(entry: dict[str, Any]) -> None:
    """Turn a kernel entry into the fallback it would be: the baseline's time."""
    for key in ("kernel", "symbol", "cubin_sha256", "launch", "design_key"):
        entry[key] = None
    entry["kind"] = "fallback"
    entry["time_us"] = entry["baseline_us"]
    entry["speedup"] = 1.0


def _scaled(table: dict[str, Any], factor: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """A copy of ``table`` whose first kernel entry takes ``factor`` times as long."""
    new = copy.deepcopy(table)
    entry = new["entries"][_kernel_index(new)]
    entry["time_us"] *= factor
    return new, entry


def test_identical_tables_have_no_changes(recorded_table):
    result = diff_tables(recorded_table, copy.deepcopy(recorded_table))
    assert result.empty
    assert result.as_json() == {"added": [], "removed": [], "changed": [], "regressions": []}
    assert render_text(result) == "no changes\n"
    assert len(result.matched) == len(recorded_table["entries"])


def test_entry_order_does_not_matter(recorded_table):
    shuffled = copy.deepcopy(recorded_table)
    shuffled["entries"].reverse()
    assert diff_tables(recorded_table, shuffled).empty


def test_removed_and_added(recorded_table):
    new = copy.deepcopy(recorded_table)
    dropped = new["entries"].pop(0)
    result = diff_tables(recorded_table, new)
    assert [_row_target(r) for r in result.removed] == [_target(dropped)]
    assert result.removed[0]["after"] is None
    assert result.removed[0]["before"]["time_us"] == dropped["time_us"]
    assert result.added == [] and result.changed == []

    reverse = diff_tables(new, recorded_table)
    assert [_row_target(r) for r in reverse.added] == [_target(dropped)]
    assert reverse.added[0]["before"] is None
    assert reverse.added[0]["after"]["kind"] == dropped["kind"]
    assert reverse.removed == []


def test_other_gpu_model_is_added_not_matched(recorded_table):
    new = copy.deepcopy(recorded_table)
    for entry in new["entries"]:
        entry["gpu"] += " (other model)"
    result = diff_tables(recorded_table, new)
    n = len(recorded_table["entries"])
    assert (len(result.added), len(result.removed), len(result.changed)) == (n, n, 0)
    assert result.regressions == [] and result.regressions_over(0) == []


def test_kernel_swapped(recorded_table):
    new = copy.deepcopy(recorded_table)
    entry = new["entries"][_kernel_index(new)]
    old_name = entry["kernel"]
    entry["kernel"] = entry["symbol"] = old_name + "_other"
    result = diff_tables(recorded_table, new)
    [row] = result.changed
    assert row["reasons"] == [KERNEL_SWAPPED]
    assert row["before"]["kernel"] == old_name
    assert row["after"]["kernel"] == old_name + "_other"
    assert row["time_pct"] == 0
    assert result.regressions == []


def test_kernel_to_fallback_and_back(recorded_table):
    new = copy.deepcopy(recorded_table)
    entry = new["entries"][_kernel_index(new)]
    original = copy.deepcopy(entry)
    _as_fallback(entry)
    result = diff_tables(recorded_table, new)
    [row] = result.changed
    assert row["reasons"][0] == TO_FALLBACK
    assert row["before"] == {
        "kind": "kernel",
        "kernel": original["kernel"],
        "time_us": original["time_us"],
        "speedup": original["speedup"],
    }
    assert row["after"]["kind"] == "fallback" and row["after"]["kernel"] is None

    back = diff_tables(new, recorded_table)
    [row] = back.changed
    assert row["reasons"][0] == TO_KERNEL
    assert row["after"]["kernel"] == original["kernel"]


def test_slower_entry_is_changed_and_a_regression(recorded_table):
    new, entry = _scaled(recorded_table, 1.10)
    result = diff_tables(recorded_table, new, noise_pct=2.0)
    [row] = result.changed
    assert _row_target(row) == _target(entry)
    assert row["reasons"] == [SLOWER]
    assert row["time_pct"] == pytest.approx(10.0)
    assert result.regressions == [row]
    assert result.regressions_over(5.0) == [row]
    assert result.regressions_over(20.0) == []


def test_faster_entry_is_changed_not_a_regression(recorded_table):
    new, _ = _scaled(recorded_table, 0.90)
    result = diff_tables(recorded_table, new)
    [row] = result.changed
    assert row["reasons"] == [FASTER]
    assert row["time_pct"] == pytest.approx(-10.0)
    assert result.regressions == [] and result.regressions_over(0.0) == []


def test_noise_threshold(recorded_table):
    new, _ = _scaled(recorded_table, 1.01)
    assert diff_tables(recorded_table, new, noise_pct=2.0).empty
    assert diff_tables(recorded_table, new, noise_pct=2.0).regressions == []
    tight = diff_tables(recorded_table, new, noise_pct=0.5)
    assert [r["reasons"] for r in tight.changed] == [[SLOWER]]

    slower, _ = _scaled(recorded_table, 1.10)
    assert diff_tables(recorded_table, slower, noise_pct=15.0).empty


def test_regression_threshold_is_separate_from_noise(recorded_table):
    new, _ = _scaled(recorded_table, 1.10)
    # below the noise, yet over the regression threshold: reported as a regression only
    quiet = diff_tables(recorded_table, new, noise_pct=15.0, regression_pct=5.0)
    assert quiet.changed == []
    assert len(quiet.regressions) == 1
    assert quiet.regressions[0]["change"] == "unchanged"
    assert "slower" in render_text(quiet)
    loud = diff_tables(recorded_table, new, noise_pct=2.0, regression_pct=20.0)
    assert len(loud.changed) == 1 and loud.regressions == []


def test_as_json_is_json(recorded_table):
    new, _ = _scaled(recorded_table, 1.10)
    new["entries"].pop()
    data = diff_tables(recorded_table, new).as_json()
    assert set(data) == {"added", "removed", "changed", "regressions"}
    assert json.loads(json.dumps(data)) == data


def test_render_text_aligned(recorded_table):
    new, entry = _scaled(recorded_table, 1.10)
    other = next(i for i, e in enumerate(new["entries"]) if e is not entry)
    removed = new["entries"].pop(other)
    text = render_text(diff_tables(recorded_table, new))
    lines = text.splitlines()
    header, rows, summary = lines[0], lines[1:-1], lines[-1]
    for column in ("change", "gpu", "dtype/layout", "M", "N", "K", "before", "after"):
        assert column in header.split()
    assert len(rows) == 2
    assert any(r.startswith("removed") and str(removed["n"]) in r for r in rows)
    assert any(r.startswith("slower +10.0%") and entry["kernel"] in r for r in rows)
    # columns line up: each column starts at the same offset in every line
    start = header.index("dtype/layout")
    assert all(r[start : start + 5] in (f"{e['dtype']}/" for e in (entry, removed)) for r in rows)
    assert summary.startswith("1 changed, 0 added, 1 removed")


def test_negative_noise_rejected(recorded_table):
    with pytest.raises(ValueError, match="noise_pct"):
        diff_tables(recorded_table, recorded_table, noise_pct=-1)


def test_malformed_table_rejected(recorded_table):
    bad = copy.deepcopy(recorded_table)
    del bad["entries"][0]["time_us"]
    with pytest.raises(TableError, match="new table: entries\\[0\\]: missing key 'time_us'"):
        diff_tables(recorded_table, bad)


def test_moves_to_and_between_cublaslt_algorithms(selected_table):
    i = next(i for i, e in enumerate(selected_table["entries"]) if e["kind"] == "cublaslt")
    lt = selected_table["entries"][i]
    old = copy.deepcopy(selected_table)
    for key in ("kernel", "design_key"):
        old["entries"][i][key] = None
    del old["entries"][i]["cublaslt"]
    old["entries"][i].update(kind="fallback", time_us=lt["baseline_us"], speedup=1.0)
    [row] = diff_tables(old, selected_table).changed
    assert row["reasons"][0] == TO_CUBLASLT and row["after"]["kernel"] == lt["kernel"]
    assert "->cublaslt" in render_text(diff_tables(old, selected_table))
    other = copy.deepcopy(selected_table)
    other["entries"][i]["kernel"] = lt["kernel"] + "_other"
    [row] = diff_tables(selected_table, other).changed
    assert row["reasons"] == [KERNEL_SWAPPED]
