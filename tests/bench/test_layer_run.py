"""``cudal2-bench layer`` on the CPU: a case checked and timed (a CPU timer stands in
for the GPU's), the results file its writer makes, the table and the docs block made
from that file, and hostile command lines (exit 2, one clear line)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import types

import pytest
import torch

from cudal2.bench import layer_run as R
from cudal2.bench import standing
from cudal2.cli import bench as bench_cli
from cudal2.verify.timing import Timing

from .test_layer import SMALL, fake_package, small_shape


def cpu_timer(fns, nsets, est_us):
    """The variants interleaved, each call timed by the host clock (µs): real CPU
    figures where the GPU run has CUDA-graph replays."""
    samples = {name: [] for name in fns}
    for rep in range(6):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn(rep % nsets)
            samples[name].append((time.perf_counter() - t0) * 1e6)
    return {name: Timing(tuple(s)) for name, s in samples.items()}


def never(*args):
    raise AssertionError("a case that failed its check was timed")


def cpu_case(pkg, dims=SMALL[0], m=3, timer=cpu_timer):
    shape = small_shape(*dims)
    return shape, R.measure_case(shape, "fp32", m, pkg, timer, device="cpu", compiled=False, sets=2)


def test_a_cpu_case_is_checked_then_timed_with_its_dispatch_recorded():
    pkg = fake_package(("residual",))
    _, case = cpu_case(pkg)
    assert case["ok"] == {"vendor": True, "cudal2": True}
    assert case["err"]["cudal2"] <= case["bound_abs"]
    assert case["plan"]["o_proj"] == "residual" and case["plan"]["qkv"] == "none"
    d = case["dispatch"]
    assert d["o_proj"]["fused"] and d["o_proj"]["op"] == "linear_residual"
    assert not d["qkv"]["fused"] and d["qkv"]["ran"] == "unknown"  # a fake package's entries
    assert all(t > 0 for t in case["timing"]["vendor"]["samples_us"])
    assert case["speedup"] == pytest.approx(
        case["timing"]["vendor"]["median_us"] / case["timing"]["cudal2"]["median_us"], rel=1e-3
    )
    assert case["speedup_spread"] is not None


def test_a_wrong_cudal2_layer_is_reported_and_not_timed():
    pkg = fake_package()
    right = pkg.linear
    pkg.linear = lambda x, w: right(x, w) * 1.001  # a GEMM 0.1% off
    _, case = cpu_case(pkg, timer=never)
    assert case["ok"] == {"vendor": True, "cudal2": False}
    assert case["not_timed"] == "failed the fp32 check: cudal2"
    assert "median_us" not in case and "timing" not in case


def test_the_cudal2_layer_must_be_within_twice_the_vendors_error():
    ref = torch.ones(4)
    got = R.check(ref, {"vendor": ref + 1e-4, "cudal2": ref + 3e-4}, "fp16")
    assert got["ok"] == {"vendor": True, "cudal2": False}  # in the dtype bound, not 2x vendor
    got = R.check(ref, {"vendor": ref + 1e-4, "cudal2": ref + 2e-4}, "fp16")
    assert got["ok"] == {"vendor": True, "cudal2": True}
    got = R.check(ref, {"vendor": ref + 0.02, "cudal2": ref}, "fp16")
    assert got["ok"] == {"vendor": False, "cudal2": True}


def test_dispatch_names_kind_kernel_and_pdl_of_each_entry_hit():
    def entry(key, kind, pdl):
        return types.SimpleNamespace(
            key=key, kind=kind, kernel=f"k_{key}", launch={"pdl": pdl} if kind == "kernel" else None
        )

    table = types.SimpleNamespace(
        entries=[entry("a", "kernel", True), entry("b", "kernel", False), entry("c", "cublaslt", 0)]
    )
    pkg = types.SimpleNamespace(_api=types.SimpleNamespace(table=table))
    probe = {
        "qkv": {"op": "linear_rmsnorm", "hits": {"a": 1}, "fallbacks": {}},
        "o_proj": {"op": "linear", "hits": {"b": 1}, "fallbacks": {}},
        "gate_up": {"op": "linear", "hits": {"c": 1}, "fallbacks": {}},
        "down": {"op": "linear_residual", "hits": {}, "fallbacks": {"no_entry": 1}},
    }
    d = R.dispatch(pkg, probe)
    assert (d["qkv"]["ran"], d["qkv"]["pdl"], d["qkv"]["fused"]) == ("kernel", True, True)
    assert d["qkv"]["runs"][0]["kernel"] == "k_a"
    assert (d["o_proj"]["ran"], d["o_proj"]["pdl"]) == ("kernel", False)
    assert (d["gate_up"]["ran"], d["gate_up"]["pdl"]) == ("cublaslt", False)
    assert d["down"]["ran"] == "fallback" and d["down"]["runs"][0]["reason"] == "no_entry"


@pytest.fixture
def results_root(tmp_path):
    """A checkout whose bench/results/ holds a layer results file written by the
    results writer from a CPU run (two models' shapes, real CPU figures)."""
    pkg = fake_package(("residual", "gated"))
    pkg.__name__ = "fake_cudal2_package"
    shapes, cases = [], []
    for model, dims in (("llama-3.1-8b", SMALL[0]), ("llama-3.1-70b-tp8", SMALL[2])):
        shape = dataclasses.replace(small_shape(*dims), model=model)
        shapes.append(shape)
        for m in (1, 4):
            cases.append(
                R.measure_case(
                    shape, "fp32", m, pkg, cpu_timer, device="cpu", compiled=False, sets=2
                )
            )
    env = {"gpu": "cpu", "torch": torch.__version__, "cuda": None, "reps": 6, "seed": 0}
    env["timing"] = "6 host-clock calls on the CPU (a test's stand-in)"
    doc = R.results_doc(env, pkg, shapes, cases)
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / standing.LAYER_RESULTS).write_text(R.results_json(doc))
    return tmp_path


