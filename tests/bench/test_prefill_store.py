"""Issue 22's 2026-12-04 blocks (``cudal2.bench.prefill_store``) from the committed H200
records: the stores' gains over their bulk-store twins, joined again here from the raw
records by design key, and the work-a-cycle ratios of the sustained runs, taken again from
the raw runs; each block follows a changed record."""

from __future__ import annotations

import gzip
import json
import math
import shutil
import statistics
from pathlib import Path

from cudal2.bench import prefill_store as ps

ROOT = Path(__file__).resolve().parents[2]


def _records(path: str) -> list[dict]:
    with gzip.open(ROOT / path, "rt") as f:
        return [json.loads(line) for line in f]


def _gain_row(block: str, label: str, dtype: str) -> tuple[float, int]:
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 6 and cells[0] == label and cells[2] == dtype:
            return float(cells[3]), int(cells[4])
    raise AssertionError(f"no row {label!r} {dtype}")


def test_the_overlap_gain_is_its_twins_joined_from_the_records():
    """Each overlap kernel (store 2) against the record of the same design with store 1
    on the same target: the block's geomean and count."""
    block = ps.tma_v5_store(ROOT)
    for dtype, path in zip(("fp16", "bf16"), ps.STORE_SWEEPS["overlap"], strict=True):
        speed = {}
        for r in _records(path):
            if r["status"] == "ok" and r["design"]:
                t, k = r["target"], r["design"]["knobs"]
                key = (t["m"], t["n"], t["k"], tuple(sorted(k.items())))
                speed[key] = statistics.median(r["baseline_samples_us"]["torch"]) / r["median_us"]
        logs = []
        for (m, n, kk, knobs), v in speed.items():
            d = dict(knobs)
            if d.get("store") == 2:
                twin = (m, n, kk, tuple(sorted({**d, "store": 1}.items())))
                logs.append(math.log(v / speed[twin]))
        gain, pairs = _gain_row(block, "overlap (`store` 2)", dtype)
        assert pairs == len(logs) == 102
        assert gain == round(math.exp(sum(logs) / len(logs)), 3)


def test_the_store_block_follows_its_records(tmp_path):
    """A twin made 10% slower in one sweep moves that sweep's overlap gain."""
    for paths in ps.STORE_SWEEPS.values():
        for p in paths:
            (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / p, tmp_path / p)
    rows = _records(ps.STORE_SWEEPS["overlap"][0])
    for r in rows:
        if r["status"] == "ok" and r["design"] and r["design"]["knobs"].get("store") == 1:
            r["median_us"] *= 1.1  # the record's samples with it (records are validated)
            r["samples_us"] = [x * 1.1 for x in r["samples_us"]]
    with gzip.open(tmp_path / ps.STORE_SWEEPS["overlap"][0], "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    before, _ = _gain_row(ps.tma_v5_store(ROOT), "overlap (`store` 2)", "fp16")
    after, _ = _gain_row(ps.tma_v5_store(tmp_path), "overlap (`store` 2)", "fp16")
    assert abs(after - before * 1.1) < 0.002, (before, after)


def test_the_work_a_cycle_is_tflops_over_the_clock_against_torch():
    d = json.loads((ROOT / ps.POWER_OWN).read_text())
    block = ps.power_own(ROOT)
    s = next(x for x in d["shapes"] if (x["target"]["m"], x["target"]["n"]) == (8192, 8192))

    def per_ghz(name: str) -> float:
        runs = s["runs"][name]
        return statistics.median(r["tflops"] for r in runs) / (
            statistics.median(r["sm_mhz"] for r in runs) / 1000
        )

    row = next(line for line in block.splitlines() if line.startswith("| 8192×8192×8192 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[-2]) == round(per_ghz("own") / per_ghz("torch"), 3)
    assert float(cells[-1]) == round(per_ghz("cublaslt") / per_ghz("torch"), 3)
    assert cells[1] == "`nvjet_sm90_hsh_320x128_64x3_1x2_h_bz_coopB_TNT`"


def test_the_ncu_block_quotes_each_kernels_figures_from_its_csv():
    import csv

    block = ps.ncu_prefill(ROOT)
    with open(ROOT / ps.NCU_PREFILL[0], newline="") as f:
        rows = list(csv.DictReader(f))
    metric = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
    own, lt = (
        next(r["Metric Value"] for r in rows if r["Metric Name"] == metric and pick(r))
        for pick in (
            lambda r: r["Kernel Name"].startswith("hgemm_"),
            lambda r: not r["Kernel Name"].startswith("hgemm_"),
        )
    )
    assert f"| tensor pipe active % | {own} | {lt} |" in block
    assert float(lt) > float(own)  # what the worklog says of these runs


def test_the_stall_table_reads_both_kernels_from_its_csv():
    own, lt, stalls = ps._stalls(ROOT / ps.NCU_STALLS)
    assert own.startswith("hgemm_") and not lt.startswith("hgemm_")
    block = ps.ncu_prefill(ROOT)
    mio = stalls["mio_throttle"]
    assert f"| mio_throttle | {mio[own]:.2f} | {mio[lt]:.2f} |" in block
    assert mio[own] > mio[lt]  # what the worklog says of this run


# (the details page's unit, its value, the table's microseconds): ncu prints a duration in
# whichever unit reads best (8192³ in ms)
DURATIONS = [("us", "179.90", "179.90"), ("ms", "1.43", "1,430.00"), ("ns", "950", "0.95")]


def test_a_duration_is_quoted_in_microseconds_whatever_ncu_printed():
    for unit, value, want in DURATIONS:
        row = {"Metric Name": "Duration", "Metric Unit": unit, "Metric Value": value}
        assert ps._us(row) == want
    other = {"Metric Name": "Elapsed Cycles", "Metric Unit": "cycle", "Metric Value": "287,434"}
    assert ps._us(other) == "287,434"
