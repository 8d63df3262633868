"""Building the native launcher once per build: ``libcudal2_native.so`` + ``bias.cubin``.

The lead's sources (``packaging/native/launcher.cpp``, a C++17 file against torch's
*stable ABI*, and ``packaging/native/bias.cu``, one ``extern "C"`` kernel) are compiled
here, on the CPU build machine, and shipped in the wheel's ``<package>/_native/``
(``packaging/wheel.py``; the runtime loads them). docs/contracts.md, "Native launcher",
is the contract; in short:

- **The .so** is built by g++ against the headers of the torch installed here, for
  ``TORCH_TARGET_VERSION`` (2.11: the GPU machine's torch; the stable ABI promises the
  one binary runs on every torch from that version on, so 2.13 here builds what 2.11
  there loads). It links only ``libtorch_cpu`` (resolved at load time from the torch
  the process has already imported, which is why a CPU torch can build it); the CUDA
  driver and torch's stream function are looked up at run time by the launcher itself.
  ``cuda.h`` comes from the CUDA toolkit of the nvcc on PATH.
- **The cubin** is compiled by nvcc for ``sm_90a`` through ``generator/nvcc.py`` (the
  source at a fixed path, the process group killed with the build).
- **Reproducible**: no ``-g``, ``--build-id=none``, compiled in a folder of the cache
  with relative file names and the include folders mapped away
  (``-ffile-prefix-map``: torch's headers put ``__FILE__`` in error messages), so two
  empty caches give the same bytes.
- **Cached by content key** in ``<cache>/native/<key>/`` (``native.json`` records each
  file's sha256 and size; every read checks them; a broken entry goes to
  ``<cache>/quarantine/native-<key>-<n>/`` and is built again, never shipped). Staged in
  the cache's ``tmp/`` and renamed into place, as ``generator/cache.py`` does.
- **Where it cannot be built** (not x86_64, no g++, nvcc or readelf, torch missing or
  older than 2.11): ``NativeUnavailable(reason)``, and the build ships a pure wheel.
  A toolchain that is here but fails on the sources is an error (``NativeBuildError``):
  shipping a pure wheel then would hide a broken launcher.

torch is imported lazily, inside ``build_native``: ``cudal2-build --help`` and the
pipeline's imports never load it.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import os
import platform
import re
import shutil
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cudal2.generator import nvcc
from cudal2.generator.cache import ArtifactCache
from cudal2.generator.compile import arch_flags, artifact_key, nvcc_version
from cudal2.records import canonical_json, sha256_hex

SO_NAME = "libcudal2_native.so"
CUBIN_NAME = "bias.cubin"
FILES = (SO_NAME, CUBIN_NAME)  # what a NativeBuild holds, exactly
SOURCES = ("launcher.cpp", "bias.cu")  # packaging/native/, shipped in cudal2 as package data
# The oldest torch the .so is built for: the GPU machine's (2.11). The stable ABI's
# macro spells a version as 0xMMmmPP...: major, minor, patch bytes, then zeros.
TORCH_TARGET = (2, 11)
TORCH_TARGET_VERSION = 0x020B000000000000
CUBIN_ARCH = "sm_90a"
CUBIN_FLAGS = ("-cubin", "-O3", *arch_flags(CUBIN_ARCH))
MACHINE = "x86_64"  # the one the tag rule and the toolchain here are for
# pip's floor for x86_64 manylinux tags (manylinux1 = glibc 2.5): a .so that needs only
# older symbols (GLIBC_2.2.5) is tagged manylinux_2_5, the oldest a pip will install.
MIN_GLIBC_MINOR = 5
TIMEOUT_S = 300
CACHE_DIR = "native"
RECORD = "native.json"
FORMAT = 1  # of native.json and of the key's recipe
_MAX_FILE_BYTES = 64 << 20
_MAX_RECORD_BYTES = 1 << 16
_TAG_RE = re.compile(r"manylinux_2_(\d+)_x86_64")
# readelf's whole answer for a file without symbol versions
_NO_VERSIONS = "No version information found in this file."
_GLIBCXX_RE = re.compile(r"GLIBCXX_\d+(\.\d+)*")

Log = Callable[[str], None]


class NativeBuildError(RuntimeError):
    """The toolchain is here but the native launcher did not build (a compile error, a
    timeout, a killed compiler): the message holds the compiler's text."""


