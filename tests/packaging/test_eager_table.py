"""An entry's eager alternative (``TableEntry.eager``) in the table, the wheel and the
diff, on the M = 64 table of llama-3.1-8b-hf-h100 (recorded H100 measurements; the
``eager_table`` fixture)."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import zipfile

import pytest

from cudal2.packaging.diff import (
    EAGER_ADDED,
    EAGER_CHANGED,
    EAGER_REMOVED,
    diff_tables,
    render_markdown,
    render_text,
)
from cudal2.packaging.runtime.table import EAGER_KEYS, DispatchTable, EagerAlt, TableError
from cudal2.packaging.table import read_table
from cudal2.packaging.wheel import WheelBuildError, write_wheel


def _alternated(table: DispatchTable) -> list:
    return [e for e in table.entries if e.eager is not None]


def test_the_table_has_alternatives_and_round_trips(eager_table):
    alts = _alternated(eager_table)
    assert {(e.n, e.k) for e in alts} == {(1024, 4096), (4096, 4096), (4096, 14336), (14336, 4096)}
    assert all(e.kind in ("cublaslt", "fallback") for e in alts)
    assert all(e.eager.time_us - e.time_us < 4.3 for e in alts)
    again = DispatchTable.from_bytes(eager_table.to_bytes())
    assert again == eager_table and again.to_bytes() == eager_table.to_bytes()
    assert [e.eager for e in again.entries] == [e.eager for e in eager_table.entries]
    # Serialised only where present: an entry without one has no key at all.
    raw = json.loads(eager_table.to_bytes())
    for obj, e in zip(raw["entries"], eager_table.entries, strict=True):
        assert ("eager" in obj) == (e.eager is not None)
        if e.eager is not None:
            assert sorted(obj["eager"]) == sorted(EAGER_KEYS)


def test_a_table_without_alternatives_is_byte_identical(eager_table):
    """Dropping every alternative gives the bytes of a table written before the key."""
    plain = dataclasses.replace(
        eager_table, entries=tuple(dataclasses.replace(e, eager=None) for e in eager_table.entries)
    )
    raw = json.loads(eager_table.to_bytes())
    for obj in raw["entries"]:
        obj.pop("eager", None)
    text = json.dumps(raw, sort_keys=True, indent=2, ensure_ascii=True) + "\n"
    assert plain.to_bytes() == text.encode()


def _hostile(eager_table, change) -> dict:
    raw = json.loads(eager_table.to_bytes())
    i = next(i for i, e in enumerate(raw["entries"]) if "eager" in e)
    change(raw["entries"][i])
    return raw


def _set(key, value):
    def change(entry):
        entry["eager"][key] = value

    return change


def _launch(key, value):
    def change(entry):
        entry["eager"]["launch"][key] = value

    return change


def _drop(key):
    def change(entry):
        del entry["eager"][key]

    return change


def _whole(value):
    def change(entry):
        entry["eager"] = value

    return change


def _on_kernel_entry(entry):
    entry.update(
        kind="kernel",
        **{k: entry["eager"][k] for k in ("kernel", "symbol", "cubin_sha256", "launch")},
        design_key=entry["eager"]["design_key"],
        cublaslt=None,
    )
    entry.pop("cublaslt")


HOSTILE = [  # (id, change, what the error says)
    ("not-an-object", _whole([1, 2]), "key 'eager' must be an object or absent"),
    ("a-string", _whole("hgemm"), "key 'eager' must be an object or absent"),
    ("a-number", _whole(1), "key 'eager' must be an object or absent"),
    *[(f"missing-{k}", _drop(k), f"missing key 'eager.{k}'") for k in EAGER_KEYS],
    ("kernel-null", _set("kernel", None), "key 'eager.kernel' must be a non-empty string"),
    ("kernel-empty", _set("kernel", ""), "key 'eager.kernel' must be a non-empty string"),
    ("design-key-number", _set("design_key", 7), "key 'eager.design_key' must be a non-empty"),
    ("symbol-not-c", _set("symbol", "hgemm; rm -rf"), "key 'eager.symbol' must be a C identifier"),
    ("symbol-null", _set("symbol", None), "key 'eager.symbol' must be a non-empty string"),
    ("sha-short", _set("cubin_sha256", "ab" * 8), "key 'eager.cubin_sha256' must be 64"),
    ("sha-upper", _set("cubin_sha256", "AB" * 32), "key 'eager.cubin_sha256' must be 64"),
    ("sha-path", _set("cubin_sha256", "../" * 21 + "a"), "key 'eager.cubin_sha256' must be 64"),
    ("time-zero", _set("time_us", 0), "key 'eager.time_us' must be a positive finite"),
    ("time-negative", _set("time_us", -9.5), "key 'eager.time_us' must be a positive finite"),
    ("time-bool", _set("time_us", True), "key 'eager.time_us' must be a positive finite"),
    ("time-string", _set("time_us", "9.5"), "key 'eager.time_us' must be a positive finite"),
    ("time-inf", _set("time_us", 1e999), "key 'eager.time_us' must be a positive finite"),
    ("launch-list", _set("launch", [1]), "key 'eager.launch' must be an object"),
    ("launch-null", _set("launch", None), "key 'eager.launch' must be an object"),
    ("tile-zero", _launch("tile_m", 0), "key 'eager.launch.tile_m' must be a positive integer"),
    ("block-huge", _launch("block", [2048, 1, 1]), "key 'eager.launch.block' must be at most"),
    ("smem-huge", _launch("smem_bytes", 1 << 30), "key 'eager.launch.smem_bytes' must be at"),
    ("pdl-one", _launch("pdl", 1), "key 'eager.launch.pdl' must be true or false"),
    ("align-bad", _launch("align", {"q": 8}), "key 'eager.launch.align' must map"),
    ("on-a-kernel-entry", _on_kernel_entry, "only a cublaslt or fallback entry has key 'eager'"),
]


@pytest.mark.parametrize(("change", "says"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_a_hostile_eager_object_is_refused_naming_the_key(eager_table, change, says):
    raw = _hostile(eager_table, change)
    with pytest.raises(TableError) as err:
        DispatchTable.from_json(raw, "dispatch.json")
    assert says in str(err.value) and "dispatch.json: entries[" in str(err.value), str(err.value)


def test_an_eager_alt_made_in_code_is_checked_too(eager_table):
    alt = _alternated(eager_table)[0].eager
    with pytest.raises(TableError, match="'eager.time_us'"):
        dataclasses.replace(alt, time_us=float("nan"))
    assert EagerAlt.from_json(alt.as_json()) == alt


def test_the_wheel_ships_and_checks_the_alternatives_cubins(eager_table, eager_cubins, tmp_path):
    whl = write_wheel(eager_table, eager_cubins, tmp_path / "dist")
    alts = {e.eager.cubin_sha256 for e in _alternated(eager_table)}
    with zipfile.ZipFile(whl) as z:
        shipped = {n.rsplit("/", 1)[1][: -len(".cubin")] for n in z.namelist() if "/cubins/" in n}
    assert alts <= shipped
    assert read_table(whl) == eager_table
    # The writer refuses a table whose alternative's cubin it was not given.
    missing = next(iter(alts))
    with pytest.raises(WheelBuildError, match="eager alternatives"):
        write_wheel(
            eager_table,
            {k: v for k, v in eager_cubins.items() if k != missing},
            tmp_path / "dist2",
        )
    with pytest.raises(WheelBuildError, match="has sha256"):
        write_wheel(eager_table, {**eager_cubins, missing: b"\x7fELF not it"}, tmp_path / "d3")


def _rewritten(whl, out, change):
    """A copy of ``whl`` with ``change(name, data) -> data | None`` (None drops the
    member) applied and RECORD rewritten to match, as a careful tamperer would."""
    rows, members = [], []
    with zipfile.ZipFile(whl) as src:
        record = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        for info in src.infolist():
            if info.filename == record:
                continue
            data = change(info.filename, src.read(info))
            if data is None:
                continue
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            rows.append(f"{info.filename},sha256={digest.decode()},{len(data)}")
            members.append((info, data))
    with zipfile.ZipFile(out, "w") as dst:
        for info, data in members:
            dst.writestr(info, data)
        dst.writestr(record, "\n".join([*rows, f"{record},,"]) + "\n")
    return out


def test_a_tampered_or_missing_alternative_cubin_is_refused(eager_table, eager_cubins, tmp_path):
    whl = write_wheel(eager_table, eager_cubins, tmp_path / "dist")
    sha = _alternated(eager_table)[0].eager.cubin_sha256
    winners = {e.cubin_sha256 for e in eager_table.entries if e.kind == "kernel"}
    assert sha not in winners  # an alternative's own cubin, no winner's

    def flip(name, data):
        return data[:-1] + bytes([data[-1] ^ 1]) if name.endswith(f"{sha}.cubin") else data

    with pytest.raises(TableError, match="holds a cubin of sha256"):
        read_table(_rewritten(whl, tmp_path / "flipped.whl", flip))

    def drop(name, data):
        return None if name.endswith(f"{sha}.cubin") else data

    with pytest.raises(TableError, match=f"eager alternative names cubin {sha}, which the wheel"):
        read_table(_rewritten(whl, tmp_path / "dropped.whl", drop))


def test_the_diff_reports_an_alternative_added_removed_or_changed(eager_table):
    alts = _alternated(eager_table)
    e, other = alts[0], alts[1]
    without = dataclasses.replace(
        eager_table,
        entries=tuple(
            dataclasses.replace(x, eager=None) if x is e else x for x in eager_table.entries
        ),
    )
    swapped = dataclasses.replace(
        eager_table,
        entries=tuple(
            dataclasses.replace(x, eager=dataclasses.replace(e.eager, kernel=other.eager.kernel))
            if x is e
            else x
            for x in eager_table.entries
        ),
    )
    assert diff_tables(eager_table, eager_table).empty
    for old, new, reason in (
        (without, eager_table, EAGER_ADDED),
        (eager_table, without, EAGER_REMOVED),
        (eager_table, swapped, EAGER_CHANGED),
    ):
        result = diff_tables(old, new)
        (row,) = result.changed
        assert row["reasons"] == [reason] and (row["n"], row["k"]) == (e.n, e.k)
        assert ("eager" in row["after"]) == (new is not without)
        json.dumps(result.as_json())
        assert "eager alternative" in render_text(result)
        assert "eager alternative" in render_markdown(result)
