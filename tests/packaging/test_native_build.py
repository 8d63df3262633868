"""The native launcher's build (``cudal2.packaging.native_build``) and its place in the
wheel: reproducible bytes, the content-keyed cache (checked on every read), the reasons
it cannot be built, the platform tag read from the .so, and the wheel that ships it."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types
import zipfile
from pathlib import Path

import pytest
from packaging.tags import Tag, sys_tags
from wheel.wheelfile import WheelFile

from cudal2.generator import nvcc
from cudal2.generator.cache import ArtifactCache
from cudal2.packaging import native_build
from cudal2.packaging.native_build import (
    CUBIN_NAME,
    SO_NAME,
    NativeBuild,
    NativeBuildError,
    NativeUnavailable,
    build_native,
    entry_path,
    needed_versions,
    platform_tag,
)
from cudal2.packaging.wheel import WHEEL_TAG, dist_name, write_wheel

TOOLS = ("g++", "nvcc", "readelf")
pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in TOOLS), reason="needs g++, nvcc and readelf"
)


@pytest.fixture
def native(session_native) -> NativeBuild:
    if isinstance(session_native, NativeUnavailable):
        pytest.skip(f"the native launcher cannot be built here: {session_native.reason}")
    return session_native


class Commands:
    """Every command the build runs through the guard, and every nvcc cubin compile."""

    def __init__(self, monkeypatch):
        self.runs: list[list[str]] = []
        self.cubins = 0
        run, compile_cubin = nvcc.run_guarded, nvcc.compile_cubin

        def spy_run(cmd, **kwargs):
            self.runs.append(list(cmd))
            return run(cmd, **kwargs)

        def spy_cubin(*args, **kwargs):
            self.cubins += 1
            return compile_cubin(*args, **kwargs)

        monkeypatch.setattr(nvcc, "run_guarded", spy_run)
        monkeypatch.setattr(nvcc, "compile_cubin", spy_cubin)

    @property
    def links(self) -> int:
        """g++ runs that built the .so (``g++ --version`` is not one)."""
        return sum("-shared" in cmd for cmd in self.runs)


# -- reproducible, cached --------------------------------------------------------------


def test_two_empty_caches_give_identical_bytes(native, tmp_path):
    lines: list[str] = []
    a = build_native(ArtifactCache(tmp_path / "a"), log=lines.append)
    b = build_native(ArtifactCache(tmp_path / "b"), log=lines.append)
    assert isinstance(a, NativeBuild) and isinstance(b, NativeBuild)
    assert a.files == b.files == native.files  # and the session's, built a third time
    assert a.key == b.key == native.key and a.platform_tag == b.platform_tag
    assert set(a.files) == {SO_NAME, CUBIN_NAME}
    assert a.files[SO_NAME][:4] == b"\x7fELF" and all(a.files.values())
    # no path of this machine in any byte (the caches' folders, torch's, CUDA's)
    for data in a.files.values():
        for path in (tmp_path, Path(sys.prefix), Path(shutil.which("nvcc")).parent):
            assert str(path).encode() not in data
    assert lines == [f"native launcher: {a.summary()}"] * 2
    assert re.fullmatch(
        r"libcudal2_native\.so \d+ KB \(manylinux_2_\d+_x86_64(, GLIBCXX_[\d.]+)?\), "
        r"bias\.cubin \d+ KB",
        a.summary(),
    )
    for root in ("a", "b"):  # the entry in place, nothing left in the cache's tmp/
        assert entry_path(ArtifactCache(tmp_path / root), a.key).is_dir()
        assert list((tmp_path / root / "tmp").iterdir()) == []


def test_the_cache_is_used_the_second_time(native, tmp_path, monkeypatch):
    cache = ArtifactCache(tmp_path / "cache")
    cmds = Commands(monkeypatch)
    first = build_native(cache)
    assert (cmds.links, cmds.cubins) == (1, 1)
    second = build_native(cache)
    assert (cmds.links, cmds.cubins) == (1, 1), "the second build compiled again"
    assert second == first
    assert cache.quarantined == []


def test_the_key_covers_what_determines_the_bytes(native, tmp_path, monkeypatch):
    """A changed source, compiler or torch is another key (and a compile), never the old
    entry."""
    cache = ArtifactCache(tmp_path / "cache")
    base = build_native(cache)
    sources = native_build.native_sources()
    changed = {**sources, "bias.cu": sources["bias.cu"] + b"\n// changed\n"}
    monkeypatch.setattr(native_build, "native_sources", lambda: changed)
    other = build_native(cache)
    assert other.key != base.key
    monkeypatch.setattr(native_build, "native_sources", lambda: sources)
    monkeypatch.setattr(native_build, "nvcc_version", lambda: "release 99.0, V99.0.0")
    assert build_native(cache).key not in (base.key, other.key)


# -- a broken cache entry is never shipped ---------------------------------------------


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _symlink_so(entry: Path) -> None:
    real = entry.parent / "elsewhere.so"
    shutil.copy(entry / SO_NAME, real)
    (entry / SO_NAME).unlink()
    (entry / SO_NAME).symlink_to(real)


def _edit_record(**changes):
    def edit(entry: Path) -> None:
        rec = json.loads((entry / "native.json").read_text())
        rec.update(changes)
        (entry / "native.json").write_text(json.dumps(rec))

    return edit


def _entry_is_a_file(entry: Path) -> None:
    shutil.rmtree(entry)
    entry.write_bytes(b"not a folder")


# (case, how the entry is damaged, what the quarantine's reason.txt names)
DAMAGES = [
    ("a byte of the .so flipped", lambda e: _flip(e / SO_NAME), "libcudal2_native.so has sha256"),
    (
        "the cubin cut short",
        lambda e: (e / CUBIN_NAME).write_bytes((e / CUBIN_NAME).read_bytes()[:100]),
        "bias.cubin has sha256",
    ),
    ("the .so missing", lambda e: (e / SO_NAME).unlink(), "libcudal2_native.so is missing"),
    ("the .so a symlink", _symlink_so, "libcudal2_native.so cannot be read"),
    ("native.json torn", lambda e: (e / "native.json").write_text('{"key": "'), "not JSON"),
    ("native.json of another key", _edit_record(key="0" * 64), "another key"),
    ("native.json lists another file", _edit_record(files={SO_NAME: {}}), "exactly"),
    ("a tag that is no manylinux tag", _edit_record(platform_tag="any"), "platform_tag"),
    ("the entry a file", _entry_is_a_file, "not a folder"),
]


@pytest.mark.parametrize(("damage", "reason"), [pytest.param(*d[1:], id=d[0]) for d in DAMAGES])
def test_a_damaged_entry_is_quarantined_and_built_again(
    native, tmp_path, monkeypatch, damage, reason
):
    cache = ArtifactCache(tmp_path / "cache")
    good = build_native(cache)
    damage(entry_path(cache, good.key))
    cmds = Commands(monkeypatch)
    again = build_native(cache)
    assert again == good  # the same bytes, compiled again: the damaged ones never returned
    assert cmds.links == 1
    (slot,) = cache.quarantined
    assert slot == cache.root / "quarantine" / f"native-{good.key}-1"
    assert reason in (slot / "reason.txt").read_text()
    assert entry_path(cache, good.key).is_dir()  # a sound entry again, read next time
    assert build_native(cache) == good and cmds.links == 1


# -- where it cannot be built: a pure wheel, one line, never an error ------------------


def _fake_torch(version: str, root: Path | None = None, headers: bool = False):
    def install(monkeypatch, tmp_path):
        folder = (root or tmp_path) / "torch"
        (folder / "lib").mkdir(parents=True)
        (folder / "lib" / "libtorch_cpu.so").write_bytes(b"")
        if headers:
            stable = folder / "include" / "torch" / "csrc" / "stable"
            stable.mkdir(parents=True)
            (stable / "library.h").write_text("")
        fake = types.ModuleType("torch")
        fake.__version__ = version
        fake.__file__ = str(folder / "__init__.py")
        monkeypatch.setitem(sys.modules, "torch", fake)

    return install


def _hide(tool: str):
    def install(monkeypatch, tmp_path):
        real = native_build._which
        monkeypatch.setattr(native_build, "_which", lambda t: None if t == tool else real(t))

    return install


def _no_torch(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError


def _machine(name: str):
    def install(monkeypatch, tmp_path):
        monkeypatch.setattr(native_build.platform, "machine", lambda: name)

    return install


def _nvcc_without_cuda_h(monkeypatch, tmp_path):
    """An nvcc whose toolkit has no cuda.h (its -dryrun names an empty folder)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (tmp_path / "inc").mkdir()
    fake = bin_ / "nvcc"
    fake.write_text(f"#!/bin/sh\necho '#$ INCLUDES=\"-I{tmp_path / 'inc'}\"'\n")
    fake.chmod(0o755)
    real = native_build._which
    monkeypatch.setattr(native_build, "_which", lambda t: str(fake) if t == "nvcc" else real(t))


