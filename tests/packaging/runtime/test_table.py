"""The dispatch table's schema (format 1): typed records, their JSON round trip and
canonical bytes, every rule of the format, and an entry's identity.

Tables come from the recorded H100 database (``selected_table`` holds kernel, cublaslt
and fallback entries); the hostile inputs are those tables with one value broken.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest

from cudal2.packaging.runtime.table import (
    ENTRY_KEYS,
    FORMAT,
    KERNEL_ONLY_KEYS,
    TOP_LEVEL_KEYS,
    CublasLtAlgo,
    DispatchTable,
    EntryKey,
    TableEntry,
    TableError,
)

DROP = object()  # a hostile value: the key is removed


def _index(raw: dict[str, Any], kind: str) -> int:
    return next(i for i, e in enumerate(raw["entries"]) if e["kind"] == kind)


def _lt(raw: dict[str, Any], _: Any) -> dict[str, Any]:
    """The cuBLASLt object of the table's first cublaslt entry."""
    return copy.deepcopy(raw["entries"][_index(raw, "cublaslt")]["cublaslt"])


def _fused(epilogue: str, n_times: int = 1, **launch: Any):
    """A derived value of key 'launch': the entry turned into one of ``epilogue`` (its N
    times ``n_times``: a gated one's packed rows), its recipe of ABI gemm_v3 for that
    epilogue with ``launch``'s keys."""

    def derive(_: Any, e: dict[str, Any]) -> dict[str, Any]:
        e.update(epilogue=epilogue, n=n_times * e["n"])
        return dict(e["launch"], abi="gemm_v3", epilogue=epilogue, **launch)

    return derive


# the boxes of a kernel that stores C and reads R by TMA
_CR = {"a": [64, 16], "b": [64, 64], "c": [64, 64], "r": [64, 64]}

