"""On a GPU with Nsight Compute: the profile metrics of recorded kernels come back,
one set per launch in job order, within their ranges."""

from __future__ import annotations

import pytest

from cudal2.verify.profile import METRICS, find_ncu, job, profile

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
    pytest.mark.skipif(find_ncu() is None, reason="needs ncu"),
]


def test_profile_recorded_kernels(recorded_measurements, artifact_cache):
    from cudal2.generator.compile import build_all

    ok = sorted(
        (
            m
            for m in recorded_measurements
            if m.status == "ok" and m.target.layout == "tn" and not m.is_vendor
        ),
        key=lambda m: m.median_us,
    )
    chosen = [ok[0], ok[len(ok) // 2], ok[-1]]  # a fast, a middling and a slow one
    built = build_all([m.design for m in chosen], artifact_cache)
    jobs = [
        job(
            artifact_cache.cubin_path(built[m.design_key].artifact_key),
            m.design,
            m.target,
        )
        for m in chosen
    ]
    res = profile(jobs)
    assert res.error == "", res.error
    assert len(res.metrics) == len(jobs)
    assert set(res.names) == set(METRICS)  # every quantity found a metric name on this GPU
    # where the seconds went: the ncu run(s), the child's own phases, the report import
    assert res.seconds["ncu_run_1"] > 0 and res.seconds["import"] > 0, res.seconds
    phases = {"child_imports", "child_cuda_init", "child_operands", "child_module_load"}
    assert phases | {"child_launches"} <= set(res.seconds), res.seconds
    for m, vals in zip(chosen, res.metrics, strict=True):
        assert set(vals) == set(METRICS), vals
        for k, v in vals.items():
            if k.endswith("_pct"):
                assert 0.0 <= v <= 100.5, (k, v)
        # ncu times one launch from cold caches at the GPU's own clocks; the recorded
        # median was taken by graph replay: the same order of magnitude.
        assert 0.25 * m.median_us < vals["ncu_duration_us"] < 4 * m.median_us, (m.median_us, vals)
        assert vals["ncu_dram_bytes"] > 0.5 * m.target.min_bytes
