"""The content-addressed store of compiled kernels, checked on every read.

Layout (docs/contracts.md, "Artifact cache")::

    <cache>/<key[:2]>/<key>/{kernel.cu, kernel.cubin, build.json}   entries
    <cache>/tmp/build-<host>.<pid>.<random>/                           compiles in flight
    <cache>/quarantine/<key>-<n>/{entry/, reason.txt}                  entries found broken

``build.json`` is the compile's ``BuildResult``, with the cubin's sha256 and size taken
from the bytes nvcc wrote. An entry is staged in a folder of its compile under
``tmp/`` and renamed into place, so a reader sees a whole entry or none. Every reader
checks the entry against its record: ``get`` (the build's cache lookup), ``cubin`` (the
bytes that get packaged: the ones hashed are the ones returned) and ``cubin_path``
(what measuring jobs open). An entry that fails a check (a cubin of other bytes or
size, missing, empty or not a regular file of the entry; a torn, foreign or unreadable
``build.json``; an empty folder; a failed compile holding a cubin, or asked for one) is
moved to ``quarantine/`` with the reason beside it, never served: ``get`` then reports a
miss and the caller compiles again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import stat
import threading
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

from cudal2.generator.scratch import owned_name, sweep
from cudal2.records import BuildResult, sha256_hex

log = logging.getLogger(__name__)

SCRATCH = "tmp"
QUARANTINE = "quarantine"
SCRATCH_PREFIX = "build-"
_MAX_RECORD_BYTES = 1 << 20  # a build.json is a few KB (the compiler's text is cut at 8 KB)
_MAX_CUBIN_BYTES = 256 << 20
_SHA_RE = re.compile(r"[0-9a-f]{64}")
_FIELDS = {f.name for f in fields(BuildResult)}


def default_cache_dir() -> Path:
    return Path(os.environ.get("CUDAL2_CACHE", Path.home() / ".cache" / "cudal2" / "artifacts"))


class CacheIntegrityError(RuntimeError):
    """A cache entry failed its check when its cubin was asked for (it is quarantined)."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"artifact {key}: {problem}")
        self.key = key
        self.problem = problem


class _Broken(Exception):
    """What is wrong with an entry (internal: becomes a quarantine)."""


