"""The Python launch path's choice between an entry and its eager alternative, with the
stream's capture state mocked (no GPU here): the alternative when not capturing, the
entry's own choice under capture; and the patched layer's per-size memo, which must
leave a size with an alternative to the op. The package is the M = 64 table of
llama-3.1-8b-hf-h100 (recorded H100 measurements)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import sys
from types import SimpleNamespace

import pytest
import torch


class FakeCuda:
    """What the runtime asks a backend's ``cuda`` (torch.cuda, or the CuPy stand-in)."""

    def __init__(self):
        self.capturing = False

    def is_current_stream_capturing(self) -> bool:
        return self.capturing

    def current_device(self) -> int:
        return 0

    def device(self, dev):
        return contextlib.nullcontext()


class Out:
    def data_ptr(self) -> int:
        return 0x7000


def _install(tmp_path, monkeypatch, write_package, table, cubins):
    name = write_package(tmp_path, table, cubins)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    return name, module


@pytest.fixture
def rig(tmp_path, monkeypatch, write_package, eager_table, eager_cubins):
    """(api, backend, launched names): the package's Api on a mocked H100 whose kernels
    and cuBLASLt algorithms 'load' and 'launch' by recording their plan's name."""
    names = []

    def make(table=eager_table):
        name, module = _install(tmp_path, monkeypatch, write_package, table, eager_cubins)
        names.append(name)
        api = module._api
        rt = sys.modules[type(api).__module__]
        be = SimpleNamespace(cuda=FakeCuda())
        api._devices[0] = rt._Device(table.gpu_models[0], table.archs[0], None)
        monkeypatch.setattr(rt.driver.Kernel, "function", lambda self, dev=0: 0x1234)

        def load_lt(torch_, plan, dev):
            if torch_.cuda.is_current_stream_capturing():
                return "capture"
            plan.loaded.add(dev)
            return None

        launched = []
        monkeypatch.setattr(api, "_load_cublaslt", load_lt)
        monkeypatch.setattr(
            api,
            "_launch",
            lambda be_, plan, dev, gemm, stream_of, epi=None: launched.append(plan.name),
        )
        return api, be, launched

    yield make
    for name in names:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]


def _call(api, be, e, m=None):
    shape = (0, e.dtype, e.layout, m or e.m_measured, e.n, e.k)
    return api._dispatch(be, shape, 0x1000, 0x2000, e.k, e.k, Out, lambda dev: 0)


def test_eager_runs_the_alternative_and_capture_the_entry(rig, eager_table):
    api, be, launched = rig()
    alts = [e for e in eager_table.entries if e.eager is not None]
    assert {e.kind for e in alts} == {"cublaslt", "fallback"}
    for e in alts:
        name = str(e.key)
        be.cuda.capturing = False
        assert isinstance(_call(api, be, e), Out)
        assert launched[-1] == f"{name}/eager"
        be.cuda.capturing = True
        got = _call(api, be, e)
        if e.kind == "cublaslt":
            assert isinstance(got, Out) and launched[-1] == name
        else:
            assert got == "fallback_entry" and launched[-1] == f"{name}/eager"
        be.cuda.capturing = False
        assert isinstance(_call(api, be, e, m=e.m_min), Out)  # another M of the range
        assert launched[-1] == f"{name}/eager"
    hits = api.stats.hits
    for e in alts:
        assert hits[f"{e.key}/eager"] == 2
        assert hits[str(e.key)] == (1 if e.kind == "cublaslt" else 0)


def test_a_first_call_under_capture_loads_nothing_and_is_not_remembered(rig, eager_table):
    """Loading a module would break a capture: the first call of a shape under capture
    runs the entry's own choice, and the next eager call loads the alternative."""
    api, be, launched = rig()
    for kind in ("cublaslt", "fallback"):
        e = next(x for x in eager_table.entries if x.eager is not None and x.kind == kind)
        be.cuda.capturing = True
        got = _call(api, be, e)
        # cuBLASLt is not loaded under capture either: torch's answer, transiently
        assert got == "capture", kind
        assert api._eager == {} or all(k[4:] != (e.n, e.k) for k in api._eager)
        be.cuda.capturing = False
        assert isinstance(_call(api, be, e), Out)
        assert launched[-1] == f"{e.key}/eager"


