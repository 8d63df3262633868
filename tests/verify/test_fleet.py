"""``verify.fleet.check_fleet``: which sets of GPUs can serve one build."""

from __future__ import annotations

import dataclasses

import pytest

from cudal2.verify.fleet import FleetError, check_cublaslt, check_fleet, recorded_as

H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"


def _gpu(recorded_measurements, name, index, arch="sm_90a"):
    base = recorded_measurements[0].gpu
    return dataclasses.replace(base, name=name, arch=arch, index=index, host="node-1")


# (GPUs as (model, arch), interchangeable groups, the error's words or None: accepted)
CASES = [
    ("one-gpu", [(H100, "sm_90a")], (), None),
    ("two-alike", [(H100, "sm_90a"), (H100, "sm_90a")], (), None),
    ("h100-and-h200", [(H100, "sm_90a"), (H200, "sm_90a")], (), "different models"),
    ("h100-and-h200-said-alike", [(H100, "sm_90a"), (H200, "sm_90a")], ((H100, H200),), None),
    ("alike-in-another-group", [(H100, "sm_90a"), (H200, "sm_90a")], ((H100, "x"),), "models"),
    (
        "two-archs",
        [(H100, "sm_90a"), ("NVIDIA A100", "sm_80")],
        ((H100, "NVIDIA A100"),),
        "different architectures",
    ),
    ("none", [], (), "no GPU found"),
]


@pytest.mark.parametrize("gpus,groups,error", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_fleet_is_one_model_unless_said_interchangeable(
    recorded_measurements, gpus, groups, error
):
    found = [_gpu(recorded_measurements, n, i, a) for i, (n, a) in enumerate(gpus)]
    if error is None:
        assert check_fleet(found, groups) == found[0]
    else:
        with pytest.raises(FleetError, match=error) as e:
            check_fleet(found, groups)
        for g in found:  # the message names every GPU, where it is
            assert f"node-1:{g.index}" in str(e.value)


def test_an_interchangeable_gpu_is_recorded_as_the_fleets_model(recorded_measurements):
    first = _gpu(recorded_measurements, H100, 0)
    other = dataclasses.replace(_gpu(recorded_measurements, H200, 1), driver="other")
    assert recorded_as(first, first) is first
    got = recorded_as(other, first)
    assert (got.name, got.arch, got.index, got.driver) == (H100, first.arch, 1, "other")


@pytest.mark.parametrize(
    "versions,error",
    [
        ({"a": 130100, "b": 130100}, None),
        ({"a": None}, None),
        ({"a": 130100, "b": 130000}, "a: 130100"),
    ],
)
def test_one_cublaslt_version_per_fleet(versions, error):
    if error is None:
        assert check_cublaslt(versions) == next(iter(versions.values()))
    else:
        with pytest.raises(FleetError, match=error):
            check_cublaslt(versions)
