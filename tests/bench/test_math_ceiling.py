"""Issue 22's math ceiling without a GPU (``cudal2.bench.math_ceiling`` and
bench/experiments/math_ceiling.py): the analysis (the ceiling per shape, its geomean,
the scaling by the torch ratio between this run and the bench file), its hostile
inputs, the monitor's parsing and windows, ``--dry-run`` end to end, the docs block;
and math_ceiling.cu compiles for sm_90a to HGMMA with no local memory.

tests/bench/data/math-ceiling-raw.json is the H100 run's raw record (the committed
bench/results/h100-math-ceiling.json before its analysis); the expectations below are
computed from its inputs and from the committed bench file, never written down."""

from __future__ import annotations

import copy
import json
import math
import re
import statistics
import sys
from pathlib import Path

import pytest

from cudal2.bench import math_ceiling as mc
from cudal2.bench import standing

ROOT = Path(__file__).resolve().parents[2]
CU = ROOT / "bench/experiments/math_ceiling.cu"
RAW = Path(__file__).parent / "data/math-ceiling-raw.json"
BENCH = "bench/results/h100-llm-public-prefill-v5.jsonl"


def raw() -> dict:
    return json.loads(RAW.read_text())


def bench_row(rows, m, n, k):
    (r,) = [
        r
        for r in rows
        if r["mode"] == "offline"
        and r["target"]["dtype"] == "fp16"
        and (r["target"]["m"], r["target"]["n"], r["target"]["k"]) == (m, n, k)
    ]
    return r


def _scale_torch(d, f):
    for s in d["shapes"]:
        for r in s["runs"]["torch"]:
            r["tflops"] *= f


def _drop_public(d, _):
    for s in d["shapes"]:
        s["llm_public"] = False


def _outlier(d, _):
    for s in d["shapes"]:
        s["runs"]["math"][0]["tflops"] = 1e6  # one wild repetition: the median ignores it


# (case, edit of the raw record, factor): each row's expectations are computed below.
CASES = [
    ("as recorded", None, 1.0),
    ("this run's torch twice as fast (clocks): the best vendor scales with it", _scale_torch, 2.0),
    ("this run's torch 20% slower", _scale_torch, 0.8),
    ("no llm-public shape", _drop_public, 1.0),
    ("one wild repetition", _outlier, 1.0),
]


@pytest.mark.parametrize("case,edit,factor", CASES, ids=[c[0] for c in CASES])
def test_ceiling_per_shape_and_geomeans(case, edit, factor, prefill_v5_rows):
    d = raw()
    if edit:
        edit(d, factor)
    res = mc.analyse(d, prefill_v5_rows, BENCH)
    ceilings, public = [], []
    for s, given in zip(res["shapes"], d["shapes"], strict=True):
        t = s["target"]
        torch_tf = statistics.median(r["tflops"] for r in given["runs"]["torch"])
        math_tf = statistics.median(r["tflops"] for r in given["runs"]["math"])
        assert s["torch"]["tflops"] == pytest.approx(torch_tf, abs=1e-3)
        assert s["math"]["tflops"] == pytest.approx(math_tf, abs=1e-3)
        try:
            b = bench_row(prefill_v5_rows, t["m"], t["n"], t["k"])
        except ValueError:  # not in the bench file: no vendor, no ceiling
            assert "vendor" not in s and "ceiling_speedup" not in s
            continue
        over = b["baselines"]["torch"]["median_us"] / b["best_vendor"]["median_us"]
        want = math_tf / (torch_tf * over)
        assert s["ceiling_speedup"] == pytest.approx(want, rel=1e-3)
        assert s["vendor"]["name"] == b["best_vendor"]["name"]
        assert s["vendor"]["tflops"] == pytest.approx(torch_tf * over, rel=1e-3)
        ceilings.append(want)
        if given["llm_public"]:
            public.append(want)
    summ = res["summary"]
    assert summ["shapes"] == len(ceilings) and summ["llm_public_shapes"] == len(public)
    g = math.exp(sum(map(math.log, ceilings)) / len(ceilings))
    assert summ["geomean_ceiling"] == pytest.approx(g, rel=1e-3)
    if public:
        gp = math.exp(sum(map(math.log, public)) / len(public))
        assert summ["geomean_ceiling_llm_public"] == pytest.approx(gp, rel=1e-3)
    else:
        assert summ["geomean_ceiling_llm_public"] is None
    assert summ["shapes_allowing_target"] == sum(c >= mc.TARGET for c in ceilings)