@dataclass(frozen=True)
class NativeUnavailable:
    """The native launcher cannot be built on this machine (the build ships a pure
    wheel): ``reason`` is one line, e.g. ``no g++ on PATH``."""

    reason: str

    def summary(self) -> str:
        return f"not built ({self.reason}); the wheel is pure Python"


@dataclass(frozen=True)
class NativeBuild:
    """The built files (``FILES``, by name), the wheel's platform tag (PEP 425's last
    part, e.g. ``manylinux_2_28_x86_64``), the content key they were built under, and
    the newest glibc / libstdc++ symbol versions the .so needs (``GLIBC_2.28``,
    ``GLIBCXX_3.4.29``; ``""`` where it needs none)."""

    files: dict[str, bytes] = field(repr=False)
    platform_tag: str
    key: str
    glibc: str
    glibcxx: str

    def __post_init__(self) -> None:
        if set(self.files) != set(FILES):
            raise ValueError(f"a native build holds exactly {', '.join(FILES)}")
        if not _TAG_RE.fullmatch(self.platform_tag):
            raise ValueError(f"not a manylinux x86_64 platform tag: {self.platform_tag!r}")

    @property
    def wheel_tag(self) -> str:
        """The wheel's PEP 425 tag: any Python 3, no Python ABI (the .so is loaded by
        ctypes, not imported), this platform."""
        return f"py3-none-{self.platform_tag}"

    def summary(self) -> str:
        so, cubin = self.files[SO_NAME], self.files[CUBIN_NAME]
        cxx = f", {self.glibcxx}" if self.glibcxx else ""
        return f"{SO_NAME} {_kb(so)} ({self.platform_tag}{cxx}), {CUBIN_NAME} {_kb(cubin)}"


def _kb(data: bytes) -> str:
    return f"{max(1, round(len(data) / 1024))} KB"


# -- the platform tag ------------------------------------------------------------------


def needed_versions(listing: str) -> list[str]:
    """The symbol versions a shared object needs, from ``readelf --version-info``'s
    text: the ``Name:`` of each entry of its "Version needs" section (other sections,
    the definitions a library exports among them, are not needs)."""
    names: list[str] = []
    inside = False
    for line in listing.splitlines():
        if line.startswith("Version needs section"):
            inside = True
        elif line and not line[0].isspace():  # the next section's header
            inside = False
        elif inside:
            m = re.search(r"\bName: (\S+)", line)
            if m:
                names.append(m.group(1))
    return names


def _newest(names: list[str], prefix: str) -> tuple[tuple[int, ...], str] | None:
    """The highest numbered ``<prefix>_a.b.c`` of ``names`` (``GLIBC_PRIVATE`` and
    other unnumbered names are no version)."""
    best: tuple[tuple[int, ...], str] | None = None
    for name in names:
        m = re.fullmatch(re.escape(prefix) + r"_(\d+(?:\.\d+)*)", name)
        if m:
            v = tuple(int(x) for x in m.group(1).split("."))
            if best is None or v > best[0]:
                best = (v, name)
    return best


