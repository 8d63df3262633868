"""Jobs the build hands a runner, and the records it makes of the answers.

A kernel or cuBLASLt answer becomes one ``Measurement`` with the metrics derived from
it (achieved TFLOP/s and GB/s, waves, registers, ...); that record, and only that, is
what the database holds of a measured job.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Sequence
from typing import Any

from cudal2 import __version__
from cudal2.generator import design_name, launch_recipe
from cudal2.records import (
    BuildResult,
    GpuInfo,
    Job,
    JobKind,
    JobResult,
    KernelDesign,
    Measurement,
    Status,
    Target,
    TimingConfig,
    canonical_json,
    sha256_hex,
)
from cudal2.verify.timing import TIMING_METHOD, Timing

VENDOR_PROPOSER = "cublaslt-autotune"


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def toolchain_of(build: BuildResult) -> str:
    """What, besides the artifact, a measurement depends on: nvcc and the timing method."""
    return f"{build.nvcc_version}; {TIMING_METHOD}"


def vendor_toolchain(version: int) -> str:
    """What a cuBLASLt record depends on besides its algorithm: the library's version
    and the timing method."""
    return f"cublasLt {version}; {TIMING_METHOD}"


def kernel_job(
    target: Target, design: KernelDesign, build: BuildResult, timing: TimingConfig, cubin: str
) -> Job:
    """Check and time ``build`` of ``design`` on ``target`` (``cubin``: where its cubin
    lies, "" for a runner that needs none)."""
    return Job(
        JobKind.MEASURE,
        target,
        timing,
        toolchain_of(build),
        design,
        build.artifact_key,
        build.symbol,
        launch_recipe(design),
        cubin,
    )


def job_for(kind: JobKind, m: Measurement, cubin: str, profile_metrics: Sequence[str] = ()) -> Job:
    """A ``profile`` or ``sanitizer`` job for the kernel of a recorded measurement: its
    answer is about the same reuse key. ``profile_metrics``: the Nsight Compute
    quantities a profile job asks for (empty: every one)."""
    assert m.design is not None, "a vendor record has no kernel to profile or check"
    return Job(
        kind,
        m.target,
        TimingConfig(mode=m.mode),
        m.toolchain,
        m.design,
        m.artifact_key,
        design_name(m.design),
        launch_recipe(m.design),
        cubin,
        tuple(profile_metrics),
    )


def timed_fields(result: JobResult) -> dict[str, Any]:
    """The timing fields of an answer and the metrics derived from them."""
    target = result.job.target
    samples = tuple(result.samples_us)
    base_samples = {k: tuple(v) for k, v in result.baseline_samples_us.items()}
    median = statistics.median(samples) if samples else None
    metrics: dict[str, Any] = dict(result.metrics)
    if median:
        metrics["tflops"] = round(target.flops / (median * 1e-6) / 1e12, 3)
        metrics["gbps"] = round(target.min_bytes / (median * 1e-6) / 1e9, 2)
    spread = None
    if samples and "torch" in base_samples:
        spread = max(Timing(samples).spread, Timing(base_samples["torch"]).spread)
    assert result.status is not None, "an unmeasured job makes no record"
    return {
        "status": result.status,
        "error": result.error,
        "max_abs_err": result.max_abs_err,
        "max_rel_err": result.max_rel_err,
        "samples_us": samples,
        "median_us": median,
        "baselines_us": {k: statistics.median(v) for k, v in base_samples.items()},
        "baseline_samples_us": base_samples,
        "spread": spread,
        "metrics": metrics,
    }


def measurement_from(
    result: JobResult, build: BuildResult, gpu: GpuInfo, proposer: str
) -> Measurement:
    """A kernel job's answer (or a compile failure) as a typed record with derived metrics,
    on the GPU that answered it (``result.gpu``; else ``gpu``, the runner's)."""
    job = result.job
    gpu = result.gpu or gpu
    assert job.design is not None
    timed = timed_fields(result)
    metrics: dict[str, Any] = {}
    if build.registers is not None:
        metrics["registers"] = build.registers
        metrics["spill_bytes"] = build.spill_bytes or 0
    if build.ok:
        recipe = job.recipe
        tiles = -(-job.target.m // recipe["tile_m"]) * -(-job.target.n // recipe["tile_n"])
        metrics["waves"] = round(tiles / gpu.sm_count, 4)
        metrics["smem_bytes"] = recipe["smem_bytes"]
    timed["metrics"] = {**metrics, **timed["metrics"]}
    return Measurement(
        target=job.target,
        design=job.design,
        design_key=job.design.key,
        artifact_key=job.artifact_key,
        gpu=gpu,
        proposer=proposer,
        tool_version=__version__,
        toolchain=job.toolchain,
        measured_at=now(),
        mode=job.timing.mode,
        **timed,
    )


def compile_failure(job: Job, build: BuildResult, gpu: GpuInfo, proposer: str) -> Measurement:
    """The record of a design that did not compile (no runner sees it)."""
    return measurement_from(JobResult(job, Status.COMPILE, build.error), build, gpu, proposer)


def vendor_measurement(result: JobResult, gpu: GpuInfo) -> Measurement:
    """A ``cublaslt`` job's answer as a record that the selection can weigh against the
    kernels and a table can dispatch (on the GPU that answered it, as ``measurement_from``)."""
    gpu = result.gpu or gpu
    vendor = result.vendor
    key = sha256_hex(canonical_json({k: vendor[k] for k in ("library", "version", "algo")}))
    timed = timed_fields(result)
    timed["metrics"]["workspace_bytes"] = vendor["workspace_bytes"]
    return Measurement(
        target=result.job.target,
        design=None,
        design_key=f"cublaslt:{key}",
        artifact_key=f"cublaslt:{key}",
        gpu=gpu,
        proposer=VENDOR_PROPOSER,
        tool_version=__version__,
        toolchain=result.job.toolchain,
        measured_at=now(),
        mode=result.job.timing.mode,
        vendor=dict(vendor),
        **timed,
    )
