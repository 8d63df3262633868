"""The dispatch key carries the epilogue: an entry of a fused epilogue serves only calls
with that epilogue, a plain entry only plain calls; a plain table's bytes do not change
(the field is left out of a plain entry's JSON)."""

from __future__ import annotations

import dataclasses

import pytest

from cudal2.packaging.runtime.table import DispatchTable, TableEntry, TableError


def _with(table: DispatchTable, *extra: TableEntry) -> DispatchTable:
    return dataclasses.replace(table, entries=(*table.entries, *extra))


def _bias_entry(plain: TableEntry) -> TableEntry:
    boxes = {"a": [64, plain.launch["tile_m"]], "b": [64, plain.launch["tile_n"]]}
    launch = {**plain.launch, "abi": "gemm_v3", "epilogue": "bias", "tma": boxes}
    return dataclasses.replace(plain, launch=launch, epilogue="bias")


def test_a_plain_tables_bytes_are_unchanged(recorded_table):
    data = recorded_table.to_bytes()
    assert b"epilogue" not in data
    assert DispatchTable.from_bytes(data).to_bytes() == data


def test_an_epilogue_entry_serves_only_its_epilogue(recorded_table):
    plain = next(e for e in recorded_table.entries if e.kind == "kernel")
    bias = _bias_entry(plain)
    fallback = dataclasses.replace(
        plain,
        kind="fallback",
        kernel=None,
        symbol=None,
        cubin_sha256=None,
        launch=None,
        design_key=None,
        epilogue="residual",
    )
    table = DispatchTable.from_bytes(_with(recorded_table, bias, fallback).to_bytes())
    shape = (plain.gpu, plain.arch, plain.dtype, plain.layout, plain.m_measured, plain.n, plain.k)
    assert table.lookup(*shape) == plain
    assert table.lookup(*shape, epilogue="none") == plain
    assert table.lookup(*shape, epilogue="bias") == bias
    assert table.lookup(*shape, epilogue="residual") == fallback
    assert table.lookup(*shape, epilogue="bias_residual") is None
    assert str(bias.key).endswith("/bias") and bias.key != plain.key
    # A table with only the epilogue entry serves no plain call
    alone = dataclasses.replace(
        recorded_table, entries=tuple(e for e in recorded_table.entries if e != plain) + (bias,)
    )
    assert alone.lookup(*shape) is None
    assert alone.lookup(*shape, epilogue="bias") == bias


def test_an_epilogue_entry_round_trips(recorded_table):
    plain = next(e for e in recorded_table.entries if e.kind == "kernel")
    bias = _bias_entry(plain)
    assert bias.as_json()["epilogue"] == "bias"
    assert "epilogue" not in plain.as_json()
    assert TableEntry.from_json(bias.as_json()) == bias


# The gated-activation and RMSNorm row-scale epilogues (issue 20): each is served by a
# gemm_v3 kernel naming it, or a fallback; never cuBLASLt; gated ones need an even N (the
# recorded entries' N are all even; a cublaslt entry of any epilogue is refused by the
# rule test_table covers); only a one-tile (not persistent) kernel renders them.
NEW_EPILOGUES = (
    "silu",
    "gelu_tanh",
    "rmsnorm",
    "rmsnorm_bias",
    "rmsnorm_silu",
    "rmsnorm_gelu_tanh",
)


def _as(plain: TableEntry, epilogue: str, **launch) -> TableEntry:
    boxes = {"a": [64, plain.launch["tile_m"]], "b": [64, plain.launch["tile_n"]]}
    recipe = {**plain.launch, "abi": "gemm_v3", "epilogue": epilogue, "tma": boxes, **launch}
    return dataclasses.replace(plain, launch=recipe, epilogue=epilogue)


def _fallback(plain: TableEntry, epilogue: str) -> TableEntry:
    return dataclasses.replace(
        plain,
        kind="fallback",
        kernel=None,
        symbol=None,
        cubin_sha256=None,
        launch=None,
        design_key=None,
        epilogue=epilogue,
    )


@pytest.mark.parametrize("epilogue", NEW_EPILOGUES)
def test_the_new_epilogues_entries_validate_and_serve_only_their_epilogue(recorded_table, epilogue):
    plain = next(e for e in recorded_table.entries if e.kind == "kernel" and e.n % 2 == 0)
    entry = _as(plain, epilogue)
    assert TableEntry.from_json(entry.as_json()) == entry
    table = DispatchTable.from_bytes(_with(recorded_table, entry).to_bytes())
    shape = (plain.gpu, plain.arch, plain.dtype, plain.layout, plain.m_measured, plain.n, plain.k)
    assert table.lookup(*shape, epilogue=epilogue) == entry
    assert table.lookup(*shape) == plain
    others = [e for e in NEW_EPILOGUES if e != epilogue]
    assert all(table.lookup(*shape, epilogue=o) is None for o in others)
    assert _fallback(plain, epilogue).epilogue == epilogue  # a fallback validates too


def _odd(entry: TableEntry) -> TableEntry:
    return dataclasses.replace(entry, n=entry.n + 1)


# (what is wrong, how the entry is made) -> the TableError's words
HOSTILE_ENTRIES = [
    ("plain abi", lambda p, e: dataclasses.replace(p, epilogue=e), "must be of ABI gemm_v3"),
    ("other recipe", lambda p, e: dataclasses.replace(
        _as(p, "silu" if e != "silu" else "gelu_tanh"), epilogue=e), "'launch.epilogue'"),
    ("persistent", lambda p, e: _as(p, e, persistent=True, ctas_per_sm=1), "persistent"),
]  # fmt: skip


@pytest.mark.parametrize("epilogue", NEW_EPILOGUES)
@pytest.mark.parametrize(
    ("what", "make", "needle"), HOSTILE_ENTRIES, ids=[h[0] for h in HOSTILE_ENTRIES]
)
def test_a_bad_new_epilogue_entry_is_refused(recorded_table, epilogue, what, make, needle):
    plain = next(e for e in recorded_table.entries if e.kind == "kernel" and e.n % 2 == 0)
    with pytest.raises(TableError, match=needle):
        make(plain, epilogue)


@pytest.mark.parametrize("epilogue", NEW_EPILOGUES)
def test_a_gated_entry_needs_an_even_n(recorded_table, epilogue):
    plain = next(e for e in recorded_table.entries if e.kind == "kernel" and e.n % 2 == 0)
    gated = epilogue in ("silu", "gelu_tanh", "rmsnorm_silu", "rmsnorm_gelu_tanh")
    for make in (lambda: _as(_odd(plain), epilogue), lambda: _fallback(_odd(plain), epilogue)):
        if gated:
            with pytest.raises(TableError, match="N must be even, got"):
                make()
        else:
            assert make().n == plain.n + 1
