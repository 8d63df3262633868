"""The runtime's torch API without a GPU: imports, bind, and every fallback that CPU
tensors can reach, each of which must return exactly torch's result.

Shapes come from the recorded table's entries (the smallest N*K of each layout, so
CPU matmuls stay quick); the tests invent no measurements.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from cudal2.packaging.runtime.api import Api, bind
from cudal2.packaging.runtime.table import DispatchTable, TableEntry

from .conftest import run_python


@pytest.fixture
def api(package) -> Api:
    return package._api


def _smallest(recorded_table: DispatchTable, layout: str) -> TableEntry | None:
    found = [e for e in recorded_table.entries if e.layout == layout]
    return min(found, key=lambda e: (e.n * e.k, e.m_measured), default=None)


def _dtype(entry: TableEntry) -> torch.dtype:
    return {"fp16": torch.float16, "bf16": torch.bfloat16}[entry.dtype]


def _operands(entry: TableEntry, m: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """A [m, K] and B as the entry's layout stores it: [N, K] for tn, [K, N] for nn."""
    g = torch.Generator().manual_seed(0)
    dtype, n, k = _dtype(entry), entry.n, entry.k
    a = torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn((n, k) if entry.layout == "tn" else (k, n), generator=g).to(dtype)
    return a, b


def _misaligned(a: torch.Tensor) -> torch.Tensor:
    """A copy of ``a`` whose data starts one element (2 bytes) past an aligned address."""
    buf = torch.empty(a.numel() + 8, dtype=a.dtype)
    out = buf[1 : 1 + a.numel()].view(a.shape)
    out.copy_(a)
    assert out.data_ptr() % 16 != 0
    return out


def test_importing_registers_the_ops_without_touching_cuda(
    tmp_path, recorded_table, recorded_cubins, write_package
):
    name = write_package(tmp_path, recorded_table, recorded_cubins)
    e = recorded_table.entries[0]
    run_python(
        f"""
        import sys
        import cudal2.packaging.runtime.api, cudal2.packaging.runtime.table
        import torch  # (torch itself may import cuda-python's modules)
        before = {{m for m in sys.modules if m.split(".")[0] == "cuda"}}
        import {name} as pkg
        assert pkg.has_torch_ops
        assert pkg.NAMESPACE == "cudal2_" + pkg.__name__.removeprefix("cudal2_kernels_")
        assert callable(getattr(torch.ops, pkg.NAMESPACE).linear)
        assert callable(getattr(torch.ops, pkg.NAMESPACE).matmul)
        hit = pkg._api.table.lookup({e.gpu!r}, {e.arch!r}, {e.dtype!r},
                                    {e.layout!r}, {e.m_measured}, {e.n}, {e.k})
        assert hit is not None and hit.m_measured == {e.m_measured}
        assert not torch.cuda.is_initialized()
        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "cuda" and m not in before)
        assert not loaded, loaded
        """,
        tmp_path,
    )


def test_the_runtime_works_without_torch_installed(
    tmp_path, recorded_table, recorded_cubins, write_package
):
    name = write_package(tmp_path, recorded_table, recorded_cubins)
    run_python(
        f"""
        import {name} as pkg
        assert not pkg.has_torch_ops
        assert len(pkg._api.table.entries) == {len(recorded_table.entries)}
        for call in (lambda: pkg.matmul(None, None), lambda: pkg.linear(None, None)):
            try:
                call()
            except ImportError as exc:
                msg = str(exc)
                assert "pip install '{name}[torch]'" in msg and "'{name}[cupy]'" in msg, msg
            else:
                raise AssertionError("a call without torch must say so")
        assert pkg.warmup() == 0  # safe at start-up without torch
        """,
        tmp_path,
        no_torch=True,
    )