def platform_tag(listing: str, machine: str = MACHINE) -> tuple[str, str, str]:
    """``(tag, glibc, glibcxx)`` for the .so whose ``readelf --version-info`` text is
    ``listing``: ``manylinux_2_<N>_<machine>`` where N is the highest ``GLIBC_2.N`` it
    needs (at least ``MIN_GLIBC_MINOR``), and the newest GLIBC and GLIBCXX versions it
    needs (``""`` where none: a .so that needs no symbol version runs on any glibc).
    Raises ``ValueError`` for a machine other than x86_64, a needed glibc that is not
    2.x, or text that is not such a listing."""
    if machine != MACHINE:
        raise ValueError(f"the manylinux tag rule here is for {MACHINE}, not {machine!r}")
    if "Version needs section" not in listing and _NO_VERSIONS not in listing:
        raise ValueError("not a readelf --version-info listing (no version needs section)")
    names = needed_versions(listing)
    glibc = _newest(names, "GLIBC")
    minor = MIN_GLIBC_MINOR
    if glibc is not None:
        version, name = glibc
        if version[0] != 2 or len(version) < 2:
            raise ValueError(f"{name} is not a glibc 2.x version")
        minor = max(version[1], MIN_GLIBC_MINOR)
    cxx = _newest(names, "GLIBCXX")
    return (
        f"manylinux_2_{minor}_{machine}",
        "" if glibc is None else glibc[1],
        "" if cxx is None else cxx[1],
    )


# -- the toolchain ---------------------------------------------------------------------


def _which(tool: str) -> str | None:
    """Where ``tool`` is on PATH (tests replace this to hide one)."""
    return shutil.which(tool)


def native_sources() -> dict[str, bytes]:
    """The lead's sources, as shipped in ``cudal2.packaging`` (``native/``)."""
    root = importlib.resources.files("cudal2.packaging") / "native"
    try:
        return {name: (root / name).read_bytes() for name in SOURCES}
    except OSError as exc:
        raise NativeBuildError(f"the native sources are missing from cudal2: {exc}") from None


@dataclass(frozen=True)
class _Toolchain:
    gxx: str
    gxx_version: str  # `g++ --version`'s first line
    nvcc: str
    nvcc_version: str
    readelf: str
    cuda_include: str
    torch_version: str
    torch_include: str
    torch_lib: str

    def so_command(self) -> list[str]:
        """The g++ line, run in the compile's folder on relative names. The include
        folders are mapped to fixed names so their paths are in no byte of the .so."""
        return [
            self.gxx,
            "-std=c++17",
            "-O2",
            "-fPIC",
            "-shared",
            "-fvisibility=hidden",
            f"-DTORCH_TARGET_VERSION=0x{TORCH_TARGET_VERSION:016x}",
            f"-ffile-prefix-map={self.torch_include}=torch/include",
            f"-ffile-prefix-map={self.cuda_include}=cuda/include",
            f"-I{self.torch_include}",
            f"-I{self.cuda_include}",
            "launcher.cpp",
            "-o",
            SO_NAME,
            f"-L{self.torch_lib}",
            "-ltorch_cpu",
            "-ldl",
            "-Wl,--no-undefined",
            "-Wl,--as-needed",
            "-Wl,--build-id=none",
        ]

    def cubin_command(self) -> list[str]:
        """nvcc's line as the key records it (``generator/nvcc.py`` runs it on the
        source at its fixed place, writing into the compile's folder)."""
        return [self.nvcc, *CUBIN_FLAGS, "-o", CUBIN_NAME, "bias.cu"]


def _first_line(cmd: list[str], cwd: Path) -> str | None:
    run = nvcc.run_guarded(cmd, cwd=cwd, env=_env(cwd), timeout_s=60)
    if run.returncode != 0:
        return None
    lines = run.stdout.strip().splitlines()
    return lines[0].strip() if lines else None


def _cuda_include(nvcc_path: str, cwd: Path) -> str | None:
    """The CUDA include folder the nvcc on PATH compiles with (its ``-dryrun`` names
    it: nvcc may be a wrapper script far from its toolkit), if ``cuda.h`` is there."""
    cmd = [nvcc_path, "-dryrun", "-E", "-x", "cu", os.devnull]
    run = nvcc.run_guarded(cmd, cwd=cwd, env=_env(cwd), timeout_s=60)
    if run.returncode != 0:
        return None
    m = re.search(r'^#\$ INCLUDES="-I([^"]+)"', run.stdout + run.stderr, re.MULTILINE)
    if m is None:
        return None
    inc = os.path.normpath(m.group(1).strip())
    return inc if os.path.isfile(os.path.join(inc, "cuda.h")) else None


