"""Issue 22's feed ceiling without a GPU (``cudal2.bench.math_ceiling``'s feed part and
bench/experiments/math_ceiling.py --feed): the analysis of the feed kernels and GEMM
twins per shape, their geomeans over every shape and over full waves, the docs blocks
(the sustained table and the ncu one), hostile inputs; and the feed kernels compile for
sm_90a without local memory, one 384-thread CTA an SM.

The data is the H100 run's committed record (bench/results/h100-feed-ceiling.json: its
raw runs, analysed again here) and its ncu pages (bench/results/h100-ncu-feed-*.csv);
the expectations are computed from their inputs, never written down."""

from __future__ import annotations

import copy
import json
import math
import re
import statistics
from pathlib import Path

import pytest

from cudal2.bench import math_ceiling as mc
from cudal2.bench import standing

ROOT = Path(__file__).resolve().parents[2]
CU = ROOT / "bench/experiments/math_ceiling.cu"
FEED = ROOT / standing.FEED_CEILING
BENCH = "bench/results/h100-llm-public-prefill-v5.jsonl"


def recorded(path: Path = FEED) -> dict:
    return json.loads(path.read_text())


def raw(path: Path = FEED) -> dict:
    """The recorded run before its analysis: the script's raw record."""
    d = recorded(path)
    del d["summary"]
    keep = ("target", "operand_sets", "math_rounds", "math_flops_per_call", "runs", "llm_public")
    d["shapes"] = [
        {k: v for k, v in s.items() if k in keep or k.endswith("_check")} for s in d["shapes"]
    ]
    return d


def over_torch(rows, t) -> float | None:
    got = [
        r
        for r in rows
        if r["mode"] == "offline"
        and r["target"]["dtype"] == "fp16"
        and r["target"]["layout"] == "tn"
        and (r["target"]["m"], r["target"]["n"], r["target"]["k"]) == (t["m"], t["n"], t["k"])
    ]
    if not got:
        return None
    (r,) = got
    return r["baselines"]["torch"]["median_us"] / r["best_vendor"]["median_us"]


def med(runs) -> float:
    return statistics.median(r["tflops"] for r in runs)


# The committed runs: the first (feed, gemm), the multicast pair's two versions, the paced
# and tall kernels, the even share (stream-K without its partial sums), the narrow widths
# and the aligned split
RUNS = list(standing.FEED_RUNS)


@pytest.mark.parametrize("path", RUNS)
def test_the_recorded_analysis_is_the_analysis_of_its_runs(path, prefill_v5_rows):
    run = ROOT / path
    assert mc.analyse(raw(run), prefill_v5_rows, BENCH) == json.loads(json.dumps(recorded(run)))


def _drop_feed(d):
    del d["shapes"][0]["runs"]["feed"]


def _slow_torch(d):
    for s in d["shapes"]:
        for r in s["runs"]["torch"]:
            r["tflops"] *= 0.5


# (case, edit of the raw record): each row's expectations are computed below.
CASES = [
    ("as recorded", None),
    ("one shape without a feed run", _drop_feed),
    ("this run's torch half as fast: the best vendor scales with it", _slow_torch),
]


@pytest.mark.parametrize("case,edit", CASES, ids=[c[0] for c in CASES])
def test_each_feed_kernel_over_the_best_vendor(case, edit, prefill_v5_rows):
    d = raw()
    if edit:
        edit(d)
    res = mc.analyse(d, prefill_v5_rows, BENCH)
    got: dict[str, list[float]] = {key: [] for key in mc.FEED.values()}
    for s, given in zip(res["shapes"], d["shapes"], strict=True):
        over = over_torch(prefill_v5_rows, s["target"])
        best = med(given["runs"]["torch"]) * over
        for name, key in mc.FEED.items():
            if name not in given["runs"]:
                assert name not in s and key not in s
                continue
            assert s[name]["tflops"] == pytest.approx(med(given["runs"][name]), abs=1e-3)
            assert s[key] == pytest.approx(med(given["runs"][name]) / best, rel=1e-3)
            got[key].append(med(given["runs"][name]) / best)
    summ = res["summary"]
    assert got["feed_ceiling"] and got["gemm_speedup"]
    for key, xs in got.items():
        if not xs:
            assert key not in summ
            continue
        g = math.exp(sum(map(math.log, xs)) / len(xs))
        assert summ[key]["shapes"] == len(xs)
        assert summ[key]["geomean"] == pytest.approx(g, rel=1e-3)
        assert summ[key]["min"] == pytest.approx(min(xs), rel=1e-3)
        assert summ[key]["shapes_at_target"] == sum(x >= mc.TARGET for x in xs)