# (where: "top" or the kind of the entry broken, key path, value, what the message says).
# A callable value is called with the table's JSON and the object at ``where``.
HOSTILE: list[tuple[str, str, Any, str]] = [
    ("top", "format", 2, "unsupported 'format' 2"),
    ("top", "format", "1", "unsupported 'format' '1'"),
    *[("top", key, DROP, f"missing top-level key {key!r}") for key in TOP_LEVEL_KEYS],
    ("top", "package", "", "top-level key 'package' must be a non-empty string"),
    ("top", "name", 7, "top-level key 'name' must be a non-empty string"),
    ("top", "version", None, "top-level key 'version' must be a non-empty string"),
    ("top", "tool_version", 0.1, "top-level key 'tool_version' must be a string"),
    ("top", "manifest_sha256", None, "top-level key 'manifest_sha256' must be a string"),
    ("top", "gpu_models", "NVIDIA H100", "top-level key 'gpu_models' must be a list of strings"),
    ("top", "archs", [90], "top-level key 'archs' must be a list of strings"),
    ("top", "gpu_models", ["NVIDIA A100"], "top-level key 'gpu_models' must list the entries'"),
    ("top", "gpu_models", [], "top-level key 'gpu_models' must list the entries' GPU models"),
    ("top", "archs", ["sm_100a", "sm_90a"], "top-level key 'archs' must list the entries' archs"),
    ("top", "drivers", None, "top-level key 'drivers' must be a list of strings"),
    ("top", "cuda_versions", [13.0], "top-level key 'cuda_versions' must be a list of strings"),
    ("top", "measured_from", 0, "top-level key 'measured_from' must be a string or null"),
    ("top", "measured_to", [], "top-level key 'measured_to' must be a string or null"),
    ("top", "entries", {}, "top-level key 'entries' must be a list"),
    ("top", "entries", [1], "entries[0]: an entry must be a JSON object"),
    ("top", "entries", lambda t, _: [*t["entries"], t["entries"][0]], "repeats the target of"),
    *[("kernel", key, DROP, f"missing key {key!r}") for key in ENTRY_KEYS],
    ("kernel", "gpu", "", "key 'gpu' must be a non-empty string"),
    ("kernel", "arch", None, "key 'arch' must be a non-empty string"),
    ("kernel", "dtype", 16, "key 'dtype' must be a non-empty string"),
    ("kernel", "layout", "", "key 'layout' must be a non-empty string"),
    ("kernel", "baseline", None, "key 'baseline' must be a non-empty string"),
    ("kernel", "n", -1, "key 'n' must be a positive integer, got -1"),
    ("kernel", "k", True, "key 'k' must be a positive integer, got True"),
    ("kernel", "m_min", 0, "key 'm_min' must be a positive integer, got 0"),
    ("kernel", "m_max", 1.5, "key 'm_max' must be a positive integer, got 1.5"),
    ("kernel", "m_measured", "64", "key 'm_measured' must be a positive integer, got '64'"),
    ("kernel", "m_min", lambda _, e: e["m_measured"] + 1, "need m_min <= m_measured <= m_max"),
    ("kernel", "time_us", 0, "key 'time_us' must be a positive finite number, got 0"),
    ("kernel", "time_us", "fast", "key 'time_us' must be a positive finite number, got 'fast'"),
    ("kernel", "time_us", None, "key 'time_us' must be a positive finite number, got None"),
    ("kernel", "baseline_us", "24.0", "key 'baseline_us' must be a finite number or null"),
    ("kernel", "speedup", "1.2x", "key 'speedup' must be a finite number or null, got '1.2x'"),
    ("kernel", "spread", False, "key 'spread' must be a finite number or null, got False"),
    ("kernel", "measured_at", 0, "key 'measured_at' must be a string, got 0"),
    ("kernel", "candidates", -1, "key 'candidates' must be a non-negative integer"),
    ("kernel", "kind", "cublas", "key 'kind' must be one of ('kernel', 'cublaslt', 'fallback')"),
    ("kernel", "kernel", "", "key 'kernel' must be a non-empty string or null, got ''"),
    ("kernel", "symbol", 7, "key 'symbol' must be a non-empty string or null, got 7"),
    ("kernel", "design_key", ["x"], "key 'design_key' must be a non-empty string or null"),
    *[
        ("kernel", key, None, f"a kernel entry needs a non-null {key!r}")
        for key in KERNEL_ONLY_KEYS
    ],
    ("kernel", "cubin_sha256", "not-a-hash", "key 'cubin_sha256' must be 64 lowercase hex"),
    ("kernel", "cubin_sha256", "AB" * 32, "key 'cubin_sha256' must be 64 lowercase hex"),
    ("kernel", "launch", [1], "key 'launch' must be an object, got [1]"),
    ("kernel", "launch.abi", 1, "key 'launch.abi' must be a non-empty string, got 1"),
    ("kernel", "launch.align", {"k": 0}, "key 'launch.align' must map 'm', 'n' or 'k'"),
    ("kernel", "launch.align", {"x": 8}, "key 'launch.align' must map 'm', 'n' or 'k'"),
    ("kernel", "launch.block", [128, 1], "key 'launch.block' must be a list of 3 positive"),
    ("kernel", "launch.block", DROP, "key 'launch.block' must be a list of 3 positive"),
    ("kernel", "launch.tile_m", 0, "key 'launch.tile_m' must be a positive integer, got 0"),
    ("kernel", "launch.tile_m", DROP, "key 'launch.tile_m' must be a positive integer"),
    ("kernel", "launch.tile_n", DROP, "key 'launch.tile_n' must be a positive integer"),
    ("kernel", "launch.smem_bytes", -1, "key 'launch.smem_bytes' must be a non-negative"),
    ("kernel", "launch.smem_bytes", DROP, "key 'launch.smem_bytes' must be a non-negative"),
    ("kernel", "launch.split_k", 0, "key 'launch.split_k' must be a positive integer"),
    ("kernel", "launch.cluster", [1, 2], "key 'launch.cluster' must be a list of 3 positive"),
    ("kernel", "launch.persistent", -1, "key 'launch.persistent' must be a non-negative"),
    # a persistent grid is 1-D: its clusters (the multicast pair's [2, 1, 1]) along x
    (
        "kernel",
        "launch",
        lambda _, e: dict(e["launch"], persistent=1, cluster=[1, 2, 1]),
        "key 'launch.cluster' of a persistent recipe must be [c, 1, 1] (its grid is 1-D)",
    ),
    ("kernel", "launch.ctas_per_sm", 0, "key 'launch.ctas_per_sm' must be a positive integer"),
    ("kernel", "launch.max_ctas", 0, "key 'launch.max_ctas' must be a positive integer, got 0"),
    ("kernel", "launch.max_ctas", -128, "key 'launch.max_ctas' must be a positive integer"),
    ("kernel", "launch.max_ctas", "128", "key 'launch.max_ctas' must be a positive integer"),
    ("kernel", "launch.max_ctas", 128.0, "key 'launch.max_ctas' must be a positive integer"),
    ("kernel", "launch.max_ctas", True, "key 'launch.max_ctas' must be a positive integer"),
    ("kernel", "launch.streamk", -1, "key 'launch.streamk' must be a non-negative integer"),
    ("kernel", "launch.streamk", "1", "key 'launch.streamk' must be a non-negative integer"),
    ("kernel", "launch.workspace_per_cta", 0, "key 'launch.workspace_per_cta' must be a positive"),
    ("kernel", "launch.workspace_per_cta", 1.5, "key 'launch.workspace_per_cta' must be a posi"),
    # a stream-K kernel reads a workspace: a recipe that would launch it without one
    ("kernel", "launch.streamk", 1, "key 'launch.streamk' needs a persistent recipe with"),
    (
        "kernel",
        "launch",
        lambda _, e: dict(e["launch"], persistent=1, streamk=1),
        "needs a persistent recipe with 'launch.workspace_per_cta'",
    ),
    ("kernel", "launch.pdl", 1, "key 'launch.pdl' must be true or false, got 1"),
    ("kernel", "launch.pdl", "true", "key 'launch.pdl' must be true or false, got 'true'"),
    ("kernel", "launch.pdl", None, "key 'launch.pdl' must be true or false, got None"),
    ("kernel", "launch", lambda _, e: dict(e["launch"], abi="gemm_v2"), "key 'launch.tma' must"),
    # the TMA store's box of C (optional; [columns, rows] by the boxes' rule)
    *(
        (
            "kernel",
            "launch",
            lambda _, e, tma=tma: dict(e["launch"], abi="gemm_v2", tma=tma),
            needle,
        )
        for tma, needle in (
            ({"a": [64, 128], "b": [64, 256], "c": [64]}, "key 'launch.tma' must hold boxes"),
            ({"a": [64, 128], "b": [64, 256], "c": [0, 64]}, "key 'launch.tma' must hold boxes"),
            ({"a": [64, 128], "b": [64, 256], "c": [72, 64]}, "key 'launch.tma.c' must be a box"),
            ({"a": [64, 128], "b": [64, 256], "c": [64, 512]}, "key 'launch.tma.c' must be a box"),
            ({"a": [64, 128], "b": [64, 256], "c": [8, 64]}, "of 16, 32 or 64 columns"),
            ({"a": [64, 128], "b": [64, 256], "c": [48, 64]}, "of 16, 32 or 64 columns"),
            ({"a": [64, 128], "b": [64, 256], "d": [64, 64]}, "key 'launch.tma' must hold boxes"),
            # R's box (R by TMA): C's, beside it
            ({"a": [64, 128], "b": [64, 256], "r": [64, 64]}, "key 'launch.tma.r' must be C's"),
            (
                {"a": [64, 128], "b": [64, 256], "c": [64, 64], "r": [32, 64]},
                "got r [32, 64] beside c [64, 64]",
            ),
            (
                {"a": [64, 128], "b": [64, 256], "c": [64, 64], "r": [64]},
                "key 'launch.tma' must hold boxes",
            ),
        )
    ),
    # R by TMA with an epilogue that has no residual (or none at all)
    (
        "kernel",
        "launch",
        lambda _, e: dict(e["launch"], abi="gemm_v2", tma=_CR),
        "key 'launch.tma.r': a kernel reading R by TMA needs an epilogue with a residual, "
        "not 'none'",
    ),
    ("kernel", "launch", _fused("bias", tma=_CR), "needs an epilogue with a residual, not 'bias'"),
    ("kernel", "cublaslt", _lt, "only a cublaslt entry has key 'cublaslt'"),
    ("kernel", "cublaslt", "algo", "only a cublaslt entry has key 'cublaslt'"),
    ("cublaslt", "cublaslt", DROP, "a cublaslt entry needs an object 'cublaslt'"),
    ("cublaslt", "cublaslt", "algo", "a cublaslt entry needs an object 'cublaslt'"),
    ("cublaslt", "kernel", None, "a cublaslt entry needs a non-null 'kernel'"),
    ("cublaslt", "design_key", None, "a cublaslt entry needs a non-null 'design_key'"),
    ("cublaslt", "symbol", "hgemm", "a cublaslt entry must have 'symbol' null"),
    ("cublaslt", "cubin_sha256", "0" * 64, "a cublaslt entry must have 'cubin_sha256' null"),
    ("cublaslt", "launch", {}, "a cublaslt entry must have 'launch' null"),
    ("cublaslt", "cublaslt.algo", "00ff", "key 'cublaslt.algo' must be 128 lowercase hex"),
    ("cublaslt", "cublaslt.algo", DROP, "key 'cublaslt.algo' must be 128 lowercase hex"),
    ("cublaslt", "cublaslt.version", "13.1", "key 'cublaslt.version' must be a non-negative"),
    ("cublaslt", "cublaslt.workspace_bytes", -1, "key 'cublaslt.workspace_bytes' must be"),
    ("cublaslt", "cublaslt.config", [], "key 'cublaslt.config' must be an object, got []"),
    ("kernel", "epilogue", "gelu", "key 'epilogue' must be one of ['none', 'bias',"),
    ("kernel", "epilogue", 1, "key 'epilogue' must be one of"),
    # a plain (gemm_v1/v2) kernel entry claiming an epilogue, and a gemm_v3 kernel
    # serving a plain target or another epilogue than its recipe's
    ("kernel", "epilogue", "bias", "key 'epilogue' 'bias': its kernel must be of ABI gemm_v3"),
    (
        "kernel",
        "launch",
        lambda _, e: dict(
            e["launch"], abi="gemm_v3", epilogue="bias", tma={"a": [64, 16], "b": [64, 64]}
        ),
        "key 'epilogue' 'none': its kernel must be of ABI",
    ),
    # a persistent kernel of a gated activation or of the row scale that does not store
    # by TMA (only the TMA store's persistent kernels render them)
    (
        "kernel",
        "launch",
        _fused("silu", 2, persistent=1, tma={"a": [64, 16], "b": [64, 64]}),
        "key 'epilogue' 'silu': its kernel cannot be persistent unless it stores C by TMA",
    ),
    (
        "kernel",
        "launch",
        _fused("rmsnorm", persistent=1, tma={"a": [64, 16], "b": [64, 64]}),
        "key 'epilogue' 'rmsnorm': its kernel cannot be persistent unless it stores C by TMA",
    ),
    (
        "kernel",
        "launch",
        _fused("rmsnorm_silu", 2, persistent=1, tma={"a": [64, 16], "b": [64, 64]}),
        "key 'epilogue' 'rmsnorm_silu': its kernel cannot be persistent unless it stores C",
    ),
    ("cublaslt", "epilogue", "residual", "a cublaslt entry serves no epilogue"),
    ("cublaslt", "epilogue", "silu", "a cublaslt entry serves no epilogue"),
    ("cublaslt", "epilogue", "rmsnorm_bias", "a cublaslt entry serves no epilogue"),
    ("fallback", "kernel", "hgemm", "a fallback entry must have 'kernel' null"),
    ("fallback", "design_key", "abc", "a fallback entry must have 'design_key' null"),
    ("fallback", "cublaslt", _lt, "only a cublaslt entry has key 'cublaslt'"),
]


