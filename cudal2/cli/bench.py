"""``cudal2-bench``: measure every vendor baseline (and a cudal2 wheel) on a shape file,
then summarise or plot the results, or regenerate the figures the docs quote.

    cudal2-bench SHAPES.toml [--kernels WHEEL_OR_DB] [--mode offline|server|both]
                 --out RESULTS.jsonl
    cudal2-bench summarize RESULTS.jsonl [--m-max M] [--m-min M] [--shapes SHAPES.toml]
                 [--mode ...] [--json]
    cudal2-bench plot RESULTS.jsonl -o speedup.png
    cudal2-bench report [FILE.md ...] [--check]
    cudal2-bench layer --package NAME [--model ...] [--m 1 16 64] [--dtype ...]
                 --out LAYER.json [--markdown LAYER.md]

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

SUBCOMMANDS = """subcommands (each has its own --help):
  summarize RESULTS.jsonl   per-shape table and geomean speedups of one slice of a results
                            file (default: fp16, tn, offline; see --dtype/--layout/--mode)
  plot RESULTS.jsonl        bar chart of per-shape speedups against each baseline (PNG)
  report [FILE.md ...]      the figures README.md and docs/ quote, generated from the
                            committed results: printed, or rewritten in place between
                            <!-- cudal2:begin NAME --> markers (--check: compare only)
  layer --package NAME      one whole decoder layer (Llama-3.1-8B, -70B tp 8) in decode,
                            as one CUDA graph: vendor GEMMs against an installed cudal2
                            wheel's ops (fused where it has them)"""


def _filter_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", type=cli_args.in_file, help="results file of a cudal2-bench run")
    p.add_argument("--m-min", type=cli_args.positive_int, help="only shapes with M >= this")
    p.add_argument("--m-max", type=cli_args.positive_int, help="only shapes with M <= this")
    p.add_argument(
        "--shapes",
        type=cli_args.in_file,
        help="only the (M, N, K) of this shapes file (e.g. bench/shapes/llm-public.toml)",
    )
    p.add_argument(
        "--mode",
        default="offline",
        choices=("offline", "server"),
        help="timing mode of the rows to keep (default: offline)",
    )
    p.add_argument(
        "--dtype", default="fp16", choices=DTYPES, help="dtype of the rows to keep (default: fp16)"
    )
    p.add_argument(
        "--layout", default="tn", choices=LAYOUTS, help="layout of the rows to keep (default: tn)"
    )


def _filter_error(prog: str, a: argparse.Namespace) -> int | None:
    """An M range that selects nothing is a usage error, not an empty report; so is a
    shapes file that cannot be read (it is read here, once)."""
    if a.m_min is not None and a.m_max is not None and a.m_min > a.m_max:
        return cli_args.fail(prog, f"--m-min {a.m_min} is above --m-max {a.m_max}")
    a.shape_set = None
    if a.shapes is not None:
        from cudal2.shapes import ShapeFileError, load_shapes

        try:
            a.shape_set = frozenset(load_shapes(a.shapes))
        except (OSError, ShapeFileError) as e:
            return cli_args.fail(prog, f"--shapes: {e}")
    return None


def _filter(a):
    from cudal2.bench.report import Filter

    return Filter(a.mode, a.dtype, a.layout, a.m_min, a.m_max, a.shape_set, str(a.shapes or ""))


