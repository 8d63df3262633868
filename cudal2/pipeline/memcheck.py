"""Record compute-sanitizer checks of the kernels databases' tables would ship, and
measure nothing else: what ``ci/gpu_memcheck.sh`` runs on the H100 for the committed
databases.

    python -m cudal2.pipeline.memcheck --db MANIFEST DATABASE [--db ...]
        [--parallel 4] [--timeout 180] [--recheck] [--device 0] [--json SUMMARY]

For each manifest, the selection a build makes from DATABASE goes through the build's
own gate (``pipeline.gate``): every would-be winner without a clean check on record
is memchecked on this machine's GPU (``--parallel`` at a time), each check announced
in DATABASE before it runs and its verdict appended after; a failure makes the next
candidate the would-be winner, which is checked in turn. DATABASE is appended to (the
committed databases: give copies). ``--recheck`` checks every would-be winner again,
failures too (a clean check after a failure lifts its veto).

The summary says, per manifest, the table's kernel entries before the rule existed
(a kernel shipped unless a failure was recorded) and now, and whether they are the
same. Exit code 0: every would-be winner has a verdict; 1: some could not be checked
here (another GPU model, no answer); 2: bad arguments.

``--runoff`` first runs off each database's contested targets (``pipeline.runoff``:
a kernel and a cuBLASLt algorithm too close to order from their own runs, timed again
with torch in one process) and appends their records to DATABASE; the summary lists
each run-off (``runoffs``). This measures: the GPU's ``ci/gpu_runoff.sh``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from cudal2.database import DatabaseError, MeasurementDB, latest
from cudal2.generator.compile import ArtifactCache
from cudal2.manifest import Manifest, ManifestError, load_manifest
from cudal2.pipeline.build import Build, believable, shippable
from cudal2.pipeline.gate import ledger_of
from cudal2.pipeline.select import Selection, select

if TYPE_CHECKING:
    from cudal2.verify.runner import Runner


def kernel_entries(selections: Sequence[Selection]) -> dict[str, str]:
    """Per selection (GPU model, target): ``kernel:<design key>`` of the kernel it
    ships, else its kind (``cublaslt``, ``fallback``)."""
    return {
        f"{s.gpu} {s.target.label}": (
            f"kernel:{s.winner.design_key}" if s.kind == "kernel" and s.winner else s.kind
        )
        for s in selections
    }


def _kernels(entries: dict[str, str]) -> int:
    return sum(v.startswith("kernel:") for v in entries.values())


def before_the_rule(manifest: Manifest, db: Path) -> dict[str, str]:
    """What a build without a GPU selected before a clean check was required: every
    kernel that builds to its measured artifact and has no failure on record."""
    contents = MeasurementDB(db, manifest.reuse).load(warn=False)
    history = believable(latest(contents.measurements))
    ledger = ledger_of(contents.checks, history)
    usable = shippable()
    sels, _ = select(
        manifest.targets,
        history,
        manifest.timing_mode,
        lambda x: usable(x) and not ledger.vetoed(x.artifact_key),
    )
    return kernel_entries(sels)


def check_databases(
    pairs: Sequence[tuple[Path, Path]],
    runner: Runner,
    cache: ArtifactCache,
    recheck: bool = False,
    log: TextIO | None = None,
    runoff: bool = False,
) -> list[dict[str, Any]]:
    """Check each (manifest, database) pair's would-be winners on ``runner``, after
    its run-offs where ``runoff``; one summary per pair, said on ``log`` (None:
    ``sys.stderr`` as it is at the call, so a caller's redirect or pytest's capture
    sees it)."""
    log = log or sys.stderr
    out = []
    with tempfile.TemporaryDirectory() as scratch:
        for manifest_path, db in pairs:
            manifest = load_manifest(manifest_path)
            started = time.monotonic()
            print(f"== {manifest_path} ({db})", file=log, flush=True)
            before = before_the_rule(manifest, db)
            build = Build(manifest, db, cache, Path(scratch), runner=runner, log=log)
            check = build.runoff if runoff else build.memcheck
            selections, _ = check(runner, recheck=recheck)
            now = kernel_entries(selections)
            gate = build.gate
            changed = {k: (before.get(k), v) for k, v in now.items() if before.get(k) != v}
            summary = {
                "manifest": str(manifest_path),
                "database": str(db),
                "kernel_entries_before": _kernels(before),
                "kernel_entries": _kernels(now),
                "checked": len(gate.checked),
                "failed": len(gate.failed),
                "waiting": len(gate.waiting),
                "unchanged": not changed,
                "changed": changed,
                "seconds": round(time.monotonic() - started, 1),
                **({"runoffs": [o.as_json() for o in build.runoffs]} if runoff else {}),
            }
            print(json.dumps(summary, indent=1), file=log, flush=True)
            out.append(summary)
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cudal2.pipeline.memcheck",
        description="memcheck the kernels a database's table would ship; record the verdicts",
    )
    p.add_argument(
        "--db",
        nargs=2,
        action="append",
        required=True,
        metavar=("MANIFEST", "DATABASE"),
        help="a manifest and the database to select from and append checks to (repeatable)",
    )
    p.add_argument("--parallel", type=int, default=4, help="memchecks at a time (default 4)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per memcheck")
    p.add_argument("--recheck", action="store_true", help="check every would-be winner again")
    p.add_argument(
        "--runoff",
        action="store_true",
        help="first run off the contested targets (kernel, cuBLASLt algorithm and torch "
        "timed in one process) and record them",
    )
    p.add_argument("--device", type=int, default=0, help="CUDA device (default 0)")
    p.add_argument("--cache", help="artifact cache (default: $CUDAL2_CACHE or ~/.cache)")
    p.add_argument("--json", help="write the summaries here")
    return p


def main(
    argv: list[str] | None = None, make_runner: Callable[[argparse.Namespace], Runner] | None = None
) -> int:
    args = _parser().parse_args(argv)
    if args.parallel < 1 or args.timeout <= 0:
        print("memcheck: error: --parallel and --timeout must be positive", file=sys.stderr)
        return 2
    pairs = [(Path(m), Path(d)) for m, d in args.db]
    if make_runner is None:
        from cudal2.verify.local import LocalRunner  # the GPU side: imported on a GPU

        def make_runner(a: argparse.Namespace) -> Runner:
            return LocalRunner(
                a.device, sanitizer_parallel=a.parallel, sanitizer_timeout_s=a.timeout
            )

    cache = ArtifactCache(Path(args.cache) if args.cache else None)
    try:
        with make_runner(args) as runner:
            summaries = check_databases(pairs, runner, cache, args.recheck, runoff=args.runoff)
    except (ManifestError, DatabaseError) as e:
        print(f"memcheck: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(summaries, indent=1) + "\n")
    for s in summaries:
        print(
            f"{s['manifest']}: {s['kernel_entries']} kernel entries "
            f"(before the rule {s['kernel_entries_before']}), checked {s['checked']}, "
            f"failed {s['failed']}, waiting {s['waiting']}, "
            f"{'unchanged' if s['unchanged'] else 'CHANGED'}"
            + (f", {len(s['runoffs'])} run-offs" if "runoffs" in s else "")
        )
    return 1 if any(s["waiting"] for s in summaries) else 0


if __name__ == "__main__":
    sys.exit(main())
