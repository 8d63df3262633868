"""Fault injection: a tampered artifact cache and a killed build (CPU only).

Cache tamperings (``TAMPERINGS``, one row each): an entry of one of the two kernels
the default manifest ships is damaged, then ``cudal2-build`` runs on that cache. Each
must end the same way: exit 0; the damaged entry moved to
``quarantine/<key>-1/`` with the reason naming what was wrong (the evidence kept, the
other entry untouched); the entry compiled again to the clean compile's very bytes; and
the wheel byte-identical to the clean build's, so nothing damaged was packaged.

Kills (``KILLS``): a real ``cudal2-build`` subprocess is stopped by a signal at one
point of its work. Right after: no wheel-looking file anywhere under the output
folder, and no nvcc process (nor its children) alive. The next build then succeeds
with the clean wheel and leaves no temporary file in the cache, the output folder or
the compile's source folder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cudal2.cli import build as build_cli
from cudal2.generator import nvcc
from cudal2.generator.cache import ArtifactCache, CacheIntegrityError

from .conftest import CacheCleanBuild, cache_build_args, cache_file_sha256

Tamper = Callable[[Path, Path], None]  # (the entry to damage, the other kernel's entry)


def _cubin(entry: Path) -> Path:
    return entry / "kernel.cubin"


def _record(entry: Path) -> Path:
    return entry / "build.json"


def _edit_record(**changes) -> Tamper:
    def tamper(entry: Path, other: Path) -> None:
        record = json.loads(_record(entry).read_text())
        for key, value in changes.items():
            if value is _DROP:
                record.pop(key)
            else:
                record[key] = value(record) if callable(value) else value
        _record(entry).write_text(json.dumps(record))

    return tamper


_DROP = object()


def _flip_byte(entry: Path, other: Path) -> None:
    data = bytearray(_cubin(entry).read_bytes())
    data[len(data) // 2] ^= 0xFF
    _cubin(entry).write_bytes(bytes(data))


def _truncate(entry: Path, other: Path) -> None:
    data = _cubin(entry).read_bytes()
    _cubin(entry).write_bytes(data[: len(data) // 2])


def _replace_cubin(make: Callable[[Path, Path], None]) -> Tamper:
    def tamper(entry: Path, other: Path) -> None:
        _cubin(entry).unlink()
        make(entry, other)

    return tamper


def _symlink_inside(entry: Path, other: Path) -> None:
    # The right bytes, through a symlink: a cubin is a regular file of its entry.
    _cubin(entry).rename(entry / "real.cubin")
    _cubin(entry).symlink_to("real.cubin")


def _ok_false(entry: Path, other: Path) -> None:
    # A failed compile's entry, as nvcc would leave it: asked for its cubin, it is
    # quarantined and compiled again.
    _cubin(entry).unlink()
    _edit_record(ok=False, error="kernel.cu(1): error: injected", cubin_sha256="")(entry, other)


def _empty_folder(entry: Path, other: Path) -> None:
    shutil.rmtree(entry)
    entry.mkdir()


def _entry_is(make: Callable[[Path, Path], None]) -> Tamper:
    def tamper(entry: Path, other: Path) -> None:
        shutil.rmtree(entry)
        make(entry, other)

    return tamper


# (case, tamper, fragment of the quarantine's reason)
TAMPERINGS: list[tuple[str, Tamper, str]] = [
    ("cubin truncated", _truncate, "kernel.cubin has sha256"),
    ("cubin emptied", lambda e, o: _cubin(e).write_bytes(b""), "(0 bytes), its compile wrote"),
    ("cubin byte flipped", _flip_byte, "kernel.cubin has sha256"),
    ("cubin byte appended", lambda e, o: _cubin(e).open("ab").write(b"\0"), "has sha256"),
    ("other kernel's cubin", lambda e, o: shutil.copy(_cubin(o), _cubin(e)), "has sha256"),
    (
        "cubin symlink to a system file",
        _replace_cubin(lambda e, o: _cubin(e).symlink_to("/etc/passwd")),
        "kernel.cubin is a symlink",
    ),
    ("cubin symlink inside the entry", _symlink_inside, "kernel.cubin is a symlink"),
    (
        "cubin symlink to the other entry",
        _replace_cubin(lambda e, o: _cubin(e).symlink_to(_cubin(o))),
        "kernel.cubin is a symlink",
    ),
    ("cubin missing", _replace_cubin(lambda e, o: None), "kernel.cubin is missing"),
    (
        "cubin is a folder",
        _replace_cubin(lambda e, o: _cubin(e).mkdir()),
        "kernel.cubin is not a regular file",
    ),
    (
        "cubin is a FIFO",
        _replace_cubin(lambda e, o: os.mkfifo(_cubin(e))),
        "kernel.cubin is not a regular file",
    ),
    ("empty entry folder", _empty_folder, "build.json is missing"),
    ("build.json missing", lambda e, o: _record(e).unlink(), "build.json is missing"),
    (
        "build.json torn",
        lambda e, o: _record(e).write_bytes(_record(e).read_bytes()[:100]),
        "build.json is not JSON",
    ),
    ("build.json empty", lambda e, o: _record(e).write_bytes(b""), "build.json is not JSON"),
    (
        "build.json garbage, not UTF-8",
        lambda e, o: _record(e).write_bytes(b"\xff\xfe\x00garbage\x80"),
        "build.json is not JSON",
    ),
    (
        "build.json nested 100000 deep",
        lambda e, o: _record(e).write_text("[" * 100_000),
        "build.json is not JSON (RecursionError)",
    ),
    ("build.json not an object", lambda e, o: _record(e).write_text("[]"), "not a JSON object"),
    (
        "build.json symlink to a system file",
        lambda e, o: (_record(e).unlink(), _record(e).symlink_to("/etc/passwd")),
        "build.json is a symlink",
    ),
    (
        "ok: false with a cubin",
        _edit_record(ok=False),
        "its compile failed (ok: false), yet kernel.cubin exists",
    ),
    ("ok: false, cubin asked for", _ok_false, "a cubin was asked for, but its compile failed"),
    ("ok not a boolean", _edit_record(ok="true"), "'ok' must be true or false"),
    (
        "sha256 missing (an older cudal2's entry)",
        _edit_record(cubin_sha256=_DROP, cubin_size=_DROP),
        "records no cubin sha256",
    ),
    ("sha256 of other bytes", _edit_record(cubin_sha256="0" * 64), "its compile wrote " + "0" * 64),
    ("size altered", _edit_record(cubin_size=lambda r: r["cubin_size"] + 1), "has sha256"),
    (
        "other kernel's build.json",
        lambda e, o: shutil.copy(_record(o), _record(e)),
        "the record of another artifact",
    ),
    (
        "entry is a symlink to the other entry",
        _entry_is(lambda e, o: e.symlink_to(o)),
        "the entry is not a folder",
    ),
    (
        "entry is a file",
        _entry_is(lambda e, o: e.write_text("x")),
        "the entry is not a folder",
    ),
]


def _copy_cache(clean: CacheCleanBuild, dest: Path) -> ArtifactCache:
    shutil.copytree(clean.cache, dest, symlinks=True)
    return ArtifactCache(dest)


@pytest.mark.parametrize(("tamper", "reason"), [pytest.param(t, r, id=c) for c, t, r in TAMPERINGS])
def test_a_tampered_entry_is_quarantined_recompiled_and_never_shipped(
    cache_clean: CacheCleanBuild, tmp_path, tamper: Tamper, reason: str, capsys
):
    cache = _copy_cache(cache_clean, tmp_path / "cache")
    key, other = cache_clean.keys
    entry, other_entry = cache.entry(key), cache.entry(other)
    tamper(entry, other_entry)
    out = tmp_path / "out"

    assert build_cli.main(cache_build_args(cache.root, out)) == 0
    assert "1 broken artifact cache entries quarantined" in capsys.readouterr().out

    slot = cache.root / "quarantine" / f"{key}-1"
    assert sorted(p.name for p in slot.parent.iterdir()) == [slot.name]
    assert reason in (slot / "reason.txt").read_text()
    assert os.path.lexists(slot / "entry")  # the evidence, as it was found
    assert cache.cubin(key) == cache_clean.cubins[key]  # compiled again: the same bytes
    assert cache.cubin(other) == cache_clean.cubins[other]
    (wheel,) = out.iterdir()
    assert cache_file_sha256(wheel) == cache_clean.wheel_sha256
    assert list((cache.root / "tmp").iterdir()) == []


def test_two_fresh_caches_give_byte_identical_wheels(
    cache_clean: CacheCleanBuild, tmp_path, capsys
):
    """Issue 17, item 3: the cubins no longer carry the folder they were compiled in."""
    assert build_cli.main(cache_build_args(tmp_path / "cache", tmp_path / "out")) == 0
    capsys.readouterr()
    assert cache_file_sha256(tmp_path / "out" / cache_clean.wheel.name) == cache_clean.wheel_sha256


def test_the_tamperings_are_the_issues_floor():
    assert len(TAMPERINGS) >= 13


@pytest.mark.parametrize(
    "reader", [ArtifactCache.cubin, ArtifactCache.cubin_path], ids=["cubin", "cubin_path"]
)
def test_a_direct_reader_refuses_a_damaged_cubin(cache_clean: CacheCleanBuild, tmp_path, reader):
    """What packaging and measuring jobs read: the bytes or path of a checked cubin; a
    damaged one raises (naming what is wrong) and is quarantined, never returned."""
    cache = _copy_cache(cache_clean, tmp_path / "cache")
    key = cache_clean.keys[0]
    _flip_byte(cache.entry(key), cache.entry(cache_clean.keys[1]))
    with pytest.raises(CacheIntegrityError, match="kernel.cubin has sha256"):
        reader(cache, key)
    assert not os.path.lexists(cache.entry(key))
    assert cache.quarantined == [cache.root / "quarantine" / f"{key}-1"]
    assert cache.get(key) is None  # a miss now: the next build compiles it


# -- kills -----------------------------------------------------------------------------

KILL_TARGET = Path(__file__).with_name("cache_kill_target.py")


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper is dead)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[0] != "Z"


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text().strip()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"the build never reached {path.name}"
        time.sleep(0.05)


# (case, signal, where it stops: "compile" = in a fake nvcc, else a cache_kill_target point,
# whether the cache is warm (the clean build's) so the build goes straight to packaging,
# the build's exit status)
KILLS = [
    ("SIGKILL during compile", signal.SIGKILL, "compile", False, -signal.SIGKILL),
    (
        "SIGKILL with an entry staged, before its rename",
        signal.SIGKILL,
        "entry-rename",
        False,
        -signal.SIGKILL,
    ),
    ("SIGKILL with the wheel half written", signal.SIGKILL, "wheel-half", True, -signal.SIGKILL),
    (
        "SIGKILL with the wheel written, before its rename",
        signal.SIGKILL,
        "wheel-rename",
        True,
        -signal.SIGKILL,
    ),
    ("SIGTERM during compile", signal.SIGTERM, "compile", False, -signal.SIGTERM),
    ("SIGINT during compile", signal.SIGINT, "compile", False, 130),
]


def test_the_kills_are_the_issues_floor():
    assert sum(sig == signal.SIGKILL for _, sig, *_ in KILLS) >= 4


@pytest.mark.parametrize(
    ("sig", "point", "warm", "status"), [pytest.param(*row[1:], id=row[0]) for row in KILLS]
)
def test_a_killed_build_leaves_nothing_behind(
    cache_clean: CacheCleanBuild, cache_fake_nvcc: Path, tmp_path, sig, point, warm, status, capsys
):
    cache, out = tmp_path / "cache", tmp_path / "out"
    if warm:
        shutil.copytree(cache_clean.cache, cache)
    marker, pids = tmp_path / "paused", tmp_path / "nvcc.pids"
    env = {
        **os.environ,
        "CUDAL2_PAUSE_AT": "none" if point == "compile" else point,
        "CUDAL2_PAUSE_MARKER": str(marker),
        "CUDAL2_FAKE_NVCC_PIDS": str(pids),
    }
    if point == "compile":
        env["PATH"] = f"{cache_fake_nvcc}{os.pathsep}{env['PATH']}"
    proc = subprocess.Popen(
        [sys.executable, str(KILL_TARGET), *cache_build_args(cache, out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for(pids if point == "compile" else marker, proc)
        proc.send_signal(sig)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == status

    # Right after the kill: no wheel-looking file, no nvcc nor any child of it.
    assert not [p for p in out.rglob("*") if p.name.endswith(".whl")]
    if point == "compile":
        started = [int(pid) for pid in pids.read_text().split()]  # guard, nvcc, its child
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in started) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in started if _alive(pid)], "nvcc outlived the build"

    # The next build: the clean wheel, and no debris anywhere.
    assert build_cli.main(cache_build_args(cache, out)) == 0
    capsys.readouterr()
    assert [p.name for p in out.iterdir()] == [cache_clean.wheel.name]
    assert cache_file_sha256(out / cache_clean.wheel.name) == cache_clean.wheel_sha256
    assert list((cache / "tmp").iterdir()) == []
    assert not (cache / "quarantine").exists()
    root = nvcc.source_root()
    for key in cache_clean.keys:
        assert not os.path.lexists(root / key) and not os.path.lexists(root / f"{key}.lock")
