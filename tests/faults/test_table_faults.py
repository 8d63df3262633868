"""Tampered ``dispatch.json`` inside a real generated package (issue 17): the runtime
checks its table once, at first use, and a table it cannot trust is not used at all:
one warning naming the problem, then every call goes to torch (reason ``table`` on the
dispatch path a GPU call takes; on CPU tensors the op still returns torch's result),
``covers`` is false so ``patch_linear`` patches nothing, and ``warmup`` readies
nothing. The build's reader (``read_table``, what ``cudal2-diff`` and the bench use)
refuses the same file with a message naming the key.

Why the whole table and not only the bad entry: the file is the unit the build wrote
and hashed into the wheel's RECORD; one value that breaks the format means the file
was edited or damaged, and nothing else in it can be vouched for either (a recipe
check catches the values that would crash a launch, not an edited tile that launches).

Each case is one line of ``CASES``: an id, how the table's JSON is broken (a function
of the recorded table's JSON, returning the new JSON or the file's bytes), and what
the runtime's warning and the reader's error say.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
import torch.nn.functional as F

from cudal2.packaging.runtime.table import MAX_TABLE_BYTES, TableError
from cudal2.packaging.table import read_table

Raw = dict[str, Any]


def first(raw: Raw, kind: str = "kernel") -> Raw:
    return next(e for e in raw["entries"] if e["kind"] == kind)


def entry(**changes: Any) -> Callable[[Raw], Raw]:
    """The first kernel entry with ``changes`` (a callable value gets the entry)."""

    def apply(raw: Raw) -> Raw:
        e = first(raw)
        for key, value in changes.items():
            e[key] = value(e) if callable(value) else value
        return raw

    return apply


def without(key: str) -> Callable[[Raw], Raw]:
    """The first kernel entry without ``key``."""

    def apply(raw: Raw) -> Raw:
        del first(raw)[key]
        return raw

    return apply


def launch(**changes: Any) -> Callable[[Raw], Raw]:
    """The first kernel entry's recipe with ``changes`` (None deletes a key)."""

    def apply(raw: Raw) -> Raw:
        recipe = first(raw)["launch"]
        for key, value in changes.items():
            if value is None:
                recipe.pop(key, None)
            else:
                recipe[key] = value
        return raw

    return apply


def tma(**changes: Any) -> Callable[[Raw], Raw]:
    """The first kernel entry as a gemm_v2 recipe with TMA boxes ``changes``."""
    boxes = {"a": [64, 128], "b": [64, 128], **changes}
    return launch(abi="gemm_v2", tma=boxes)


def top(**changes: Any) -> Callable[[Raw], Raw]:
    def apply(raw: Raw) -> Raw:
        for key, value in changes.items():
            if value is None:
                raw.pop(key)
            else:
                raw[key] = value
        return raw

    return apply


def text(transform: Callable[[str], str]) -> Callable[[Raw], bytes]:
    """The file's text, transformed (for what JSON objects cannot spell)."""
    return lambda raw: transform(json.dumps(raw, indent=2, sort_keys=True)).encode()


def as_cublaslt(raw: Raw) -> Raw:
    e = first(raw)
    e.update(kind="cublaslt", symbol=None, cubin_sha256=None, launch=None)
    e["cublaslt"] = {"version": 130100, "algo": "00" * 63, "workspace_bytes": 0}
    return raw


DIRECTORY = object()  # dispatch.json replaced by a folder
MISSING = object()  # dispatch.json deleted


class Case(NamedTuple):
    id: str
    tamper: Callable[[Raw], Raw | bytes] | object
    says: str  # in the runtime's warning and the reader's error
    read_says: str | None = None  # where the reader says it otherwise


