"""Reading, validating and canonically writing dispatch tables (``dispatch.json``, format 1).

The format is specified in docs/contracts.md. A table is read either from a
``dispatch.json`` file or from inside a generated wheel, where it lives at
``<package>/dispatch.json``. Everything that consumes a table (the diff, the wheel
writer) goes through :func:`validate_table` first, so a malformed table fails here
with a message naming the file and the key instead of deep inside a consumer.
"""

from __future__ import annotations

import copy
import json
import re
import zipfile
from pathlib import Path
from typing import Any

from wheel.wheelfile import WheelError, WheelFile

TABLE_FORMAT = 1

# Every top-level key of format 1 (docs/contracts.md, "Dispatch table").
TOP_LEVEL_KEYS: tuple[str, ...] = (
    "format",
    "package",
    "name",
    "version",
    "tool_version",
    "manifest_sha256",
    "gpu_models",
    "archs",
    "drivers",
    "cuda_versions",
    "measured_from",
    "measured_to",
    "entries",
)

ENTRY_KEYS: tuple[str, ...] = (
    "gpu",
    "arch",
    "dtype",
    "layout",
    "n",
    "k",
    "m_min",
    "m_max",
    "m_measured",
    "kind",
    "kernel",
    "symbol",
    "cubin_sha256",
    "launch",
    "time_us",
    "baseline",
    "baseline_us",
    "speedup",
    "spread",
    "design_key",
    "measured_at",
)

# Keys that a kernel entry must fill and a fallback entry must leave null.
KERNEL_ONLY_KEYS: tuple[str, ...] = ("kernel", "symbol", "cubin_sha256", "launch", "design_key")
# A cublaslt entry fills these and leaves the rest of KERNEL_ONLY_KEYS null.
CUBLASLT_KEYS: tuple[str, ...] = ("kernel", "design_key")

KINDS: tuple[str, ...] = ("kernel", "cublaslt", "fallback")

_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_ALGO_RE = re.compile(r"[0-9a-f]{128}")


class TableError(ValueError):
    """A dispatch table that cannot be read or does not follow format 1."""


def entry_sort_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    """The order of ``entries`` in a canonical table."""
    return (entry["gpu"], entry["dtype"], entry["layout"], entry["n"], entry["k"], entry["m_min"])


