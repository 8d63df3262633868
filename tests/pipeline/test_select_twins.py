"""The twin path in the selection (``pipeline.select.prefer_twins``), from the fused
prefill's recorded H200 and H100 databases: a row-scaled target's kernel ships only where it beats
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
# the fourth run (H100, ci/gpu_prefill_fused.sh): the RMSNorm timed beside each row scale
SELECT = RESULTS / "h100-llama-prefill-fused-select.measurements.jsonl.gz"


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


def test_a_row_scaled_kernel_slower_than_its_twin_path_is_displaced():
    """gate_up's fastest row-scaled gated kernel beat torch's ops (1.045x) but not torch's
    RMSNorm then the silu twin's own kernel: the fallback serves the twins."""
    ms = _read(SELECT)
    assert any(NORM_BASELINE in m.baselines_us for m in ms)
    sels, missing = select({m.target for m in ms}, ms, "offline")
    got = _by_epilogue(sels)
    s = got[(28672, "rmsnorm_silu")]
    assert s.kind == "fallback" and s.winner is None and s.displaced is not None
    twin = got[(28672, "silu")]
    assert twin.kind == "kernel"
    norm = s.displaced.baselines_us[NORM_BASELINE]
    want = norm + twin.time_us / twin.baseline_us * (s.baseline_us - norm)
    assert s.twin_us == want < s.displaced.median_us < s.baseline_us
    # qkv's row scale lost to torch outright: a plain fallback, nothing displaced
    assert got[(6144, "rmsnorm")].kind == "fallback" and got[(6144, "rmsnorm")].displaced is None
    assert missing == []


def test_the_gate_keeps_why_a_row_scaled_target_falls_back():
    """A displaced kernel is never memchecked (it does not ship), so the gated selection
    has no checked kernel for it: it keeps the ungated selection's twin path for the
    build's summary."""
    from cudal2.pipeline.gate import SanitizerGate, SanitizerLedger

    ms = _read(SELECT)
    gate = SanitizerGate(None, SanitizerLedger())
    sels, _ = gate.select({m.target for m in ms}, ms, "offline", lambda m: True)
    got = _by_epilogue(sels)
    assert all(s.kind != "kernel" for s in sels)  # nothing checked: nothing ships
    s = got[(28672, "rmsnorm_silu")]
    assert s.displaced is not None and s.twin_us < s.displaced.median_us
    assert [x for x in sels if x.displaced is not None] == [s]