def test_bind_reads_nothing_until_used(tmp_path, monkeypatch):
    empty = tmp_path / f"cudal2_kernels_empty_{uuid.uuid4().hex[:12]}"
    empty.mkdir()
    (empty / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    api = bind(empty.name)  # no dispatch.json: binding still works
    assert api.package == empty.name
    with pytest.warns(RuntimeWarning, match="dispatch.json"):  # and using it falls back
        assert api.table.entries == ()


def test_a_table_that_breaks_the_format_is_not_trusted(package, api, recorded_table):
    """The runtime checks its table with the schema at first use; a table it cannot
    trust sends every call to torch (reason ``table``), with one warning."""
    raw = recorded_table.as_json()
    raw["entries"][0]["n"] = 0
    (Path(package.__file__).parent / "dispatch.json").write_text(json.dumps(raw))
    with pytest.warns(RuntimeWarning, match=r"entries\[0\]: key 'n' must be a positive integer"):
        assert api.table.entries == ()
    e = recorded_table.entries[0]
    assert not api.covers(e.n, e.k, e.dtype, e.layout)
    assert api._check_device(torch, 0).reason == "table"
    assert api.warmup() == 0


def test_package_table_is_the_recorded_table(package, api, recorded_table):
    assert package.matmul == api.matmul and package.linear == api.linear
    # The package's runtime is its own copy of the schema: compare what the tables say.
    assert [e.as_json() for e in api.table.entries] == [e.as_json() for e in recorded_table.entries]
    assert api.table is api.table  # read once


@pytest.mark.parametrize("layout", ["tn", "nn"])
def test_cpu_tensors_fall_back_to_torch(api, recorded_table, layout):
    entry = _smallest(recorded_table, layout)
    if entry is None:
        pytest.skip(f"the recorded table has no {layout} entry")
    a, b = _operands(entry)
    if layout == "tn":
        # b.t() is the transpose view of a row-major [N, K]: classified as tn, then
        # refused because it is not on a GPU.
        assert torch.equal(api.matmul(a, b.t()), torch.matmul(a, b.t()))
        assert torch.equal(api.linear(a, b), F.linear(a, b))
        assert api.stats.fallbacks == {"device": 2}
    else:
        assert torch.equal(api.matmul(a, b), torch.matmul(a, b))
        assert api.stats.fallbacks == {"device": 1}
    assert not api.stats.hits


def test_linear_with_leading_dims_falls_back_to_torch(api, recorded_table):
    entry = _smallest(recorded_table, "tn") or _smallest(recorded_table, "nn")
    a, w = _operands(entry, m=6)
    if entry.layout == "nn":
        w = w.t().contiguous()
    x = a.reshape(2, 3, -1)
    out = api.linear(x, w)
    assert out.shape == (2, 3, w.shape[0])
    assert torch.equal(out, F.linear(x, w))
    # A view that does not collapse to [M, K] without a copy is refused before the device.
    y = a.reshape(3, 2, -1).transpose(0, 1)
    assert torch.equal(api.linear(y, w), F.linear(y, w))
    # A 1-D x is M = 1.
    assert torch.equal(api.linear(a[0], w), F.linear(a[0], w))
    assert api.stats.fallbacks == {"device": 2, "stride": 1}


def test_fp32_mixed_dtypes_and_3d_fall_back(api, recorded_table):
    entry = recorded_table.entries[0]
    a, b = _operands(entry)
    b = b.t() if entry.layout == "tn" else b
    a32, b32 = a.float(), b.float()
    assert torch.equal(api.matmul(a32, b32), torch.matmul(a32, b32))
    other = torch.bfloat16 if a.dtype == torch.float16 else torch.float16
    with pytest.raises(RuntimeError) as ours:
        api.matmul(a, b.to(other))
    with pytest.raises(RuntimeError) as theirs:
        torch.matmul(a, b.to(other))
    assert str(ours.value) == str(theirs.value)
    a3 = a.reshape(2, -1, a.shape[1])
    assert torch.equal(api.matmul(a3, b), torch.matmul(a3, b))
    assert api.stats.fallbacks == {"dtype": 2, "rank": 1}


def test_disable_env_falls_back(api, recorded_table, monkeypatch):
    entry = _smallest(recorded_table, "nn") or _smallest(recorded_table, "tn")
    a, b = _operands(entry)
    b = b.t() if entry.layout == "tn" else b
    monkeypatch.setenv("CUDAL2_DISABLE", "1")
    assert torch.equal(api.matmul(a, b), torch.matmul(a, b))
    monkeypatch.setenv("CUDAL2_DISABLE", "0")
    assert torch.equal(api.matmul(a, b), torch.matmul(a, b))
    assert api.stats.fallbacks == {"disabled": 1, "device": 1}


def test_autograd_falls_back_and_keeps_gradients(api, recorded_table):
    entry = _smallest(recorded_table, "tn") or _smallest(recorded_table, "nn")
    a, w = _operands(entry)
    w = torch.nn.Parameter(w if entry.layout == "tn" else w.t().contiguous())
    x = a.clone().requires_grad_(True)
    api.linear(x, w).float().sum().backward()
    ours = (x.grad.clone(), w.grad.clone())
    x.grad, w.grad = None, None
    F.linear(x, w).float().sum().backward()
    assert torch.equal(ours[0], x.grad) and torch.equal(ours[1], w.grad)
    with torch.no_grad():
        assert torch.equal(api.linear(x, w), F.linear(x, w))
    # A Parameter is a plain tensor: under no_grad only the device refuses it.
    assert api.stats.fallbacks == {"grad": 1, "device": 1}


def test_stride_alignment_and_shape_rules(api, recorded_table):
    entry = _smallest(recorded_table, "nn") or _smallest(recorded_table, "tn")
    a, b = _operands(entry, m=8)
    b = b.t() if entry.layout == "tn" else b
    k = a.shape[1]
    cases = {
        "stride": [
            (a.t().contiguous().t(), b),  # A column-major
            (torch.cat([a, a[:, :1]], dim=1)[:, :k], b),  # lda = K + 1
            (a, b[:, :-1]),  # N - 1: C's leading dim not a multiple of 8
        ],
        "alignment": [(_misaligned(a), b)],
        "empty": [(a[:0], b)],
    }
    for reason, pairs in cases.items():
        for x, y in pairs:
            assert torch.equal(api.matmul(x, y), torch.matmul(x, y)), reason
            assert api.stats.fallbacks[reason] >= 1, reason
    with pytest.raises(RuntimeError):
        api.matmul(a[:, 1:], b)
    assert api.stats.fallbacks["shape"] == 1
    assert not api.stats.hits


def test_tensor_subclasses_and_non_tensors_fall_back(api, recorded_table):
    entry = recorded_table.entries[0]
    a, b = _operands(entry)
    b = b.t() if entry.layout == "tn" else b

    class Tagged(torch.Tensor):
        pass

    ta = a.as_subclass(Tagged)
    assert torch.equal(api.matmul(ta, b), torch.matmul(ta, b))
    with pytest.raises(TypeError):
        api.matmul(a.tolist(), b)
    assert api.stats.fallbacks == {"tensor_type": 2}


def test_stats_reset_and_export(api, recorded_table):
    entry = recorded_table.entries[0]
    a, b = _operands(entry)
    b = b.t() if entry.layout == "tn" else b
    api.matmul(a.float(), b.float())
    assert api.stats.as_dict() == {"hits": {}, "fallbacks": {"dtype": 1}}
    api.stats.reset()
    assert api.stats.as_dict() == {"hits": {}, "fallbacks": {}}


def test_warmup_without_a_usable_gpu_loads_nothing(api):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: test_api_gpu covers warmup")
    assert api.warmup() == 0
    assert not api.stats.hits and not api.stats.fallbacks


def test_an_entry_of_an_unknown_launch_abi_falls_back(recorded_table):
    """A table entry whose recipe names an ABI this runtime cannot launch is never
    launched (reason ``abi``); every known ABI is launchable (gemm_v3 by an entry of
    the epilogue its recipe names)."""
    from cudal2.packaging.runtime.abi import ABIS, EPILOGUE_ABI
    from cudal2.packaging.runtime.api import _Plan

    kernel = next(e for e in recorded_table.entries if e.kind == "kernel")
    boxes = {"a": [64, kernel.launch["tile_m"]], "b": [64, kernel.launch["tile_n"]]}
    for abi in ABIS:
        launch = {**kernel.launch, "abi": abi, "tma": boxes}
        epilogue = "none"
        if abi == EPILOGUE_ABI:
            epilogue = launch["epilogue"] = "residual"
        entry = dataclasses.replace(kernel, launch=launch, epilogue=epilogue)
        assert _Plan(entry).reason is None
    assert _Plan(dataclasses.replace(kernel, launch={"abi": "gemm_v9"})).reason == "abi"
