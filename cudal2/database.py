"""The measurement database: append-only JSON Lines, one record per line (a gzipped
file, ``.gz``, is read like a plain one; it cannot be appended to).

A line is a ``Measurement`` or a ``SanitizerCheck`` (a line with ``"record":
"sanitizer_check"``). Merging databases from several GPU hosts is concatenating their
files. Each append writes whole lines in one ``write`` under an exclusive lock, then
fsyncs, so a killed build leaves at most one torn last line.

Reading believes nothing it cannot check. Every line is parsed by the strict schema
(``cudal2.schema``), and a measurement's timings must agree with themselves: its
median is the median of its samples, each baseline's the median of its samples, and
no median is below the physical floor of its target on its GPU model
(``cudal2.hardware.floor_us``; a model without a datasheet cannot be checked, and the
build does not select from it). A line that fails is skipped with a warning naming
the file, the line and why, and counted (``Contents.skipped``): a torn line, invalid
UTF-8, NUL bytes, a line longer than ``MAX_LINE_BYTES`` (read in bounded chunks, never
whole) or a record that lies. The path itself must be a regular file (or absent: a
new database); anything else raises ``DatabaseError`` before a byte is read.
Records written by earlier versions are read in today's spelling (``migrate.upgrade``).
"""

from __future__ import annotations

import fcntl
import gzip
import json
import math
import os
import stat
import statistics
import warnings
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from cudal2.hardware import datasheet, floor_us, norm_floor_us
from cudal2.records import NORM_BASELINE, Measurement, SanitizerCheck, Status
from cudal2.schema import RecordError, parse_line

MAX_LINE_BYTES = 1 << 20  # the largest recorded line is ~3 KB; a record never needs 1 MiB
MEDIAN_REL_TOL = 1e-6  # "the median of its samples", up to rounding to 6 significant digits
MAX_WARNINGS = 20  # per read: one per bad line, then one saying how many more
_CHUNK = 1 << 16


class DatabaseError(ValueError):
    """The path cannot be a measurement database (a directory, FIFO, device, socket, an
    unreadable file, a ``.gz`` that is not gzip): the message names it and why."""


@dataclass(frozen=True)
class Skipped:
    """A line the reader did not believe: its number (from 1) and why; ``file``: the
    reused database it is in (None: the database's own file)."""

    line: int
    reason: str
    file: Path | None = None


@dataclass(frozen=True)
class Contents:
    """What a database holds that can be believed: its measurements, and its sanitizer
    checks in file order (failures recorded as measurements of status ``sanitizer``
    before checks had lines of their own among them, ``SanitizerCheck.of_failure``);
    and the lines skipped."""

    path: Path
    measurements: tuple[Measurement, ...]
    checks: tuple[SanitizerCheck, ...]
    skipped: tuple[Skipped, ...]