# fmt: off
CASES: list[Case] = [
    # the file
    Case("truncated", lambda raw: json.dumps(raw).encode()[:500], "not valid JSON"),
    Case("empty", lambda raw: b"", "not valid JSON"),
    Case("not-utf8", lambda raw: b"\xff\xfe{}", "not valid JSON"),
    Case("a-json-array", lambda raw: b"[]", "a dispatch table must be a JSON object"),
    Case("nested-100000-deep", lambda raw: b"[" * 100000 + b"]" * 100000, "nested too deeply",
         "JSON nested more than 32 levels deep"),
    Case("n-5000-digits", text(lambda t: t.replace('"n": ', '"n": ' + "9" * 5000, 1)),
         "not valid JSON"),
    Case("larger-than-64MiB", lambda raw: b" " * (MAX_TABLE_BYTES + 1),
         "more than a dispatch table may have", f"more than the {MAX_TABLE_BYTES}-byte limit"),
    Case("deleted", MISSING, "dispatch.json", "no such file"),
    Case("a-folder", DIRECTORY, "dispatch.json", "not a regular file"),
    # the top level
    Case("format-2", top(format=2), "unsupported 'format' 2"),
    Case("format-1.0", top(format=1.0), "unsupported 'format' 1.0"),
    Case("format-true", top(format=True), "unsupported 'format' True"),
    Case("format-missing", top(format=None), "missing top-level key 'format'"),
    Case("entries-missing", top(entries=None), "missing top-level key 'entries'"),
    Case("entries-object", top(entries={}), "top-level key 'entries' must be a list"),
    Case("version-empty", top(version=""), "top-level key 'version' must be a non-empty string"),
    Case("gpu-models-lie", top(gpu_models=["NVIDIA A100"]), "key 'gpu_models' must list"),
    Case("duplicate-entry", lambda raw: top(entries=[*raw["entries"], raw["entries"][0]])(raw),
         "repeats the target of"),
    # an entry's keys
    Case("entry-without-m-min", without("m_min"), "missing key 'm_min'"),
    Case("entry-without-launch", without("launch"), "missing key 'launch'"),
    Case("n-0", entry(n=0), "key 'n' must be a positive integer, got 0"),
    Case("m-range-inverted", entry(m_min=lambda e: e["m_measured"] + 1),
         "need m_min <= m_measured <= m_max"),
    Case("time-nan", text(lambda t: t.replace('"time_us": ', '"time_us": NaN, "x": ', 1)),
         "key 'time_us' must be a positive finite number, got nan"),
    Case("time-infinity", entry(time_us=float("inf")),
         "key 'time_us' must be a positive finite number, got inf"),
    Case("speedup-nan", entry(speedup=float("nan")), "key 'speedup' must be a finite number"),
    Case("kind-cublas", entry(kind="cublas"), "key 'kind' must be one of"),
    Case("symbol-not-c", entry(symbol="hgemm x; rm -rf /"), "key 'symbol' must be a C identifier"),
    Case("sha-uppercase", entry(cubin_sha256=lambda e: e["cubin_sha256"].upper()),
         "key 'cubin_sha256' must be 64 lowercase hex digits"),
    Case("cublaslt-algo-short", as_cublaslt, "key 'cublaslt.algo' must be 128 lowercase hex"),
    # the launch recipe: what the driver would refuse, or divide by
    Case("tile-m-0", launch(tile_m=0), "key 'launch.tile_m' must be a positive integer, got 0"),
    Case("tile-n-negative", launch(tile_n=-64), "key 'launch.tile_n' must be a positive integer"),
    Case("tile-m-missing", launch(tile_m=None), "key 'launch.tile_m' must be a positive integer"),
    Case("block-2048-threads", launch(block=[2048, 1, 1]), "key 'launch.block' must be at most"),
    Case("block-32x32x2", launch(block=[32, 32, 2]), "key 'launch.block' must be at most 1024"),
    Case("block-z-128", launch(block=[1, 1, 128]), "key 'launch.block' must be at most"),
    Case("block-2-dims", launch(block=[128, 1]), "key 'launch.block' must be a list of 3"),
    Case("smem-300KB", launch(smem_bytes=300_000), "key 'launch.smem_bytes' must be at most"),
    Case("smem-negative", launch(smem_bytes=-1), "key 'launch.smem_bytes' must be a non-negative"),
    Case("cluster-16-ctas", launch(cluster=[1, 4, 4], split_k=4),
         "key 'launch.cluster' must hold at most 8 CTAs"),
    Case("cluster-0", launch(cluster=[1, 0, 1]), "key 'launch.cluster' must be a list of 3"),
    Case("split-k-0", launch(split_k=0), "key 'launch.split_k' must be a positive integer"),
    Case("split-k-off-cluster", launch(split_k=3, cluster=[1, 1, 2]),
         "key 'launch.split_k' must be at most 65535 and a multiple of the cluster's z (2)"),
    Case("split-k-100000", launch(split_k=100_000, cluster=[1, 1, 1]),
         "key 'launch.split_k' must be at most 65535"),
    Case("persistent-3", launch(persistent=3), "key 'launch.persistent' must be 0, 1"),
    Case("ctas-per-sm-0", launch(ctas_per_sm=0), "key 'launch.ctas_per_sm' must be a positive"),
    Case("ctas-per-sm-1000", launch(ctas_per_sm=1000), "key 'launch.ctas_per_sm' must be at most"),
    # programmatic dependent launch: JSON true or false only
    Case("pdl-1", launch(pdl=1), "key 'launch.pdl' must be true or false, got 1"),
    Case("pdl-string", launch(pdl="true"), "key 'launch.pdl' must be true or false, got 'true'"),
    Case("pdl-0", launch(pdl=0), "key 'launch.pdl' must be true or false, got 0"),
    Case("pdl-list", launch(pdl=[True]), "key 'launch.pdl' must be true or false"),
    Case("grid-y-past-65535", lambda raw: launch(tile_m=1)(entry(m_min=1, m_max=100_000,
         m_measured=100_000)(raw)), "needs a grid of"),
    Case("align-k-0", launch(align={"k": 0}), "key 'launch.align' must map"),
    Case("align-unknown-dim", launch(align={"q": 8}), "key 'launch.align' must map"),
    Case("v2-no-tma", launch(abi="gemm_v2"), "key 'launch.tma' must hold boxes"),
    Case("v2-box-256-bytes", tma(a=[128, 64]), "key 'launch.tma.a' must be a box"),
    Case("v2-box-512-rows", tma(b=[64, 512]), "key 'launch.tma.b' must be a box"),
    Case("v2-box-8-bytes", tma(a=[4, 64]), "key 'launch.tma.a' must be a box"),
    Case("v2-box-0", tma(b=[64, 0]), "key 'launch.tma' must hold boxes"),
]
# fmt: on


