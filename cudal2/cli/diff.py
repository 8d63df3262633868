"""``cudal2-diff A B``: compare the dispatch tables of two kernel wheels (or dispatch.json
files), and gate a release on them.

Output: ``--format text`` (default: a terminal or a CI log), ``markdown`` (a pull
request comment) or ``json`` (``--json``). The gate is armed by ``--fail-on-regression
PCT``: it fails on a target removed, or moved from a kernel or cuBLASLt entry to the
fallback (unless ``--allow-removed``), and on a kernel or cuBLASLt entry slower by more
than PCT percent relative to the baseline timed in its own run. A fallback -> fallback
move of torch's time is reported as noise and never fails it.

Exit status:
  0  no gate failure (or the gate is not armed);
  1  the gate failed: a target removed or moved to the fallback, or a regression;
  2  bad input: a bad command line, or an input that cannot be read or is refused
     (missing, not a regular file, too large, not a wheel, a wheel that fails its
     RECORD or cubin checks, not JSON, nested too deeply, a malformed table), with one
     line naming the file; never a traceback for any input file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from cudal2.cli import args as cli_args
from cudal2.packaging.diff import (
    GateSettings,
    diff_tables,
    gate_line,
    render_markdown,
    render_text,
)
from cudal2.packaging.runtime.table import TableError
from cudal2.packaging.table import read_table

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_UNREADABLE = 2

FORMATS = ("text", "markdown", "json")
EPILOG = """exit status:
  0  no gate failure (or no --fail-on-regression)
  1  the gate failed: a target removed or moved to the fallback (unless
     --allow-removed), or an entry slower than PCT relative to its same-run baseline
  2  bad input: a bad option, or a file that cannot be read or is no valid table
"""


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < math.inf:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be a finite percentage >= 0, got {text!r}")
    return value


def build_parser() -> cli_args.Parser:
    parser = cli_args.Parser(
        prog="cudal2-diff",
        description="Compare the dispatch tables of two cudal2 kernel wheels (or\n"
        "dispatch.json files): removed, added and changed targets, and regressions in\n"
        "what cudal2 ships (an entry's time relative to the torch baseline of its own\n"
        "run; a fallback's time is torch's own, and its moves are noise).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("old", metavar="A", help="the old wheel (.whl) or dispatch.json")
    parser.add_argument("new", metavar="B", help="the new wheel (.whl) or dispatch.json")
    parser.add_argument(
        "--noise",
        type=_percent,
        default=2.0,
        metavar="PCT",
        help="moves of at most PCT percent (relative to the same-run baseline; for a "
        "fallback, torch's own time) are not reported (default 2)",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="text (default: aligned tables for a terminal or a log), markdown "
        "(a pull-request comment: counts, then tables, long lists folded) or json",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='the same as --format json: {"added", "removed", "changed", "regressions", '
        '"noise", "gate"}',
    )
    parser.add_argument(
        "--fail-on-regression",
        type=_percent,
        default=None,
        metavar="PCT",
        help="arm the gate: exit 1 if a target was removed or moved to the fallback, or "
        "a kernel/cuBLASLt entry got slower than PCT percent relative to its same-run "
        "baseline (same GPU model)",
    )
    parser.add_argument(
        "--allow-removed",
        action="store_true",
        help="removed targets and moves to the fallback do not fail the gate",
    )
    parser.add_argument(
        "--max-rows",
        type=cli_args.non_negative_int,
        default=20,
        metavar="N",
        help="text: at most N rows per section, the rest counted (default 20; 0: all)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the diff; returns the exit status (see the module docstring)."""
    args = build_parser().parse(argv)
    if isinstance(args, int):  # a bad command line, already reported
        return args
    tables = []
    for path in (args.old, args.new):
        try:
            tables.append(read_table(path))
        except TableError as exc:
            print(f"cudal2-diff: error: {exc}", file=sys.stderr)
            return EXIT_UNREADABLE
        except Exception as exc:  # a bug's exit is 2, not 1 (--fail-on-regression's)
            print(
                f"cudal2-diff: error: {path}: cannot be read ({type(exc).__name__}: {exc})",
                file=sys.stderr,
            )
            return EXIT_UNREADABLE
    old, new = tables
    result = diff_tables(old, new, noise_pct=args.noise, regression_pct=args.fail_on_regression)
    gate = GateSettings(armed=args.fail_on_regression is not None, allow_removed=args.allow_removed)
    failures = result.gate_failures(gate.allow_removed) if gate.armed else []
    fmt = "json" if args.json else args.format
    if fmt == "json":
        data = result.as_json()
        data["gate"] = {
            "armed": gate.armed,
            "regression_pct": args.fail_on_regression,
            "allow_removed": gate.allow_removed,
            "failures": failures,
        }
        print(json.dumps(data, indent=2, sort_keys=True))
    elif fmt == "markdown":
        names = [Path(p).name for p in (args.old, args.new)]
        if names[0] == names[1]:  # two builds of one package: name them by folder too
            names = [str(Path(p)) for p in (args.old, args.new)]
        sys.stdout.write(render_markdown(result, gate, *names))
    else:
        sys.stdout.write(render_text(result, gate, max_rows=args.max_rows))
    if failures:
        print(f"cudal2-diff: {gate_line(result, gate)}", file=sys.stderr)
        return EXIT_REGRESSION
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
