"""Templates: substitution only, strict about missing values, one symbol per design."""

from __future__ import annotations

import pytest

from cudal2.generator import design_name
from cudal2.generator.render import IllegalDesignError, render
from cudal2.records import KernelDesign, Knobs


def _d(dtype="fp16", layout="tn", **kw) -> KernelDesign:
    base = dict(bm=64, bn=128, bk=32, warps_m=2, warps_n=2, warps_k=1, stages=3)
    base.update(kw)
    return KernelDesign("sm80mma", "sm_90a", dtype, layout, Knobs.of(**base))


@pytest.mark.parametrize(
    "dtype, ctype, ptx", [("fp16", "__half", "f16"), ("bf16", "__nv_bfloat16", "bf16")]
)
def test_dtype_spellings(dtype, ctype, ptx):
    src = render(_d(dtype))
    assert f"typedef {ctype} T;" in src
    assert f"row.col.f32.{ptx}.{ptx}.f32" in src
    assert "{{" not in src and "<%" not in src  # nothing left unsubstituted


@pytest.mark.parametrize("layout, b_kn", [("tn", "false"), ("nn", "true")])
def test_layout_and_knobs_substituted(layout, b_kn):
    d = _d(layout=layout)
    src = render(d)
    assert f"constexpr bool B_KN = {b_kn};" in src
    for knob, value in [
        ("BM", 64),
        ("BN", 128),
        ("BK", 32),
        ("WARPS_M", 2),
        ("WARPS_N", 2),
        ("STAGES", 3),
    ]:
        assert f"constexpr int {knob} = {value};" in src
    assert f"\n{design_name(d)}(const T* __restrict__ A" in src  # extern "C" symbol = the name
    assert d.key in src


def test_render_is_deterministic():
    assert render(_d()) == render(_d())


def test_illegal_design_refused_with_reasons():
    with pytest.raises(IllegalDesignError, match="multiple of 16\\*warps_m"):
        render(_d(bm=24))
