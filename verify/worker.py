"""The measuring worker: a separate process that owns the CUDA context.

It answers jobs one at a time over a pipe. A CUDA error poisons the context, so the
worker reports it and exits; the parent starts a fresh one for the rest of the batch.
This module is the only place that launches candidates, through the same driver
code the shipped runtime uses (``cudal2.runtime.driver``).
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Any

from cudal2.records import Target
from cudal2.runtime import driver
from cudal2.verify import correctness
from cudal2.verify.floor import floor_us
from cudal2.verify.gpu import current_gpu
from cudal2.verify.launch import launch_dense
from cudal2.verify.spread import VendorSpread, nvmath_available
from cudal2.verify.timing import TimingConfig, operand_sets, time_interleaved


def run_job(
    job: dict[str, Any], device: int, gpu_name: str, vendor_errors: correctness.VendorErrors
) -> dict[str, Any]:
    import torch

    t = Target.from_json(job["target"])
    cfg = TimingConfig(**job["timing"])
    gen = torch.Generator(device="cuda")
    gen.manual_seed(cfg.seed)
    kernel = driver.Kernel(
        Path(job["cubin_path"]).read_bytes(), job["symbol"], job["recipe"]["smem_bytes"]
    )
    recipe = job["recipe"]

    def run(a, b, c) -> None:
        stream = torch.cuda.current_stream().cuda_stream
        launch_dense(kernel, recipe, t, a.data_ptr(), b.data_ptr(), c.data_ptr(), stream, device)

    result = correctness.check(t, run, gen, vendor_errors=vendor_errors)
    out: dict[str, Any] = {
        "max_abs_err": result.max_abs_err,
        "max_rel_err": result.max_rel_err,
        "vendor_max_abs_err": result.vendor_max_abs_err,
        "vendors": len(result.vendors),
    }
    if not result.ok:
        return {**out, "status": "incorrect", "error": result.error}
    # Time on operand sets rotated past L2 (the same function the benchmarks use).
    nsets = operand_sets(t.min_bytes)
    sets = [correctness.operands(t, "random", gen) for _ in range(nsets)]
    outs = [torch.empty((t.m, t.n), dtype=a.dtype, device="cuda") for a, _ in sets]
    timings = time_interleaved(
        {
            "candidate": lambda j: run(sets[j][0], sets[j][1], outs[j]),
            "torch": lambda j: correctness.vendor(t, sets[j][0], sets[j][1], out=outs[j]),
        },
        nsets,
        cfg,
        est_us=max(floor_us(t, gpu_name), 2.0),
    )
    return {
        **out,
        "status": "ok",
        "error": "",
        "samples_us": list(timings["candidate"].samples_us),
        "baseline_samples_us": {"torch": list(timings["torch"].samples_us)},
    }


def _is_cuda_error(exc: BaseException) -> bool:
    text = str(exc)
    return (
        isinstance(exc, driver.CudaDriverError)
        or "CUDA error" in text
        or "cuda" in type(exc).__module__
    )


def worker_main(conn, device: int) -> None:
    """Entry point of the worker process (spawned, never forked)."""
    import torch

    os.environ.setdefault("CUDA_MODULE_LOADING", "LAZY")
    torch.cuda.set_device(device)
    torch.cuda.init()
    driver.ensure_context(device)
    gpu = current_gpu(device)
    # The correctness bound is the spread of every vendor baseline where nvmath-python
    # (cuBLAS, cuBLASLt) is installed, torch.matmul's error alone otherwise.
    vendor_errors: correctness.VendorErrors = correctness.torch_error
    if nvmath_available():
        vendor_errors = VendorSpread()
    conn.send({"hello": gpu.as_json()})
    while True:
        job = conn.recv()
        if job is None:
            return
        try:
            conn.send(run_job(job, device, gpu.name, vendor_errors))
        except Exception as exc:  # noqa: BLE001 - every failure is a result, recorded
            fatal = _is_cuda_error(exc)
            conn.send(
                {
                    "status": "runtime",
                    "fatal": fatal,
                    "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}",
                }
            )
            if fatal:  # the context is poisoned: leave, the parent starts a fresh worker
                conn.close()
                os._exit(3)