def _torch_paths() -> tuple[str, str, str] | str:
    """torch's version, include and lib folders, or why it cannot build the .so."""
    try:
        import torch
    except ImportError as exc:
        return f"torch is not importable ({exc})"
    version = str(getattr(torch, "__version__", ""))
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        return f"torch {version!r} has no readable version"
    if (int(m.group(1)), int(m.group(2))) < TORCH_TARGET:
        return (
            f"torch {version} is older than {TORCH_TARGET[0]}.{TORCH_TARGET[1]}: its headers "
            "lack the stable ABI"
        )
    root = os.path.dirname(os.path.abspath(torch.__file__))
    include, lib = os.path.join(root, "include"), os.path.join(root, "lib")
    if not os.path.isfile(os.path.join(include, "torch", "csrc", "stable", "library.h")):
        return f"torch {version} has no stable-ABI headers in {include} (a build without them)"
    if not any(n.startswith("libtorch_cpu.") for n in _listdir(lib)):
        return f"torch {version} has no libtorch_cpu in {lib}"
    return version, include, lib


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _toolchain(cwd: Path) -> _Toolchain | NativeUnavailable:
    """What builds the native launcher here, or why nothing can (checked in the order
    a user would fix them: machine, compilers, torch)."""
    machine = platform.machine()
    if machine != MACHINE:
        return NativeUnavailable(f"{machine or 'an unknown machine'} is not {MACHINE}")
    tools = {}
    for tool in ("g++", "nvcc", "readelf"):
        tools[tool] = _which(tool)
        if tools[tool] is None:
            return NativeUnavailable(f"no {tool} on PATH")
    gxx_version = _first_line([tools["g++"], "--version"], cwd)
    if gxx_version is None:
        return NativeUnavailable(f"{tools['g++']} --version failed")
    cuda_include = _cuda_include(tools["nvcc"], cwd)
    if cuda_include is None:
        return NativeUnavailable(f"{tools['nvcc']} names no CUDA include folder with cuda.h")
    paths = _torch_paths()
    if isinstance(paths, str):
        return NativeUnavailable(paths)
    return _Toolchain(
        gxx=tools["g++"],
        gxx_version=gxx_version,
        nvcc=tools["nvcc"],
        nvcc_version=nvcc_version(),
        readelf=tools["readelf"],
        cuda_include=cuda_include,
        torch_version=paths[0],
        torch_include=paths[1],
        torch_lib=paths[2],
    )


def native_key(tc: _Toolchain, sources: Mapping[str, bytes]) -> str:
    """sha256 of everything that determines the bytes: the sources, both command lines,
    g++'s and nvcc's versions, torch's version and the torch target."""
    return sha256_hex(
        canonical_json(
            {
                "format": FORMAT,
                "sources": {name: hashlib.sha256(sources[name]).hexdigest() for name in SOURCES},
                "so_command": tc.so_command(),
                "cubin_command": tc.cubin_command(),
                "gxx": tc.gxx_version,
                "nvcc": tc.nvcc_version,
                "torch": tc.torch_version,
                "torch_target": f"0x{TORCH_TARGET_VERSION:016x}",
            }
        )
    )


def _env(folder: Path) -> dict[str, str]:
    # The compilers' temporary files stay in the compile's folder (swept if killed);
    # C locale: the same messages (and readelf's text) everywhere.
    return {**os.environ, "TMPDIR": str(folder), "LC_ALL": "C"}


# -- building --------------------------------------------------------------------------


