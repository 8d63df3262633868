"""The native launcher on a CPU machine: the compiled library's operand rules against the
Python runtime's (``abi``), its reasons against ``Stats``' names, its registration as
the ops' CUDA kernel on a CPU build of torch, and the Python fallback wherever it cannot
serve (absent, corrupted, unrecorded, a torch without CUDA, no driver)."""

from __future__ import annotations

import hashlib
import importlib
import sys
import uuid

import pytest
import torch

from cudal2.packaging.runtime import abi, api, native, ops

pytestmark = pytest.mark.usefixtures("shipped_native")


@pytest.fixture
def lib(shipped_native, tmp_path):
    if shipped_native is None:
        pytest.skip("the native launcher cannot be built here (no g++ or nvcc)")
    path = tmp_path / native.LIBRARY
    path.write_bytes(shipped_native.files[native.LIBRARY])
    return native._library(str(path))


def _c(shape, strides=None):
    """(shape, strides) of a contiguous array unless strides are given."""
    if strides is None:
        strides, acc = [], 1
        for size in reversed(shape):
            strides.insert(0, acc)
            acc *= size
    return (tuple(shape), tuple(strides))


# (linear?, a, b): every rule of abi.linear_operands / abi.matmul_operands, one line each.
OPERANDS = [
    (True, _c((4, 4096)), _c((1024, 4096))),  # the plain case
    (True, _c((2, 3, 4096)), _c((1024, 4096))),  # leading dims collapse into M
    (True, _c((1, 1, 4096)), _c((1024, 4096))),  # all-1 prefix: ld is K
    (True, _c((4, 4096), (8192, 1)), _c((1024, 4096))),  # a padded row stride
    (True, _c((2, 3, 4096), (3 * 4096 + 8, 4096, 1)), _c((1024, 4096))),  # cannot collapse
    (True, _c((4096,)), _c((1024, 4096))),  # a 1-D x: M = 1
    (True, _c(()), _c((1024, 4096))),  # 0-D x
    (True, _c((4, 4096)), _c((1024, 4096, 1))),  # 3-D w
    (True, _c((4, 4096)), _c((1024, 4095))),  # K mismatch
    (True, _c((0, 4096)), _c((1024, 4096))),  # empty M
    (True, _c((4, 0)), _c((1024, 0))),  # empty K
    (True, _c((4, 4096)), _c((1024, 4096), (1, 1024))),  # w transposed
    (True, _c((4, 4096)), _c((1024, 4096), (4100, 1))),  # w's ld not a multiple of 8
    (True, _c((4, 4096), (4104, 2)), _c((1024, 4096))),  # x's inner stride 2
    (True, _c((4, 4100)), _c((1024, 4100))),  # K 4100: neither ld a multiple of 8
    (True, _c((4, 4096), (4100, 1)), _c((1024, 4096))),  # lda 4100 alone
    (True, _c((4, 4096), (4092, 1)), _c((1024, 4096))),  # lda below K
    (True, _c((4, 4096)), _c((1020, 4096))),  # N not a multiple of 8
    (False, _c((4, 4096)), _c((4096, 1024))),  # nn
    (False, _c((4, 4096)), _c((4096, 1024), (1, 4096))),  # tn: b the transpose view
    (False, _c((4, 4096)), _c((4096, 1024), (1, 4000))),  # b's ld below K
    (False, _c((4, 4096)), _c((4096, 1024), (2048, 2))),  # b strided both ways
    (False, _c((2, 4, 4096)), _c((4096, 1024))),  # 3-D a
    (False, _c((4, 4096)), _c((4095, 1024))),  # K mismatch
    (False, _c((4, 4096)), _c((4096, 0))),  # empty N
]


@pytest.mark.parametrize(("linear", "a", "b"), OPERANDS)
def test_the_library_applies_the_abi_rules(lib, linear, a, b):
    rules = abi.linear_operands if linear else abi.matmul_operands
    assert native.operands(lib, linear, a, b) == rules(a[0], a[1], b[0], b[1])


def test_its_reasons_are_the_stats_names(lib):
    names = native.reasons(lib)
    assert len(names) == len(set(names)) > 10
    documented = api.Stats.__doc__
    assert all(f"``{name}``" in documented for name in names), names


def test_it_registers_the_ops_cuda_kernels_on_a_cpu_torch(lib):
    ns = f"cudal2_t{uuid.uuid4().hex[:10]}"
    apis = {ns: api.Api("nothing")}
    keep = ops._define(ns, apis)
    got = native.Native(lib, apis, ns, {})
    assert got.slot >= 0 and keep is not None
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::linear", "CUDA")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::matmul", "CUDA")
    # CPU tensors still reach the Python kernel: torch's answer.
    x, w = torch.randn(3, 16), torch.randn(8, 16)
    assert torch.equal(getattr(torch.ops, ns).linear(x, w), torch.nn.functional.linear(x, w))
    assert apis[ns].stats.fallbacks == {"dtype": 1}


def _import(root, name):
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(root))


def _absent(pkg_dir):
    (pkg_dir / "_native" / native.LIBRARY).unlink()


def _corrupt(pkg_dir):
    path = pkg_dir / "_native" / native.LIBRARY
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))


def _unrecorded(pkg_dir):
    init = pkg_dir / "__init__.py"
    init.write_text(init.read_text().replace(native.LIBRARY, "another.so"))


# (how the package is broken, a torch with CUDA?, the reason Api.native_reason names)
FALLBACKS = [
    (None, False, "torch is a CPU build"),
    (_absent, True, f"{native.LIBRARY} is not in the package"),
    (_corrupt, True, f"{native.LIBRARY} is corrupted: sha256"),
    (_unrecorded, True, f"the package records no sha256 for {native.LIBRARY}"),
    (None, True, "cannot load libcuda.so.1"),  # a CUDA torch on a machine without a driver
]


@pytest.mark.parametrize(("break_it", "cuda_torch", "reason"), FALLBACKS)
def test_the_python_path_serves_where_the_native_one_cannot(
    break_it,
    cuda_torch,
    reason,
    tmp_path,
    monkeypatch,
    shipped_native,
    recorded_table,
    recorded_cubins,
    write_package,
):
    if shipped_native is None:
        pytest.skip("the native launcher cannot be built here (no g++ or nvcc)")
    name = write_package(tmp_path, recorded_table, recorded_cubins)
    pkg_dir = tmp_path / name
    shipped = (pkg_dir / "_native" / native.LIBRARY).read_bytes()
    assert hashlib.sha256(shipped).hexdigest() in (pkg_dir / "__init__.py").read_text()
    if break_it is not None:
        break_it(pkg_dir)
    if cuda_torch:  # past the CPU-build check, to the package's files and the driver
        monkeypatch.setattr(torch.version, "cuda", "13.0")
    try:
        k = _import(tmp_path, name)
        assert k._api.launcher == "python"
        assert reason in k._api.native_reason, k._api.native_reason
        # ... and every call is served, by the Python path (CPU tensors: torch's answer)
        x, w = torch.randn(2, 64, dtype=torch.float16), torch.randn(32, 64, dtype=torch.float16)
        want = torch.nn.functional.linear(x, w)
        assert torch.equal(getattr(torch.ops, k.NAMESPACE).linear(x, w), want)
        assert torch.equal(k.linear(x, w), want)
        assert k.stats.fallbacks == {"device": 2}
    finally:
        for key in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[key]
