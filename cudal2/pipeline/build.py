"""The build pipeline: manifest -> proposals -> cubins -> measurements -> selection -> wheel.

Each stage resumes from what is on disk: compiled kernels come from the artifact
cache, measurements from the append-only database (reused per GPU model, target,
artifact and timing mode), so a killed build re-run repeats no finished work.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from cudal2 import __version__
from cudal2.database import MeasurementDB, latest
from cudal2.generator import design_name, launch_recipe
from cudal2.generator.compile import ArtifactCache, artifact_key_of, build_all
from cudal2.generator.render import IllegalDesignError
from cudal2.manifest import Manifest
from cudal2.packaging.runtime.table import DispatchTable
from cudal2.packaging.wheel import package_name, write_wheel
from cudal2.pipeline.dispatch import build_table
from cudal2.pipeline.select import Selection, select
from cudal2.policy import make_proposer
from cudal2.records import (
    BuildResult,
    GpuInfo,
    KernelDesign,
    Measurement,
    Target,
    canonical_json,
    sha256_hex,
)
from cudal2.verify.gpu import gpu_names
from cudal2.verify.profile import find_ncu, is_profiled, job, profile
from cudal2.verify.sanitizer import PREFIX as SANITIZER_PREFIX
from cudal2.verify.sanitizer import memcheck
from cudal2.verify.timing import TIMING_METHOD, Timing, TimingConfig


class BuildError(RuntimeError):
    """The build cannot go on; the message says why and what to do."""


@dataclass
class BuildReport:
    wheel: Path
    table: DispatchTable
    selections: list[Selection]
    missing: list[Target]
    measured: int = 0
    reused: int = 0
    compiled: int = 0
    failures: dict[str, int] = field(default_factory=dict)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def toolchain_of(build: BuildResult) -> str:
    """What, besides the artifact, a measurement depends on: nvcc and the timing method."""
    return f"{build.nvcc_version}; {TIMING_METHOD}"


def _timed(target: Target, result: dict[str, Any]) -> dict[str, Any]:
    """The timing fields of a worker's answer and the metrics derived from them."""
    samples = tuple(result.get("samples_us", ()))
    base_samples = {k: tuple(v) for k, v in result.get("baseline_samples_us", {}).items()}
    median = _median(samples)
    metrics: dict[str, float] = {}
    if result.get("vendors"):  # the vendor spread the correctness bound came from
        metrics["vendor_max_abs_err"] = result["vendor_max_abs_err"]
        metrics["bound_vendors"] = result["vendors"]
    if median:
        metrics["tflops"] = round(target.flops / (median * 1e-6) / 1e12, 3)
        metrics["gbps"] = round(target.min_bytes / (median * 1e-6) / 1e9, 2)
    spread = None
    if samples and "torch" in base_samples:
        spread = max(Timing(samples).spread, Timing(base_samples["torch"]).spread)
    return {
        "status": result["status"],
        "error": result.get("error", ""),
        "max_abs_err": result.get("max_abs_err"),
        "max_rel_err": result.get("max_rel_err"),
        "samples_us": samples,
        "median_us": median,
        "baselines_us": {k: statistics.median(v) for k, v in base_samples.items()},
        "baseline_samples_us": base_samples,
        "spread": spread,
        "metrics": metrics,
    }