def target_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies one measured target across tables: (gpu, dtype, layout, n, k, m)."""
    return (
        entry["gpu"],
        entry["dtype"],
        entry["layout"],
        entry["n"],
        entry["k"],
        entry["m_measured"],
    )


def read_table(path: str | Path) -> dict[str, Any]:
    """Read and validate the dispatch table of a ``.whl`` or of a ``dispatch.json`` file.

    Raises :class:`TableError` when the file is missing or unreadable, is not a
    wheel / not JSON, or holds a table that breaks format 1.
    """
    path = Path(path)
    # Checked up front: WheelFile would otherwise report a missing file by its name.
    if not path.is_file():
        reason = "no such file" if not path.exists() else "not a regular file"
        raise TableError(f"{path}: cannot read: {reason}")
    if path.suffix == ".whl":
        raw, source = _read_from_wheel(path)
    else:
        source = str(path)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise TableError(f"{source}: cannot read: {exc.strerror or exc}") from exc
    try:
        table = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TableError(f"{source}: not valid JSON: {exc}") from exc
    validate_table(table, source)
    return table


def _read_from_wheel(path: Path) -> tuple[bytes, str]:
    """The bytes of ``<package>/dispatch.json`` inside a wheel, and a name for messages."""
    try:
        # WheelFile checks each member against RECORD as it is read, so a corrupted
        # wheel is reported here rather than yielding a half-right table.
        with WheelFile(path) as whl:
            names = [
                n for n in whl.namelist() if n.count("/") == 1 and n.endswith("/dispatch.json")
            ]
            if len(names) != 1:
                found = ", ".join(names) if names else "none"
                raise TableError(
                    f"{path}: expected exactly one <package>/dispatch.json in the wheel, "
                    f"found {found}"
                )
            return whl.read(names[0]), f"{path}!{names[0]}"
    except OSError as exc:
        raise TableError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except (zipfile.BadZipFile, WheelError) as exc:
        raise TableError(f"{path}: not a readable wheel: {exc}") from exc


def validate_table(table: Any, source: str = "<table>") -> None:
    """Raise :class:`TableError` unless ``table`` is a well-formed format-1 dispatch table.

    ``source`` names the table in messages (usually its file).
    """
    if not isinstance(table, dict):
        raise TableError(f"{source}: a dispatch table must be a JSON object")
    if "format" not in table:
        raise TableError(f"{source}: missing top-level key 'format'")
    if table["format"] != TABLE_FORMAT:
        raise TableError(
            f"{source}: unsupported 'format' {table['format']!r} (this reader knows {TABLE_FORMAT})"
        )
    for key in TOP_LEVEL_KEYS:
        if key not in table:
            raise TableError(f"{source}: missing top-level key {key!r}")
    for key in ("package", "name", "version"):
        if not isinstance(table[key], str) or not table[key]:
            raise TableError(f"{source}: top-level key {key!r} must be a non-empty string")
    for key in ("gpu_models", "archs"):
        if not isinstance(table[key], list) or not all(isinstance(x, str) for x in table[key]):
            raise TableError(f"{source}: top-level key {key!r} must be a list of strings")
    entries = table["entries"]
    if not isinstance(entries, list):
        raise TableError(f"{source}: top-level key 'entries' must be a list")
    seen: dict[tuple[Any, ...], int] = {}
    for i, entry in enumerate(entries):
        _validate_entry(entry, f"{source}: entries[{i}]")
        key = target_key(entry)
        if key in seen:
            raise TableError(
                f"{source}: entries[{i}] repeats the target of entries[{seen[key]}] "
                f"(gpu, dtype, layout, n, k, m_measured) = {key}"
            )
        seen[key] = i


def _validate_entry(entry: Any, where: str) -> None:
    if not isinstance(entry, dict):
        raise TableError(f"{where}: an entry must be a JSON object")
    for key in ENTRY_KEYS:
        if key not in entry:
            raise TableError(f"{where}: missing key {key!r}")
    for key in ("gpu", "arch", "dtype", "layout"):
        if not isinstance(entry[key], str) or not entry[key]:
            raise TableError(f"{where}: key {key!r} must be a non-empty string")
    for key in ("n", "k", "m_min", "m_max", "m_measured"):
        value = entry[key]
        # bool is an int subclass; a true/false here is a writer bug, not a size.
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise TableError(f"{where}: key {key!r} must be a positive integer, got {value!r}")
    if not entry["m_min"] <= entry["m_measured"] <= entry["m_max"]:
        raise TableError(
            f"{where}: need m_min <= m_measured <= m_max, got "
            f"{entry['m_min']} / {entry['m_measured']} / {entry['m_max']}"
        )
    time_us = entry["time_us"]
    if not isinstance(time_us, int | float) or isinstance(time_us, bool) or not time_us > 0:
        raise TableError(f"{where}: key 'time_us' must be a positive number, got {time_us!r}")
    speedup = entry["speedup"]
    if speedup is not None and (not isinstance(speedup, int | float) or isinstance(speedup, bool)):
        raise TableError(f"{where}: key 'speedup' must be a number or null, got {speedup!r}")
    kind = entry["kind"]
    if kind not in KINDS:
        raise TableError(f"{where}: key 'kind' must be one of {KINDS}, got {kind!r}")
    if kind == "kernel":
        for key in KERNEL_ONLY_KEYS:
            if entry[key] is None:
                raise TableError(f"{where}: a kernel entry needs a non-null {key!r}")
        sha = entry["cubin_sha256"]
        if not isinstance(sha, str) or not _SHA256_RE.fullmatch(sha):
            raise TableError(
                f"{where}: key 'cubin_sha256' must be 64 lowercase hex digits, got {sha!r}"
            )
        if not isinstance(entry["launch"], dict):
            raise TableError(f"{where}: key 'launch' must be an object")
    else:
        filled = CUBLASLT_KEYS if kind == "cublaslt" else ()
        for key in KERNEL_ONLY_KEYS:
            if key in filled and entry[key] is None:
                raise TableError(f"{where}: a {kind} entry needs a non-null {key!r}")
            if key not in filled and entry[key] is not None:
                raise TableError(f"{where}: a {kind} entry must have {key!r} null")
    lt = entry.get("cublaslt")
    if kind != "cublaslt":
        if lt is not None:
            raise TableError(f"{where}: only a cublaslt entry has key 'cublaslt'")
        return
    if not isinstance(lt, dict):
        raise TableError(f"{where}: a cublaslt entry needs an object 'cublaslt'")
    for key in ("version", "workspace_bytes"):
        value = lt.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TableError(
                f"{where}: key 'cublaslt.{key}' must be a non-negative integer, got {value!r}"
            )
    algo = lt.get("algo")
    if not isinstance(algo, str) or not _ALGO_RE.fullmatch(algo):
        raise TableError(
            f"{where}: key 'cublaslt.algo' must be 128 lowercase hex digits (the 64 bytes of "
            f"a cublasLtMatmulAlgo_t), got {algo!r}"
        )


def canonical_table(table: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of ``table`` with ``entries`` in canonical order."""
    out = copy.deepcopy(table)
    out["entries"] = sorted(out["entries"], key=entry_sort_key)
    return out


def write_table_bytes(table: dict[str, Any]) -> bytes:
    """The canonical bytes of ``table``: sorted keys, 2-space indent, trailing newline.

    The table is validated first (a :class:`TableError` otherwise) and its entries
    are sorted by (gpu, dtype, layout, n, k, m_min), so equal tables give equal bytes.
    """
    validate_table(table)
    text = json.dumps(canonical_table(table), sort_keys=True, indent=2, ensure_ascii=True)
    return (text + "\n").encode("utf-8")