def test_a_failed_alternative_falls_back_to_the_entry(rig, eager_table):
    api, be, launched = rig()
    e = next(x for x in eager_table.entries if x.eager is not None and x.kind == "cublaslt")
    _call(api, be, e)
    api._plans[e.key].eager.reason = "launch_error"  # what a failed launch sets
    assert isinstance(_call(api, be, e), Out) and launched[-1] == str(e.key)
    f = next(x for x in eager_table.entries if x.eager is not None and x.kind == "fallback")
    _call(api, be, f)
    api._plans[f.key].eager.reason = "launch_error"
    assert _call(api, be, f) == "fallback_entry"


def test_entries_with_alternatives_are_covered(rig, eager_table):
    api, _, _ = rig()
    for e in eager_table.entries:
        if e.eager is not None:
            assert api.covers(e.n, e.k, e.dtype, e.layout)


def _memo(api, rt_ops, e, monkeypatch, be):
    monkeypatch.setattr(rt_ops, "_torch", be)
    layer = SimpleNamespace(
        in_features=e.k,
        out_features=e.n,
        weight=SimpleNamespace(dtype=torch.float16),
        _cudal2_api=api,
        _cudal2_torch={},
    )
    x = SimpleNamespace(is_cuda=True, get_device=lambda: 0)
    size = e.m_measured * e.k
    return rt_ops._table_reason(layer, x, size), layer._cudal2_torch[size]


def test_the_patched_layer_leaves_sizes_with_an_alternative_to_the_op(
    rig, eager_table, monkeypatch
):
    """A fallback entry with an alternative: the op (which picks by capture state),
    never remembered as torch's; the same entry without one: torch's, remembered."""
    f = next(x for x in eager_table.entries if x.eager is not None and x.kind == "fallback")
    api, be, _ = rig()
    rt_ops = sys.modules[type(api).__module__.rsplit(".", 1)[0] + ".ops"]
    assert _memo(api, rt_ops, f, monkeypatch, be) == (None, None)
    plain = dataclasses.replace(
        eager_table,
        entries=tuple(dataclasses.replace(x, eager=None) for x in eager_table.entries),
    )
    api, be, _ = rig(plain)
    rt_ops = sys.modules[type(api).__module__.rsplit(".", 1)[0] + ".ops"]
    assert _memo(api, rt_ops, f, monkeypatch, be) == ("fallback_entry", "fallback_entry")


class FakeLib:
    """The library's side of ``cudal2_native_set_plan``: each plan record as set."""

    def __init__(self):
        self.plans = {}

    def cudal2_native_set_plan(self, slot, pid, desc_ref):
        self.plans[pid] = {
            name: getattr(desc_ref._obj, name) for name, _ in type(desc_ref._obj)._fields_
        }
        return 0