def summarize_main(argv: list[str]) -> int:
    p = cli_args.Parser(
        prog="cudal2-bench summarize",
        description="A per-shape table of one slice of a results file, then its summary "
        "(geomean speedups, wins, floor fraction). The slice is printed first: rows of "
        "other dtypes, layouts or modes are left out, and it says how many.",
    )
    _filter_args(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON only (no table)")
    a = p.parse(argv)
    if isinstance(a, int):  # a bad command line, already reported
        return a
    if (bad := _filter_error(p.prog, a)) is not None:
        return bad
    from cudal2.bench.report import describe, read_results, summarize, summary_text, table

    try:
        rows = read_results(a.results)
    except (OSError, ValueError) as e:
        print(f"cudal2-bench: error: {e}", file=sys.stderr)
        return 2
    f = _filter(a)
    s = summarize(rows, f)
    if a.json:
        print(json.dumps(s, indent=1))
        return 0
    print(describe(rows, f))
    print(table(rows, f))
    print()
    print(summary_text(s))
    return 0


def plot_main(argv: list[str]) -> int:
    p = cli_args.Parser(
        prog="cudal2-bench plot",
        description="One panel per baseline: each shape's speedup (baseline / cudal2) as a "
        "bar labelled MxNxK, sorted, with the geomean and 1.0 marked.",
    )
    _filter_args(p)
    p.add_argument(
        "-o",
        "--output",
        type=cli_args.out_file,
        default=Path("speedup.png"),
        help="PNG to write (default: speedup.png)",
    )
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


def report_main(argv: list[str]) -> int:
    p = cli_args.Parser(
        prog="cudal2-bench report",
        description="The figures README.md and docs/ quote, generated from the committed "
        "results (bench/results/, manifests/*.measurements.jsonl). With no FILE, print "
        "every block; with FILEs, rewrite each generated block between its "
        "<!-- cudal2:begin NAME --> and <!-- cudal2:end NAME --> markers.",
        epilog="exit status: 0 up to date (or rewritten), 1 --check found a stale block, "
        "2 bad input (a missing file, broken markers)",
    )
    p.add_argument("files", nargs="*", type=cli_args.in_file, help="markdown files to update")
    p.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 naming each file whose blocks differ from the results",
    )
    p.add_argument(
        "--root",
        type=Path,
        help="the checkout whose results are read (default: the one cudal2 is installed from)",
    )
    a = p.parse(argv)
    if isinstance(a, int):  # a bad command line, already reported
        return a
    from cudal2.bench import standing

    root = a.root or Path(__file__).resolve().parents[2]
    if not (root / "bench" / "results").is_dir():
        return cli_args.fail(p.prog, f"{root} has no bench/results/: pass --root CHECKOUT")
    if not a.files:
        for name, make in standing.BLOCKS.items():
            try:
                body = make(root)
            except standing.ResultsMissing as e:  # not measured yet: said, not fatal
                print(f"{p.prog}: block {name} skipped: {e}", file=sys.stderr)
                continue
            print(f"<!-- cudal2:begin {name} -->\n{body}\n<!-- cudal2:end {name} -->")
        return 0
    stale = []
    for f in a.files:
        text = f.read_text()
        try:
            new = standing.regenerate(text, root)
        except (standing.StaleBlockError, standing.ResultsMissing) as e:
            return cli_args.fail(p.prog, f"{f}: {e}")
        if new == text:
            continue
        stale.append(f)
        if not a.check:
            with atomic_path(f) as tmp:
                tmp.write_text(new)
    for f in stale:
        if a.check:
            print(
                f"{f}: its generated figures differ from the committed results "
                f"(run: cudal2-bench report {f})",
                file=sys.stderr,
            )
        else:
            print(f"{f}: updated")
    return 1 if stale and a.check else 0


def layer_main(argv: list[str]) -> int:
    from cudal2.bench.layer import MODELS

    p = cli_args.Parser(
        prog="cudal2-bench layer",
        description="One whole decoder layer in decode (attention over a KV cache of 1,024 "
        "tokens included), the vendor layer (cuBLAS GEMMs, torch-compiled norms and "
        "elementwise ops) against the same layer with every GEMM through an installed "
        "cudal2 wheel (its fused ops where it has them): both checked against an fp32 "
        "reference layer, then timed as CUDA graphs of back-to-back layers, interleaved "
        "(docs/inference.md, 'The layer benchmark').",
        epilog="exit status: 0 done (a case that fails the fp32 check is reported, not "
        "timed), 1 no CUDA GPU here, 2 bad input",
    )
    p.add_argument(
        "--package", required=True, help="the installed cudal2 wheel's package (import name)"
    )
    p.add_argument(
        "--model",
        nargs="+",
        default=list(MODELS),
        choices=list(MODELS),
        help="models (default: all); 70b-tp8 is one GPU's shard of Llama-3.1-70B at tp 8",
    )
    p.add_argument(
        "--m",
        nargs="+",
        type=cli_args.positive_int,
        default=[1, 16, 64],
        help="decode sequences per step (default: 1 16 64)",
    )
    p.add_argument(
        "--dtype",
        nargs="+",
        default=["fp16", "bf16"],
        choices=DTYPES,
        help="dtypes (default: fp16 bf16)",
    )
    p.add_argument(
        "--reps",
        type=cli_args.positive_int,
        default=100,
        help="timed repetitions (default: 100; a replay lasts about 0.5 ms)",
    )
    p.add_argument("--seed", type=cli_args.seed, default=0, help="weights and inputs (default: 0)")
    p.add_argument("--out", type=cli_args.out_file, required=True, help="results file (JSON)")
    p.add_argument("--markdown", type=cli_args.out_file, help="the table as markdown too")
    a = p.parse(argv)
    if isinstance(a, int):  # a bad command line, already reported
        return a
    from cudal2.bench.layer_run import M_MAX

    if too_big := [m for m in a.m if m > M_MAX]:
        return cli_args.fail(p.prog, f"--m {too_big[0]}: decode sequences must be <= {M_MAX}")
    pkg = _cudal2_package(p.prog, a.package)
    if isinstance(pkg, int):
        return pkg
    import torch

    if not torch.cuda.is_available():
        print(
            f"{p.prog}: error: no CUDA GPU here; the layer runs on a GPU machine", file=sys.stderr
        )
        return 1
    from cudal2.bench.layer import layer_shape
    from cudal2.bench.layer_run import markdown_table, results_json, run
    from cudal2.cli.output import write_text

    shapes = [layer_shape(m) for m in dict.fromkeys(a.model)]

    def save(doc: dict) -> None:  # after every case: a run cut short keeps what it took
        write_text(a.out, results_json(doc))

    doc = run(
        pkg, shapes, list(dict.fromkeys(a.dtype)), sorted(set(a.m)), a.reps, a.seed, save=save
    )
    save(doc)
    table = markdown_table(doc)
    if a.markdown:
        write_text(a.markdown, table + "\n")
    print(table)
    return 0