# (case, what is wrong here, the reason's words)
UNAVAILABLE = [
    ("no g++", _hide("g++"), "no g++ on PATH"),
    ("no nvcc", _hide("nvcc"), "no nvcc on PATH"),
    ("no readelf", _hide("readelf"), "no readelf on PATH"),
    ("an nvcc without cuda.h", _nvcc_without_cuda_h, "names no CUDA include folder with cuda.h"),
    ("torch missing", _no_torch, "torch is not importable"),
    ("torch 2.10", _fake_torch("2.10.1+cpu"), "torch 2.10.1+cpu is older than 2.11"),
    ("torch 1.13", _fake_torch("1.13.0"), "older than 2.11: its headers lack the stable ABI"),
    ("a torch version that is none", _fake_torch("nightly"), "has no readable version"),
    ("torch 2.11 without stable headers", _fake_torch("2.11.0"), "has no stable-ABI headers"),
    ("not x86_64", _machine("aarch64"), "aarch64 is not x86_64"),
    ("no machine name", _machine(""), "an unknown machine is not x86_64"),
]


@pytest.mark.parametrize(
    ("install", "reason"), [pytest.param(*u[1:], id=u[0]) for u in UNAVAILABLE]
)
def test_where_it_cannot_be_built_it_says_why(tmp_path, monkeypatch, install, reason):
    install(monkeypatch, tmp_path)
    cache = ArtifactCache(tmp_path / "cache")
    lines: list[str] = []
    got = build_native(cache, log=lines.append)
    assert isinstance(got, NativeUnavailable)
    assert reason in got.reason
    assert lines == [f"native launcher: not built ({got.reason}); the wheel is pure Python"]
    assert not (cache.root / native_build.CACHE_DIR).exists()