def test_scaling_by_the_torch_ratio_moves_every_ceiling_inversely(prefill_v5_rows):
    base = mc.analyse(raw(), prefill_v5_rows, BENCH)
    d = raw()
    _scale_torch(d, 1.25)
    faster = mc.analyse(d, prefill_v5_rows, BENCH)
    pairs = [
        (a["ceiling_speedup"], b["ceiling_speedup"])
        for a, b in zip(base["shapes"], faster["shapes"], strict=True)
        if "ceiling_speedup" in a
    ]
    assert pairs and all(b == pytest.approx(a / 1.25, rel=1e-3) for a, b in pairs)


def _set(path, value):
    def edit(d):
        cur = d
        parts = path.split(".")
        for p in parts[:-1]:
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        if value is KeyError:
            del cur[parts[-1]]
        else:
            cur[parts[-1]] = value

    return edit


# Hostile raw records: (edit, the key path the error must name).
HOSTILE = [
    (_set("shapes", KeyError), "shapes: missing"),
    (_set("shapes.0.runs.torch", KeyError), "shapes.0: runs.torch: missing"),
    (_set("shapes.0.runs.math", []), "shapes.0.runs.math: no runs"),
    (_set("shapes.1.runs.math.2.tflops", 0), "shapes.1.runs.math.2: tflops = 0"),
    (_set("shapes.0.runs.torch.0.tflops", -5.0), "shapes.0.runs.torch.0: tflops = -5.0"),
    (_set("shapes.0.runs.torch.0.tflops", "fast"), "tflops = 'fast'"),
    (_set("shapes.0.runs.torch.1.tflops", True), "tflops = True"),
    (_set("shapes.0.runs.torch.0.power_w", -1.0), "power_w = -1.0"),
    (_set("shapes.2.target.m", KeyError), "shapes.2: target.m: missing"),
    (_set("shapes.2.target.k", 0), "shapes.2: target.k = 0"),
]


@pytest.mark.parametrize("edit,says", HOSTILE, ids=[h[1] for h in HOSTILE])
def test_hostile_raw_records_name_the_key_path(
    edit, says, prefill_v5_rows, math_ceiling_script, tmp_path, capsys
):
    d = raw()
    edit(d)
    with pytest.raises(ValueError, match=re.escape(says)):
        mc.analyse(d, prefill_v5_rows, BENCH)
    bad = tmp_path / "raw.json"
    bad.write_text(json.dumps(d))
    out = tmp_path / "out.json"
    assert (
        math_ceiling_script.main(["--dry-run", str(bad), "--out", str(out), "--bench", BENCH]) == 2
    )
    assert says in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--bench", "no/such.jsonl"], "no/such.jsonl"),
        (["--dry-run", "no/such-raw.json"], "no/such-raw.json"),
    ],
)
def test_missing_files_exit_2_naming_them(argv, says, math_ceiling_script, tmp_path, capsys):
    assert (
        math_ceiling_script.main(["--dry-run", str(RAW), *argv, "--out", str(tmp_path / "o.json")])
        == 2
    )
    assert says in capsys.readouterr().err


def test_dry_run_writes_what_the_docs_block_reads(
    math_ceiling_script, tmp_path, capsys, prefill_v5_rows
):
    out = tmp_path / "out.json"
    assert (
        math_ceiling_script.main(["--dry-run", str(RAW), "--out", str(out), "--bench", BENCH]) == 0
    )
    printed = capsys.readouterr().out
    got = json.loads(out.read_text())
    assert got == json.loads(json.dumps(mc.analyse(raw(), prefill_v5_rows, BENCH)))
    assert f"geomean ceiling {got['summary']['geomean_ceiling']}" in printed
    assert not list(tmp_path.glob("*.tmp"))  # written atomically, nothing left behind
    # The docs block, from a results file where the lead will commit it.
    (tmp_path / "bench/results").mkdir(parents=True)
    (tmp_path / standing.MATH_CEILING).write_text(out.read_text())
    table = standing.math_ceiling(tmp_path)
    for s in got["shapes"]:
        t = s["target"]
        row = next(x for x in table.splitlines() if x.startswith(f"| {t['m']}x{t['n']}x{t['k']} |"))
        assert f"| {s['math']['tflops']:.1f} |" in row
        want = f"{s['ceiling_speedup']:.3f}" if "ceiling_speedup" in s else "–"
        assert row.endswith(f"| {want} |")
    summ = got["summary"]
    assert f"{summ['geomean_ceiling']:.3f} over {summ['shapes']} shapes" in table
    for v in got["variants"].values():
        assert f"| {v['label']} |" in table
    # A figure of the results changes the block.
    got["shapes"][0]["math"]["tflops"] = 123.4
    (tmp_path / standing.MATH_CEILING).write_text(json.dumps(got))
    assert "| 123.4 |" in standing.math_ceiling(tmp_path)
    doc = "x\n<!-- cudal2:begin math-ceiling -->\nstale\n<!-- cudal2:end math-ceiling -->\n"
    assert "| 123.4 |" in standing.regenerate(doc, tmp_path)