def _cudal2_package(prog: str, name: str):
    """The installed cudal2 wheel's module, or exit status 2 naming what is wrong."""
    import importlib
    import importlib.util

    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError) as e:  # a relative or empty name, a broken parent
        return cli_args.fail(prog, f"--package {name!r}: {e}")
    if found is None:
        return cli_args.fail(
            prog, f"--package {name!r}: no such module installed (pip install the cudal2 wheel)"
        )
    pkg = importlib.import_module(name)
    if not all(callable(getattr(pkg, attr, None)) for attr in ("linear", "warmup")) or not hasattr(
        pkg, "stats"
    ):
        return cli_args.fail(
            prog, f"--package {name!r}: not a cudal2 wheel (no linear / warmup / stats)"
        )
    return pkg


def run_main(argv: list[str]) -> int:
    p = cli_args.Parser(
        prog="cudal2-bench",
        description=__doc__.split("\n\n")[0],
        epilog=SUBCOMMANDS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("shapes", help="shape file (bench/shapes/*.toml formats)")
    p.add_argument(
        "--out", type=cli_args.out_file, required=True, help="results file (JSON Lines, appended)"
    )
    p.add_argument(
        "--kernels",
        type=cli_args.in_file,
        help="cudal2 kernels to time beside the baselines: a wheel, its dispatch.json, a "
        "measurement database (.jsonl or .jsonl.gz; its winners as a build would select "
        "them), or a manifest (.toml: as its build would select them from its database and "
        "the ones it reuses)",
    )
    p.add_argument(
        "--mode",
        default="offline",
        choices=("offline", "server", "both"),
        help="offline: back to back; server: L2 flushed before each sample; both "
        "(default: offline; docs/measuring.md)",
    )
    p.add_argument(
        "--dtype", nargs="+", default=["fp16"], choices=DTYPES, help="dtypes (default: fp16)"
    )
    p.add_argument(
        "--layout", nargs="+", default=["tn"], choices=LAYOUTS, help="layouts (default: tn)"
    )
    p.add_argument(
        "--reps", type=cli_args.positive_int, default=30, help="timed repetitions (default: 30)"
    )
    p.add_argument(
        "--settle-ms",
        type=cli_args.non_negative_int,
        default=0,
        help="before each shape's autotuning and timing, run its torch.matmul for this "
        "long, so that every sample is taken in the clock state a sustained run holds "
        "(a prefill GEMM's: the power limit's; docs/measuring.md); the rows record it "
        "(default: 0, none)",
    )
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
    kernels = a.kernels and str(a.kernels)
    return run(shapes, a.out, modes, a.dtype, a.layout, a.reps, kernels, a.settle_ms)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "summarize":
        return summarize_main(argv[1:])
    if argv and argv[0] == "plot":
        return plot_main(argv[1:])
    if argv and argv[0] == "report":
        return report_main(argv[1:])
    if argv and argv[0] == "layer":
        return layer_main(argv[1:])
    return run_main(argv)


if __name__ == "__main__":
    sys.exit(main())