class ArtifactCache:
    """The content-addressed store of compiled kernels (see the module docstring)."""

    def __init__(self, root: Path | None = None):
        # Absolute: nvcc runs in a folder of its own and is given paths in the cache.
        self.root = Path(os.path.abspath(root if root else default_cache_dir()))
        self.quarantined: list[Path] = []  # this object's quarantines, in order
        self._swept = False
        self._lock = threading.Lock()

    def entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    # -- reading (checked) -----------------------------------------------------------
    def get(self, key: str) -> BuildResult | None:
        """The entry's build record, or None if there is no entry or it was broken
        (then quarantined: compile again)."""
        try:
            result, _ = self._check(key, want_cubin=False)
        except _Broken as broken:
            self.quarantine(key, str(broken))
            return None
        return result

    def cubin(self, key: str) -> bytes:
        """The entry's cubin, hashed as read and equal to the sha256 and size its
        compile recorded. Raises ``CacheIntegrityError`` (after quarantining the
        entry) for a broken entry, a failed compile or no entry."""
        return self._checked_cubin(key)[1]

    def cubin_path(self, key: str) -> Path:
        """Where the entry's checked cubin lies (for a measuring job, which opens it
        itself). Raises as ``cubin`` does."""
        return self._checked_cubin(key)[0]

    def _checked_cubin(self, key: str) -> tuple[Path, bytes]:
        try:
            result, data = self._check(key, want_cubin=True)
        except _Broken as broken:
            self.quarantine(key, str(broken))
            raise CacheIntegrityError(key, str(broken)) from None
        if result is None or data is None:
            raise CacheIntegrityError(key, "not in the cache")
        return self.entry(key) / "kernel.cubin", data

    def _check(self, key: str, want_cubin: bool) -> tuple[BuildResult | None, bytes | None]:
        """The entry's record and, where it has one, its checked cubin; (None, None)
        for no entry. Raises ``_Broken`` naming what is wrong."""
        entry = self.entry(key)
        try:
            st = entry.lstat()
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            raise _Broken(f"entry cannot be read: {exc.strerror or exc}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise _Broken("the entry is not a folder (a symlink or a file)")
        raw = _read_regular(entry / "build.json", _MAX_RECORD_BYTES)
        result = _record(raw, key)
        cubin = entry / "kernel.cubin"
        if not result.ok:
            if os.path.lexists(cubin):
                raise _Broken("its compile failed (ok: false), yet kernel.cubin exists")
            if want_cubin:
                raise _Broken("a cubin was asked for, but its compile failed (ok: false)")
            return result, None
        data = _read_regular(cubin, _MAX_CUBIN_BYTES)
        sha = sha256_hex(data)
        if sha != result.cubin_sha256 or len(data) != result.cubin_size:
            raise _Broken(
                f"kernel.cubin has sha256 {sha} ({len(data)} bytes), its compile wrote "
                f"{result.cubin_sha256} ({result.cubin_size} bytes)"
            )
        return result, data

    # -- writing ---------------------------------------------------------------------
    def put(
        self, result: BuildResult, source: str, cubin: bytes | None, staging: Path | None = None
    ) -> None:
        """Store a compile's entry (first writer wins). ``staging``: a ``scratch()``
        folder of the caller's to assemble it in."""
        if result.ok != (cubin is not None):
            raise ValueError("an entry has a cubin exactly when its compile succeeded")
        if cubin is not None and (
            sha256_hex(cubin) != result.cubin_sha256 or len(cubin) != result.cubin_size
        ):
            raise ValueError("the cubin is not the one its BuildResult records")
        final = self.entry(result.artifact_key)
        if os.path.lexists(final):
            return
        with contextlib.ExitStack() as stack:
            if staging is None:
                staging = stack.enter_context(self.scratch())
            tmp = staging / "entry"
            tmp.mkdir()
            (tmp / "kernel.cu").write_text(source)
            if cubin is not None:
                (tmp / "kernel.cubin").write_bytes(cubin)
            (tmp / "build.json").write_text(json.dumps(result.as_json(), indent=2, sort_keys=True))
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(tmp, final)
            except OSError:
                if not os.path.lexists(final):  # lost a race with a writer of that key: fine
                    raise

    @contextlib.contextmanager
    def scratch(self) -> Iterator[Path]:
        """A fresh folder under ``<cache>/tmp/`` named after this process, removed on
        exit. The first one of this object sweeps what killed builds left there."""
        base = self.root / SCRATCH
        base.mkdir(parents=True, exist_ok=True)
        with self._lock:
            if not self._swept:
                self._swept = True
                for path in sweep(base, SCRATCH_PREFIX):
                    log.info("cudal2: removed %s, left by a build that was killed", path)
        path = base / owned_name(SCRATCH_PREFIX)
        path.mkdir(mode=0o700)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def quarantine(
        self, key: str, problem: str, *, entry: Path | None = None, kind: str = ""
    ) -> Path | None:
        """Move the entry of ``key`` to ``quarantine/<key>-<n>/entry`` with the problem
        in ``reason.txt`` beside it; None if it was gone already. ``entry`` and
        ``kind``: another kind of entry this cache keeps (the native launcher's,
        ``packaging/native_build.py``), quarantined as ``<kind>-<key>-<n>``."""
        base = self.root / QUARANTINE
        base.mkdir(parents=True, exist_ok=True)
        prefix = f"{kind}-{key}" if kind else key
        n = 1
        while True:
            slot = base / f"{prefix}-{n}"
            try:
                slot.mkdir()
                break
            except FileExistsError:
                n += 1
        try:
            os.rename(self.entry(key) if entry is None else entry, slot / "entry")
        except FileNotFoundError:  # another reader moved it first
            with contextlib.suppress(OSError):
                slot.rmdir()
            return None
        (slot / "reason.txt").write_text(problem + "\n")
        with self._lock:
            self.quarantined.append(slot)
        what = f"{kind} cache entry" if kind else "cache entry"
        log.warning("cudal2: %s %s quarantined to %s: %s", what, key, slot, problem)
        return slot


def _read_regular(path: Path, limit: int) -> bytes:
    """The bytes of ``path``, a regular file of the entry itself (never followed
    through a symlink), of at most ``limit`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise _Broken(f"{path.name} is missing") from None
    except OSError as exc:
        reason = "is a symlink" if path.is_symlink() else f"cannot be read: {exc.strerror}"
        raise _Broken(f"{path.name} {reason}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
        os.close(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Broken(f"{path.name} is not a regular file")
        raise _Broken(f"{path.name} is {st.st_size} bytes, more than {limit}")
    with os.fdopen(fd, "rb") as f:
        try:
            return f.read(limit + 1)
        except OSError as exc:
            raise _Broken(f"{path.name} cannot be read: {exc.strerror or exc}") from None


def _record(raw: bytes, key: str) -> BuildResult:
    """``build.json``'s record, checked field by field."""
    try:
        d = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # torn, garbage, not UTF-8, too deep
        raise _Broken(f"build.json is not JSON ({type(exc).__name__})") from None
    if not isinstance(d, dict):
        raise _Broken("build.json is not a JSON object")
    missing = sorted({"design_key", "artifact_key", "ok", "symbol"} - d.keys())
    if missing:
        raise _Broken(f"build.json lacks {', '.join(missing)}")
    if d["artifact_key"] != key:
        raise _Broken(f"build.json is the record of another artifact ({d['artifact_key']!r})")
    if not isinstance(d["ok"], bool):
        raise _Broken(f"build.json: 'ok' must be true or false, got {d['ok']!r}")
    if d["ok"]:
        sha, size = d.get("cubin_sha256"), d.get("cubin_size")
        if not isinstance(sha, str) or not _SHA_RE.fullmatch(sha):
            raise _Broken("build.json records no cubin sha256 (an older cudal2 wrote it?)")
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise _Broken(f"build.json: cubin_size must be a positive integer, got {size!r}")
    try:
        result = BuildResult.from_json({k: v for k, v in d.items() if k in _FIELDS})
    except (TypeError, ValueError) as exc:
        raise _Broken(f"build.json is not a build record: {exc}") from None
    if not all(isinstance(getattr(result, k), str) for k in ("design_key", "symbol")):
        raise _Broken("build.json: design_key and symbol must be strings")
    return result
