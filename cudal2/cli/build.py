"""``cudal2-build [MANIFEST] [--out DIR]``: manifest -> measured kernels -> wheel.

A build split across CI runners (docs/ci.md): ``--dry-run`` says what a build would do;
``--export-job DIR`` compiles the next round on a CPU runner into a job folder;
``--measure-job DIR`` measures it on a GPU runner that has no nvcc; ``--no-measure``
packages the database on a CPU runner.

Exit codes (``EXIT_CODES``, in ``--help`` and docs/ci.md): 0 built (or the job exported,
measured, or described); 2 bad manifest, arguments or job folder, or a
``--measurements`` path that is no database (nothing written); 3 no GPU here and no
recorded measurement of any of the manifest's targets (a new shape: measure on a GPU, or
split the build); 1 any other reason the build could not run (nvcc missing, no GPU
worker, GPUs of different models not declared interchangeable, a selected kernel or the
native launcher that does not compile here); 130 interrupted (Ctrl-C). ``--no-native``
ships a pure wheel without the native launcher. ``--runner local|host|ray`` and
``--ray-address`` override the manifest's ``[runner]`` (docs/runners.md); a runner that
cannot be made here (Ray not installed, a device this host lacks) exits 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from cudal2.cli import args as cli_args
from cudal2.database import default_database
from cudal2.manifest import (
    RUNNER_KINDS,
    Manifest,
    ManifestError,
    default_manifest_path,
    load_manifest,
)
from cudal2.policy import PROPOSERS

if TYPE_CHECKING:  # the pipeline is imported after the manifest is validated
    from cudal2.pipeline.build import BuildReport


EXIT_NO_RECORDS = 3
EXIT_CODES = (
    "exit codes: 0 built (or job exported / measured / described); 1 the build could not run "
    "(nvcc missing, no GPU worker, GPUs of models not declared interchangeable, a winner or "
    "the native launcher that does not compile here); 2 bad manifest, arguments, job folder, "
    "database path, or a runner that cannot be made here (nothing written); 3 no GPU here and "
    "no recorded "
    "measurement of the manifest's targets (a new shape: build on a GPU, or split the build "
    "with --export-job / --measure-job, docs/ci.md); 130 interrupted"
)


def _parser() -> cli_args.Parser:
    p = cli_args.Parser(
        prog="cudal2-build",
        description="Build a wheel of measured HGEMM kernels for the shapes of a manifest. "
        "Split across CI runners (docs/ci.md): --dry-run, then --export-job DIR on a CPU "
        "runner with nvcc, --measure-job DIR on a GPU runner (no nvcc needed), one round at "
        "a time, then --no-measure on a CPU runner packages the database.",
        epilog=EXIT_CODES,
    )
    p.add_argument(
        "manifest", nargs="?", help="manifest TOML (default: the shipped manifests/default.toml)"
    )
    p.add_argument(
        "--out",
        type=cli_args.out_folder,
        default=Path("dist"),
        help="folder for the wheel (default: dist/)",
    )
    p.add_argument(
        "--measurements",
        type=cli_args.in_folder,
        help="measurement database, .jsonl or .jsonl.gz (read-only) "
        "(default: <manifest stem>.measurements.jsonl next to the manifest, else "
        "<stem>.measurements.jsonl.gz)",
    )
    p.add_argument(
        "--remeasure", action="store_true", help="measure again even where a record exists"
    )
    p.add_argument(
        "--no-measure",
        action="store_true",
        help="do not use a GPU even if present: package from records",
    )
    p.add_argument(
        "--no-native",
        action="store_true",
        help="ship a pure py3-none-any wheel, without the native launcher (by default it "
        "is built with g++ and nvcc against the torch installed here, >= 2.11, and shipped "
        "in <package>/_native/ under a manylinux tag; where it cannot be built, the wheel "
        "is pure and the log says why)",
    )
    p.add_argument(
        "--cache",
        type=cli_args.out_folder,
        help="artifact cache folder (default: $CUDAL2_CACHE or ~/.cache/cudal2/artifacts)",
    )
    p.add_argument(
        "--proposer",
        choices=PROPOSERS,
        help="override the manifest's search.proposer (grid, random, sample, policy)",
    )
    p.add_argument(
        "--profile-lag",
        type=int,
        choices=(0, 1),
        help="override the manifest's search.profile_lag: 0, a round's Nsight Compute "
        "profiles are read by the next round's proposals (ncu runs between the rounds); 1, "
        "by the round after (ncu runs beside the next round's proposing and compiling); "
        "docs/runners.md",
    )
    p.add_argument(
        "--jobs", type=cli_args.positive_int, help="parallel nvcc processes (default: all cores)"
    )
    split = p.add_mutually_exclusive_group()
    split.add_argument(
        "--dry-run",
        action="store_true",
        help="write nothing: the targets per arch/dtype/layout, the next round's candidates "
        "and cubins to compile, and an estimate of GPU time",
    )
    split.add_argument(
        "--list-targets", action="store_true", help="print the targets the manifest expands to"
    )
    split.add_argument(
        "--export-job",
        type=cli_args.out_folder,
        metavar="DIR",
        help="compile only (CPU runner with nvcc): write the next round's measuring job "
        "(targets, designs, cubins by artifact key) to DIR; nothing left to measure: DIR "
        "is removed and the database is ready to package (--no-measure)",
    )
    split.add_argument(
        "--measure-job",
        type=cli_args.in_dir,
        metavar="DIR",
        help="measure an exported job on this machine's GPU into --measurements "
        "(no manifest, no nvcc needed)",
    )
    p.add_argument(
        "--json", action="store_true", help="with --dry-run: print it as JSON (targets listed)"
    )
    p.add_argument(
        "--gpu",
        metavar="NAME",
        help="with --export-job/--dry-run: the measuring GPU model, as torch names it "
        "(default: the one with most records of the manifest's targets in the database)",
    )
    p.add_argument(
        "--device",
        type=cli_args.non_negative_int,
        default=0,
        help="CUDA device to measure on with the local runner (default: 0)",
    )
    p.add_argument(
        "--runner",
        choices=RUNNER_KINDS,
        help="override the manifest's [runner] kind: local (worker processes on one GPU, "
        "--device), host (one per GPU of this host), ray (an actor per GPU of a Ray "
        "cluster; pip install 'cudal2[ray]'); docs/runners.md",
    )
    p.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="with the ray runner: the cluster to join (ray.init's address, e.g. "
        "ray://head:10001 or auto; default: a local Ray head)",
    )
    return p


def _summary(report: BuildReport) -> str:
    rows = [("gpu", "dtype/layout", "M", "N", "K", "dispatch", "time us", "torch us", "speedup")]
    for e in report.table.entries:
        rows.append(
            (
                e.gpu.replace("NVIDIA ", ""),
                f"{e.dtype}/{e.layout}",
                e.m_range,
                str(e.n),
                str(e.k),
                e.label,
                f"{e.time_us:.2f}",
                "-" if e.baseline_us is None else f"{e.baseline_us:.2f}",
                "-" if e.speedup is None else f"{e.speedup:.3f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            c.rjust(w) if i >= 2 else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    kinds = [e.kind for e in report.table.entries]
    lines.append(
        f"{len(kinds)} entries: {kinds.count('kernel')} own kernels, "
        f"{kinds.count('cublaslt')} autotuned cuBLASLt algorithms, "
        f"{kinds.count('fallback')} fallbacks"
    )
    alts = [e for e in report.table.entries if e.eager is not None]
    if alts:  # only where the manifest asked for them: other summaries are as they were
        lines.append(
            f"{len(alts)} eager alternatives (an own kernel launched in the entry's place "
            "when no CUDA graph is being captured):"
        )
        lines += [
            f"  {e.gpu.replace('NVIDIA ', '')} {e.dtype}/{e.layout} M {e.m_range} N {e.n} "
            f"K {e.k}: {e.label} {e.time_us:.2f} us -> {e.eager.kernel} {e.eager.time_us:.2f} us"
            for e in alts
        ]
    twins = [s for s in report.selections if s.twin_us is not None and s.displaced is not None]
    if twins:
        lines.append(
            f"{len(twins)} row-scaled targets left to their twins (a fallback entry: torch's "
            "RMSNorm, then the twin's entry), a faster path than their fastest kernel:"
        )
        lines += [
            f"  {s.gpu.replace('NVIDIA ', '')} {s.target.dtype}/{s.target.layout} M "
            f"{s.target.m} N {s.target.n} K {s.target.k} {s.target.epilogue}: "
            f"{s.displaced.median_us:.2f} us -> {s.twin_us:.2f} us"
            for s in twins
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse(argv)
    if isinstance(args, int):  # a bad command line, already reported
        return args
    if args.measure_job is not None:
        return _measure_job(args)
    if args.json and not args.dry_run:
        return cli_args.fail("cudal2-build", "--json goes with --dry-run")
    path = Path(args.manifest) if args.manifest else default_manifest_path()
    try:
        manifest = load_manifest(path)
    except ManifestError as e:
        print(f"cudal2-build: error: {e}", file=sys.stderr)
        return 2
    if args.proposer:
        search = dataclasses.replace(manifest.search, proposer=args.proposer)
        manifest = dataclasses.replace(manifest, search=search)
    if args.profile_lag is not None:
        search = dataclasses.replace(manifest.search, profile_lag=args.profile_lag)
        manifest = dataclasses.replace(manifest, search=search)
    if args.runner or args.ray_address is not None:
        runner = manifest.runner
        if args.runner and args.runner != runner.kind:
            # another kind: the manifest's keys of its own kind do not carry over
            keep = dataclasses.replace(type(runner)(), job_timeout_s=runner.job_timeout_s)
            if args.runner in ("host", "ray"):
                keep = dataclasses.replace(keep, interchangeable=runner.interchangeable)
            runner = dataclasses.replace(keep, kind=args.runner)
        if args.ray_address is not None:
            if runner.kind != "ray":
                return cli_args.fail(
                    "cudal2-build",
                    f"--ray-address goes with the ray runner (--runner ray, or [runner] "
                    f"kind = 'ray'); the runner here is {runner.kind!r}",
                )
            if not args.ray_address.strip():
                return cli_args.fail("cudal2-build", "--ray-address must not be empty")
            runner = dataclasses.replace(runner, ray_address=args.ray_address)
        manifest = dataclasses.replace(manifest, runner=runner)

    # Imported after validation so a bad manifest fails fast and writes nothing.
    from cudal2.database import DatabaseError
    from cudal2.generator.compile import (
        ArtifactCache,
        CacheIntegrityError,
        CompileInterruptedError,
        CubinUnavailableError,
        NvccNotFoundError,
    )
    from cudal2.packaging.native_build import NativeBuildError
    from cudal2.pipeline.build import Build, BuildError, NoRecordsError
    from cudal2.pipeline.runners import RunnerUnavailableError
    from cudal2.verify.fleet import FleetError
    from cudal2.verify.pool import WorkerError

    db = args.measurements or default_database(path)
    if args.list_targets:
        for t in manifest.targets:
            fused = "" if t.epilogue == "none" else f" {t.epilogue}"
            print(f"{t.arch} {t.dtype} {t.layout} {t.m} {t.n} {t.k}{fused}")
        return 0
    if args.dry_run or args.export_job is not None:
        return _export(args, manifest, db)
    started = time.monotonic()
    try:
        report = Build(
            manifest,
            db,
            ArtifactCache(args.cache),
            args.out,
            remeasure=args.remeasure,
            measure=not args.no_measure,
            jobs=args.jobs,
            device=args.device,
            native=not args.no_native,
        ).run()
    except (DatabaseError, RunnerUnavailableError) as e:
        # --measurements names no database, or the runner asked for cannot be made here
        # (Ray not installed, a device this host lacks): bad input, nothing written
        print(f"cudal2-build: error: {e}", file=sys.stderr)
        return 2
    except NoRecordsError as e:
        print(f"cudal2-build: error: {e}", file=sys.stderr)
        return EXIT_NO_RECORDS
    except (
        BuildError,
        NvccNotFoundError,
        CubinUnavailableError,
        CacheIntegrityError,
        CompileInterruptedError,
        NativeBuildError,
        WorkerError,
        FleetError,
    ) as e:
        print(f"cudal2-build: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the compiles were killed on the way out (build_all)
        print("cudal2-build: interrupted", file=sys.stderr)
        return 130
    print(_summary(report))
    if report.missing:
        print(
            f"{len(report.missing)} targets have no timed measurement "
            "(the runtime falls back to cuBLAS for them):"
        )
        for t in report.missing:
            print(f"  {t.label} ({t.arch})")
    if report.failures:
        print(
            "failed candidates: "
            + ", ".join(f"{k} {v}" for k, v in sorted(report.failures.items()))
        )
    if report.quarantined:
        print(
            f"{len(report.quarantined)} broken artifact cache entries quarantined and "
            f"compiled again (the evidence: {report.quarantined[0].parent})"
        )
    unmeasured = f", {report.unmeasured} jobs without a record" if report.unmeasured else ""
    print(
        f"measured {report.measured}, reused {report.reused} measurements{unmeasured}; "
        f"{time.monotonic() - started:.1f} s; database {db}"
    )
    print(f"wheel: {report.wheel}")
    return 0


def _export(args: argparse.Namespace, manifest: Manifest, db: Path) -> int:
    """``--dry-run`` and ``--export-job``: the next job of a split build."""
    from cudal2.database import DatabaseError
    from cudal2.generator.compile import (
        ArtifactCache,
        CacheIntegrityError,
        CompileInterruptedError,
        CubinUnavailableError,
        NvccNotFoundError,
    )
    from cudal2.pipeline.build import BuildError
    from cudal2.pipeline.job import JobBundleError
    from cudal2.pipeline.split import describe, export_job, remove_job

    try:
        report = export_job(
            manifest,
            db,
            ArtifactCache(args.cache),
            None if args.dry_run else args.export_job,
            gpu=args.gpu,
            jobs=args.jobs,
        )
    except (DatabaseError, JobBundleError) as e:
        print(f"cudal2-build: error: {e}", file=sys.stderr)
        return 2
    except (
        BuildError,
        NvccNotFoundError,
        CubinUnavailableError,
        CacheIntegrityError,
        CompileInterruptedError,
    ) as e:
        print(f"cudal2-build: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("cudal2-build: interrupted", file=sys.stderr)
        return 130
    summary = describe(manifest, report, db)
    if args.dry_run:
        print(json.dumps(summary, indent=1) if args.json else _dry_text(summary))
        return 0
    if report.folder is None:
        remove_job(args.export_job)
        print(
            f"nothing left to measure: {db} answers every job of {manifest.name}; package it "
            f"with: cudal2-build {manifest.path} --no-measure --measurements {db}"
        )
        return 0
    job = report.job
    print(
        f"exported {job.phase} of {manifest.name} for {job.gpu}: {len(job.measure)} "
        f"candidates, {len(job.checks)} sanitizer checks, {len(job.autotune)} cuBLASLt "
        f"autotunings, {report.designs} cubins -> {report.folder}; measure it on the GPU "
        f"with: cudal2-build --measure-job {report.folder} --measurements {db.name}"
    )
    return 0


def _dry_text(s: dict) -> str:
    lines = [f"manifest {s['manifest']} ({s['package']}): {s['targets']} targets"]
    lines += [f"  {g}: {n}" for g, n in s["groups"].items()]
    lines.append(f"database {s['database']}: {s['records']} records of these targets")
    lines.append(
        f"next: {s['phase']} on {s['gpu']}: {s['candidates']} candidates to measure, "
        f"{s['checks']} sanitizer checks, {s['autotune']} cuBLASLt autotunings; "
        f"{s['cubins']} cubins, {s['cubins_to_compile']} not yet compiled"
    )
    lines.append(
        f"estimated GPU time: this job ~{s['gpu_s_next']:.0f} s; the whole build "
        f"({s['rounds']} rounds x {s['per_round']} candidates) ~{s['gpu_s_build']:.0f} s, "
        f"at most the budget of {s['budget_s']:.0f} s"
    )
    if s["pdl"]:
        lines.append(
            f"PDL on ([search] pdl): {s['pdl_candidates']} of the next job's "
            f"{s['candidates']} candidates are PDL designs; up to {s['pdl_per_round']} of "
            f"each round's {s['per_round']} are PDL variants of its proposed tiles"
        )
    if s.get("room"):
        lines.append(
            f"room on ([search] room): {s['room_candidates']} of the next job's "
            f"{s['candidates']} candidates leave room for the next kernel (all PDL designs)"
        )
    return "\n".join(lines)


def _measure_job(args: argparse.Namespace) -> int:
    """``--measure-job DIR``: on a GPU machine, no manifest and no nvcc needed."""
    from cudal2.database import DatabaseError
    from cudal2.pipeline.job import JobBundleError, JobMeasurer
    from cudal2.verify.gpu import gpu_names
    from cudal2.verify.pool import WorkerError

    if args.measurements is None:
        return cli_args.fail("cudal2-build", "--measure-job needs --measurements DB to write")
    try:
        if not gpu_names():
            print("cudal2-build: error: --measure-job needs an NVIDIA GPU here", file=sys.stderr)
            return 1
        from cudal2.verify.local import LocalRunner

        measurer = JobMeasurer(args.measure_job, args.measurements, LocalRunner(args.device))
        report = measurer.run()
    except (DatabaseError, JobBundleError) as e:
        print(f"cudal2-build: error: {e}", file=sys.stderr)
        return 2
    except WorkerError as e:
        print(f"cudal2-build: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("cudal2-build: interrupted", file=sys.stderr)
        return 130
    print(
        f"{report.phase}: measured {report.measured} candidates ({report.reused} recorded "
        f"before, {report.unmeasured} unanswered), {report.autotuned} cuBLASLt autotunings, "
        f"{report.checked} sanitizer checks ({report.failed_checks} failed) -> "
        f"{args.measurements}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
