"""The grid sample's per-shape block (``cudal2.bench.grid_sample.shapes``) from the
committed H100 bench rows: each cell recomputed from the rows, and edited copies of them
in a table."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import pytest

from cudal2.bench import grid_sample
from cudal2.bench.report import read_results

ROOT = Path(__file__).resolve().parents[2]
PATHS = grid_sample.WHEELS[-1][2]


def _cells(text: str) -> dict[tuple[str, str], list[str]]:
    out = {}
    for line in text.splitlines():
        if line.startswith("| fp16") or line.startswith("| bf16"):
            c = [x.strip() for x in line.strip("|").split("|")]
            out[(c[0], c[1])] = c[2:]
    return out


def _tflops(r: dict, us: float) -> float:
    t = r["target"]
    return 2 * t["m"] * t["n"] * t["k"] / (us * 1e-6) / 1e12


def test_each_shape_row_is_recomputed_from_the_bench_rows():
    got = _cells(grid_sample.shapes(ROOT))
    rows = [r for p in PATHS for r in read_results(ROOT / p)]
    keep = [r for r in rows if r["mode"] == "offline" and r["target"]["m"] >= 1024]
    assert len(got) == 12 and len(keep) == 12 * len(PATHS)
    for (dtype, dims), cells in got.items():
        m, n, k = (int(x) for x in dims.split("x"))
        rs = [
            r
            for r in keep
            if r["target"]["dtype"] == dtype
            and (r["target"]["m"], r["target"]["n"], r["target"]["k"]) == (m, n, k)
        ]
        wheel = statistics.median(_tflops(r, r["cudal2"]["median_us"]) for r in rs)
        torch = statistics.median(_tflops(r, r["baselines"]["torch"]["median_us"]) for r in rs)
        best = statistics.median(_tflops(r, r["best_vendor"]["median_us"]) for r in rs)
        assert cells[1:] == [
            f"{wheel:.1f}",
            f"{torch:.1f}",
            f"{best:.1f}",
            f"{wheel / torch:.3f}",
            f"{wheel / best:.3f}",
        ], (dtype, dims)


# Edits of every bench row of fp16 8192x8192x8192: (what changes, the cells it then shows)
EDITS = [
    (
        "the wheel twice as slow",
        lambda r: r["cudal2"].update(median_us=2 * r["cudal2"]["median_us"]),
    ),
    ("dispatched by torch", lambda r: r["cudal2"]["dispatch"].update(kind="fallback")),
]


@pytest.mark.parametrize(("case", "edit"), EDITS, ids=[e[0] for e in EDITS])
def test_an_edited_row_changes_its_cells(case, edit, tmp_path):
    for p in PATHS:
        rows = read_results(ROOT / p)
        for r in rows:
            t = r["target"]
            if (t["dtype"], t["m"], t["n"], t["k"]) == ("fp16", 8192, 8192, 8192):
                edit(r)
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(tmp_path / p, "wt") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    before = _cells(grid_sample.shapes(ROOT))[("fp16", "8192x8192x8192")]
    after = _cells(grid_sample.shapes(tmp_path))[("fp16", "8192x8192x8192")]
    if case == "the wheel twice as slow":
        assert float(after[1]) == pytest.approx(float(before[1]) / 2, abs=0.1)
        assert after[2:4] == before[2:4]
    else:
        assert after[0] == "fallback" and before[0] != "fallback"