def test_the_block_cannot_be_made_before_the_results_are_committed(tmp_path):
    with pytest.raises(standing.ResultsMissing, match="ci/gpu_math_ceiling.sh"):
        standing.math_ceiling(tmp_path)


def test_load_rejects_a_results_file_without_what_the_table_reads(tmp_path, prefill_v5_rows):
    res = mc.analyse(raw(), prefill_v5_rows, BENCH)
    assert mc.load(json.dumps(res), "f.json")["summary"] == res["summary"]
    for path, says in (("env.power_limit_w", "env.power_limit_w: missing"), ("summary", "summary")):
        d = copy.deepcopy(res)
        parent, _, key = path.rpartition(".")
        del (d[parent] if parent else d)[key]
        with pytest.raises(ValueError, match=re.escape(f"f.json: {says}")):
            mc.load(json.dumps(d), "f.json")
    with pytest.raises(ValueError, match="f.json: not JSON"):
        mc.load("{", "f.json")


SMI = [
    ("2026/11/25 05:50:04.123, 651.20, 1755, 61", (651.2, 1755.0, 61.0)),
    ("2026/11/25 05:50:04.223, [N/A], 1755, 61", None),
    ("2026/11/25 05:50:04.3", None),
    ("", None),
    ("not a date, 1, 2, 3", None),
]


@pytest.mark.parametrize("line,want", SMI)
def test_nvidia_smi_lines(line, want):
    got = mc.parse_smi_line(line)
    if want is None:
        assert got is None
    else:
        assert got[1:] == want and got[0] > 0


def test_a_window_summarises_only_its_samples():
    samples = [(1.0, 100.0, 1900.0, 40.0), (2.0, 600.0, 1700.0, 60.0), (3.0, 700.0, 1500.0, 65.0)]
    samples.append((9.0, 50.0, 300.0, 30.0))
    w = mc.window(samples, 2.0, 3.0)
    assert w == {
        "power_w": statistics.fmean([600.0, 700.0]),
        "power_w_max": 700.0,
        "sm_mhz": statistics.fmean([1700.0, 1500.0]),
        "sm_mhz_min": 1500.0,
        "temp_c_max": 65.0,
        "samples": 2,
    }
    assert mc.window(samples, 4.0, 5.0)["samples"] == 0
    assert mc.window(samples, 4.0, 5.0)["power_w"] is None


def test_the_hosts_constants_are_the_kernels(math_ceiling_script):
    text = CU.read_text()

    def const(name):
        return int(re.search(rf"constexpr int {name} = (\d+);", text).group(1))

    assert (const("KTILES"), const("BM"), const("BN"), const("BK"), const("THREADS")) == (
        math_ceiling_script.KTILES,
        math_ceiling_script.TILE_M,
        math_ceiling_script.TILE_N,
        math_ceiling_script.TILE_K,
        math_ceiling_script.THREADS,
    )


def test_the_kernel_compiles_to_hgmma_without_local_memory(math_ceiling_cubin, math_ceiling_script):
    got = math_ceiling_cubin
    assert "0 bytes spill stores, 0 bytes spill loads" in got.ptxas
    assert not re.search(r"[1-9]\d* bytes (stack frame|spill)", got.ptxas), got.ptxas
    # One CTA per SM: more than 128 registers a thread leaves no room for a second CTA.
    assert got.registers["math_n256"] > 128 and got.registers["math_n128"] > 128, got.registers
    if got.sass is None:
        pytest.skip("cuobjdump not installed")
    k16_steps = math_ceiling_script.KTILES * math_ceiling_script.TILE_K // 16  # a round, unrolled
    for name, op, per_step in (("math_n256", "64x256x16", 1), ("math_n128", "64x128x16", 2)):
        body = got.sass[name]
        assert body.count(f"HGMMA.{op}.F32") == k16_steps * per_step, name
        assert not re.search(r"\s(LDL|STL)[.\s]", body), name


# -- the GPU run's plumbing on the CPU: a stand-in nvidia-smi (its env line and a sample
# every 10 ms: the parsing, the monitor's process and windows) and stand-ins for the
# kernel and the timing function; the figures are the stand-ins', not measurements. --

