"""The runtime's torch API on an sm_90 GPU, with the recorded table's own cubins.

A generated package is laid out in tmp_path from ``recorded_table`` and
``recorded_cubins`` and every table shape (plus M values between measured points) is
run through ``matmul`` and ``linear`` and compared with a float reference; then CUDA
graph capture and a side stream.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import warnings
from collections import defaultdict
from typing import Any

import pytest
import torch

from cudal2.packaging.runtime.table import CublasLtAlgo, DispatchTable, TableEntry

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# Tolerance relative to max|ref|. The kernels accumulate in fp32 and round once to
# the output type, so an element's error is about half an ulp of the output format
# at its magnitude (<= max|ref|): 2^-9 = 2.0e-3 for bf16 (8-bit significand), 2^-12 =
# 2.4e-4 for fp16 (11-bit significand); a different fp32 summation order (split-K,
# tile order) adds ~K * 2^-24, far below either. 1e-2 and 2e-3 leave a margin of
# 5-8x above that rounding without letting a wrong tile or a dropped K slice through
# (those are O(max|ref|) errors).
TOLERANCE = {"fp16": 2e-3, "bf16": 1e-2}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@pytest.fixture
def make_api(tmp_path, monkeypatch, recorded_table, recorded_cubins, write_package):
    """Build and import a fresh generated package per call; returns its Api."""
    if not any(blob.startswith(b"\x7fELF") for blob in recorded_cubins.values()):
        pytest.skip("recorded_cubins holds no ELF cubins (the placeholder table)")
    archs = sorted({e.arch for e in recorded_table.entries})
    if _device_arch(archs) is None:
        pytest.skip(f"the table is for {archs}, not {torch.cuda.get_device_name()}")
    monkeypatch.syspath_prepend(str(tmp_path))
    names = []

    def make(table: DispatchTable | None = None):
        name = write_package(tmp_path, table or recorded_table, recorded_cubins)
        names.append(name)
        return importlib.import_module(name)._api

    yield make
    for key in [k for k in sys.modules if any(k.split(".")[0] == n for n in names)]:
        del sys.modules[key]


def _device_arch(archs: list[str]) -> str | None:
    """The table arch whose cubins run on this GPU (sm_90a on compute capability 9.0)."""
    major, minor = torch.cuda.get_device_capability()
    digits = f"{major}{minor}"
    return next((a for a in archs if a.removeprefix("sm_").rstrip("abf") == digits), None)


def _served(recorded_table: DispatchTable, api: Any) -> list[TableEntry]:
    """The entries that serve this GPU (its own model's, or a stand-in's)."""
    arch = _device_arch(api.table.archs)
    gpu, _ = api.table.resolve_gpu(torch.cuda.get_device_name(), arch)
    return [e for e in recorded_table.entries if (e.gpu, e.arch) == (gpu, arch)]


def _probes(entries: list[TableEntry]) -> list[tuple[TableEntry, int]]:
    """Each entry at its measured M, and at the low end and middle of its range."""
    axes: dict[tuple, list[TableEntry]] = defaultdict(list)
    for e in entries:
        axes[(e.dtype, e.layout, e.n, e.k)].append(e)
    probes = []
    for group in axes.values():
        group.sort(key=lambda e: e.m_measured)
        previous = 0
        for e in group:
            m = e.m_measured
            probes += [(e, x) for x in sorted({previous + 1, (previous + 1 + m) // 2, m})]
            previous = m
    return probes


def _inputs(entry: TableEntry, m: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A [M, K] and B stored as the layout says: [N, K] for tn, [K, N] for nn."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dtype, n, k = DTYPES[entry.dtype], entry.n, entry.k
    shape_b = (n, k) if entry.layout == "tn" else (k, n)
    a = torch.randn(m, k, device="cuda", generator=g).to(dtype)
    b = torch.randn(shape_b, device="cuda", generator=g).to(dtype)
    return a, b


def _check(out: torch.Tensor, ref: torch.Tensor, dtype: str, what: str) -> None:
    assert out.dtype == DTYPES[dtype] and out.shape == ref.shape, what
    # The reference is computed in float64 from the same fp16/bf16 inputs: the brief's
    # fp32 reference, minus any dependence on the TF32 setting of fp32 matmuls.
    err = (out.double() - ref).abs().max().item()
    scale = ref.abs().max().item() or 1.0
    assert err <= TOLERANCE[dtype] * scale, f"{what}: max error {err:.3g} vs max|ref| {scale:.3g}"


def test_every_table_shape_matches_the_reference(make_api, recorded_table):
    api = make_api()
    with torch.inference_mode():
        for i, (e, m) in enumerate(_probes(_served(recorded_table, api))):
            a, b = _inputs(e, m, seed=i)
            what = f"{e.dtype}/{e.layout} m={m} n={e.n} k={e.k}"
            hits, fallbacks = sum(api.stats.hits.values()), api.stats.fallbacks["fallback_entry"]
            if e.layout == "tn":
                ref = a.double() @ b.double().t()
                _check(api.linear(a, b), ref, e.dtype, "linear " + what)
                _check(api.matmul(a, b.t()), ref, e.dtype, "matmul " + what)
                calls = 2
            else:
                ref = a.double() @ b.double()
                _check(api.matmul(a, b), ref, e.dtype, "matmul " + what)
                calls = 1
            if e.kind == "kernel":
                assert sum(api.stats.hits.values()) == hits + calls, (what, api.stats)
            else:
                assert api.stats.fallbacks["fallback_entry"] == fallbacks + calls, what
    assert not set(api.stats.fallbacks) - {"fallback_entry"}, api.stats


def test_linear_keeps_leading_dims(make_api, recorded_table):
    api = make_api()
    kernels = [e for e in _served(recorded_table, api) if e.layout == "tn"]
    kernels = [e for e in kernels if e.kind == "kernel" and e.m_measured % 2 == 0]
    if not kernels:
        pytest.skip("no tn kernel entry with an even measured M")
    e = kernels[0]
    a, w = _inputs(e, e.m_measured, seed=1)
    x = a.view(2, -1, e.k)
    with torch.no_grad():
        out = api.linear(x, w)
    assert out.shape == (2, e.m_measured // 2, e.n)
    _check(out.view(-1, e.n), a.double() @ w.double().t(), e.dtype, "3-D linear")
    assert sum(api.stats.hits.values()) == 1, api.stats


def _kernel_entries(api: Any, recorded_table: DispatchTable, count: int) -> list[TableEntry]:
    entries = [e for e in _served(recorded_table, api) if e.kind == "kernel"]
    if not entries:
        pytest.skip("the table has no kernel entry for this GPU")
    # Small problems first: the graph test is about capture, not throughput.
    return sorted(entries, key=lambda e: e.m_measured * e.n * e.k)[:count]


def _call(api: Any, e: TableEntry, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return api.linear(a, b) if e.layout == "tn" else api.matmul(a, b)


def _reference(e: TableEntry, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.double() @ (b.double().t() if e.layout == "tn" else b.double())


def _eager_then_replayed(api: Any, entries: list[dict], inputs: list) -> tuple[list, list]:
    """Each entry's call run eagerly, then captured in one CUDA graph, the A inputs
    negated, and the graph replayed: (eager outputs, replayed outputs)."""
    with torch.inference_mode():
        eager = [_call(api, e, a, b) for e, (a, b) in zip(entries, inputs, strict=True)]
        graph = torch.cuda.CUDAGraph()
        with warnings.catch_warnings(record=True) as caught, torch.cuda.graph(graph):
            warnings.simplefilter("always")
            captured = [_call(api, e, a, b) for e, (a, b) in zip(entries, inputs, strict=True)]
        # Anything not ready before capture would have fallen back with a warning.
        assert not [w for w in caught if api.package in str(w.message)]
        for a, _ in inputs:
            a.mul_(-1)  # replay must read the new inputs
        graph.replay()
        torch.cuda.synchronize()
    return eager, captured


def test_graph_capture_after_warmup_matches_eager(make_api, recorded_table):
    api = make_api()
    entries = _kernel_entries(api, recorded_table, 4)
    served = {(e.cubin_sha256, e.symbol) for e in _served(recorded_table, api)}
    kernels = {k for k in served if k[0] is not None}
    assert api.warmup() == len([e for e in _served(recorded_table, api) if e.kind == "kernel"])
    assert len(api._kernels) == len(kernels)
    inputs = [_inputs(e, e.m_measured, seed=10 + i) for i, e in enumerate(entries)]
    eager, captured = _eager_then_replayed(api, entries, inputs)
    for e, (a, b), before, out in zip(entries, inputs, eager, captured, strict=True):
        if e.launch.get("split_k", 1) == 1:
            # One fp32 summation order per output: bitwise equal (the sign flips exactly).
            assert torch.equal(out, -before), e.kernel
        _check(out, _reference(e, a, b), e.dtype, "graph " + e.kernel)
    assert sum(api.stats.hits.values()) == 2 * len(entries), api.stats
    assert not api.stats.fallbacks, api.stats


def test_capture_before_warmup_falls_back_with_a_warning(make_api, recorded_table):
    api = make_api()
    e = _kernel_entries(api, recorded_table, 1)[0]
    a, b = _inputs(e, e.m_measured, seed=20)
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode():
        with pytest.warns(RuntimeWarning, match="warmup"), torch.cuda.graph(graph):
            out = _call(api, e, a, b)
        graph.replay()
        torch.cuda.synchronize()
    _check(out, _reference(e, a, b), e.dtype, "captured fallback")
    assert api.stats.fallbacks == {"capture": 1}, api.stats
    with torch.inference_mode():
        _check(_call(api, e, a, b), _reference(e, a, b), e.dtype, "after capture")
    assert sum(api.stats.hits.values()) == 1, api.stats


def test_launches_go_to_the_callers_stream(make_api, recorded_table):
    from cuda.bindings import driver as cu

    api = make_api()
    e = _kernel_entries(api, recorded_table, 1)[0]
    src_a, b = _inputs(e, e.m_measured, seed=30)
    a = torch.zeros_like(src_a)
    # A non-blocking stream: the legacy default stream does not wait for it, so a
    # launch that went anywhere else would not be ordered after the copy below.
    err, handle = cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING.value)
    assert err == cu.CUresult.CUDA_SUCCESS
    side = torch.cuda.ExternalStream(int(handle))
    # Loading a module can wait for the device to go idle, which would hide a launch
    # on the wrong stream: load everything first.
    assert api.warmup() > 0
    torch.cuda.synchronize()
    try:
        with torch.inference_mode(), torch.cuda.stream(side):
            # The side stream is busy, then fills A: a kernel on any other stream
            # would run first and read zeros.
            torch.cuda._sleep(200_000_000)
            a.copy_(src_a)
            out = _call(api, e, a, b)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
    finally:
        cu.cuStreamDestroy(handle)
    _check(out, _reference(e, src_a, b), e.dtype, "side stream")
    assert sum(api.stats.hits.values()) == 1, api.stats


def test_cuda_fallbacks_match_torch(make_api, recorded_table):
    api = make_api()
    e = _kernel_entries(api, recorded_table, 1)[0]
    a, b = _inputs(e, e.m_measured, seed=40)
    buf = torch.empty(a.numel() + 8, dtype=a.dtype, device="cuda")
    shifted = buf[1 : 1 + a.numel()].view(a.shape)
    shifted.copy_(a)
    torch_fn = torch.nn.functional.linear if e.layout == "tn" else torch.matmul
    with torch.inference_mode():
        assert torch.equal(_call(api, e, shifted, b), torch_fn(shifted, b))
        assert torch.equal(_call(api, e, a.float(), b.float()), torch_fn(a.float(), b.float()))
    a.requires_grad_(True)
    assert torch.equal(_call(api, e, a, b), torch_fn(a, b))
    assert api.stats.fallbacks == {"alignment": 1, "dtype": 1, "grad": 1}, api.stats


def test_unknown_model_of_the_same_arch_uses_stand_ins_with_a_warning(make_api, recorded_table):
    probe = make_api()
    served = _served(recorded_table, probe)
    e = _kernel_entries(probe, recorded_table, 1)[0]
    other = served[0].gpu + " (renamed)"  # a model this GPU is not
    entries = tuple(
        dataclasses.replace(x, gpu=other) if x in served else x for x in recorded_table.entries
    )
    renamed = dataclasses.replace(
        recorded_table, entries=entries, gpu_models=tuple(sorted({x.gpu for x in entries}))
    )
    api = make_api(renamed)
    a, b = _inputs(e, e.m_measured, seed=50)
    with torch.inference_mode(), pytest.warns(RuntimeWarning) as caught:
        out = _call(api, e, a, b)
    message = str(caught[0].message)
    assert torch.cuda.get_device_name() in message and other in message
    _check(out, _reference(e, a, b), e.dtype, "stand-in")
    assert sum(api.stats.hits.values()) == 1, api.stats


@pytest.mark.parametrize("change", ["newer_cuda", "other_arch", "recipe_align"])
def test_a_table_this_machine_cannot_run_falls_back(make_api, recorded_table, change):
    e = _kernel_entries(make_api(), recorded_table, 1)[0]
    table = recorded_table
    if change == "newer_cuda":
        newest = max(int(v.split(".")[0]) for v in table.cuda_versions)
        # no driver supports it
        table = dataclasses.replace(
            table, cuda_versions=(*table.cuda_versions, f"{newest + 100}.0")
        )
        reason = "driver"
    elif change == "other_arch":
        # the same cubins, claimed for another arch
        entries = tuple(dataclasses.replace(x, arch="sm_80") for x in table.entries)
        table = dataclasses.replace(table, archs=("sm_80",), entries=entries)
        reason = "arch"
    else:
        # an M alignment that the measured M breaks
        entries = tuple(
            dataclasses.replace(
                x, launch={**x.launch, "align": {**x.launch["align"], "m": x.m_measured + 1}}
            )
            if x.kind == "kernel"
            else x
            for x in table.entries
        )
        table = dataclasses.replace(table, entries=entries)
        reason = "align"
    api = make_api(table)
    a, b = _inputs(e, e.m_measured, seed=60)
    with torch.inference_mode(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _call(api, e, a, b)
        torch_fn = torch.nn.functional.linear if e.layout == "tn" else torch.matmul
        assert torch.equal(out, torch_fn(a, b))
    assert api.stats.fallbacks == {reason: 1}, api.stats
    assert (api.warmup() > 0) == (change == "recipe_align")
    if change == "newer_cuda":
        assert any("driver" in str(w.message) for w in caught)


# -- entries of kind cublaslt: algorithms autotuned here by the build's own vendor job --

# Shapes whose cuBLASLt winners differ in kind: a skinny split-K one, a residue shape
# in nn, and a large tile.
LT_TARGETS = [("fp16", "tn", 16, 4096, 4096), ("bf16", "nn", 100, 1000, 1000)]
LT_TARGETS += [("fp16", "tn", 1024, 4096, 4096)]


@pytest.fixture(scope="module")
def lt_records():
    """Real vendor records: the build's vendor job (autotune, correctness suite, timing
    beside torch) run here on each of LT_TARGETS."""
    pytest.importorskip("nvmath.bindings.cublasLt")
    from cudal2.packaging.runtime.cublaslt import version
    from cudal2.pipeline.results import vendor_measurement, vendor_toolchain
    from cudal2.records import Job, JobKind, Target, TimingConfig
    from cudal2.verify.gpu import current_gpu
    from cudal2.verify.spread import VendorSpread
    from cudal2.verify.worker import run_vendor_job

    gpu = current_gpu(0)
    spread = VendorSpread()
    timing = TimingConfig(reps=10, mode="offline", seed=0)
    records = []
    for dtype, layout, m, n, k in LT_TARGETS:
        t = Target("sm_90a", dtype, layout, m, n, k)
        job = Job(JobKind.AUTOTUNE, t, timing, vendor_toolchain(version()))
        records.append(vendor_measurement(run_vendor_job(job, gpu.name, spread), gpu))
    return records


@pytest.fixture
def lt_table(lt_records, recorded_table):
    """The recorded table with LT_TARGETS' entries of kind cublaslt added (whether or
    not they beat torch: this is about running them)."""
    from cudal2.pipeline.dispatch import build_table
    from cudal2.pipeline.select import Selection

    sels = [
        Selection(
            r.gpu.name,
            r.target,
            "cublaslt",
            r,
            r.median_us,
            r.baselines_us["torch"],
            r.spread,
            r.measured_at,
            1,
        )
        for r in lt_records
    ]
    lt, _ = build_table(
        name="lt",
        version="0",
        package="cudal2_kernels_lt",
        manifest_sha256="",
        selections=sels,
        cubin_of=lambda key: b"",
    )
    ours = {(e.gpu, e.dtype, e.layout, e.n, e.k) for e in lt.entries}
    kept = [e for e in recorded_table.entries if (e.gpu, e.dtype, e.layout, e.n, e.k) not in ours]
    entries = (*kept, *lt.entries)
    return dataclasses.replace(
        recorded_table,
        entries=entries,
        gpu_models=tuple(sorted({e.gpu for e in entries})),
        archs=tuple(sorted({e.arch for e in entries})),
    )


def _other_version(lt: CublasLtAlgo) -> CublasLtAlgo:
    return dataclasses.replace(lt, version=lt.version + 1)


def _lt_entries(table: DispatchTable) -> list[TableEntry]:
    return [e for e in table.entries if e.kind == "cublaslt"]


def test_vendor_job_records_a_checked_algorithm(lt_records):
    from cudal2.packaging.runtime import cublaslt

    for r in lt_records:
        assert r.status == "ok", (r.target.label, r.error)
        assert r.vendor["version"] == cublaslt.version()
        assert len(bytes.fromhex(r.vendor["algo"])) == cublaslt.ALGO_BYTES
        assert r.metrics["bound_vendors"] > 1  # the bound came from the vendor spread
        assert r.median_us > 0 and r.baselines_us["torch"] > 0 and r.spread is not None
        assert r.vendor["candidates"] == len(r.vendor["candidates_us"]) >= 1
        assert r.design is None and r.design_key.startswith("cublaslt:")


def test_cublaslt_entries_match_the_reference(make_api, lt_table):
    api = make_api(lt_table)
    probes = _probes(_lt_entries(lt_table))
    with torch.inference_mode():
        for i, (e, m) in enumerate(probes):
            a, b = _inputs(e, m, seed=100 + i)
            what = f"cublaslt {e.dtype}/{e.layout} m={m} n={e.n} k={e.k}"
            _check(_call(api, e, a, b), _reference(e, a, b), e.dtype, what)
            if e.layout == "tn":  # and as matmul of the transpose view
                _check(api.matmul(a, b.t()), _reference(e, a, b), e.dtype, what)
    calls = sum(2 if e.layout == "tn" else 1 for e, _ in probes)
    assert sum(api.stats.hits.values()) == calls and not api.stats.fallbacks, api.stats


def test_cublaslt_graph_capture_after_warmup_matches_eager(make_api, lt_table):
    api = make_api(lt_table)
    entries = _lt_entries(lt_table)
    assert api.warmup() == len([e for e in _served(lt_table, api) if e.kind != "fallback"])
    inputs = [_inputs(e, e.m_measured, seed=110 + i) for i, e in enumerate(entries)]
    # torch.cuda.graph captures on its own stream: that stream gets its own workspace.
    eager, captured = _eager_then_replayed(api, entries, inputs)
    for e, (a, b), before, out in zip(entries, inputs, eager, captured, strict=True):
        # One algorithm, one summation order: the sign flips exactly.
        assert torch.equal(out, -before), e.kernel
        _check(out, _reference(e, a, b), e.dtype, "graph " + e.kernel)
    assert sum(api.stats.hits.values()) == 2 * len(entries) and not api.stats.fallbacks


@pytest.mark.parametrize("change", ["version", "missing"])
def test_cublaslt_entries_fall_back_without_their_library(make_api, lt_table, change):
    table = lt_table
    if change == "version":  # measured with another cuBLASLt than this one
        entries = tuple(
            dataclasses.replace(e, cublaslt=_other_version(e.cublaslt)) if e.cublaslt else e
            for e in table.entries
        )
        table = dataclasses.replace(table, entries=entries)
    api = make_api(table)
    if change == "missing":  # nvmath-python not installed: its import fails
        runtime = sys.modules[f"{api.package}._runtime.cublaslt"]

        def missing():
            raise ImportError("No module named 'nvmath'")

        runtime.bindings = missing
    e = _lt_entries(table)[0]
    a, b = _inputs(e, e.m_measured, seed=120)
    torch_fn = torch.nn.functional.linear if e.layout == "tn" else torch.matmul
    with torch.inference_mode(), pytest.warns(RuntimeWarning, match="cuBLASLt"):
        assert torch.equal(_call(api, e, a, b), torch_fn(a, b))
    assert api.stats.fallbacks == {f"cublaslt_{change}": 1}, api.stats
