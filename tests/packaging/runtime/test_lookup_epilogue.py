"""The dispatch key carries the epilogue: an entry of a fused epilogue serves only calls
with that epilogue, a plain entry only plain calls; a plain table's bytes do not change
(the field is left out of a plain entry's JSON)."""

from __future__ import annotations

import dataclasses

from cudal2.packaging.runtime.table import DispatchTable, TableEntry


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
