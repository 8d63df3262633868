"""The cost model on a fused epilogue's target: the tiles cover the GEMM's N (the
packed gate_up rows), the output written is ``Target.out_n`` wide (N/2 for a gated
epilogue), through ``Target.min_bytes``."""

from __future__ import annotations

import pytest

from cudal2.generator.families import sm90_tma
from cudal2.policy.cost_model import predicted_time_s
from cudal2.records import Target

DESIGN = sm90_tma.design("fp16", 2, 1, False, 128, 4, 1)


def _t(m: int, n: int, k: int, epilogue: str = "none") -> Target:
    return Target("sm_90a", "fp16", "tn", m, n, k, epilogue=epilogue)


@pytest.mark.parametrize("epilogue", ["silu", "rmsnorm_gelu_tanh"])
def test_a_gated_output_half_as_wide_is_predicted_faster_when_the_output_dominates(epilogue):
    # M x N = 8192 x 8192 written against a 64-deep K: the output is most of the bytes
    plain, gated = _t(8192, 8192, 64), _t(8192, 8192, 64, epilogue)
    assert gated.min_bytes < plain.min_bytes
    assert predicted_time_s(DESIGN, gated) < 0.8 * predicted_time_s(DESIGN, plain)


def test_a_row_scaled_epilogue_costs_what_the_plain_gemm_does():
    """rmsnorm reads nothing more (its row scale comes from A, already streamed)."""
    for shape in ((1, 6144, 4096), (64, 28672, 4096), (4096, 4096, 4096)):
        assert predicted_time_s(DESIGN, _t(*shape, "rmsnorm")) == predicted_time_s(
            DESIGN, _t(*shape)
        )


def test_a_decode_gated_gemm_streams_the_whole_packed_weight():
    """At M = 1 the weight is the bytes: the gated target is predicted no faster than
    the plain GEMM of the same packed N (the halved output is a few KB)."""
    plain, gated = _t(1, 28672, 4096), _t(1, 28672, 4096, "rmsnorm_silu")
    assert predicted_time_s(DESIGN, gated) == pytest.approx(
        predicted_time_s(DESIGN, plain), rel=1e-3
    )