@pytest.fixture(scope="module")
def rt_runtime(rt_package):
    """The package's own copy of the runtime's modules (what a user's process runs)."""
    name = rt_package.__name__
    return sys.modules[f"{name}._runtime.api"], rt_package._ops


@pytest.fixture
def rt_tampered(rt_package, rt_table, rt_runtime):
    """A function that writes a case's table into the package, and restores the
    package's file and op binding after the test."""
    path = Path(rt_package.__file__).parent / "dispatch.json"
    saved = path.read_bytes()
    api_module, ops = rt_runtime

    def write(case: Case) -> Path:
        if case.tamper is MISSING:
            path.unlink()
        elif case.tamper is DIRECTORY:
            path.unlink()
            path.mkdir()
        else:
            out = case.tamper(copy.deepcopy(rt_table.as_json()))
            path.write_bytes(out if isinstance(out, bytes) else json.dumps(out).encode())
        return path

    yield write
    if path.is_dir():
        shutil.rmtree(path)
    path.write_bytes(saved)
    ops.register(rt_package._api, rt_package.NAMESPACE)


def test_there_are_at_least_20_cases():
    assert len(CASES) >= 20
    assert len({c.id for c in CASES}) == len(CASES)


def test_the_untampered_table_is_used(rt_package, rt_table, rt_runtime, rt_tampered):
    """The baseline every case breaks: the package's table loads, with no warning."""
    api_module, _ = rt_runtime
    api = api_module.Api(rt_package.__name__)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert len(api.table.entries) == len(rt_table.entries)
    e = rt_table.entries[0]
    assert api.covers(e.n, e.k, e.dtype, e.layout)


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's notes, not the runtime's
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_tampered_table_is_not_trusted(rt_package, rt_table, rt_runtime, rt_tampered, case):
    path = rt_tampered(case)
    with pytest.raises(TableError) as err:
        read_table(path)
    assert (case.read_says or case.says) in str(err.value), str(err.value)

    api_module, ops = rt_runtime
    api = api_module.Api(rt_package.__name__)  # first use is now
    ops.register(api, rt_package.NAMESPACE)
    e = next(x for x in rt_table.entries if x.kind == "kernel" and x.layout == "tn")
    x = torch.randn(4, e.k, dtype=torch.float16)
    w = torch.randn(e.n, e.k, dtype=torch.float16)
    layer = torch.nn.Linear(e.k, e.n, dtype=torch.float16)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert api.table.entries == ()
        assert not api.covers(e.n, e.k, e.dtype, e.layout)
        # The dispatch path every eligible GPU call takes, at its first use:
        shape = (0, e.dtype, e.layout, e.m_measured, e.n, e.k)
        assert api._prepare(torch, shape) == "table"
        assert api.warmup() == 0
        out = getattr(torch.ops, rt_package.NAMESPACE).linear(x, w)
        assert torch.equal(out, F.linear(x, w))
        assert dict(api.stats.fallbacks) == {"device": 1}  # CPU tensors: torch's result
        assert ops.patch_linear(layer, api, rt_package.NAMESPACE).names == []
        assert api.table.entries == ()  # read once: no second warning
    ours = [w for w in seen if issubclass(w.category, RuntimeWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    message = str(ours[0].message)
    assert f"{rt_package.__name__}: cannot use its dispatch table" in message
    assert case.says in message, message
    assert "using torch for every call" in message
