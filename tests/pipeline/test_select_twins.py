"""The twin path in the selection (``pipeline.select.prefer_twins``), from the fused
prefill's recorded H200 databases: a row-scaled target's kernel ships only where it beats
torch's RMSNorm and its twin's entry, priced from the RMSNorm timed beside it (baseline
``rms_norm``); records without that baseline select as they always did."""

from __future__ import annotations

from pathlib import Path

from cudal2.database import MeasurementDB
from cudal2.pipeline.select import select
from cudal2.records import NORM_BASELINE

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
# before the worker timed the RMSNorm (2026-12-05, the third run): no rms_norm baseline
BEFORE = RESULTS / "h200-llama-prefill-fused-twins.measurements.jsonl.gz"


def _read(path: Path):
    ms = MeasurementDB(path).read()
    assert ms, path
    return ms


def _by_epilogue(sels):
    return {(s.target.n, s.target.epilogue): s for s in sels}


def test_records_without_the_norm_baseline_select_as_before():
    ms = _read(BEFORE)
    assert not any(NORM_BASELINE in m.baselines_us for m in ms)
    sels, _ = select({m.target for m in ms}, ms, "offline")
    got = _by_epilogue(sels)
    # the third run's wheel: gate_up's row-scaled gated kernel shipped (it beat torch's
    # norm, GEMMs and SiLU), qkv's row scale did not
    assert got[(28672, "rmsnorm_silu")].kind == "kernel"
    assert got[(6144, "rmsnorm")].kind == "fallback"
    assert all(s.twin_us is None and s.displaced is None for s in sels)
