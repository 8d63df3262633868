"""Nsight Compute metrics of a few kernels: the profiling feedback of the search.

Each kernel runs once, in a child process under ``ncu --clock-control none`` (the
GPU is measured as found; its clocks are never locked), on random operands of its
target. The child imports no torch (its import was ~4 s of every round's ~12 s on the
H100): buffers, copies and the launch go through the CUDA driver's bindings. ncu
replays the launch as many times as its counters need, flushing the caches before
each pass. The report is read back as CSV (``ncu --import``),
one row per profiled launch, in launch order.

Metric names differ across GPUs and ncu versions, so each quantity lists
alternatives; a name ncu does not know is dropped and the next one tried (a whole
ncu run each time). What ncu refused is remembered for the rest of the process, so
only a build's first profiling round pays for it. What could not be collected is
simply absent: profiling informs the search and never decides whether a kernel is
correct or fast.

Where the seconds go (``ProfileResult.seconds``, and one line on stderr per call):
each ncu run's wall time, and the child's own phases (imports, CUDA start-up,
operands, module loads, the launches, which under ncu include its replays).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal2.generator.space import design_name, launch_recipe
from cudal2.records import KernelDesign, Target
from cudal2.verify.gpu import visible_device

# Our name -> ncu metric names, preferred first. Percentages are of the peak.
METRICS: dict[str, tuple[str, ...]] = {
    "ncu_sm_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    "ncu_dram_pct": (
        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    ),
    "ncu_tensor_pct": (
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active",
    ),
    "ncu_occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "ncu_l2_hit_pct": ("lts__t_sector_hit_rate.pct",),
    "ncu_duration_us": ("gpu__time_duration.sum",),
    "ncu_dram_bytes": ("dram__bytes.sum",),
}
_SCALE = {"ncu_duration_us": 1e-3}  # ncu reports base units: ns
# What the search reads (``policy/reward.py``'s ``entry``: the DRAM and tensor-pipe
# shares), and the duration: a timestamp pair of the launch, not a hardware counter, so
# it should cost no replay pass of its own (``ci/ncu_passes.py`` counts). With the other
# four too, ncu replayed each kernel 9 times on the H100: ``sm__throughput`` is a
# breakdown (the max over many units' throughputs, each its own counters), and L2 hits,
# occupancy and DRAM bytes add counters of their own.
SEARCH_QUANTITIES: tuple[str, ...] = ("ncu_dram_pct", "ncu_tensor_pct", "ncu_duration_us")
# A manifest's ``search.profile_metrics`` -> the quantities collected.
QUANTITY_SETS: dict[str, tuple[str, ...]] = {"search": SEARCH_QUANTITIES, "all": tuple(METRICS)}
_PASSES_RE = re.compile(r"==PROF== Profiling .*- (\d+) pass(?:es)?\s*$", re.M)
KERNEL_PREFIX = "hgemm_"  # every family's procedural kernel names start so
_UNKNOWN_RE = re.compile(r"Failed to find metric\s+'?([A-Za-z0-9_.]+)'?")


@dataclass
class ProfileResult:
    metrics: list[dict[str, float]]  # per job, in job order ({} where none came back)
    error: str = ""
    names: dict[str, str] = field(default_factory=dict)  # our name -> ncu metric used
    csv: str = ""  # the imported report, as ncu printed it
    log: str = ""  # ncu's own output of the profiling run
    # Where the seconds went: "ncu_run_<i>" each ncu run (wall), "child_<phase>" the
    # profiled child's own phases (its last run), "import" the report's CSV export
    seconds: dict[str, float] = field(default_factory=dict)
    passes: list[int] = field(default_factory=list)  # ncu's replay passes per kernel


def quantities(choice: str) -> tuple[str, ...]:
    """The quantities (``METRICS`` keys) a manifest's ``search.profile_metrics`` names."""
    try:
        return QUANTITY_SETS[choice]
    except KeyError:
        raise ValueError(
            f"unknown profile metric set {choice!r}: one of {', '.join(QUANTITY_SETS)}"
        ) from None


