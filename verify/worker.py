"""The measuring worker: a separate process that owns the CUDA context.

It answers jobs one at a time over a pipe: a ``Job`` as JSON in, a ``JobResult`` as
JSON out (with a ``fatal`` flag beside it). A CUDA error poisons the context, so the
worker reports it and exits; the parent starts a fresh one for the rest of the batch.

A ``{"prepare": [...]}`` message (targets with their timing settings) is no job: it
gets no answer. While its pipe is empty, the worker readies those targets one at a
time (``prepare``: what their first job would make, kept in its ``InputCache``),
looking at the pipe between targets, so a job waits at most for one target's
preparation, which is that target's first job's work done ahead. Each answer says how
many prepare messages the worker has read and how many targets it has left
(``prepares_read`` / ``preparing``): the pool knows whether the worker may have been
preparing when it died.

This module is the only place that launches candidates, through the same driver
code the shipped runtime uses (``cudal2.packaging.runtime.driver``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cudal2.hardware import floor_us
from cudal2.packaging.runtime import cublaslt, driver
from cudal2.packaging.runtime.cublaslt import version
from cudal2.records import (
    NORM_BASELINE,
    NORMED_TWINS,
    Job,
    JobKind,
    JobResult,
    Status,
    Target,
    TimingConfig,
)
from cudal2.verify import correctness, pdl_pair
from cudal2.verify.gpu import current_gpu
from cudal2.verify.inputs import Fresh, InputCache, TimingSets, bound_bytes
from cudal2.verify.launch import dense_gemm, launch_dense, tensor_epilogue
from cudal2.verify.spread import VendorSpread, nvmath_available
from cudal2.verify.timing import Captured, capture, operand_sets, replay_calls, time_interleaved
from cudal2.verify.vendor import algo_name, autotune

CHECKED_ALGOS = 3  # vendor job: the fastest candidates tried through the checks, in order


def run_job(
    job: Job,
    device: int,
    gpu_name: str,
    vendor_errors: correctness.VendorErrors,
    inputs: Fresh | None = None,
) -> JobResult:
    """A ``measure`` or ``cublaslt`` job (profiling and memcheck run in child processes
    of their own tools, not in this worker). ``inputs``: where the checks' trials and
    the timing's operand sets come from (the worker's ``InputCache``; drawn afresh
    when None). The answer carries the job's wall seconds here (``job_s``) and their
    phases (``phases_s``), which no record keeps."""
    started = time.perf_counter()
    phases: dict[str, float] = {}
    res = _run_job(job, device, gpu_name, vendor_errors, inputs, phases)
    return dataclasses.replace(
        res,
        job_s=round(time.perf_counter() - started, 6),
        phases_s={k: round(v, 6) for k, v in phases.items()},
    )


def _run_job(
    job: Job,
    device: int,
    gpu_name: str,
    vendor_errors: correctness.VendorErrors,
    inputs: Fresh | None,
    phases: dict[str, float],
) -> JobResult:
    if job.kind == JobKind.AUTOTUNE:
        return run_vendor_job(job, gpu_name, vendor_errors, inputs=inputs, phases=phases)
    if job.kind != JobKind.MEASURE:
        raise ValueError(f"the measuring worker does not run {job.kind} jobs")
    t, recipe = job.target, job.recipe
    with _phase(phases, "module_load"):
        kernel = driver.Kernel(Path(job.cubin).read_bytes(), job.symbol, recipe["smem_bytes"])

    def run(a, b, c, epi=None) -> None:
        # A fused epilogue's operands (fresh per trial: correctness.epilogue_operands)
        ops = tensor_epilogue(t, epi)
        stream = _stream()
        launch_dense(
            kernel, recipe, t, a.data_ptr(), b.data_ptr(), c.data_ptr(), stream, device, ops
        )

    # A PDL design (its recipe launches it with programmatic stream serialization)
    # also runs as the second kernel of a pair (verify/pdl_pair.py).
    pdl = recipe.get("pdl") is True
    return _check_and_time(
        job, run, gpu_name, vendor_errors, pdl_pair_check=pdl, inputs=inputs, phases=phases
    )


def _stream() -> int:
    import torch

    return torch.cuda.current_stream().cuda_stream


class _phase:
    """Adds the wall seconds of its block to ``phases[name]``."""

    def __init__(self, phases: dict[str, float] | None, name: str) -> None:
        self.phases, self.name = phases, name

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        if self.phases is not None:
            dt = time.perf_counter() - self.t0
            self.phases[self.name] = self.phases.get(self.name, 0.0) + dt


def torch_graph(t: Target, sets: TimingSets, nsets: int, calls: int) -> Captured:
    """torch's baseline on the timing sets, captured: it reads A, B and the epilogue's
    operands of the sets themselves (the unfused op only reads the residual; it writes
    outputs of its own, made here and kept with the graph), so the graph stays valid for
    as long as the sets are kept, whatever any job frees. (Its temporaries live in the
    graph's private pool; the cuBLAS workspace it uses is torch's per-stream one, which
    torch keeps for the process.)"""
    import torch

    outs = [
        torch.empty((t.m, t.out_n), dtype=a.dtype, device=correctness.DEVICE) for a, _ in sets.sets
    ]

    def run(j: int) -> None:
        a, b = sets.sets[j]
        correctness.vendor(t, a, b, out=outs[j], epi=sets.epis[j])

    own = sum(x.numel() * x.element_size() for x in outs)
    return capture(run, nsets, calls, keep=(sets, outs), own_bytes=own)


def norm_graph(sets: TimingSets, nsets: int, calls: int) -> Captured:
    """torch's RMSNorm of A alone (``correctness.rmsnorm``: ``F.rms_norm``, what the
    runtime runs before a row-scaled call's twin, ``NORMED_TWINS``) on the timing sets,
    captured; its outputs live in the graph's pool. Timed beside a NORMED_TWINS target's
    candidates, it lets the selection price the twin path in their process
    (``pipeline.select.prefer_twins``)."""
    return capture(lambda j: correctness.rmsnorm(sets.sets[j][0]), nsets, calls, keep=(sets,))


def rival_graph(
    rival: Mapping[str, Any], handle: int, t: Target, sets: TimingSets, nsets: int, calls: int
) -> Captured:
    """A run-off's rival (``Job.rival``): the recorded cuBLASLt algorithm on the timing
    sets through ``handle`` (the worker's, ``VendorSpread.lt``), captured as torch's
    graph is (its outputs and workspace its own, kept with the graph). Raises where this
    process's cuBLASLt is not the recorded one: its algorithm would not be the one the
    table dispatches."""
    import torch

    if int(rival["version"]) != version():
        raise RuntimeError(
            f"rival {rival['design_key']}: recorded with cuBLASLt {rival['version']}, "
            f"this worker has {version()}"
        )
    outs = [torch.empty((t.m, t.n), dtype=a.dtype, device=correctness.DEVICE) for a, _ in sets.sets]
    args = [
        dense_gemm(t, a.data_ptr(), b.data_ptr(), c.data_ptr())
        for (a, b), c in zip(sets.sets, outs, strict=True)
    ]
    gemm = cublaslt.LtGemm(handle, bytes.fromhex(rival["algo"]), t.dtype, t.layout, args[0])
    ws = torch.empty(max(gemm.workspace_bytes, 1), dtype=torch.uint8, device=correctness.DEVICE)

    def run(j: int) -> None:
        gemm.run(args[j], ws.data_ptr(), ws.numel(), _stream())

    own = sum(x.numel() * x.element_size() for x in outs) + ws.numel()
    return capture(run, nsets, calls, keep=(sets, outs, ws, gemm), own_bytes=own)


def _check_and_time(
    job: Job,
    run: Callable[[Any, Any, Any], None],
    gpu_name: str,
    vendor_errors: correctness.VendorErrors,
    pdl_pair_check: bool = False,
    inputs: Fresh | None = None,
    phases: dict[str, float] | None = None,
) -> JobResult:
    """The correctness suite on ``run(a, b, c)`` (and, for a PDL design, the pair
    check), then its timing beside torch. The trials and the timing's operand sets
    depend on (target, seed) only: ``inputs`` may keep them across jobs, and torch's
    graph over the sets too."""
    import torch

    t, cfg = job.target, job.timing
    inputs = inputs or Fresh()
    with _phase(phases, "correctness"):
        result = correctness.check(t, run, cfg.seed, vendor_errors=vendor_errors, inputs=inputs)
    checked = JobResult(
        job,
        Status.INCORRECT,
        max_abs_err=result.max_abs_err,
        max_rel_err=result.max_rel_err,
        # the vendor spread the correctness bound came from
        metrics=(
            {"vendor_max_abs_err": result.vendor_max_abs_err, "bound_vendors": len(result.vendors)}
            if result.vendors
            else {}
        ),
    )
    if not result.ok:
        return dataclasses.replace(checked, error=result.error)
    if pdl_pair_check:
        gen = correctness.generator(cfg.seed, t, "pdl_pair")
        with _phase(phases, "pdl_pair"):
            checked = pdl_pair.recorded(checked, pdl_pair.check(t, run, gen))
        if checked.error:
            return checked
    # Time on operand sets rotated past L2 (the same function the benchmarks use). A
    # fused epilogue's baseline is torch's unfused op (the vendor GEMM, then the add;
    # torch's RMSNorm before it and the gated activation after it where the epilogue
    # has them: correctness.vendor).
    # The sets (A, B, bias) are shared by the jobs of the target; what the candidate
    # writes is the job's own: its outputs, and its residuals (copied: an in-place
    # epilogue). torch's graph (its own outputs, reading the sets) is the target's.
    est_us = max(floor_us(t, gpu_name), 2.0)
    nsets = operand_sets(t.min_bytes)
    with _phase(phases, "operands"):
        pool = inputs.timing(t, cfg.seed, nsets)
        sets, epis = pool.sets, pool.for_job()
        outs = [
            torch.empty((t.m, t.out_n), dtype=a.dtype, device=correctness.DEVICE) for a, _ in sets
        ]
    # Kept across the jobs of the target, torch's graph is replayed, warmed up and
    # interleaved with the candidate's exactly as one captured in this job: the same
    # calls on the same sets, each writing outputs only it reads back, so its samples
    # mean what they meant (TIMING_METHOD unchanged; docs/measuring.md).
    with _phase(phases, "timing_capture"):
        calls = replay_calls(nsets, cfg, est_us)
        baseline = inputs.baseline(t, cfg, nsets, calls, lambda s: torch_graph(t, s, nsets, calls))
        baselines: dict[str, Any] = {"torch": baseline}
        if t.epilogue in NORMED_TWINS:
            baselines[NORM_BASELINE] = inputs.baseline(
                t, cfg, nsets, calls, lambda s: norm_graph(s, nsets, calls), NORM_BASELINE
            )
        if job.rival:  # a run-off: the rival algorithm, the job's own (not the target's)
            try:
                if not isinstance(vendor_errors, VendorSpread):
                    raise RuntimeError("a rival needs nvmath-python in the measuring worker")
                lt = vendor_errors.lt
                baselines[job.rival["design_key"]] = rival_graph(
                    job.rival, lt, t, pool, nsets, calls
                )
            except Exception as exc:  # noqa: BLE001 - the rival's fault, not the kernel's
                # timed without it: the record says nothing of the rival, and the
                # run-off decides nothing (pipeline.runoff says so)
                print(f"run-off of {t.label}: rival not timed: {exc}", file=sys.stderr)
    if t.epilogue == "none":

        def candidate(j: int) -> None:
            run(sets[j][0], sets[j][1], outs[j])

    else:

        def candidate(j: int) -> None:
            run(sets[j][0], sets[j][1], outs[j], epis[j])

    timings = time_interleaved(
        {"candidate": candidate, **baselines},
        nsets,
        cfg,
        est_us=est_us,
        phases=phases,
        stop=clearly_slower,
        stop_after=STOP_AFTER,
    )
    got = timings["candidate"].samples_us
    return dataclasses.replace(
        checked,
        status=Status.OK,
        samples_us=tuple(got),
        baseline_samples_us={k: tuple(timings[k].samples_us) for k in baselines},
        # a timing stopped early says so (and why) beside its fewer samples
        metrics=checked.metrics
        | ({"timing_stopped_below": STOP_BELOW} if len(got) < cfg.reps else {}),
    )


# A candidate slower than torch by this much in each of the first STOP_AFTER paired
# repetitions of its timing (torch's time over its own, every one below STOP_BELOW) is
# not timed further (tinygrad's rule, against the vendor in the same job): it cannot be
# selected (selection takes a kernel only where it beats every vendor beyond the
# spread), and its speedup, which the policy learns from, is already known to a few per
# cent. Its record keeps the STOP_AFTER samples of each and says it stopped.
STOP_AFTER = 5
STOP_BELOW = 0.8


def clearly_slower(samples: Mapping[str, Sequence[float]]) -> bool:
    """``time_interleaved``'s ``stop``: every paired repetition so far has the candidate
    below ``STOP_BELOW`` of torch's speed."""
    pairs = list(zip(samples["candidate"], samples["torch"], strict=True))
    return bool(pairs) and all(t / c < STOP_BELOW for c, t in pairs)


def prepare(
    t: Target,
    cfg: TimingConfig,
    gpu_name: str,
    vendor_errors: correctness.VendorErrors,
    inputs: InputCache,
) -> None:
    """What the first job of ``t`` would make, made ahead into ``inputs``: the checks'
    trials, references and vendor errors (``correctness.prepare``), the timing sets and
    torch's graph over them. Nothing is timed and nothing answered."""
    correctness.prepare(t, cfg.seed, vendor_errors=vendor_errors, inputs=inputs)
    nsets = operand_sets(t.min_bytes)
    calls = replay_calls(nsets, cfg, max(floor_us(t, gpu_name), 2.0))
    inputs.baseline(t, cfg, nsets, calls, lambda s: torch_graph(t, s, nsets, calls))


def run_vendor_job(
    job: Job,
    gpu_name: str,
    vendor_errors: correctness.VendorErrors,
    inputs: Fresh | None = None,
    phases: dict[str, float] | None = None,
) -> JobResult:
    """cuBLASLt autotuning of one target: every heuristic candidate timed, the fastest
    that passes the same correctness suite as a kernel timed again beside torch. The
    answer carries the algorithm (``vendor``) so the table can dispatch it."""
    import torch

    if not isinstance(vendor_errors, VendorSpread):
        raise RuntimeError("cuBLASLt autotuning needs nvmath-python in the measuring worker")
    t, cfg = job.target, job.timing
    inputs = inputs or Fresh()
    lt = vendor_errors.problem(t)
    nsets = operand_sets(t.min_bytes)
    # the target's timing pool (the kernels' jobs time on the same sets)
    sets = inputs.timing(t, cfg.seed, nsets).sets
    outs = [torch.empty((t.m, t.n), dtype=a.dtype, device="cuda") for a, _ in sets]

    def run_of(i: int) -> Callable[[int], None]:
        return lambda j: lt.run(
            i, sets[j][0].data_ptr(), sets[j][1].data_ptr(), outs[j].data_ptr(), _stream()
        )

    est = max(floor_us(t, gpu_name), 2.0)
    with _phase(phases, "autotune"):
        order, tuned = autotune(lt, run_of, nsets, max(5, cfg.reps // 3), cfg.seed, est)
    outs.clear()
    # No algorithm tried: a failure without a ``vendor`` (the build counts it, records nothing).
    res = JobResult(job, Status.RUNTIME, "cuBLASLt's heuristic offered no algorithm")
    for i in order[:CHECKED_ALGOS]:

        def run(a, b, c, i=i) -> None:
            lt.run(i, a.data_ptr(), b.data_ptr(), c.data_ptr(), _stream())

        res = _check_and_time(job, run, gpu_name, vendor_errors, inputs=inputs, phases=phases)
        config = lt.algo_config(i)
        vendor = {
            "library": "cublaslt",
            "version": version(),
            "algo": lt.algo_bytes(i).hex(),
            "workspace_bytes": lt.workspace_of(i),
            "config": config,
            "name": algo_name(config),
            "heuristic_index": i,
            "candidates": lt.count,
            "candidates_us": [round(tuned[f"lt{x}"].median_us, 4) for x in range(lt.count)],
        }
        res = dataclasses.replace(res, vendor=vendor)
        if res.status == Status.OK:
            break
    return res


def _is_cuda_error(exc: BaseException) -> bool:
    text = str(exc)
    return (
        isinstance(exc, driver.CudaDriverError)
        or "CUDA error" in text
        or "cuda" in type(exc).__module__
    )


def process_age_s() -> float | None:
    """Seconds since this process was started (Linux: /proc), None where unknown: in a
    spawned worker, what the spawn and the imports before ``worker_main`` took."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return round(uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"), 3)
    except (OSError, ValueError, IndexError):
        return None


class _Steps:
    """Seconds of each start-up step, in order (the worker's hello carries them)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    def done(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self._t, 3)
        self._t = now


def worker_main(conn, device: int) -> None:
    """Entry point of the worker process (spawned, never forked). Its hello carries
    the GPU, the cuBLASLt version and ``startup_s``: the seconds of each start-up step
    (``before_main``: the spawn and the imports before this function ran)."""
    steps = _Steps()
    before_main = process_age_s()
    import torch

    steps.done("import_torch")
    os.environ.setdefault("CUDA_MODULE_LOADING", "LAZY")
    torch.cuda.set_device(device)
    torch.cuda.init()
    steps.done("cuda_init")
    driver.ensure_context(device)
    steps.done("driver_context")
    gpu = current_gpu(device)
    steps.done("gpu_info")
    # The correctness bound is the spread of every vendor baseline where nvmath-python
    # (cuBLAS, cuBLASLt) is installed, torch.matmul's error alone otherwise. Its
    # handles and workspaces are made at its first use (a job), not here.
    vendor_errors: correctness.VendorErrors = correctness.torch_error
    if nvmath_available():
        vendor_errors = VendorSpread()
    steps.done("nvmath_import")
    # The cuBLASLt version the worker autotunes with: the build reuses vendor records
    # of that version only (an algorithm belongs to the library that offered it).
    lt_version = version() if isinstance(vendor_errors, VendorSpread) else None
    steps.done("cublaslt_version")
    startup = {"before_main": before_main, **steps.seconds}
    startup["in_main"] = round(sum(steps.seconds.values()), 3)
    # What every candidate of a target shares (trials, references, vendor errors,
    # timing operand sets, torch's graph), kept on this worker's GPU.
    inputs = InputCache(bound_bytes(torch.cuda.mem_get_info(device)[0]))
    conn.send({"hello": gpu.as_json(), "cublaslt_version": lt_version, "startup_s": startup})
    # (the build's log has the worker's stderr: where its start-up went, on any runner)
    steps_text = ", ".join(f"{k} {v}" for k, v in startup.items())
    print(f"measuring worker on device {device}: start-up s: {steps_text}", file=sys.stderr)
    serve(
        conn,
        lambda job: run_job(job, device, gpu.name, vendor_errors, inputs),
        lambda t, cfg: prepare(t, cfg, gpu.name, vendor_errors, inputs),
        inputs,
    )


def serve(
    conn,
    answer: Callable[[Job], JobResult],
    ready: Callable[[Target, TimingConfig], None],
    inputs: InputCache,
) -> None:
    """The worker's loop: each job read is answered (``answer``) at once; targets to
    prepare (``{"prepare": [[target, timing], ...]}``, no answer) are readied
    (``ready``, into ``inputs``' free room) one at a time while no message waits.
    ``None`` ends it."""
    todo: deque[tuple[Target, TimingConfig]] = deque()
    read = 0  # prepare messages read
    done, busy_s = 0, 0.0  # targets prepared, and their seconds (logged once all are)
    while True:
        if todo and not conn.poll(0):
            t, cfg = todo.popleft()
            t0 = time.perf_counter()
            try:
                with inputs.without_eviction():
                    ready(t, cfg)
            except Exception as exc:  # noqa: BLE001 - a hint that failed: the job does it
                if _is_cuda_error(exc):  # poisoned: leave (the pool starts a fresh worker)
                    print(f"preparing {t.label}: {exc}", file=sys.stderr)
                    conn.close()
                    os._exit(3)
                why = f"preparing {t.label} failed (its first job makes it): {exc}"
                print(why, file=sys.stderr)
                continue
            if inputs.full:  # the rest would only push out what jobs will use sooner
                print(
                    f"the cache filled while preparing {t.label} "
                    f"({inputs.bytes / 2**30:.1f} of {inputs.max_bytes / 2**30:.1f} GiB); "
                    f"{len(todo)} targets left to their first jobs",
                    file=sys.stderr,
                )
                todo.clear()
            done, busy_s = done + 1, busy_s + time.perf_counter() - t0
            if not todo:  # (the build's log has the worker's stderr)
                print(
                    f"prepared {done} targets in {busy_s:.1f} s between jobs "
                    f"(cache {inputs.bytes / 2**30:.1f} of {inputs.max_bytes / 2**30:.1f} GiB)",
                    file=sys.stderr,
                )
                done, busy_s = 0, 0.0
            continue
        msg = conn.recv()
        if msg is None:
            return
        if "prepare" in msg:
            read += 1
            todo.extend((Target.from_json(t), TimingConfig.from_json(c)) for t, c in msg["prepare"])
            continue
        job = Job.from_json(msg)
        seen = {"prepares_read": read, "preparing": len(todo)}
        try:
            conn.send({"result": answer(job).as_json(), **seen})
        except Exception as exc:  # noqa: BLE001 - every failure is a result, recorded
            fatal = _is_cuda_error(exc)
            error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}"
            failed = JobResult(job, Status.RUNTIME, error).as_json()
            conn.send({"result": failed, "fatal": fatal, **seen})
            if fatal:  # the context is poisoned: leave, the parent starts a fresh worker
                conn.close()
                os._exit(3)