# (edit of the raw record, the key path the error must name): one line a case.
HOSTILE = [
    (("shapes.0.runs.feed.0.tflops", 0), "shapes.0.runs.feed.0: tflops = 0"),
    (("shapes.3.runs.gemm.1.tflops", "fast"), "shapes.3.runs.gemm.1: tflops = 'fast'"),
    (("shapes.2.runs.feed", []), "shapes.2.runs.feed: no runs"),
    (("shapes.1.runs.gemm.0.power_w", -3.0), "power_w = -3.0"),
]


@pytest.mark.parametrize("edit,says", HOSTILE, ids=[h[1] for h in HOSTILE])
def test_hostile_feed_runs_name_the_key_path(edit, says, prefill_v5_rows):
    d = raw()
    path, value = edit
    cur = d
    parts = path.split(".")
    for p in parts[:-1]:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    cur[parts[-1]] = value
    with pytest.raises(ValueError, match=re.escape(says)):
        mc.analyse(d, prefill_v5_rows, BENCH)


WAVES = [  # (m, n, sms, tile, tiles, fill)
    (1024, 1280, 132, (128, 256), 40, 40 / 132),
    (4096, 4096, 132, (128, 256), 512, 512 / 528),
    (1024, 4096, 128, (128, 256), 128, 1.0),
    (1000, 1000, 132, (128, 256), 8 * 4, 32 / 132),  # residues round up
]


@pytest.mark.parametrize("m,n,sms,tile,tiles,fill", WAVES)
def test_waves(m, n, sms, tile, tiles, fill):
    got = mc.waves(m, n, sms, tile)
    assert got[0] == tiles and got[1] == pytest.approx(fill)