def test_the_docs_block_is_the_table_of_the_results_file(results_root):
    doc = json.loads((results_root / standing.LAYER_RESULTS).read_text())
    block = standing.layer_bench(results_root)
    assert block.startswith(f"`{standing.LAYER_RESULTS}`: cpu, torch ")
    assert "fused ops available: residual, gated. µs per layer: median of 6 host-clock" in block
    rows = [line for line in block.splitlines() if line.startswith("| llama")]
    assert len(rows) == len(doc["cases"]) == 4
    c = doc["cases"][0]
    assert f"| {c['m']} | {c['median_us']['vendor']:.1f} (" in rows[0]
    assert f"| {c['speedup']:.3f} (" in rows[0]
    assert "o_proj unknown+residual" in rows[0] and "gate_up unknown+gated" in rows[0]
    assert "- `llama-3.1-70b-tp8` (tp 1, per GPU): hidden 512, 8 heads, 1 kv heads" in block
    # the figure follows the file
    doc["cases"][0]["speedup"] = 9.876
    (results_root / standing.LAYER_RESULTS).write_text(json.dumps(doc))
    assert "| 9.876 (" in standing.layer_bench(results_root)


def test_a_document_holding_the_block_regenerates_from_the_file(results_root, capsys):
    f = results_root / "doc.md"
    f.write_text("<!-- cudal2:begin layer-bench -->\nstale\n<!-- cudal2:end layer-bench -->\n")
    args = ["report", str(f), "--root", str(results_root)]
    assert bench_cli.main([*args, "--check"]) == 1
    assert bench_cli.main(args) == 0
    assert "| llama-3.1-8b | fp32 | 1 |" in f.read_text()
    assert bench_cli.main([*args, "--check"]) == 0


