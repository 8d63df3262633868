"""On a GPU: a run-off's ``measure`` job (``Job.rival``, ``pipeline.runoff``) times the
rival cuBLASLt algorithm beside the kernel and torch, interleaved in the worker
(``worker.rival_graph``); a rival the worker cannot run leaves the kernel's answer as
it would be without one, never a failure of the kernel."""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path

import pytest

from cudal2.records import Job, JobKind, Status, Target, TimingConfig

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc"),
]

TARGET = Target("sm_90a", "fp16", "tn", 256, 1024, 1024)
TIMING = TimingConfig(reps=10, mode="offline", seed=0)


@pytest.fixture(scope="module")
def setup(adversarial):
    """The fixture kernels' cubin and recipe (tests/verify/conftest.py), the GPU, the
    vendor spread and a real cuBLASLt record of TARGET (the build's own autotuning job)."""
    pytest.importorskip("nvmath.bindings.cublasLt")
    from cudal2.packaging.runtime import driver
    from cudal2.packaging.runtime.cublaslt import version
    from cudal2.pipeline.results import vendor_measurement, vendor_toolchain
    from cudal2.verify.gpu import current_gpu
    from cudal2.verify.spread import VendorSpread
    from cudal2.verify.worker import run_vendor_job

    torch.cuda.init()
    driver.ensure_context(0)
    gpu = current_gpu(0)
    spread = VendorSpread()
    tune = Job(JobKind.AUTOTUNE, TARGET, TIMING, vendor_toolchain(version()))
    vendor = vendor_measurement(run_vendor_job(tune, gpu.name, spread), gpu)
    assert vendor.status == Status.OK, vendor.error
    return adversarial, gpu, spread, vendor


def _job(adversarial: tuple[Path, dict], rival: dict) -> Job:
    cubin, recipe = adversarial
    return Job(
        JobKind.MEASURE,
        TARGET,
        TIMING,
        toolchain="fixture",
        artifact_key="fixture:fx_honest",
        symbol="fx_honest",
        recipe=recipe,
        cubin=str(cubin),
        rival=rival,
    )


def test_the_rival_is_timed_beside_the_kernel_and_torch(setup):
    from cudal2.verify import worker

    kernels, gpu, spread, vendor = setup
    rival = {"design_key": vendor.design_key, **vendor.vendor}
    res = worker.run_job(_job(kernels, rival), 0, gpu.name, spread)
    assert res.status == Status.OK, res.error
    got = res.baseline_samples_us[vendor.design_key]
    assert len(got) == len(res.samples_us) == len(res.baseline_samples_us["torch"])
    # the same algorithm as the record's, on the same target: the same time to within
    # what two processes' timings of a 2-10 us GEMM differ by
    ratio = statistics.median(got) / vendor.median_us
    assert 0.67 < ratio < 1.5, (statistics.median(got), vendor.median_us)


# Rivals the worker cannot run: (field changed, value); the kernel's answer stands
HOSTILE = [("version", 1), ("algo", "00" * 64)]


@pytest.mark.parametrize(("field", "value"), HOSTILE)
def test_a_rival_the_worker_cannot_run_leaves_the_kernel_answered(setup, field, value, capfd):
    from cudal2.verify import worker

    kernels, gpu, spread, vendor = setup
    rival = {"design_key": vendor.design_key, **vendor.vendor, field: value}
    res = worker.run_job(_job(kernels, rival), 0, gpu.name, spread)
    assert res.status == Status.OK, res.error
    assert set(res.baseline_samples_us) == {"torch"}
    assert "rival not timed" in capfd.readouterr().err
