"""On a GPU: one layer case as ``cudal2-bench layer`` takes it (torch.compile'd pieces,
CUDA graphs, the project's timing function), with ``F.linear`` as the package: both
variants pass the fp32 check and are timed, at about the same speed."""

from __future__ import annotations

import dataclasses
import types

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_a_small_layer_is_checked_and_timed_under_cuda_graphs(dtype):
    import torch.nn.functional as F

    from cudal2.bench import layer as L
    from cudal2.bench import layer_run as R
    from cudal2.records import TimingConfig
    from cudal2.verify.timing import time_interleaved

    shape = dataclasses.replace(
        L.layer_shape("llama-3.1-8b"), hidden=1024, heads=8, kv_heads=2, intermediate=2048
    )
    cfg = TimingConfig(reps=10, warmup=2, mode="offline")

    def timer(fns, nsets, est):
        return time_interleaved(fns, nsets, cfg, est)

    torch.compiler.reset()
    pkg = types.SimpleNamespace(linear=F.linear)
    case = R.measure_case(shape, dtype, 16, pkg, timer, sets=2)
    assert case["ok"] == {"vendor": True, "cudal2": True}, case
    assert all(case["median_us"][v] > 1.0 for v in R.VARIANTS)
    # the same GEMMs and pieces: nothing but noise may separate the two
    assert 0.8 < case["speedup"] < 1.25, case["median_us"]
