"""The run-offs' docs blocks (``cudal2.bench.runoffs``) from the committed H100 results:
the run-off summary (bench/results/h100-runoff-llm-public.json) and the wheels benched
round-robin before and after it; expectations computed from the files, and edited
copies of them in a table."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest

from cudal2.bench import grid_sample, runoffs
from cudal2.bench.report import Filter, read_results, summarize

ROOT = Path(__file__).resolve().parents[2]


def _summary() -> dict:
    (s,) = json.loads((ROOT / runoffs.RUNOFF).read_text())
    return s


def _rows(text: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ")
        and not line.startswith(("| target", "| wheel"))
        and "---" not in line
    ]


def test_the_run_off_block_lists_each_prefill_run_off_in_order():
    s = _summary()
    text = runoffs.runoffs(ROOT)
    timed = [r for r in s["runoffs"] if r["kernel_over_vendor"] is not None]
    ahead = sum(r["kernel_over_vendor"] >= 1 for r in timed)
    assert f"{len(s['runoffs'])} run-offs, {len(timed)} with the algorithm timed" in text
    assert f"ahead of the algorithm beside it in {ahead}." in text
    got = {target: cells.split(", ") for target, cells in _rows(text)}
    want: dict[str, list[str]] = {}
    for r in timed:
        if int(r["target"].split()[1].split("x")[0]) >= 1024:
            want.setdefault(r["target"], []).append(f"{r['kernel_over_vendor']:.3f}")
    assert got == want and len(got) == 28


# Edits of a run-off the kernel lost: (what changes, what the block then says)
EDITS = [
    ("the algorithm not timed", {"kernel_over_vendor": None}, "79 run-offs, 78 with the algorithm"),
    ("the kernel ahead", {"kernel_over_vendor": 1.5}, "beside it in 32."),
]


@pytest.mark.parametrize(("case", "edit", "says"), EDITS, ids=[e[0] for e in EDITS])
def test_an_edited_summary_changes_the_block(case, edit, says, tmp_path):
    s = _summary()
    lost = next(r for r in s["runoffs"] if r["kernel_over_vendor"] < 1)
    lost.update(edit)
    path = tmp_path / runoffs.RUNOFF
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps([s]))
    assert says in runoffs.runoffs(tmp_path)


# The round-robin blocks: (name, the block, its wheels)
AB_BLOCKS = [
    ("run-offs", runoffs.wheels_ab, runoffs.WHEELS),
    ("vendor view", runoffs.vendor_view, runoffs.VENDOR_VIEW),
    (
        "settled 300 ms",
        lambda root: runoffs.settled(root, runoffs.SETTLED_300),
        runoffs.SETTLED_300,
    ),
    ("settled 2 s", runoffs.settled, runoffs.SETTLED),
    ("grid sample v5", grid_sample.ab, grid_sample.WHEELS),
]


@pytest.mark.parametrize(("case", "block", "wheels"), AB_BLOCKS, ids=[b[0] for b in AB_BLOCKS])
def test_the_wheels_block_is_each_wheels_median_and_range_over_its_rounds(case, block, wheels):
    rows = _rows(block(ROOT))
    assert [r[0].split(":")[0] for r in rows] == [w[0] for w in wheels]
    for (label, _, paths), row in zip(wheels, rows, strict=True):
        cells = iter(row[1:])
        for mode in ("offline", "server"):
            for dtype in ("fp16", "bf16"):
                got = [
                    summarize(read_results(ROOT / p), Filter(mode=mode, dtype=dtype, m_min=1024))[
                        "geomean_speedup"
                    ]["best_vendor"]
                    for p in paths
                ]
                want = f"{statistics.median(got):.3f} ({min(got):.3f}–{max(got):.3f})"
                assert next(cells) == want, (label, mode, dtype)


def test_a_wheel_run_not_committed_cannot_make_the_block(tmp_path):
    (label, what, paths), *_ = runoffs.WHEELS
    for p in paths[:1]:
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / p, tmp_path / p)
    with pytest.raises(FileNotFoundError):
        runoffs.wheels_ab(tmp_path, ((label, what, paths),))


def test_the_shipped_block_is_over_issue_22s_16_shapes_and_all_17():
    """Row one: llm-public's 16 shapes at M >= 1024 (not the prefill files' 8192^3); row
    two: all 17. Each cell the median and range over the shipped wheel's benches."""
    from cudal2.shapes import load_shapes

    public = {s for s in load_shapes(ROOT / runoffs.PUBLIC_SHAPES) if s[0] >= 1024}
    assert len(public) == 16
    rows = _rows(runoffs.shipped(ROOT))[1:]  # the header row first
    assert [r[0] for r in rows] == ["llm-public's 16 (issue 22)", "the 17 prefill shapes"]
    files = [read_results(ROOT / p) for p in runoffs.SHIPPED_RUNS]
    assert len(files) == 10
    for row, only in zip(rows, (public, None), strict=True):
        cells = iter(row[1:])
        for mode in ("offline", "server"):
            for dtype in ("fp16", "bf16"):
                got = []
                for f in files:
                    kept = [
                        r
                        for r in f
                        if Filter(mode=mode, dtype=dtype, m_min=1024).keep(r)
                        and (
                            only is None
                            or (r["target"]["m"], r["target"]["n"], r["target"]["k"]) in only
                        )
                    ]
                    assert len(kept) == (16 if only else 17)
                    xs = [r["best_vendor"]["median_us"] / r["cudal2"]["median_us"] for r in kept]
                    got.append(statistics.geometric_mean(xs))
                want = f"{statistics.median(got):.3f} ({min(got):.3f}–{max(got):.3f})"
                assert next(cells) == want, (row[0], mode, dtype)