def test_the_native_plan_of_a_shape_names_its_alternative(rig, eager_table, monkeypatch):
    """``Native._answer`` (the library's ``prepare``): a cuBLASLt entry's plan and a
    fallback entry's torch plan (kind 0) each carry 1 + the id of their alternative's
    kernel plan (kind 1), which the library launches when the stream is not capturing."""
    api, be, _ = rig()
    rt = sys.modules[type(api).__module__]
    native = sys.modules[type(api).__module__.rsplit(".", 1)[0] + ".native"]
    lt = SimpleNamespace(
        desc=SimpleNamespace(op=1, w=2, a=3, c=4, alpha=5, beta=6), algo_ptr=7, workspace_bytes=8
    )
    monkeypatch.setattr(api, "_lt_gemm", lambda plan, dev, gemm: lt)
    api._lt_handles[0] = 0x4A4E
    monkeypatch.setattr(
        sys.modules[rt.__name__.rsplit(".", 1)[0] + ".cublaslt"], "matmul_address", lambda: 9
    )
    monkeypatch.setattr(rt.driver, "sm_count", lambda dev=0: 132)
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    n = object.__new__(native.Native)
    n.lib, n.slot, n.namespace, n._apis = FakeLib(), 0, "ns", {"ns": api}
    n._lock, n._ids, n._names, n._plans, n._keep = contextlib.nullcontext(), {}, [], {}, []
    n._max_plans, n._codes = 1 << 14, {"fits": 14, "capture": 16, "load_error": 17}
    monkeypatch.setattr(n, "_bias_function", lambda dtype, dev: 0xB1A5)
    for e in (x for x in eager_table.entries if x.eager is not None):
        pid = n._answer(0, e.dtype, e.layout, e.m_measured, e.n, e.k, e.k, e.k)
        main = n.lib.plans[pid]
        alt = n.lib.plans[main["eager"] - 1]
        assert main["kind"] == {"cublaslt": 2, "fallback": 0}[e.kind], e.key
        assert alt["kind"] == 1 and alt["eager"] == 0 and alt["bias_function"] == 0xB1A5
        assert (alt["tile_m"], alt["tile_n"]) == (
            e.eager.launch["tile_m"],
            e.eager.launch["tile_n"],
        )
        assert n._names[pid] == str(e.key) and n._names[main["eager"] - 1] == f"{e.key}/eager"
        # asked again (another lda, say): the same plans, nothing set twice
        count = len(n.lib.plans)
        assert n._answer(0, e.dtype, e.layout, e.m_measured, e.n, e.k, e.k, e.k) == pid
        assert len(n.lib.plans) == count


def test_a_native_first_call_under_capture_is_not_remembered_without_its_alternative(
    rig, eager_table, monkeypatch
):
    """The library remembers every answer but a transient one: a shape first seen under
    capture whose entry is loaded but whose alternative is not (it cannot be loaded
    then) must not become a plan without the alternative."""
    api, _, _ = rig()
    native = sys.modules[type(api).__module__.rsplit(".", 1)[0] + ".native"]
    rt = sys.modules[type(api).__module__]
    capturing = [False]
    lt = SimpleNamespace(
        desc=SimpleNamespace(op=1, w=2, a=3, c=4, alpha=5, beta=6), algo_ptr=7, workspace_bytes=8
    )
    monkeypatch.setattr(api, "_lt_gemm", lambda plan, dev, gemm: lt)
    api._lt_handles[0] = 0x4A4E
    monkeypatch.setattr(
        sys.modules[rt.__name__.rsplit(".", 1)[0] + ".cublaslt"], "matmul_address", lambda: 9
    )
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    n = object.__new__(native.Native)
    n.lib, n.slot, n.namespace, n._apis = FakeLib(), 0, "ns", {"ns": api}
    n._lock, n._ids, n._names, n._plans, n._keep = contextlib.nullcontext(), {}, [], {}, []
    n._max_plans, n._codes = 1 << 14, {"fits": 14, "capture": 16, "load_error": 17}
    monkeypatch.setattr(n, "_bias_function", lambda dtype, dev: 0xB1A5)
    e = next(x for x in eager_table.entries if x.eager is not None and x.kind == "cublaslt")
    n._answer(0, e.dtype, e.layout, e.m_measured, e.n, e.k, e.k, e.k)
    api._plans[e.key].eager.loaded.clear()  # the entry is loaded there, its alternative not
    count = len(n.lib.plans)
    capturing[0] = True
    args = (0, e.dtype, e.layout, e.m_measured // 2, e.n, e.k, e.k, e.k)
    assert n._answer(*args) == -((16 | native._TRANSIENT) + 1)
    assert len(n.lib.plans) == count
    capturing[0] = False
    pid = n._answer(*args)
    assert n.lib.plans[pid]["kind"] == 2 and n.lib.plans[pid]["eager"] > 0
