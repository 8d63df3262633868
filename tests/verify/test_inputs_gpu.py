"""On a GPU: the worker's kept inputs (``cudal2.verify.inputs.InputCache``) change no
answer. A mixed batch of honest and adversarial kernels (tests/verify/fixtures/), run
through ``worker.run_job`` as the measuring worker runs it, once with every trial and
timing set drawn afresh and once through one cache: the same statuses and the same
errors (the racy kernel's count of differing elements is its own coin flips: its
status and the kind of failure are compared)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cudal2.records import Job, JobKind, Status, Target, TimingConfig

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc"),
]

SOURCE = Path(__file__).parent / "fixtures" / "adversarial.cu"
RECIPE = {
    "abi": "gemm_v1",
    "block": [256, 1, 1],
    "tile_m": 16,
    "tile_n": 16,
    "split_k": 1,
    "cluster": [1, 1, 1],
    "smem_bytes": 0,
    "align": {"k": 8},
}
TARGETS = [
    Target("sm_90a", "fp16", "tn", 100, 136, 264),
    Target("sm_90a", "fp16", "tn", 64, 512, 1024),
]
BATCH = [
    ("fx_honest", ""),
    ("fx_skipped_work", "bound"),
    ("fx_writes_input", "wrote into its input(s) a"),
    ("fx_honest", ""),
    ("fx_partial_write", "not written"),
    ("fx_cached_result", "trial 1"),
    ("fx_nan_output", "not written (or NaN)"),
    ("fx_racy", "a race"),
    ("fx_honest", ""),
]


@pytest.fixture(scope="module")
def cubin(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("adversarial") / "adversarial.cubin"
    cmd = ["nvcc", "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-O2", "-o", str(out)]
    subprocess.run([*cmd, str(SOURCE)], check=True)
    return out


def _job(cubin: Path, t: Target, symbol: str) -> Job:
    return Job(
        JobKind.MEASURE,
        t,
        TimingConfig(reps=5),
        toolchain="fixture",
        artifact_key=f"fixture:{symbol}",
        symbol=symbol,
        recipe=RECIPE,
        cubin=str(cubin),
    )


@pytest.mark.parametrize("t", TARGETS, ids=lambda t: t.label)
def test_a_mixed_batch_answers_alike_with_and_without_the_cache(cubin, t):
    from cudal2.packaging.runtime import driver
    from cudal2.verify import correctness, worker
    from cudal2.verify.gpu import current_gpu
    from cudal2.verify.inputs import InputCache
    from cudal2.verify.spread import VendorSpread, nvmath_available

    torch.cuda.init()
    driver.ensure_context(0)
    gpu = current_gpu(0)
    errors = VendorSpread() if nvmath_available() else correctness.torch_error
    cache = InputCache()
    for symbol, needle in BATCH:
        job = _job(cubin, t, symbol)
        fresh = worker.run_job(job, 0, gpu.name, errors)
        kept = worker.run_job(job, 0, gpu.name, errors, cache)
        assert kept.status == fresh.status, (symbol, fresh.error, kept.error)
        if needle:
            assert kept.status == Status.INCORRECT and needle in kept.error, (symbol, kept.error)
            assert needle in fresh.error, (symbol, fresh.error)
        else:
            assert kept.status == Status.OK, (symbol, kept.error)
            assert len(kept.samples_us) == len(fresh.samples_us) == 5
        if symbol != "fx_racy":
            assert kept.error == fresh.error, symbol
            assert (kept.max_abs_err, kept.metrics) == (fresh.max_abs_err, fresh.metrics), symbol
    stats = cache.stats()
    assert stats["hits"] > 0 and stats["bytes"] <= cache.max_bytes
    # the write into A dropped the trial it wrote; the kept ones are as drawn
    assert stats["redrawn"] == 0
