"""Writing the kernel wheel: precompiled cubins + dispatch.json + the runtime.

Layout (docs/contracts.md): the wheel ``cudal2_kernels_<name>-<version>-py3-none-any.whl``
holds the import package ``<package>/`` with an ``__init__.py`` rendered from
``templates/package_init.py.j2``, the runtime
copied to ``_runtime/``, ``dispatch.json`` and ``cubins/<sha256>.cubin``, plus its
``.dist-info``. With a native launcher (``packaging/native_build.py``) it also holds
``_native/libcudal2_native.so`` and ``_native/bias.cubin``, is not purelib, and is
tagged ``py3-none-manylinux_2_<N>_x86_64`` (the .so's glibc). The wheel is
reproducible: every member has the same timestamp and mode (0o644, the .so too: ctypes
loads it with dlopen, which needs no exec bit) and members are written in a fixed
order, so equal inputs give equal bytes.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import importlib.resources
import io
import logging
import os
import re
import zipfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path

import jinja2

from cudal2.generator.scratch import owned_name, sweep
from packaging.version import InvalidVersion, Version

from .native_build import FILES as NATIVE_FILES
from .native_build import NativeBuild
from .runtime.table import DispatchTable

log = logging.getLogger(__name__)

# What the shipped runtime imports at run time (torch is optional and not required).
# cuda-python's driver bindings: the only thing the runtime imports (the GPU image has
# cuda-bindings without the cuda-python metapackage).
RUNTIME_REQUIRES: tuple[str, ...] = ("cuda-bindings>=12.6",)
# Where the table dispatches cuBLASLt algorithms: the bindings that run them.
CUBLASLT_REQUIRES: tuple[str, ...] = ("nvmath-python>=1.0",)
# The array libraries the runtime serves: one is needed (without either every call
# fails, naming these extras), and which one is the user's choice. torch 2.4 is the
# first with torch.library.custom_op; CuPy for CUDA 13, which the cubins are built with.
EXTRAS: dict[str, tuple[str, ...]] = {
    "torch": ("torch>=2.4",),
    "cupy": ("cupy-cuda13x>=14",),
}
REQUIRES_PYTHON = ">=3.11"
WHEEL_TAG = "py3-none-any"  # a pure wheel's (no native launcher)
NATIVE_DIR = "_native"  # <package>/_native/: the native launcher's files
# The wheel being written: ``<out>/.cudal2-wheel-<host>.<pid>.<random>.part``.
TEMP_PREFIX = ".cudal2-wheel-"

# Zip timestamps cannot predate 1980; a fixed stamp makes rebuilds byte-identical.
_ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)
_ZIP_MODE = 0o644 << 16

# The one rule for a kernel package's name and version, which the manifest applies when
# it reads them and the writer when it names the wheel (so a manifest that loads always
# makes a wheel). A name is also the import name's and the torch op namespace's tail
# (``cudal2_kernels_<name>``, ``cudal2_<name>``), so it is an identifier part, and two
# names never normalise to one distribution (PEP 503 folds runs of '_' into one '-').
NAME_MAX_LEN = 64
VERSION_MAX_LEN = 64  # with the name, keeps the wheel's file name far below 255 bytes
NAME_PATTERN = "[a-z][a-z0-9]*(_[a-z0-9]+)*"
_NAME_RE = re.compile(NAME_PATTERN)  # str patterns: [a-z0-9] is ASCII only
# What a version may be spelled with before PEP 440 parses it: ASCII, no whitespace
# (the parser would strip a trailing newline and accept it).
_VERSION_CHARS_RE = re.compile(r"[A-Za-z0-9.+!_-]+")


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a kernel package (one line), or None when it can."""
    if not isinstance(name, str):
        return f"must be a string, got {type(name).__name__}"
    if not 1 <= len(name) <= NAME_MAX_LEN:
        return f"must be 1 to {NAME_MAX_LEN} characters long, got {len(name)}"
    if not _NAME_RE.fullmatch(name):
        return (
            f"must match {NAME_PATTERN} (lowercase ASCII letters and digits, words joined "
            "by single underscores, starting with a letter)"
        )
    return None