def test_a_fake_torch_with_headers_passes_the_checks(tmp_path, monkeypatch):
    """The table's fake torch fails for its version, not for being a fake: with
    headers and 2.11 it is the toolchain's torch."""
    _fake_torch("2.11.0", headers=True)(monkeypatch, tmp_path)
    tc = native_build._toolchain(tmp_path)
    assert not isinstance(tc, NativeUnavailable), tc
    assert tc.torch_version == "2.11.0"
    assert tc.torch_include == str(tmp_path / "torch" / "include")


def test_sources_that_do_not_compile_are_an_error_not_a_pure_wheel(native, tmp_path, monkeypatch):
    sources = native_build.native_sources()
    broken = {**sources, "launcher.cpp": sources["launcher.cpp"] + b"\nthis is not C++;\n"}
    monkeypatch.setattr(native_build, "native_sources", lambda: broken)
    cache = ArtifactCache(tmp_path / "cache")
    with pytest.raises(NativeBuildError) as info:
        build_native(cache)
    assert "g++ failed on launcher.cpp" in str(info.value)
    assert "--no-native" in str(info.value) and "error" in str(info.value)
    assert not (cache.root / native_build.CACHE_DIR).exists()
    assert list((cache.root / "tmp").iterdir()) == []


# -- the platform tag ------------------------------------------------------------------