class MeasurementDB:
    """The database at ``path``, read together with ``reuse``: other databases (a
    manifest's ``[build] reuse``, e.g. the sweeps measured for it), never written. Their
    measurements are read in the order they were measured (``measured_at``; at equal
    times, the reused files' first and this one's last), so the record of a key that
    stands (``latest``) is its newest, wherever it is: a re-measurement here, or a sweep
    newer than this database's record. Each file counts once, however spelled (a reused
    path that is ``path`` itself too)."""

    def __init__(self, path: str | Path, reuse: Iterable[str | Path] = ()):
        self.path = Path(path)
        seen = {_identity(self.path)}
        reused = []
        for p in map(Path, reuse):
            if (key := _identity(p)) not in seen:  # each file once, however it is spelled
                seen.add(key)
                reused.append(p)
        self.reuse = tuple(reused)

    def load(self, warn: bool = True) -> Contents:
        """Every believable record, the reused databases' first, each file in its order
        (with ``reuse``, the measurements then in the order they were measured);
        each skipped line warned about (``warn``) and counted. A missing file is an empty
        database; a missing reused one raises ``DatabaseError``."""
        measurements: list[Measurement] = []
        checks: list[SanitizerCheck] = []
        skipped: list[Skipped] = []
        for reused in self.reuse:
            if not reused.exists():
                raise DatabaseError(f"{reused}: no such reused measurement database")
        sources = [(p, p) for p in self.reuse] + [(self.path, None)]
        for path, file in sources:
            for record in _records(path):
                if isinstance(record, Skipped):
                    skipped.append(Skipped(record.line, record.reason, file))
                    continue
                if isinstance(record, SanitizerCheck):
                    checks.append(record)
                else:
                    measurements.append(record)
                    if record.status == Status.SANITIZER:
                        checks.append(SanitizerCheck.of_failure(record))
        if warn:
            for s in skipped[:MAX_WARNINGS]:
                warnings.warn(
                    f"{s.file or self.path}:{s.line}: skipping unreadable record ({s.reason})",
                    stacklevel=2,
                )
            if len(skipped) > MAX_WARNINGS:
                warnings.warn(
                    f"{self.path}: {len(skipped) - MAX_WARNINGS} more unreadable records skipped",
                    stacklevel=2,
                )
        if self.reuse:  # which record of a key stands (``latest``): the one measured last
            measurements.sort(key=lambda m: m.measured_at)  # stable: file order at ties
        return Contents(self.path, tuple(measurements), tuple(checks), tuple(skipped))

    def read(self) -> list[Measurement]:
        return list(self.load().measurements)

    def append(self, measurements: Iterable[Measurement]) -> None:
        self._append(m.as_json() for m in measurements)

    def append_checks(self, checks: Iterable[SanitizerCheck]) -> None:
        """Sanitizer check lines, all in one write (fsynced before this returns)."""
        self._append(c.as_json() for c in checks)

    def _append(self, objs: Iterable[dict]) -> None:
        if self.path.suffix == ".gz":
            raise DatabaseError(
                f"{self.path}: a gzipped database is read-only; measure into a plain "
                ".jsonl file (gunzip a copy to extend this one)"
            )
        append_lines(
            self.path, (json.dumps(o, sort_keys=True, separators=(",", ":")) for o in objs)
        )

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Held while a build checks kernels with compute-sanitizer, so that no two
        checks of one database overlap (``<database>.lock`` beside it, flock'ed; the
        lock goes with the process that held it)."""
        path = self.path.with_name(self.path.name + ".lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def timing_problem(m: Measurement) -> str | None:
    """Why a measurement's timings contradict themselves or physics, or None."""
    if m.median_us is not None:
        med = statistics.median(m.samples_us)
        if not math.isclose(m.median_us, med, rel_tol=MEDIAN_REL_TOL):
            return (
                f"median_us {m.median_us:.6g} is not the median of its "
                f"{len(m.samples_us)} samples ({med:.6g})"
            )
    for name, value in m.baselines_us.items():
        samples = m.baseline_samples_us.get(name)
        if samples and not math.isclose(value, statistics.median(samples), rel_tol=MEDIAN_REL_TOL):
            return (
                f"baselines_us.{name} {value:.6g} is not the median of its "
                f"{len(samples)} samples ({statistics.median(samples):.6g})"
            )
    try:
        datasheet(m.gpu.name)
    except ValueError:
        return None  # no datasheet: the floor cannot be checked (the build selects nothing of it)
    floor = floor_us(m.target, m.gpu.name)
    # torch's RMSNorm alone (timed beside a row-scaled target's GEMM) has a floor of its own
    norm = norm_floor_us(m.target, m.gpu.name)
    timed = [
        ("median_us", m.median_us, floor),
        *(
            (f"baselines_us.{k}", v, norm if k == NORM_BASELINE else floor)
            for k, v in m.baselines_us.items()
        ),
    ]
    for name, value, its_floor in timed:
        if value is not None and value < its_floor:
            return (
                f"{name} {value:.4g} us is below the physical floor of {m.target.label} on "
                f"{m.gpu.name} ({its_floor:.4g} us): a measurement error"
            )
    return None


def latest(measurements: Iterable[Measurement]) -> list[Measurement]:
    """The last record of each reuse key (GPU model, target, artifact, toolchain, mode):
    a re-measurement or a record enriched with profile metrics stands for the key from
    then on. Order is that of each key's first record. A failure recorded as a
    measurement of status ``sanitizer`` (before checks had lines of their own) is a
    check, not a timing (``Contents.checks``, ``cudal2.verdicts``): it does not stand
    for its key."""
    last: dict[tuple, Measurement] = {}
    for m in measurements:
        if m.status != Status.SANITIZER:
            last[m.reuse_key] = m
    return list(last.values())


