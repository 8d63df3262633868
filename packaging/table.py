"""Reading dispatch tables from files: a ``dispatch.json``, or the one inside a
generated wheel (``<package>/dispatch.json``).

The table's schema, its rules and its canonical bytes are the runtime's
(``cudal2.packaging.runtime.table``: ``DispatchTable``, ``TableError``); this module
finds and reads the bytes, and every way a file can be wrong fails here as a
``TableError`` naming the file: missing, unreadable, not a regular file (a folder, a
FIFO, a device), larger than ``MAX_TABLE_BYTES`` (checked before reading: for a wheel,
from the zip's own record of the member's size), not JSON, nested deeper than
``MAX_DEPTH``, a table that breaks format 1.

A wheel is checked whole before its table is trusted: one ``<package>/dispatch.json``,
no member twice, every member listed in ``.dist-info/RECORD`` with the sha256 and size
of its bytes (streamed, each member at most ``MAX_MEMBER_BYTES``, all of them at most
``MAX_WHEEL_BYTES``), every ``cubins/<sha256>.cubin`` holding bytes of that sha256, and
the cubin of every kernel entry and eager alternative present. So a wheel whose cubin
was replaced (RECORD left as it was, or rewritten to match) is refused.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import stat
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Any

from .runtime.table import DispatchTable, TableError

# A 32-entry table is ~30 KB; the largest shipped one is under 1 MB.
MAX_TABLE_BYTES = 64 << 20
# A table nests 5 levels (entries -> entry -> launch -> tma -> box); JSON deeper than
# this is not a table, and parsing it must not exhaust the interpreter's stack.
MAX_DEPTH = 32
MAX_MEMBER_BYTES = 256 << 20
MAX_WHEEL_BYTES = 1 << 30
_MAX_RECORD_BYTES = 16 << 20
_CHUNK = 1 << 20
_RECORD_RE = re.compile(r"[^/]+\.dist-info/RECORD")
_CUBIN_RE = re.compile(r"[^/]+/cubins/(?P<sha>[^/]*)\.cubin")
_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def read_table(path: str | Path) -> DispatchTable:
    """Read and validate the dispatch table of a ``.whl`` or of a ``dispatch.json`` file.

    Raises :class:`TableError` when the file is missing or unreadable, is not a
    wheel / not JSON, is too large or too deeply nested, is a wheel that fails its
    checks (module docstring), or holds a table that breaks format 1.
    """
    path = Path(path)
    _regular_file(path)
    if path.suffix == ".whl":
        raw, source, cubins = _read_wheel(path)
    else:
        raw, source, cubins = _read_json_file(path), str(path), None
    table = parse_table(raw, source)
    if cubins is not None:
        for e in table.entries:
            if e.kind == "kernel" and e.cubin_sha256 not in cubins:
                raise TableError(
                    f"{path}: entry {e.key} names cubin {e.cubin_sha256}, which the wheel lacks"
                )
            if e.eager is not None and e.eager.cubin_sha256 not in cubins:
                raise TableError(
                    f"{path}: entry {e.key}'s eager alternative names cubin "
                    f"{e.eager.cubin_sha256}, which the wheel lacks"
                )
    return table


def parse_table(raw: bytes, source: str) -> DispatchTable:
    """The table of a ``dispatch.json``'s bytes, with JSON errors and excess depth
    reported as ``TableError`` naming ``source`` (never a ``RecursionError``)."""
    try:
        obj = json.loads(raw)
    except RecursionError:
        raise TableError(f"{source}: JSON nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an int of 5000 digits
        raise TableError(f"{source}: not valid JSON: {exc}") from None
    if _deeper_than(obj, MAX_DEPTH):
        raise TableError(f"{source}: JSON nested more than {MAX_DEPTH} levels deep")
    try:
        return DispatchTable.from_json(obj, source)
    except RecursionError:  # cannot happen below MAX_DEPTH; never a traceback if it does
        raise TableError(f"{source}: JSON nested too deeply to check") from None


def _deeper_than(obj: Any, limit: int) -> bool:
    """Whether ``obj`` nests more than ``limit`` containers deep (iterative: no stack)."""
    stack = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _regular_file(path: Path) -> None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise TableError(f"{path}: cannot read: no such file") from None
    except (OSError, ValueError) as exc:
        raise TableError(f"{path}: cannot read: {_why(exc)}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a file")
        raise TableError(f"{path}: cannot read: not a regular file ({kind})")


def _why(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _too_large(path: Path, size: int, limit: int, what: str) -> TableError:
    return TableError(f"{path}: {what} is {size} bytes, more than the {limit}-byte limit: not read")


def _read_json_file(path: Path) -> bytes:
    # O_NONBLOCK: a FIFO swapped in after the check above must not hang the read.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise TableError(f"{path}: cannot read: {_why(exc)}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_TABLE_BYTES:
        os.close(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TableError(f"{path}: cannot read: not a regular file")
        raise _too_large(path, st.st_size, MAX_TABLE_BYTES, "the table")
    with os.fdopen(fd, "rb") as f:
        try:
            raw = f.read(MAX_TABLE_BYTES + 1)
        except OSError as exc:
            raise TableError(f"{path}: cannot read: {_why(exc)}") from None
    if len(raw) > MAX_TABLE_BYTES:  # grew since the stat
        raise _too_large(path, len(raw), MAX_TABLE_BYTES, "the table")
    return raw


class _BadWheel(Exception):
    """Why a wheel is refused (internal: becomes a TableError naming the wheel)."""


def _read_wheel(path: Path) -> tuple[bytes, str, set[str]]:
    """The bytes of ``<package>/dispatch.json`` inside a wheel, a name for messages,
    and the sha256 of each cubin the wheel ships, after checking the whole wheel."""
    try:
        with zipfile.ZipFile(path) as z:
            return _checked_wheel(path, z)
    except TableError:
        raise
    except _BadWheel as exc:
        raise TableError(f"{path}: not a readable wheel: {exc}") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, NotImplementedError) as exc:
        raise TableError(f"{path}: not a readable wheel: {_why(exc)}") from None
    except RuntimeError as exc:  # an encrypted member
        raise TableError(f"{path}: not a readable wheel: {exc}") from None
    except OSError as exc:
        raise TableError(f"{path}: cannot read: {_why(exc)}") from None


def _checked_wheel(path: Path, z: zipfile.ZipFile) -> tuple[bytes, str, set[str]]:
    infos = [i for i in z.infolist() if not i.is_dir()]
    names = [i.filename for i in infos]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise _BadWheel(f"member {name!r} appears twice")
        seen.add(name)
    tables = [n for n in names if n.count("/") == 1 and n.endswith("/dispatch.json")]
    if len(tables) != 1:
        found = ", ".join(tables) if tables else "none"
        raise TableError(
            f"{path}: expected exactly one <package>/dispatch.json in the wheel, found {found}"
        )
    by_name = {i.filename: i for i in infos}
    table_info = by_name[tables[0]]
    if table_info.file_size > MAX_TABLE_BYTES:
        raise _too_large(path, table_info.file_size, MAX_TABLE_BYTES, tables[0])
    for info in infos:
        if info.file_size > MAX_MEMBER_BYTES:
            raise _too_large(path, info.file_size, MAX_MEMBER_BYTES, info.filename)
    total = sum(i.file_size for i in infos)
    if total > MAX_WHEEL_BYTES:
        raise _too_large(path, total, MAX_WHEEL_BYTES, "the wheel's content")
    records = [n for n in names if _RECORD_RE.fullmatch(n)]
    if len(records) != 1:
        raise _BadWheel(f"expected one .dist-info/RECORD, found {len(records)}")
    record_info = by_name[records[0]]
    if record_info.file_size > _MAX_RECORD_BYTES:
        raise _too_large(path, record_info.file_size, _MAX_RECORD_BYTES, records[0])
    record = _parse_record(z.read(record_info), records[0])
    unlisted = sorted(seen - record.keys() - {records[0]})
    if unlisted:
        raise _BadWheel(f"{unlisted[0]} is not listed in {records[0]}")
    absent = sorted(record.keys() - seen)
    if absent:
        raise _BadWheel(f"{records[0]} lists {absent[0]}, which the wheel lacks")
    table_bytes = b""
    cubins: set[str] = set()
    for info in infos:
        if info.filename == records[0]:
            continue
        sha, size, data = _member_digest(z, info, keep=info.filename == tables[0])
        want_sha, want_size = record[info.filename]
        if sha != want_sha or size != want_size:
            raise _BadWheel(
                f"{info.filename} does not match {records[0]} "
                f"(sha256 {sha.hex()}, {size} bytes; RECORD says {want_sha.hex()}, "
                f"{want_size} bytes)"
            )
        if data is not None:
            table_bytes = data
        m = _CUBIN_RE.fullmatch(info.filename)
        if m:
            if m.group("sha") != sha.hex():
                raise _BadWheel(f"{info.filename} holds a cubin of sha256 {sha.hex()}")
            cubins.add(sha.hex())
    return table_bytes, f"{path}!{tables[0]}", cubins


def _member_digest(
    z: zipfile.ZipFile, info: zipfile.ZipInfo, keep: bool
) -> tuple[bytes, int, bytes | None]:
    """sha256 and size of a member's bytes, read in chunks and never past the size
    the zip records for it (zipfile stops there, and checks the CRC)."""
    h, size = hashlib.sha256(), 0
    kept = io.BytesIO() if keep else None
    with z.open(info) as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
            if kept is not None:
                kept.write(chunk)
    return h.digest(), size, kept.getvalue() if kept is not None else None


def _parse_record(raw: bytes, name: str) -> dict[str, tuple[bytes, int]]:
    """RECORD's rows: member -> (sha256 digest, size). Every row but RECORD's own must
    have both; other hash algorithms are not what cudal2 writes."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _BadWheel(f"{name} is not UTF-8") from None
    out: dict[str, tuple[bytes, int]] = {}
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        raise _BadWheel(f"{name} is not CSV: {exc}") from None
    for n, row in enumerate(rows, 1):
        if not row:
            continue
        if len(row) != 3:
            raise _BadWheel(f"{name} line {n}: expected path,hash,size, got {len(row)} fields")
        member, digest, size = row
        if member == name and not digest:
            continue
        algo, _, b64 = digest.partition("=")
        try:
            sha = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4))
            count = int(size)
        except ValueError:
            sha, count = b"", -1
        if algo != "sha256" or len(sha) != 32 or count < 0:
            raise _BadWheel(f"{name} line {n}: not a sha256 and size for {member!r}")
        if member in out:
            raise _BadWheel(f"{name} lists {member!r} twice")
        if PurePosixPath(member).is_absolute() or ".." in PurePosixPath(member).parts:
            raise _BadWheel(f"{name} line {n}: {member!r} is not a path inside the wheel")
        out[member] = (sha, count)
    return out