def _objdump_glibc_minor(so: Path) -> int:
    """The highest GLIBC_2.N of the .so's dynamic symbols, read by another tool."""
    out = subprocess.run(["objdump", "-T", str(so)], capture_output=True, text=True, check=True)
    return max((int(m) for m in re.findall(r"\bGLIBC_2\.(\d+)", out.stdout)), default=0)


def test_the_tag_is_read_from_the_built_so(native, tmp_path):
    so = tmp_path / SO_NAME
    so.write_bytes(native.files[SO_NAME])
    listing = subprocess.run(
        ["readelf", "--version-info", "--wide", str(so)], capture_output=True, text=True
    ).stdout
    tag, glibc, glibcxx = platform_tag(listing)
    assert (tag, glibc, glibcxx) == (native.platform_tag, native.glibc, native.glibcxx)
    n = max(_objdump_glibc_minor(so), native_build.MIN_GLIBC_MINOR)
    assert tag == f"manylinux_2_{n}_x86_64"
    # a tag this machine's pip accepts (the floor keeps it one pip knows)
    assert Tag("py3", "none", tag) in set(sys_tags())


def _listing(*names: str, defs: tuple[str, ...] = ()) -> str:
    """A ``readelf --version-info --wide`` text needing ``names`` (and defining
    ``defs``, which are no needs)."""
    lines = [
        "",
        "Version symbols section '.gnu.version' contains 9 entries:",
        " Addr: 0x00000000000003d6  Offset: 0x000003d6  Link: 2 (.dynsym)",
        "  000:   0 (*local*)       2 (GLIBC_2.99)   3 (GLIBCXX_9.9)",
        "",
    ]
    if defs:
        lines.append("Version definition section '.gnu.version_d' contains 2 entries:")
        lines += [f"  0x00{i}c: Rev: 1  Flags: none  Index: {i}  Cnt: 1  Name: {d}" for i, d in
                  enumerate(defs, 1)]  # fmt: skip
        lines.append("")
    lines.append(f"Version needs section '.gnu.version_r' contains {len(names)} entries:")
    lines.append(" Addr: 0x00000000000003e8  Offset: 0x000003e8  Link: 3 (.dynstr)")
    for i, name in enumerate(names):
        lines.append(f"  0x{i:04x}:   Name: {name}  Flags: none  Version: {i + 2}")
    return "\n".join(lines) + "\n"


# (case, listing, machine, (tag, glibc, glibcxx))
TAGS = [
    (
        "a typical .so",
        _listing("GLIBC_2.2.5", "GLIBC_2.14", "GLIBC_2.34", "GLIBCXX_3.4.29", "CXXABI_1.3"),
        "x86_64",
        ("manylinux_2_34_x86_64", "GLIBC_2.34", "GLIBCXX_3.4.29"),
    ),
    (
        "only GLIBC_2.2.5: the floor pip knows",
        _listing("GLIBC_2.2.5", "GLIBCXX_3.4"),
        "x86_64",
        ("manylinux_2_5_x86_64", "GLIBC_2.2.5", "GLIBCXX_3.4"),
    ),
    (
        "2.9 and 2.10 compare as numbers",
        _listing("GLIBC_2.9", "GLIBC_2.10"),
        "x86_64",
        ("manylinux_2_10_x86_64", "GLIBC_2.10", ""),
    ),
    (
        "3.4.9 and 3.4.30 compare as numbers",
        _listing("GLIBC_2.17", "GLIBCXX_3.4.9", "GLIBCXX_3.4.30", "GLIBCXX_3.4"),
        "x86_64",
        ("manylinux_2_17_x86_64", "GLIBC_2.17", "GLIBCXX_3.4.30"),
    ),
    (
        "no symbol version at all",
        "\nNo version information found in this file.\n",
        "x86_64",
        ("manylinux_2_5_x86_64", "", ""),
    ),
    (
        "libstdc++ versions only",
        _listing("GLIBCXX_3.4.21", "CXXABI_1.3"),
        "x86_64",
        ("manylinux_2_5_x86_64", "", "GLIBCXX_3.4.21"),
    ),
    (
        "GLIBC_PRIVATE is no version",
        _listing("GLIBC_PRIVATE", "GLIBC_2.28"),
        "x86_64",
        ("manylinux_2_28_x86_64", "GLIBC_2.28", ""),
    ),
    (
        "versions it defines are not needs",
        _listing("GLIBC_2.17", defs=("GLIBC_2.40", "GLIBCXX_3.4.33")),
        "x86_64",
        ("manylinux_2_17_x86_64", "GLIBC_2.17", ""),
    ),
]


