"""Comparing dispatch tables: added, removed, changed, kernel<->fallback, regressions."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from cudal2.packaging.diff import (
    BASELINE_MOVED,
    FASTER,
    FOLD_ROWS,
    GATE_REMOVED,
    GATE_SLOWER,
    GATE_TO_FALLBACK,
    KERNEL_SWAPPED,
    SLOWER,
    TO_CUBLASLT,
    TO_FALLBACK,
    TO_KERNEL,
    GateSettings,
    diff_tables,
    render_markdown,
    render_text,
    sections,
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
    assert result.as_json() == {
        "added": [],
        "removed": [],
        "changed": [],
        "regressions": [],
        "noise": [],
    }
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
        "label": original.label,
        "cubin_sha256": original.cubin_sha256,
        "m_range": original.m_range,
        "time_us": original.time_us,
        "baseline_us": original.baseline_us,
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
    assert set(data) == {"added", "removed", "changed", "regressions", "noise"}
    assert json.loads(json.dumps(data)) == data


def test_render_text_aligned(recorded_table):
    new, entry = _scaled(recorded_table, 1.10)
    other = next(i for i, e in enumerate(new.entries) if e.key != entry.key)
    removed = new.entries[other]
    text = render_text(diff_tables(recorded_table, _with(new, other, None)))
    lines = text.splitlines()
    # counts first, then the GPU model, then one table per section
    assert lines[0].startswith(f"{len(recorded_table.entries)} -> {len(new.entries) - 1} targets")
    assert "1 removed" in lines[0] and "1 slower by more than 2%" in lines[0]
    assert lines[1].startswith("1 changed, 0 added")
    assert lines[2] == f"GPU: {entry.gpu}"
    titles = [x for x in lines if x and not x.startswith("  ")][3:]
    assert titles == [
        "removed (1):",
        "slower by more than 2% relative to the same-run baseline (1):",
    ]
    tables = [lines[i + 1 : i + 3] for i, x in enumerate(lines) if x in titles]
    for header, row in tables:
        for column in ("change", "dtype/layout", "M", "N", "K", "before", "after", "speedup"):
            assert column in header.split()
        # columns line up: each column starts at the same offset in header and row
        start = header.index("dtype/layout")
        assert row[start : start + 5] in (f"{e.dtype}/" for e in (entry, removed))
    assert tables[0][1].startswith("  removed") and removed.label in tables[0][1]
    assert removed.m_range in tables[0][1].split()
    assert tables[1][1].startswith("  slower +10.0%") and entry.label in tables[1][1]
    assert entry.m_range in tables[1][1].split()


def test_text_folds_long_sections(recorded_table):
    new = dataclasses.replace(recorded_table, entries=recorded_table.entries[:1])
    result = diff_tables(recorded_table, new)
    n = len(recorded_table.entries) - 1
    lines = render_text(result, max_rows=5).splitlines()
    assert f"removed ({n}):" in lines
    assert sum(x.startswith("  removed ") for x in lines) == 5
    assert lines[-1] == f"  ... and {n - 5} more (--max-rows 0, or --json)"
    assert (
        sum(x.startswith("  removed ") for x in render_text(result, max_rows=0).splitlines()) == n
    )


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


# -- what is compared: what cudal2 controls ----------------------------------------------


def _timed(entry: TableEntry, time: float, baseline: float | None) -> TableEntry:
    return dataclasses.replace(entry, time_us=entry.time_us * time, baseline_us=baseline)


def test_fallback_to_fallback_is_noise_never_a_regression(selected_table):
    """Torch's own time moving between two measuring days (a fallback entry's time is
    the baseline's) is listed as noise: not a change, not a regression, never a gate
    failure, at any threshold."""
    i = _index(selected_table, "fallback")
    fb = selected_table.entries[i]
    slower = dataclasses.replace(fb, time_us=fb.time_us * 1.10, baseline_us=fb.time_us * 1.10)
    result = diff_tables(selected_table, _with(selected_table, i, slower), regression_pct=0.0)
    assert result.empty and result.changed == [] and result.regressions == []
    [row] = result.noise
    assert row["change"] == "noise" and row["reasons"] == [BASELINE_MOVED]
    assert row["time_pct"] == pytest.approx(10.0) and row["rel_pct"] == 0.0
    assert result.gate_failures() == [] and result.regressions_over(0.0) == []
    assert "torch +10.0%" in render_text(result)
    # within the noise threshold it is not even listed
    quiet = dataclasses.replace(fb, time_us=fb.time_us * 1.01)
    assert diff_tables(selected_table, _with(selected_table, i, quiet)).noise == []


@pytest.mark.parametrize(
    ("case", "time", "baseline", "rel_pct", "reasons"),
    [
        # the GPU slower on the day: kernel and torch of one run both 10% slower
        ("both slower", 1.10, 1.10, 0.0, []),
        # the kernel as fast as before, torch 10% faster in its run: relatively slower
        ("torch faster", 1.0, 1 / 1.10, 10.0, [SLOWER]),
        # the kernel 10% slower, torch as before
        ("kernel slower", 1.10, 1.0, 10.0, [SLOWER]),
        ("kernel faster", 0.90, 1.0, -10.0, [FASTER]),
    ],
)
def test_an_entry_is_compared_relative_to_its_same_run_baseline(
    recorded_table, case, time, baseline, rel_pct, reasons
):
    i = _index(recorded_table)
    e = recorded_table.entries[i]
    new = _with(recorded_table, i, _timed(e, time, e.baseline_us * baseline))
    result = diff_tables(recorded_table, new, regression_pct=5.0)
    [row] = result.matched[i : i + 1]
    assert row["rel_pct"] == pytest.approx(rel_pct, abs=1e-9), case
    assert row["time_pct"] == pytest.approx((time - 1) * 100), case
    assert row["reasons"] == reasons, case
    assert (result.regressions == [row]) == (rel_pct > 5.0), case


def test_without_a_baseline_the_kernels_own_time_is_compared(recorded_table):
    i = _index(recorded_table)
    e = recorded_table.entries[i]
    old = _with(recorded_table, i, _timed(e, 1.0, None))
    new = _with(recorded_table, i, _timed(e, 1.10, None))
    [row] = diff_tables(old, new).changed
    assert row["rel_pct"] == pytest.approx(10.0) and row["reasons"] == [SLOWER]


# -- the gate ----------------------------------------------------------------------------


def test_removal_and_a_move_to_the_fallback_fail_the_gate(selected_table):
    gone = _index(selected_table, "cublaslt")
    lt_key = selected_table.entries[gone].key
    k = _index(selected_table, "kernel")
    kernel = selected_table.entries[k]
    new = _with(selected_table, k, _as_fallback(kernel))
    new = dataclasses.replace(new, entries=tuple(e for e in new.entries if e.key != lt_key))
    result = diff_tables(selected_table, new, regression_pct=5.0)
    # a move to the fallback is the gate's "to_fallback", never counted as "slower" too
    assert result.regressions == [] and [r["m"] for r in result.to_fallback] == [kernel.m_measured]
    failures = result.gate_failures()
    assert [f["gate"] for f in failures] == [GATE_REMOVED, GATE_TO_FALLBACK]
    assert [f["m"] for f in failures] == [lt_key.m_measured, kernel.m_measured]
    assert result.gate_failures(allow_removed=True) == []
    assert "gate: FAILED at 5%: 1 removed, 1 to fallback" in render_text(
        result, GateSettings(armed=True)
    )


def test_allow_removed_keeps_failing_on_a_slower_entry(selected_table):
    i = _index(selected_table, "kernel")
    slower = _timed(selected_table.entries[i], 1.10, selected_table.entries[i].baseline_us)
    new = _with(_with(selected_table, i, slower), 0, None)
    result = diff_tables(selected_table, new, regression_pct=5.0)
    assert [f["gate"] for f in result.gate_failures()] == [GATE_REMOVED, GATE_SLOWER]
    assert [f["gate"] for f in result.gate_failures(allow_removed=True)] == [GATE_SLOWER]
    assert diff_tables(selected_table, new, regression_pct=20.0).gate_failures(True) == []


def test_sections_are_disjoint_and_cover_every_reported_row(selected_table):
    fb = _index(selected_table, "fallback")
    k = _index(selected_table, "kernel")
    new = _with(selected_table, k, _as_fallback(selected_table.entries[k]))
    e = new.entries[fb]
    new = _with(new, fb, dataclasses.replace(e, time_us=e.time_us * 1.2, baseline_us=None))
    new = _with(new, len(new.entries) - 1, None)
    result = diff_tables(selected_table, new)
    rows = [id(r) for _, section in sections(result) for r in section]
    assert len(rows) == len(set(rows))
    expected = {id(r) for r in (*result.removed, *result.changed, *result.noise)}
    assert set(rows) == expected | {id(r) for r in result.regressions}


# -- names and markdown ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kernel", "label"),
    [
        ("hgemm_sm90stream_sm90_fp16_tn_8x32x512_w1x1_s3_sk1", "sm90stream/8x32x512_w1x1_s3_sk1"),
        ("hgemm_sm90tma_v4_sm90_fp16_tn_bm128_s4", "sm90tma_v4/bm128_s4"),
        ("my_handwritten_kernel", "my_handwritten_kernel"),  # not the generator's form
        ("hgemm_sm90_fp16_tn_x", "hgemm_sm90_fp16_tn_x"),  # no family
        ("hgemm_a_sm90_fp16_tn_", "hgemm_a_sm90_fp16_tn_"),  # no knobs
        ("hgemm_a_sm90_bf16_tn_x", "hgemm_a_sm90_bf16_tn_x"),  # another dtype's name
        ("hgemm_a_sm100_fp16_tn_x", "hgemm_a_sm100_fp16_tn_x"),  # another arch's name
    ],
)
def test_kernel_label(recorded_table, kernel, label):
    e = recorded_table.entries[_index(recorded_table)]
    e = dataclasses.replace(e, dtype="fp16", layout="tn", arch="sm_90a", kernel=kernel)
    assert e.label == label


def test_cublaslt_label_is_its_name(selected_table):
    e = selected_table.entries[_index(selected_table, "cublaslt")]
    assert e.label == e.kernel and e.kernel.startswith("cublaslt_")


def test_fallback_label_and_m_range(selected_table):
    e = selected_table.entries[_index(selected_table, "fallback")]
    assert e.label == "fallback"
    assert e.m_range == f"{e.m_min}-{e.m_max}"


def test_markdown_counts_first_then_tables_long_lists_folded(selected_table):
    k = _index(selected_table, "kernel")
    kernel = selected_table.entries[k]
    slower = _timed(kernel, 1.10, kernel.baseline_us)
    new = _with(selected_table, k, slower)
    keep = {kernel.key, *(e.key for e in new.entries[:3])}
    new = dataclasses.replace(new, entries=tuple(e for e in new.entries if e.key in keep))
    result = diff_tables(selected_table, new, regression_pct=5.0)
    n_removed = len(selected_table.entries) - len(keep)
    assert n_removed > FOLD_ROWS
    md = render_markdown(result, GateSettings(armed=True), "old.whl", "new.whl")
    lines = md.splitlines()
    assert lines[0] == "### cudal2-diff: A `old.whl` → B `new.whl`"
    assert lines[2] == f"❌ **gate: FAILED at 5%: {n_removed} removed, 1 slower**"
    counts = lines.index("| | targets |")
    assert counts < lines.index(f"#### Removed ({n_removed})")
    assert f"| removed | {n_removed} |" in lines
    assert "| slower by more than 5% (relative to the same-run baseline) | 1 |" in lines
    # the long removed list is folded, the one slower row is not
    assert f"<details><summary>{n_removed} targets</summary>" in lines
    assert md.count("<details>") == 1 and md.count("</details>") == 1
    [row] = [x for x in lines if x.startswith("| slower +10.0%")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:6] == [
        f"{kernel.dtype}/{kernel.layout}",
        kernel.m_range,
        str(kernel.n),
        str(kernel.k),
        f"`{kernel.label}`",
    ]
    # an unarmed gate says nothing of a verdict
    assert "gate" not in render_markdown(result).split("####")[0]


def test_markdown_of_no_changes(selected_table):
    md = render_markdown(diff_tables(selected_table, selected_table))
    assert md.rstrip().endswith("No changes.") and "####" not in md


HOSTILE_NAMES = [
    ("a pipe", "algo|x", "`algo\\|x`"),
    ("a newline", "algo\nx", "`algo?x`"),
    ("a carriage return", "algo\rx", "`algo?x`"),
    ("a backtick", "algo`x", "`algo'x`"),
    ("html", "<details>x", "`<details>x`"),  # literal inside a code span
    ("a long name", "a" * 300, "`" + "a" * 300 + "`"),
]


@pytest.mark.parametrize(
    ("name", "shown"), [pytest.param(*row[1:], id=row[0]) for row in HOSTILE_NAMES]
)
def test_a_hostile_name_stays_in_its_cell(selected_table, name, shown):
    """A table is input: a name that would end a row, a cell or a code span, or open
    HTML, is shown in its own cell of its own row."""
    i = _index(selected_table, "cublaslt")
    odd = dataclasses.replace(selected_table.entries[i], kernel=name)
    result = diff_tables(selected_table, _with(selected_table, i, odd))
    md = render_markdown(result)
    [row] = [x for x in md.splitlines() if x.startswith("| swapped")]
    assert shown in row
    header = next(x for x in md.splitlines() if x.startswith("| change |"))
    unescaped = re.compile(r"(?<!\\)\|")
    assert len(unescaped.findall(row)) == len(unescaped.findall(header))
    assert "<details>" not in md.replace(shown, "")
    text = render_text(result).splitlines()
    [text_row] = [x for x in text if x.startswith("  swapped")]
    assert re.sub(r"[\x00-\x1f]", "?", name) in text_row
    assert not any(c in "".join(text) for c in "\r\x00")


def test_a_hostile_gpu_name_in_markdown(selected_table):
    gpu = "GPU|<b>x</b>\nnext"
    entries = tuple(dataclasses.replace(e, gpu=gpu) for e in selected_table.entries)
    other = dataclasses.replace(selected_table, gpu_models=(gpu,), entries=entries)
    md = render_markdown(diff_tables(selected_table, other))
    assert "GPU\\|&lt;b&gt;x&lt;/b&gt;?next" in md and "<b>" not in md
