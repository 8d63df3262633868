"""Summaries of the committed H100 benchmark results (bench/results/)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from cudal2.bench.report import Filter, baseline_us, read_results, summarize, table, wins
from cudal2.cli import bench as bench_cli
from cudal2.hardware import floor_us
from cudal2.records import Target

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
LLM = RESULTS / "h100-llm-public.jsonl"
GRID = RESULTS / "h100-grid-sample.jsonl"


@pytest.fixture(scope="module")
def llm():
    return read_results(LLM)


def test_results_cover_every_shape_in_both_modes(llm):
    for mode in ("offline", "server"):
        assert summarize(llm, Filter(mode=mode))["shapes"] == 48
    assert summarize(read_results(GRID), Filter())["shapes"] == 12
    assert {r["gpu"]["name"] for r in llm} == {"NVIDIA H100 80GB HBM3"}


def test_gzipped_results_read_as_the_plain_file(llm, tmp_path):
    import gzip

    packed = tmp_path / "r.jsonl.gz"
    packed.write_bytes(gzip.compress(LLM.read_bytes()))
    assert read_results(packed) == llm


def test_records_are_self_consistent(llm):
    for r in llm:
        t = Target.from_json(r["target"])
        assert r["floor_us"] == pytest.approx(floor_us(t, r["gpu"]["name"]), rel=1e-3)
        medians = {n: b["median_us"] for n, b in r["baselines"].items()}
        assert r["best_vendor"]["median_us"] == min(medians.values())
        assert all(m >= r["floor_us"] for m in medians.values())  # nothing beat physics
        assert r["errors"] == []
        auto = r["cublaslt_autotune"]
        assert 1 <= auto["algorithms"] <= 100 and len(auto["candidates_us"]) == auto["algorithms"]
        for b in r["baselines"].values():
            assert b["p20_us"] <= b["median_us"] <= b["p80_us"]
        assert all(c["agrees"] for c in r["sync_check"].values())


def test_summary_matches_a_recomputation(llm):
    f = Filter(m_max=256)
    s = summarize(llm, f)
    kept = [r for r in llm if f.keep(r)]
    assert s["shapes"] == len(kept) == 32
    for name in ("torch", "cublas", "best_vendor"):
        ratios = [baseline_us(r, name) / r["cudal2"]["median_us"] for r in kept]
        geo = math.exp(statistics.fmean(math.log(x) for x in ratios))
        assert s["geomean_speedup"][name] == pytest.approx(geo, rel=1e-3)
    fr = statistics.median(r["floor_us"] / r["cudal2"]["median_us"] for r in kept)
    assert s["floor_fraction_median"] == pytest.approx(fr, rel=1e-3)
    # No own kernel ships yet: cudal2 runs the fallback, torch.matmul, at torch's time.
    assert s["own_kernel_targets"] == 0 == s["wins_vs_best_vendor"]
    assert s["geomean_speedup"]["torch"] == 1.0
    assert s["geomean_speedup"]["best_vendor"] <= 1.0


def test_a_kernel_counts_as_a_win_only_beyond_the_spread(llm):
    r = json.loads(json.dumps(next(x for x in llm if x["mode"] == "offline")))
    best = r["baselines"][r["best_vendor"]["name"]]
    r["cudal2"]["dispatch"] = {"kind": "kernel", "kernel": "k"}
    spread = (best["p80_us"] - best["p20_us"]) / best["median_us"]
    for factor, expect in ((1 + spread / 2, False), (1 + spread + 0.05, True)):
        t = best["median_us"] / factor
        r["cudal2"]["timing"] = {"median_us": t, "p20_us": t, "p80_us": t}
        assert wins(r) is expect


def test_table_lists_shapes_and_m_buckets(llm):
    text = table(llm, Filter())
    assert text.count("\n") > 48
    assert "floor fraction by M bucket" in text and ">=1025" in text


def test_cli_summarize_json_and_plot(tmp_path, capsys):
    assert bench_cli.main(["summarize", str(LLM), "--m-min", "1024", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["shapes"] == 16 and s["gpu"] == "NVIDIA H100 80GB HBM3"
    assert set(s["geomean_speedup"]) == {
        "torch",
        "cublas",
        "cublaslt_heuristic",
        "cublaslt_autotune",
        "best_vendor",
    }
    for key in ("own_kernel_targets", "wins_vs_best_vendor", "floor_fraction_median"):
        assert key in s
    png = tmp_path / "speedup.png"
    assert bench_cli.main(["plot", str(GRID), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_errors(tmp_path, capsys):
    assert bench_cli.main(["summarize", str(tmp_path / "none.jsonl")]) == 2
    bad = tmp_path / "bad.toml"
    bad.write_text("shapes = [[1, -2, 3]]")
    assert bench_cli.main([str(bad), "--out", str(tmp_path / "r.jsonl")]) == 2
    assert "shapes[0][1] = -2" in capsys.readouterr().err


def test_help_lists_every_subcommand_and_every_option_has_help(capsys):
    with pytest.raises(SystemExit):
        bench_cli.main(["--help"])
    top = capsys.readouterr().out
    for sub in ("summarize RESULTS.jsonl", "plot RESULTS.jsonl", "report [FILE.md ...]"):
        assert sub in top
    for sub in ("summarize", "plot", "report"):
        with pytest.raises(SystemExit):
            bench_cli.main([sub, "--help"])
        text = capsys.readouterr().out
        # argparse prints an option's help on its line or the next; a bare option
        # line followed by another option (or the end) has none.
        lines = [x.strip() for x in text.split("options:")[1].splitlines() if x.strip()]
        for i, line in enumerate(lines):
            if line.startswith("-") and "  " not in line:
                nxt = lines[i + 1] if i + 1 < len(lines) else "-"
                assert not nxt.startswith("-"), f"{sub}: {line} has no help"


def test_summarize_says_what_it_filters_and_prints_no_raw_json(capsys):
    assert bench_cli.main(["summarize", str(LLM), "--m-max", "16"]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("16 of 192 rows: fp16 tn offline, M 1-16 (left out: ")
    assert "48 bf16/tn/offline" in first and "48 fp16/tn/server" in first
    assert not any(line.lstrip().startswith("{") for line in out.splitlines())
    assert "16 shapes on NVIDIA H100 80GB HBM3 (fp16 tn offline)" in out


def test_plot_labels_every_bar_and_shows_the_tallest(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cudal2.bench import report

    rows = read_results(LLM)
    seen = {}
    monkeypatch.setattr(plt, "close", lambda fig: seen.setdefault("fig", fig))
    report.plot(rows, Filter(), tmp_path / "p.png")
    kept = [r for r in rows if Filter().keep(r)]
    for ax in seen["fig"].axes:
        labels = {t.get_text() for t in ax.get_xticklabels()}
        assert labels == {report.shape_label(r) for r in kept}
        lo, hi = ax.get_ylim()
        tops = [b.get_y() + b.get_height() for b in ax.patches]
        assert lo < min(1.0, *tops) and max(1.0, *tops) < hi  # no bar cut at either end


PREFILL = RESULTS / "h100-prefill-llm-public-settle-a-1.jsonl.gz"  # the 17 prefill shapes
PUBLIC = Path(__file__).resolve().parents[2] / "bench/shapes/llm-public.toml"


def test_summarize_keeps_only_a_shape_files_shapes(capsys):
    """Issue 22's geomean is over llm-public's 16 shapes at M >= 1024: the prefill file's
    8192^3 (no llm-public shape) is left out by --shapes, and said to be."""
    rows = read_results(PREFILL)
    from cudal2.shapes import load_shapes

    public = frozenset(load_shapes(PUBLIC))
    every = summarize(rows, Filter(m_min=1024))
    only = summarize(rows, Filter(m_min=1024, shapes=public, shapes_from=str(PUBLIC)))
    assert (every["shapes"], only["shapes"]) == (17, 16)
    kept = [r for r in rows if Filter(m_min=1024, shapes=public).keep(r)]
    assert {(r["target"]["m"], r["target"]["n"], r["target"]["k"]) for r in kept} == {
        s for s in public if s[0] >= 1024
    }
    xs = [r["best_vendor"]["median_us"] / r["cudal2"]["median_us"] for r in kept]
    want = math.exp(statistics.fmean(math.log(x) for x in xs))
    assert only["geomean_speedup"]["best_vendor"] == pytest.approx(want, abs=1e-4)
    args = ["summarize", str(PREFILL), "--m-min", "1024", "--shapes", str(PUBLIC)]
    assert bench_cli.main(args) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(
        f"16 of 68 rows: fp16 tn offline, M 1024-any, the 48 shapes of {PUBLIC}"
    )


# (--shapes file content or None for a missing file, what the error says)
BAD_SHAPES = [
    (None, "no such file"),
    ("shapes = [[1, -2, 3]]", "shapes[0][1] = -2"),
    ("shapes = []", "no shapes"),
    ("shapes = [[1, 2]]", "expected [M, N, K]"),
    ("not toml [", "bad.toml"),
]


@pytest.mark.parametrize("content,says", BAD_SHAPES, ids=[s for _, s in BAD_SHAPES])
def test_a_shapes_filter_that_cannot_be_read_is_named_and_exits_2(content, says, tmp_path, capsys):
    path = tmp_path / "bad.toml"
    if content is not None:
        path.write_text(content)
    assert bench_cli.main(["summarize", str(PREFILL), "--shapes", str(path)]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("results", "says"),
    [  # the H100 bench of the shipped llm-public wheel, settled and not (docs/measuring.md)
        ("h100-prefill-llm-public-declared-settled-c-1.jsonl.gz", ", settled 2000 ms a shape"),
        ("h100-prefill-llm-public-declared-c-1.jsonl.gz", None),
    ],
)
def test_summarize_says_whether_its_rows_were_settled(results, says, capsys):
    """A bench run with ``--settle-ms`` belongs to another clock state than one without:
    the first line of its summary says so, and a run without says nothing of it."""
    path = RESULTS / results
    assert bench_cli.main(["summarize", str(path), "--m-min", "1024"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    if says is None:
        assert "settled" not in first
    else:
        assert says in first