def _case_id(value: Any) -> str:
    if value is DROP:
        return "DROP"
    return "derived" if callable(value) else repr(value)[:20]


def _break(raw: dict[str, Any], where: str, path: str, value: Any) -> str:
    """Apply one hostile value to ``raw`` in place; the location the message names."""
    if where == "top":
        obj, location = raw, ""
    else:
        i = _index(raw, where)
        obj, location = raw["entries"][i], f"entries[{i}]: "
    *parents, last = path.split(".")
    if callable(value):
        value = value(raw, obj)
    for key in parents:
        obj = obj[key]
    if value is DROP:
        del obj[last]
    else:
        obj[last] = value
    return location


@pytest.mark.parametrize(
    ("where", "path", "value", "message"),
    HOSTILE,
    ids=[f"{w}.{p}={_case_id(v)}" for w, p, v, _ in HOSTILE],
)
def test_a_broken_table_is_refused_by_the_rule_it_breaks(
    selected_table, where, path, value, message
):
    raw = selected_table.as_json()
    location = _break(raw, where, path, value)
    with pytest.raises(TableError) as err:
        DispatchTable.from_json(raw, "T")
    assert str(err.value).startswith(f"T: {location}"), str(err.value)
    assert message in str(err.value)


# -- round trip and canonical bytes ---------------------------------------------------