def wheel_version(version: object) -> str:
    """``version`` as the wheel is named and its METADATA says it: its normalised PEP
    440 spelling, read by the PyPA ``packaging`` library (``1.0a`` -> ``1.0a0``,
    ``1.0-post1`` -> ``1.0.post1``). Raises ``ValueError`` (one line) for anything else:
    not a string, empty or longer than ``VERSION_MAX_LEN``, whitespace or non-ASCII
    characters, not PEP 440, or an epoch (``1!2.0``: a '!' in a file name)."""
    if not isinstance(version, str):
        raise ValueError(f"must be a string, got {type(version).__name__}")
    if not 1 <= len(version) <= VERSION_MAX_LEN:
        raise ValueError(f"must be 1 to {VERSION_MAX_LEN} characters long, got {len(version)}")
    if not _VERSION_CHARS_RE.fullmatch(version):
        raise ValueError(
            "must be written with ASCII letters, digits and . + ! _ - only (no spaces, "
            "newlines or other characters)"
        )
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise ValueError("is not a PEP 440 version (e.g. 0.1.0, 1.2rc1, 0.3.post1)") from None
    if parsed.epoch:
        raise ValueError("a version epoch (N!) is not supported: it cannot be in a file name")
    return str(parsed)


class WheelBuildError(ValueError):
    """The table and cubins given cannot make a wheel (bad name, missing/bad cubin)."""


def package_name(name: str) -> str:
    """The import name of the kernel package built from manifest ``name``."""
    return f"cudal2_kernels_{name}"


def dist_name(name: str) -> str:
    """The PEP 503 normalised distribution name of the wheel for table name ``name``."""
    return re.sub(r"[-_.]+", "-", f"cudal2-kernels-{name}").lower()


def wheel_filename(name: str, version: str, tag: str = WHEEL_TAG) -> str:
    """The PEP 427 file name: the normalised name with '-' spelled '_'; ``tag``: a
    native build's ``wheel_tag`` where the wheel ships one."""
    return f"{dist_name(name).replace('-', '_')}-{version}-{tag}.whl"


def runtime_sources() -> dict[str, bytes]:
    """Every ``*.py`` file of the installed ``cudal2.packaging.runtime`` package, by file name."""
    root = importlib.resources.files("cudal2.packaging.runtime")
    files = [p for p in root.iterdir() if p.is_file() and p.name.endswith(".py")]
    return {p.name: p.read_bytes() for p in sorted(files, key=lambda p: p.name)}