def test_the_feed_block_reads_the_results(tmp_path):
    d = recorded()
    table = standing.feed_ceiling(ROOT)
    sms, tile = d["kernel"]["feed"]["grid"], d["kernel"]["feed"]["tile"]
    full, every = [], []
    for s in d["shapes"]:
        t = s["target"]
        row = next(x for x in table.splitlines() if x.startswith(f"| {t['m']}x{t['n']}x{t['k']} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        tiles, fill = mc.waves(t["m"], t["n"], sms, tile)
        assert cells[1] == f"{tiles} ({fill:.2f})"
        assert cells[5] == f"{s['feed']['tflops']:.1f}"
        assert cells[6] == f"{s['feed']['tflops'] / s['torch']['tflops']:.3f}"
        assert cells[7] == f"{s['feed_ceiling']:.3f}" and cells[8] == f"{s['gemm_speedup']:.3f}"
        every.append(s["feed_ceiling"])
        if fill >= mc.FULL_WAVES:
            full.append(s["feed_ceiling"])
    g = math.exp(sum(map(math.log, full)) / len(full))
    assert f"feed, over wave fill >= {mc.FULL_WAVES} ({len(full)}): " in table
    assert f"{g:.3f} × the best vendor" in table
    assert f"feed, over every shape ({len(every)})" in table
    assert "all passed" in table
    # A failed check of a twin says so; a shape without a feed run has dashes; a figure
    # of the results changes the block.
    d["shapes"][4]["gemm_check"]["ok"] = False
    t = d["shapes"][5]["target"]
    del d["shapes"][5]["feed"], d["shapes"][5]["feed_ceiling"]
    d["shapes"][0]["feed"]["tflops"] = 123.4
    (tmp_path / "bench/results").mkdir(parents=True)
    (tmp_path / standing.FEED_CEILING).write_text(json.dumps(d))
    table = standing.feed_ceiling(tmp_path)
    assert "FAILED" in table and "| 123.4 |" in table
    row = next(x for x in table.splitlines() if x.startswith(f"| {t['m']}x{t['n']}x{t['k']} |"))
    assert [c.strip() for c in row.strip("|").split("|")][5:8] == ["–", "–", "–"]
    doc = "x\n<!-- cudal2:begin feed-ceiling -->\nstale\n<!-- cudal2:end feed-ceiling -->\n"
    assert "| 123.4 |" in standing.regenerate(doc, tmp_path)


def test_the_blocks_cannot_be_made_before_the_results_are_committed(tmp_path):
    with pytest.raises(standing.ResultsMissing, match="FEED=1 ci/gpu_math_ceiling.sh"):
        standing.feed_ceiling(tmp_path)
    with pytest.raises(standing.ResultsMissing, match="FEED=1 ci/gpu_ncu_prefill.sh"):
        standing.ncu_feed(tmp_path)


def test_the_ncu_block_reads_each_role_of_each_page():
    table = standing.ncu_feed(ROOT)
    for f in standing.NCU_FEED:
        shape = re.search(r"(\d+x\d+x\d+)", f).group(1)
        got = mc.ncu_feed_details((ROOT / f).read_text(), f)
        feed_us = float(got["feed"]["Duration"])
        for role in mc.NCU_FEED_ROLES:
            row = next(x for x in table.splitlines() if x.startswith(f"| {shape} | {role} |"))
            us = float(got[role]["Duration"])
            assert f"| {got[role]['Duration']} | {us / feed_us:.3f} |" in row
            assert row.endswith(f"| {got[role]['Grid Size']} | {got[role]['Cluster Size']} |")
        assert f"`{got['cublaslt']['kernel']}`" in table


BYTE_SCALE = {"Gbyte": 1.0, "Mbyte": 1e-3, "Kbyte": 1e-6}  # ncu's units, in GB
# (block, its pages, its roles): the ncu blocks with the bytes of each memory level
BYTE_BLOCKS = [
    (standing.ncu_feedpair, standing.NCU_FEEDPAIR, mc.NCU_PAIR_ROLES),
    (standing.ncu_feedsk, standing.NCU_FEEDSK, mc.NCU_SK_ROLES),
    (standing.ncu_feedsplit, standing.NCU_FEEDSPLIT, mc.NCU_SPLIT_ROLES),
]


@pytest.mark.parametrize(
    "block,files,roles", BYTE_BLOCKS, ids=["pair", "even share", "aligned split"]
)
def test_the_byte_blocks_read_the_bytes_of_each_role_in_gigabytes(block, files, roles):
    """The ncu-feedpair, ncu-feedsk and ncu-feedsplit blocks: per shape and role, the
    DRAM, L2 and L2-to-SM bytes of its page, in GB whatever unit ncu gave (the math
    kernel's are in Mbyte)."""
    table = block(ROOT)
    for f in files:
        shape = re.search(r"(\d+x\d+x\d+)", f).group(1)
        got = mc.ncu_feed_details((ROOT / f).read_text(), f, roles, mc.NCU_PAIR_ROWS)
        for role in roles:
            row = next(x for x in table.splitlines() if x.startswith(f"| {shape} | {role} |"))
            cells = [c.strip() for c in row.strip("|").split("|")]
            for i, metric in ((6, "dram__bytes_read.sum"), (7, "lts__t_bytes.sum")):
                unit = got[role][metric + " unit"]
                want = float(got[role][metric].replace(",", "")) * BYTE_SCALE[unit]
                assert float(cells[i]) == pytest.approx(want, abs=0.006), (shape, role, metric)
        assert f"torch `{got['torch']['kernel']}`" in table


def test_the_byte_pages_give_both_units():
    """The byte blocks' pages hold both the plain path (Gbyte) and the scaled one (Mbyte:
    the math kernel's, and every kernel's at the smallest shapes), so the test above reads
    both."""
    units = set()
    for _, files, roles in BYTE_BLOCKS:
        for f in files:
            got = mc.ncu_feed_details((ROOT / f).read_text(), f, roles, mc.NCU_PAIR_ROWS)
            units |= {got[r]["lts__t_bytes.sum unit"] for r in roles}
    assert {"Gbyte", "Mbyte"} <= units


def _page(f: str) -> str:
    return (ROOT / f).read_text()


def _without_range(text: str, role: str) -> str:
    return "\n".join(x for x in text.splitlines() if f":{role}:none" not in x)


def _without_metric(text: str, metric: str) -> str:
    return "\n".join(x for x in text.splitlines() if f'"{metric}"' not in x)


# (edit of the 4096^3 page, what the error must say): one line a case.
NCU_HOSTILE = [
    (lambda t: _without_range(t, "feed"), "no kernel in NVTX range 'feed'"),
    (lambda t: _without_metric(t, "Duration"), "no metric 'Duration'"),
    (lambda t: t.replace('"Duration","us"', '"Duration","second"'), "Duration in 'second'"),
    (lambda t: t.replace(">:own:none", ">:OWN:none"), "no NVTX range in"),
]


@pytest.mark.parametrize("edit,says", NCU_HOSTILE, ids=[h[1] for h in NCU_HOSTILE])
def test_hostile_ncu_pages_are_named(edit, says):
    f = standing.NCU_FEED[0]
    text = edit(_page(f))
    with pytest.raises(ValueError, match=re.escape(says)):
        mc.ncu_feed_details(text, f)


# (command line, what the error must say): one line a case; each exits 2 before a GPU.
BAD_ARGS = [
    (["--feed", "feed,bogus"], "--feed: unknown kernel 'bogus'"),
    (["--feed", "gemmpair,"], None),  # a trailing comma names nothing more: accepted
    (["--smoke"], "--smoke launches the --feed kernels: name them"),
    (["--feed", ",", "--smoke"], "--smoke launches the --feed kernels: name them"),
]


@pytest.mark.parametrize("argv,says", BAD_ARGS, ids=[" ".join(a) for a, _ in BAD_ARGS])
def test_feed_command_lines(argv, says, math_ceiling_script, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(math_ceiling_script.shutil, "which", lambda name: None)  # no GPU here
    out = tmp_path / "o.json"
    assert math_ceiling_script.main([*argv, "--out", str(out), "--bench", BENCH]) == 2
    # A valid feed list gets as far as the missing nvidia-smi.
    assert (says or "nvidia-smi not found") in capsys.readouterr().err
    assert not out.exists()


def test_the_hosts_feed_constants_are_the_kernels(math_ceiling_script):
    text = CU.read_text()

    def const(name):
        return int(re.search(rf"constexpr int {name} = (\d+);", text).group(1))

    assert (const("FEED_THREADS"), const("STAGES")) == (
        math_ceiling_script.FEED_THREADS,
        math_ceiling_script.FEED_STAGES,
    )

    def kernel(name):  # FEED_KERNEL(symbol, tile M, tile N, sync, pair, paced, dims)
        sym = math_ceiling_script.feed_symbol(name)
        got = re.search(rf"FEED_KERNEL\({sym}, (\d+), (\d+), (\w+), (\w+), (\w+),", text)
        assert got, name
        return got.groups()

    tiles = {n: tuple(int(x) for x in kernel(n)[:2]) for n in mc.FEED}
    assert tiles == {
        n: math_ceiling_script.FEED_TILES.get(n, math_ceiling_script.FEED_TILE) for n in mc.FEED
    }
    paired = {n for n in mc.FEED if kernel(n)[3] == "true"}
    assert paired == set(math_ceiling_script.FEED_PAIRED)
    # The host's shared memory is the largest tile's ring (math_ceiling.cu's sum).
    ring = max(m + n for m, n in tiles.values()) * 64 * 2 * math_ceiling_script.FEED_STAGES
    assert ring + 2 * 8 * 4 + 8 + 1024 == math_ceiling_script.FEED_SMEM_BYTES
    assert (
        "FEED_SMEM_BYTES = STAGES * Tile<256, 176>::STAGE_BYTES + 2 * STAGES * 8 + 8 + 1024;"
        in text
    )


# (kernel, M, N, K, takes it): whole M tiles (a pair's two) and k tiles; whole N tiles for
# the twins, which store C unchecked; the feed kernels round the last N tile up.
FITS = [
    ("feed", 4096, 4096, 4096, True),
    ("feed", 4096, 1280, 8192, True),  # 1280 = 5 x 256
    ("feed", 4096, 4096, 4000, False),  # K % 64
    ("feed", 4032, 4096, 4096, False),  # M % 128
    ("gemm", 4096, 4224, 4096, False),  # N % 256: the twin would store past C
    ("feed", 4096, 4224, 4096, True),  # the feed kernels only load it (zeros past N)
    ("feedpair", 4224, 4096, 4096, False),  # a pair's 256 rows
    ("gemmpair", 4096, 4096, 4096, True),
    ("feedpaced", 1024, 8192, 1024, True),
    ("feedtall", 4096, 8192, 4096, True),  # 8192 = 46.5 x 176: the last tile rounded up
    ("feedtall", 4224, 4096, 4096, False),  # M % 256
    ("feedsk", 1024, 1280, 8192, True),  # 40 tiles: every SM a share of their k tiles
    ("feedsk", 1024, 4224, 4096, True),
    ("feedsk", 4032, 4096, 4096, False),  # M % 128
    ("feedsplit", 1024, 6144, 4096, True),  # 60 last-wave tiles, each cut in two
    ("feedsplit", 1088, 6144, 4096, False),  # M % 128
    ("feedtallsk", 4096, 6144, 4096, True),  # 6144 = 34.9 x 176
    ("feedtallsk", 1152, 4096, 4096, False),  # M % 256
    ("feed80", 1024, 1280, 8192, True),  # the narrow widths: 128 tiles of 128 x 80
    ("feed224", 1024, 7168, 8192, True),
    ("feed192", 1088, 6144, 4096, False),  # M % 128
]


@pytest.mark.parametrize(
    "kernel,m,n,k,takes", FITS, ids=[f"{c[0]}-{c[1]}x{c[2]}x{c[3]}" for c in FITS]
)
def test_which_shapes_a_feed_kernel_takes(kernel, m, n, k, takes, math_ceiling_script):
    assert math_ceiling_script.FeedKernel.fits(kernel, m, n, k) is takes


def test_the_feed_kernels_fit_one_cta_an_sm_without_local_memory(
    math_ceiling_cubin, math_ceiling_script
):
    got = math_ceiling_cubin
    symbol = math_ceiling_script.feed_symbol
    for name in mc.FEED:
        # setmaxnreg moves registers between warpgroups of one CTA: 384 threads must fit.
        assert got.registers[symbol(name)] * math_ceiling_script.FEED_THREADS <= 65536
    assert not re.search(r"[1-9]\d* bytes (stack frame|spill)", got.ptxas), got.ptxas
    if got.sass is None:
        pytest.skip("cuobjdump not installed")
    for name in mc.FEED:
        body = got.sass[symbol(name)]
        tn = math_ceiling_script.FEED_TILES.get(name, math_ceiling_script.FEED_TILE)[1]
        assert f"HGMMA.64x{tn}x16.F32" in body, name
        assert not re.search(r"\s(LDL|STL)[.\s]", body), name


def test_a_results_file_without_the_feed_grid_cannot_make_the_block(tmp_path):
    d = copy.deepcopy(recorded())
    del d["kernel"]["feed"]
    (tmp_path / "bench/results").mkdir(parents=True)
    (tmp_path / standing.FEED_CEILING).write_text(json.dumps(d))
    with pytest.raises(KeyError, match="feed"):
        standing.feed_ceiling(tmp_path)


def test_each_feed_kernels_count_of_k_tiles_is_in_its_block(tmp_path):
    d = recorded(ROOT / standing.FEED_CEILING_SK)
    checked = [s for s in d["shapes"] if "feedsk_check" in s]
    assert checked and all(s["feedsk_check"]["ok"] for s in checked)
    table = standing.feed_ceiling(ROOT, standing.FEED_CEILING_SK)
    n = len(checked)
    assert (
        "- feedsk: its k tiles, counted from its sums on operands of ones before it was "
        f"timed, were the shape's on {n} of {n} shapes."
    ) in table
    # A wrong count names its shape; a run without counts (the first) has no such line.
    checked[3]["feedsk_check"]["ok"] = False
    (tmp_path / "bench/results").mkdir(parents=True)
    (tmp_path / standing.FEED_CEILING_SK).write_text(json.dumps(d))
    table = standing.feed_ceiling(tmp_path, standing.FEED_CEILING_SK)
    t = checked[3]["target"]
    assert f"on {n - 1} of {n} shapes; WRONG on {t['m']}x{t['n']}x{t['k']}." in table
    assert "counted from its sums" not in standing.feed_ceiling(ROOT)


def _label(s) -> str:
    return "{m}x{n}x{k}".format(**s["target"])


def _bound_rows(table: str) -> dict[str, list[str]]:
    return {
        row.split("|")[1].strip(): [c.strip() for c in row.strip("|").split("|")]
        for row in table.splitlines()
        if re.match(r"\| \d+x\d+x\d+ \|", row)
    }


def test_the_bound_is_the_best_stall_free_kernel_of_every_run(tmp_path):
    runs = {p: recorded(ROOT / p) for p in standing.FEED_RUNS}
    best: dict[str, dict[str, float]] = {}
    for d in runs.values():
        for s in d["shapes"]:
            if s.get("llm_public"):
                t = s["target"]
                got = best.setdefault(f"{t['m']}x{t['n']}x{t['k']}", {})
                for name, key in mc.FEED.items():
                    if name.startswith("feed") and key in s:
                        got[name] = max(got.get(name, 0.0), s[key])
    table = standing.feed_bound(ROOT)
    rows = _bound_rows(table)
    assert set(rows) == set(best) and len(best) == 16
    names = table.splitlines()[2].strip("|").split("|")[2:-2]
    names = [x.strip() for x in names]
    assert "feedsk" in names and "gemm" not in names
    tops = {}
    for shape, kernels in best.items():
        top = max(kernels, key=lambda x: kernels[x])
        tops[shape] = kernels[top]
        assert rows[shape][-1] == top and rows[shape][-2] == f"{kernels[top]:.3f}"
        for i, name in enumerate(names):
            assert rows[shape][2 + i] == (f"{kernels[name]:.3f}" if name in kernels else "–")
    g = math.exp(sum(map(math.log, tops.values())) / len(tops))
    assert f"over the 16 shapes: {g:.3f} × the best vendor" in table
    full = {k: v for k, v in tops.items() if float(rows[k][1]) >= mc.FULL_WAVES}
    part = [v for k, v in tops.items() if k not in full]
    need = (mc.TARGET**16 / math.prod(full.values())) ** (1 / len(part))
    assert f"would take the {len(part)} others to {need:.3f}" in table
    # A faster run of one kernel at one shape becomes that shape's bound; a shape that
    # is not llm-public leaves the table.
    d = runs[standing.FEED_CEILING_SK]
    s = next(x for x in d["shapes"] if _label(x) == "4096x4096x4096")
    s["feedsk_ceiling"] = 1.5
    other = next(x for x in d["shapes"] if x.get("llm_public") and x is not s)
    t = other["target"]
    (tmp_path / "bench/results").mkdir(parents=True)
    for p, dd in runs.items():
        if p != standing.FEED_CEILING_SK:
            (tmp_path / p).write_text(json.dumps(dd))
        else:
            for x in dd["shapes"]:
                if x["target"] == t:
                    x["llm_public"] = False
            (tmp_path / p).write_text(json.dumps(dd))
    rows = _bound_rows(standing.feed_bound(tmp_path))
    assert rows["4096x4096x4096"][-2:] == ["1.500", "feedsk"]
    assert f"{t['m']}x{t['n']}x{t['k']}" in rows  # the other runs still have it


def test_the_bound_needs_every_run_and_a_public_shape(tmp_path):
    with pytest.raises(standing.ResultsMissing, match="FEED=1 ci/gpu_math_ceiling.sh"):
        standing.feed_bound(tmp_path)
    d = recorded(ROOT / standing.FEED_CEILING_SK)
    for s in d["shapes"]:
        s["llm_public"] = False
    with pytest.raises(ValueError, match="no llm-public shape"):
        mc.bound_markdown({"x.json": d})


def test_the_readme_sentence_gives_the_bound_of_the_feed_bound_block():
    """README's where-it-stands sentence on prefill reads the same runs as the feed-bound
    block, and says the block's best per shape over the 16."""
    line = standing._feed_bound_line(ROOT)
    block = standing.feed_bound(ROOT)
    g = re.search(r"The best per shape, over the 16 shapes: ([\d.]+) ×", block).group(1)
    assert f"reaches at most {g}x the best vendor" in line
    assert f"({len(standing.FEED_RUNS)} runs, `{standing.FEED_RUNS[0]}`" in line
    assert "no prefill design measured can reach issue 22's 1.03x" in line


def test_the_readme_sentence_turns_where_the_bound_reaches_the_target(monkeypatch):
    monkeypatch.setattr(mc, "TARGET", 1.0)
    line = standing._feed_bound_line(ROOT)
    assert "a prefill design measured may reach issue 22's 1.00x" in line
