"""Comparing dispatch tables: added, removed, changed, kernel<->fallback, regressions."""

from __future__ import annotations

import dataclasses
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
from cudal2.packaging.runtime.table import KERNEL_ONLY_KEYS, DispatchTable, TableEntry


def _index(table: DispatchTable, kind: str = "kernel") -> int:
    return next(i for i, e in enumerate(table.entries) if e.kind == kind)


def _with(table: DispatchTable, i: int, entry: TableEntry | None) -> DispatchTable:
    """``table`` with entry ``i`` replaced (or removed, for None)."""
    entries = list(table.entries)
    if entry is None:
        del entries[i]
    else:
        entries[i] = entry
    return dataclasses.replace(table, entries=tuple(entries))


def _target(entry: TableEntry) -> dict[str, Any]:
    return {
        "gpu": entry.gpu,
        "dtype": entry.dtype,
        "layout": entry.layout,
        "m": entry.m_measured,
        "n": entry.n,
        "k": entry.k,
    }


def _row_target(row: dict[str, Any]) -> dict[str, Any]:
    return {key: row[key] for key in ("gpu", "dtype", "layout", "m", "n", "k")}


def _as_fallback(entry: TableEntry) -> TableEntry:
    """The fallback a kernel or cuBLASLt entry would be: the baseline's time."""
    return dataclasses.replace(
        entry,
        **dict.fromkeys(KERNEL_ONLY_KEYS),
        kind="fallback",
        cublaslt=None,
        time_us=entry.baseline_us,
        speedup=1.0,
    )


def _scaled(table: DispatchTable, factor: float) -> tuple[DispatchTable, TableEntry]:
    """``table`` whose first kernel entry takes ``factor`` times as long."""
    i = _index(table)
    entry = dataclasses.replace(table.entries[i], time_us=table.entries[i].time_us * factor)
    return _with(table, i, entry), entry


def test_identical_tables_have_no_changes(recorded_table):
    result = diff_tables(recorded_table, DispatchTable.from_bytes(recorded_table.to_bytes()))
    assert result.empty
    assert result.as_json() == {"added": [], "removed": [], "changed": [], "regressions": []}
    assert render_text(result) == "no changes\n"
    assert len(result.matched) == len(recorded_table.entries)


def test_entry_order_does_not_matter(recorded_table):
    raw = recorded_table.as_json()
    raw["entries"].reverse()
    assert diff_tables(recorded_table, DispatchTable.from_json(raw)).empty


def test_removed_and_added(recorded_table):
    dropped = recorded_table.entries[0]
    new = _with(recorded_table, 0, None)
    result = diff_tables(recorded_table, new)
    assert [_row_target(r) for r in result.removed] == [_target(dropped)]
    assert result.removed[0]["after"] is None
    assert result.removed[0]["before"]["time_us"] == dropped.time_us
    assert result.added == [] and result.changed == []

    reverse = diff_tables(new, recorded_table)
    assert [_row_target(r) for r in reverse.added] == [_target(dropped)]
    assert reverse.added[0]["before"] is None
    assert reverse.added[0]["after"]["kind"] == dropped.kind
    assert reverse.removed == []


def test_other_gpu_model_is_added_not_matched(recorded_table):
    other = tuple(
        dataclasses.replace(e, gpu=e.gpu + " (other model)") for e in recorded_table.entries
    )
    models = tuple(sorted({e.gpu for e in other}))
    new = dataclasses.replace(recorded_table, gpu_models=models, entries=other)
    result = diff_tables(recorded_table, new)
    n = len(recorded_table.entries)
    assert (len(result.added), len(result.removed), len(result.changed)) == (n, n, 0)
    assert result.regressions == [] and result.regressions_over(0) == []


