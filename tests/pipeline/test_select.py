"""Selection from the recorded H100 database (manifests/default.measurements.jsonl): kernel
and cuBLASLt records."""

from __future__ import annotations

import dataclasses

from cudal2.manifest import default_manifest_path, load_manifest
from cudal2.pipeline.select import noise, select
from cudal2.verify.timing import paired_spread


def _targets():
    return load_manifest(default_manifest_path()).targets


def test_every_measured_target_gets_one_selection_per_gpu(recorded_measurements):
    sels, missing = select(_targets(), recorded_measurements, "offline")
    measured = {(m.gpu.name, m.target) for m in recorded_measurements}
    assert {(s.gpu, s.target) for s in sels} == measured
    assert not missing  # the shipped database covers the default manifest


def _speedup(m) -> float:
    return m.baselines_us["torch"] / m.median_us


def test_a_candidate_wins_only_beyond_its_noise_and_is_the_fastest(recorded_measurements):
    sels, _ = select(_targets(), recorded_measurements, "offline")
    for s in sels:
        ok = [
            m
            for m in recorded_measurements
            if m.target == s.target and m.gpu.name == s.gpu and m.status == "ok"
        ]
        kernels = [m for m in ok if not m.is_vendor]
        vendors = [m for m in ok if m.is_vendor]
        best_kernel = min(kernels, key=lambda m: m.median_us) if kernels else None
        best_vendor = max(vendors, key=_speedup) if vendors else None
        if s.kind == "kernel":
            assert s.winner is best_kernel
            assert best_vendor is None or _speedup(best_vendor) <= _speedup(s.winner)
        elif s.kind == "cublaslt":
            assert s.winner is best_vendor and s.winner.design is None
            # The kernel was slower relative to torch, or within its own noise.
            assert best_kernel is None or (
                _speedup(best_kernel) <= _speedup(s.winner)
                or _speedup(best_kernel) - 1 <= noise(best_kernel)
            )
        if s.kind != "fallback":
            assert s.speedup - 1 > s.spread == noise(s.winner)
            assert s.time_us == s.winner.median_us
            assert s.baseline_us == s.winner.baselines_us["torch"]
        else:
            for m in (best_kernel, best_vendor):
                assert m is None or _speedup(m) - 1 <= noise(m)
            assert s.time_us == s.baseline_us  # a fallback runs the baseline


def test_recorded_cublaslt_algorithms_are_selected_where_they_win(recorded_measurements):
    sels, _ = select(_targets(), recorded_measurements, "offline")
    kinds = {s.kind for s in sels}
    assert kinds == {"kernel", "cublaslt", "fallback"}, kinds
    for s in sels:
        if s.kind == "cublaslt":
            assert len(bytes.fromhex(s.winner.vendor["algo"])) == 64


def test_noise_is_the_paired_spread_where_samples_pair(recorded_measurements):
    timed = [m for m in recorded_measurements if m.status == "ok" and m.median_us]
    paired = [paired_spread(m.samples_us, m.baseline_samples_us["torch"]) for m in timed]
    assert all(p is not None for p in paired)  # every recorded run interleaves by repetition
    assert [noise(m) for m in timed] == paired


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
    assert {s.kind for s in sels} == {"cublaslt", "fallback"}  # no kernel ships
    for s in sels:
        if s.kind == "fallback":
            assert s.time_us == s.baseline_us > 0