@pytest.mark.parametrize("fixture", ["recorded_table", "selected_table"])
def test_round_trip(request, fixture):
    table: DispatchTable = request.getfixturevalue(fixture)
    data = table.to_bytes()
    assert DispatchTable.from_json(table.as_json()) == table
    assert DispatchTable.from_bytes(data) == table
    assert DispatchTable.from_bytes(data).to_bytes() == data
    assert DispatchTable.from_bytes(data.decode()).as_json() == json.loads(data)


def test_bytes_are_canonical(selected_table):
    data = selected_table.to_bytes()
    assert data.endswith(b"}\n") and data.isascii()
    parsed = json.loads(data)
    # sorted keys, 2-space indent: re-serialising the parsed table gives the same bytes
    assert data == (json.dumps(parsed, sort_keys=True, indent=2) + "\n").encode()
    order = [TableEntry.from_json(e).sort_key for e in parsed["entries"]]
    assert order == sorted(order)
    assert parsed["format"] == FORMAT
    assert sorted(parsed) == sorted(TOP_LEVEL_KEYS)


def test_input_order_does_not_matter(selected_table):
    raw = selected_table.as_json()
    raw["entries"].reverse()
    raw = dict(reversed(list(raw.items())))
    table = DispatchTable.from_json(raw)
    assert table == selected_table
    assert table.to_bytes() == selected_table.to_bytes()
    reordered = dataclasses.replace(selected_table, entries=selected_table.entries[::-1])
    assert reordered.entries == selected_table.entries


