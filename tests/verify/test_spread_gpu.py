"""On a GPU: the correctness bound is the spread of every vendor baseline.

Each baseline's deviation from the fp32 reference is measured on the check's own
inputs; a kernel within twice the worst of them passes, one beyond fails, and the
message names the baseline that set the bound.
"""

from __future__ import annotations

import math

import pytest

from cudal2.records import Target

torch = pytest.importorskip("torch")
pytest.importorskip("nvmath")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


@pytest.fixture(scope="module")
def spread():
    from cudal2.verify.spread import VendorSpread

    return VendorSpread()


@pytest.mark.parametrize(
    "t",
    [
        Target("sm_90a", "fp16", "tn", 100, 1000, 1000),
        Target("sm_90a", "bf16", "nn", 64, 512, 4096),
    ],
    ids=lambda t: t.label,
)
def test_every_vendor_baseline_is_compared(spread, t):
    from cudal2.verify import correctness

    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    a, b = correctness.operands(t, "random", gen)
    ref = correctness.reference(t, a, b)
    errs = spread(t, a, b, ref)
    assert {"torch", "cublas_tn", "cublas_nn", "cublaslt_0"} <= set(errs)
    scale = float(ref.abs().max())
    for name, e in errs.items():  # every baseline is a correct GEMM: rounding-sized error
        assert math.isfinite(e) and 0.0 <= e < 8 * correctness.OUT_EPS[t.dtype] * scale, name
    assert spread(t, a, b, ref) is errs  # same inputs: computed once


def test_bound_passes_a_correct_kernel_and_rejects_a_deviating_one(
    spread, recorded_measurements, tmp_path
):
    from cudal2.generator.compile import ArtifactCache, build
    from cudal2.generator.space import launch_recipe
    from cudal2.packaging.runtime import driver
    from cudal2.verify import correctness
    from cudal2.verify.launch import launch_dense

    kernels = (m for m in recorded_measurements if m.status == "ok" and not m.is_vendor)
    best = min(kernels, key=lambda m: m.median_us)
    d, t = best.design, best.target
    cache = ArtifactCache(tmp_path)
    b = build(d, cache)
    kernel = driver.Kernel(cache.cubin(b.artifact_key), b.symbol, launch_recipe(d)["smem_bytes"])
    bump = {"value": 0.0}

    def run(a, bb, c):
        stream = torch.cuda.current_stream().cuda_stream
        launch_dense(kernel, launch_recipe(d), t, a.data_ptr(), bb.data_ptr(), c.data_ptr(), stream)
        if bump["value"]:
            c.view(-1)[c.numel() // 2] += bump["value"]

    def check():
        return correctness.check(t, run, 3, vendor_errors=spread)

    ok = check()
    assert ok.ok, ok.error
    assert len(ok.vendors) >= 4 and ok.vendor_max_abs_err > 0
    assert ok.max_abs_err <= correctness.bound({"w": ok.vendor_max_abs_err}, 1e9, t.dtype)
    # One element off by 3x the worst vendor deviation (plus rounding at the result's
    # scale): beyond the bound in the first random trial.
    scale = float(correctness.draw(t, 3, 0, "random").ref.abs().max())  # the first trial's
    bump["value"] = 3 * ok.vendor_max_abs_err + 4 * correctness.OUT_EPS[t.dtype] * scale
    bad = check()
    assert not bad.ok
    assert "vendor baselines" in bad.error, bad.error