FAKE_SMI = """#!{python}
import sys, time
from datetime import datetime
args = " ".join(sys.argv[1:])
if "timestamp" not in args:
    print("NVIDIA H100 80GB HBM3, 580.159.04, 700.00, 700.00, 1980")
    sys.exit(0)
while True:
    now = datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    print(f"{{now}}, 650.00, 1755, 61", flush=True)
    time.sleep(0.01)
"""


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    return smi


def test_the_monitor_reads_nvidia_smi_into_windows(math_ceiling_script, fake_smi):
    import time

    mon = math_ceiling_script.Monitor(0)
    assert mon.source == "nvidia-smi -lms 100"  # pynvml is not installed here
    t0 = time.time()
    time.sleep(0.3)
    t1 = time.time()
    mon.stop()
    assert mon._proc.poll() is not None  # the sampler process is gone
    w = mc.window(mon.samples, t0, t1)
    assert w["samples"] >= 5 and w["power_w"] == 650.0 and w["sm_mhz"] == 1755.0
    env = math_ceiling_script.gpu_env(0)
    assert env["gpu"] == "NVIDIA H100 80GB HBM3" and env["power_limit_w"] == 700.0


class FakeKernel:
    """MathKernel's interface without a GPU."""

    def __init__(self, cubin, sms):
        self.sms = sms

    def grid(self, grid):
        return self.sms if grid == "sms" else int(grid)

    def rounds_for(self, flops, grid):
        return max(1, round(flops / (self.grid(grid) * 16777216)))

    def flops(self, rounds, grid):
        return self.grid(grid) * rounds * 16777216

    def launcher(self, kernel, grid, operands, rounds):
        return lambda j: None

    def check(self, kernel):
        return {"kernel": kernel, "max_rel_err": 0.0, "ok": True}

    def fixed_us(self):
        return 3.0

    def short_run(self, seconds, idle_s):
        return {"rounds": 1, "seconds": seconds, "idle_s": idle_s, "tflops": 1.0}


def test_a_cpu_run_through_the_measurement_plumbing(
    math_ceiling_script, fake_smi, tmp_path, monkeypatch
):
    import time

    import torch

    from cudal2.bench import bench as bench_mod
    from cudal2.packaging.runtime import driver
    from cudal2.verify import timing

    def sustained(fns, nsets, seconds, reps, seed):
        out = {}
        for name in fns:
            out[name] = []
            for _ in range(reps):
                t0 = time.time()
                time.sleep(0.06)
                out[name].append(timing.SustainedRun(1000, 0.05, t0, time.time()))
        return out

    monkeypatch.setattr(timing, "time_sustained", sustained)
    monkeypatch.setattr(
        bench_mod, "make_operands", lambda t, n, s: bench_mod.Operands([], [], [], [])
    )
    monkeypatch.setattr(driver, "sm_count", lambda i: 132)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(math_ceiling_script, "MathKernel", FakeKernel)
    monkeypatch.setattr(math_ceiling_script, "SHORT_IDLE_S", 0.0)
    monkeypatch.chdir(ROOT)
    shapes = tmp_path / "shapes.toml"
    shapes.write_text("shapes = [[4096, 4096, 4096], [2048, 2048, 2048], [1024, 8192, 1024]]\n")
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"stand-in")
    out = tmp_path / "out.json"
    argv = ["--shapes", str(shapes), "--cubin", str(cubin), "--out", str(out)]
    assert math_ceiling_script.main([*argv, "--seconds", "0.05", "--reps", "2"]) == 0
    got = mc.load(out.read_text(), "out.json")
    assert [tuple(s["target"][d] for d in "mnk") for s in got["shapes"]] == [
        (4096, 4096, 4096),
        (2048, 2048, 2048),
        (1024, 8192, 1024),
    ]  # the file's order, whatever order they ran in
    assert [s["llm_public"] for s in got["shapes"]] == [True, False, True]
    assert got["env"]["monitor"] == "nvidia-smi -lms 100" and got["env"]["power_limit_w"] == 700.0
    assert sorted(got["variants"]) == sorted(math_ceiling_script.VARIANTS)
    for s in got["shapes"]:
        assert len(s["runs"]["torch"]) == len(s["runs"]["math"]) == 2
        assert s["torch"]["power_w"] == 650.0  # the stand-in's samples, in each run's window
        flops = 2.0 * s["target"]["m"] * s["target"]["n"] * s["target"]["k"]
        assert s["torch"]["tflops"] == pytest.approx(flops / 50.0 / 1e6, rel=1e-3)
        assert s["math"]["tflops"] == pytest.approx(s["math_flops_per_call"] / 50.0 / 1e6, rel=1e-3)
    assert got["summary"]["shapes"] == 2 and got["summary"]["llm_public_shapes"] == 2
    assert got["fixed_us"] == 3.0 and got["checks"][0]["ok"]