def measurement_from(
    target: Target,
    design: KernelDesign,
    build: BuildResult,
    result: dict[str, Any],
    gpu: GpuInfo,
    proposer: str,
    mode: str,
) -> Measurement:
    """A worker's answer (or a compile failure) as a typed record with derived metrics."""
    timed = _timed(target, result)
    metrics: dict[str, float] = {}
    if build.registers is not None:
        metrics["registers"] = build.registers
        metrics["spill_bytes"] = build.spill_bytes or 0
    if build.ok:
        recipe = launch_recipe(design)
        tiles = -(-target.m // recipe["tile_m"]) * -(-target.n // recipe["tile_n"])
        metrics["waves"] = round(tiles / gpu.sm_count, 4)
        metrics["smem_bytes"] = recipe["smem_bytes"]
    timed["metrics"] = {**metrics, **timed["metrics"]}
    return Measurement(
        target=target,
        design=design,
        design_key=design.key,
        artifact_key=build.artifact_key,
        gpu=gpu,
        proposer=proposer,
        tool_version=__version__,
        toolchain=toolchain_of(build),
        measured_at=_now(),
        mode=mode,
        **timed,
    )


VENDOR_PROPOSER = "cublaslt-autotune"


def vendor_toolchain(version: int) -> str:
    """What a cuBLASLt record depends on besides its algorithm: the library's version
    and the timing method."""
    return f"cublasLt {version}; {TIMING_METHOD}"


def vendor_measurement(
    target: Target, result: dict[str, Any], gpu: GpuInfo, mode: str
) -> Measurement:
    """A vendor job's answer (cuBLASLt autotuning) as a record that the selection can
    weigh against the kernels and a table can dispatch."""
    vendor = result["vendor"]
    key = sha256_hex(canonical_json({k: vendor[k] for k in ("library", "version", "algo")}))
    timed = _timed(target, result)
    timed["metrics"]["workspace_bytes"] = vendor["workspace_bytes"]
    return Measurement(
        target=target,
        design=None,
        design_key=f"cublaslt:{key}",
        artifact_key=f"cublaslt:{key}",
        gpu=gpu,
        proposer=VENDOR_PROPOSER,
        tool_version=__version__,
        toolchain=vendor_toolchain(vendor["version"]),
        measured_at=_now(),
        mode=mode,
        vendor=vendor,
        **timed,
    )


def unsafe_artifacts(history: Sequence[Measurement]) -> set[str]:
    """Artifacts that failed compute-sanitizer on any target: they never ship."""
    return {x.artifact_key for x in history if x.error.startswith(SANITIZER_PREFIX)}


def shippable(unsafe: set[str]) -> Callable[[Measurement], bool]:
    """Whether a kernel measurement can ship: not unsafe, and its design renders and
    compiles to the measured artifact key (source, nvcc version, flags) here."""
    key_cache: dict[str, str] = {}

    def usable(x: Measurement) -> bool:
        if x.design is None or x.artifact_key in unsafe:
            return False
        if x.design_key not in key_cache:
            try:
                key_cache[x.design_key] = artifact_key_of(x.design)
            except IllegalDesignError:  # recorded under older legality rules
                key_cache[x.design_key] = ""
        return key_cache[x.design_key] == x.artifact_key

    return usable


def table_from_measurements(
    history: Sequence[Measurement], mode: str, cache: ArtifactCache, name: str
) -> tuple[DispatchTable, dict[str, bytes]]:
    """The dispatch table a build would make from these measurements, for every target
    they hold (winners compiled into ``cache``): what ``cudal2-bench --kernels DB`` runs."""
    history = latest(history)
    targets = sorted({x.target for x in history})
    selections, _ = select(targets, history, mode, shippable(unsafe_artifacts(history)))
    winners = [s.winner.design for s in selections if s.winner and s.winner.design]
    build_all(winners, cache)
    return build_table(
        name=name,
        version="0",
        package=package_name(name),
        manifest_sha256="",
        selections=selections,
        cubin_of=cache.cubin,
    )


class Build:
    def __init__(
        self,
        manifest: Manifest,
        db_path: Path,
        cache: ArtifactCache,
        out_dir: Path,
        *,
        remeasure: bool = False,
        measure: bool = True,
        jobs: int | None = None,
        device: int = 0,
        log: TextIO = sys.stderr,
    ):
        self.manifest = manifest
        self.db = MeasurementDB(db_path)
        self.cache = cache
        self.out_dir = out_dir
        self.remeasure = remeasure
        self.measure = measure
        self.jobs = jobs
        self.device = device
        self.log = log
        self.report_counts = {"measured": 0, "reused": 0, "compiled": 0}
        self.failures: dict[str, int] = {}
        self._sanitized: set[str] = set()

    def say(self, msg: str) -> None:
        print(msg, file=self.log, flush=True)

    # -- measuring (GPU machines) ---------------------------------------------------
    def _measure(self, history: list[Measurement]) -> None:
        from cudal2.verify.pool import WorkerPool

        m = self.manifest
        timing = TimingConfig(mode=m.timing_mode, seed=m.search.seed)
        with WorkerPool(self.device) as pool:
            gpu = pool.start()
            self.say(
                f"measuring on {gpu.name} ({gpu.arch}, driver {gpu.driver}, {gpu.sm_count} SMs)"
            )
            proposer = make_proposer(
                m.search.proposer,
                m.search.seed,
                m.search.families,
                gpu=gpu.name,
                updates=m.search.policy_updates,
            )
            describe = getattr(proposer, "describe", None)
            self.say(f"proposer: {describe() if describe else proposer.name}")
            targets = [t for t in m.targets if t.arch == gpu.arch]
            skipped = len(m.targets) - len(targets)
            if skipped:
                self.say(
                    f"{skipped} targets are for other archs than {gpu.arch}: not measured here"
                )
            # (GPU model, target, artifact, mode) -> the latest record: reused, not re-run.
            prior = {} if self.remeasure else {x.reuse_key: x for x in history}
            this_build: list[Measurement] = []
            started = time.monotonic()
            for rnd in range(m.search.rounds):
                proposals = {
                    t: proposer.propose(t, this_build, m.search.candidates) for t in targets
                }
                designs = [d for ds in proposals.values() for d in ds]
                builds = self._compile(designs, f"round {rnd + 1}/{m.search.rounds}: compile")
                jobs: list[tuple[Target, KernelDesign, BuildResult]] = []
                round_ms: list[Measurement] = []
                for t, ds in proposals.items():
                    for d in ds:
                        b = builds[d.key]
                        key = (gpu.name, t.key, b.artifact_key, toolchain_of(b), m.timing_mode)
                        old = prior.get(key)
                        if old is not None:
                            round_ms.append(old)
                            self.report_counts["reused"] += 1
                        elif not b.ok:
                            rec = measurement_from(
                                t,
                                d,
                                b,
                                {"status": "compile", "error": b.error},
                                gpu,
                                proposer.name,
                                m.timing_mode,
                            )
                            self.db.append([rec])
                            round_ms.append(rec)
                        else:
                            jobs.append((t, d, b))
                bar = tqdm(
                    jobs,
                    desc=f"round {rnd + 1}/{m.search.rounds}: measure",
                    unit="cand",
                    file=self.log,
                )
                for t, d, b in bar:
                    if time.monotonic() - started > m.search.gpu_budget_s:
                        self.say(
                            f"GPU-time budget of {m.search.gpu_budget_s:.0f} s spent: "
                            f"{len(jobs) - bar.n} candidates left unmeasured (re-run to continue)"
                        )
                        break
                    job = {
                        "target": t.as_json(),
                        "cubin_path": str(self.cache.entry(b.artifact_key) / "kernel.cubin"),
                        "symbol": b.symbol,
                        "recipe": launch_recipe(d),
                        "timing": dataclasses.asdict(timing),
                    }
                    rec = measurement_from(
                        t, d, b, pool.run(job), gpu, proposer.name, m.timing_mode
                    )
                    self.db.append([rec])  # at once: a killed build keeps what it measured
                    round_ms.append(rec)
                    self.report_counts["measured"] += 1
                    if rec.status != "ok":
                        self.failures[rec.status] = self.failures.get(rec.status, 0) + 1
                bar.close()
                round_ms = self._profile(round_ms, m.search.profile_top)
                this_build.extend(round_ms)
                learned = proposer.observe(round_ms)
                if learned:
                    self.say(learned)
            if m.search.cublaslt:
                self._autotune_vendor(pool, gpu, targets, history, timing, started)

    def _autotune_vendor(
        self,
        pool: Any,
        gpu: GpuInfo,
        targets: Sequence[Target],
        history: Sequence[Measurement],
        timing: TimingConfig,
        started: float,
    ) -> None:
        """cuBLASLt autotuning of every target without a record of this GPU model,
        cuBLASLt version and timing mode: its fastest correct algorithm becomes a
        candidate of the selection like any kernel."""
        m = self.manifest
        version = pool.cublaslt_version
        if version is None:
            self.say(
                "nvmath-python is not importable in the measuring worker: cuBLASLt is not "
                "autotuned (pip install nvmath-python; or set search.cublaslt = false)"
            )
            return
        toolchain = vendor_toolchain(version)
        done = set()
        if not self.remeasure:
            done = {
                x.target
                for x in history
                if x.is_vendor
                and x.gpu.name == gpu.name
                and x.mode == m.timing_mode
                and x.toolchain == toolchain
            }
        todo = [t for t in targets if t not in done]
        self.report_counts["reused"] += len(targets) - len(todo)
        bar = tqdm(todo, desc=f"cuBLASLt {version} autotune", unit="target", file=self.log)
        for t in bar:
            if time.monotonic() - started > m.search.gpu_budget_s:
                self.say(
                    f"GPU-time budget of {m.search.gpu_budget_s:.0f} s spent: "
                    f"{len(todo) - bar.n} targets left without cuBLASLt autotuning"
                )
                break
            job = {"kind": "cublaslt", "target": t.as_json(), "timing": dataclasses.asdict(timing)}
            result = pool.run(job)
            if "vendor" not in result:  # the job failed before any algorithm was tried
                self.failures["cublaslt"] = self.failures.get("cublaslt", 0) + 1
                self.say(f"cuBLASLt autotuning of {t.label} failed: {result.get('error', '')}")
                continue
            rec = vendor_measurement(t, result, gpu, m.timing_mode)
            self.db.append([rec])
            self.report_counts["measured"] += 1
            if rec.status != "ok":
                self.failures[rec.status] = self.failures.get(rec.status, 0) + 1
        bar.close()

    def _profile(self, ms: list[Measurement], top: int) -> list[Measurement]:
        """Nsight Compute metrics for each target's ``top`` fastest correct candidates
        of the round (unless they have them already), recorded as enriched copies of their
        measurements; the returned list carries them to the proposer."""
        if top <= 0:
            return ms
        by_target: dict[Target, list[Measurement]] = {}
        for x in ms:
            if x.status == "ok" and x.median_us and x.design is not None:
                by_target.setdefault(x.target, []).append(x)
        chosen = [
            x
            for xs in by_target.values()
            for x in sorted(xs, key=lambda x: (x.median_us, x.design_key))[:top]
            if not is_profiled(x.metrics)  # profiled before
        ]
        if not chosen:
            return ms
        if find_ncu() is None:
            self.say("ncu (Nsight Compute) not found: candidates are not profiled")
            return ms
        self.say(f"profiling {len(chosen)} candidates with Nsight Compute")
        res = profile(
            [
                job(self.cache.entry(x.artifact_key) / "kernel.cubin", x.design, x.target)
                for x in chosen
            ]
        )
        if res.error:
            self.say(f"profiling failed, going on without: {res.error.splitlines()[0]}")
            return ms
        enriched = {
            id(x): dataclasses.replace(x, metrics={**x.metrics, **vals})
            for x, vals in zip(chosen, res.metrics, strict=True)
            if vals
        }
        self.db.append(enriched.values())
        return [enriched.get(id(x), x) for x in ms]

    def _sanitize(self, selections: Sequence[Selection], unsafe: set[str]) -> set[str]:
        """memcheck each selected kernel's artifact once per build; failures are
        recorded (status runtime) so that no later build ships them either."""
        failed: set[str] = set()
        for s in selections:
            w = s.winner
            if s.kind != "kernel" or w is None or w.design is None:
                continue
            if w.artifact_key in self._sanitized or w.artifact_key in unsafe:
                continue
            self._sanitized.add(w.artifact_key)
            build_all([w.design], self.cache)  # a winner recorded by an earlier build
            cubin = self.cache.entry(w.artifact_key) / "kernel.cubin"
            res = memcheck(cubin, design_name(w.design), launch_recipe(w.design), s.target)
            if not res.ok:
                failed.add(w.artifact_key)
                self.db.append(
                    [
                        dataclasses.replace(
                            w,
                            status="runtime",
                            error=res.report,
                            samples_us=(),
                            median_us=None,
                            measured_at=_now(),
                        )
                    ]
                )
        return failed

    def _compile(self, designs: Sequence[KernelDesign], desc: str) -> dict[str, BuildResult]:
        unique = {d.key: d for d in designs}
        bar = tqdm(total=len(unique), desc=desc, unit="kernel", file=self.log)
        results = build_all(unique.values(), self.cache, self.jobs, on_done=lambda r: bar.update(1))
        bar.close()
        self.report_counts["compiled"] += len(results)
        return results

    # -- selection and packaging (any machine) --------------------------------------
    def run(self) -> BuildReport:
        history = latest(self.db.read())
        have_gpu = self.measure and bool(gpu_names())
        if have_gpu:
            self._measure(history)
            history = latest(self.db.read())
        else:
            relevant = [x for x in history if x.target in set(self.manifest.targets)]
            if not relevant:
                raise BuildError(
                    f"no GPU here and no recorded measurements for this manifest's targets in "
                    f"{self.db.path}: run cudal2-build on a machine with an NVIDIA GPU, or pass "
                    f"--measurements FILE recorded on one"
                )
            self.say(
                f"no GPU here: building from {len(relevant)} recorded measurements "
                f"in {self.db.path}"
            )
            self.report_counts["reused"] = len(relevant)
        unsafe = unsafe_artifacts(history)
        usable = shippable(unsafe)
        selections, missing = select(
            self.manifest.targets, history, self.manifest.timing_mode, usable
        )
        while have_gpu and (failed := self._sanitize(selections, unsafe)):
            self.say(f"{len(failed)} selected kernels failed {SANITIZER_PREFIX}: reselecting")
            unsafe |= failed
            selections, missing = select(
                self.manifest.targets, history, self.manifest.timing_mode, usable
            )
        stale = {
            x.design_key
            for x in history
            if x.status == "ok"
            and not x.is_vendor
            and x.target in set(self.manifest.targets)
            and not usable(x)
        }
        if stale:
            self.say(
                f"{len(stale)} measured designs no longer build to the measured artifact "
                "(template or nvcc changed): not shipped; re-measure on a GPU"
            )
        winners = [
            s.winner.design
            for s in selections
            if s.kind == "kernel" and s.winner and s.winner.design
        ]
        self._compile(winners, "compile winners")
        m = self.manifest
        table, cubins = build_table(
            name=m.name,
            version=m.version,
            package=m.package,
            manifest_sha256=m.sha256,
            selections=selections,
            cubin_of=self.cache.cubin,
        )
        wheel = write_wheel(table, cubins, self.out_dir)
        return BuildReport(
            wheel=wheel,
            table=table,
            selections=selections,
            missing=missing,
            measured=self.report_counts["measured"],
            reused=self.report_counts["reused"],
            compiled=self.report_counts["compiled"],
            failures=self.failures,
        )