def test_the_build_writes_every_key_and_the_candidates(selected_table):
    for raw in selected_table.as_json()["entries"]:
        assert set(ENTRY_KEYS) <= set(raw)
        assert raw["candidates"] >= 1
        assert ("cublaslt" in raw) == (raw["kind"] == "cublaslt")


def test_keys_of_older_and_newer_writers(selected_table):
    """An older table has no ``candidates``; a newer one may add keys this reader does
    not know: both read, and the unknown keys are not written back."""
    raw = selected_table.as_json()
    for e in raw["entries"]:
        del e["candidates"]
        e["from_the_future"] = 1
    raw["from_the_future"] = {"x": 1}
    table = DispatchTable.from_json(raw)
    assert all(e.candidates is None for e in table.entries)
    out = json.loads(table.to_bytes())
    assert "from_the_future" not in out
    assert all(set(e) == set(ENTRY_KEYS) | ({"cublaslt"} & set(e)) for e in out["entries"])


def test_a_recipe_of_an_unknown_abi_is_kept_for_the_runtime_to_refuse(selected_table):
    raw = selected_table.as_json()
    i = _index(raw, "kernel")
    raw["entries"][i]["launch"] = {"abi": "gemm_v9", "grid_fn": "whatever"}
    table = DispatchTable.from_json(raw)
    assert table.as_json()["entries"][i]["launch"] == {"abi": "gemm_v9", "grid_fn": "whatever"}


# -- typed, frozen ------------------------------------------------------------------


def test_records_are_typed_and_read_only(selected_table):
    table = selected_table
    kernel = next(e for e in table.entries if e.kind == "kernel")
    lt = next(e for e in table.entries if e.kind == "cublaslt")
    assert isinstance(table.entries, tuple) and isinstance(table.gpu_models, tuple)
    assert isinstance(lt.cublaslt, CublasLtAlgo) and len(bytes.fromhex(lt.cublaslt.algo)) == 64
    assert lt.kernel.startswith("cublaslt_") and lt.symbol is None and lt.launch is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        table.name = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        kernel.time_us = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        kernel.launch["tile_m"] = 1  # type: ignore[index]
    assert isinstance(kernel.launch["block"], tuple)  # nested lists are frozen too


def test_a_record_is_checked_when_made_not_only_when_read(selected_table):
    kernel = next(e for e in selected_table.entries if e.kind == "kernel")
    with pytest.raises(TableError, match="key 'n' must be a positive integer"):
        dataclasses.replace(kernel, n=0)
    with pytest.raises(TableError, match="a fallback entry must have 'kernel' null"):
        dataclasses.replace(kernel, kind="fallback")
    with pytest.raises(TableError, match="top-level key 'package' must be a non-empty string"):
        dataclasses.replace(selected_table, package="")
    with pytest.raises(TableError, match=r"entries\[0\]: an entry must be a TableEntry"):
        dataclasses.replace(selected_table, entries=(kernel.as_json(),))
    with pytest.raises(TableError, match="top-level key 'entries' must be a list"):
        dataclasses.replace(selected_table, entries=None)
    with pytest.raises(TableError, match="top-level key 'gpu_models' must list the entries'"):
        dataclasses.replace(selected_table, entries=())


# -- identity ------------------------------------------------------------------------