def test_kernel_swapped(recorded_table):
    i = _index(recorded_table)
    old_name = recorded_table.entries[i].kernel
    swapped = dataclasses.replace(
        recorded_table.entries[i], kernel=old_name + "_other", symbol=old_name + "_other"
    )
    result = diff_tables(recorded_table, _with(recorded_table, i, swapped))
    [row] = result.changed
    assert row["reasons"] == [KERNEL_SWAPPED]
    assert row["before"]["kernel"] == old_name
    assert row["after"]["kernel"] == old_name + "_other"
    assert row["time_pct"] == 0
    assert result.regressions == []


def test_kernel_to_fallback_and_back(recorded_table):
    i = _index(recorded_table)
    original = recorded_table.entries[i]
    new = _with(recorded_table, i, _as_fallback(original))
    result = diff_tables(recorded_table, new)
    [row] = result.changed
    assert row["reasons"][0] == TO_FALLBACK
    assert row["before"] == {
        "kind": "kernel",
        "kernel": original.kernel,
        "cubin_sha256": original.cubin_sha256,
        "time_us": original.time_us,
        "speedup": original.speedup,
    }
    assert row["after"]["kind"] == "fallback" and row["after"]["kernel"] is None

    back = diff_tables(new, recorded_table)
    [row] = back.changed
    assert row["reasons"][0] == TO_KERNEL
    assert row["after"]["kernel"] == original.kernel


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
    new = _with(new, len(new.entries) - 1, None)
    data = diff_tables(recorded_table, new).as_json()
    assert set(data) == {"added", "removed", "changed", "regressions"}
    assert json.loads(json.dumps(data)) == data


def test_render_text_aligned(recorded_table):
    new, entry = _scaled(recorded_table, 1.10)
    other = next(i for i, e in enumerate(new.entries) if e.key != entry.key)
    removed = new.entries[other]
    text = render_text(diff_tables(recorded_table, _with(new, other, None)))
    lines = text.splitlines()
    header, rows, summary = lines[0], lines[1:-1], lines[-1]
    for column in ("change", "gpu", "dtype/layout", "M", "N", "K", "before", "after"):
        assert column in header.split()
    assert len(rows) == 2
    assert any(r.startswith("removed") and str(removed.n) in r for r in rows)
    assert any(r.startswith("slower +10.0%") and entry.kernel in r for r in rows)
    # columns line up: each column starts at the same offset in every line
    start = header.index("dtype/layout")
    assert all(r[start : start + 5] in (f"{e.dtype}/" for e in (entry, removed)) for r in rows)
    assert summary.startswith("1 changed, 0 added, 1 removed")


def test_negative_noise_rejected(recorded_table):
    with pytest.raises(ValueError, match="noise_pct"):
        diff_tables(recorded_table, recorded_table, noise_pct=-1)


def test_targets_are_matched_by_entry_identity(recorded_table):
    """Matching is ``TableEntry.key``: the arch is part of it, so a model's entries
    under another arch are other targets, never compared with these."""
    moved = tuple(dataclasses.replace(e, arch="sm_90") for e in recorded_table.entries)
    new = dataclasses.replace(recorded_table, archs=("sm_90",), entries=moved)
    result = diff_tables(recorded_table, new)
    n = len(recorded_table.entries)
    assert (len(result.added), len(result.removed), len(result.matched)) == (n, n, 0)
    assert {r["arch"] for r in result.added} == {"sm_90"}


def test_moves_to_and_between_cublaslt_algorithms(selected_table):
    i = _index(selected_table, "cublaslt")
    lt = selected_table.entries[i]
    old = _with(selected_table, i, _as_fallback(lt))
    [row] = diff_tables(old, selected_table).changed
    assert row["reasons"][0] == TO_CUBLASLT and row["after"]["kernel"] == lt.kernel
    assert "->cublaslt" in render_text(diff_tables(old, selected_table))
    other = _with(selected_table, i, dataclasses.replace(lt, kernel=lt.kernel + "_other"))
    [row] = diff_tables(selected_table, other).changed
    assert row["reasons"] == [KERNEL_SWAPPED]
