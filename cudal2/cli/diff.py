"""``cudal2-diff A B``: compare the dispatch tables of two kernel wheels (or dispatch.json files).

Exit status: 0 normally; 1 when ``--fail-on-regression PCT`` is given and some
target got slower by more than PCT percent on the same GPU model; 2 when an input
cannot be read or is refused (missing, not a regular file, too large, not a wheel, a
wheel that fails its RECORD or cubin checks, not JSON, nested too deeply, a malformed
table), with one line naming the file; never a traceback for any input file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence

from cudal2.cli import args as cli_args
from cudal2.packaging.diff import diff_tables, render_text
from cudal2.packaging.runtime.table import TableError
from cudal2.packaging.table import read_table

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_UNREADABLE = 2


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
        description="Compare the dispatch tables of two cudal2 kernel wheels "
        "(or dispatch.json files): added, removed and changed targets, and regressions.",
    )
    parser.add_argument("old", metavar="A", help="the old wheel (.whl) or dispatch.json")
    parser.add_argument("new", metavar="B", help="the new wheel (.whl) or dispatch.json")
    parser.add_argument(
        "--noise",
        type=_percent,
        default=2.0,
        metavar="PCT",
        help="time moves of at most PCT percent are not reported as changes (default 2)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print {"added", "removed", "changed", "regressions"} as JSON',
    )
    parser.add_argument(
        "--fail-on-regression",
        type=_percent,
        default=None,
        metavar="PCT",
        help="exit 1 if any target got slower by more than PCT percent on the same GPU model",
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
    if args.json:
        print(json.dumps(result.as_json(), indent=2, sort_keys=True))
    else:
        sys.stdout.write(render_text(result))
    if args.fail_on_regression is not None and result.regressions:
        print(
            f"cudal2-diff: {len(result.regressions)} target(s) slower by more than "
            f"{args.fail_on_regression:g}%",
            file=sys.stderr,
        )
        return EXIT_REGRESSION
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