def test_an_entry_is_identified_by_its_target_on_its_gpu(selected_table):
    e = selected_table.entries[0]
    assert e.key == EntryKey(e.gpu, e.arch, e.dtype, e.layout, e.n, e.k, e.m_measured)
    assert str(e.key) == f"{e.gpu}/{e.arch}/{e.dtype}/{e.layout}/n{e.n}/k{e.k}/m{e.m_measured}"
    # What was measured and what runs are not identity; the target and GPU are.
    slower = dataclasses.replace(e, time_us=e.time_us * 2, candidates=1)
    assert slower.key == e.key and hash(slower) == hash(e) and slower != e
    for change in ({"gpu": e.gpu + " x"}, {"arch": "sm_100a"}, {"n": e.n + 8}, {"k": e.k + 8}):
        assert dataclasses.replace(e, **change).key != e.key
    moved = dataclasses.replace(e, m_measured=e.m_max + 1, m_max=e.m_max + 1)
    assert moved.key != e.key


def test_keys_are_unique_in_a_table(selected_table):
    keys = [e.key for e in selected_table.entries]
    assert len(set(keys)) == len(keys) == len({str(k) for k in keys})


def test_duplicates_are_refused(selected_table):
    entries = selected_table.entries
    twin = dataclasses.replace(entries[-1], time_us=entries[-1].time_us + 1)
    n = len(entries)
    with pytest.raises(
        TableError, match=rf"entries\[{n}\] repeats the target of entries\[{n - 1}\]"
    ):
        dataclasses.replace(selected_table, entries=(*entries, twin))
    raw = selected_table.as_json()
    raw["entries"].insert(0, raw["entries"][2])
    with pytest.raises(TableError, match=r"T: entries\[3\] repeats the target of entries\[0\]"):
        DispatchTable.from_json(raw, "T")


def test_one_model_under_two_archs_is_two_targets(selected_table):
    """Identity holds the arch, so a model's entries for another arch are not
    duplicates (the lookup keeps them apart, too)."""
    entries = selected_table.entries
    other = tuple(dataclasses.replace(e, arch="sm_90") for e in entries)
    table = dataclasses.replace(
        selected_table, archs=("sm_90", *selected_table.archs), entries=(*entries, *other)
    )
    e = entries[0]
    assert table.lookup_exact(e.gpu, "sm_90", e.dtype, e.layout, e.m_measured, e.n, e.k).arch == (
        "sm_90"
    )
    assert table.lookup_exact(e.gpu, e.arch, e.dtype, e.layout, e.m_measured, e.n, e.k) == e


# -- the recipe limits refuse nothing the generator makes ------------------------------


def test_every_legal_design_recipe_passes_the_launch_limits(recorded_table):
    """The launch limits (``abi.LIMITS``: threads, shared memory, cluster, split-K, TMA
    boxes, the grid at the entry's shape) refuse no recipe of any legal design of any
    family, at a large serving shape (M 65536, N 128256: an LM head's)."""
    from cudal2.generator import design_space, launch_recipe
    from cudal2.records import ARCHS, DTYPES, LAYOUTS

    kernel = next(e for e in recorded_table.entries if e.kind == "kernel")
    big = dataclasses.replace(kernel, n=128256, m_min=1, m_max=65536, m_measured=65536)
    recipes = {
        json.dumps(launch_recipe(d), sort_keys=True)
        for arch in ARCHS
        for dtype in DTYPES
        for layout in LAYOUTS
        for d in design_space(arch, dtype, layout)
    }
    assert len(recipes) > 1000
    for text in recipes:
        dataclasses.replace(big, launch=json.loads(text))  # checked when made


@pytest.mark.parametrize("pdl", [True, False])
def test_a_pdl_recipe_is_accepted_and_kept(selected_table, pdl):
    """``launch.pdl`` (programmatic dependent launch) is a JSON boolean the launcher
    reads; the table keeps it as written."""
    raw = selected_table.as_json()
    i = _index(raw, "kernel")
    raw["entries"][i]["launch"]["pdl"] = pdl
    table = DispatchTable.from_json(raw, "T")
    assert table.as_json()["entries"][i]["launch"]["pdl"] is pdl
    assert DispatchTable.from_json(json.loads(table.to_bytes()), "T") == table


def test_launch_limits_are_the_archs():
    """The runtime cannot import the build's hardware table; the two must agree."""
    from cudal2.hardware import ARCH_LIMITS
    from cudal2.packaging.runtime.abi import LIMITS

    sm90 = ARCH_LIMITS["sm_90a"]
    assert LIMITS.block_threads == sm90.max_threads
    assert LIMITS.dynamic_smem_bytes == sm90.max_smem_bytes
