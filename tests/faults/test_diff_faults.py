"""Fault injection: ``cudal2-diff`` against hostile inputs (CPU only).

Each row of ``HOSTILE`` makes one input file from the clean build's wheel (the default
manifest's, from its committed H100 database) and says what ``cudal2-diff CLEAN INPUT``
must do: its exit status and a fragment of its one-line error, which names the file.
Never a traceback, never a read of more than the limits, never a hang. ``OUTCOMES``
are inputs that are fine but differ from the clean wheel in what ships.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import io
import json
import os
import struct
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from cudal2.cli.diff import main
from cudal2.packaging.table import MAX_DEPTH, MAX_TABLE_BYTES, read_table
from cudal2.packaging.wheel import write_wheel

from .conftest import CacheCleanBuild

Members = list[tuple[str, bytes]]
Make = Callable[[Path, CacheCleanBuild], Path]  # (a fresh folder, the clean build) -> the input


def _is(suffix: str, name: str) -> bool:
    return name.endswith(suffix)


def _record_bytes(members: Members) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    record = next(n for n, _ in members if n.endswith(".dist-info/RECORD"))
    for name, data in members:
        if name == record:
            continue
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow((name, f"sha256={digest}", len(data)))
    writer.writerow((record, "", ""))
    return buf.getvalue().encode()


def _wheel(edit: Callable[[Members], Members], rerecord: bool = False) -> Make:
    """The clean wheel with its members edited; RECORD rewritten to match, or kept."""

    def make(tmp: Path, clean: CacheCleanBuild) -> Path:
        with zipfile.ZipFile(clean.wheel) as z:
            members = edit([(i.filename, z.read(i)) for i in z.infolist()])
        if rerecord:
            fresh = _record_bytes(members)
            members = [(n, fresh if n.endswith("/RECORD") else d) for n, d in members]
        path = tmp / clean.wheel.name
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data in members:
                z.writestr(name, data)
        return path

    return make


def _replace(suffix: str, change: Callable[[bytes], bytes]) -> Callable[[Members], Members]:
    return lambda ms: [(n, change(d) if _is(suffix, n) else d) for n, d in ms]


def _drop(suffix: str) -> Callable[[Members], Members]:
    return lambda ms: [(n, d) for n, d in ms if not _is(suffix, n)]


def _twice(suffix: str, rename: Callable[[str], str] = lambda n: n) -> Callable[[Members], Members]:
    return lambda ms: ms + [(rename(n), d) for n, d in ms if _is(suffix, n)]


def _patched(member_suffix: str, **fields: int) -> Make:
    """The clean wheel with a member's zip headers (local and central) patched:
    ``flags``, ``method``, ``crc`` (xor), ``size`` (uncompressed)."""

    def make(tmp: Path, clean: CacheCleanBuild) -> Path:
        data = bytearray(clean.wheel.read_bytes())
        with zipfile.ZipFile(clean.wheel) as z:
            info = next(i for i in z.infolist() if i.filename.endswith(member_suffix))
            pos = z.start_dir
            while data[pos : pos + 4] == b"PK\x01\x02":
                name_len, extra_len, comment_len = struct.unpack_from("<HHH", data, pos + 28)
                if data[pos + 46 : pos + 46 + name_len].decode() == info.filename:
                    _patch(data, pos + 8, info.header_offset + 6, fields)
                pos += 46 + name_len + extra_len + comment_len
        path = tmp / clean.wheel.name
        path.write_bytes(bytes(data))
        return path

    return make


def _patch(data: bytearray, central: int, local: int, fields: dict[str, int]) -> None:
    # offsets from the flags field: flags +0, method +2, crc +8, uncompressed size +16
    for at in (central, local):
        if "flags" in fields:
            struct.pack_into("<H", data, at, fields["flags"])
        if "method" in fields:
            struct.pack_into("<H", data, at + 2, fields["method"])
        if "crc" in fields:
            (crc,) = struct.unpack_from("<I", data, at + 8)
            struct.pack_into("<I", data, at + 8, crc ^ fields["crc"])
        if "size" in fields:
            struct.pack_into("<I", data, at + 16, fields["size"])


def _file(name: str, content: bytes | str) -> Make:
    def make(tmp: Path, clean: CacheCleanBuild) -> Path:
        path = tmp / name
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        return path

    return make


def _sparse(name: str, size: int) -> Make:
    def make(tmp: Path, clean: CacheCleanBuild) -> Path:
        path = tmp / name
        with path.open("wb") as f:
            f.truncate(size)
        return path

    return make


def _table_json(change: Callable[[dict], object]) -> Make:
    def make(tmp: Path, clean: CacheCleanBuild) -> Path:
        path = tmp / "dispatch.json"
        path.write_text(json.dumps(change(read_table(clean.wheel).as_json())))
        return path

    return make


def _nested(depth: int) -> str:
    return '{"format": ' + "[" * depth + "]" * depth + "}"


def _symlink(target: Callable[[Path], str], name: str = "link.whl") -> Make:
    def make(tmp: Path, clean: CacheCleanBuild) -> Path:
        (tmp / name).symlink_to(target(tmp))
        return tmp / name

    return make


def _bytes(clean: CacheCleanBuild) -> bytes:
    return clean.wheel.read_bytes()


def _fifo(tmp: Path, clean: CacheCleanBuild) -> Path:
    os.mkfifo(tmp / "pipe.json")
    return tmp / "pipe.json"


def _unreadable(tmp: Path, clean: CacheCleanBuild) -> Path:
    if os.geteuid() == 0:
        pytest.skip("root reads a file of mode 000")
    path = _file("locked.json", "{}")(tmp, clean)
    path.chmod(0)
    return path


def _dir(tmp: Path, clean: CacheCleanBuild) -> Path:
    (tmp / "folder.whl").mkdir()
    return tmp / "folder.whl"


def _deflated_bomb(tmp: Path, clean: CacheCleanBuild) -> Path:
    """A dispatch.json of MAX_TABLE_BYTES + 1 bytes that deflates to ~65 KB."""
    big = b" " * (MAX_TABLE_BYTES + 1)
    return _wheel(_replace("/dispatch.json", lambda d: big), rerecord=True)(tmp, clean)


CUBIN = ".cubin"
TABLE = "/dispatch.json"
LIMIT = f"more than the {MAX_TABLE_BYTES}-byte limit"
TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep"

# (case, the input, exit status, a fragment of the error line)
HOSTILE: list[tuple[str, Make, int, str]] = [
    ("missing file", lambda tmp, c: tmp / "missing.whl", 2, "cannot read: no such file"),
    ("a directory", _dir, 2, "not a regular file (a directory)"),
    ("a FIFO", _fifo, 2, "not a regular file (a FIFO)"),
    ("/dev/zero", lambda tmp, c: Path("/dev/zero"), 2, "not a regular file (a character device)"),
    (
        "a wheel name linked to /dev/zero",
        _symlink(lambda tmp: "/dev/zero"),
        2,
        "not a regular file (a character device)",
    ),
    ("a path through a file", lambda tmp, c: tmp / "f" / "x", 2, "cannot read"),
    ("a symlink loop", _symlink(lambda tmp: str(tmp / "link.whl")), 2, "Too many levels"),
    ("unreadable (mode 000)", _unreadable, 2, "Permission denied"),
    (
        "a file whose read fails (/proc/self/mem)",
        lambda tmp, c: Path("/proc/self/mem"),
        2,
        "cannot read: Input/output error",
    ),
    ("empty .json", _file("empty.json", b""), 2, "not valid JSON"),
    ("not UTF-8", _file("latin.json", b'{"format": "\xe9\xff"}'), 2, "not valid JSON"),
    ("a 5000-digit number", _file("big.json", '{"format": ' + "9" * 5000 + "}"), 2, "JSON"),
    ("JSON nested 100000 deep", _file("deep.json", _nested(100_000)), 2, TOO_DEEP),
    ("JSON nested just past the limit", _file("deep.json", _nested(MAX_DEPTH)), 2, TOO_DEEP),
    ("a .json over the size limit", _sparse("huge.json", MAX_TABLE_BYTES + 1), 2, LIMIT),
    ("a JSON list", _table_json(lambda t: [t]), 2, "JSON object"),
    ("a wheel named .json", lambda tmp, c: _file("w.json", _bytes(c))(tmp, c), 2, "not valid JSON"),
    ("a .whl that is JSON", _file("t.whl", "{}"), 2, "not a readable wheel"),
    ("an empty .whl", _file("e.whl", b""), 2, "not a readable wheel"),
    (
        "a truncated .whl",
        lambda tmp, c: _file(c.wheel.name, c.wheel.read_bytes()[:5000])(tmp, c),
        2,
        "not a readable wheel",
    ),
    ("a wheel without its table", _wheel(_drop(TABLE), rerecord=True), 2, "found none"),
    (
        "a wheel with two tables",
        _wheel(_twice(TABLE, lambda n: "other/dispatch.json"), rerecord=True),
        2,
        "expected exactly one <package>/dispatch.json in the wheel, found",
    ),
    (
        "a table whose zip header says 1.5 GB",
        _patched(TABLE, size=1_500_000_000),
        2,
        f"dispatch.json is 1500000000 bytes, {LIMIT}: not read",
    ),
    ("a table that inflates past the limit", _deflated_bomb, 2, f"{LIMIT}: not read"),
    (
        "a table nested too deeply in a wheel",
        _wheel(_replace(TABLE, lambda d: _nested(100_000).encode()), rerecord=True),
        2,
        TOO_DEEP,
    ),
    (
        "a table edited, RECORD not",
        _wheel(_replace(TABLE, lambda d: d.replace(b'"format": 1', b'"format": 1 '))),
        2,
        "dispatch.json does not match",
    ),
    (
        "a cubin replaced, RECORD not",
        _wheel(_replace(CUBIN, lambda d: d[:-1] + bytes([d[-1] ^ 1]))),
        2,
        ".cubin does not match",
    ),
    (
        "a cubin replaced, RECORD rewritten to match",
        _wheel(_replace(CUBIN, lambda d: d + b"\0"), rerecord=True),
        2,
        "holds a cubin of sha256",
    ),
    ("a cubin removed", _wheel(_drop(CUBIN), rerecord=True), 2, "which the wheel lacks"),
    (
        "no RECORD",
        _wheel(_drop("/RECORD")),
        2,
        "expected one .dist-info/RECORD, found 0",
    ),
    (
        "a RECORD line of two fields",
        _wheel(_replace("/RECORD", lambda d: b"a,b\n" + d)),
        2,
        "expected path,hash,size",
    ),
    (
        "a RECORD of md5 hashes",
        _wheel(_replace("/RECORD", lambda d: d.replace(b"sha256=", b"md5="))),
        2,
        "not a sha256 and size",
    ),
    ("a RECORD not UTF-8", _wheel(_replace("/RECORD", lambda d: d + b"\xff\n")), 2, "not UTF-8"),
    (
        "a member not in RECORD",
        _wheel(lambda ms: ms + [("extra/evil.py", b"import os\n")]),
        2,
        "extra/evil.py is not listed in",
    ),
    ("a member twice", _wheel(_twice(CUBIN)), 2, "appears twice"),
    ("a bad CRC", _patched(TABLE, crc=1), 2, "Bad CRC-32"),
    ("an unknown compression", _patched(TABLE, method=99), 2, "compression method"),
    ("an encrypted member", _patched(TABLE, flags=1), 2, "encrypted"),
]


def test_the_cases_are_the_issues_floor():
    assert len(HOSTILE) >= 22


@pytest.mark.filterwarnings("ignore:Duplicate name")  # zipfile, writing "a member twice"
@pytest.mark.parametrize(
    ("make", "status", "fragment"), [pytest.param(*row[1:], id=row[0]) for row in HOSTILE]
)
def test_a_hostile_input_is_refused_in_one_line(
    cache_clean: CacheCleanBuild, tmp_path, capsys, make: Make, status: int, fragment: str
):
    (tmp_path / "f").write_text("a file, not a folder")
    path = make(tmp_path, cache_clean)
    assert main([str(cache_clean.wheel), str(path)]) == status
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"cudal2-diff: error: {path}") and err.count("\n") == 1, err
    assert fragment in err, err
    # either side: the same refusal
    assert main([str(path), str(cache_clean.wheel)]) == status
    assert fragment in capsys.readouterr().err


def _wheel_with_changed_cubin(tmp: Path, clean: CacheCleanBuild) -> Path:
    """The clean table and cubins but one cubin of other bytes under the same kernel:
    what two caches that compiled in random folders gave before (issue 17, item 3)."""
    table = read_table(clean.wheel)
    with zipfile.ZipFile(clean.wheel) as z:
        cubins = {Path(n).stem: z.read(n) for n in z.namelist() if n.endswith(CUBIN)}
    old = next(e.cubin_sha256 for e in table.entries if e.kind == "kernel")
    changed = cubins[old] + b"\0"
    sha = hashlib.sha256(changed).hexdigest()
    entries = tuple(
        dataclasses.replace(e, cubin_sha256=sha) if e.cubin_sha256 == old else e
        for e in table.entries
    )
    table = dataclasses.replace(table, entries=entries)
    return write_wheel(table, {**cubins, sha: changed}, tmp / "changed")


# (case, extra arguments, exit status, fragment of stdout)
OUTCOMES = [
    ("cubin changed under one kernel", [], 0, "cubin changed"),
    ("cubin changed is no regression", ["--fail-on-regression", "0"], 0, "gate: passed at 0%"),
    ("cubin changed, as JSON", ["--json"], 0, '"cubin_changed"'),
]


@pytest.mark.parametrize(
    ("args", "status", "fragment"), [pytest.param(*row[1:], id=row[0]) for row in OUTCOMES]
)
def test_a_changed_cubin_is_a_change(
    cache_clean: CacheCleanBuild, tmp_path, capsys, args, status, fragment
):
    changed = _wheel_with_changed_cubin(tmp_path, cache_clean)
    assert main([str(cache_clean.wheel), str(changed), *args]) == status
    out = capsys.readouterr().out
    assert fragment in out and "no changes" not in out


def test_inflating_is_never_needed_to_refuse(cache_clean: CacheCleanBuild, tmp_path, monkeypatch):
    """The 1.5 GB table is refused from the zip's header: no byte of it is inflated."""
    path = _patched(TABLE, size=1_500_000_000)(tmp_path, cache_clean)
    monkeypatch.setattr(zlib, "decompressobj", None)  # any inflate would fail loudly
    assert main([str(path), str(cache_clean.wheel)]) == 2