def write_wheel(
    table: DispatchTable,
    cubins: Mapping[str, bytes],
    out_dir: Path,
    native: NativeBuild | None = None,
) -> Path:
    """Write the kernel wheel for ``table`` into ``out_dir`` and return its path.

    ``cubins`` maps sha256 hex -> cubin bytes and must hold the cubin of every
    ``kind == "kernel"`` entry (extra cubins are ignored). ``native``: the build's
    native launcher, shipped in ``<package>/_native/`` under its platform tag (None: a
    pure ``py3-none-any`` wheel, byte for byte as before there was one). Raises
    :class:`WheelBuildError` on a missing cubin, a cubin whose hash is not its key,
    or a table name/version/package that cannot name a wheel (the table itself was
    checked when it was made).
    """
    name, version, package = table.name, table.version, table.package
    _check_names(name, version, package)
    table_bytes = table.to_bytes()

    members = _package_members(table, table_bytes, cubins, native)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in sweep(out_dir, TEMP_PREFIX):  # left by a killed build
        log.info("cudal2: removed %s, left by a build that was killed", stale)
    tag = WHEEL_TAG if native is None else native.wheel_tag
    filename = wheel_filename(name, version, tag)
    namever = filename.removesuffix(f"-{tag}.whl")
    dist_info = f"{namever}.dist-info"
    members[f"{dist_info}/METADATA"] = _metadata(table)
    members[f"{dist_info}/entry_points.txt"] = _entry_points(table)
    members[f"{dist_info}/WHEEL"] = _wheel_file(table, native)
    record_path = f"{dist_info}/RECORD"
    # Written under a name that is no wheel's, in out_dir (one file system, so the
    # rename is atomic): a killed build leaves no wheel-looking file, and the next
    # write sweeps what it left.
    tmp_path = out_dir / owned_name(TEMP_PREFIX, ".part")
    try:
        with open(tmp_path, "xb") as raw, zipfile.ZipFile(raw, "w") as whl:
            for arcname, data in members.items():
                whl.writestr(_zipinfo(arcname), data)
            whl.writestr(_zipinfo(record_path), _record(members, record_path))
        with open(tmp_path, "rb") as f:
            os.fsync(f.fileno())
        final = out_dir / filename
        os.replace(tmp_path, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise
    _fsync_dir(out_dir)
    return final


def _fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (a crash after the build reports the wheel
    must not lose it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _check_names(name: str, version: str, package: str) -> None:
    """The manifest's rule (``name_problem``, ``wheel_version``), applied again: a
    table may come from elsewhere than a manifest (a test, a rewritten table)."""
    problem = name_problem(name)
    if problem:
        raise WheelBuildError(f"table name {name!r} {problem}")
    try:
        normal = wheel_version(version)
    except ValueError as exc:
        raise WheelBuildError(f"table version {version!r} {exc}") from None
    if normal != version:
        raise WheelBuildError(
            f"table version {version!r} is not in its normalised PEP 440 spelling {normal!r}"
        )
    if package != package_name(name):
        raise WheelBuildError(
            f"table package {package!r} is not the package of name {name!r}: {package_name(name)!r}"
        )


def _package_members(
    table: DispatchTable,
    table_bytes: bytes,
    cubins: Mapping[str, bytes],
    native: NativeBuild | None,
) -> dict[str, bytes]:
    """The import package's files, in the order they go into the zip (sorted by name)."""
    package = table.package
    native_sha256 = (
        {name: hashlib.sha256(data).hexdigest() for name, data in native.files.items()}
        if native is not None
        else None
    )
    members: dict[str, bytes] = {
        f"{package}/__init__.py": _init_source(table, native_sha256).encode("utf-8"),
        f"{package}/dispatch.json": table_bytes,
    }
    for fname, data in runtime_sources().items():
        members[f"{package}/_runtime/{fname}"] = data
    for sha, data in _kernel_cubins(table, cubins).items():
        members[f"{package}/cubins/{sha}.cubin"] = data
    if native is not None:
        if set(native.files) != set(NATIVE_FILES):  # a NativeBuild checks it; so do we
            raise WheelBuildError(f"a native build ships exactly {', '.join(NATIVE_FILES)}")
        for fname, data in native.files.items():
            members[f"{package}/{NATIVE_DIR}/{fname}"] = bytes(data)
    return dict(sorted(members.items()))


def _kernel_cubins(table: DispatchTable, cubins: Mapping[str, bytes]) -> dict[str, bytes]:
    """The cubins that the table's kernel entries and eager alternatives need, each
    checked against its hash."""
    needed = sorted(
        {e.cubin_sha256 for e in table.entries if e.kind == "kernel"}
        | {e.eager.cubin_sha256 for e in table.entries if e.eager is not None}
    )
    missing = [sha for sha in needed if sha not in cubins]
    if missing:
        raise WheelBuildError(
            f"{len(missing)} cubin(s) referenced by kernel entries or eager alternatives "
            "were not supplied: " + ", ".join(missing)
        )
    out: dict[str, bytes] = {}
    for sha in needed:
        data = bytes(cubins[sha])
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha:
            raise WheelBuildError(f"cubin supplied for {sha} has sha256 {actual}")
        out[sha] = data
    return out


@cache
def _templates() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("cudal2.packaging", "templates"),
        undefined=jinja2.StrictUndefined,  # a missing value is an error, never ""
        keep_trailing_newline=True,
        autoescape=False,
    )


def _init_source(table: DispatchTable, native_sha256: Mapping[str, str] | None = None) -> str:
    """The generated ``__init__.py`` of the kernel package
    (``templates/package_init.py.j2``); ``native_sha256``: the native launcher's files
    shipped under ``_native/`` by name, with their hashes (the runtime checks them)."""
    kinds = [e.kind for e in table.entries]
    template = _templates().get_template("package_init.py.j2")
    return template.render(
        tool_version=_docstring_text(table.tool_version),
        gpus=_docstring_text(", ".join(table.gpu_models) or "no GPU"),
        archs=_docstring_text(", ".join(table.archs) or "no arch"),
        name=_docstring_text(repr(table.name)),
        manifest_sha256=_docstring_text(table.manifest_sha256),
        measured_from=_docstring_text(str(table.measured_from)),
        measured_to=_docstring_text(str(table.measured_to)),
        entries=len(kinds),
        kernels=kinds.count("kernel"),
        algos=kinds.count("cublaslt"),
        version=repr(table.version),
        namespace=repr(op_namespace(table)),
        native_sha256=repr(dict(sorted((native_sha256 or {}).items()))),
    )


def _docstring_text(text: str) -> str:
    """Table strings are data, not code: keep them from closing the docstring."""
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def op_namespace(table: DispatchTable) -> str:
    """The torch op namespace of a table's package: ``cudal2_<manifest name>``."""
    return f"cudal2_{table.name}"


def _entry_points(table: DispatchTable) -> bytes:
    """The vLLM general plugin entry point (loaded only by vLLM)."""
    return (
        f"[vllm.general_plugins]\n{op_namespace(table)} = {table.package}:vllm_register\n"
    ).encode()


def _metadata(table: DispatchTable) -> bytes:
    gpus = ", ".join(table.gpu_models) or "no GPU"
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {dist_name(table.name)}",
        f"Version: {table.version}",
        f"Summary: cudal2 HGEMM kernels for {gpus} (manifest {table.name})",
        f"Requires-Python: {REQUIRES_PYTHON}",
        *(f"Requires-Dist: {req}" for req in RUNTIME_REQUIRES),
    ]
    if any(e.kind == "cublaslt" for e in table.entries):
        lines += [f"Requires-Dist: {req}" for req in CUBLASLT_REQUIRES]
    for extra, reqs in EXTRAS.items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {req}; extra == "{extra}"' for req in reqs]
    return ("\n".join(lines) + "\n").encode("utf-8")


def _wheel_file(table: DispatchTable, native: NativeBuild | None) -> bytes:
    # A wheel with a platform-specific file is platlib (PEP 427): installers put it in
    # the platform's site-packages, and the tag names the platform it runs on.
    lines = [
        "Wheel-Version: 1.0",
        f"Generator: cudal2 {table.tool_version}",
        f"Root-Is-Purelib: {'true' if native is None else 'false'}",
        f"Tag: {WHEEL_TAG if native is None else native.wheel_tag}",
    ]
    return ("\n".join(lines) + "\n").encode("utf-8")


def _record(members: Mapping[str, bytes], record_path: str) -> bytes:
    """RECORD per the binary distribution format: path,sha256=<urlsafe b64>,size."""
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter=",", quotechar='"', lineterminator="\n")
    for arcname, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        writer.writerow((arcname, f"sha256={digest.decode('ascii')}", len(data)))
    writer.writerow((record_path, "", ""))
    return buf.getvalue().encode("utf-8")


def _zipinfo(arcname: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(arcname, date_time=_ZIP_DATE_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = _ZIP_MODE
    # ZipInfo defaults create_system to the host OS; pin it so the bytes do not.
    info.create_system = 3
    return info
