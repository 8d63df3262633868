"""``cudal2-build [MANIFEST] [--out DIR]``: manifest -> measured kernels -> wheel.

Exit codes: 0 built; 2 bad manifest or arguments, or a ``--measurements`` path that
is no database (a directory, FIFO, device, socket, unreadable; nothing written); 1 the
build could not run (no GPU and no recorded measurements, nvcc missing, no GPU worker,
a selected kernel that does not compile here); 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from cudal2.cli import args as cli_args
from cudal2.manifest import ManifestError, default_manifest_path, load_manifest
from cudal2.policy import PROPOSERS

if TYPE_CHECKING:  # the pipeline is imported after the manifest is validated
    from cudal2.pipeline.build import BuildReport


def _parser() -> cli_args.Parser:
    p = cli_args.Parser(
        prog="cudal2-build",
        description="Build a wheel of measured HGEMM kernels for the shapes of a manifest.",
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
        help="measurement database "
        "(default: <manifest stem>.measurements.jsonl next to the manifest)",
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
        "--jobs", type=cli_args.positive_int, help="parallel nvcc processes (default: all cores)"
    )
    p.add_argument(
        "--device",
        type=cli_args.non_negative_int,
        default=0,
        help="CUDA device to measure on (default: 0)",
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
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse(argv)
    if isinstance(args, int):  # a bad command line, already reported
        return args
    path = Path(args.manifest) if args.manifest else default_manifest_path()
    try:
        manifest = load_manifest(path)
    except ManifestError as e:
        print(f"cudal2-build: error: {e}", file=sys.stderr)
        return 2
    if args.proposer:
        search = dataclasses.replace(manifest.search, proposer=args.proposer)
        manifest = dataclasses.replace(manifest, search=search)

    # Imported after validation so a bad manifest fails fast and writes nothing.
    from cudal2.database import DatabaseError
    from cudal2.generator.compile import (
        ArtifactCache,
        CacheIntegrityError,
        CompileInterruptedError,
        CubinUnavailableError,
        NvccNotFoundError,
    )
    from cudal2.pipeline.build import Build, BuildError
    from cudal2.verify.pool import WorkerError

    db = args.measurements or path.with_name(f"{path.stem}.measurements.jsonl")
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
        ).run()
    except DatabaseError as e:  # --measurements names no database: bad input
        print(f"cudal2-build: error: {e}", file=sys.stderr)
        return 2
    except (
        BuildError,
        NvccNotFoundError,
        CubinUnavailableError,
        CacheIntegrityError,
        CompileInterruptedError,
        WorkerError,
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


if __name__ == "__main__":
    sys.exit(main())
