"""On a GPU: one benchmark record, with a cudal2 wheel's kernel timed beside every
vendor baseline (the recorded table: each target's best recorded kernel)."""

from __future__ import annotations

import pytest

from cudal2.packaging.wheel import write_wheel
from cudal2.records import Target

torch = pytest.importorskip("torch")
pytest.importorskip("nvmath")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


def test_bench_record_times_every_baseline_and_the_wheel_kernel(
    tmp_path, recorded_table, recorded_cubins
):
    from cudal2.bench.bench import VENDORS, Bench
    from cudal2.bench.kernels import WheelKernels
    from cudal2.verify.gpu import current_gpu

    gpu = current_gpu()
    wheel = write_wheel(recorded_table, recorded_cubins, tmp_path)
    e = next(e for e in recorded_table.entries if e.kind == "kernel" and e.layout == "tn")
    t = Target(e.arch, e.dtype, e.layout, e.m_measured, e.n, e.k)
    rec = Bench(gpu, "offline", reps=5, kernels=WheelKernels.open(wheel, gpu)).shape(t)
    assert rec["errors"] == []
    assert set(rec["baselines"]) == set(VENDORS)
    assert rec["cublaslt_autotune"]["algorithms"] >= 1
    assert rec["cudal2"]["dispatch"]["kind"] == "kernel"
    assert rec["cudal2"]["dispatch"]["kernel"] == e.kernel
    own = rec["cudal2"]["median_us"]
    assert own >= rec["floor_us"] and rec["cudal2"]["floor_fraction"] <= 1
    best = rec["best_vendor"]
    assert best["median_us"] == min(b["median_us"] for b in rec["baselines"].values())
    assert all(c["agrees"] for c in rec["sync_check"].values()), rec["sync_check"]


def test_a_settled_shape_runs_torch_first_and_says_so():
    """``settle_ms``: the shape's torch.matmul runs that long before its autotuning and
    timing, and the record carries it; without, neither."""
    import time

    from cudal2.bench.bench import Bench
    from cudal2.verify.gpu import current_gpu

    gpu = current_gpu()
    t = Target(gpu.arch, "fp16", "tn", 1024, 1024, 1024)
    took = {}
    for settle in (0, 1000):
        start = time.perf_counter()
        rec = Bench(gpu, "offline", reps=5, settle_ms=settle).shape(t)
        took[settle] = time.perf_counter() - start
        assert rec["errors"] == []
        assert rec["timing"].get("settle_ms", 0) == settle
    # the unsettled shape (its first-call costs included) takes less than the settle alone
    assert took[0] < 1.0 <= took[1000], took
