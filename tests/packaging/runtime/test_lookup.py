"""Lookup rules of the runtime's dispatch table (docs/contracts.md, format 1).

Every case is derived from the recorded table's own entries (their models, shapes and
measured M values); the tests invent no measurements.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import pytest

from cudal2.packaging.runtime.table import DispatchTable, TableEntry


def _axes(entries: tuple[TableEntry, ...]) -> dict[tuple, list[TableEntry]]:
    """Entries grouped by (gpu, arch, dtype, layout, n, k), each group sorted by M."""
    groups: dict[tuple, list[TableEntry]] = defaultdict(list)
    for e in entries:
        groups[(e.gpu, e.arch, e.dtype, e.layout, e.n, e.k)].append(e)
    return {key: sorted(g, key=lambda e: e.m_measured) for key, g in groups.items()}


def _query(table: DispatchTable, entry: TableEntry, m: int, **change: Any) -> Any:
    q = {key: getattr(entry, key) for key in ("gpu", "arch", "dtype", "layout", "n", "k")}
    q.update(change)
    return table.lookup(q["gpu"], q["arch"], q["dtype"], q["layout"], m, q["n"], q["k"])


def test_models_and_archs_are_the_entries(recorded_table):
    entries = recorded_table.entries
    assert recorded_table.gpu_models == tuple(sorted({e.gpu for e in entries}))
    assert recorded_table.archs == tuple(sorted({e.arch for e in entries}))


def test_each_entry_serves_its_whole_range(recorded_table):
    for group in _axes(recorded_table.entries).values():
        previous = 0
        for e in group:
            m = e.m_measured
            # Both ends of [previous + 1, m], and the entry's own m_min/m_max say the same.
            for probe in {previous + 1, m - 1 if m - 1 > previous else m, m, e.m_min, e.m_max}:
                assert _query(recorded_table, e, probe) is e, (str(e.key), probe)
            previous = m


def test_between_points_takes_the_nearest_point_at_or_above(recorded_table):
    table = recorded_table
    checked = 0
    for group in _axes(table.entries).values():
        for below, above in zip(group, group[1:], strict=False):
            lo, hi = below.m_measured, above.m_measured
            if hi - lo >= 2:
                assert _query(table, above, (lo + hi) // 2 + 1) is above
                checked += 1
            assert _query(table, above, lo) is below
            assert _query(table, above, lo + 1) is above
    first = next(iter(_axes(table.entries).values()))[0]
    assert _query(table, first, 1) is first
    assert checked or all(len(g) == 1 for g in _axes(table.entries).values())


def test_outside_the_measured_range_is_not_covered(recorded_table):
    for group in _axes(recorded_table.entries).values():
        top = group[-1]
        assert _query(recorded_table, top, top.m_measured) is top
        assert _query(recorded_table, top, top.m_measured + 1) is None
        assert _query(recorded_table, top, 0) is None


def test_file_order_does_not_matter(recorded_table):
    raw = recorded_table.as_json()
    raw["entries"].reverse()
    backward = DispatchTable.from_json(raw)
    assert backward.entries == recorded_table.entries
    for e in recorded_table.entries:
        for m in (1, e.m_min, e.m_measured, e.m_measured + 1):
            assert _query(recorded_table, e, m) == _query(backward, e, m)


def test_shape_dtype_layout_mismatch_is_not_covered(recorded_table):
    table = recorded_table
    entries = table.entries
    present = set(_axes(entries))
    absent_n = max(e.n for e in entries) + 8  # larger than any N in the table
    absent_k = max(e.k for e in entries) + 8
    for e in entries:
        m = e.m_measured
        assert _query(table, e, m, n=absent_n) is None
        assert _query(table, e, m, k=absent_k) is None
        if (e.gpu, e.arch, e.dtype, e.layout, e.k, e.n) not in present:
            assert _query(table, e, m, n=e.k, k=e.n) is None
        for dtype in ("fp16", "bf16", "fp32"):
            if (e.gpu, e.arch, dtype, e.layout, e.n, e.k) not in present:
                assert _query(table, e, m, dtype=dtype) is None
        for layout in ("tn", "nn", "nt"):
            if (e.gpu, e.arch, e.dtype, layout, e.n, e.k) not in present:
                assert _query(table, e, m, layout=layout) is None


def test_exact_gpu_model_is_not_a_stand_in(recorded_table):
    for e in recorded_table.entries:
        assert recorded_table.resolve_gpu(e.gpu, e.arch) == (e.gpu, False)


def test_unknown_model_of_a_known_arch_uses_the_first_model_of_that_arch(recorded_table):
    entries = recorded_table.entries
    e = entries[0]
    first = min(x.gpu for x in entries if x.arch == e.arch)
    # Derived names that sort before and after every model of the table.
    before, after = " " + first, max(x.gpu for x in entries) + " (other)"
    table = recorded_table
    assert table.resolve_gpu(after, e.arch) == (first, True)
    stand_in = _query(table, e, e.m_measured, gpu=after)
    assert stand_in is _query(table, e, e.m_measured, gpu=first)

    # A second model that sorts first becomes the stand-in; the exact model still wins.
    clones = [dataclasses.replace(x, gpu=before) for x in entries if x.gpu == first]
    table = dataclasses.replace(
        table,
        gpu_models=tuple(sorted({before, *table.gpu_models})),
        entries=(*clones, *entries),
    )
    assert table.resolve_gpu(after, e.arch) == (before, True)
    assert _query(table, e, e.m_measured, gpu=after).gpu == before
    if e.gpu == first:
        assert _query(table, e, e.m_measured).gpu == first


def test_unknown_arch_is_not_covered(recorded_table):
    archs = {x.arch for x in recorded_table.entries}
    other = next(a for a in ("sm_80", "sm_89", "sm_100a", "sm_120a") if a not in archs)
    for e in recorded_table.entries:
        assert recorded_table.resolve_gpu(e.gpu, other) == (None, False)
        assert _query(recorded_table, e, e.m_measured, arch=other) is None


def test_entries_for_lists_one_model(recorded_table):
    table = recorded_table
    for gpu in table.gpu_models:
        for arch in table.archs:
            want = [e for e in table.entries if (e.gpu, e.arch) == (gpu, arch)]
            assert table.entries_for(gpu, arch) == want


def test_m_spans_are_the_lookup_rule(recorded_table):
    """``m_spans`` (what ``Api.m_ranges`` reads) answers as ``lookup_exact`` at every M."""
    table = recorded_table
    for key, group in _axes(table.entries).items():
        spans = table.m_spans(*key)
        assert [e for _, _, e in spans] == group
        top = group[-1].m_measured
        for m in range(1, top + 3):
            got = next((e for lo, hi, e in spans if lo <= m <= hi), None)
            assert got is table.lookup_exact(*key[:4], m, *key[4:]), (key, m)


@pytest.mark.parametrize("which", ["recorded_table", "selected_table", "eager_table"])
def test_api_m_ranges_are_the_entries_that_launch(request, which):
    """``Api.m_ranges`` (no device: any GPU model of the table) against a brute-force
    lookup at every M: covered where some model's entry is a kernel / cuBLASLt entry, or
    a fallback with an eager alternative (plain GEMMs). The selected and eager tables
    have fallback entries (with and without an eager alternative) between kernels."""
    from cudal2.packaging.runtime.api import Api

    recorded_table = request.getfixturevalue(which)
    api = Api("not_a_package")
    api._table = recorded_table
    kinds = {e.kind for e in recorded_table.entries}
    assert "kernel" in kinds  # the table has launching entries to find
    assert which == "recorded_table" or "fallback" in kinds
    shapes = {(e.dtype, e.n, e.k, e.epilogue) for e in recorded_table.entries if e.layout == "tn"}
    models = recorded_table.models()
    checked = 0
    for dtype, n, k, epilogue in sorted(shapes):
        top = max(e.m_measured for e in recorded_table.entries if (e.n, e.k) == (n, k))
        for m in range(1, top + 3):
            want = False
            for gpu, arch in models:
                e = recorded_table.lookup_exact(gpu, arch, dtype, "tn", m, n, k, epilogue)
                want |= e is not None and (
                    e.kind in ("kernel", "cublaslt") or (epilogue == "none" and e.eager is not None)
                )
            assert api.covers_at(m, n, k, dtype, epilogue) is want, (dtype, n, k, epilogue, m)
            checked += 1
    assert checked
    assert api.m_ranges(3, 5, "fp16") == ()  # a shape the table has not


def test_api_m_ranges_on_a_device_is_its_gpu_model(selected_table):
    """With a device: the GPU model its calls resolve to (the device's checked info,
    set here as the first call would), only that model's entries; a device that cannot
    use the table (its reason set): nothing."""
    from cudal2.packaging.runtime.api import Api, _Device

    (gpu, arch), *_ = selected_table.models()
    # a second GPU model of the arch whose entries reach 5000 M further: "any model"
    # would answer with its ranges too
    other = [
        dataclasses.replace(
            e, gpu="Other GPU", m_max=e.m_max + 5000, m_measured=e.m_measured + 5000
        )
        for e in selected_table.entries
    ]
    table = dataclasses.replace(
        selected_table,
        entries=(*selected_table.entries, *other),
        gpu_models=tuple(sorted({*selected_table.gpu_models, "Other GPU"})),
    )
    api = Api("not_a_package")
    api._table = table
    api._devices[0] = _Device(gpu, arch, None)
    api._devices[1] = _Device(None, arch, "driver")
    checked = 0
    for e in selected_table.entries:
        if e.layout != "tn":
            continue
        want = tuple(
            (lo, hi)
            for lo, hi, x in selected_table.m_spans(gpu, arch, e.dtype, "tn", e.n, e.k, e.epilogue)
            if x.kind in ("kernel", "cublaslt") or (x.epilogue == "none" and x.eager is not None)
        )
        got = api.m_ranges(e.n, e.k, e.dtype, e.epilogue, device=0)
        # merged: the same M set
        assert {m for lo, hi in got for m in range(lo, hi + 1)} == {
            m for lo, hi in want for m in range(lo, hi + 1)
        }
        assert api.m_ranges(e.n, e.k, e.dtype, e.epilogue, device=1) == ()
        checked += 1
    assert checked
    e = next(x for x in selected_table.entries if x.kind == "kernel" and x.layout == "tn")
    anywhere = api.m_ranges(e.n, e.k, e.dtype, e.epilogue)
    assert anywhere != api.m_ranges(e.n, e.k, e.dtype, e.epilogue, device=0)