def append_lines(path: Path, lines: Iterable[str]) -> None:
    """Append whole JSON lines to ``path`` in one write under an exclusive lock, then
    fsync. A previous writer killed mid-line left no newline: start on a fresh line."""
    data = "".join(line + "\n" for line in lines)
    if not data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _open_regular(path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = "\n" + data
        os.write(fd, data.encode("utf-8"))
        os.fsync(fd)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _identity(path: Path) -> tuple[int, int] | Path:
    """What makes two spellings of a path one file: its device and inode where it
    exists, else the path made absolute."""
    try:
        st = path.stat()
    except OSError:
        return path.absolute()
    return (st.st_dev, st.st_ino)


def _not_regular(path: Path, mode: int) -> DatabaseError:
    kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
    return DatabaseError(
        f"{path} is {kind}, not a measurement database (a regular .jsonl or .jsonl.gz file)"
    )


def _open_regular(path: Path, flags: int) -> int:
    """An fd of ``path`` that is known to be a regular file. ``stat`` first, so a FIFO
    is never opened (that would block) and a device never read; opened non-blocking
    and checked again with ``fstat``, so a path swapped in between cannot slip past."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
    except OSError as e:  # a parent that is a file, a loop of links, ...
        raise DatabaseError(f"{path}: {e.strerror}") from None
    else:
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st.st_mode)
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY, 0o644)
    except OSError as e:
        raise DatabaseError(f"{path}: cannot open: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _not_regular(path, st.st_mode)
    return fd


@contextmanager
def _open(path: Path) -> Iterator[BinaryIO | None]:
    """The file to read (a gzip stream for ``.gz``), or None where there is none."""
    try:
        fd = _open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        yield None
        return
    with os.fdopen(fd, "rb") as f:
        if path.suffix != ".gz":
            yield f
            return
        with gzip.GzipFile(fileobj=f) as z:  # closes the stream, not ``f``: ``with f`` does
            try:
                z.peek(1)
            except (OSError, EOFError, zlib.error) as e:
                raise DatabaseError(f"{path}: not a gzip file ({e})") from None
            yield z  # type: ignore[misc]


def _records(path: Path) -> Iterator[Measurement | SanitizerCheck | Skipped]:
    with _open(path) as f:
        if f is None:
            return
        lineno = 0
        while True:
            try:
                raw = f.readline(MAX_LINE_BYTES + 1)
            except (OSError, EOFError, zlib.error) as e:  # a corrupt or truncated .gz
                yield Skipped(lineno + 1, f"the rest of the file is unreadable: {e}")
                return
            if not raw:
                return
            lineno += 1
            if len(raw) > MAX_LINE_BYTES:
                _discard_line(f, raw)
                yield Skipped(lineno, f"line longer than {MAX_LINE_BYTES} bytes")
                continue
            if not raw.strip():
                continue
            yield _record(lineno, raw)


def _discard_line(f: BinaryIO, head: bytes) -> None:
    """Read past the rest of an overlong line in bounded chunks."""
    chunk = head
    while chunk and not chunk.endswith(b"\n"):
        chunk = f.readline(_CHUNK)


def _record(lineno: int, raw: bytes) -> Measurement | SanitizerCheck | Skipped:
    try:
        text = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as e:
        return Skipped(lineno, f"not UTF-8: byte 0x{raw[e.start]:02x} at column {e.start + 1}")
    if "\x00" in text:
        return Skipped(lineno, "NUL bytes: not a record")
    try:
        record = parse_line(text)
    except RecordError as e:
        return Skipped(lineno, str(e))
    if isinstance(record, Measurement):
        problem = timing_problem(record)
        if problem:
            return Skipped(lineno, problem)
    return record


def default_database(manifest: Path) -> Path:
    """The database beside a manifest: ``<stem>.measurements.jsonl``, else a shipped
    ``<stem>.measurements.jsonl.gz`` (read-only), else the ``.jsonl`` to create."""
    plain = manifest.with_name(f"{manifest.stem}.measurements.jsonl")
    packed = plain.with_name(plain.name + ".gz")
    return packed if not plain.exists() and packed.exists() else plain