def build_native(
    cache: ArtifactCache | None = None, *, log: Log | None = None
) -> NativeBuild | NativeUnavailable:
    """The native launcher of this build: from ``cache`` (checked) or compiled into it.
    Says one line (``native launcher: ...``) through ``log``. Raises
    ``NativeBuildError`` where the toolchain is here and the sources do not build."""
    cache = cache if cache is not None else ArtifactCache()
    say = log if log is not None else (lambda _msg: None)
    with cache.scratch() as work:
        tc = _toolchain(work)
        if isinstance(tc, NativeUnavailable):
            say(f"native launcher: {tc.summary()}")
            return tc
        sources = native_sources()
        key = native_key(tc, sources)
        built = _cached(cache, key)
        if built is None:
            built = _compile(tc, sources, key, work)
            _store(cache, built, tc, work)
    say(f"native launcher: {built.summary()}")
    return built


def _compile(tc: _Toolchain, sources: Mapping[str, bytes], key: str, work: Path) -> NativeBuild:
    so_dir = work / "so"
    so_dir.mkdir()
    (so_dir / "launcher.cpp").write_bytes(sources["launcher.cpp"])
    run = nvcc.run_guarded(tc.so_command(), cwd=so_dir, env=_env(so_dir), timeout_s=TIMEOUT_S)
    _check_run(run, "g++", "launcher.cpp")
    so = _read_file(so_dir / SO_NAME, "g++")

    listing = nvcc.run_guarded(
        [tc.readelf, "--version-info", "--wide", SO_NAME],
        cwd=so_dir,
        env=_env(so_dir),
        timeout_s=60,
    )
    _check_run(listing, "readelf", SO_NAME)
    try:
        tag, glibc, glibcxx = platform_tag(listing.stdout)
    except ValueError as exc:
        raise NativeBuildError(f"{SO_NAME}: {exc}") from None

    cu_dir = work / "cubin"
    cu_dir.mkdir()
    source = sources["bias.cu"].decode("utf-8")
    # Keyed as the kernels are (source, nvcc, flags, arch): the fixed source folder's
    # name, and with it the cubin's bytes, depend on nothing of this machine's paths.
    cu_key = artifact_key(source, CUBIN_ARCH, CUBIN_FLAGS)
    run, cubin = nvcc.compile_cubin(tc.nvcc, CUBIN_FLAGS, source, cu_key, cu_dir, TIMEOUT_S)
    _check_run(run, "nvcc", "bias.cu")
    if cubin is None or not cubin:
        raise NativeBuildError("nvcc wrote no bias.cubin")
    return NativeBuild(
        files={SO_NAME: so, CUBIN_NAME: cubin},
        platform_tag=tag,
        key=key,
        glibc=glibc,
        glibcxx=glibcxx,
    )


def _check_run(run: nvcc.NvccRun, tool: str, what: str) -> None:
    if run.killed:
        raise NativeBuildError(f"{tool} was killed building {what} (the build is stopping)")
    if run.returncode is None:
        raise NativeBuildError(f"{tool} timed out after {TIMEOUT_S} s building {what}")
    if run.returncode != 0:
        text = (run.stdout + run.stderr).strip()[-4000:]
        raise NativeBuildError(
            f"{tool} failed on {what} (exit {run.returncode}); build with --no-native to "
            f"ship a pure wheel:\n{text}"
        )