def test_without_the_results_file_the_block_cannot_be_made(tmp_path, capsys):
    (tmp_path / "bench" / "results").mkdir(parents=True)
    with pytest.raises(standing.ResultsMissing, match="ci/gpu_layer.sh"):
        standing.layer_bench(tmp_path)
    f = tmp_path / "doc.md"
    f.write_text("<!-- cudal2:begin layer-bench -->\n<!-- cudal2:end layer-bench -->\n")
    assert bench_cli.main(["report", str(f), "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(f) in err and "h100-layer.json is not committed" in err


def test_report_without_files_skips_the_unmeasured_block(monkeypatch, capsys, tmp_path):
    """Every other block is printed; the layer block, its results not in the root, says
    why it is not."""
    made = {"fine": lambda root: "ok", "layer-bench": standing.layer_bench}
    monkeypatch.setattr(standing, "BLOCKS", made)
    (tmp_path / "bench" / "results").mkdir(parents=True)  # a results folder, without it
    assert bench_cli.main(["report", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "<!-- cudal2:begin fine -->\nok\n" in out.out and "layer-bench" not in out.out
    assert "block layer-bench skipped" in out.err


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "not JSON"),
        ('{"kind": "other", "format": 1}', "not a cudal2-layer-bench results file"),
        ('{"kind": "cudal2-layer-bench", "format": 1}', "missing gpu, torch, package, timing"),
    ],
)
def test_a_broken_results_file_is_refused_naming_it(text, says):
    with pytest.raises(R.LayerResultsError, match=f"x.json: {says}"):
        R.load_results(text, "x.json")


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch):
    """An importable module with a cudal2 package's surface, and one without it."""
    (tmp_path / "fake_cudal2_pkg.py").write_text(
        "linear = lambda x, w: x @ w.T\nwarmup = lambda: 0\nstats = None\n"
    )
    (tmp_path / "not_a_wheel.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("fake_cudal2_pkg", "not_a_wheel"):
        monkeypatch.delitem(sys.modules, name, raising=False)


HOSTILE = [
    # (arguments after "layer", what the one line says)
    (["--model", "llama-2"], "argument --model: invalid choice: 'llama-2'"),
    (["--m", "0"], "argument --m: must be a positive integer, got '0'"),
    (["--m", "-3"], "argument --m: must be a positive integer, got '-3'"),
    (["--m", "x"], "argument --m: not an integer: 'x'"),
    (["--m", "1", "4096"], "--m 4096: decode sequences must be <= 1024"),
    (["--dtype", "fp8"], "argument --dtype: invalid choice: 'fp8'"),
    (["--reps", "0"], "argument --reps: must be a positive integer"),
    (["--package", "no_such_cudal2_pkg"], "'no_such_cudal2_pkg': no such module installed"),
    (["--package", ".relative"], "--package '.relative':"),
    (["--package", ""], "--package '':"),
    (["--package", "not_a_wheel"], "'not_a_wheel': not a cudal2 wheel"),
]


@pytest.mark.parametrize(("args", "says"), HOSTILE)
def test_hostile_layer_command_lines_exit_2_with_one_line(tmp_path, fake_wheel, capsys, args, says):
    argv = ["layer", "--package", "fake_cudal2_pkg", "--out", str(tmp_path / "l.json"), *args]
    assert bench_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err
    assert not (tmp_path / "l.json").exists()


def test_a_good_command_line_without_a_gpu_exits_1(tmp_path, fake_wheel, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = ["layer", "--package", "fake_cudal2_pkg", "--out", str(tmp_path / "l.json")]
    assert bench_cli.main(argv) == 1
    assert "no CUDA GPU here" in capsys.readouterr().err


def test_a_case_that_raised_is_a_row_saying_why(results_root):
    path = results_root / standing.LAYER_RESULTS
    doc = json.loads(path.read_text())
    try:
        raise RuntimeError("CUDA error: an illegal memory access\nwas encountered")
    except RuntimeError as e:
        doc["cases"].append(R.failed_case("llama-3.1-8b", "bf16", 64, e))
    path.write_text(R.results_json(doc))
    row = standing.layer_bench(results_root).splitlines()[-3]
    assert row == (
        "| llama-3.1-8b | bf16 | 64 | – | – | not timed: error: RuntimeError: CUDA error: "
        "an illegal memory access was encountered | – |  |"
    )


def test_the_run_goes_on_past_a_case_that_raised(monkeypatch, capsys):
    """``run`` on the CPU: its measuring stood in by CPU cases, one of which raises."""
    pkg = fake_package()
    pkg.__name__ = "fake"

    measure_case = R.measure_case

    def measure(shape, dtype, m, pkg, timer, seed):
        if m == 16:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return measure_case(shape, dtype, m, pkg, cpu_timer, device="cpu", compiled=False, sets=2)

    monkeypatch.setattr(R, "measure_case", measure)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "NVIDIA H100 80GB HBM3")
    shape = small_shape(*SMALL[0])
    saved = []
    doc = R.run(pkg, [shape], ["fp32"], [1, 16, 64], reps=5, log=sys.stdout, save=saved.append)
    assert [len(d["cases"]) for d in saved] == [1, 2, 3]  # the document so far, every case
    assert [c["m"] for c in doc["cases"]] == [1, 16, 64]
    assert doc["cases"][1]["not_timed"] == "error: OutOfMemoryError: CUDA out of memory"
    assert "speedup" in doc["cases"][0] and "speedup" in doc["cases"][2]
    out = capsys.readouterr().out
    assert "llama-3.1-8b fp32 M=16: error: OutOfMemoryError" in out
    assert "layer cases: 3/3 cases" in out  # plain progress lines in a log
    assert R.load_results(R.results_json(doc))["gpu"] == "NVIDIA H100 80GB HBM3"


def test_the_command_writes_the_results_and_the_table(tmp_path, fake_wheel, monkeypatch, capsys):
    """``cudal2-bench layer`` end to end on the CPU, each case measured on a small
    layer of its model (the GPU's parts stood in)."""
    measure_case = R.measure_case

    def measure(shape, dtype, m, pkg, timer, seed):
        small = dataclasses.replace(small_shape(*SMALL[0]), model=shape.model)
        return measure_case(small, "fp32", m, pkg, cpu_timer, device="cpu", compiled=False, sets=2)

    monkeypatch.setattr(R, "measure_case", measure)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "NVIDIA H100 80GB HBM3")
    out, md = tmp_path / "layer.json", tmp_path / "layer.md"
    argv = ["layer", "--package", "fake_cudal2_pkg", "--m", "4", "1", "4", "--dtype", "fp16"]
    assert bench_cli.main([*argv, "--out", str(out), "--markdown", str(md)]) == 0
    doc = R.load_results(out.read_text(), str(out))
    assert [(c["model"], c["m"]) for c in doc["cases"]] == [
        ("llama-3.1-8b", 1),
        ("llama-3.1-8b", 4),
        ("llama-3.1-70b-tp8", 1),
        ("llama-3.1-70b-tp8", 4),
    ]
    assert doc["shapes"]["llama-3.1-70b-tp8"]["gemms_nk"]["down"] == [8192, 3584]
    assert doc["package"] == "fake_cudal2_pkg" and doc["reps"] == 100
    table = md.read_text()
    assert table == R.markdown_table(doc) + "\n" and table in capsys.readouterr().out + "\n"
    assert not list(tmp_path.glob(".layer*"))  # no temporary file left behind
