"""Selection from the recorded H100 database (manifests/default.measurements.jsonl)."""

from __future__ import annotations

import dataclasses

from cudal2.manifest import default_manifest_path, load_manifest
from cudal2.select import select


def _targets():
    return load_manifest(default_manifest_path()).targets


def test_every_measured_target_gets_one_selection_per_gpu(recorded_measurements):
    sels, missing = select(_targets(), recorded_measurements, "offline")
    measured = {(m.gpu.name, m.target) for m in recorded_measurements}
    assert {(s.gpu, s.target) for s in sels} == measured
    assert not missing  # the shipped database covers the default manifest


def test_kernel_wins_only_beyond_the_spread_and_is_the_fastest_correct(recorded_measurements):
    sels, _ = select(_targets(), recorded_measurements, "offline")
    for s in sels:
        ok = [
            m
            for m in recorded_measurements
            if m.target == s.target and m.gpu.name == s.gpu and m.status == "ok"
        ]
        if s.kind == "kernel":
            assert s.winner.median_us == min(m.median_us for m in ok)
            assert s.speedup - 1 > s.spread
            assert (
                s.time_us == s.winner.median_us and s.baseline_us == s.winner.baselines_us["torch"]
            )
        elif ok:
            best = min(ok, key=lambda m: m.median_us)
            assert best.baselines_us["torch"] / best.median_us - 1 <= s.spread
            assert s.time_us == s.baseline_us  # a fallback runs the baseline


def test_other_timing_mode_has_no_data_here(recorded_measurements):
    sels, missing = select(_targets(), recorded_measurements, "server")
    assert sels == [] and len(missing) == len(set(_targets()))


def test_targets_with_only_failures_get_no_entry(recorded_measurements):
    timed = [m for m in recorded_measurements if m.status == "ok"]
    failed = [dataclasses.replace(m, status="incorrect", median_us=None) for m in timed]
    sels, missing = select(_targets(), failed, "offline")
    assert sels == [] and set(missing) == set(_targets())


def test_unusable_kernels_still_price_the_fallback(recorded_measurements):
    sels, _ = select(_targets(), recorded_measurements, "offline", usable=lambda m: False)
    for s in sels:
        assert s.kind == "fallback" and s.time_us == s.baseline_us > 0