def _read_file(path: Path, tool: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError:
        data = b""
    if not data:
        raise NativeBuildError(f"{tool} wrote no {path.name}")
    return data


# -- the cache entry -------------------------------------------------------------------


class _Broken(Exception):
    """What is wrong with a cache entry (it is quarantined, then built again)."""


def entry_path(cache: ArtifactCache, key: str) -> Path:
    return cache.root / CACHE_DIR / key


def _cached(cache: ArtifactCache, key: str) -> NativeBuild | None:
    """The entry of ``key``, every file checked against ``native.json``; None for no
    entry or a broken one (then quarantined)."""
    entry = entry_path(cache, key)
    if not os.path.lexists(entry):
        return None
    try:
        return _check_entry(entry, key)
    except _Broken as broken:
        cache.quarantine(key, str(broken), entry=entry, kind="native")
        return None


def _check_entry(entry: Path, key: str) -> NativeBuild:
    if entry.is_symlink() or not entry.is_dir():
        raise _Broken("the entry is not a folder (a symlink or a file)")
    try:
        record = json.loads(_read_regular(entry / RECORD, _MAX_RECORD_BYTES))
    except (ValueError, RecursionError) as exc:
        raise _Broken(f"{RECORD} is not JSON ({type(exc).__name__})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise _Broken(f"{RECORD} is not a format-{FORMAT} record")
    if record.get("key") != key:
        raise _Broken(f"{RECORD} is the record of another key ({record.get('key')!r})")
    listed = record.get("files")
    if not isinstance(listed, dict) or set(listed) != set(FILES):
        raise _Broken(f"{RECORD} does not list exactly {', '.join(FILES)}")
    files: dict[str, bytes] = {}
    for name in FILES:
        want = listed[name]
        if not isinstance(want, dict):
            raise _Broken(f"{RECORD}: {name} has no sha256 and size")
        data = _read_regular(entry / name, _MAX_FILE_BYTES)
        sha = hashlib.sha256(data).hexdigest()
        if sha != want.get("sha256") or len(data) != want.get("size"):
            raise _Broken(
                f"{name} has sha256 {sha} ({len(data)} bytes), its build wrote "
                f"{want.get('sha256')} ({want.get('size')} bytes)"
            )
        files[name] = data
    tag, glibc, glibcxx = (record.get(k) for k in ("platform_tag", "glibc", "glibcxx"))
    if not isinstance(tag, str) or not _TAG_RE.fullmatch(tag):
        raise _Broken(f"{RECORD}: platform_tag {tag!r} is not a manylinux x86_64 tag")
    if not isinstance(glibc, str) or not (
        glibc == "" or re.fullmatch(r"GLIBC_2\.\d+(\.\d+)*", glibc)
    ):
        raise _Broken(f"{RECORD}: glibc {glibc!r} is not a GLIBC_2.x version")
    if not isinstance(glibcxx, str) or not (glibcxx == "" or _GLIBCXX_RE.fullmatch(glibcxx)):
        raise _Broken(f"{RECORD}: glibcxx {glibcxx!r} is not a GLIBCXX_ version")
    return NativeBuild(files=files, platform_tag=tag, key=key, glibc=glibc, glibcxx=glibcxx)


def _read_regular(path: Path, limit: int) -> bytes:
    """The bytes of ``path``, a regular file of the entry (never through a symlink)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise _Broken(f"{path.name} is missing") from None
    except OSError as exc:
        raise _Broken(f"{path.name} cannot be read: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise _Broken(f"{path.name} is not a regular file")
        if st.st_size > limit:
            raise _Broken(f"{path.name} is {st.st_size} bytes, more than {limit}")
        return f.read(limit + 1)


def _store(cache: ArtifactCache, built: NativeBuild, tc: _Toolchain, work: Path) -> None:
    """Put ``built`` in the cache: assembled in the compile's folder, renamed into place
    (a reader sees a whole entry or none; first writer wins)."""
    staged = work / "entry"
    staged.mkdir()
    for name, data in built.files.items():
        (staged / name).write_bytes(data)
    record = {
        "format": FORMAT,
        "key": built.key,
        "files": {
            name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
            for name, data in sorted(built.files.items())
        },
        "platform_tag": built.platform_tag,
        "glibc": built.glibc,
        "glibcxx": built.glibcxx,
        # What it was built with (for a reader; the key already covers them).
        "gxx": tc.gxx_version,
        "nvcc": tc.nvcc_version,
        "torch": tc.torch_version,
        "torch_target": f"0x{TORCH_TARGET_VERSION:016x}",
    }
    (staged / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    final = entry_path(cache, built.key)
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(staged, final)
    except OSError:
        if not os.path.lexists(final):  # lost a race with another build of this key: fine
            raise
