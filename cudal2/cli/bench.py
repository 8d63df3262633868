"""``cudal2-bench``: measure every vendor baseline (and a cudal2 wheel) on a shape file,
then summarise or plot the results.

    cudal2-bench SHAPES.toml [--kernels WHEEL_OR_DB] [--mode offline|server|both]
                 --out RESULTS.jsonl
    cudal2-bench summarize RESULTS.jsonl [--m-max M] [--m-min M] [--mode ...] [--json]
    cudal2-bench plot RESULTS.jsonl -o speedup.png

Results are appended one JSON line per (shape, dtype, layout, mode) as they are taken;
a re-run skips what the file already holds for this GPU model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cudal2.cli import args as cli_args
from cudal2.cli.output import atomic_path
from cudal2.records import DTYPES, LAYOUTS


def _filter_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", type=cli_args.in_file)
    p.add_argument("--m-min", type=cli_args.positive_int)
    p.add_argument("--m-max", type=cli_args.positive_int)
    p.add_argument("--mode", default="offline", choices=("offline", "server"))
    p.add_argument("--dtype", default="fp16", choices=DTYPES)
    p.add_argument("--layout", default="tn", choices=LAYOUTS)


def _filter_error(prog: str, a: argparse.Namespace) -> int | None:
    """An M range that selects nothing is a usage error, not an empty report."""
    if a.m_min is not None and a.m_max is not None and a.m_min > a.m_max:
        return cli_args.fail(prog, f"--m-min {a.m_min} is above --m-max {a.m_max}")
    return None


def _filter(a):
    from cudal2.bench.report import Filter

    return Filter(a.mode, a.dtype, a.layout, a.m_min, a.m_max)


def summarize_main(argv: list[str]) -> int:
    p = cli_args.Parser(prog="cudal2-bench summarize")
    _filter_args(p)
    p.add_argument("--json", action="store_true")
    a = p.parse(argv)
    if isinstance(a, int):  # a bad command line, already reported
        return a
    if (bad := _filter_error(p.prog, a)) is not None:
        return bad
    from cudal2.bench.report import read_results, summarize, table

    try:
        rows = read_results(a.results)
    except (OSError, ValueError) as e:
        print(f"cudal2-bench: error: {e}", file=sys.stderr)
        return 2
    s = summarize(rows, _filter(a))
    if a.json:
        print(json.dumps(s, indent=1))
    else:
        print(table(rows, _filter(a)))
        print()
        print(json.dumps(s))
    return 0


def plot_main(argv: list[str]) -> int:
    p = cli_args.Parser(prog="cudal2-bench plot")
    _filter_args(p)
    p.add_argument("-o", "--output", type=cli_args.out_file, default=Path("speedup.png"))
    a = p.parse(argv)
    if isinstance(a, int):  # a bad command line, already reported
        return a
    if (bad := _filter_error(p.prog, a)) is not None:
        return bad
    from cudal2.bench.report import plot, read_results

    try:
        rows = read_results(a.results)
        with atomic_path(a.output) as tmp:
            plot(rows, _filter(a), tmp)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"cudal2-bench: error: {e}", file=sys.stderr)
        return 2
    print(a.output)
    return 0


def run_main(argv: list[str]) -> int:
    p = cli_args.Parser(prog="cudal2-bench", description=__doc__.split("\n\n")[0])
    p.add_argument("shapes", help="shape file (bench/shapes/*.toml formats)")
    p.add_argument(
        "--out", type=cli_args.out_file, required=True, help="results file (JSON Lines, appended)"
    )
    p.add_argument(
        "--kernels",
        type=cli_args.in_file,
        help="cudal2 kernels to time beside the baselines: a wheel, its dispatch.json, or a "
        "measurement database (.jsonl; its winners as a build would select them)",
    )
    p.add_argument("--mode", default="offline", choices=("offline", "server", "both"))
    p.add_argument("--dtype", nargs="+", default=["fp16"], choices=DTYPES)
    p.add_argument("--layout", nargs="+", default=["tn"], choices=LAYOUTS)
    p.add_argument("--reps", type=cli_args.positive_int, default=30)
    a = p.parse(argv)
    if isinstance(a, int):  # a bad command line, already reported
        return a
    from cudal2.shapes import ShapeFileError, load_shapes

    try:
        shapes = load_shapes(a.shapes)
    except ShapeFileError as e:
        print(f"cudal2-bench: error: {e}", file=sys.stderr)
        return 2
    from cudal2.bench.run import run

    modes = ("offline", "server") if a.mode == "both" else (a.mode,)
    return run(shapes, a.out, modes, a.dtype, a.layout, a.reps, a.kernels and str(a.kernels))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "summarize":
        return summarize_main(argv[1:])
    if argv and argv[0] == "plot":
        return plot_main(argv[1:])
    return run_main(argv)


if __name__ == "__main__":
    sys.exit(main())