@pytest.mark.parametrize(
    ("listing", "machine", "want"), [pytest.param(*t[1:], id=t[0]) for t in TAGS]
)
def test_platform_tag_from_symbol_versions(listing, machine, want):
    assert platform_tag(listing, machine) == want


# (case, listing, machine, the error's words)
BAD_TAGS = [
    ("no listing at all", "", "x86_64", "not a readelf --version-info listing"),
    ("not readelf's text", "GLIBC_2.34 GLIBC_2.35\n", "x86_64", "not a readelf"),
    ("only the version symbols section", _listing()[:200] + "\n", "x86_64", "not a readelf"),
    ("a glibc 3", _listing("GLIBC_3.1"), "x86_64", "not a glibc 2.x"),
    ("a glibc 2 without a minor", _listing("GLIBC_2"), "x86_64", "not a glibc 2.x"),
    ("aarch64", _listing("GLIBC_2.17"), "aarch64", "not 'aarch64'"),
]


@pytest.mark.parametrize(
    ("listing", "machine", "words"), [pytest.param(*t[1:], id=t[0]) for t in BAD_TAGS]
)
def test_platform_tag_refuses(listing, machine, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        platform_tag(listing, machine)


def test_needed_versions_reads_only_the_needs_section():
    listing = _listing("GLIBC_2.2.5", "GLIBCXX_3.4", defs=("MINE_1.0",))
    assert needed_versions(listing) == ["GLIBC_2.2.5", "GLIBCXX_3.4"]


# -- the wheel -------------------------------------------------------------------------


def _zip(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {n: z.read(n) for n in z.namelist()}


def test_the_wheel_ships_the_native_launcher(recorded_table, recorded_cubins, native, tmp_path):
    whl = write_wheel(recorded_table, recorded_cubins, tmp_path / "n", native)
    pure = write_wheel(recorded_table, recorded_cubins, tmp_path / "p")
    dist = dist_name(recorded_table.name).replace("-", "_")
    info = f"{dist}-{recorded_table.version}.dist-info"
    assert whl.name == f"{dist}-{recorded_table.version}-py3-none-{native.platform_tag}.whl"
    assert pure.name == f"{dist}-{recorded_table.version}-{WHEEL_TAG}.whl"
    got, base = _zip(whl), _zip(pure)
    pkg = recorded_table.package
    native_members = {f"{pkg}/_native/{SO_NAME}", f"{pkg}/_native/{CUBIN_NAME}"}
    assert set(got) - set(base) == native_members
    for name in native.files:
        assert got[f"{pkg}/_native/{name}"] == native.files[name]
    # the rest of the package is the pure wheel's, byte for byte, but for the line of
    # __init__.py that records the native files' hashes (the runtime checks them)
    init = f"{pkg}/__init__.py"
    sha = {n: hashlib.sha256(d).hexdigest() for n, d in sorted(native.files.items())}
    recorded = f"NATIVE_SHA256 = {sha!r}".encode()
    assert got[init] == base[init].replace(b"NATIVE_SHA256 = {}", recorded)
    for name in base:
        if not name.startswith(info) and name != init:
            assert got[name] == base[name], name
    assert not any("_native" in n for n in base)
    wheel_lines = got[f"{info}/WHEEL"].decode().splitlines()
    assert "Root-Is-Purelib: false" in wheel_lines
    assert f"Tag: py3-none-{native.platform_tag}" in wheel_lines
    pure_lines = base[f"{info}/WHEEL"].decode().splitlines()
    assert "Root-Is-Purelib: true" in pure_lines and "Tag: py3-none-any" in pure_lines
    # RECORD covers every member, the native files with their hashes and sizes
    with WheelFile(whl) as wf:  # checks each member against RECORD as it reads
        for name in wf.namelist():
            wf.read(name)
    rows = {r[0]: r[1:] for r in csv.reader(io.StringIO(got[f"{info}/RECORD"].decode()))}
    assert set(rows) == set(got)
    for name in native_members:
        digest = base64.urlsafe_b64encode(hashlib.sha256(got[name]).digest()).rstrip(b"=")
        assert rows[name] == [f"sha256={digest.decode()}", str(len(got[name]))]
    # one fixed mode for every member, the .so too (dlopen needs no exec bit)
    with zipfile.ZipFile(whl) as z:
        assert {i.external_attr for i in z.infolist()} == {0o644 << 16}
    # reproducible with native too
    again = write_wheel(recorded_table, recorded_cubins, tmp_path / "n2", native)
    assert again.read_bytes() == whl.read_bytes()


def test_the_native_wheel_installs_where_pip_accepts_its_tag(
    recorded_table, recorded_cubins, native, tmp_path
):
    whl = write_wheel(recorded_table, recorded_cubins, tmp_path / "dist", native)
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index"]
    pip += ["--disable-pip-version-check", "--target", str(target), str(whl)]
    res = subprocess.run(pip, capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    installed = target / recorded_table.package / "_native"
    assert (installed / SO_NAME).read_bytes() == native.files[SO_NAME]
    assert (installed / CUBIN_NAME).read_bytes() == native.files[CUBIN_NAME]


def test_a_native_build_holds_exactly_its_files(native):
    with pytest.raises(ValueError, match="exactly"):
        NativeBuild({SO_NAME: b"x"}, native.platform_tag, native.key, "GLIBC_2.17", "")
    with pytest.raises(ValueError, match="platform tag"):
        NativeBuild(dict(native.files), "linux_x86_64", native.key, "GLIBC_2.17", "")


# -- killed: nothing left behind -------------------------------------------------------

KILLED_BUILD = """
import sys
from pathlib import Path
from cudal2.generator.cache import ArtifactCache
from cudal2.packaging.native_build import build_native
build_native(ArtifactCache(Path(sys.argv[1])))
"""


def test_a_build_killed_in_g_plus_plus_leaves_nothing_behind(native, tmp_path):
    """SIGKILL while g++ runs: g++ dies with the build (the guard), and the next build
    in that cache sweeps the compile's folder and builds the same bytes."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    pids = tmp_path / "gxx.pids"
    real = shutil.which("g++")
    fake = bin_ / "g++"
    fake.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then exec "{real}" --version; fi\n'
        "sleep 120 &\n"
        f'echo "$$ $!" >> "{pids}"\n'
        "wait\n"
    )
    fake.chmod(0o755)
    cache = tmp_path / "cache"
    env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_BUILD, str(cache)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not (pids.exists() and pids.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    started = [int(p) for p in pids.read_text().split()]
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in started if _alive(p)], "g++ outlived the build"
    assert [p.name for p in (cache / "tmp").iterdir()]  # the killed compile's folder
    assert not (cache / native_build.CACHE_DIR).exists()

    again = build_native(ArtifactCache(cache))
    assert again == native
    assert list((cache / "tmp").iterdir()) == []


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[0] != "Z"


def test_help_and_the_pipeline_import_no_torch(tmp_path):
    """torch is imported inside build_native only: ``cudal2-build --help`` and the
    modules that import the native build never load it (a fresh interpreter)."""
    code = (
        "import sys, contextlib, io\n"
        "from cudal2.cli import build\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    build.main(['--help'])\n"
        "import cudal2.pipeline.build, cudal2.packaging.wheel, cudal2.packaging.native_build\n"
        "print('torch' in sys.modules)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    assert res.stdout.strip() == "False"