def passes_of(log: str) -> list[int]:
    """The replay passes ncu reported per profiled kernel (``==PROF== Profiling "k":
    0%....100% - 9 passes``), in launch order."""
    return [int(n) for n in _PASSES_RE.findall(log)]


# ncu path -> metric names it reported unknown (this process: later rounds skip them)
_UNKNOWN: dict[str, set[str]] = {}


def job(cubin: Path, design: KernelDesign, target: Target) -> dict[str, Any]:
    """One kernel launch to profile: its cubin, symbol, launch recipe and target."""
    return {
        "cubin": str(cubin),
        "symbol": design_name(design),
        "recipe": launch_recipe(design),
        "target": target.as_json(),
    }


def is_profiled(metrics: dict[str, float]) -> bool:
    return any(k in METRICS for k in metrics)


def find_ncu() -> str | None:
    return shutil.which("ncu") or next(
        (p for p in ("/usr/local/cuda/bin/ncu",) if os.path.exists(p)), None
    )


def parse_raw_csv(text: str, names: dict[str, str]) -> list[dict[str, float]]:
    """``ncu --import R --csv --page raw --print-units base`` -> one dict per launch,
    in launch (ID) order, keyed by our names. Rows before the header (ncu's own
    messages) and the units row are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError('no ncu CSV header (a line starting with "ID") in the report')
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, data = rows[0], rows[1:]
    col = {h: i for i, h in enumerate(header)}
    out: list[tuple[int, dict[str, float]]] = []
    for row in data:
        if len(row) != len(header) or not row[col["ID"]].strip().isdigit():
            continue  # the units row, or a truncated one
        vals: dict[str, float] = {}
        for ours, metric in names.items():
            if metric not in col:
                continue
            raw = row[col[metric]].replace(",", "").strip()
            try:
                vals[ours] = round(float(raw) * _SCALE.get(ours, 1.0), 4)
            except ValueError:
                continue  # "n/a"
        out.append((int(row[col["ID"]]), vals))
    return [v for _, v in sorted(out, key=lambda x: x[0])]


def ncu_command(
    ncu: str, metrics: list[str], report: Path, job_file: Path, phases: Path, launches: int
) -> list[str]:
    """The profiling run. ``--clock-control none``: the GPU as found, clocks never
    locked (as the timing sees it). Kernel replay with the caches flushed before each
    pass (ncu's defaults, stated). Only the candidates' kernels (``--kernel-name``),
    ``launches`` of them (``--launch-count``: ncu stops intercepting after the last),
    in the child only (``--target-processes application-only``)."""
    return [
        ncu,
        "--clock-control",
        "none",
        "--replay-mode",
        "kernel",
        "--cache-control",
        "all",
        "--target-processes",
        "application-only",
        "--kernel-name",
        f"regex:^{KERNEL_PREFIX}",
        "--launch-count",
        str(launches),
        "--metrics",
        ",".join(metrics),
        "--export",
        str(report),
        "--force-overwrite",
        sys.executable,
        "-m",
        "cudal2.verify.profile",
        str(job_file),
        str(phases),
    ]


def profile(
    jobs: list[dict[str, Any]],
    timeout_s: float = 900,
    device: int | None = None,
    wanted: Sequence[str] = (),
) -> ProfileResult:
    """``jobs``: dicts with cubin, symbol, recipe and target (as ``Target.as_json``),
    launched under ncu on CUDA device ``device`` of this process (None: the child sees
    what this process sees and runs on its device 0). ``wanted``: the quantities
    collected (``METRICS`` keys; empty: every one): fewer counters, fewer replays."""
    unasked = sorted(set(wanted) - set(METRICS))
    if unasked:
        raise ValueError(f"unknown Nsight Compute quantities {unasked}: {', '.join(METRICS)}")
    if not jobs:
        return ProfileResult([])
    ncu = find_ncu()
    if ncu is None:
        return ProfileResult([{} for _ in jobs], "ncu not found (Nsight Compute)")
    unknown = _UNKNOWN.setdefault(ncu, set())
    alt = {
        k: [m for m in v if m not in unknown]
        for k, v in METRICS.items()
        if not wanted or k in wanted
    }
    seconds: dict[str, float] = {}
    env = dict(os.environ)
    if device is not None:  # ncu's child sees that GPU alone, as its device 0
        env["CUDA_VISIBLE_DEVICES"] = visible_device(device)
    with tempfile.TemporaryDirectory(prefix="cudal2-ncu-") as tmp:
        job_file = Path(tmp) / "jobs.json"
        job_file.write_text(json.dumps(jobs))
        report = Path(tmp) / "report"
        phases = Path(tmp) / "phases.json"
        for attempt in range(1 + sum(len(v) for v in METRICS.values())):
            names = {k: v[0] for k, v in alt.items() if v}
            if not names:
                return ProfileResult([{} for _ in jobs], "ncu knows none of the metrics")
            cmd = ncu_command(ncu, list(names.values()), report, job_file, phases, len(jobs))
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(
                    cmd, capture_output=True, text=True, timeout=timeout_s, env=env
                )
            except subprocess.TimeoutExpired:
                return ProfileResult([{} for _ in jobs], f"ncu timed out after {timeout_s:.0f} s")
            seconds[f"ncu_run_{attempt + 1}"] = round(time.perf_counter() - t0, 3)
            text = proc.stdout + proc.stderr
            refused = set(_UNKNOWN_RE.findall(text))
            if not refused:
                break
            unknown |= refused
            for v in alt.values():
                if v and v[0] in refused:
                    v.pop(0)  # not known here: try the next name
        else:
            return ProfileResult([{} for _ in jobs], f"ncu: no usable metric set\n{text[-2000:]}")
        seconds.update(child_seconds(phases))
        if proc.returncode != 0:
            return ProfileResult([{} for _ in jobs], f"ncu: exit {proc.returncode}\n{text[-2000:]}")
        t0 = time.perf_counter()
        imported = subprocess.run(
            [ncu, "--import", f"{report}.ncu-rep", "--csv", "--page", "raw"]
            + ["--print-units", "base"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        seconds["import"] = round(time.perf_counter() - t0, 3)
        if imported.returncode != 0:
            return ProfileResult(
                [{} for _ in jobs], f"ncu --import: exit {imported.returncode}\n{imported.stderr}"
            )
        rows = parse_raw_csv(imported.stdout, names)
    passes = passes_of(text)
    print(summary(len(jobs), seconds, sorted(unknown), passes), file=sys.stderr, flush=True)
    if len(rows) != len(jobs):
        return ProfileResult(
            [{} for _ in jobs], f"ncu profiled {len(rows)} launches, expected {len(jobs)}"
        )
    return ProfileResult(rows, "", names, imported.stdout, text[-20000:], seconds, passes)


def child_seconds(path: Path) -> dict[str, float]:
    """The child's phases (``child_<phase>``), {} where it wrote none (it failed)."""
    try:
        return {f"child_{k}": float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def summary(
    kernels: int, seconds: dict[str, float], unknown: list[str], passes: Sequence[int] = ()
) -> str:
    """One line: where a profiling call's seconds went (and ncu's replay passes per
    kernel, where its log said)."""
    runs = [v for k, v in seconds.items() if k.startswith("ncu_run_")]
    child = ", ".join(
        f"{k.removeprefix('child_')} {v:.1f}" for k, v in seconds.items() if k.startswith("child_")
    )
    low, high = (min(passes), max(passes)) if passes else (0, 0)
    per_kernel = f", {low}{f'-{high}' if high > low else ''} passes per kernel" if passes else ""
    return (
        f"ncu: {kernels} kernels, {len(runs)} run(s) "
        f"{' + '.join(f'{r:.1f}' for r in runs)} s{per_kernel}"
        f" (child: {child or 'no phases'}); report import {seconds.get('import', 0.0):.1f} s"
        + (f"; metrics ncu does not know, skipped: {', '.join(unknown)}" if unknown else "")
    )


# The profiled child's operands: each its first this many uniform values (as the
# memcheck child's, ``sanitizer.host_operands``), repeated on the GPU to its size. Drawing
# every value on the host would cost more than the torch import it replaces (a round's
# 24 llama targets read 1.3 G values), and ncu counts what the kernel does with its
# operands, never its result.
OPERAND_BLOCK = 1 << 19


def _child(job_path: str, phases_path: str | None = None) -> None:
    """Runs under ncu: each job's kernel launched once, in job order, on random operands
    in memory of its own, on the legacy default stream. Writes its phase seconds to
    ``phases_path`` (JSON) when given. Its imports are the CUDA driver's bindings and the
    runtime's launcher, as the memcheck child's (``sanitizer._child``): the tensor
    library's import was ~4 s of each round's child on the H100 (the module's doc)."""
    steps: dict[str, float] = {}
    t = time.perf_counter()

    def done(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        steps[name] = round(steps.get(name, 0.0) + now - t, 3)
        t = now

    from cudal2.packaging.runtime import driver
    from cudal2.records import ROPE_KV
    from cudal2.verify import rope_kv
    from cudal2.verify.launch import dense_epilogue, launch_dense
    from cudal2.verify.sanitizer import host_operands, operand_shapes

    drv = driver._driver()
    check = driver._check
    done("imports")
    driver.ensure_context(0)
    done("cuda_init")
    for job in json.loads(Path(job_path).read_text()):
        target = Target.from_json(job["target"])
        shapes = operand_shapes(target)
        ptrs: dict[str, int] = {}
        try:
            for name, block in host_operands(target, most=OPERAND_BLOCK).items():
                nbytes = 2 * math.prod(shapes[name])
                ptrs[name] = int(check(drv.cuMemAlloc(nbytes), f"cuMemAlloc({name})"))
                fill_repeated(drv, ptrs[name], nbytes, block)
            # the output: [M, out_n] (N/2 columns for a gated epilogue)
            ptrs["c"] = int(check(drv.cuMemAlloc(target.m * target.out_n * 2), "cuMemAlloc(c)"))
            rope = None
            if target.epilogue in ROPE_KV:  # the int64 positions, then the operands' record
                host = rope_kv.host_positions(target)
                ptrs["positions"] = int(check(drv.cuMemAlloc(host.nbytes), "cuMemAlloc(pos)"))
                check(drv.cuMemcpyHtoD(ptrs["positions"], host, host.nbytes), "cuMemcpyHtoD")
                rope = rope_kv.contiguous_args(target, ptrs, ptrs["positions"])
            ops = dense_epilogue(target, ptrs.get("bias", 0), ptrs.get("residual", 0), rope)
            check(drv.cuCtxSynchronize(), "cuCtxSynchronize")
            done("operands")
            kernel = driver.Kernel(
                Path(job["cubin"]).read_bytes(), job["symbol"], job["recipe"]["smem_bytes"]
            )
            done("module_load")
            launch_dense(
                kernel, job["recipe"], target, ptrs["a"], ptrs["b"], ptrs["c"], 0, epilogue=ops
            )
            check(drv.cuCtxSynchronize(), "cuCtxSynchronize")
            done("launches")  # under ncu: its replays of the launch, too
        finally:
            for ptr in ptrs.values():
                drv.cuMemFree(ptr)
    if phases_path:
        Path(phases_path).write_text(json.dumps(steps))


def fill_repeated(drv: Any, ptr: int, nbytes: int, block: Any) -> list[tuple[int, int, int]]:
    """Device memory ``[ptr, ptr + nbytes)`` filled with ``block`` (host bytes) repeated:
    one copy from the host, then device-to-device copies of what is filled, doubling.
    Returns the copies made, as (destination, source or -1 for the host, bytes)."""
    first = min(block.nbytes, nbytes)
    copies = [(ptr, -1, first)]
    driver_check(drv.cuMemcpyHtoD(ptr, block, first), "cuMemcpyHtoD")
    filled = first
    while filled < nbytes:
        n = min(filled, nbytes - filled)
        driver_check(drv.cuMemcpyDtoD(ptr + filled, ptr, n), "cuMemcpyDtoD")
        copies.append((ptr + filled, ptr, n))
        filled += n
    return copies


def driver_check(result: tuple, what: str) -> Any:
    """``driver._check`` (imported late: importing this module touches no CUDA)."""
    from cudal2.packaging.runtime import driver

    return driver._check(result, what)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
